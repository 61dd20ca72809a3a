"""simulate(): differentiation, transformations, saving, randomness and bad input."""

import functools
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import sciax
from sciax import PhaseSpace, integrators as si
from sciax.systems import HarmonicOscillator, Kepler, Lorenz

Y0 = jnp.array([1.0, 1.0, 1.0])


def lorenz_loss(rho, y0=Y0, adjoint=sciax.DirectAdjoint(), n_steps=200, save_every=10):
    tr = sciax.simulate(Lorenz(rho=rho), y0, integrator=si.RK4(), dt=0.005, n_steps=n_steps,
                        save_every=save_every, adjoint=adjoint)
    return jnp.mean(tr.states**2)


def central_difference(f, x, h):
    return (f(x + h) - f(x - h)) / (2 * h)


@pytest.mark.parametrize("adjoint", [sciax.DirectAdjoint(), sciax.CheckpointAdjoint(),
                                     sciax.CheckpointAdjoint(checkpoint_steps=False)],
                         ids=["direct", "checkpoint", "checkpoint-blocks-only"])
def test_grad_matches_finite_differences(adjoint):
    rho = 28.0
    g = eqx.filter_jit(jax.grad(lorenz_loss))(rho, adjoint=adjoint)  # one program: compiles faster than eagerly
    fd = central_difference(lambda r: lorenz_loss(r, adjoint=adjoint), rho, 1e-5)
    np.testing.assert_allclose(g, fd, rtol=1e-6)


def test_grad_wrt_initial_state_and_forward_mode():
    f = lambda y0: lorenz_loss(28.0, y0=y0)  # noqa: E731
    g = jax.jit(jax.grad(f))(Y0)  # each one program: compiles faster than eagerly
    jf = jax.jit(jax.jacfwd(f))(Y0)
    fd = np.array([central_difference(lambda s, i=i: f(Y0.at[i].set(s)), Y0[i], 1e-6) for i in range(3)])
    np.testing.assert_allclose(g, fd, rtol=1e-6)
    np.testing.assert_allclose(jf, g, rtol=1e-12)


def test_checkpointed_and_plain_gradients_identical():
    g_direct = jax.grad(lorenz_loss)(28.0)
    g_ckpt = jax.grad(lorenz_loss)(28.0, adjoint=sciax.CheckpointAdjoint())
    np.testing.assert_allclose(g_ckpt, g_direct, rtol=1e-14, atol=0)
    fwd = jax.jvp(lambda r: lorenz_loss(r, adjoint=sciax.CheckpointAdjoint()), (28.0,), (1.0,))[1]
    np.testing.assert_allclose(fwd, g_direct, rtol=1e-12)


def test_checkpoint_adjoint_memory_scales_with_frames_not_steps():
    """Reverse-mode residuals: Direct stores every step, Checkpoint one carry per saved frame."""

    def residual_bytes(adjoint, n_steps):
        f = lambda r: lorenz_loss(r, adjoint=adjoint, n_steps=n_steps, save_every=n_steps // 10)  # noqa: E731
        _, vjp = jax.vjp(f, 28.0)
        return sum(x.nbytes for x in jax.tree_util.tree_leaves(vjp))

    direct = [residual_bytes(sciax.DirectAdjoint(), n) for n in (1000, 10_000)]
    ckpt = [residual_bytes(sciax.CheckpointAdjoint(), n) for n in (1000, 10_000)]
    assert direct[1] > 8 * direct[0]  # grows with the number of steps
    assert ckpt[1] == ckpt[0]  # same 10 saved frames: same memory
    assert ckpt[1] * 100 < direct[1]


def test_particle_system_grad_matches_finite_differences():
    def loss(k):
        system = HarmonicOscillator(stiffness=k, masses=1.3)
        s0 = PhaseSpace(jnp.array([1.0, 0.2]), jnp.array([0.0, 0.5]))
        tr = sciax.simulate(system, s0, integrator=si.VelocityVerlet(), dt=0.01, n_steps=300, save_every=30)
        return jnp.sum(tr.states.positions**2)

    np.testing.assert_allclose(jax.jit(jax.grad(loss))(2.0), central_difference(loss, 2.0, 1e-6), rtol=1e-6)


def test_vmap_equals_loop_and_jit_equals_eager():
    rhos = jnp.array([10.0, 20.0, 28.0, 35.0])
    y0s = Y0 + 0.1 * jnp.arange(4.0)[:, None]
    run = lambda rho, y0: sciax.simulate(Lorenz(rho=rho), y0, integrator=si.RK4(), dt=0.01,  # noqa: E731
                                         n_steps=100, save_every=10).states
    batched = jax.vmap(run)(rhos, y0s)
    looped = jnp.stack([run(r, y) for r, y in zip(rhos, y0s)])
    np.testing.assert_allclose(batched, looped, rtol=1e-13, atol=1e-13)
    with jax.disable_jit():
        eager = run(rhos[2], y0s[2])
    np.testing.assert_allclose(eager, looped[2], rtol=1e-12, atol=1e-12)
    jitted = jax.jit(run)(rhos[2], y0s[2])
    np.testing.assert_allclose(jitted, looped[2], rtol=1e-13, atol=1e-13)


def test_componentwise_layout_equals_array_layout():
    """Library ODEs accept a tuple of scalars or an array; simulate's internal tuple layout
    gives the same numbers as stepping the array through a system without n_components."""

    class LorenzArray(sciax.systems.AbstractODE):
        def vector_field(self, t, y, args=None):
            x, yy, z = y
            return jnp.stack([10.0 * (yy - x), x * (28.0 - z) - yy, x * yy - 8 / 3 * z])

    a = sciax.simulate(Lorenz(), Y0, integrator=si.RK4(), dt=0.01, n_steps=100).states
    b = sciax.simulate(LorenzArray(), Y0, integrator=si.RK4(), dt=0.01, n_steps=100).states
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    assert a.shape == (101, 3)
    from_numpy = sciax.simulate(Lorenz(), np.asarray(Y0), integrator=si.RK4(), dt=0.01, n_steps=100).states
    np.testing.assert_array_equal(from_numpy, a)


def test_componentwise_frames_are_stacked_once_after_the_scan():
    """A componentwise state is saved as its components, one array each, and stacked into the
    user's layout once after the time loop. Stacking it in every frame cost a transposed stack
    in every backward iteration: on XLA:CPU, the gradient through 100 saved frames of 1,000
    Lorenz members took 7.3 ms instead of 1.6 ms."""

    def sub_jaxprs(params):
        for value in params.values():
            for v in value if isinstance(value, tuple | list) else (value,):
                if hasattr(v, "eqns"):
                    yield v
                elif hasattr(getattr(v, "jaxpr", None), "eqns"):
                    yield v.jaxpr

    def primitives_in_loops(jaxpr, inside=False, found=None):
        found = set() if found is None else found
        for eqn in jaxpr.eqns:
            if inside:
                found.add(eqn.primitive.name)
            for sub in sub_jaxprs(eqn.params):
                primitives_in_loops(sub, inside or eqn.primitive.name in ("scan", "while"), found)
        return found

    def loss(rho):
        traj = sciax.simulate(Lorenz(rho=rho), Y0, integrator=si.RK4(), dt=0.01, n_steps=20,
                              adjoint=sciax.CheckpointAdjoint())
        return jnp.sum(traj.states ** 2)

    def energy_loss(rho):  # an observable acting on the whole state vector, in the loop
        traj = sciax.simulate(Lorenz(rho=rho), Y0, integrator=si.RK4(), dt=0.01, n_steps=20, save_states=False,
                              observables={"e": lambda t, y, s: jnp.sum(y ** 2)})
        return jnp.sum(traj.observables["e"])

    for fn in (loss, jax.grad(loss), energy_loss, jax.grad(energy_loss)):
        in_loops = primitives_in_loops(jax.make_jaxpr(fn)(28.0).jaxpr)
        assert "mul" in in_loops  # the steps were found inside the loops
        assert not in_loops & {"stack", "concatenate"}
    traj = sciax.simulate(Lorenz(), Y0, integrator=si.RK4(), dt=0.01, n_steps=20, save_every=5)
    assert traj.states.shape == (5, 3)


def test_observables_see_exactly_the_saved_state():
    """Observables receive the component-wise state assembled into an array (by selects);
    every value comes through unchanged: inf, NaN, -0.0 and ordinary numbers."""
    from sciax._simulate import _assemble

    parts = (jnp.float64(np.inf), jnp.float64(np.nan), jnp.float64(-0.0), jnp.float64(1.5))
    out = np.asarray(_assemble(parts))
    np.testing.assert_array_equal(out, [np.inf, np.nan, 0.0, 1.5])
    assert np.signbit(out[2]) and out.dtype == np.float64
    traj = sciax.simulate(Lorenz(), Y0, integrator=si.RK4(), dt=0.01, n_steps=30, save_every=3,
                          observables={"same": lambda t, y, s: y})
    np.testing.assert_array_equal(traj.observables["same"], traj.states)


def test_saving_frames_times_and_observables():
    tr = sciax.simulate(Lorenz(), Y0, integrator=si.RK4(), dt=0.01, n_steps=100, save_every=25, t0=2.0,
                        observables={"x": lambda t, y, s: y[0], "t": lambda t, y, s: t})
    np.testing.assert_allclose(tr.times, [2.0, 2.25, 2.5, 2.75, 3.0])
    np.testing.assert_allclose(tr.observables["t"], tr.times)
    np.testing.assert_array_equal(tr.observables["x"], tr.states[:, 0])
    np.testing.assert_array_equal(tr.states[0], Y0)
    fine = sciax.simulate(Lorenz(), Y0, integrator=si.RK4(), dt=0.01, n_steps=100, t0=2.0)
    np.testing.assert_array_equal(fine.states[::25], tr.states)
    lean = sciax.simulate(Lorenz(), Y0, integrator=si.RK4(), dt=0.01, n_steps=100, save_every=25,
                          save_states=False, observables={"x": lambda t, y, s: y[0]})
    assert lean.states is None
    np.testing.assert_array_equal(lean.observables["x"], tr.observables["x"])
    with pytest.raises(ValueError, match="save_states=False"):
        _ = lean.final_state


def test_float32_and_float64_preserved(dtype):
    tr = sciax.simulate(Lorenz(), Y0.astype(dtype), integrator=si.RK4(), dt=0.01, n_steps=10)
    assert tr.states.dtype == dtype and tr.times.dtype == dtype
    g = jax.grad(lambda r: jnp.sum(sciax.simulate(Lorenz(rho=r), Y0.astype(dtype), integrator=si.RK4(),
                                                  dt=0.01, n_steps=10).final_state))(jnp.asarray(28.0, dtype))
    assert g.dtype == dtype


def test_stochastic_keys_independent_of_saving_and_chunking(key):
    system = HarmonicOscillator()
    s0 = PhaseSpace(jnp.array([1.0]), jnp.array([0.0]))
    integ = si.LangevinBAOAB(kT=1.0, friction=0.5)
    one = sciax.simulate(system, s0, integrator=integ, dt=0.05, n_steps=100, save_every=1, key=key)
    coarse = sciax.simulate(system, s0, integrator=integ, dt=0.05, n_steps=100, save_every=50, key=key)
    np.testing.assert_array_equal(one.states.positions[::50], coarse.states.positions)
    first = sciax.simulate(system, s0, integrator=integ, dt=0.05, n_steps=40, key=key)
    second = sciax.simulate(system, first.final_state, integrator=integ, dt=0.05, n_steps=60, key=key,
                            step_offset=40)
    np.testing.assert_array_equal(second.final_state.positions, one.final_state.positions)
    np.testing.assert_array_equal(second.times, one.times[40:])
    other = sciax.simulate(system, s0, integrator=integ, dt=0.05, n_steps=100, key=jr.fold_in(key, 1))
    assert not np.allclose(other.final_state.positions, one.final_state.positions)


def test_check_finite_names_first_bad_frame():
    # Euler on a harmonic well with dt far beyond stability grows geometrically until overflow.
    system = HarmonicOscillator(stiffness=1.0)
    s0 = PhaseSpace(jnp.array([1.0], jnp.float32), jnp.array([0.0], jnp.float32))
    tr = sciax.simulate(system, s0, integrator=si.Euler(), dt=10.0, n_steps=100)
    bad = tr.first_nonfinite_frame()
    assert bad is not None and bool(tr.finite[bad - 1]) and not bool(tr.finite[bad])
    with pytest.raises(sciax.NonFiniteStateError, match=f"by frame {bad} \\(t = {10.0 * bad:g}\\)") as info:
        sciax.simulate(system, s0, integrator=si.Euler(), dt=10.0, n_steps=100, check_finite=True)
    assert info.value.frame == bad
    ok = sciax.simulate(system, s0, integrator=si.Euler(), dt=0.01, n_steps=10, check_finite=True)
    assert ok.first_nonfinite_frame() is None


def test_check_finite_under_jit_raises():
    system = HarmonicOscillator(stiffness=1.0)
    s0 = PhaseSpace(jnp.array([1.0], jnp.float32), jnp.array([0.0], jnp.float32))
    f = jax.jit(lambda s: sciax.simulate(system, s, integrator=si.Euler(), dt=10.0, n_steps=100,
                                         check_finite=True).times)
    with pytest.raises(Exception, match="non-finite"):
        jax.block_until_ready(f(s0))


class TestBadInput:
    def run(self, **overrides):
        kw = dict(integrator=si.RK4(), dt=0.01, n_steps=10)
        kw.update(overrides)
        state = kw.pop("state", Y0)
        system = kw.pop("system", Lorenz())
        return sciax.simulate(system, state, **kw)

    def test_state_shape_mismatch(self):
        with pytest.raises(sciax.StateMismatchError,
                           match=r"Lorenz expects a state of shape \(3,\), got array of shape \(2,\)"):
            self.run(state=jnp.array([1.0, 2.0]))

    def test_particle_state_mismatch(self):
        with pytest.raises(sciax.StateMismatchError, match="expects a sciax.PhaseSpace"):
            sciax.simulate(Kepler(), jnp.zeros(4), integrator=si.VelocityVerlet(), dt=0.01, n_steps=10)
        with pytest.raises(sciax.StateMismatchError, match="same shape"):
            sciax.simulate(Kepler(), PhaseSpace(jnp.zeros(2), jnp.zeros(3)), integrator=si.VelocityVerlet(),
                           dt=0.01, n_steps=10)

    def test_integer_state(self):
        with pytest.raises(sciax.StateMismatchError, match="floating point"):
            self.run(state=jnp.array([1, 0, 0]))

    @pytest.mark.parametrize("dt", [0.0, -0.1, float("nan"), float("inf")])
    def test_bad_dt(self, dt):
        with pytest.raises(ValueError, match="`dt` must be positive and finite"):
            self.run(dt=dt)

    def test_non_scalar_dt(self):
        with pytest.raises(ValueError, match="`dt` must be a scalar"):
            self.run(dt=jnp.array([0.1, 0.2]))

    def test_n_steps_not_multiple_of_save_every(self):
        with pytest.raises(ValueError, match=r"`n_steps` \(10\) must be a multiple of `save_every` \(3\)"):
            self.run(save_every=3)

    @pytest.mark.parametrize("n", [0, -5, 2.5, True])
    def test_bad_n_steps(self, n):
        with pytest.raises((ValueError, TypeError), match="`n_steps`"):
            self.run(n_steps=n)

    def test_missing_key_for_stochastic(self):
        with pytest.raises(ValueError, match="LangevinBAOAB is stochastic: pass `key="):
            sciax.simulate(HarmonicOscillator(), HarmonicOscillator().default_state(),
                           integrator=si.LangevinBAOAB(kT=1.0, friction=1.0), dt=0.01, n_steps=10)

    def test_bad_key(self):
        with pytest.raises(TypeError, match="`key` must be a jax.random key"):
            sciax.simulate(HarmonicOscillator(), HarmonicOscillator().default_state(),
                           integrator=si.LangevinBAOAB(kT=1.0, friction=1.0), dt=0.01, n_steps=10, key=3)

    def test_wrong_integrator_for_system(self):
        with pytest.raises(TypeError, match="VelocityVerlet steps an AbstractHamiltonian"):
            self.run(integrator=si.VelocityVerlet())
        with pytest.raises(TypeError, match="`integrator` must be a sciax.integrators method"):
            self.run(integrator="RK4")

    def test_bad_observables(self):
        with pytest.raises(TypeError, match="`observables` must be a dict"):
            self.run(observables=[lambda t, y, s: y])

    @pytest.mark.parametrize("state", [[1.0, 1.0, 1.0], (1.0, 1.0, 1.0)])
    def test_python_numbers_as_the_state(self, state):
        """They passed the checks and failed inside the traced step (TracerArrayConversionError)."""
        with pytest.raises(sciax.StateMismatchError, match=r"state leaves must be arrays, got (list|tuple) .* "
                                                           r"holding Python numbers; convert the initial state"):
            self.run(state=state)

    @pytest.mark.parametrize("t0", [float("nan"), float("inf"), jnp.array([0.0, 1.0])])
    def test_bad_t0(self, t0):
        with pytest.raises(ValueError, match=r"simulate: `t0` must be (finite, got (nan|inf)\.$|a scalar)"):
            self.run(t0=t0, state=Y0.astype(jnp.float32))  # a value bad as given is not blamed on the cast

    def test_numpy_scalars_in_a_tuple_state_are_arrays(self):
        """tuple(np.array(...)) holds np.float64, a subclass of float: still a valid state."""
        by_tuple = self.run(state=tuple(np.array([1.0, 1.0, 1.0])))
        np.testing.assert_array_equal(by_tuple.final_state, self.run().final_state)

    @pytest.mark.parametrize("state", [0.5, np.float64(0.5)])
    def test_a_bare_python_float_is_a_scalar_state(self, state):
        """A bare Python float went through `jit` as a static value and failed ('float' object is
        not subscriptable); it is a 0-d state like np.float64(0.5). Decay: y' = -k y."""
        traj = sciax.simulate(ExponentialDecay(), state, integrator=si.RK4(), dt=0.1, n_steps=10)
        assert traj.states.shape == (11,) and traj.states.dtype == jnp.float64
        step = 1 - 0.1 + 0.1**2 / 2 - 0.1**3 / 6 + 0.1**4 / 24  # RK4 on a linear ODE: the degree-4 Taylor factor
        np.testing.assert_allclose(traj.final_state, 0.5 * step**10, rtol=1e-14)

    @pytest.mark.parametrize("adjoint", [sciax.DirectAdjoint(), sciax.CheckpointAdjoint(),
                                         sciax.ReversibleAdjoint()], ids=["direct", "checkpoint", "reversible"])
    def test_an_observable_returning_a_python_number(self, adjoint):
        """An observable returning a Python float or int failed while the frames were stacked
        ('float' object is not subscriptable); it is a 0-d array per frame, and a gradient
        through another observable of the same run is unchanged by it."""
        y0 = PhaseSpace(jnp.array([1.0]), jnp.array([0.0]))

        def run(system, extra):
            energy = {"energy": lambda t, y, s: jnp.sum(s.stiffness * y.positions**2 + s.masses * y.velocities**2)}
            return sciax.simulate(system, y0, integrator=si.VelocityVerlet(), dt=0.01, n_steps=20, save_every=5,
                                  adjoint=adjoint, observables={**energy, **extra})

        traj = run(HarmonicOscillator(), {"half": lambda t, y, s: 0.5, "three": lambda t, y, s: 3})
        np.testing.assert_array_equal(traj.observables["half"], np.full(5, 0.5))
        np.testing.assert_array_equal(traj.observables["three"], np.full(5, 3))
        assert traj.observables["three"].dtype.kind == "i" and traj.observables["half"].dtype == jnp.float64
        y32 = PhaseSpace(jnp.array([1.0], jnp.float32), jnp.array([0.0], jnp.float32))
        traj32 = sciax.simulate(sciax.astype(HarmonicOscillator(), jnp.float32), y32, integrator=si.VelocityVerlet(),
                                dt=0.01, n_steps=20, save_every=5, adjoint=adjoint,
                                observables={"half": lambda t, y, s: 0.5})
        assert traj32.observables["half"].dtype == jnp.float32  # the state's precision, not float64
        def energy_sum(k, extra):
            return run(HarmonicOscillator(stiffness=k), extra).observables["energy"].sum()

        grads = [jax.grad(energy_sum)(2.0, extra) for extra in ({}, {"half": lambda t, y, s: 0.5})]
        assert np.isfinite(grads[0]) and grads[0] == grads[1]

    @pytest.mark.parametrize(("dt", "cast"), [(1e-46, "0.0"), (1e39, "inf")])
    def test_dt_that_is_zero_or_inf_in_the_states_precision(self, dt, cast):
        """dt was checked as given, then cast to float32: 1e-46 ran every step at dt = 0."""
        message = f"`dt` must be positive and finite, got {dt!r}, which is {cast} in float32"
        with pytest.raises(ValueError, match=re.escape(message)):
            self.run(state=Y0.astype(jnp.float32), dt=dt)

    def test_nan_initial_state_is_named_when_the_run_checks_finiteness(self):
        bad = Y0.at[1].set(jnp.nan)
        with pytest.raises(sciax.NonFiniteStateError, match=r"simulate: `state0` holds NaN or Inf \(1 value\(s\), "
                                                           r"the first at state0\[1\]\)") as info:
            self.run(state=bad, check_finite=True)
        assert info.value.frame == 0 and info.value.time == 0.0
        assert not self.run(state=bad).finite.any()  # without the check: reported per frame, as before


def test_times_that_cannot_be_told_apart_in_float32_are_warned_about():
    """Near t = 3e7 float32 times are 2 apart: with dt = 1e-3 every saved time was t0, silently."""
    osc = sciax.systems.DampedDrivenOscillator()
    y32 = jnp.array([1.0, 0.0], jnp.float32)
    with pytest.warns(RuntimeWarning, match=r"`dt` = 0.001 is not above the spacing 2 of float32 times near "
                                            r"t = 3e\+07.*the saved times are wrong too") as caught:
        tr = sciax.simulate(osc, y32, integrator=si.RK4(), dt=1e-3, n_steps=5, t0=3.0e7)
    assert np.all(np.asarray(tr.times) == np.float32(3.0e7))  # what the warning is about
    assert caught[0].filename == __file__  # it points at the caller's line
    # Frames farther apart than the spacing keep their times (each is t0 + n dt, rounded once):
    # the warning said "the saved times are wrong" there too.
    with pytest.warns(RuntimeWarning, match=r"the saved frames, 4 apart, keep their times"):
        tr = sciax.simulate(osc, y32, integrator=si.RK4(), dt=1e-3, n_steps=8000, save_every=4000, t0=3.0e7)
    np.testing.assert_array_equal(tr.times, np.float32(3.0e7) + np.array([0, 4, 8], np.float32))
    sciax.simulate(osc, y32, integrator=si.RK4(), dt=4.0, n_steps=5, t0=3.0e7)  # resolved: no warning
    sciax.simulate(osc, y32.astype(jnp.float64), integrator=si.RK4(), dt=1e-3, n_steps=5, t0=3.0e7)


def test_wider_args_than_state_are_refused_by_simulate_and_solve():
    class Driven(sciax.systems.AbstractODE):
        def vector_field(self, t, y, args):
            return -args * y

    y32 = jnp.ones(2, jnp.float32)
    with pytest.raises(TypeError, match=r"simulate: the state is float32 but `args` has wider float parameters"):
        sciax.simulate(Driven(), y32, integrator=si.RK4(), dt=0.1, n_steps=2, args=jnp.array(1.0, jnp.float64))
    with pytest.raises(TypeError, match=r"solve: the state is float32 but `args` has wider float parameters"):
        sciax.solve(Driven(), y32, t0=0.0, t1=1.0, args=jnp.array(1.0, jnp.float64))
    tr = sciax.simulate(Driven(), y32, integrator=si.RK4(), dt=0.1, n_steps=2, args=jnp.array(1.0, jnp.float32))
    assert tr.states.dtype == jnp.float32
    with pytest.raises(TypeError, match=r"`args` has wider float parameters at \(the value itself\)"):
        sciax.simulate(Driven(), y32, integrator=si.RK4(), dt=0.1, n_steps=2, args=np.float64(1.0) * np.ones(1))


# The scripts that run with x64 off, each in a namespace of its own but all in one fresh Python:
# starting Python and importing JAX and sciax is most of each one's time.
_X64_OFF_CHILD = """
import contextlib, io, json, sys, traceback
results = {}
for name, script in json.loads(sys.stdin.read()).items():
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(script, name, "exec"), {"__name__": "__main__"})
        results[name] = {"stdout": out.getvalue()}
    except BaseException:
        results[name] = {"error": traceback.format_exc()}
print(json.dumps(results))
"""


@functools.cache
def _without_x64_outputs() -> dict:
    import json
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _X64_OFF_CHILD], input=json.dumps(X64_OFF_SCRIPTS),
                         capture_output=True, text=True, timeout=120, env={**os.environ, "JAX_ENABLE_X64": "0"})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_without_x64(name: str) -> str:
    """Run `X64_OFF_SCRIPTS[name]` in a fresh Python with JAX's default 32-bit mode (this process
    has x64 on); returns its stdout."""
    result = _without_x64_outputs()[name]
    assert "error" not in result, result.get("error", "")[-2000:]
    return result["stdout"]


class ExponentialDecay(sciax.systems.AbstractODE):
    """y' = -k y, on a state of any shape."""
    k: float = 1.0

    def vector_field(self, t, y, args=None):
        return -self.k * y


def test_numpy_float64_scalars_are_wider_parameters_and_astype_converts_them():
    """np.float64(...) (what np.mean returns) is an np.generic, not an ndarray: the precision
    check skipped it (a cryptic scan carry-type error followed) and sciax.astype left it."""
    class Driven(sciax.systems.AbstractODE):
        k: object = 1.0

        def vector_field(self, t, y, args):
            return -self.k * args * y

    y32 = jnp.ones(2, jnp.float32)
    kw = dict(integrator=si.RK4(), dt=0.1, n_steps=2)
    with pytest.raises(TypeError, match=r"the state is float32 but `args` has wider float parameters"):
        sciax.simulate(Driven(), y32, args=np.float64(2.0), **kw)
    with pytest.raises(TypeError, match=r"the state is float32 but the system has wider float parameters at .k"):
        sciax.simulate(Driven(k=np.float64(0.5)), y32, args=1.0, **kw)
    converted = sciax.astype(Driven(k=np.float64(0.5)), jnp.float32)
    assert converted.k.dtype == np.float32
    assert sciax.simulate(converted, y32, args=np.float32(2.0), **kw).states.dtype == jnp.float32


X64_OFF_SCRIPTS = {
    "numpy_float64_args": (
        "import jax, jax.numpy as jnp, numpy as np, sciax\n"
        "class Driven(sciax.systems.AbstractODE):\n"
        "    def vector_field(self, t, y, args):\n"
        "        return -args * y\n"
        "tr = sciax.simulate(Driven(), jnp.ones(2), integrator=sciax.integrators.RK4(), dt=0.1, n_steps=2,"
        " args=np.array([0.5]))\n"
        "print(tr.states.dtype)\n"
    ),
    "step_index_past_int32": (
        "import jax.numpy as jnp, sciax\n"
        "from sciax.systems import DampedDrivenOscillator\n"
        "kw = dict(integrator=sciax.integrators.Euler(), dt=1.0, n_steps=6)\n"
        "tr = sciax.simulate(DampedDrivenOscillator(), jnp.ones(2), step_offset=2**31 - 7, **kw)\n"
        "print(bool((tr.times > 2e9).all()))\n"
        "for offset in (2**31 - 3, 2**31 + 10, jnp.int32(2**31 - 3), -2**31 - 1):\n"
        "    try:\n"
        "        sciax.simulate(DampedDrivenOscillator(), jnp.ones(2), step_offset=offset, **kw)\n"
        "    except ValueError as err:\n"
        "        print('refused' if 'leave the range of JAX' in str(err) and 'int32' in str(err) else err)\n"
    ),
}


def test_numpy_float64_args_are_fine_when_x64_is_off():
    """With x64 off (JAX's default) a NumPy float64 array becomes float32 in JAX: not refused."""
    assert run_without_x64("numpy_float64_args").strip() == "float32"


def test_step_index_past_the_int32_counter_is_refused_when_x64_is_off():
    """With x64 off step indices are int32: step_offset + n past 2**31 − 1 wrapped to negative
    times (2.1e9 → −2.1e9 mid-run); 2**31 itself raised a bare OverflowError."""
    assert run_without_x64("step_index_past_int32").split() == ["True", "refused", "refused", "refused", "refused"]


def test_wider_integrator_parameters_are_named_as_the_integrators():
    s32 = sciax.astype(HarmonicOscillator().default_state(), jnp.float32)
    with pytest.raises(TypeError, match=r"the state is float32 but the integrator has wider float parameters at .kT"):
        sciax.simulate(sciax.astype(HarmonicOscillator(), jnp.float32), s32,
                       integrator=si.LangevinBAOAB(kT=jnp.array(1.0, jnp.float64), friction=1.0), dt=0.1, n_steps=2,
                       key=jr.key(0))


def test_wider_parameters_than_state_are_refused_not_downcast():
    s32 = Y0.astype(jnp.float32)
    with pytest.raises(TypeError, match=r"the state is float32 but the system has wider float parameters at .*rho"):
        sciax.simulate(Lorenz(rho=jnp.array(28.0, jnp.float64)), s32, integrator=si.RK4(), dt=0.01, n_steps=10)
    # Python floats are weakly typed and follow the state; sciax.astype converts a whole system.
    system = sciax.astype(Lorenz(rho=jnp.array(28.0, jnp.float64)), jnp.float32)
    tr = sciax.simulate(system, s32, integrator=si.RK4(), dt=0.01, n_steps=10)
    assert tr.states.dtype == jnp.float32
    with pytest.raises(TypeError, match="masses"):
        sciax.simulate(HarmonicOscillator(masses=jnp.array(1.0, jnp.float64)),
                       sciax.astype(HarmonicOscillator().default_state(), jnp.float32),
                       integrator=si.VelocityVerlet(), dt=0.1, n_steps=2)
