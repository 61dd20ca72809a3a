"""`sciax.solve` (Diffrax): accuracy against SciPy, stiff problems, dtypes, vmap, gradients
and argument errors."""

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import sciax
from sciax import StateMismatchError
from sciax.systems import AbstractSDE, HarmonicOscillator, Lorenz, VanDerPol

LORENZ_Y0 = (1.0, 1.0, 1.0)


def lorenz_numpy(rho=28.0, sigma=10.0, beta=8.0 / 3.0):
    def f(t, y):
        x, yy, z = y
        return [sigma * (yy - x), x * (rho - z) - yy, x * yy - beta * z]

    return f


def van_der_pol_numpy(mu):
    def f(t, y):
        return [y[1], mu * (1 - y[0] ** 2) * y[1] - y[0]]

    def jac(t, y):
        return [[0.0, 1.0], [-2 * mu * y[0] * y[1] - 1.0, mu * (1 - y[0] ** 2)]]

    return f, jac


class ScalarNoise(AbstractSDE):
    def vector_field(self, t, y, args=None):
        return -y

    def diffusion(self, t, y, args=None):
        return jnp.ones_like(y)


def max_relative_error(states, reference):
    states, reference = np.asarray(states), np.asarray(reference)
    return float(np.max(np.abs(states - reference) / np.abs(reference)))


# --- accuracy against SciPy -------------------------------------------------------------------


@pytest.mark.parametrize("solver", ["dopri8", "tsit5"])
def test_lorenz_matches_scipy_dop853(solver):
    save_at = np.linspace(0.1, 1.0, 10)
    reference = solve_ivp(lorenz_numpy(), (0.0, 1.0), LORENZ_Y0, method="DOP853",
                          rtol=1e-12, atol=1e-14, t_eval=save_at).y.T
    traj = sciax.solve(Lorenz(), jnp.array(LORENZ_Y0), t0=0.0, t1=1.0, save_at=save_at,
                       solver=solver, rtol=1e-12, atol=1e-14)
    assert traj.states.shape == (10, 3)
    np.testing.assert_allclose(traj.times, save_at)
    assert max_relative_error(traj.states, reference) < 1e-8
    assert bool(jnp.all(traj.finite)) and bool(traj.stats["success"])
    assert int(traj.stats["num_accepted_steps"]) > 0


def test_van_der_pol_mu1000_stiff_matches_scipy():
    # Relaxation oscillation with period ~ (3 - 2 ln 2) mu ~ 1614: slow drift along the
    # branches |x| > 1, then a jump of duration O(1/mu) near t ~ 807, 1614, 2421. Saving on a
    # jump is ill-conditioned: there |dy/dt| ~ mu or more, so a tiny difference in the jump's
    # timing becomes a large state difference (SciPy's own Radau and LSODA, both at
    # rtol=1e-12, differ by 1.4e-8 relative at t = 807). So the save times lie on the slow
    # branches, where the state is well conditioned. Runs in ~4 s on one core.
    mu, t1 = 1000.0, 3000.0
    save_at = np.array([100, 300, 500, 700, 1000, 1200, 1500, 2000, 2200, 2500, 2800, 3000.0])
    # The reference is SciPy's LSODA (it switches to BDF on stiffness) at rtol=1e-12 with the
    # analytic Jacobian. DOP853, being explicit, needs steps of O(1/mu) throughout this stiff
    # problem and does not finish in reasonable time; Radau at the same tolerance agrees with
    # LSODA to < 1e-9 relative at these times but takes ~30x longer.
    f, jac = van_der_pol_numpy(mu)
    reference = solve_ivp(f, (0.0, t1), [2.0, 0.0], method="LSODA", jac=jac,
                          rtol=1e-12, atol=1e-14, t_eval=save_at).y.T
    traj = sciax.solve(VanDerPol(mu=mu), jnp.array([2.0, 0.0]), t0=0.0, t1=t1,
                       save_at=save_at, solver="kvaerno5", rtol=1e-12, atol=1e-14,
                       max_steps=400_000)  # it takes ~116,000 steps, half of them rejected
    assert bool(traj.stats["success"])
    assert max_relative_error(traj.states, reference) < 1e-8


def test_particle_system_phase_space_state():
    system = HarmonicOscillator(stiffness=4.0, masses=1.0)
    state0 = sciax.PhaseSpace(jnp.array([1.0, 0.0]), jnp.array([0.0, 1.0]))
    save_at = jnp.linspace(0.0, 3.0, 7)
    traj = sciax.solve(system, state0, t0=0.0, t1=3.0, save_at=save_at, rtol=1e-10,
                       atol=1e-12, observables={"energy": lambda t, y, s: s.energy(y)})
    exact = jax.vmap(lambda t: system.exact(state0, t))(save_at)
    np.testing.assert_allclose(traj.states.positions, exact.positions, atol=1e-8)
    np.testing.assert_allclose(traj.states.velocities, exact.velocities, atol=1e-8)
    np.testing.assert_allclose(traj.observables["energy"], system.energy(state0), rtol=1e-8)


def test_default_save_at_is_final_time_and_constant_steps():
    # rtol=None: constant steps of dt0; Euler from (1, 1, 1) equals a hand-written loop.
    system, y0, dt = Lorenz(), jnp.array(LORENZ_Y0), 0.01
    traj = sciax.solve(system, y0, t0=0.0, t1=0.5, solver="euler", rtol=None, dt0=dt)
    y = y0
    for n in range(50):
        y = y + dt * system.vector_field(n * dt, y)
    np.testing.assert_allclose(traj.times, [0.5])
    np.testing.assert_allclose(traj.final_state, y, rtol=1e-12)
    assert int(traj.stats["num_steps"]) == 50


def test_solver_instance_and_observables():
    save_at = jnp.linspace(0.0, 0.5, 6)
    by_name = sciax.solve(Lorenz(), jnp.array(LORENZ_Y0), t0=0.0, t1=0.5, save_at=save_at,
                          solver="dopri5", observables={"x": lambda t, y, s: y[0],
                                                        "t": lambda t, y, s: t})
    by_instance = sciax.solve(Lorenz(), jnp.array(LORENZ_Y0), t0=0.0, t1=0.5,
                              save_at=save_at, solver=dfx.Dopri5())
    np.testing.assert_array_equal(by_name.states, by_instance.states)
    np.testing.assert_array_equal(by_name.observables["x"], by_name.states[:, 0])
    np.testing.assert_array_equal(by_name.observables["t"], save_at)
    np.testing.assert_array_equal(by_name.states[0], jnp.array(LORENZ_Y0))


# --- failure reporting ------------------------------------------------------------------------


def test_max_steps_throw_false_reports_and_flags_frames():
    save_at = jnp.linspace(0.01, 1.0, 5)
    traj = sciax.solve(Lorenz(), jnp.array(LORENZ_Y0), t0=0.0, t1=1.0, save_at=save_at,
                       max_steps=4, throw=False)
    assert not bool(traj.stats["success"])
    assert traj.stats["result"] == dfx.RESULTS.max_steps_reached
    assert "max" in dfx.RESULTS[traj.stats["result"]]
    assert int(traj.stats["num_steps"]) == 4
    assert not bool(traj.finite[-1])
    assert traj.first_nonfinite_frame() is not None


def test_max_steps_throw_true_raises():
    with pytest.raises(Exception, match="maximum number of solver steps"):
        sciax.solve(Lorenz(), jnp.array(LORENZ_Y0), t0=0.0, t1=1.0, max_steps=4)


# --- dtypes, vmap, grad ------------------------------------------------------------------------


def test_float32_preserved():
    traj = sciax.solve(Lorenz(), jnp.array(LORENZ_Y0, dtype=jnp.float32), t0=0.0, t1=0.5,
                       save_at=np.linspace(0.1, 0.5, 5), rtol=1e-5, atol=1e-7)
    assert traj.states.dtype == jnp.float32
    assert traj.times.dtype == jnp.float32
    reference = solve_ivp(lorenz_numpy(), (0.0, 0.5), LORENZ_Y0, method="DOP853",
                          rtol=1e-12, atol=1e-14, t_eval=np.linspace(0.1, 0.5, 5)).y.T
    assert max_relative_error(traj.states, reference) < 1e-3


def test_vmap_over_parameters_and_initial_states_equals_loop():
    rhos = jnp.array([10.0, 28.0, 35.0])
    y0s = jnp.array([[1.0, 1.0, 1.0], [0.5, -1.0, 2.0], [2.0, 0.0, 0.1]])
    save_at = jnp.linspace(0.1, 0.5, 5)

    def run(rho, y0):
        return sciax.solve(Lorenz(rho=rho), y0, t0=0.0, t1=0.5, save_at=save_at,
                           rtol=1e-8, atol=1e-10).states

    batched = jax.vmap(run)(rhos, y0s)
    looped = jnp.stack([run(r, y) for r, y in zip(rhos, y0s)])
    assert batched.shape == (3, 5, 3)
    np.testing.assert_allclose(batched, looped, rtol=1e-9, atol=1e-12)


def test_jit_equals_eager_with_traced_times():
    def run(y0, t1):
        return sciax.solve(Lorenz(), y0, t0=0.0, t1=t1, save_at=jnp.linspace(0.1, 0.5, 5)).states

    y0 = jnp.array(LORENZ_Y0)
    np.testing.assert_allclose(jax.jit(run)(y0, 0.5), run(y0, 0.5), rtol=1e-12)


def test_constant_steps_that_do_not_divide_the_span_are_equal_steps_also_when_traced():
    """dt0 = 0.3 over [0, 1]: n = 4 equal steps of 0.25, whether the times are concrete or
    traced (jit, grad); a hand-written Euler loop is the reference."""
    y0 = jnp.array([2.0, 0.0])

    def final_x(t1, dt0=0.3):
        return sciax.solve(VanDerPol(), y0, t0=0.0, t1=t1, solver="euler", rtol=None, dt0=dt0).final_state[0]

    y = y0
    for n in range(4):
        y = y + 0.25 * VanDerPol().vector_field(n * 0.25, y)
    for value in (final_x(1.0), jax.jit(final_x)(1.0), jax.jit(lambda d: final_x(1.0, d))(0.3)):
        np.testing.assert_allclose(value, y[0], rtol=1e-14)
    h = 1e-6
    fd = (final_x(1.0 + h) - final_x(1.0 - h)) / (2 * h)
    d_t1, d_dt0 = jax.jit(jax.grad(final_x, argnums=(0, 1)))(1.0, 0.3)  # both times traced: one program
    np.testing.assert_allclose(d_t1, fd, rtol=1e-7)
    assert d_dt0 == 0.0  # n is piecewise constant in dt0


def test_traced_constant_steps_refuse_t1_before_t0():
    run = jax.jit(lambda a, b: sciax.solve(VanDerPol(), jnp.array([2.0, 0.0]), t0=a, t1=b, solver="euler",
                                           rtol=None, dt0=0.1).final_state)
    # Equinox's runtime error (inside jit it reaches Python as a JaxRuntimeError with the message)
    with pytest.raises(Exception, match="`t1` must not be before `t0`"):  # noqa: B017
        jax.block_until_ready(run(1.0, 0.5))


def test_float32_constant_steps_are_not_miscounted_by_rounding():
    # 0.6 / 0.1 in float32 is 6.0000001: still 6 steps.
    system = sciax.astype(VanDerPol(), jnp.float32)
    traj = sciax.solve(system, jnp.array([2.0, 0.0], jnp.float32), t0=0.0, t1=0.6, solver="euler", rtol=None,
                       dt0=0.1)
    assert int(traj.stats["num_steps"]) == 6


def rho_loss(rho, adjoint):
    """States and an observable saved at five times: the loss of the two gradient tests below (one
    definition, so that the second reuses the programs the first compiled for the same gradient)."""
    traj = sciax.solve(Lorenz(rho=rho), jnp.array(LORENZ_Y0), t0=0.0, t1=0.5, save_at=jnp.linspace(0.1, 0.5, 5),
                       solver="tsit5", rtol=1e-12, atol=1e-12, adjoint=adjoint,
                       observables={"x2": lambda t, y, s: y[0] ** 2})
    return jnp.sum(traj.states**2) + jnp.sum(traj.observables["x2"])


@pytest.mark.parametrize("adjoint", ["recursive_checkpoint", "backsolve"])
def test_grad_wrt_rho_matches_finite_differences(adjoint):
    grad = jax.grad(rho_loss)(28.0, adjoint)
    h = 1e-4
    fd = (rho_loss(28.0 + h, "direct") - rho_loss(28.0 - h, "direct")) / (2 * h)
    assert abs(float(grad) - float(fd)) < 1e-6 * abs(float(fd))


def test_forward_adjoint_gives_forward_derivatives_and_refuses_reverse_mode_by_name():
    """adjoint='forward': jvp and jacfwd (vmapped under jit) agree with the checkpointed
    reverse-mode gradient (checked against central differences in
    test_grad_wrt_rho_matches_finite_differences); jax.grad and jax.vjp raised JAX's "Reverse-mode
    differentiation does not work for lax.while_loop", which names neither the solve nor the fix,
    and now raise an error saying both."""
    def loss(rho, adjoint="forward"):
        return rho_loss(rho, adjoint)

    reference = float(jax.grad(rho_loss)(28.0, "recursive_checkpoint"))  # compiled by the test above
    for d in (jax.jvp(loss, (28.0,), (1.0,))[1], jax.jit(jax.vmap(jax.jacfwd(loss)))(jnp.array([28.0, 28.0]))):
        np.testing.assert_allclose(d, reference, rtol=1e-9)
    message = r"solve: adjoint='forward' computes forward-mode derivatives only .* use adjoint='recursive_checkpoint'"
    for reverse in (jax.grad(loss), lambda r: jax.vjp(loss, r)[1](1.0)):
        with pytest.raises(ValueError, match=message):
            reverse(28.0)


def test_a_new_observable_lambda_reuses_the_compiled_solve(compiles):
    """Observables were static arguments compared by identity: a lambda re-created for every
    call (same code) recompiled the Diffrax solve; `simulate` keyed them by code already."""
    def observables(scale):
        return {"sx": lambda t, y, s: scale * y[0]}

    save_at, y0 = jnp.linspace(0.1, 0.5, 5), jnp.array(LORENZ_Y0)
    kw = dict(t0=0.0, t1=0.5, save_at=save_at, solver="tsit5", rtol=1e-8, atol=1e-8)
    first = sciax.solve(Lorenz(), y0, observables=observables(2.0), **kw)
    compiles.clear()
    second = sciax.solve(Lorenz(), y0, observables=observables(2.0), **kw)
    assert compiles == []
    np.testing.assert_array_equal(np.asarray(second.observables["sx"]), np.asarray(first.observables["sx"]))
    np.testing.assert_allclose(np.asarray(second.observables["sx"]), 2.0 * np.asarray(second.states)[:, 0],
                               rtol=1e-15)
    third = sciax.solve(Lorenz(), y0, observables=observables(3.0), **kw)  # another captured value: its own
    np.testing.assert_allclose(np.asarray(third.observables["sx"]), 3.0 * np.asarray(third.states)[:, 0], rtol=1e-15)


@pytest.mark.parametrize("wrt", ["t0", "t1", "save_at", "dt0"])
def test_backsolve_names_the_times_it_cannot_differentiate(wrt):
    """Diffrax's BacksolveAdjoint raised "Unexpected tangent. *args and **kwargs to
    filter_custom_vjp cannot be autodifferentiated", naming neither `adjoint` nor the input."""
    def loss(x):
        times = dict(t0=0.0, t1=0.5, save_at=jnp.linspace(0.1, 0.5, 5), dt0=0.01)
        times[wrt] = x * times[wrt]
        traj = sciax.solve(Lorenz(), jnp.array(LORENZ_Y0), **times, solver="tsit5", rtol=1e-8, atol=1e-8,
                           adjoint="backsolve")
        return jnp.sum(traj.states**2)

    with pytest.raises(RuntimeError, match=rf"solve: the backsolve adjoint cannot differentiate with respect to "
                                           rf"`{wrt}` .*use adjoint='recursive_checkpoint'"):
        jax.grad(loss)(1.0)
    assert np.isfinite(loss(1.0))  # the marker changes nothing without a derivative


# Slow (14 s): test_constant_step_gradient_under_jit_matches_finite_differences covers the same
# configuration in the default run (constant steps handed over as StepTo, saved at every step,
# max_steps equal to the step count, the checkpointed gradient against central differences); this
# test adds the comparison with DirectAdjoint's gradient (to 1e-12) in an eager call.
@pytest.mark.slow
def test_constant_step_gradient_is_exact_with_tight_max_steps():
    # Fixed steps saved at every step, max_steps equal to the step count: the gradient through
    # the checkpointed solve must equal plain autodiff of the same discretisation (DESIGN.md
    # records Diffrax traps for exactly this configuration).
    save_at = jnp.arange(1, 51) * 0.01

    def loss(rho, adjoint):
        traj = sciax.solve(Lorenz(rho=rho), jnp.array(LORENZ_Y0), t0=0.0, t1=0.5,
                           save_at=save_at, rtol=None, dt0=0.01, max_steps=50, adjoint=adjoint)
        return jnp.sum(traj.states**2)

    checkpointed = jax.grad(loss)(28.0, "recursive_checkpoint")
    direct_value_and_grad = jax.value_and_grad(loss)
    direct = direct_value_and_grad(28.0, "direct")[1]
    h = 1e-4  # the loss at 28 ± h from the programs just compiled for the direct gradient
    fd = (direct_value_and_grad(28.0 + h, "direct")[0] - direct_value_and_grad(28.0 - h, "direct")[0]) / (2 * h)
    assert abs(float(checkpointed) - float(direct)) < 1e-12 * abs(float(direct))
    assert abs(float(checkpointed) - float(fd)) < 1e-6 * abs(float(fd))


def test_constant_step_gradient_under_jit_matches_finite_differences():
    # Regression: under `jax.jit` with the times given as Python floats (compile-time
    # constants), Diffrax 0.7.2's `ConstantStepSize` step ends were rounded differently in the
    # forward pass and in `RecursiveCheckpointAdjoint`'s recomputation, so a save time on a
    # step end was saved in different steps by the two and its cotangent was dropped or
    # counted twice. Here (Euler, save at every step) the gradient was 0.57% off with
    # max_steps=100 and 2.5% off with 202, with no error, before `solve` handed over `StepTo`.
    save_at = jnp.arange(1, 101) * 0.01

    def loss(rho):
        traj = sciax.solve(Lorenz(rho=rho), jnp.array(LORENZ_Y0), t0=0.0, t1=1.0,
                           save_at=save_at, solver="euler", rtol=None, dt0=0.01, max_steps=100)
        return jnp.sum(traj.states**2)

    value_and_grad, h = jax.jit(jax.value_and_grad(loss)), 1e-5  # one compilation
    grad = float(value_and_grad(28.0)[1])
    fd = float((value_and_grad(28.0 + h)[0] - value_and_grad(28.0 - h)[0]) / (2 * h))
    assert abs(grad - fd) < 1e-6 * abs(fd)


# --- argument errors ---------------------------------------------------------------------------


def _solve(**overrides):
    kwargs = dict(system=Lorenz(), state0=jnp.array(LORENZ_Y0), t0=0.0, t1=1.0)
    kwargs.update(overrides)
    system, state0 = kwargs.pop("system"), kwargs.pop("state0")
    return sciax.solve(system, state0, **kwargs)


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        (dict(t1=0.0), ValueError, r"`t1` must be greater than `t0`, got t0=0.0 and t1=0.0"),
        (dict(t0=2.0), ValueError, r"`t1` must be greater than `t0`, got t0=2.0 and t1=1.0"),
        (dict(t1=float("inf")), ValueError, r"`t1` must be finite"),
        (dict(t0=float("nan")), ValueError, r"solve: `t0` must be finite, got nan"),
        (dict(state0=jnp.array([1.0, jnp.inf, 1.0])), ValueError,
         r"solve: `state0` holds NaN or Inf \(1 value\(s\), the first at state0\[1\]\)"),
        (dict(state0=[1.0, 1.0, 1.0]), StateMismatchError, r"state leaves must be arrays, got list"),
        # float32 states: times checked after the cast (dt0 = 1e-46 became 0, then ZeroDivisionError)
        (dict(state0=jnp.ones(3, jnp.float32), rtol=None, dt0=1e-46, solver="euler"), ValueError,
         r"`dt0` must be positive and finite, got 1e-46, which is 0.0 in float32"),
        (dict(state0=jnp.ones(3, jnp.float32), dt0=-0.1), ValueError,
         r"`dt0` must be positive and finite, got -0.1\.$"),
        (dict(state0=jnp.ones(3, jnp.float32), t1=1e-46), ValueError,
         r"`t1` must be greater than `t0`, got t0=0.0 and t1=1e-46 \(in the state's float32: t0=0.0, t1=0.0\)"),
        (dict(t0=jnp.zeros(2)), ValueError, r"solve: `t0` must be a scalar, got array of shape \(2,\)"),
        (dict(save_at=jnp.zeros((2, 2))), ValueError,
         r"`save_at` must be a 1-D array of times, got array of shape \(2, 2\)"),
        (dict(save_at=0.5), ValueError, r"`save_at` must be a 1-D array of times, got float"),
        (dict(save_at=jnp.array([])), ValueError, r"`save_at` must hold at least one time"),
        (dict(save_at=jnp.array([0.1, 0.3, 0.2])), ValueError,
         r"`save_at` must be strictly increasing, got save_at\[1\]=0.3 followed by save_at\[2\]=0.2"),
        (dict(save_at=jnp.array([0.1, 0.1])), ValueError, r"`save_at` must be strictly increasing"),
        (dict(save_at=jnp.array([0.5, 1.5])), ValueError,
         r"`save_at` must lie within \[t0, t1\] = \[0.0, 1.0\], got times from 0.5 to 1.5"),
        (dict(save_at=jnp.array([-0.5, 0.5])), ValueError, r"`save_at` must lie within \[t0, t1\]"),
        (dict(rtol=0.0), ValueError, r"`rtol` must be positive and finite, got 0.0"),
        (dict(atol=-1e-9), ValueError, r"`atol` must be positive and finite, got -1e-09"),
        (dict(atol=None), ValueError, r"adaptive steps need both `rtol` and `atol`"),
        (dict(dt0=0.0), ValueError, r"`dt0` must be positive and finite, got 0.0"),
        (dict(rtol=None), ValueError, r"`rtol=None` asks for constant steps.*pass `dt0`"),
        (dict(max_steps=0), ValueError, r"`max_steps` must be a positive integer, got 0"),
        (dict(max_steps=1.5), TypeError, r"`max_steps` must be a Python int"),
        (dict(solver="rk45"), ValueError,
         r"unknown `solver` 'rk45'; expected a diffrax solver or one of .*dopri8.*kvaerno5.*tsit5"),
        (dict(solver=sciax.integrators.RK4()), TypeError,
         r"`solver` must be a name or a diffrax solver instance, got RK4"),
        (dict(solver="euler"), ValueError, r"Euler has no error estimate.*`rtol=None`"),
        (dict(adjoint="implicit"), ValueError,
         r"unknown `adjoint` 'implicit'; expected .*recursive_checkpoint, backsolve, direct"),
        (dict(adjoint="backsolve", rtol=None, dt0=0.01), ValueError,
         r"adjoint='backsolve' needs adaptive steps.*use adjoint='recursive_checkpoint'"),
        (dict(rtol=None, dt0=0.01, max_steps=99), ValueError,
         r"`max_steps` \(99\) is below the 100 constant steps of dt0=0.01"),
        (dict(adjoint=sciax.DirectAdjoint()), TypeError,
         r"`adjoint` must be a name or a diffrax adjoint instance"),
        (dict(observables=[lambda t, y, s: y]), TypeError, r"`observables` must be a dict"),
        (dict(throw=1), TypeError, r"`throw` must be True or False"),
        (dict(state0=jnp.ones(2)), StateMismatchError, r"Lorenz expects a state of shape \(3,\), got"),
        (dict(state0=jnp.array([1, 1, 1])), StateMismatchError, r"floating point.*got dtype int"),
        (dict(system=HarmonicOscillator()), StateMismatchError, r"expects a sciax.PhaseSpace"),
        (dict(system=Lorenz(rho=jnp.array(28.0, jnp.float64)), state0=jnp.ones(3, jnp.float32)), TypeError,
         r"solve: the state is float32 but the system has wider float parameters at .*rho"),
        (dict(system=lorenz_numpy()), TypeError, r"`system` must be a sciax ODE system.*got function"),
        (dict(system=ScalarNoise()), TypeError, r"not an SDE.*got ScalarNoise"),
    ],
)
def test_bad_arguments_raise_clear_errors(overrides, error, match):
    with pytest.raises(error, match=match):
        _solve(**overrides)


def test_the_typed_names_are_the_known_solvers_and_adjoints():
    from sciax import _solve

    assert set(_solve.SolverName.__args__) == set(_solve.SOLVERS)
    assert set(_solve.AdjointName.__args__) == set(_solve.ADJOINTS)


def test_an_explicit_solver_at_its_step_limit_says_the_problem_may_be_stiff_and_names_implicit_solvers():
    """It was Diffrax's raw EquinoxRuntimeError advising a larger max_steps."""
    from sciax._solve import MaxStepsError
    from sciax.systems import VanDerPol

    y0 = jnp.array([2.0, 0.0])
    with pytest.raises(MaxStepsError, match=r"solve: Tsit5 reached the maximum number of solver steps, max_steps = "
                                            r"2000, before `t1`. The problem may be stiff .* Use an implicit solver: "
                                            r"solver='kvaerno5' \(or 'kvaerno4', 'kvaerno3', 'implicit_euler'\)"):
        sciax.solve(VanDerPol(mu=1e5), y0, t0=0.0, t1=10.0, solver="tsit5", max_steps=2000)
    with pytest.raises(MaxStepsError, match=r"Kvaerno5 reached the maximum number of solver steps, max_steps = 3, "
                                            r"before `t1`. Raise `max_steps`, or loosen `rtol`/`atol`.$"):
        sciax.solve(VanDerPol(mu=1e5), y0, t0=0.0, t1=10.0, solver="kvaerno5", max_steps=3)
    # (that the advised solver solves such a problem: test_van_der_pol_mu1000_stiff_matches_scipy)


@pytest.mark.parametrize("half", [jnp.float16, jnp.bfloat16])
def test_a_half_precision_state_is_refused_by_solve_naming_what_runs(half):
    """The state checks accept float16/bfloat16 (simulate steps them); solve's adaptive steps failed
    with a raw runtime error."""
    with pytest.raises(TypeError, match=rf"solve: the state is {jnp.dtype(half).name}; solve's adaptive steps need "
                                        r"float32 or float64"):
        sciax.solve(sciax.astype(Lorenz(), half), jnp.array(LORENZ_Y0, half), t0=0.0, t1=0.1)
