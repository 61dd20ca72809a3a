"""Every benchmark baseline computes the same numbers as sciax on a small instance.

The speed ratios in `benchmarks/` compare equal work only if the baselines solve the same
problem from the same initial state with the same method; these tests check that. Tolerances,
per workload:

- Same Runge–Kutta arithmetic in float64 (NumPy, PyTorch, C, hand-written JAX vs sciax):
  relative 1e-12 on final states after 200 non-chaotic steps (ρ ≤ 21) — only the rounding
  order (and FMA contraction) differs, ~1e-16 per operation.
- The same in float32: relative 2e-5 (float32 rounding, ~6e-8 per operation, over 200 steps).
- Gradients through 200 chaotic RK4 steps (ρ ≈ 28, t ≤ 2) in float64: relative 1e-9; the
  rounding differences are amplified by the flow's sensitivity (~e^{0.9 t}).
- Diffrax's gradient (a peer with its own checkpointed adjoint and Hermite save-time
  interpolation at step boundaries): relative 1e-8.
- The fit: SciPy's RK45 (rtol 1e-8) and sciax's RK4 (dt 0.01) are different discretisations,
  both within ~5e-9 of the exact solution, so the fitted (ω, ζ) agree to relative 1e-5.
"""

import shutil
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `benchmarks/` lives beside the package, not inside it
    sys.path.insert(0, str(ROOT))

import sciax  # noqa: E402
from benchmarks import workloads as wl  # noqa: E402
from benchmarks.baselines import numpy_gradient, numpy_lorenz  # noqa: E402
from benchmarks.suites import gradient as gradient_suite  # noqa: E402
from sciax.integrators import RK4, Tsit5  # noqa: E402
from sciax.systems import Lorenz  # noqa: E402

N_MEMBERS, N_STEPS = 32, 200
TOL = {"float32": 2e-5, "float64": 1e-12}


def sciax_ensemble(method, dtype, n_members=N_MEMBERS, n_steps=N_STEPS):
    """The benchmarked sciax call (the `lorenz_ensemble` suite's), at a small size."""
    integrator = {"rk4": RK4(), "tsit5": Tsit5()}[method]
    u0 = jnp.asarray(wl.ENSEMBLE_U0, dtype)
    sigma, beta = jnp.asarray(wl.LORENZ_SIGMA, dtype), jnp.asarray(wl.LORENZ_BETA, dtype)

    def one(rho):
        traj = sciax.simulate(Lorenz(sigma=sigma, rho=rho, beta=beta), u0, integrator=integrator,
                              dt=wl.ENSEMBLE_DT, n_steps=n_steps, save_every=n_steps)
        return traj.final_state

    rhos = wl.ensemble_rhos(n_members, dtype)
    return rhos, np.asarray(jax.jit(jax.vmap(one))(jnp.asarray(rhos)), dtype=np.float64)


def assert_close(actual, expected, rtol):
    actual = np.asarray(actual, dtype=np.float64)
    err = np.max(np.abs(actual - expected)) / np.max(np.abs(expected))
    assert err <= rtol, f"max relative difference {err:.2e} > {rtol:.0e}"


@pytest.fixture(scope="module")
def ensembles():
    return {(m, p): sciax_ensemble(m, p) for m in ("rk4", "tsit5") for p in ("float32", "float64")}


@pytest.mark.parametrize("precision", ["float32", "float64"])
@pytest.mark.parametrize("method", ["rk4", "tsit5"])
def test_numpy_ensemble_matches_sciax(ensembles, method, precision):
    rhos, expected = ensembles[(method, precision)]
    out = numpy_lorenz.lorenz_ensemble(rhos, wl.ENSEMBLE_U0, dt=wl.ENSEMBLE_DT, n_steps=N_STEPS,
                                       method=method)
    assert out.dtype == np.dtype(precision)
    assert_close(out, expected, TOL[precision])


@pytest.mark.parametrize("precision", ["float32", "float64"])
@pytest.mark.parametrize("method", ["rk4", "tsit5"])
def test_torch_eager_ensemble_matches_sciax(ensembles, method, precision):
    pytest.importorskip("torch")
    from benchmarks.baselines import torch_lorenz

    rhos, expected = ensembles[(method, precision)]
    out = torch_lorenz.lorenz_ensemble(rhos, wl.ENSEMBLE_U0, dt=wl.ENSEMBLE_DT, n_steps=N_STEPS,
                                       method=method)
    assert out.dtype == np.dtype(precision)
    assert_close(out, expected, TOL[precision])


# Two of the four cases are slow: the default run keeps RK4 in float64 and Tsit5 in float32, so each
# method and each precision of the Diffrax ensemble baseline (the same make_ensemble path) still runs;
# -m slow adds RK4 in float32 and Tsit5 in float64.
@pytest.mark.parametrize(("method", "precision"), [pytest.param("rk4", "float32", marks=pytest.mark.slow),
                                                   ("rk4", "float64"), ("tsit5", "float32"),
                                                   pytest.param("tsit5", "float64", marks=pytest.mark.slow)],
                         ids=["rk4-float32", "rk4-float64", "tsit5-float32", "tsit5-float64"])
def test_diffrax_ensemble_matches_sciax(ensembles, method, precision):
    from benchmarks.baselines import diffrax_lorenz

    rhos, expected = ensembles[(method, precision)]
    fn = diffrax_lorenz.make_ensemble(method, np.dtype(precision), u0=wl.ENSEMBLE_U0, dt=wl.ENSEMBLE_DT,
                                      n_steps=N_STEPS, sigma=wl.LORENZ_SIGMA, beta=wl.LORENZ_BETA)
    out = np.asarray(fn(jnp.asarray(rhos)))
    assert out.dtype == np.dtype(precision)
    assert_close(out, expected, TOL[precision])


@pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")  # Inductor's own imports
@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_torch_compile_ensemble_matches_sciax(ensembles, precision):
    """The `torch.compile` row: the same step function compiled by Inductor (its own fusion and
    rounding order, so checked apart from eager)."""
    pytest.importorskip("torch")
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("Inductor needs a C++ compiler")
    from benchmarks.baselines import torch_lorenz

    rhos, expected = ensembles[("rk4", precision)]
    out = torch_lorenz.lorenz_ensemble(rhos, wl.ENSEMBLE_U0, dt=wl.ENSEMBLE_DT, n_steps=N_STEPS,
                                       method="rk4", compile=True)
    assert out.dtype == np.dtype(precision)
    assert_close(out, expected, TOL[precision])


@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_suite_sweep_row_matches_sciax(precision):
    """The `sciax.sweep` row runs the workload's full 1,000 steps; it must equal the
    `jit(vmap(simulate))` row bit for bit (the same fixed-step arithmetic, only chunked)."""
    from types import SimpleNamespace

    from benchmarks.suites import lorenz_ensemble as le

    ctx = SimpleNamespace(jax_device=lambda: jax.devices("cpu")[0])
    rhos = wl.ensemble_rhos(N_MEMBERS, np.dtype(precision))
    swept = np.asarray(le.prepare_sweep(ctx, "rk4", np.dtype(precision), rhos).call())
    _, expected = sciax_ensemble("rk4", precision, n_steps=wl.ENSEMBLE_STEPS)
    assert swept.dtype == np.dtype(precision)
    np.testing.assert_array_equal(swept.astype(np.float64), expected)


@pytest.fixture(scope="module")
def c_library(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("gcc not available")
    from benchmarks.baselines import c_lorenz

    return c_lorenz.LorenzC(c_lorenz.compile_library(tmp_path_factory.mktemp("c")))


@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_c_reference_matches_sciax(ensembles, c_library, precision):
    rhos, expected = ensembles[("rk4", precision)]
    out = c_library(rhos, wl.ENSEMBLE_U0, dt=wl.ENSEMBLE_DT, n_steps=N_STEPS)
    assert out.dtype == np.dtype(precision)
    assert_close(out, expected, TOL[precision])


def test_c_peak_kernel_returns_a_flop_rate(c_library):
    """The ensemble suite's "of core peak" divides by this (its size is a benchmark figure, not
    tested here: no timing in unit tests)."""
    for precision in ("float32", "float64"):
        peak = c_library.peak_flops(np.dtype(precision), iters=100_000, repeats=1)
        assert np.isfinite(peak) and peak > 0


# --- gradient workload: 4 members, 200 RK4 steps over t in [0, 2], 10 observations -----------

G_STEPS, G_T_END, G_OBS = 200, 2.0, 10


@pytest.fixture(scope="module")
def gradient_problem():
    params = wl.gradient_params(4)
    u0 = np.asarray(wl.GRADIENT_U0)
    obs = wl.gradient_observations()[:G_OBS] * 0.5  # any data: the loss only needs numbers
    return params, u0, obs


def sciax_loss(n_steps, adjoint):
    """The gradient suite's sciax loss with the test's time span."""
    dt = G_T_END / n_steps

    def member(p, u0, obs):
        traj = sciax.simulate(Lorenz(sigma=p[0], rho=p[1], beta=p[2]), u0, integrator=RK4(), dt=dt,
                              n_steps=n_steps, save_every=n_steps // obs.shape[0], adjoint=adjoint)
        return jnp.mean((traj.states[1:] - obs) ** 2)

    return lambda params, u0, obs: jnp.sum(jax.vmap(member, in_axes=(0, None, None))(params, u0, obs))


@pytest.fixture(scope="module")
def sciax_gradient(gradient_problem):
    value, grad = jax.jit(jax.value_and_grad(sciax_loss(G_STEPS, sciax.DirectAdjoint())))(  # one program: compiles
        *map(jnp.asarray, gradient_problem))                                                # faster than eagerly
    return float(value), np.asarray(grad)


def test_suite_sciax_loss_matches_numpy_on_the_full_workload_length(gradient_problem):
    """The gradient suite's own sciax loss (t in [0, 10], 1,000 steps, 100 observations)."""
    params, u0, _ = gradient_problem
    obs = wl.gradient_observations()
    suite_value = gradient_suite.sciax_loss(1000, sciax.CheckpointAdjoint())(
        jnp.asarray(params), jnp.asarray(u0), jnp.asarray(obs))
    ref_value = numpy_gradient.loss(params, u0, obs, t_end=wl.GRADIENT_T_END, n_steps=1000)
    np.testing.assert_allclose(float(suite_value), ref_value, rtol=1e-9)


def test_numpy_forward_sensitivities_match_sciax_gradient(gradient_problem, sciax_gradient):
    value, grad = numpy_gradient.loss_and_grad(*gradient_problem, t_end=G_T_END, n_steps=G_STEPS)
    np.testing.assert_allclose(value, sciax_gradient[0], rtol=1e-12)
    assert_close(grad, sciax_gradient[1], 1e-9)
    assert numpy_gradient.loss(*gradient_problem, t_end=G_T_END, n_steps=G_STEPS) == pytest.approx(
        value, rel=1e-13)


def test_suite_forward_mode_gradient_matches_reverse_mode(gradient_problem):
    """The suite's forward-mode row (jacfwd with 3 tangents over the per-member losses) gives
    the same (B, 3) gradient as reverse mode through the suite's loss, and one entry matches a
    central finite difference."""
    params, u0, obs = map(jnp.asarray, gradient_problem)
    obs = jnp.asarray(wl.gradient_observations())  # the suite's 100 observations over [0, 10]
    losses = gradient_suite.sciax_member_losses(1000, sciax.DirectAdjoint())
    value, grad = jax.jit(gradient_suite.forward_mode_value_and_grad(losses))(params, u0, obs)
    ref_value, ref_grad = jax.jit(jax.value_and_grad(gradient_suite.sciax_loss(1000, sciax.CheckpointAdjoint())))(
        params, u0, obs)
    np.testing.assert_allclose(float(value), float(ref_value), rtol=1e-13)
    assert grad.shape == params.shape
    assert_close(np.asarray(grad), np.asarray(ref_grad), 1e-12)
    h = 1e-6 * params[2, 1]
    up, down = (float(jnp.sum(losses(params.at[2, 1].add(s), u0, obs))) for s in (h, -h))
    assert (up - down) / (2 * h) == pytest.approx(float(grad[2, 1]), rel=1e-6)


@pytest.mark.parametrize("checkpoint", [False, True], ids=["plain", "checkpoint"])
def test_hand_written_jax_scan_matches_sciax_gradient(gradient_problem, sciax_gradient, checkpoint):
    from benchmarks.baselines.jax_scan_lorenz import make_loss

    loss = make_loss(G_STEPS, G_OBS, G_T_END, checkpoint=checkpoint)
    value, grad = jax.jit(jax.value_and_grad(loss))(*map(jnp.asarray, gradient_problem))
    np.testing.assert_allclose(float(value), sciax_gradient[0], rtol=1e-12)
    assert_close(grad, sciax_gradient[1], 1e-9)


def test_torch_autograd_matches_sciax_gradient(gradient_problem, sciax_gradient):
    pytest.importorskip("torch")
    from benchmarks.baselines import torch_gradient

    value, grad = torch_gradient.autograd_value_and_grad(*gradient_problem, n_steps=G_STEPS, t_end=G_T_END)
    np.testing.assert_allclose(value, sciax_gradient[0], rtol=1e-12)
    assert_close(grad, sciax_gradient[1], 1e-9)
    forward = torch_gradient.autograd_forward(*gradient_problem, n_steps=G_STEPS, t_end=G_T_END)
    assert forward == pytest.approx(value, rel=1e-13)


def test_diffrax_checkpointed_gradient_matches_sciax(gradient_problem, sciax_gradient):
    """Guards the known Diffrax trap: RecursiveCheckpointAdjoint with SaveAt(ts) gives wrong
    gradients for some values of max_steps (see benchmarks/baselines/diffrax_lorenz.py)."""
    from benchmarks.baselines.diffrax_lorenz import make_gradient_loss

    loss = make_gradient_loss(G_STEPS, G_OBS, G_T_END)
    value, grad = jax.jit(jax.value_and_grad(loss))(*map(jnp.asarray, gradient_problem))
    np.testing.assert_allclose(float(value), sciax_gradient[0], rtol=1e-10)
    assert_close(grad, sciax_gradient[1], 1e-8)


# --- fit workload ------------------------------------------------------------------------------


def test_torch_fit_objective_matches_scipy():
    """The PyTorch + torchdiffeq fit minimises the same ½ Σ r² as SciPy (dopri5 and RK45 at the
    same tolerances: both within ~1e-8 of the exact solution)."""
    pytest.importorskip("torch")
    pytest.importorskip("torchdiffeq")
    from benchmarks.baselines import numpy_fit, torch_fit

    t, x_obs = wl.fit_data()
    start = (1.5, 0.3)
    expected = 0.5 * np.sum((numpy_fit.simulate_x(start, t) - x_obs) ** 2)
    assert torch_fit.evaluate_once(t, x_obs, start) == pytest.approx(expected, rel=1e-6)


def test_scipy_fit_matches_sciax_fit():
    from benchmarks.baselines import numpy_fit
    from benchmarks.suites import fit as fit_suite

    t, x_obs = wl.fit_data()
    scipy = numpy_fit.fit(t, x_obs)
    _, sciax_fit = fit_suite.make_sciax_fit()
    ours = sciax_fit(t, x_obs)
    assert scipy["success"] and ours["converged"]
    np.testing.assert_allclose(ours["params"], scipy["params"], rtol=1e-5)
    # Both recover the truth to within the noise (0.05 on 200 points).
    np.testing.assert_allclose(ours["params"], wl.FIT_TRUTH, rtol=0.05)


# --- GPU plan of the ensemble suite (checked here without a GPU) -------------------------------


def test_gpu_plan_and_diffeqgpu_target_of_the_ensemble_suite():
    """`--device gpu`: sizes up to DiffEqGPU's 8,388,608 members, CPU rows only at 1e5 (RK4),
    and the bar is the published 145 ms (CPU bars are not applied)."""
    from types import SimpleNamespace

    from benchmarks.harness import Measurement, SuiteResult
    from benchmarks.suites import lorenz_ensemble as le

    plan = le._plan(SimpleNamespace(device="gpu", quick=False))
    assert {size for _, _, size, _ in plan} == {10_000, 100_000, 1_000_000, le.GPU_TARGET_SIZE}
    assert {p for _, p, _, _ in plan} == {"float32", "float64"}
    assert all(le.SCIAX in impls and le.SWEEP in impls for *_, impls in plan)
    assert all((le.C_REF in impls) == (size == 100_000 and method == "rk4") for method, _, size, impls in plan)

    def row(impl, seconds, device="gpu"):
        return Measurement(suite=le.NAME, case=le._case("tsit5"), impl=impl, precision="float32",
                           size=le.GPU_TARGET_SIZE, size_name="members", unit=le.UNIT,
                           work=le.GPU_TARGET_SIZE * 1000.0, time_median_s=seconds, device=device)

    result = SuiteResult(measurements=[row(le.SCIAX, 0.0663), row(le.SWEEP, 0.2184), row(le.TORCH_COMPILE, 0.0604),
                                       row(le.DIFFRAX, 7.357)])
    le._targets(SimpleNamespace(device="gpu"), result)
    judged = {t.name: t for t in result.targets if t.met is not None}
    big = le.fmt_size(le.GPU_TARGET_SIZE)
    assert judged[f"Tsit5 float32 B={big}: {le.SCIAX} vs DiffEqGPU (published, V100)"].met is True
    assert judged[f"Tsit5 float32 B={big}: {le.SWEEP} vs DiffEqGPU (published, V100)"].met is False
    assert len(judged) == 2  # the peers are listed, not judged
    peers = {t.name: t.value for t in result.targets if t.bar.startswith("no bar")}
    assert peers[f"Tsit5 float32 B={big}: {le.SCIAX} vs {le.DIFFRAX}"] == pytest.approx(7.357 / 0.0663)
    assert not any("NumPy" in t.name for t in result.targets)


# --- the suites' verdicts (checked on made-up rows: no timing here) ---------------------------


def _ensemble_row(le, impl, seconds, precision="float32", size=100_000, **extra):
    from benchmarks.harness import Measurement

    m = Measurement(suite=le.NAME, case=le._case("rk4"), impl=impl, precision=precision, size=size,
                    size_name="members", unit=le.UNIT, work=size * 1000.0, time_median_s=seconds, device="cpu")
    m.extra.update(extra)
    return m


def test_ensemble_agreement_is_per_member():
    """A member with small states is judged on its own scale, not the ensemble's largest."""
    from benchmarks.suites import lorenz_ensemble as le

    reference = np.array([[10.0, 20.0, 30.0], [1e-3, 2e-3, 3e-3]])
    off = reference.copy()
    off[1, 0] *= 1.01  # 1% off in the small member: 3e-7 of the ensemble's largest state
    assert le._disagreement(off, reference) == pytest.approx(1e-5 / 3e-3)
    assert le._disagreement(reference, reference) == 0.0


def test_ensemble_verdicts_leave_out_disagreeing_rows_and_multithread_runs():
    from types import SimpleNamespace

    from benchmarks.harness import Context, SuiteResult
    from benchmarks.suites import lorenz_ensemble as le

    def result():
        return SuiteResult(measurements=[
            _ensemble_row(le, le.SCIAX, 0.05), _ensemble_row(le, le.C_REF, 0.04),
            _ensemble_row(le, le.NUMPY, 0.7, disagrees=True), _ensemble_row(le, le.TORCH_COMPILE, 0.07)])

    one_core = Context(quick=True, device="cpu", threads=1, reps=1, max_call_s=1.0, out_dir=Path("."))
    judged = result()
    le._targets(one_core, judged)
    by_name = {t.name: t for t in judged.targets}
    assert by_name[f"RK4 float32 B=1e5 vs {le.NUMPY}"].met is None  # disagrees: not judged
    assert by_name[f"RK4 float32 B=1e5: sciax vs {le.TORCH_COMPILE}"].met is False  # 1.4x < 5x
    assert by_name["RK4 float32 B=1e5: sciax fraction of C"].met is True  # 80% ≥ 40%

    for threads in (None, 2):
        ctx = SimpleNamespace(**{**vars(one_core), "threads": threads})
        ctx.unjudged = Context.unjudged.__get__(ctx)
        ctx.threads_label = Context.threads_label.__get__(ctx)
        many = result()
        le._targets(ctx, many)
        assert all(t.met is None for t in many.targets)
        assert any("one-core figures" in t.note for t in many.targets)


def test_a_c_build_failure_fails_only_the_c_rows(tmp_path, monkeypatch):
    """gcc present but failing: the C rows report it, gcc is not run again, and the suite's
    peak step is skipped instead of taking the suite down."""
    from benchmarks.baselines import c_lorenz
    from benchmarks.harness import Context
    from benchmarks.suites import lorenz_ensemble as le

    calls = []

    def broken(build_dir):
        calls.append(build_dir)
        raise RuntimeError("gcc failed: no such option -march=native")

    monkeypatch.setattr(c_lorenz, "compile_library", broken)
    ctx = Context(quick=True, device="cpu", threads=1, reps=1, max_call_s=1.0, out_dir=tmp_path)
    prepare = le.make_prepare_c(ctx)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="gcc failed"):
            prepare(ctx, "rk4", np.dtype("float32"), wl.ensemble_rhos(4, np.float32))
    with pytest.raises(RuntimeError, match="gcc failed"):
        prepare.library()
    assert len(calls) == 1

    # The whole suite: the C rows fail, the others are measured, no core-peak figures.
    monkeypatch.setattr(le, "_availability", lambda: {})
    monkeypatch.setattr(le, "_plan", lambda ctx: [("rk4", "float32", 64, [le.C_REF, le.NUMPY])])
    ctx.log = lambda _: None
    result = le.run(ctx)
    rows = {m.impl: m for m in result.measurements}
    assert rows[le.C_REF].status == "failed" and "gcc failed" in rows[le.C_REF].note
    assert rows[le.NUMPY].status == "ok"
    assert any("No core-peak figures: the C library did not build" in n for n in result.notes)


def test_gradient_rows_are_checked_against_checkpoint_adjoint_where_direct_is_not_run(tmp_path, monkeypatch):
    """Quick mode runs no DirectAdjoint at 10,000 steps: CheckpointAdjoint is the reference there."""
    from benchmarks.harness import Context, Prepared
    from benchmarks.suites import gradient as g

    grads = {g.SCIAX_CKPT: np.ones(3), g.SCAN_CKPT: np.array([1.0, 1.0, 1.1])}

    def fake(impl):
        return lambda ctx, case, n_steps, problem: Prepared(call=lambda: (1.0, grads[impl]))

    monkeypatch.setattr(g, "_plan", lambda ctx: [(10_000, g.GRAD, [g.SCIAX_CKPT, g.SCAN_CKPT])])
    monkeypatch.setattr(g, "_problem", lambda: None)
    monkeypatch.setattr(g, "PREPARE", {impl: fake(impl) for impl in grads})
    ctx = Context(quick=True, device="cpu", threads=1, reps=1, max_call_s=100.0, out_dir=tmp_path,
                  log=lambda _: None)
    rows = {m.impl: m for m in g.run(ctx).measurements if m.status == "ok"}
    assert rows[g.SCIAX_CKPT].extra["agreement"].startswith("ref")
    assert rows[g.SCAN_CKPT].extra["grad_rel_err"] == pytest.approx(0.1)
    assert rows[g.SCAN_CKPT].note.startswith(f"WRONG GRADIENT: off by 1.0e-01 relative to {g.SCIAX_CKPT}")


def test_gradient_speed_is_not_judged_against_a_peer_with_a_wrong_gradient():
    from benchmarks.harness import Measurement, SuiteResult
    from benchmarks.suites import gradient as g

    def row(impl, seconds, note=""):
        return Measurement(suite=g.NAME, case=g.GRAD, impl=impl, precision="float64", size=g.MAIN_STEPS,
                           size_name="steps", unit="traj-steps/s", time_median_s=seconds, note=note)

    result = SuiteResult(measurements=[row(g.SCIAX_CKPT, 0.010), row(g.SCAN_CKPT, 0.020),
                                       row(g.NUMPY, 0.005, "WRONG GRADIENT: off by 1.0e-01 relative to x")])
    g._targets(result)
    by_peer = {t.name.rsplit(" than ", 1)[1]: t for t in result.targets if " faster than " in t.name}
    assert by_peer[g.SCAN_CKPT].met is True
    assert by_peer[g.NUMPY].met is None and by_peer[g.NUMPY].note.startswith("WRONG GRADIENT")
