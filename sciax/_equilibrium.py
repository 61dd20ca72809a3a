"""`equilibrium`: mechanical equilibria of particle systems, differentiable by the implicit
function theorem (Optimistix's `ImplicitAdjoint`), never by backpropagating through iterations."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx

from ._errors import StateMismatchError
from ._optimistix_solvers import BFGS
from ._validation import (
    check_finite_state,
    check_precision,
    check_tolerances,
    describe,
    positive_int,
    state_dtype,
)
from .systems._base import AbstractHamiltonian


class Equilibrium(eqx.Module):
    """Result of `equilibrium`.

    - `positions`: equilibrium positions, same shape as `positions0` (length units).
    - `energy`: total energy U(q*) − f·q* at the equilibrium (energy units).
    - `n_steps`: BFGS iterations plus Newton iterations.
    - `converged`: BFGS met its tolerance, and Newton then converged or its last step was below
      the tolerance (settled at round-off).
    """

    positions: jax.Array
    energy: jax.Array
    n_steps: jax.Array
    converged: jax.Array


def equilibrium(
    system: AbstractHamiltonian,
    positions0,
    *,
    external_force=None,
    fixed=None,
    rtol: float | None = None,
    atol: float | None = None,
    max_steps: int = 10_000,
    throw: bool = True,
) -> Equilibrium:
    """Positions q* minimising E(q) = U(q) − Σ f·q, with some coordinates held fixed.

    At q* the net force vanishes on every free coordinate: −∂U/∂q + f = 0. Derivatives of q*
    with respect to the system's parameters, the load f or `positions0` follow from the implicit
    function theorem, dq*/dθ = −H⁻¹ ∂²E/∂q∂θ with H the Hessian of E at q*: one linear solve,
    whatever the number of minimiser iterations (Optimistix's `ImplicitAdjoint`).

    **Arguments:**

    - `system`: an `AbstractHamiltonian` particle system (its `potential_energy` is used).
    - `positions0`: starting positions, shape `masses.shape + (d,)` (length units).
    - `external_force`: load f, same shape as the positions (force units), default zero.
    - `fixed`: bool array like the positions; `True` holds that coordinate at its value in
      `positions0` (supports, clamps). The free coordinates must have a unique minimum: a free
      chain or network with nothing fixed can translate and rotate, and its Hessian is singular.
    - `rtol`, `atol`, `max_steps`: tolerances (finite, ≥ 0, not both 0) and iteration limit (a
      positive int) of the BFGS minimisation (default 1e-10 in float64, 1e-5 in float32); the
      result is then polished by Newton's method on ∇E = 0 (dense Hessian: meant for systems of
      up to a few thousand coordinates), which stops when its steps stop contracting at
      round-off (Optimistix's Kantorovich criterion; a fixed absolute bound on |∇E| cannot be
      met when stiff springs make the round-off in ∇E ~ k |q| ε larger than it).
    - `throw`: `True` or `False`: raise if the minimiser does not converge (else check `converged`).

    **Returns:** an `Equilibrium`.

    **Raises:** `TypeError` for a system that is not a particle system, or a `max_steps`,
    `rtol`, `atol` or `throw` of the wrong type; `ValueError` for shapes that do not match,
    NaN or Inf in `positions0` or `external_force`, `max_steps` < 1, and tolerances that are
    negative, non-finite or both zero (checked when known on the host, not when traced);
    Optimistix's error when `throw=True` and the minimiser fails.
    """
    if not isinstance(system, AbstractHamiltonian):
        raise TypeError(f"equilibrium: `system` must be an AbstractHamiltonian particle system, "
                        f"got {type(system).__name__}.")
    max_steps = positive_int("max_steps", max_steps, "equilibrium")
    check_tolerances("equilibrium", rtol, atol)
    if not isinstance(throw, bool | np.bool_):
        raise TypeError(f"equilibrium: `throw` must be True or False, got {describe(throw)}.")
    throw = bool(throw)
    positions0 = jnp.asarray(positions0)
    try:
        dtype = state_dtype(positions0)
    except StateMismatchError as err:
        raise StateMismatchError(f"equilibrium: `positions0`: {err}") from None
    check_precision(system, dtype, "equilibrium")
    check_precision(external_force, dtype, "equilibrium", what="`external_force`")
    expected = jnp.shape(system.masses)
    if positions0.ndim == 0 or positions0.shape[:-1] != expected:
        raise ValueError(f"equilibrium: `positions0` must have shape masses.shape + (d,) = {expected} + (d,), "
                         f"got {describe(positions0)}.")
    check_finite_state("equilibrium", "positions0", positions0)
    force = jnp.zeros_like(positions0) if external_force is None else jnp.asarray(external_force, dtype)
    if force.shape != positions0.shape:
        raise ValueError(f"equilibrium: `external_force` must have the shape of the positions {positions0.shape}, "
                         f"got {describe(force)}.")
    check_finite_state("equilibrium", "external_force", force, need="the load must be finite")  # after the cast
    held = jnp.zeros(positions0.shape, bool) if fixed is None else jnp.asarray(fixed)
    if held.shape != positions0.shape or held.dtype != bool:
        raise ValueError(f"equilibrium: `fixed` must be a bool array of shape {positions0.shape}, "
                         f"got {describe(held)}.")

    default_tol = 1e-10 if jnp.finfo(dtype).bits >= 64 else 1e-5
    rtol = default_tol if rtol is None else rtol
    atol = default_tol if atol is None else atol
    return _find_equilibrium(system, positions0, force, held, rtol, atol, max_steps, throw)


def _total_energy(y, args):
    """E(y) = U(q) − Σ f·q with q = y on the free coordinates and the anchor on the held ones,
    plus ½ Σ_held (y − anchor)²: the penalty gives the held coordinates an identity Hessian block
    (their optimum is the anchor), so the implicit-function linear solve stays well posed."""
    system, force, anchor, held = args
    q = jnp.where(held, anchor, y)
    penalty = 0.5 * jnp.sum(jnp.where(held, (y - anchor) ** 2, 0.0))
    return system.potential_energy(q) - jnp.sum(force * q) + penalty


# Compiled once per structure (system type, shapes, dtypes, tolerances, flags): called eagerly,
# Optimistix's loops were traced and compiled anew at every call (3.6 s each for a 5-mass chain).
@eqx.filter_jit
def _find_equilibrium(system, positions0, force, held, rtol, atol, max_steps, throw) -> Equilibrium:
    args = (system, force, positions0, held)
    # BFGS finds the basin; its stopping rule leaves ~1e-9 relative error in the positions
    # (measured on a loaded spring chain, independent of rtol/atol). Newton's method on the
    # stationarity condition ∇E = 0 then converges quadratically to round-off. Gradients come from
    # the implicit function theorem at that root (ImplicitAdjoint); the BFGS start does not need
    # any, since the root does not depend on where Newton started. (`BFGS` also stops on a rejected
    # step within tolerance whose predicted energy change is round-off, where Optimistix's would
    # go on shrinking it: `_optimistix_solvers.py`.)
    start = optx.minimise(_total_energy, BFGS(rtol=rtol, atol=atol), jax.lax.stop_gradient(positions0),
                          args=jax.lax.stop_gradient(args), max_steps=max_steps, throw=throw)
    stationary = jax.grad(_total_energy)
    newton = optx.Newton(rtol=rtol, atol=atol * 1e-3, cauchy_termination=False)
    solution = optx.root_find(stationary, newton, start.value, args=args, max_steps=50, throw=False)
    # From a BFGS start Newton's steps may be round-off from the first one, and the Kantorovich
    # rule can then read that noise as "diverged". A last step below the tolerance (Optimistix's
    # scaled step size < 1: |Δq| < rtol·|q| + atol) means q* is settled all the same.
    settled = jnp.isfinite(solution.state.diffsize) & (solution.state.diffsize < 1)
    converged = (start.result == optx.RESULTS.successful) & (
        (solution.result == optx.RESULTS.successful) | settled)
    # Where Newton failed (a singular Hessian makes its steps NaN) the BFGS minimum is returned,
    # with converged=False, so that throw=False leaves something to inspect.
    newton_finite = jnp.all(jnp.isfinite(solution.value))
    q = jnp.where(held, positions0, jnp.where(newton_finite, solution.value, start.value))
    if throw:
        q = eqx.error_if(q, ~converged, "equilibrium: Newton's method on ∇E = 0 did not converge from the "
                                        "BFGS minimum (a singular Hessian does this: a chain or network with "
                                        "nothing `fixed` can translate and rotate); pass throw=False to inspect "
                                        "the result.")
    return Equilibrium(
        positions=q,
        energy=system.potential_energy(q) - jnp.sum(force * q),
        n_steps=start.stats["num_steps"] + solution.stats["num_steps"],
        converged=converged,
    )

