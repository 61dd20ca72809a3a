"""`fit`: least-squares fitting of a system's parameters (and initial state) to data."""

from collections.abc import Callable
from typing import Literal

import equinox as eqx
import jax
import jax.tree_util as jtu
import numpy as np

from .._compile.callable_key import by_code
from .._rollout import AbstractRollout
from .._validation import check_precision, describe, refuse_tracers, state_dtype, to_device
from ..systems._base import AbstractODE
from ._data import check_mask_sigma, check_observed, check_times
from ._optimise import COMPILATIONS, choose_solver, package, resolve_compilation, solve
from ._problem import Problem, identity
from ._result import FitError, FitResult
from ._shooting import MultipleShooting, initial_segment_states, segment_bounds
from ._unknowns import (
    Block,
    resolve_params,
    resolve_state_mask,
    resolve_transforms,
    state_layout,
)


def fit(
    system,
    state0,
    times,
    observed,
    *,
    params,
    rollout: AbstractRollout,
    transforms=None,
    fit_initial_state=False,
    observe: Callable | None = None,
    sigma=None,
    mask=None,
    t0=None,
    args=None,
    shooting: MultipleShooting | None = None,
    solver="levenberg_marquardt",
    jacobian: Literal["auto", "forward", "reverse"] = "auto",
    rtol: float | None = None,
    atol: float | None = None,
    max_steps: int = 256,
    scale_covariance: bool | None = None,
    throw: bool = True,
    compilation: Literal["auto", "optimised", "fast"] = "auto",
) -> FitResult:
    """Fit parameters of `system` (and optionally its initial state) to observations.

    Minimises ½ Σᵢ rᵢ² with rᵢ = (model − observed)/sigma over the observed entries, using
    Optimistix. The model is `observe(state(t))` for the state obtained by integrating
    `system` from `state0` at `t0` with `rollout`.

    **Arguments:**

    - `system`: an `AbstractODE` or particle system (Equinox module) holding the initial guesses.
    - `state0`: the state at `t0` (array, or `PhaseSpace`); its dtype is the fit's dtype.
    - `times`: `(n,)` strictly increasing observation times, all ≥ `t0`.
    - `observed`: the data, leading axis over `times`: an array `(n, ...)` matching the shape of
      `observe(state)`, or a pytree of such arrays matching its structure.
    - `params`: what to fit: a field name (`"rho"`), a list of names (dotted for nested modules;
      an array field is fitted entrywise), a selector `lambda s: (s.omega, s.zeta)` as in
      `eqx.tree_at`, or a boolean filter with the system's structure.
    - `rollout`: how to integrate: `Simulate(integrator, dt)` (fixed step; `times` on the step
      grid) or `Solve(...)` (Diffrax; any times).
    - `transforms`: dict name -> `Positive()`, `Bounded(lo, hi)`, `Identity()` or `Fixed()`
      (also the key `"state0"` for the fitted initial-state entries), or one transform for all
      parameters. The optimiser works in the unconstrained space; results are physical.
    - `fit_initial_state`: `False`, `True` (every entry) or a boolean mask like `state0`.
    - `observe`: `observe(state) -> measured quantities` (default: the whole state).
    - `sigma`: standard deviation of each observation: a scalar, an array broadcastable to
      `observed`, or a pytree like it; positive. Default 1 (and the covariance is rescaled by
      the residual variance). For weights w pass `sigma = 1/sqrt(w)`.
    - `mask`: boolean like `observed`: True where a value was measured, False where it is
      missing (its value, NaN or not, is then ignored). Default: everything observed, and a NaN
      in `observed` is an error.
    - `t0`: start time of the integration (default `times[0]`).
    - `args`: passed to `vector_field(t, y, args)`.
    - `shooting`: `None` (single shooting) or `MultipleShooting(n_segments, continuity_weight)`.
    - `solver`: `"levenberg_marquardt"` (default), `"gauss_newton"`, `"bfgs"` (minimises the
      scalar loss), or an Optimistix least-squares solver / minimiser instance. A solver named
      by string is Optimistix's, made to stop also when it rejects a step that is within the
      tolerance on the parameters and whose predicted change of the loss is within round-off
      (`sciax/_optimistix_solvers.py`): Optimistix alone tests only accepted steps, and at tight
      tolerances on noisy data it rejected steps at the optimum until `max_steps` (seen under
      jax 0.10.0). An instance is used as given.
    - `jacobian`: `"auto"` (forward mode when the unknowns are no more than the residuals,
      reverse mode otherwise; for a minimiser such as BFGS, whose gradient is that of one
      scalar loss, forward mode only up to 16 unknowns, while the covariance's Jacobian keeps
      the first rule; unless the rollout supports only the other, as `ReversibleAdjoint`
      supports only reverse mode), `"forward"` or `"reverse"`. It sets how the residual Jacobian
      is formed (Optimistix's `options={"jac": ...}`; for BFGS, the gradient's
      `autodiff_mode`), at the optimum for the covariance too, and the rollout's adjoint when
      it has an automatic one (`Solve(adjoint=None)`).
    - `rtol`, `atol`: the optimiser's tolerances on the step and on the change of the residuals
      (default 1e-8 in float64, 1e-5 in float32); for a solver named by string only.
    - `max_steps`: optimiser step limit.
    - `scale_covariance`: rescale `(JᵀJ)⁻¹` by the residual variance s². Default: only when
      `sigma` is not given.
    - `throw`: raise `FitError` when the fit does not converge; with `False` the result comes
      back with `converged=False` and the solver's message.
    - `compilation`: how XLA compiles the solve on a CPU. `"fast"`: quickly, to less optimised
      code (XLA's legacy loop emitters, no LLVM optimisation); `"optimised"`: XLA's full
      optimisation; `"auto"` (default): `"fast"` when a fit that takes all `max_steps` steps is
      estimated at no more than 5·10⁸ operations (the residuals' operation count, counted from
      their jaxpr, times the passes of one step, 1 + number of unknowns in forward mode, times
      `max_steps`: 2·10⁶ per step at the default 256), else `"optimised"`. A `Solve` rollout
      (Diffrax's loop has no known length) is always optimised by `"auto"`; pass `"fast"` for a
      one-off fit of a small model with it. The choice depends only on the problem's structure
      and `max_steps`, never on timings, so a fit gives the same bits every time;
      `FitResult.compilation` says which was used. Measured on the benchmark machine (one core):
      the damped oscillator's first fit takes about half as long fast (1.5 s -> 0.74 s; SciPy's
      whole fit is 0.43 s) and each later fit about 1.5x longer (8–10 -> 13–15 ms); larger models
      run several times slower fast (mass–spring lattice: 135 ms -> 1.0 s per fit), which is why
      `"auto"` keeps them optimised. Pass `"optimised"` for a small model fitted many times in one
      process (bootstrap loops) when the run time, not the first call, matters. Off a CPU always
      optimised. The fitted values agree within the solver's tolerance either way (different
      round-off may take one more or fewer step).

    **Returns:** a `FitResult` (fitted `params`, `system`, `state0`, `covariance`, …).

    **Raises:** `ValueError`/`TypeError` for bad input (NaN without a mask, mismatched
    lengths, times not increasing or before `t0`, unknown field names, an initial value
    outside its transform's domain, non-positive sigma); `FitError` when `throw=True` and
    the fit did not converge.

    With JAX's persistent compilation cache on (`sciax.enable_compilation_cache()`), the solve
    is also kept traced and lowered on disk, so the first fit in a new process skips tracing,
    lowering and compiling: a few tenths of a second instead of seconds (`benchmarks/README.md`,
    `fit`). With a `Solve` rollout too: its run-time checks of the save times and `dt0`, host
    callbacks that JAX's cache does not keep, are left out of the program, as `fit` made those
    times itself. Compiled in every new process instead: a model whose jaxpr holds a user
    `custom_jvp`/`custom_vjp` rule or a host callback (`jax.debug.print`, an `eqx.error_if`), and
    a `Solve` with an implicit solver (`"kvaerno5"`, ...), whose tangent linear solves Lineax
    checks at run time with a host callback.

    `fit` runs on the host (it checks concrete data, then calls one jitted solve); the solve
    is compiled once per problem structure and reused for new data of the same shapes (an
    `observe` function re-created for every call, such as a `lambda` in a loop, is compared by
    its code and captured values, so it does not recompile).

    ```python
    result = sciax.fit(DampedDrivenOscillator(omega=1.5, zeta=0.3), y0, times, xs,
                       params=("omega", "zeta"), observe=lambda y: y[0], sigma=0.05,
                       transforms={"omega": Positive(), "zeta": Bounded(0.0, 1.0)},
                       rollout=Simulate(RK4(), dt=0.01))
    print(result.summary())
    ```
    """
    refuse_tracers("fit", "it checks the data, then compiles and runs its own solve, and returns NumPy "
                   "statistics. To fit many data sets, loop over them (the solve is compiled once per problem "
                   "structure).", system=system, state0=state0, times=times, observed=observed, sigma=sigma,
                   mask=mask, t0=t0, args=args, observe=observe, rollout=rollout, transforms=transforms,
                   shooting=shooting, solver=solver, rtol=rtol, atol=atol)
    problem, segment_states, segment_times, sigma_given, dtype = _build_problem(
        system, state0, times, observed, params, rollout, transforms, fit_initial_state, observe,
        sigma, mask, t0, args, shooting,
    )
    optimiser, options, mode, covariance_mode = choose_solver(solver, jacobian, rtol, atol, dtype, problem)
    if isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)) or max_steps < 1:
        raise ValueError(f"fit: `max_steps` must be a positive int, got {max_steps!r}.")
    if scale_covariance is not None and not isinstance(scale_covariance, bool | np.bool_):
        raise TypeError(f"fit: `scale_covariance` must be True, False or None (the default), got "
                        f"{describe(scale_covariance)}.")
    if not isinstance(throw, bool | np.bool_):
        raise TypeError(f"fit: `throw` must be True or False, got {describe(throw)}.")
    if not isinstance(compilation, str):
        raise TypeError(f"fit: `compilation` must be 'auto', 'optimised' or 'fast', got {describe(compilation)}.")
    if compilation not in COMPILATIONS:
        raise ValueError(f"fit: `compilation` must be 'auto', 'optimised' or 'fast', got {compilation!r}.")
    rollout.check_jacobian(mode)
    scale = (not sigma_given) if scale_covariance is None else bool(scale_covariance)
    solve_problem = eqx.tree_at(lambda p: p.rollout, problem, rollout.for_jacobian(mode))
    compilation = resolve_compilation(compilation, solve_problem, segment_states, optimiser, mode, int(max_steps))
    out = solve(solve_problem, segment_states, optimiser, options, int(max_steps), mode, compilation=compilation)
    # The covariance's Jacobian (when the solver did not leave one) in its own mode: BFGS may take
    # its gradient backward while J, with fewer unknowns than residuals, is cheaper forward.
    problem = eqx.tree_at(lambda p: p.rollout, problem, rollout.for_jacobian(covariance_mode))
    result = package(problem, segment_states, segment_times, out, covariance_mode, scale, compilation)
    if throw and not result.converged:
        raise FitError(
            f"fit did not converge after {result.n_steps} steps: {result.message} (loss ½Σr² = "
            f"{float(result.loss):.6g}). Try a closer initial guess, transforms that keep the "
            "parameters in their physical range, a larger max_steps, or MultipleShooting for long "
            "or chaotic series; pass throw=False to inspect the result.",
            result=result,
        )
    return result


# ---------------------------------------------------------------------------------------------
# Building the problem
# ---------------------------------------------------------------------------------------------


def _build_problem(system, state0, times, observed, params, rollout, transforms, fit_initial_state,
                   observe, sigma, mask, t0, args, shooting):
    if not isinstance(system, AbstractODE):
        raise TypeError(f"fit: `system` must be a sciax system (AbstractODE), got {type(system).__name__}.")
    system.check_state(state0)
    dtype = state_dtype(state0)
    check_precision(system, dtype, "fit")  # one precision: the state's (no silent downcast)
    if not isinstance(rollout, AbstractRollout):
        raise TypeError(
            "fit: `rollout` must say how to integrate: Simulate(integrator, dt) or Solve(...), "
            f"got {describe(rollout)}."
        )
    rollout.check_for_fit()
    if shooting is None:
        shooting = MultipleShooting(1)
    if not isinstance(shooting, MultipleShooting):
        raise TypeError(f"fit: `shooting` must be None or MultipleShooting(...), got {describe(shooting)}.")
    if observe is not None and not callable(observe):
        raise TypeError(f"fit: `observe` must be a function observe(state), got {describe(observe)}.")

    # Unknowns.
    leaf_index, names, groups = resolve_params(system, params, transforms)
    layout = state_layout(state0)
    state_index = resolve_state_mask(fit_initial_state, state0, layout)
    per_leaf, state_transform = resolve_transforms(transforms, names, groups, state_index.size > 0)
    if state_transform.fixed:  # transforms={"state0": Fixed()}: held at the value given
        state_index = state_index[:0]
    leaves = jtu.tree_leaves(system)
    values = tuple(to_device(leaves[i], dtype) for i in leaf_index)
    blocks, start = [], 0
    for name, transform, value in zip(names, per_leaf, values):
        transform.check(name, np.asarray(value))
        block = Block(name, tuple(value.shape), transform, -1 if transform.fixed else start)
        start += 0 if transform.fixed else block.size
        blocks.append(block)
    state_block = None
    if state_index.size:
        flat0 = np.asarray(layout.flatten(state0))
        state_transform.check("state0", flat0[state_index])
        state_block = Block("state0", (int(state_index.size),), state_transform, start)
        start += state_block.size
    n_interest = start
    if n_interest == 0:
        raise ValueError(
            "fit: nothing to fit: every selected parameter is Fixed() and no initial-state entry is fitted."
        )

    # Data.
    times, t0, eps = check_times(times, t0)
    rollout.check_times(t0, times, eps)
    observe_fn = identity if observe is None else by_code(observe)  # a new lambda: no recompile
    try:
        expected = jax.eval_shape(observe_fn, state0)
    except Exception as err:
        raise TypeError(f"fit: `observe(state0)` failed: {type(err).__name__}: {err}") from err
    obs_leaves, obs_def, missing = check_observed(observed, times.size, expected, dtype)
    mask_leaves, sigma_leaves, _ = check_mask_sigma(obs_leaves, obs_def, times, mask, sigma, missing)
    keep_flags = np.concatenate([m.ravel() for m in mask_leaves])
    keep = to_device(np.flatnonzero(keep_flags), np.int32)
    observed_filled = tuple(to_device(np.where(m, x, 0), dtype) for x, m in zip(obs_leaves, mask_leaves))
    inv_sigma = tuple(to_device(1.0 / s if sigma_leaves is not None else np.ones(x.shape), dtype)
                      for x, s in zip(obs_leaves, sigma_leaves or [None] * len(obs_leaves)))

    # Segments.
    m = shooting.n_segments
    bounds = segment_bounds(times.size, m)
    starts = np.array([t0] + [times[b] for b in bounds[1:-1]])
    save_times, obs_segment, obs_position, end_position = [], [], [], []
    for j in range(m):
        seg = times[bounds[j]:bounds[j + 1]]
        obs_segment += [j] * seg.size
        obs_position += list(range(seg.size))
        if j < m - 1:
            seg = np.append(seg, times[bounds[j + 1]])
            end_position.append(seg.size - 1)
        save_times.append(seg)
    plan = rollout.plan(starts, save_times, dtype)

    problem = Problem(
        system=system,
        state0=jtu.tree_map(lambda x: to_device(x, dtype), state0),
        param_values=values,
        observed=observed_filled,
        inv_sigma=inv_sigma,
        keep=keep,
        plan=plan,
        obs_segment=to_device(obs_segment, np.int32),
        obs_position=to_device(obs_position, np.int32),
        end_position=to_device(end_position, np.int32),
        continuity_weight=to_device(shooting.continuity_weight, dtype),
        state_index=to_device(state_index, np.int32),
        rollout=rollout,
        blocks=tuple(blocks),
        state_block=state_block,
        leaf_index=tuple(leaf_index),
        layout=layout,
        observe=observe_fn,
        obs_treedef=obs_def,
        n_segments=m,
        n_unknowns=n_interest + (m - 1) * layout.size,
        n_interest=n_interest,
        dtype=np.dtype(dtype),
        args=args,
    )
    segment_states = initial_segment_states(problem, shooting, observe is None, obs_leaves, mask_leaves,
                                             bounds, starts, dtype)
    # The start times are kept out of the problem, whose non-array fields key the compiled solve:
    # a new first time (or segment boundary) must not recompile it. They are read on the host only.
    return problem, segment_states, tuple(float(t) for t in starts), sigma_leaves is not None, dtype
