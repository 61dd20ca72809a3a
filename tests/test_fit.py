"""sciax.fit: recovery of known parameters, uncertainties, solvers, multiple shooting, bad input.

Compilation dominates the cost of a fit, so the tests share a few fit configurations (the
same observe function, transforms, solver and data shapes hit the same compiled solve).
"""

import functools
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize

import sciax
from sciax import (
    Bounded,
    FitError,
    Fixed,
    MultipleShooting,
    PhaseSpace,
    Positive,
    Simulate,
)
from sciax.integrators import RK4, VelocityVerlet
from sciax.systems import DampedDrivenOscillator, Lorenz, MassSpringChain

# ---------------------------------------------------------------------------------------------
# The damped oscillator: x(t) observed at 201 times over [0, 20], RK4 with dt = 0.01.
# ---------------------------------------------------------------------------------------------

DT = 0.01
TRUTH = DampedDrivenOscillator(omega=2.0, zeta=0.1)
GUESS = DampedDrivenOscillator(omega=1.5, zeta=0.3)
Y0 = jnp.array([1.0, 0.0])
ROLLOUT = Simulate(RK4(), dt=DT)
TRANSFORMS = {"omega": Positive(), "zeta": Bounded(0.0, 1.0)}
TOL = {"rtol": 1e-10, "atol": 1e-10}


def position(y):
    return y[0]


def oscillator_data():
    traj = sciax.simulate(TRUTH, Y0, integrator=RK4(), dt=DT, n_steps=2000, save_every=10)
    return np.asarray(traj.times), np.asarray(traj.states[:, 0])


TIMES, CLEAN = oscillator_data()


def fit_oscillator(observed, **kwargs):
    options = {"params": ("omega", "zeta"), "observe": position, "rollout": ROLLOUT, "transforms": TRANSFORMS,
               **TOL, **kwargs}
    return sciax.fit(GUESS, Y0, TIMES, observed, **options)


def noisy(seed, noise=0.05):
    return CLEAN + noise * np.random.default_rng(seed).standard_normal(CLEAN.shape)


def test_noise_free_recovery_ode():
    result = fit_oscillator(CLEAN)
    assert result.converged and result.message == ""
    np.testing.assert_allclose(result.params["omega"], 2.0, rtol=1e-8)
    np.testing.assert_allclose(result.params["zeta"], 0.1, rtol=1e-8)
    assert float(result.loss) < 1e-20
    np.testing.assert_allclose(result.system.omega, result.params["omega"])
    assert result.labels == ("omega", "zeta")
    assert result.n_observations == 201 and result.n_parameters == 2
    assert result.residuals.shape == (201,) and result.n_steps > 0


def test_noisy_truth_within_reported_standard_errors():
    """Coverage over seeds: |error| < 3 SE always, and < 1 SE about 68% of the time."""
    z = []
    for seed in range(12):
        result = fit_oscillator(noisy(seed), sigma=0.05)
        assert result.converged
        for name in ("omega", "zeta"):
            z.append((float(result.params[name]) - float(getattr(TRUTH, name)))
                     / float(result.standard_errors[name]))
    z = np.abs(np.array(z))
    assert np.all(z < 3), z
    assert 0.45 < np.mean(z < 1) < 0.9, z  # calibrated: neither too small nor too large


def test_covariance_matches_scipy_least_squares():
    data = noisy(100)
    result = fit_oscillator(data)  # sigma not given: covariance scaled by s² = Σr²/(n − p)

    import jax

    @jax.jit
    def model(p):
        system = DampedDrivenOscillator(omega=p[0], zeta=p[1])
        return sciax.simulate(system, Y0, integrator=RK4(), dt=DT, n_steps=2000, save_every=10).states[:, 0]

    def residuals(p):
        return np.asarray(model(jnp.asarray(p))) - data

    x_opt = np.array([result.params["omega"], result.params["zeta"]], dtype=float)
    reference = scipy.optimize.least_squares(residuals, x_opt * 1.01, method="lm", jac="3-point",
                                             xtol=1e-14, ftol=1e-14)
    np.testing.assert_allclose(reference.x, x_opt, rtol=1e-7)
    jac = reference.jac
    s2 = np.sum(reference.fun**2) / (len(data) - 2)
    expected = np.linalg.inv(jac.T @ jac) * s2
    np.testing.assert_allclose(result.covariance, expected, rtol=1e-6)
    np.testing.assert_allclose(result.residual_variance, s2, rtol=1e-8)
    np.testing.assert_allclose(result.standard_errors["omega"], np.sqrt(expected[0, 0]), rtol=1e-6)
    corr = expected[0, 1] / np.sqrt(expected[0, 0] * expected[1, 1])
    np.testing.assert_allclose(result.correlation, [[1, corr], [corr, 1]], rtol=1e-6)
    assert f"C(omega, zeta) = {corr: .3f}" in result.summary()
    assert result.summary(min_correlation=1.0).endswith("correlations (|C| ≥ 1): none")

    # With sigma given the covariance is not rescaled: σ² (JᵀJ)⁻¹.
    with_sigma = fit_oscillator(data, sigma=0.05)
    np.testing.assert_allclose(with_sigma.covariance, expected * 0.05**2 / s2, rtol=1e-6)
    np.testing.assert_allclose(with_sigma.params["omega"], result.params["omega"], rtol=1e-9)
    # What other tools report: the SSE without sigma, χ² with it (the summary showed only ½Σr²).
    sse = np.sum(residuals(x_opt) ** 2)  # an independent rollout of the fitted model
    np.testing.assert_allclose(result.chi_square, sse, rtol=1e-8)
    np.testing.assert_allclose(with_sigma.chi_square, sse / 0.05**2, rtol=1e-6)
    assert f"SSE (no sigma): {result.chi_square:.6g} ({sse / (len(data) - 2):.4g} per degree of freedom)" \
        in result.summary()
    assert f"χ²: {with_sigma.chi_square:.6g}" in with_sigma.summary()


def test_covariance_comes_from_the_solvers_last_linearisation(monkeypatch):
    """Levenberg–Marquardt's state holds r and J at the point it returns; the covariance is
    built from them (no second rollout) and equals the one from a fresh linearisation there.
    A saturated transform (dv/du = 0) cannot be divided out and falls back to the latter."""
    import optimistix as optx

    from sciax.fitting import _optimise

    fresh = _optimise.physical_linearisation

    def refuse(*args, **kwargs):
        raise AssertionError("LM fit linearised again instead of using the solver's state")

    monkeypatch.setattr(_optimise, "physical_linearisation", refuse)
    result = fit_oscillator(noisy(9))
    monkeypatch.setattr(_optimise, "physical_linearisation", fresh)
    jac, r = fresh(result.problem, result.optimum, "fwd")
    cov, _, variance, full_rank = _optimise.gauss_newton_covariance(jac, r, 2, 2, True)
    np.testing.assert_allclose(result.residuals, r, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(result.covariance, cov, rtol=1e-10)
    np.testing.assert_allclose(result.residual_variance, variance, rtol=1e-13)
    assert full_rank

    # Saturated transforms (dv/du = 0 or below √tiny) and a solve that took no step: the
    # solver's J_u cannot be used, so `package` linearises in physical units.
    calls = []
    monkeypatch.setattr(_optimise, "physical_linearisation", lambda *a, **k: calls.append(a) or fresh(*a, **k))
    for second_scale, n_steps in ((0.0, 3), (1e-200, 3), (result.scale[1], 0)):
        out = {"v": result.optimum, "scale": jnp.array([result.scale[0], second_scale]),
               "params": (result.system.omega, result.system.zeta),
               "state0": tuple(jax.tree_util.tree_leaves(result.state0)),
               "segment_states": tuple(jax.tree_util.tree_leaves(result.segment_states)),
               "result": tuple(jax.tree_util.tree_leaves(optx.RESULTS.successful)), "success": True, "n_steps": n_steps,
               "jac": jnp.full((r.size, 2), jnp.nan), "r": jnp.zeros_like(r)}
        fallback = _optimise.package(result.problem, None, result.segment_times, out, "fwd", True)
        np.testing.assert_allclose(fallback.covariance, cov, rtol=1e-12)
        np.testing.assert_allclose(fallback.residuals, r, rtol=1e-13, atol=1e-15)
    assert len(calls) == 3


def _spy_on_fast(monkeypatch, jitted, calls):
    """Record (jitted, its fast jit, args) of every call that reaches `jitted.fast`."""
    fast = jitted.fast
    monkeypatch.setattr(jitted, "fast", lambda *a: calls.append((jitted, fast, a)) or fast(*a))


def _programs_differ(call):
    """Whether the fast jit recorded in `call` compiled a different program than the default."""
    jitted, fast, args = call
    text = lambda jit: jit.lower(*args).compile().compiled.as_text()  # noqa: E731 - cached compiles
    return text(fast) != text(jitted.optimised)


@pytest.mark.parametrize("solver", ["levenberg_marquardt", "bfgs"])
def test_fast_compilation_gives_the_same_fit(monkeypatch, solver):
    """compilation="fast" compiles the solve (and, for BFGS, the linearisation at the optimum)
    with the quick-compile XLA options, and reaches the same optimum and covariance."""
    from sciax.fitting import _optimise

    data = noisy(11)
    default = fit_oscillator(data, solver=solver, compilation="optimised")
    assert default.compilation == "optimised"
    calls = []
    for jitted in (_optimise.solve, _optimise.physical_linearisation):
        _spy_on_fast(monkeypatch, jitted, calls)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", category=RuntimeWarning)  # this jaxlib takes the options
        quick = fit_oscillator(data, solver=solver, compilation="fast")
    expected = [_optimise.solve] + ([_optimise.physical_linearisation] if solver == "bfgs" else [])
    assert [jitted for jitted, *_ in calls] == expected
    assert _programs_differ(calls[0])  # the options reached XLA
    assert quick.converged and quick.compilation == "fast"
    # Different round-off takes the solvers along different paths (LM: 14/15, 20/28, 12/23, 12/12
    # steps for four data sets), so they stop at different points within the tolerance (1e-10):
    # the optimum differs by up to 2.2e-10 for LM and 1.8e-9 for BFGS (which only sees the scalar
    # loss), and the covariance, evaluated at the returned point, by up to 1.1e-9 and 7e-9.
    rtol = 1e-9 if solver == "levenberg_marquardt" else 1e-7
    for name in ("omega", "zeta"):
        np.testing.assert_allclose(quick.params[name], default.params[name], rtol=rtol)
        np.testing.assert_allclose(quick.standard_errors[name], default.standard_errors[name], rtol=100 * rtol)
    np.testing.assert_allclose(quick.covariance, default.covariance, rtol=100 * rtol)


def test_fast_compilation_of_a_failing_fit_and_off_cpu(monkeypatch):
    """The check that explains a failed fit compiles quickly too; on another platform the
    default compile is used whatever `compilation` says."""
    from sciax.fitting import _optimise

    calls = []
    for jitted in (_optimise.solve, _optimise._initial_residuals_finite):
        _spy_on_fast(monkeypatch, jitted, calls)
    bad = DampedDrivenOscillator(omega=400.0, zeta=0.1)  # blows up RK4 at the initial guess
    result = sciax.fit(bad, Y0, TIMES, CLEAN, params=("omega", "zeta"), observe=position, rollout=ROLLOUT,
                       transforms=TRANSFORMS, throw=False, compilation="fast", **TOL)
    assert not result.converged and "not finite" in result.message
    assert [jitted for jitted, *_ in calls] == [_optimise.solve, _optimise._initial_residuals_finite]

    calls.clear()
    monkeypatch.setattr(_optimise, "_platform", lambda problem: "gpu")
    fit_oscillator(CLEAN, compilation="fast")
    assert calls == []


class _Stop(Exception):
    """Raised by a stand-in for the solve: carries what `fit` chose, compiles nothing."""


def _chosen(fit_call):
    """(compilation, problem, segment states, solver, mode) that `fit_call()` hands the solve."""
    from sciax.fitting import _fit

    def stand_in(problem, segment_states, solver, options, max_steps, mode, compilation):
        raise _Stop(compilation, problem, segment_states, solver, mode)

    with pytest.MonkeyPatch.context() as patch, pytest.raises(_Stop) as stop:
        patch.setattr(_fit, "solve", stand_in)
        fit_call()
    return stop.value.args


def test_auto_compilation_compiles_small_models_fast_and_reproducibly():
    """The default, compilation="auto", compiles the oscillator fast (FitResult.compilation says
    so) and returns exactly what compilation="fast" does; the optimised program agrees within the
    tolerance."""
    data = noisy(5)
    auto = fit_oscillator(data)
    fast = fit_oscillator(data, compilation="fast")
    optimised = fit_oscillator(data, compilation="optimised")
    assert (auto.compilation, fast.compilation, optimised.compilation) == ("fast", "fast", "optimised")
    for name in ("omega", "zeta"):
        assert auto.params[name].tobytes() == fast.params[name].tobytes()
        np.testing.assert_allclose(auto.params[name], optimised.params[name], rtol=1e-9)
    assert auto.covariance.tobytes() == fast.covariance.tobytes()


def test_auto_compilation_rule(monkeypatch):
    """"auto" is "fast" exactly when the residuals' operation count times the passes of one step
    times `max_steps` is within AUTO_FAST_MAX_OPERATIONS; an adaptive Solve (a loop of unknown
    length) and a large particle system are optimised; off a CPU it is always optimised; the
    count is made once per problem structure."""
    import equinox as eqx

    from sciax._compile.operation_count import operation_count
    from sciax.fitting import _optimise

    compilation, problem, states, solver, mode = _chosen(lambda: fit_oscillator(CLEAN))
    assert compilation == "fast" and mode == "fwd"
    operations = operation_count(eqx.filter_make_jaxpr(_optimise._residuals_at_start)(problem, states)[0])
    per_step = operations * (1 + problem.n_unknowns)
    assert 1e5 < per_step and 256 * per_step <= _optimise.AUTO_FAST_MAX_OPERATIONS  # 2,000 RK4 steps, 2 states
    _optimise._AUTO_MEMO.clear()
    monkeypatch.setattr(_optimise, "AUTO_FAST_MAX_OPERATIONS", 100 * per_step)
    assert _optimise.resolve_compilation("auto", problem, states, solver, mode, 100) == "fast"
    assert _optimise.resolve_compilation("auto", problem, states, solver, mode, 101) == "optimised"
    monkeypatch.undo()
    # A larger step limit (the advice for a fit that did not converge) can tip it.
    assert _chosen(lambda: fit_oscillator(CLEAN, max_steps=10_000))[0] == "optimised"
    # Explicit choices are kept; off a CPU everything is optimised.
    assert _optimise.resolve_compilation("fast", problem, states, solver, mode, 10_000) == "fast"
    monkeypatch.setattr(_optimise, "_platform", lambda problem: "gpu")
    for choice in ("auto", "fast", "optimised"):
        assert _optimise.resolve_compilation(choice, problem, states, solver, mode, 256) == "optimised"
    monkeypatch.undo()
    _optimise._AUTO_MEMO.clear()

    # Counted once per structure: new data of the same shapes reuse the choice.
    counts = []
    monkeypatch.setattr(_optimise, "operation_count", lambda j: counts.append(1) or operation_count(j))
    for seed in (1, 2):
        assert _chosen(functools.partial(fit_oscillator, noisy(seed)))[0] == "fast"
    assert counts == [1]
    monkeypatch.undo()

    solve_rollout = sciax.Solve(rtol=1e-8, atol=1e-10)
    assert _chosen(lambda: fit_oscillator(CLEAN, rollout=solve_rollout))[0] == "optimised"

    # 32 masses, 1,000 velocity-Verlet steps, 31 stiffnesses: far above the limit.
    n = 32
    chain = MassSpringChain(masses=jnp.ones(n), stiffness=jnp.full(n - 1, 2.0))
    start = PhaseSpace(jnp.arange(n, dtype=jnp.float64)[:, None], jnp.zeros((n, 1)).at[0, 0].set(0.1))
    times = np.arange(1, 101) * 0.1
    positions = np.zeros((100, n))

    def fit_chain_of_32():
        sciax.fit(chain, start, times, positions, params="stiffness", observe=chain_positions, t0=0.0,
                  rollout=Simulate(VelocityVerlet(), dt=0.01))

    assert _chosen(fit_chain_of_32)[0] == "optimised"


def test_fast_compilation_drops_only_the_options_xla_does_not_know(monkeypatch):
    """A jaxlib that does not know one option of FAST_CPU_COMPILER_OPTIONS: that option is
    dropped with a warning naming it, the others still apply. Other errors propagate."""
    from sciax.fitting import _optimise

    solve = _optimise.solve
    options = {**_optimise.FAST_CPU_COMPILER_OPTIONS, "xla_cpu_option_that_does_not_exist": True}
    monkeypatch.setattr(solve, "options", options)
    monkeypatch.setattr(solve, "fast", eqx.filter_jit(solve.fn, compiler_options=options))
    calls = []
    _spy_on_fast(monkeypatch, solve, calls)
    with pytest.warns(RuntimeWarning, match="does not know the XLA option 'xla_cpu_option_that_does_not_exist'"):
        result = fit_oscillator(CLEAN, compilation="fast")
    np.testing.assert_allclose(result.params["omega"], 2.0, rtol=1e-8)
    assert solve.options == _optimise.FAST_CPU_COMPILER_OPTIONS
    assert _programs_differ((solve, solve.fast, calls[0][2]))  # rebuilt with the options it knows

    def broken(*args):
        raise jax.errors.JaxRuntimeError("INTERNAL: something else went wrong")

    monkeypatch.setattr(solve, "fast", broken)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", category=RuntimeWarning)
        with pytest.raises(jax.errors.JaxRuntimeError, match="something else went wrong"):
            fit_oscillator(CLEAN, compilation="fast")


def test_covariance_is_nan_with_fewer_residuals_than_unknowns():
    from sciax.fitting._optimise import gauss_newton_covariance

    cov, unscaled, variance, full_rank = gauss_newton_covariance(np.array([[1.0, 2.0]]), np.array([0.5]), 2, 2, False)
    assert not full_rank and np.isnan(cov).all() and np.isnan(unscaled).all() and np.isnan(variance)
    cov, _, _, full_rank = gauss_newton_covariance(np.array([[1.0, 2.0], [0.0, 1.0]]), np.zeros(2), 2, 2, False)
    assert full_rank
    np.testing.assert_allclose(cov, np.linalg.inv(np.array([[1.0, 2.0], [2.0, 5.0]])), rtol=1e-13)


def test_messages_say_why_standard_errors_are_nan():
    """Two observations for two unknowns leave no residual degrees of freedom: the standard
    errors were NaN with converged=True and an empty message (SciPy's curve_fit warns)."""
    exact = sciax.fit(GUESS, Y0, TIMES[[10, 30]], CLEAN[[10, 30]], params=("omega", "zeta"), observe=position,
                      rollout=ROLLOUT, t0=0.0, transforms=TRANSFORMS, **TOL)
    assert exact.converged and np.isnan(exact.standard_errors["omega"])
    assert "2 residuals for 2 unknowns leave no degrees of freedom" in exact.message and "`sigma`" in exact.message
    given = sciax.fit(GUESS, Y0, TIMES[[10, 30]], CLEAN[[10, 30]], params=("omega", "zeta"), observe=position,
                      rollout=ROLLOUT, t0=0.0, transforms=TRANSFORMS, sigma=0.05, **TOL)
    assert given.message == "" and np.isfinite(given.standard_errors["omega"])
    # Undriven (drive_amplitude = 0): drive_frequency changes nothing, so J has a zero column.
    # It made every standard error NaN; now only its own, and it is named.
    blind = fit_oscillator(noisy(4), params=("omega", "zeta", "drive_frequency"), sigma=0.05,
                           transforms={**TRANSFORMS, "drive_frequency": Positive()})
    assert blind.converged and np.isnan(blind.standard_errors["drive_frequency"])
    assert blind.unidentifiable == ("drive_frequency",)
    assert "drive_frequency is not identifiable from these data" in blind.message
    assert "not identifiable from these data: drive_frequency" in blind.summary()
    seeing = fit_oscillator(noisy(4), sigma=0.05)  # the reference: the same fit without it
    for name in ("omega", "zeta"):
        np.testing.assert_allclose(blind.standard_errors[name], seeing.standard_errors[name], rtol=1e-6)


def test_covariance_rank_test_does_not_depend_on_parameter_units():
    """Columns 10^7 apart through the units alone (float32): the unscaled SVD called this
    well-posed Jacobian rank-deficient and returned NaN. Reference: float64 (JᵀJ)⁻¹."""
    from sciax.fitting._optimise import gauss_newton_covariance

    rng = np.random.default_rng(1)
    jac32 = (rng.standard_normal((50, 3)) * np.array([1e5, 1.0, 1e-2])).astype(np.float32)
    cov, _, _, full_rank = gauss_newton_covariance(jac32, np.zeros(50, np.float32), 3, 3, False)
    assert full_rank and cov.dtype == np.float32
    jac64 = jac32.astype(np.float64)
    expected = np.linalg.inv(jac64.T @ jac64)
    scale = np.sqrt(np.outer(np.diag(expected), np.diag(expected)))  # compare in correlation units
    np.testing.assert_allclose(cov / scale, expected / scale, rtol=0, atol=1e-6)
    jac64[:, 1] = 0.0  # a parameter the data do not depend on: not identifiable
    cov, _, _, full_rank = gauss_newton_covariance(jac64, np.zeros(50), 3, 3, False)
    assert not full_rank and np.isnan(cov[1]).all() and np.isnan(cov[:, 1]).all()
    kept = jac64[:, [0, 2]]  # the others keep the covariance of the fit without it
    np.testing.assert_allclose(cov[np.ix_([0, 2], [0, 2])], np.linalg.inv(kept.T @ kept), rtol=1e-9)


def test_only_the_parameters_in_an_undetermined_combination_lose_their_standard_errors():
    """Two parameters entering only through their sum are not identifiable; a third is, with
    the variance of the model written with the sum as one parameter (an estimable value has the
    same variance with any generalised inverse)."""
    from sciax.fitting._optimise import gauss_newton_covariance

    rng = np.random.default_rng(2)
    a, c = rng.standard_normal(40), rng.standard_normal(40)
    jac = np.stack([a, 1e3 * c, a], axis=1)  # parameters 0 and 2 only as p0 + p2
    cov, unscaled, _, full_rank = gauss_newton_covariance(jac, np.zeros(40), 3, 3, False)
    assert not full_rank
    assert np.isnan(cov[0]).all() and np.isnan(cov[2]).all() and np.isfinite(cov[1, 1])
    reduced = np.stack([a, 1e3 * c], axis=1)
    np.testing.assert_allclose(cov[1, 1], np.linalg.inv(reduced.T @ reduced)[1, 1], rtol=1e-9)


def test_float32_fit_of_a_large_population_reports_standard_errors():
    """SIR with N = 10^7 fitting (β, γ, I₀) in float32: the errors match the float64 fit's."""
    from sciax.systems import SIR

    n, i0 = 1e7, 1e5
    traj = sciax.simulate(SIR(beta=0.4, gamma=0.1, population=n), jnp.array([n - i0, i0, 0.0]), integrator=RK4(),
                          dt=0.1, n_steps=600, save_every=10)
    infected = np.asarray(traj.states[:, 1])
    sigma = np.sqrt(infected)
    data = infected + sigma * np.random.default_rng(0).standard_normal(infected.shape)
    results = {}
    for dtype in (jnp.float64, jnp.float32):
        results[dtype] = sciax.fit(
            sciax.astype(SIR(beta=0.38, gamma=0.11, population=n), dtype),
            jnp.array([n - 1.1 * i0, 1.1 * i0, 0.0], dtype), np.asarray(traj.times), data.astype(dtype),
            params=("beta", "gamma"), observe=lambda y: y[1], sigma=sigma.astype(dtype),
            fit_initial_state=np.array([False, True, False]), rollout=Simulate(RK4(), dt=0.1))
    r32, r64 = results[jnp.float32], results[jnp.float64]
    assert r32.converged and "rank-deficient" not in r32.message
    np.testing.assert_allclose(np.sqrt(np.diag(r32.covariance)), np.sqrt(np.diag(r64.covariance)), rtol=1e-3)


def test_masked_array_observations_count_as_missing():
    """A NumPy masked array's mask is honoured (np.asarray would drop it and fit the masked values)."""
    corrupted = noisy(3)
    corrupted[20:30] = 50.0
    as_masked_array = fit_oscillator(np.ma.masked_where(np.abs(corrupted) > 10, corrupted), sigma=0.05)
    with_mask = fit_oscillator(corrupted, sigma=0.05, mask=np.abs(corrupted) <= 10)
    assert as_masked_array.n_observations == with_mask.n_observations == 191
    np.testing.assert_allclose(as_masked_array.optimum, with_mask.optimum, rtol=1e-12)
    # plot_fit draws the same points: the masked (corrupted) values are not data.
    fig = sciax.plot_fit(as_masked_array, TIMES, np.ma.masked_where(np.abs(corrupted) > 10, corrupted), n_samples=0)
    drawn = fig.axes[0].lines[1].get_ydata()
    assert len(drawn) == 191 and np.max(np.abs(drawn)) < 10


@pytest.mark.parametrize("solver", ["gauss_newton", "bfgs"])
def test_solvers_reach_the_same_optimum(solver):
    data = noisy(7)
    reference = fit_oscillator(data)
    other = fit_oscillator(data, solver=solver)
    assert other.converged
    for name in ("omega", "zeta"):
        np.testing.assert_allclose(other.params[name], reference.params[name], rtol=1e-6)
    np.testing.assert_allclose(other.covariance, reference.covariance, rtol=1e-4)


def test_forward_and_reverse_jacobians_agree():
    data = noisy(8)
    forward = fit_oscillator(data, jacobian="forward")
    reverse = fit_oscillator(data, jacobian="reverse")
    for name in ("omega", "zeta"):
        np.testing.assert_allclose(reverse.params[name], forward.params[name], rtol=1e-9)
    np.testing.assert_allclose(reverse.covariance, forward.covariance, rtol=1e-8)


def test_fused_forward_jacobian_is_the_plain_derivative():
    """`forward_residual_function` (one rollout with all tangents, then J·u̇) has exactly the
    derivatives of the plain residual function: JVP, the linearisation and its transpose (what
    Optimistix applies), reverse mode, and derivatives with respect to the data (fallback).

    Each derivative is taken under `jit`, as `fit` takes them (one compilation each, instead of
    hundreds of eager primitives), and each function in its own program, so that XLA cannot
    share work between the fused and the plain one."""
    import equinox as eqx
    import jax

    from sciax.fitting._problem import forward_residual_function, residual_function

    problem = fit_oscillator(noisy(8)).problem
    u = problem.to_unconstrained(jnp.array([1.7, 0.25]))  # away from the optimum
    u_dot = jnp.array([0.3, -1.2])

    @eqx.filter_jit
    def jvp(function, u, u_dot, problem):
        return jax.jvp(lambda x: function(x, problem), (u,), (u_dot,))

    @eqx.filter_jit
    def linearised_and_transposed(function, u, u_dot, cotangent, problem):
        _, linear = jax.linearize(lambda x: function(x, problem), u)
        return linear(u_dot), jax.linear_transpose(linear, u)(cotangent)[0]

    @eqx.filter_jit
    def vjp(function, u, cotangent, problem):
        return jax.vjp(lambda x: function(x, problem), u)[1](cotangent)[0]

    @eqx.filter_jit
    def jacobian(transform, function, u, problem):
        return transform(lambda x: function(x, problem))(u)

    r_ref, jvp_ref = jvp(residual_function, u, u_dot, problem)
    r, jvp_fused = jvp(forward_residual_function, u, u_dot, problem)
    np.testing.assert_array_equal(r, r_ref)
    np.testing.assert_allclose(jvp_fused, jvp_ref, rtol=1e-12, atol=1e-14 * float(jnp.max(jnp.abs(jvp_ref))))

    cotangent = jnp.linspace(-1.0, 1.0, r.size)
    linear_u_dot, transposed = linearised_and_transposed(forward_residual_function, u, u_dot, cotangent, problem)
    vjp_ref = vjp(residual_function, u, cotangent, problem)
    np.testing.assert_allclose(linear_u_dot, jvp_ref, rtol=1e-12, atol=1e-14 * float(jnp.max(jnp.abs(jvp_ref))))
    np.testing.assert_allclose(transposed, vjp_ref, rtol=1e-12)
    np.testing.assert_allclose(jacobian(jax.jacrev, forward_residual_function, u, problem),
                               jacobian(jax.jacfwd, residual_function, u, problem), rtol=1e-12, atol=1e-14)

    @eqx.filter_jit
    def grad_of_data(function, observed, problem):
        def loss_of_data(observed):
            p = eqx.tree_at(lambda q: q.observed, problem, observed)
            return 0.5 * jnp.sum(function(u, p) ** 2)

        return jax.grad(loss_of_data)(observed)

    grads = [grad_of_data(f, problem.observed, problem) for f in (forward_residual_function, residual_function)]
    np.testing.assert_allclose(grads[0][0], grads[1][0], rtol=1e-12)


def test_a_new_observe_lambda_reuses_the_compiled_solve(compiles):
    """A lambda re-created for every fit (a loop over datasets) must not recompile the solve."""

    def observe_position():
        return lambda y: y[0]

    first = fit_oscillator(noisy(11), observe=observe_position())
    compiles.clear()
    again = fit_oscillator(noisy(12), observe=observe_position())
    assert compiles == []
    assert again.converged and float(again.params["omega"]) != float(first.params["omega"])
    np.testing.assert_allclose(again.params["omega"], 2.0, atol=4 * float(again.standard_errors["omega"]))


def test_new_observation_times_reuse_the_compiled_solve_and_their_own_start(compiles):
    """The segment start times were static fields of the compiled problem: a new first time
    (a series starting at 0.5 instead of 0) recompiled the whole solve. They are values now,
    so the program is reused; the drive depends on absolute time, so a stale start would fit
    the second series wrongly."""

    truth = DampedDrivenOscillator(omega=2.0, zeta=0.1, drive_amplitude=1.0, drive_frequency=1.3)
    guess = DampedDrivenOscillator(omega=1.5, zeta=0.3, drive_amplitude=1.0, drive_frequency=1.3)
    series = []
    for t0 in (0.0, 0.5, 1.25):
        traj = sciax.simulate(truth, Y0, integrator=RK4(), dt=DT, n_steps=1000, save_every=10, t0=t0)
        series.append((t0, np.asarray(traj.times), np.asarray(traj.states[:, 0])))
    options = dict(params=("omega", "zeta"), observe=position, rollout=ROLLOUT, transforms=TRANSFORMS, **TOL)
    results = []
    for t0, times, observed in series:
        results.append(sciax.fit(guess, Y0, times, observed, t0=t0, **options))
        if len(results) == 1:
            compiles.clear()
    assert compiles == []
    for r, (t0, _, _) in zip(results, series):
        assert r.converged and r.segment_times == (t0,)
        np.testing.assert_allclose([r.params["omega"], r.params["zeta"]], [2.0, 0.1], rtol=1e-8)


def test_selector_and_filter_select_like_names():
    import equinox as eqx
    import jax.tree_util as jtu

    by_name = fit_oscillator(CLEAN)
    by_selector = fit_oscillator(CLEAN, params=lambda s: (s.omega, s.zeta))
    flags = eqx.tree_at(lambda s: (s.omega, s.zeta), jtu.tree_map(lambda _: False, GUESS), (True, True))
    by_filter = fit_oscillator(CLEAN, params=flags)
    for result in (by_selector, by_filter):
        assert result.labels == by_name.labels
        np.testing.assert_array_equal(result.params["omega"], by_name.params["omega"])
    with pytest.raises(ValueError, match="selector returned .* not a field of the DampedDrivenOscillator"):
        fit_oscillator(CLEAN, params=lambda s: jnp.array(2.0))
    # A misspelt field was reported as "the selector returned NoneType None".
    with pytest.raises(ValueError, match=r"selector failed on the DampedDrivenOscillator passed in \(.*'zeta_typo'\); "
                                         r"its fields are \['omega', 'zeta', "):
        fit_oscillator(CLEAN, params=lambda s: (s.omega, s.zeta_typo))


def test_float32_fit_follows_the_state_dtype():
    y0 = Y0.astype(jnp.float32)
    traj = sciax.simulate(TRUTH, y0, integrator=RK4(), dt=DT, n_steps=2000, save_every=10)
    times, xs = np.asarray(traj.times), np.asarray(traj.states[:, 0])  # float32 times from a float32 run
    result = sciax.fit(GUESS, y0, times, xs + 0.05 * np.random.default_rng(0).standard_normal(xs.shape),
                       params=("omega", "zeta"), observe=position, rollout=ROLLOUT, transforms=TRANSFORMS, sigma=0.05)
    assert result.converged
    assert result.params["omega"].dtype == jnp.float32 and result.covariance.dtype == jnp.float32
    assert result.system.zeta.dtype == jnp.float32 and result.state0.dtype == jnp.float32
    reference = fit_oscillator(noisy(0), sigma=0.05)  # the same noise in float64
    with pytest.raises(TypeError, match="the state is float32 but the system has wider float parameters at .omega"):
        sciax.fit(DampedDrivenOscillator(omega=jnp.array(1.5, jnp.float64)), y0, times, xs, params="omega",
                  observe=position, rollout=ROLLOUT)
    np.testing.assert_allclose(result.params["omega"], reference.params["omega"], rtol=1e-4)
    np.testing.assert_allclose(result.standard_errors["zeta"], reference.standard_errors["zeta"], rtol=1e-3)


def test_solve_rollout_recovers_parameters_at_arbitrary_times():
    """Diffrax-backed rollout, observation times off any grid, data from sciax.solve itself."""
    times = np.sort(np.random.default_rng(4).uniform(0.0, 12.0, 60))
    rollout = sciax.Solve(solver="tsit5", rtol=1e-9, atol=1e-9)
    data = sciax.solve(TRUTH, Y0, t0=0.0, t1=float(times[-1]), save_at=times, rtol=1e-9, atol=1e-9).states[:, 0]
    result = sciax.fit(GUESS, Y0, times, np.asarray(data), params=("omega", "zeta"), observe=position,
                       rollout=rollout, transforms=TRANSFORMS, t0=0.0, **TOL)
    np.testing.assert_allclose(result.params["omega"], 2.0, rtol=1e-8)
    np.testing.assert_allclose(result.params["zeta"], 0.1, rtol=1e-8)


def test_non_convergence_is_reported_never_success():
    """A start that blows up RK4 (ω·dt far past its stability limit) cannot be fitted."""
    bad = DampedDrivenOscillator(omega=400.0, zeta=0.1)
    options = {"params": ("omega", "zeta"), "observe": position, "rollout": ROLLOUT, "transforms": TRANSFORMS, **TOL}
    with pytest.raises(FitError, match="not finite.*initial guess"):
        sciax.fit(bad, Y0, TIMES, CLEAN, **options)
    result = sciax.fit(bad, Y0, TIMES, CLEAN, throw=False, **options)
    assert result.converged is False
    assert "not finite" in result.message
    assert "the model blew up; start closer" in result.message and "Diffrax" not in result.message


def test_a_solve_that_fails_at_the_initial_guess_is_named_as_a_possible_cause():
    """Diffrax reaching `max_steps` gives non-finite states too: the message blamed the model
    alone and quoted Lineax ("you have a bug upstream of Lineax")."""
    result = fit_oscillator(CLEAN, rollout=sciax.Solve(max_steps=5), throw=False)
    assert not result.converged
    assert result.message.startswith("the residuals are not finite (NaN/Inf) at the initial guess: the model blew "
                                     "up, or Diffrax's solve failed there (a `Solve` returns non-finite states when "
                                     "it reaches `max_steps`")
    assert "The optimiser's message: " in result.message


def _band(fig):
    """(t, fitted curve, lower, upper) of the first axes' band (fill_between's polygon)."""
    from matplotlib.collections import PolyCollection

    ax = fig.axes[0]
    (poly,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
    vertices = poly.get_paths()[0].vertices
    t, fitted = ax.lines[0].get_xdata(), ax.lines[0].get_ydata()
    at = [vertices[np.isclose(vertices[:, 0], ti, rtol=0, atol=1e-12), 1] for ti in t]
    return t, fitted, np.array([a.min() for a in at]), np.array([a.max() for a in at])


def exact_position(t, w, z):
    """x(t) of the damped oscillator from x₀ = 1, v₀ = 0 (underdamped)."""
    wd = w * np.sqrt(1 - z**2)
    return np.exp(-z * w * t) * (np.cos(wd * t) + z * w / wd * np.sin(wd * t))


def test_plot_fit_band_is_the_delta_method_band():
    """The 95% band around the fitted curve against an independent one: the delta method on the
    exact solution x(t; ω, ζ) = e^{-ζωt}(x₀ cos ω_d t + (v₀ + ζωx₀)/ω_d sin ω_d t), half-width
    1.96 √(gᵀ Σ g) with g = ∂x/∂(ω, ζ) by central differences. A band drawn from a zero or a
    wrong covariance fails; four times the covariance doubles it."""
    from matplotlib.figure import Figure

    data = noisy(3)
    result = fit_oscillator(data, sigma=0.05)
    fig = sciax.plot_fit(result, TIMES, data, n_samples=400, labels=["x"])
    assert isinstance(fig, Figure) and len(fig.axes[0].lines[1].get_xdata()) == len(TIMES)
    t, fitted, lower, upper = _band(fig)
    assert np.all(lower <= fitted + 1e-12) and np.all(fitted <= upper + 1e-12)  # the band holds the fit

    omega, zeta = float(result.params["omega"]), float(result.params["zeta"])
    x = functools.partial(exact_position, t)
    np.testing.assert_allclose(fitted, x(omega, zeta), atol=1e-6)  # RK4 at dt = 0.01
    h = 1e-6
    g = np.stack([(x(omega + h, zeta) - x(omega - h, zeta)) / (2 * h),
                  (x(omega, zeta + h) - x(omega, zeta - h)) / (2 * h)], axis=1)
    half_width = 1.959964 * np.sqrt(np.einsum("ti,ij,tj->t", g, np.asarray(result.covariance), g))
    where = half_width > 0.2 * half_width.max()  # away from the zeros of ∂x/∂θ
    ratio = 0.5 * (upper - lower)[where] / half_width[where]
    assert 0.9 < np.median(ratio) < 1.1, np.median(ratio)  # 400 draws: quantiles to a few percent

    wider = sciax.plot_fit(eqx.tree_at(lambda r: r.covariance, result, 4 * result.covariance), TIMES, data,
                           n_samples=400, labels=["x"])
    _, _, lower4, upper4 = _band(wider)
    np.testing.assert_allclose(np.median((upper4 - lower4)[where] / (upper - lower)[where]), 2.0, rtol=0.02)


def test_a_value_that_reaches_its_bound_is_reported_and_held_in_the_band():
    """ζ = 0.1 lies outside Bounded(0.2, 1): BFGS drives the logit to +-infinity and said
    "converged" with an empty message, and plot_fit drew ζ from N(z, Var(z)) with Var(z) ~ 1e29
    in the unconstrained space, so half the band's draws sat at the other bound (a band 0.7 wide
    instead of 0.01). Now a value within one standard error of a bound is named (compare SciPy's
    active_mask), the message says what that means, and the band holds it with a warning."""
    data = noisy(3)
    bounded = {"omega": Positive(), "zeta": Bounded(0.2, 1.0)}
    result = fit_oscillator(data, transforms=bounded, solver="bfgs")
    assert result.converged and result.at_bounds == ("zeta",)
    assert float(result.params["zeta"]) == pytest.approx(0.2, abs=1e-6)
    assert result.message.startswith("converged, but zeta lies within one standard error of a bound of its "
                                     "Bounded transform")
    assert "(near a bound)" in result.summary().splitlines()[3] and "zeta" in result.summary().splitlines()[3]
    # Levenberg–Marquardt stops at max_steps short of the bound: named too.
    assert fit_oscillator(data, transforms=bounded, throw=False).at_bounds == ("zeta",)
    # Interior optima are not, however wide the interval (a test on dx/dz flagged this one).
    for interval in ((0.0, 1.0), (0.0, 1000.0)):
        inside = fit_oscillator(data, transforms={"omega": Positive(), "zeta": Bounded(*interval)}, solver="bfgs")
        assert inside.at_bounds == () and inside.message == "", interval
    with pytest.warns(UserWarning, match=r"plot_fit: zeta lies within one standard error of a bound .* the band "
                                         r"holds it at its fitted value"):
        fig = sciax.plot_fit(result, TIMES, data, n_samples=200)
    t, fitted, lower, upper = _band(fig)
    # The delta-method band of omega alone, zeta held at 0.2 (the bug's band was ~0.7 wide).
    omega, h = float(result.params["omega"]), 1e-6
    g = (exact_position(t, omega + h, 0.2) - exact_position(t, omega - h, 0.2)) / (2 * h)
    half_width = 1.959964 * np.abs(g) * float(result.standard_errors["omega"])
    where = half_width > 0.2 * half_width.max()
    assert 0.85 < np.median(0.5 * (upper - lower)[where] / half_width[where]) < 1.15
    inside = fit_oscillator(data, solver="bfgs")  # Bounded(0, 1): the optimum is inside
    assert inside.at_bounds == () and inside.message == ""


# ---------------------------------------------------------------------------------------------
# A particle system: spring constants of a 3-mass chain from observed positions, with a mask.
# ---------------------------------------------------------------------------------------------


def chain_setup():
    truth = MassSpringChain(masses=jnp.array([1.0, 2.0, 1.5]), stiffness=jnp.array([3.0, 5.0]))
    state = PhaseSpace(jnp.array([[0.0], [1.3], [1.8]]), jnp.array([[0.2], [0.0], [-0.1]]))
    traj = sciax.simulate(truth, state, integrator=VelocityVerlet(), dt=0.01, n_steps=600, save_every=5)
    return truth, state, np.asarray(traj.times), np.asarray(traj.states.positions[..., 0])


CHAIN_TRUTH, CHAIN_STATE, CHAIN_TIMES, CHAIN_POSITIONS = chain_setup()


def chain_positions(state):
    return state.positions[:, 0]


def fit_chain(observed, mask, **kwargs):
    """Fit the two spring constants and the initial velocities; the masses are held Fixed()."""
    guess = MassSpringChain(masses=jnp.array([1.0, 2.0, 1.5]), stiffness=jnp.array([2.0, 6.0]))
    start = PhaseSpace(CHAIN_STATE.positions, CHAIN_STATE.velocities + 0.05)
    return sciax.fit(guess, start, CHAIN_TIMES, observed, params=("stiffness", "masses"), observe=chain_positions,
                     transforms={"stiffness": Positive(), "masses": Fixed()}, mask=mask,
                     fit_initial_state=PhaseSpace(False, True),
                     rollout=Simulate(VelocityVerlet(), dt=0.01), **TOL, **kwargs)


def test_particle_system_recovery_with_mask_fixed_values_and_initial_state():
    mask = np.ones(CHAIN_POSITIONS.shape, bool)
    mask[10, 1] = mask[40, 0] = mask[41] = False
    corrupted = CHAIN_POSITIONS.copy()
    corrupted[10, 1] = 1e6  # wildly wrong but masked
    corrupted[40, 0] = np.nan  # missing
    corrupted[41] = -1e3
    result = fit_chain(corrupted, mask)
    assert result.converged
    np.testing.assert_allclose(result.params["stiffness"], [3.0, 5.0], rtol=1e-8)
    np.testing.assert_allclose(result.state0.velocities, CHAIN_STATE.velocities, atol=1e-9)
    np.testing.assert_array_equal(result.state0.positions, CHAIN_STATE.positions)
    np.testing.assert_array_equal(result.params["masses"], [1.0, 2.0, 1.5])  # Fixed(): untouched
    np.testing.assert_array_equal(result.standard_errors["masses"], 0.0)
    assert result.n_observations == CHAIN_POSITIONS.size - 5
    assert result.labels == ("stiffness[0]", "stiffness[1]", "state0.velocities[0,0]", "state0.velocities[1,0]",
                             "state0.velocities[2,0]")
    np.testing.assert_array_equal(result.state0_standard_errors.positions, 0.0)

    # The same mask with noisy data: the truth within 3 standard errors.
    rng = np.random.default_rng(5)
    noisy_positions = np.where(mask, corrupted + 0.01 * rng.standard_normal(corrupted.shape), corrupted)
    result = fit_chain(noisy_positions, mask, sigma=0.01)
    error = np.abs(np.asarray(result.params["stiffness"]) - [3.0, 5.0])
    assert np.all(error < 3 * np.asarray(result.standard_errors["stiffness"])), (error, result.standard_errors)
    assert np.all(error > 0)
    velocity_error = np.abs(np.asarray(result.state0.velocities - CHAIN_STATE.velocities))
    assert np.all(velocity_error < 3 * np.asarray(result.state0_standard_errors.velocities))


def test_auto_jacobian_takes_reverse_mode_for_a_reversible_adjoint():
    """Few unknowns make "auto" pick forward mode, which ReversibleAdjoint cannot do: the default
    fit raised and asked for jacobian="reverse". Auto now takes the mode the rollout supports."""
    kw = dict(params=("stiffness", "masses"), observe=chain_positions,
              transforms={"stiffness": Positive(), "masses": Fixed()}, **TOL)
    guess = MassSpringChain(masses=jnp.array([1.0, 2.0, 1.5]), stiffness=jnp.array([2.0, 6.0]))
    reversible = sciax.fit(guess, CHAIN_STATE, CHAIN_TIMES, CHAIN_POSITIONS,
                           rollout=Simulate(VelocityVerlet(), dt=0.01, adjoint=sciax.ReversibleAdjoint()), **kw)
    assert reversible.converged
    np.testing.assert_allclose(reversible.params["stiffness"], [3.0, 5.0], rtol=1e-8)
    with pytest.raises(ValueError, match="ReversibleAdjoint supports reverse mode only"):
        sciax.fit(guess, CHAIN_STATE, CHAIN_TIMES, CHAIN_POSITIONS, jacobian="forward",
                  rollout=Simulate(VelocityVerlet(), dt=0.01, adjoint=sciax.ReversibleAdjoint()), **kw)


@pytest.mark.parametrize(("nx", "solver", "expected"), [(3, "levenberg_marquardt", "fwd"), (4, "bfgs", "bwd"),
                                                     (3, "bfgs", "fwd")])
def test_auto_jacobian_follows_what_the_solver_differentiates(nx, solver, expected):
    """Least squares: forward mode while the unknowns are no more than the residuals. BFGS needs
    the gradient of one scalar loss, which reverse mode gives in one pass: "auto" took forward
    mode for every identifiable fit, n_unknowns tangents per gradient (60x slower at 210). The
    covariance's Jacobian (fewer unknowns than residuals) stays forward either way."""
    from sciax.fitting._fit import _build_problem
    from sciax.fitting._optimise import choose_solver
    from sciax.systems import MassSpringLattice

    n_springs = len(MassSpringLattice.square(nx, nx, diagonals=False).springs)
    lattice = MassSpringLattice.square(nx, nx, diagonals=False, stiffness=jnp.ones(n_springs))
    state0, times = lattice.rest_state(), 0.1 * np.arange(1, 11)
    observed = np.zeros((10,) + state0.positions.shape)
    problem, *_ = _build_problem(lattice, state0, times, observed, "stiffness", Simulate(VelocityVerlet(), 0.01),
                                 Positive(), False, lambda s: s.positions, None, None, None, None, None)
    assert problem.n_unknowns == n_springs < problem.n_data and (n_springs > 16) == (nx == 4)
    _, options, mode, covariance_mode = choose_solver(solver, "auto", None, None, jnp.float64, problem)
    assert mode == expected and covariance_mode == "fwd"
    assert options == ({"autodiff_mode": mode} if solver == "bfgs" else {"jac": mode})
    assert choose_solver(solver, "reverse", None, None, jnp.float64, problem)[2:] == ("bwd", "bwd")  # overridable


def test_masked_value_matters_when_not_masked():
    """Control for the mask test: the same outlier left unmasked moves the fit."""
    corrupted = CLEAN.copy()
    corrupted[50] = 5.0
    result = fit_oscillator(corrupted, throw=False)
    assert abs(float(result.params["omega"]) - 2.0) > 1e-4


# ---------------------------------------------------------------------------------------------
# Multiple shooting: Lorenz from sparse noisy data, where single shooting fails.
# ---------------------------------------------------------------------------------------------


def test_multiple_shooting_recovers_lorenz_where_single_shooting_fails():
    truth = Lorenz()
    y0 = jnp.array([-8.0, 7.0, 27.0])
    traj = sciax.simulate(truth, y0, integrator=RK4(), dt=0.01, n_steps=500, save_every=5)
    times = np.asarray(traj.times)
    data = np.asarray(traj.states) + 0.5 * np.random.default_rng(1).standard_normal(traj.states.shape)
    guess = Lorenz(sigma=7.0, rho=20.0, beta=2.0)
    options = {"params": ("sigma", "rho", "beta"), "transforms": Positive(), "fit_initial_state": True,
               "sigma": 0.5, "rollout": Simulate(RK4(), dt=0.01), "throw": False}

    single = sciax.fit(guess, jnp.asarray(data[0]), times, data, **options)
    single_error = max(abs(float(single.params[k]) / float(getattr(truth, k)) - 1) for k in ("sigma", "rho", "beta"))
    assert (not single.converged) or single_error > 0.1
    if not single.converged:
        assert "maximum number of steps" in single.message or "finite" in single.message

    multi = sciax.fit(guess, jnp.asarray(data[0]), times, data, shooting=MultipleShooting(10), **options)
    assert multi.converged, multi.message
    for k in ("sigma", "rho", "beta"):
        error = abs(float(multi.params[k]) - float(getattr(truth, k)))
        assert error < 3 * float(multi.standard_errors[k]), (k, multi.params[k], multi.standard_errors[k])
        assert float(multi.standard_errors[k]) < 0.05 * float(getattr(truth, k))
    assert multi.continuity_residuals.shape == (9, 3)
    assert len(multi.segment_times) == 10
    assert float(multi.loss) < 0.1 * float(single.loss)


# ---------------------------------------------------------------------------------------------
# Bad input: each raises a clear error before any compilation.
# ---------------------------------------------------------------------------------------------


def test_selector_picks_only_the_field_it_returns_even_when_another_holds_the_same_object():
    class Decay(sciax.systems.AbstractODE):
        k: float = 0.5
        c: float = 0.5  # the same float object as k

        def vector_field(self, t, y, args=None):
            return -self.k * y + 0.0 * self.c

    times = np.linspace(0.1, 2.0, 20)
    # The selector is matched in the model's fields whatever the rollout: RK4 (recovers k to ~1e-10)
    # compiles in a fraction of a Diffrax solve's time.
    result = sciax.fit(Decay(), jnp.array([1.0]), times, np.exp(-0.8 * times)[:, None], params=lambda s: s.k,
                       t0=0.0, rollout=Simulate(RK4(), dt=0.01))
    assert result.labels == ("k",) and result.converged
    np.testing.assert_allclose(result.params["k"], 0.8, rtol=1e-7)
    assert result.system.c == 0.5 and set(result.params) == {"k"}  # c untouched


def test_fixed_transform_holds_the_initial_state():
    from sciax.systems import LotkaVolterra

    # What holds the initial state is how the unknowns are split, the same for every rollout: a
    # fixed-step one compiles in a fraction of a Diffrax solve's time.
    times = np.linspace(0.5, 10.0, 20)
    truth = sciax.simulate(LotkaVolterra(), jnp.array([30.0, 4.0]), integrator=RK4(), dt=0.01, n_steps=1000,
                           save_every=50)
    result = sciax.fit(LotkaVolterra(), jnp.array([25.0, 5.0]), times, np.asarray(truth.states[1:]), params="alpha",
                       t0=0.0, fit_initial_state=True, transforms={"state0": sciax.Fixed()},
                       rollout=Simulate(RK4(), dt=0.01), throw=False)
    np.testing.assert_array_equal(np.asarray(result.state0), [25.0, 5.0])
    assert result.labels == ("alpha",) and result.state0_standard_errors is None


def test_multiple_shooting_segments_do_not_integrate_past_their_last_observation():
    """Segments of unequal length share one scan; the short one (t in [0, 0.6]) of a model that
    blows up at t = 1 must stop at its last save, or its unused frames are inf and reverse-mode
    cotangents NaN (0 · inf)."""

    class Blow(sciax.systems.AbstractODE):
        a: jax.Array

        def vector_field(self, t, y, args=None):
            return self.a * y**2  # y = 1 / (1 - a t) from y(0) = 1

    times = np.r_[np.linspace(0.0, 0.6, 7), np.linspace(0.61, 0.66, 6)]
    observed = (1 / (1 - times))[:, None]
    results = [sciax.fit(Blow(a=jnp.array(0.9)), jnp.array([1.0]), times, observed, params="a",
                         rollout=sciax.Simulate(RK4(), dt=0.01), shooting=sciax.MultipleShooting(2, 10.0),
                         jacobian=mode) for mode in ("forward", "reverse")]
    for r in results:
        assert r.converged
        np.testing.assert_allclose(r.params["a"], 1.0, rtol=1e-7)  # RK4 error at dt = 0.01
    np.testing.assert_allclose(results[0].params["a"], results[1].params["a"], rtol=1e-10)


def test_float32_times_that_start_at_t0_are_accepted():
    """float32(0.7) = 0.69999999: the t0 check compared it exactly with t0 = 0.7 and refused it,
    though the step-grid check allows for the times' own rounding."""
    start = 7  # frame 7 is t = 0.7
    y_start = sciax.simulate(TRUTH, Y0, integrator=RK4(), dt=DT, n_steps=70, save_every=70).final_state
    times32 = TIMES[start:].astype(np.float32)
    assert float(times32[0]) < 0.7
    result = sciax.fit(GUESS, y_start, times32, CLEAN[start:], params=("omega", "zeta"), observe=position,
                       rollout=ROLLOUT, transforms=TRANSFORMS, t0=0.7, **TOL)
    assert result.converged
    np.testing.assert_allclose([result.params["omega"], result.params["zeta"]], [2.0, 0.1], rtol=1e-7)
    # Two float32 times that both round onto t0 are one time, not two increasing ones.
    twice = np.concatenate([[np.nextafter(times32[0], np.float32(0))], times32])
    with pytest.raises(ValueError, match=r"strictly increasing; times\[0\] = 0.7 is followed by times\[1\] = 0.7"):
        sciax.fit(GUESS, y_start, twice, CLEAN[start - 1:], params=("omega", "zeta"), observe=position,
                  rollout=ROLLOUT, transforms=TRANSFORMS, t0=0.7, **TOL)


def test_observations_as_python_lists_fit_like_the_array():
    array = fit_oscillator(noisy(3))
    listed = fit_oscillator(noisy(3).tolist())
    assert listed.params == array.params and listed.n_observations == 201


class TestBadInput:
    def test_nan_without_mask(self):
        data = CLEAN.copy()
        data[7] = np.nan
        with pytest.raises(ValueError, match=r"NaN/Inf value\(s\) \(first at times\[7\].*no `mask`.*mask=np.isfinite"):
            fit_oscillator(data)

    def test_nan_at_an_unmasked_entry(self):
        data = CLEAN.copy()
        data[7] = np.nan
        mask = np.ones(data.shape, bool)
        with pytest.raises(ValueError, match="entries marked as observed"):
            fit_oscillator(data, mask=mask)

    def test_mismatched_lengths(self):
        with pytest.raises(ValueError, match=r"`times` has 201 entries but `observed` has 200 rows"):
            fit_oscillator(CLEAN[:200])

    def test_times_not_increasing(self):
        times = TIMES.copy()
        times[[3, 4]] = times[[4, 3]]
        with pytest.raises(ValueError, match=r"strictly increasing; times\[3\] = 0.4 is followed by times\[4\] = 0.3"):
            sciax.fit(GUESS, Y0, times, CLEAN, params="omega", observe=position, rollout=ROLLOUT)

    def test_times_before_t0(self):
        with pytest.raises(ValueError, match=r"times\[0\] = 0 is before t0"):
            sciax.fit(GUESS, Y0, TIMES, CLEAN, params="omega", observe=position, rollout=ROLLOUT, t0=0.5)

    @pytest.mark.parametrize("t0", [float("nan"), float("-inf")])
    def test_non_finite_t0(self, t0):
        with pytest.raises(ValueError, match=r"`t0` must be a finite time, got (nan|-inf)"):
            sciax.fit(GUESS, Y0, TIMES, CLEAN, params="omega", observe=position, rollout=ROLLOUT, t0=t0)

    def test_times_off_the_step_grid(self):
        times = TIMES.copy()
        times[5] += 0.003
        with pytest.raises(ValueError, match=r"times\[5\] = 0.503 does not.*nearest grid time 0.5.*Solve"):
            sciax.fit(GUESS, Y0, times, CLEAN, params="omega", observe=position, rollout=ROLLOUT)

    def test_unknown_parameter_name_lists_valid_fields(self):
        with pytest.raises(ValueError, match=r"has no parameter field `omgea`; valid field names: 'omega', 'zeta', "
                                             r"'drive_amplitude', 'drive_frequency'"):
            sciax.fit(GUESS, Y0, TIMES, CLEAN, params=("omgea",), observe=position, rollout=ROLLOUT)

    def test_static_field_is_not_a_parameter(self):
        from sciax.systems import MassSpringLattice

        lattice = MassSpringLattice.square(2, 2)
        with pytest.raises(ValueError, match="`springs` is a field of MassSpringLattice but not a fittable"):
            sciax.fit(lattice, lattice.default_state(), TIMES[:3], np.zeros((3, 4, 2)), params="springs",
                      rollout=ROLLOUT, observe=lambda s: s.positions)

    def test_negative_start_for_positive(self):
        with pytest.raises(ValueError, match=r"Positive\(\) on `drive_amplitude` needs a positive, finite initial "
                                             r"value, got -1.5"):
            sciax.fit(DampedDrivenOscillator(omega=1.5, zeta=0.3, drive_amplitude=-1.5), Y0, TIMES, CLEAN,
                      params=("omega", "drive_amplitude"), observe=position, rollout=ROLLOUT,
                      transforms={"drive_amplitude": Positive()})

    def test_start_outside_bounds(self):
        with pytest.raises(ValueError, match=r"Bounded\(0, 0.2\) on `zeta` needs an initial value strictly inside "
                                             r"\(0, 0.2\), got 0.3"):
            fit_oscillator(CLEAN, transforms={"zeta": Bounded(0.0, 0.2)})

    def test_transform_for_unknown_name(self):
        with pytest.raises(ValueError, match=r"`transforms` names `rho`.*valid names: 'omega', 'zeta'"):
            fit_oscillator(CLEAN, transforms={"rho": Positive()})

    @pytest.mark.parametrize("sigma", [0.0, -0.1, np.nan])
    def test_non_positive_sigma(self, sigma):
        with pytest.raises(ValueError, match="`sigma` .* must be positive and finite"):
            fit_oscillator(CLEAN, sigma=sigma)

    def test_a_weight_of_zero_is_named_and_pointed_to_the_mask(self):
        """sigma = 1/sqrt(w) with w = 0 is inf: the message gave the minimum (a valid sigma) and
        suggested sigma = 1/sqrt(w), which was what the user had done."""
        weights = np.ones(CLEAN.shape)
        weights[7] = 0.0
        with np.errstate(divide="ignore"):
            sigma = 0.05 / np.sqrt(weights)
        with pytest.raises(ValueError, match=r"got sigma\[7\] = inf \(1 such value\(s\)\).*an observation of "
                                             r"weight 0 is missing: mark it False in `mask`"):
            fit_oscillator(CLEAN, sigma=sigma)
        masked = np.ones(CLEAN.shape, bool)
        masked[7] = False  # already missing: no advice to mask it
        with pytest.raises(ValueError, match=r"including at masked entries; got sigma\[7\] = inf \(1 such "
                                             r"value\(s\)\)\. For weights w pass sigma = 1/sqrt\(w\)\.$"):
            fit_oscillator(CLEAN, sigma=sigma, mask=masked)
        with pytest.raises(ValueError, match=r"got sigma = 0\. For weights"):  # a scalar is named as given
            fit_oscillator(CLEAN, sigma=0.0)

    @pytest.mark.parametrize("name", ["sigma", "mask"])
    def test_sigma_or_mask_dict_missing_a_leaf_of_observed(self, name):
        """A dict has ndim 0, so it was broadcast to every leaf as if it were a scalar, and the
        mismatch surfaced as "must hold real numbers" / "must be boolean"."""
        def both(y):
            return {"x": y[0], "v": y[1]}

        traj = sciax.simulate(TRUTH, Y0, integrator=RK4(), dt=DT, n_steps=2000, save_every=10)
        observed = {"x": np.asarray(traj.states[:, 0]), "v": np.asarray(traj.states[:, 1])}
        partial = {"x": 0.05} if name == "sigma" else {"x": np.ones(201, bool)}
        with pytest.raises(ValueError, match=f"`{name}` must be a scalar, an array broadcastable to `observed`, or "
                                             "a pytree with the structure of `observed`; got dict"):
            sciax.fit(GUESS, Y0, TIMES, observed, params="omega", observe=both, rollout=ROLLOUT, **{name: partial})

    @pytest.mark.parametrize("kwargs, error, match", [
        (dict(sigma="0.05"), TypeError, r"`sigma` .* must hold real numbers, got .* dtype <U4"),
        (dict(sigma=[None]), TypeError, r"`sigma` .* must hold real numbers, got .* dtype object"),
        (dict(sigma=True), TypeError, r"`sigma` .* must hold real numbers, got .* dtype bool"),
        (dict(sigma=0.05 + 0.01j), TypeError, r"`sigma` .* must hold real numbers, got .* dtype complex128"),
        (dict(t0="zero"), TypeError, r"`t0` must be a real number, got str 'zero'"),
        (dict(rtol="tight"), TypeError, r"`rtol` must be a real number, got str 'tight'"),
        # numeric strings were converted (the check refused only strings float() rejects)
        (dict(t0="0"), TypeError, r"`t0` must be a real number, got str '0'"),
        (dict(rtol="1e-3"), TypeError, r"`rtol` must be a real number, got str '1e-3'"),
        # an infinite tolerance stopped at the first step and reported the start as converged
        (dict(rtol=np.inf), ValueError, r"^fit: `rtol` must be finite and >= 0, got inf\.$"),
        (dict(atol=np.inf), ValueError, r"^fit: `atol` must be finite and >= 0, got inf\.$"),
        (dict(rtol=0, atol=0.0), ValueError, r"^fit: `rtol` and `atol` are both 0, a tolerance no step can meet"),
        (dict(scale_covariance="no"), TypeError, r"`scale_covariance` must be True, False or None"),
        (dict(throw=1), TypeError, r"`throw` must be True or False, got int 1"),
        (dict(compilation=None), TypeError, r"`compilation` must be 'auto', 'optimised' or 'fast', got NoneType None"),
        (dict(compilation="quick"), ValueError, r"`compilation` must be 'auto', 'optimised' or 'fast', got 'quick'"),
    ])
    def test_arguments_that_are_not_real_numbers_or_booleans(self, kwargs, error, match):
        with pytest.raises(error, match=match):
            fit_oscillator(CLEAN, **kwargs)

    def test_called_inside_a_jax_transformation(self):
        """`fit` runs on the host: inside jit/grad/vmap it raised JAX's TracerArrayConversionError
        from deep inside the input checks; now the traced argument is named."""
        message = r"^fit: `{}` is being traced by a JAX transformation .* on the host: .* outside the transformation"
        with pytest.raises(TypeError, match=message.format("observed")):
            jax.jit(lambda data: fit_oscillator(data).params["omega"])(jnp.asarray(CLEAN))
        with pytest.raises(TypeError, match=message.format("system")):
            jax.grad(lambda w: sciax.fit(DampedDrivenOscillator(omega=w, zeta=0.3), Y0, TIMES, CLEAN, params="zeta",
                                         observe=position, rollout=ROLLOUT).loss)(1.5)
        with pytest.raises(TypeError, match=message.format("sigma")):
            jax.vmap(lambda s: fit_oscillator(CLEAN, sigma=s).loss)(jnp.array([0.1, 0.2]))
        with pytest.raises(TypeError, match=message.format("observe")):  # a traced value in its closure
            jax.grad(lambda scale: fit_oscillator(CLEAN, observe=lambda y: scale * y[0]).loss)(1.0)
        with pytest.raises(TypeError, match=message.format("rtol")):
            jax.jit(lambda tol: fit_oscillator(CLEAN, rtol=tol, atol=1e-10).loss)(1e-8)
        # Settings built inside the transformation are refused where they are built.
        with pytest.raises(TypeError, match=r"^Simulate: `dt` is being traced by a JAX transformation .* a setting"):
            jax.grad(lambda dt: fit_oscillator(CLEAN, rollout=Simulate(RK4(), dt=dt)).loss)(0.01)
        with pytest.raises(TypeError, match=r"^Bounded: `upper` is being traced by a JAX transformation"):
            jax.grad(lambda hi: fit_oscillator(CLEAN, transforms={"zeta": Bounded(0.0, hi)}).loss)(1.0)

    def test_complex_times(self):
        with pytest.raises(ValueError, match=r"`times` must be a non-empty 1-D array .* dtype complex128"):
            sciax.fit(GUESS, Y0, TIMES + 0j, CLEAN, params="omega", observe=position, rollout=ROLLOUT)

    def test_part_of_a_parameter_cannot_be_selected(self):
        chain = MassSpringChain(masses=jnp.ones(3), stiffness=jnp.ones(2))
        with pytest.raises(ValueError, match=r"`stiffness\[0\]` selects part of the parameter `stiffness`; fit "
                                             r"selects whole fields, so pass 'stiffness'"):
            sciax.fit(chain, chain.default_state(), TIMES[:3], np.zeros((3, 3, 1)), params="stiffness[0]",
                      rollout=ROLLOUT, observe=lambda s: s.positions)

    def test_observed_shape_does_not_match_observe(self):
        with pytest.raises(ValueError,
                           match=r"each observation has shape \(3,\) but `observe\(state\)` returns shape \(\)"):
            fit_oscillator(np.zeros((201, 3)))

    def test_bad_solver_and_jacobian(self):
        with pytest.raises(ValueError, match="unknown solver 'newton'"):
            fit_oscillator(CLEAN, solver="newton")
        with pytest.raises(ValueError, match="`jacobian` must be 'auto', 'forward' or 'reverse'"):
            fit_oscillator(CLEAN, jacobian="central")
        for other_spelling in ("fwd", "Forward"):  # one spelling per option
            with pytest.raises(ValueError, match="`jacobian` must be 'auto', 'forward' or 'reverse'"):
                fit_oscillator(CLEAN, jacobian=other_spelling)
        with pytest.raises(ValueError, match="`compilation` must be 'auto', 'optimised' or 'fast', got 'optimized'"):
            fit_oscillator(CLEAN, compilation="optimized")

    def test_solve_tolerances_accept_any_real_number_and_refuse_others(self):
        rollout = sciax.Solve(rtol=np.float32(1e-6), atol=np.float64(1e-8), dt0=np.int64(1))
        assert (rollout.rtol, rollout.atol, rollout.dt0) == (float(np.float32(1e-6)), 1e-8, 1.0)
        assert type(rollout.rtol) is float  # a static field: a plain, hashable number
        for bad in (True, "1e-6", -1e-6, float("nan")):
            with pytest.raises(ValueError, match=r"Solve: `rtol` must be a positive, finite number or None"):
                sciax.Solve(rtol=bad)

    def test_bounded_needs_ordered_bounds(self):
        with pytest.raises(ValueError, match="lower < upper"):
            Bounded(1.0, 0.0)

    def test_option_objects_name_themselves_and_the_argument(self):
        """These raised "could not convert string to float: 'a'", or converted a numeric string,
        or named neither the class nor fit."""
        for make, match in ((lambda: Bounded("a", 1), r"Bounded: `lower` must be a real number, got str 'a'"),
                            (lambda: MultipleShooting(2, "a"), r"MultipleShooting: `continuity_weight` must be a real"),
                            (lambda: Simulate(RK4(), dt="0.01"), r"Simulate: `dt` must be a real number, got str"),
                            (lambda: sciax.Solve(max_steps=0), r"Solve: `max_steps` must be a positive integer")):
            with pytest.raises((TypeError, ValueError), match=match):
                make()

    def test_plot_fit_checks_its_data_and_draws(self):
        """A wrong width or length of the data raised a bare IndexError, n_samples=2.5 a
        TypeError about floats, and n_samples=-1 drew no band silently."""
        result = fit_oscillator(CLEAN)
        for times, observed in ((TIMES, np.stack([CLEAN, CLEAN], axis=1)), (TIMES[:-1], CLEAN[:-1])):
            with pytest.raises(ValueError, match=r"plot_fit: `times` and `observed` must be the data that were "
                                                 r"fitted: times of shape \(201,\) and observed leaves of shapes"):
                sciax.plot_fit(result, times, observed)
        for n in (2.5, -1, True):
            with pytest.raises(ValueError, match=r"plot_fit: `n_samples` must be an int ≥ 0 \(0: no band\)"):
                sciax.plot_fit(result, TIMES, CLEAN, n_samples=n)

    def test_too_many_segments(self):
        with pytest.raises(ValueError, match=r"MultipleShooting\(300\) needs at least one observation per segment"):
            fit_oscillator(CLEAN, shooting=MultipleShooting(300))

