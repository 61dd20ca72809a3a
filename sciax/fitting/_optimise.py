"""The jitted solve: Optimistix on the residuals, then the Gauss–Newton covariance at the
optimum, packaged as a `FitResult`."""

import functools
import re
import threading
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import optimistix as optx

from .._compile.async_dispatch import _Static
from .._compile.host_checked import drop_host_checked
from .._compile.operation_count import operation_count
from .._compile.program_cache import ProgramCache
from .._optimistix_solvers import BY_NAME as _SOLVERS
from .._rollout import Solve
from .._validation import check_tolerances, describe, real_scalar
from ._problem import forward_residual_function, residual_function
from ._result import FitResult
from ._unknowns import entry_labels

_JACOBIAN = {"auto": "auto", "forward": "fwd", "reverse": "bwd"}
_FORWARD_GRADIENT_MAX_UNKNOWNS = 16  # a minimiser's gradient: forward mode up to this many unknowns


def choose_solver(solver, jacobian, rtol, atol, dtype, problem):
    """(solver, Optimistix options, mode of the solver's derivatives, mode of the residual
    Jacobian for the covariance); modes are "fwd" or "bwd"."""
    if not isinstance(jacobian, str) or jacobian not in _JACOBIAN:
        raise ValueError(f"fit: `jacobian` must be 'auto', 'forward' or 'reverse', got {jacobian!r}.")
    given_tolerances = rtol is not None or atol is not None
    default_tol = 1e-8 if jnp.finfo(dtype).bits >= 64 else 1e-5
    rtol = default_tol if rtol is None else real_scalar("rtol", rtol)
    atol = default_tol if atol is None else real_scalar("atol", atol)
    check_tolerances("fit", rtol, atol)  # an infinite one returned the start as converged
    if isinstance(solver, str):
        key = solver.lower().replace("-", "_").replace(" ", "_")
        key = {"lm": "levenberg_marquardt", "gn": "gauss_newton"}.get(key, key)
        if key not in _SOLVERS:
            raise ValueError(
                f"fit: unknown solver {solver!r}; choose 'levenberg_marquardt', 'gauss_newton' or "
                "'bfgs', or pass an Optimistix solver instance."
            )
        solver = _SOLVERS[key](rtol=rtol, atol=atol)
    elif not isinstance(solver, (optx.AbstractLeastSquaresSolver, optx.AbstractMinimiser)):
        raise TypeError(
            "fit: `solver` must be 'levenberg_marquardt', 'gauss_newton', 'bfgs' or an Optimistix "
            f"least-squares solver or minimiser, got {describe(solver)}."
        )
    elif given_tolerances:
        raise ValueError(
            f"fit: `rtol`/`atol` set the tolerances of a solver chosen by name; {type(solver).__name__} "
            "was passed as an instance and carries its own, so pass them to its constructor instead."
        )
    mode = covariance_mode = _JACOBIAN[jacobian]
    if mode == "auto":
        # The residual Jacobian (least-squares solvers, and the covariance): n_unknowns tangents
        # forward, or n_residuals cotangents backward. A minimiser (BFGS) needs the gradient of
        # one scalar loss: one backward pass, against n_unknowns tangents forward; measured, forward
        # won at 6 unknowns (Lorenz, 3,000 RK4 steps: 2.5x) and lost at 42 (mass-spring lattice:
        # 2.3x) and 210 (60x per gradient).
        n_residuals = problem.n_data + (problem.n_segments - 1) * problem.layout.size
        covariance_mode = _supported(problem, "fwd" if problem.n_unknowns <= n_residuals else "bwd")
        mode = covariance_mode
        if isinstance(solver, optx.AbstractMinimiser):
            mode = _supported(problem, "fwd" if problem.n_unknowns <= _FORWARD_GRADIENT_MAX_UNKNOWNS else "bwd")
    if isinstance(solver, optx.AbstractMinimiser):
        options = {"autodiff_mode": mode}
    else:
        options = {"jac": mode}
    return solver, options, mode, covariance_mode


def _supported(problem, mode):
    """`mode`, or the other one when the rollout differentiates one way only (e.g. ReversibleAdjoint)."""
    try:
        problem.rollout.check_jacobian(mode)
    except ValueError:
        return {"fwd": "bwd", "bwd": "fwd"}[mode]
    return mode


# `fit(compilation="fast")` on CPU: XLA's legacy loop emitters and no LLVM optimisation
# (`xla_backend_optimization_level=0`). Measured on the damped-oscillator benchmark fit (one
# core, float64): first fit 1.5 s -> 0.69-0.75 s (the emitters option alone: 1.0-1.2 s; O0 alone:
# 1.24-1.31 s), per fit 12 -> 14 ms. On the examples' larger models the compiled fit runs slower
# (mass–spring lattice 134 -> 983 ms per fit, Lorenz multiple shooting 26 -> 97 ms).
FAST_CPU_COMPILER_OPTIONS = {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 0}
COMPILATIONS = ("auto", "optimised", "fast")

# `compilation="auto"` compiles quickly (`"fast"`) when a fit that runs to its step limit is
# estimated at no more than this many operations (`sciax._compile.operation_count` of the
# residuals, times the passes of one step, times `max_steps`). Measured, one core, float64, per
# operation of that estimate: the quick compile runs 0.95-3.5 ns slower (Lorenz, damped
# oscillator, mass-spring lattice) and saves 1.7-3.5 s of compiling (on a machine 2-4x slower
# than the benchmarks' usual one). So a fit at the limit that takes every step it may loses at
# most 5e8 x 3.5 ns = 1.75 s, about the smallest saving; a fit that converges in a tenth of its
# steps, a tenth of that. With the default 256 steps the limit is 2e6 operations per step.
AUTO_FAST_MAX_OPERATIONS = 5e8
_AUTO_MEMO: dict = {}  # problem structure -> operations per step, oldest first
_AUTO_MEMO_SIZE = 64
_AUTO_MEMO_LOCK = threading.Lock()  # fits may run in several threads
_UNKNOWN_OPTION = re.compile(r"No such compile option: '([^']+)'")


class _Jitted:
    """`fn` under `eqx.filter_jit`, twice: with XLA's default optimisation, and with
    `FAST_CPU_COMPILER_OPTIONS` for `compilation="fast"` where it runs on a CPU (elsewhere
    the default). An option the installed jaxlib does not know is dropped, with a warning,
    and the others are kept.

    With `probe` and `config` (see `ProgramCache`), the traced and lowered program is also kept
    on disk next to JAX's persistent compilation cache when that is on, so that a fresh process
    skips tracing and lowering; `fn`'s outputs must then be plain (arrays, None, tuples, dicts).
    With `settings`, `fn` and `probe` take one more argument, `settings(problem)`, for the key.

    A `Solve` rollout's run-time checks of its times are left out of the compiled program
    (`_without_host_checked`)."""

    def __init__(self, fn, probe=None, config=(), settings=None):
        fn = _without_host_checked(fn)
        self.fn = fn
        self.settings = settings
        self.optimised = eqx.filter_jit(fn)
        self.options = dict(FAST_CPU_COMPILER_OPTIONS)
        self.fast = eqx.filter_jit(fn, compiler_options=self.options)
        self.programs = None if probe is None else ProgramCache(fn, probe, config, fn.__name__)
        self.__doc__ = fn.__doc__

    def __call__(self, problem, *args, compilation="optimised"):
        fast = compilation == "fast" and _platform(problem) == "cpu"
        if self.settings is not None:
            args = (*args, self.settings(problem))
        while True:
            try:
                return self._call(fast, problem, *args)
            except jax.errors.JaxRuntimeError as err:
                # Raised while compiling, before anything runs; any other error propagates.
                unknown = _UNKNOWN_OPTION.search(str(err))
                if not fast or unknown is None or unknown.group(1) not in self.options:
                    raise
                del self.options[unknown.group(1)]
                warnings.warn(f"fit(compilation='fast'): this jaxlib does not know the XLA option "
                              f"{unknown.group(1)!r}; compiling without it.", RuntimeWarning, stacklevel=3)
                self.fast = eqx.filter_jit(self.fn, compiler_options=self.options)

    def _call(self, fast, *args):
        if self.programs is not None:
            kept = self.programs.lookup(args, self.options if fast else None)
            if kept is not None:
                leaves = jtu.tree_leaves(eqx.filter(args, eqx.is_array))
                try:
                    program = kept.compile(leaves)
                except Exception as why:  # a kept program must never fail a fit the ordinary path runs
                    if fast and _UNKNOWN_OPTION.search(str(why)):
                        raise  # not the entry's fault: `__call__` drops the option and comes back
                    self.programs.discard(kept, why)
                else:
                    return program(*leaves)  # errors while running are the fit's own, as without it
        return (self.fast if fast else self.optimised)(*args)


def _without_host_checked(fn):
    """`fn(problem, ...)`, with a `Solve` rollout's run-time checks of its times left out of the
    compiled program (`_compile/host_checked.py`): `fit` made those times on the host, and the
    checks' host callbacks kept the program out of JAX's persistent compilation cache."""
    dropped = drop_host_checked(fn)

    @functools.wraps(fn)
    def program(problem, *args):
        return (dropped if isinstance(problem.rollout, Solve) else fn)(problem, *args)

    return program


def _platform(problem) -> str:
    """The platform the problem's jitted functions run on: that of a committed array (placed
    on a device explicitly) if there is one, else that of the current default device, where
    `fit` put the data (`problem.keep`)."""
    for leaf in jax.tree_util.tree_leaves(problem):
        if isinstance(leaf, jax.Array) and leaf.committed:
            return next(iter(leaf.devices())).platform
    return next(iter(problem.keep.devices())).platform


def resolve_compilation(compilation: str, problem, segment_states, solver, mode, max_steps: int) -> str:
    """`"optimised"` or `"fast"`: `compilation` itself unless it is `"auto"`, which picks
    `"fast"` on a CPU when a fit of `max_steps` steps is cheap (`AUTO_FAST_MAX_OPERATIONS`), so
    that a small model's one-off fit is not dominated by XLA optimising code that runs for
    milliseconds. The choice depends on the problem's structure and `max_steps` alone (never on
    timings or on how often it was called), so the same fit gives the same bits every time.

    One step's work is the residuals' operation count times the passes it makes: 1 + (number of
    unknowns) forward-mode tangents, or for reverse mode 1 + 2 x (number of residuals) passes for
    a least-squares Jacobian and 3 for a minimiser's gradient. An unbounded loop in the model
    (a Diffrax `Solve`) counts as expensive."""
    if _platform(problem) != "cpu":
        return "optimised"  # the quick compile is a CPU option
    if compilation != "auto":
        return compilation
    if isinstance(problem.rollout, Solve):
        return "optimised"  # Diffrax's loop: no known length, so counted as infinite without tracing it
    work = _work_per_step(problem, segment_states, solver, mode) * max_steps
    return "fast" if work <= AUTO_FAST_MAX_OPERATIONS else "optimised"


def _work_per_step(problem, segment_states, solver, mode) -> float:
    """Estimated operations of one optimiser step (see `resolve_compilation`), memoised per
    problem structure: the count traces the residuals once."""
    dynamic, static = eqx.partition((problem, segment_states), eqx.is_array)
    key = (_Static(static), jtu.tree_structure(dynamic), tuple((x.shape, x.dtype) for x in jtu.tree_leaves(dynamic)),
           mode, isinstance(solver, optx.AbstractMinimiser))
    try:
        hash(key)
    except TypeError:  # an unhashable static field: count without the memo
        key = None
    if key is not None:
        with _AUTO_MEMO_LOCK:
            if key in _AUTO_MEMO:
                return _AUTO_MEMO[key]
    operations = operation_count(eqx.filter_make_jaxpr(_residuals_at_start)(problem, segment_states)[0])
    if mode == "fwd":
        passes = 1 + problem.n_unknowns
    elif isinstance(solver, optx.AbstractMinimiser):
        passes = 3
    else:
        passes = 1 + 2 * (problem.n_data + (problem.n_segments - 1) * problem.layout.size)
    work = operations * passes
    if key is not None:
        with _AUTO_MEMO_LOCK:
            if len(_AUTO_MEMO) >= _AUTO_MEMO_SIZE:
                _AUTO_MEMO.pop(next(iter(_AUTO_MEMO)))
            _AUTO_MEMO[key] = work
    return work


def _residuals_at_start(problem, segment_states):
    return problem.residuals_unconstrained(initial_unconstrained(problem, segment_states))


def initial_unconstrained(problem, segment_states):
    return problem.to_unconstrained(problem.initial_physical(segment_states)).astype(problem.optimiser_dtype)


@_Jitted
def _initial_residuals_finite(problem, segment_states):
    return jnp.all(jnp.isfinite(_residuals_at_start(problem, segment_states)))


def _solve(problem, segment_states, solver, options, max_steps, mode, settings=None):
    """Solve, and return the optimum with the residuals r and their Jacobian J = ∂r/∂v there.

    Optimistix's Gauss–Newton family (Levenberg–Marquardt, Gauss–Newton, Dogleg) keeps the
    linearisation of the point it returns (`state.f_info`: r(u*) and J_u = ∂r/∂u at u*), so
    the covariance needs no further rollout: J = J_u · diag(dv/du)⁻¹ (the transforms act
    elementwise). That saves compiling a second copy of the model, about a third of a fit's
    compile time. Other solvers (BFGS) return `jac=None`, and `fit` linearises separately.

    The outputs are plain (arrays, tuples of arrays, None), so that the program can be kept on
    disk (`ProgramCache`); `unpack` turns them into the system, states and solver result.
    `settings` is only for its key (`_diffrax_settings`).
    """
    u0 = initial_unconstrained(problem, segment_states)
    fn = forward_residual_function if mode == "fwd" else residual_function
    sol = optx.least_squares(fn, solver, u0, args=problem, options=options,
                             max_steps=max_steps, throw=False)
    out = _at_optimum(problem, sol.value)
    out.update(result=tuple(jtu.tree_leaves(sol.result)), success=sol.result == optx.RESULTS.successful,
               n_steps=sol.stats["num_steps"], jac=None, r=None)
    f_info = getattr(sol.state, "f_info", None)
    if isinstance(solver, optx.AbstractGaussNewton) and isinstance(f_info, optx.FunctionInfo.ResidualJac):
        out["r"] = f_info.residual.astype(problem.dtype)
        out["jac"] = (f_info.jac.as_matrix() / out["scale"]).astype(problem.dtype)
    return out


def _at_optimum(problem, u):
    """The physical values at the unconstrained point u, as plain arrays."""
    v = problem.to_physical(u).astype(problem.dtype)
    scale = jax.jvp(problem.to_physical, (u,), (jnp.ones_like(u),))[1].astype(problem.dtype)
    system, flat0, segments = problem.values(v)
    system_leaves = jtu.tree_leaves(system)
    states = jax.vmap(problem.layout.unflatten)(jnp.concatenate([flat0[None], segments]))
    return {"v": v, "scale": scale, "params": tuple(system_leaves[i] for i in problem.leaf_index),
            "state0": tuple(jtu.tree_leaves(problem.layout.unflatten(flat0))),
            "segment_states": tuple(jtu.tree_leaves(states))}


def _solve_probe(problem, segment_states, solver, options, max_steps, mode, settings=None):
    """What `_solve` runs besides Optimistix: the model (both residual functions call
    `residuals_unconstrained`), the start point and the values at the optimum. With a `Solve`
    rollout, Diffrax is left out too: the model is its vector field (`Solve.without_diffrax`),
    and the `Solve` itself, which picks Diffrax's code, is in the key by value (`settings`)."""
    if settings is not None:
        problem = eqx.tree_at(lambda p: p.rollout, problem, settings.without_diffrax())
    u0 = initial_unconstrained(problem, segment_states)
    return problem.residuals_unconstrained(u0), _at_optimum(problem, u0)


def _diffrax_settings(problem):
    """The `Solve` rollout, for the key of a kept program (see `_solve_probe`); else None."""
    return problem.rollout if isinstance(problem.rollout, Solve) else None


solve = _Jitted(_solve, probe=_solve_probe, config=(2, 3, 4, 5, 6), settings=_diffrax_settings)


def unpack(problem, out):
    """(system, state0, segment start states, solver result) from `solve`'s plain outputs (no
    device work: only the pytree structures are put back)."""
    treedef = problem.layout.treedef
    return (problem.with_params(out["params"]), jtu.tree_unflatten(treedef, list(out["state0"])),
            jtu.tree_unflatten(treedef, list(out["segment_states"])),
            jtu.tree_unflatten(jtu.tree_structure(optx.RESULTS.successful), list(out["result"])))


@_Jitted
def physical_linearisation(problem, v, mode):
    """(J = ∂r/∂v, r) at the physical vector v, from one rollout (the primal is the aux)."""
    jacobian = jax.jacfwd if mode == "fwd" else jax.jacrev
    return jacobian(lambda x: (problem.residuals_physical(x),) * 2, has_aux=True)(v)


def gauss_newton_covariance(jac, r, n_interest, n_unknowns, scale_covariance):
    """Covariance of the first `n_interest` unknowns from the residual Jacobian J (NumPy).

    The columns are scaled to unit norm first, J = Ĵ D with D = diag(‖J_j‖), so that the rank
    test does not depend on the units of the parameters: (JᵀJ)⁻¹ = D⁻¹ V S⁻² Vᵀ D⁻¹ from the SVD
    Ĵ = U S Vᵀ (no squared condition number). Singular values of Ĵ below s₀ · max(n, p) · ε
    (a zero column among them) span the directions the data do not determine: an unknown with a
    share of more than 10⁻⁶ of its unit vector in them is not identifiable, and its rows and
    columns are NaN. The others are estimable, and their covariance is that of the
    pseudo-inverse, D⁻¹ V S⁺² Vᵀ D⁻¹ (for an estimable value any generalised inverse of JᵀJ
    gives the same variance): an unidentifiable parameter no longer makes every standard error
    NaN. (Unscaled, a float32 SIR fit with N = 10^7, whose Jacobian columns differ by 10^7
    through the units alone, was called rank-deficient with every standard error NaN.) Scaled by
    the residual variance s² = Σr² / (n − p) when `scale_covariance`. Returns (covariance,
    unscaled covariance, residual variance, full rank).
    """
    jac, r = np.asarray(jac), np.asarray(r)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # NaN/Inf are reported
        return _covariance(jac, r, n_interest, n_unknowns, scale_covariance)


def _covariance(jac, r, n_interest, n_unknowns, scale_covariance):
    q = n_interest
    n_total = r.shape[0]
    sum_sq = np.sum(r**2)
    residual_variance = sum_sq / (n_total - n_unknowns) if n_total > n_unknowns else np.asarray(np.nan, r.dtype)
    if jac.shape[0] < jac.shape[1] or not np.all(np.isfinite(jac)):
        # Fewer residuals than unknowns: JᵀJ is singular (the SVD's min(n, p) values would
        # hide it); non-finite J: nothing to invert.
        nan = np.full((q, q), np.nan, jac.dtype)
        return nan, nan, residual_variance, False
    norms = np.linalg.norm(jac, axis=0)
    columns_ok = norms > 0
    _, s, vt = np.linalg.svd(jac / np.where(columns_ok, norms, 1), full_matrices=False)
    rank_ok = s > s[0] * max(jac.shape) * np.finfo(jac.dtype).eps  # a zero column gives a zero s
    share = np.sum(vt[~rank_ok] ** 2, axis=0)  # each unknown's share in the undetermined directions
    unidentifiable = (share > _NULL_SHARE) | ~columns_ok
    inverse = np.where(rank_ok, 1 / np.where(rank_ok, s, 1) ** 2, 0.0)  # the pseudo-inverse
    inv_norms = 1 / np.where(columns_ok, norms, 1)
    full = (vt.T * inverse) @ vt * np.outer(inv_norms, inv_norms)
    full[unidentifiable, :] = np.nan
    full[:, unidentifiable] = np.nan
    cov_unscaled = full[:q, :q]
    cov = cov_unscaled * (residual_variance if scale_covariance else 1)
    return cov.astype(jac.dtype), cov_unscaled, residual_variance, bool(np.all(rank_ok))


_NULL_SHARE = 1e-6  # squared component along the undetermined directions that makes an unknown unidentifiable


def _labels(problem) -> tuple[str, ...]:
    labels = []
    for b in problem.blocks:
        if not b.fixed:
            labels += entry_labels(b.name, b.shape)
    if problem.state_block is not None:
        names = problem.layout.labels("state0")
        labels += [names[i] for i in np.asarray(problem.state_index)]
    return tuple(labels)


def _at_bounds(problem, v, standard_errors) -> tuple[str, ...]:
    """Labels of the fitted values within one standard error of a bound of their transform."""
    labels = _labels(problem)
    near = np.concatenate([np.ravel(b.transform.at_bound(v[b.start:b.start + b.size],
                                                         standard_errors[b.start:b.start + b.size]))
                           for b in problem._free_blocks()] or [np.zeros(0, bool)])
    return tuple(label for label, p in zip(labels, near, strict=True) if p)


def _saturation_threshold(dtype):
    """|dv/du| below which J = J_u / (dv/du) is not trusted: √(smallest normal number)."""
    return np.sqrt(np.finfo(dtype).tiny)


def package(problem, segment_states, segment_times, out, mode, scale_covariance, compilation="optimised") -> FitResult:
    """Turn `solve`'s arrays into a `FitResult`: covariance and standard errors (NumPy, on the
    host), the solver's message, and the checks that explain a failure. `compilation` is
    `fit`'s, for the linearisation or check that may need compiling here."""
    system, state0, states_at_optimum, result = unpack(problem, out)
    v, scale = np.asarray(out["v"]), np.asarray(out["scale"])
    jac, r = out["jac"], out["r"]
    if jac is None or int(out["n_steps"]) == 0 or not np.all(np.abs(scale) >= _saturation_threshold(scale.dtype)):
        # No linearisation from the solver (BFGS, or no step taken), or a transform saturated
        # (dv/du ≈ 0, so J_u has lost J's digits): J in physical units directly.
        jac, r = physical_linearisation(problem, out["v"], mode, compilation=compilation)
    jac, r = np.asarray(jac), np.asarray(r)
    q, n_data = problem.n_interest, problem.n_data
    cov, cov_unscaled, residual_variance, full_rank = gauss_newton_covariance(
        jac, r, q, problem.n_unknowns, scale_covariance)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # NaN/Inf are reported
        se_flat = np.sqrt(np.diag(cov))
        d = np.sqrt(np.diag(cov_unscaled))
        correlation = (cov_unscaled / np.outer(d, d)).astype(cov.dtype)
        loss = 0.5 * np.sum(r**2)
    params, errors = {}, {}
    for b, value in zip(problem.blocks, problem.param_values):
        if b.fixed:
            params[b.name], errors[b.name] = np.asarray(value), np.zeros(np.shape(value), v.dtype)
        else:
            params[b.name] = v[b.start:b.start + b.size].reshape(b.shape)
            errors[b.name] = se_flat[b.start:b.start + b.size].reshape(b.shape)
    layout = problem.layout
    state0_se = None
    if problem.state_block is not None:
        sb = problem.state_block
        se0 = np.zeros(layout.size, v.dtype)
        se0[np.asarray(problem.state_index)] = se_flat[sb.start:sb.start + sb.size]
        state0_se = layout.unflatten(se0)

    at_bounds = _at_bounds(problem, v, se_flat)
    unidentifiable = () if full_rank or not np.all(np.isfinite(jac)) else tuple(
        label for label, d in zip(_labels(problem), np.diag(cov_unscaled), strict=True) if np.isnan(d))
    converged = bool(out["success"])
    message = optx.RESULTS[result]
    final_finite = bool(np.all(np.isfinite(r)))
    # The initial residuals are only looked at to explain a failure (a separate, small compile
    # on that path keeps them out of the solve every successful fit compiles).
    if not (converged and final_finite) and not bool(
            _initial_residuals_finite(problem, segment_states, compilation=compilation)):
        converged = False
        cause = ("the model blew up, or Diffrax's solve failed there (a `Solve` returns non-finite states when "
                 "it reaches `max_steps` or its steps fall below the resolution of the times' dtype; "
                 "sciax.solve(..., throw=True) at the initial guess says which)"
                 if isinstance(problem.rollout, Solve) else "the model blew up")
        message = (f"the residuals are not finite (NaN/Inf) at the initial guess: {cause}; start closer, shorten "
                   "the step, or use transforms. The optimiser's message: " + message).strip()
    elif not final_finite:
        converged = False
        message = ("the residuals at the returned point are not finite (NaN/Inf). " + message).strip()
    elif converged and not full_rank:
        which = (f"{', '.join(unidentifiable)} {'is' if len(unidentifiable) == 1 else 'are'} not identifiable "
                 f"from these data (standard error NaN)" if unidentifiable else
                 "some combination of the shooting segments' states is not identifiable from these data")
        message = (f"converged, but the Jacobian is rank-deficient at the optimum: {which}; the other "
                   "values' standard errors are computed on the identifiable subspace (the pseudo-inverse of JᵀJ).")
    elif converged and scale_covariance and not np.isfinite(residual_variance):
        message = (f"converged, but {r.shape[0]} residuals for {problem.n_unknowns} unknowns leave no degrees "
                   "of freedom to estimate the noise from the residuals, so the standard errors are NaN; "
                   "give the noise as `sigma` (the covariance is then not rescaled).")
    elif converged and at_bounds:
        message = (f"converged, but {', '.join(at_bounds)} lies within one standard error of a bound of its "
                   "Bounded transform: the best fit may lie on or beyond the bound, and the Gaussian "
                   "approximation (standard error, plot band) does not hold there. Widen the bounds if the "
                   "value belongs inside.")
    return FitResult(
        params=params,
        standard_errors=errors,
        system=system,
        state0=state0,
        state0_standard_errors=state0_se,
        loss=loss,
        residuals=r[:n_data],
        continuity_residuals=r[n_data:].reshape(problem.n_segments - 1, layout.size),
        covariance=cov,
        correlation=correlation,
        residual_variance=residual_variance,
        labels=_labels(problem),
        n_observations=n_data,
        n_parameters=q,
        n_steps=int(out["n_steps"]),
        converged=converged,
        message=message,
        at_bounds=at_bounds,
        unidentifiable=unidentifiable,
        compilation=compilation,
        segment_times=segment_times,
        segment_states=states_at_optimum,
        problem=problem,
        optimum=out["v"],
        scale=out["scale"],
    )
