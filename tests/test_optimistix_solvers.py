"""sciax's Optimistix solvers (sciax/_solvers.py) also stop on a rejected step that is within the
tolerance on y and whose predicted change of the loss is within its round-off; any other
rejection leaves them exactly as Optimistix's own."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
import pytest

from sciax import _optimistix_solvers as _solvers
from sciax.fitting._optimise import choose_solver

# float64 throughout: the suite enables x64 (conftest.py).
TOL = {"rtol": 1e-10, "atol": 1e-10}
NAMES = ["LevenbergMarquardt", "BFGS"]


def _noisy(y, args):
    """r = (10³(y − 1), ½ + η) with η = 0 at the start y₀ = 1 + 10⁻¹² and 4.4·10⁻¹⁶ (4 ulp of ½)
    elsewhere, without a derivative: the loss's round-off, made deterministic. Every step from y₀
    raises the loss by ~2.2·10⁻¹⁶ while the model predicts a decrease of at most ~10⁻¹⁸, so each
    is rejected; y₀ is within 10⁻¹² of the optimum of what the solver can see."""
    noise = jax.lax.stop_gradient(jnp.where(y[0] == Y0_NOISY[0], 0.0, 4.4e-16))
    return jnp.stack([1e3 * (y[0] - 1.0), 0.5 + noise])


Y0_NOISY = jnp.array([1.0 + 1e-12])


def _wrong_jacobian(y, args):
    """r₂ is 10⁻³ at b = 5 and 2·10⁻³ elsewhere, but carries the Jacobian of 10³ b: the model asks
    for a step that reduces r₂ to zero (a predicted change ~10⁻⁶ · |Δb|/10⁻⁶, far above round-off)
    and every step doubles r₂. A rejection the model did not predict: no early stop."""
    a, b = y
    bump = jax.lax.stop_gradient(jnp.where(b == 5.0, 1e-3, 2e-3))
    return jnp.stack([1e3 * (a - 1.0), 1e3 * b - jax.lax.stop_gradient(1e3 * b) + bump])


def _run(solver, residuals, y0, max_steps=200):
    if isinstance(solver, optx.AbstractMinimiser):
        return optx.minimise(lambda y, a: 0.5 * jnp.sum(residuals(y, a) ** 2), solver, y0,
                             max_steps=max_steps, throw=False)
    return optx.least_squares(residuals, solver, y0, max_steps=max_steps, throw=False)


def _first_settled_rejection(solver, residuals, y0):
    """Step Optimistix's own solver by hand and return the 1-based index of the first step that
    rejects a proposal within tolerance whose predicted loss change is below 64·√m ulp of the
    loss, with the point it kept. The rule written out independently of sciax/_solvers.py."""
    least_squares = not isinstance(solver, optx.AbstractMinimiser)
    fn = ((lambda y, a: (residuals(y, a), None)) if least_squares
          else (lambda y, a: (0.5 * jnp.sum(residuals(y, a) ** 2), None)))
    f_struct = jax.eval_shape(lambda: fn(y0, None)[0])
    options = {}
    state = solver.init(fn, y0, None, options, f_struct, None, frozenset())
    step = eqx.filter_jit(solver.step)
    y = y0
    for k in range(1, 200):
        y_next, next_state, _ = step(fn, y, None, options, state, frozenset())
        rejected = int(next_state.num_accepted_steps) == int(state.num_accepted_steps) and k > 1
        delta = np.asarray(state.y_eval) - np.asarray(y)
        within = np.max(np.abs(delta) / (solver.atol + solver.rtol * np.abs(np.asarray(y)))) < 1
        if rejected and within:
            r = np.asarray(residuals(y, None))
            loss = 0.5 * np.sum(r**2)
            grad = np.asarray(jax.grad(lambda x: 0.5 * jnp.sum(residuals(x, None) ** 2))(y))
            m = r.size if least_squares else 1
            if abs(grad @ delta) <= 64 * np.sqrt(m) * np.finfo(np.float64).eps * abs(loss):
                return k, np.asarray(y)
        if bool(next_state.terminate):
            return None, np.asarray(y_next)
        y, state = y_next, next_state
    raise AssertionError("no stop within 200 steps")


@pytest.mark.parametrize("name", NAMES)
def test_a_rejected_step_settled_by_round_off_stops_the_solver(name):
    stock = _run(getattr(optx, name)(**TOL), _noisy, Y0_NOISY)
    ours = _run(getattr(_solvers, name)(**TOL), _noisy, Y0_NOISY)
    expected_steps, expected_y = _first_settled_rejection(getattr(optx, name)(**TOL), _noisy, Y0_NOISY)
    assert ours.result == optx.RESULTS.successful
    assert int(ours.stats["num_steps"]) == expected_steps
    np.testing.assert_array_equal(ours.value, expected_y)
    np.testing.assert_array_equal(ours.value, Y0_NOISY)  # nothing after the start was accepted
    # Optimistix's own solver shrinks the step until y + Δy rounds to y, then accepts that.
    assert stock.result == optx.RESULTS.successful
    assert int(stock.stats["num_steps"]) > expected_steps + 5
    np.testing.assert_array_equal(stock.value, ours.value)


@pytest.mark.parametrize("name", NAMES)
def test_a_rejection_the_model_did_not_predict_does_not_stop_the_solver(name):
    y0 = jnp.array([1.0, 5.0])
    stock = _run(getattr(optx, name)(**TOL), _wrong_jacobian, y0)
    ours = _run(getattr(_solvers, name)(**TOL), _wrong_jacobian, y0)
    assert _first_settled_rejection(getattr(optx, name)(**TOL), _wrong_jacobian, y0)[0] is None
    assert int(ours.stats["num_steps"]) == int(stock.stats["num_steps"])
    np.testing.assert_array_equal(ours.value, stock.value)


def test_bfgs_limited_by_a_stiff_direction_goes_on_to_the_optimum():
    """½(10¹²a² + b²) from (2·10⁻¹¹, 1): the line search's rejected steps are all within 10⁻¹⁰
    (the stiff a limits them) while b is far from 0; the tolerance test alone would stop there."""

    def loss(y, args):
        return 0.5 * (1e12 * y[0] ** 2 + y[1] ** 2)

    y0 = jnp.array([2e-11, 1.0])
    ours = optx.minimise(loss, _solvers.BFGS(**TOL), y0, max_steps=200, throw=False)
    stock = optx.minimise(loss, optx.BFGS(**TOL), y0, max_steps=200, throw=False)
    assert ours.result == optx.RESULTS.successful
    assert abs(float(ours.value[1])) < 1e-8 and abs(float(ours.value[0])) < 1e-10
    np.testing.assert_array_equal(ours.value, stock.value)


@pytest.mark.parametrize("name", NAMES)
def test_zero_tolerances_never_stop_on_a_rejected_step(name):
    ours = _run(getattr(_solvers, name)(rtol=0.0, atol=0.0), _noisy, Y0_NOISY, max_steps=100)
    assert ours.result == optx.RESULTS.nonlinear_max_steps_reached


class _NelderMead(_solvers._StopAtRoundOff, optx.NelderMead):
    __init__ = optx.NelderMead.__init__


def test_a_state_without_the_fields_runs_optimistix_rule_only():
    """A solver state without `y_eval`, `num_accepted_steps`, ... (here Nelder–Mead's; it would be
    a future Optimistix's renamed fields) leaves the solver exactly as Optimistix's own."""

    def loss(y, args):
        return jnp.sum((y - jnp.array([1.0, 2.0])) ** 2)

    y0 = jnp.array([0.0, 0.0])
    ours = optx.minimise(loss, _NelderMead(rtol=1e-8, atol=1e-8), y0, max_steps=500, throw=False)
    stock = optx.minimise(loss, optx.NelderMead(rtol=1e-8, atol=1e-8), y0, max_steps=500, throw=False)
    assert ours.result == optx.RESULTS.successful
    assert int(ours.stats["num_steps"]) == int(stock.stats["num_steps"])
    np.testing.assert_array_equal(ours.value, stock.value)


def test_fit_builds_them_by_name_and_keeps_a_given_instance():
    for name, cls in [("lm", _solvers.LevenbergMarquardt), ("levenberg-marquardt", _solvers.LevenbergMarquardt),
                      ("gauss_newton", _solvers.GaussNewton), ("BFGS", _solvers.BFGS)]:
        solver, *_ = choose_solver(name, "forward", 1e-9, 1e-7, jnp.float64, problem=None)
        assert type(solver) is cls and (solver.rtol, solver.atol) == (1e-9, 1e-7)
    given = optx.LevenbergMarquardt(rtol=1e-8, atol=1e-8)
    assert choose_solver(given, "forward", None, None, jnp.float64, problem=None)[0] is given
