"""The jitted solve: Optimistix on the residuals, then the Gauss–Newton covariance at the
optimum, packaged as a `FitResult`."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx

from .._validation import describe
from ._problem import forward_residual_function, residual_function
from ._result import FitResult
from ._unknowns import entry_labels

_SOLVERS = {
    "levenberg_marquardt": optx.LevenbergMarquardt,
    "gauss_newton": optx.GaussNewton,
    "bfgs": optx.BFGS,
}
_JACOBIAN = {"auto": "auto", "forward": "fwd", "fwd": "fwd", "reverse": "bwd", "bwd": "bwd"}


def choose_solver(solver, jacobian, rtol, atol, dtype, problem):
    if not isinstance(jacobian, str) or jacobian.lower() not in _JACOBIAN:
        raise ValueError(f"fit: `jacobian` must be 'auto', 'forward' or 'reverse', got {jacobian!r}.")
    mode = _JACOBIAN[jacobian.lower()]
    if mode == "auto":
        n_residuals = problem.n_data + (problem.n_segments - 1) * problem.layout.size
        mode = "fwd" if problem.n_unknowns <= n_residuals else "bwd"
    given_tolerances = rtol is not None or atol is not None
    default_tol = 1e-8 if jnp.finfo(dtype).bits >= 64 else 1e-5
    rtol = default_tol if rtol is None else float(rtol)
    atol = default_tol if atol is None else float(atol)
    if not (rtol >= 0 and atol >= 0):
        raise ValueError(f"fit: `rtol` and `atol` must be non-negative, got rtol={rtol!r}, atol={atol!r}.")
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
    if isinstance(solver, optx.AbstractMinimiser):
        options = {"autodiff_mode": mode}
    else:
        options = {"jac": mode}
    return solver, options, mode


def initial_unconstrained(problem, segment_states):
    return problem.to_unconstrained(problem.initial_physical(segment_states)).astype(problem.optimiser_dtype)


@eqx.filter_jit
def _initial_residuals_finite(problem, segment_states):
    return jnp.all(jnp.isfinite(problem.residuals_unconstrained(initial_unconstrained(problem, segment_states))))


@eqx.filter_jit
def solve(problem, segment_states, solver, options, max_steps, mode, scale_covariance):
    """Solve, then linearise at the optimum and assemble every array of the result (one compile)."""
    u0 = initial_unconstrained(problem, segment_states)
    fn = forward_residual_function if mode == "fwd" else residual_function
    sol = optx.least_squares(fn, solver, u0, args=problem, options=options,
                             max_steps=max_steps, throw=False)
    u = sol.value
    v = problem.to_physical(u).astype(problem.dtype)
    scale = jax.jvp(problem.to_physical, (u,), (jnp.ones_like(u),))[1].astype(problem.dtype)
    # One rollout gives both the residuals and their Jacobian (the primal is the aux output).
    jacobian = jax.jacfwd if mode == "fwd" else jax.jacrev
    jac, r = jacobian(lambda x: (problem.residuals_physical(x),) * 2, has_aux=True)(v)

    # Gauss–Newton covariance from the SVD of J: (JᵀJ)⁻¹ = V S⁻² Vᵀ (no squared condition number).
    _, s, vt = jnp.linalg.svd(jac, full_matrices=False)
    rank_ok = s > s[0] * max(jac.shape) * jnp.finfo(jac.dtype).eps
    inverse = jnp.where(rank_ok, 1 / jnp.where(rank_ok, s, 1) ** 2, jnp.nan)
    q, n_data = problem.n_interest, problem.n_data
    cov_unscaled = ((vt.T * inverse) @ vt)[:q, :q]
    n_total, p_total = r.shape[0], problem.n_unknowns
    sum_sq = jnp.sum(r**2)
    residual_variance = sum_sq / (n_total - p_total) if n_total > p_total else jnp.full((), jnp.nan, r.dtype)
    cov = cov_unscaled * jnp.where(scale_covariance, residual_variance, 1.0)
    se_flat = jnp.sqrt(jnp.diag(cov))
    d = jnp.sqrt(jnp.diag(cov_unscaled))
    correlation = cov_unscaled / jnp.outer(d, d)

    system, flat0, segments = problem.values(v)
    params, errors = {}, {}
    for b, value in zip(problem.blocks, problem.param_values):
        if b.fixed:
            params[b.name], errors[b.name] = value, jnp.zeros_like(value)
        else:
            params[b.name] = v[b.start:b.start + b.size].reshape(b.shape)
            errors[b.name] = se_flat[b.start:b.start + b.size].reshape(b.shape)
    layout = problem.layout
    state0_se = None
    if problem.state_block is not None:
        sb = problem.state_block
        se0 = jnp.zeros(layout.size, v.dtype).at[problem.state_index].set(se_flat[sb.start:sb.start + sb.size])
        state0_se = layout.unflatten(se0)
    return {
        "params": params, "errors": errors, "system": system, "state0": layout.unflatten(flat0),
        "state0_se": state0_se,
        "loss": 0.5 * sum_sq, "residuals": r[:n_data],
        "continuity": r[n_data:].reshape(problem.n_segments - 1, layout.size),
        "cov": cov, "correlation": correlation, "residual_variance": residual_variance,
        "segment_states": jax.vmap(layout.unflatten)(jnp.concatenate([flat0[None], segments])),
        "v": v, "scale": scale, "success": sol.result == optx.RESULTS.successful, "result": sol.result,
        "n_steps": sol.stats["num_steps"],
        "final_finite": jnp.all(jnp.isfinite(r)), "full_rank": jnp.all(rank_ok),
    }


def _labels(problem) -> tuple[str, ...]:
    labels = []
    for b in problem.blocks:
        if not b.fixed:
            labels += entry_labels(b.name, b.shape)
    if problem.state_block is not None:
        names = problem.layout.labels("state0")
        labels += [names[i] for i in np.asarray(problem.state_index)]
    return tuple(labels)


def package(problem, segment_states, out) -> FitResult:
    converged = bool(out["success"])
    message = optx.RESULTS[out["result"]]
    # The initial residuals are only looked at to explain a failure (a separate, small compile
    # on that path keeps them out of the solve every successful fit compiles).
    failed = not (converged and bool(out["final_finite"]))
    if failed and not bool(_initial_residuals_finite(problem, segment_states)):
        converged = False
        message = ("the residuals are not finite (NaN/Inf) at the initial guess: the model blew up; "
                   "start closer, shorten the step, or use transforms. " + message).strip()
    elif not bool(out["final_finite"]):
        converged = False
        message = ("the residuals at the returned point are not finite (NaN/Inf). " + message).strip()
    elif converged and not bool(out["full_rank"]):
        message = ("converged, but the Jacobian is rank-deficient at the optimum: some fitted values "
                   "are not identifiable from these data, and their covariance is NaN.")
    return FitResult(
        params=out["params"],
        standard_errors=out["errors"],
        system=out["system"],
        state0=out["state0"],
        state0_standard_errors=out["state0_se"],
        loss=out["loss"],
        residuals=out["residuals"],
        continuity_residuals=out["continuity"],
        covariance=out["cov"],
        correlation=out["correlation"],
        residual_variance=out["residual_variance"],
        labels=_labels(problem),
        n_observations=problem.n_data,
        n_parameters=problem.n_interest,
        n_steps=int(out["n_steps"]),
        converged=converged,
        message=message,
        segment_times=problem.segment_times,
        segment_states=out["segment_states"],
        problem=problem,
        optimum=out["v"],
        scale=out["scale"],
    )
