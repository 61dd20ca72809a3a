"""Multiple shooting: segments with their own start states, joined by continuity penalties."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .._compile.host_checked import drop_host_checked
from .._rollout import Solve
from .._validation import describe, real_scalar, to_device


class MultipleShooting(eqx.Module):
    """Fit long or chaotic series by splitting the observation window into segments.

    Segment 0 starts at `t0` from the initial state (fitted or not, as `fit_initial_state`
    says); segment j ≥ 1 starts at an observation time with its own start state, fitted as a
    nuisance parameter (all state components). Segments hold about equal numbers of
    observations. The residual vector holds the data misfit of every segment and, for each
    boundary, the continuity penalty

        continuity_weight · (state at the end of segment j − start state of segment j+1)

    so a trajectory only has to be followed for one segment at a time: the optimiser can
    approach the data from a start far from the truth without the exponential sensitivity of
    one long chaotic integration (the "single shooting" failure).

    The penalty is soft: with noisy data the segments join up to a small mismatch that
    shrinks as the weight grows (the fitted `continuity_residuals` show it). The weight is in
    1/(state units) and competes with the data residuals (model − observed)/sigma: a jump of
    size g costs as much as a misfit of g·w·sigma at one observation. Weights of a few times
    1/sigma join the segments tightly; very large weights make the problem as stiff as single
    shooting again (on the Lorenz example, noise 0.5: w = 10 works, w = 100 does not).

    **Arguments:**

    - `n_segments`: number of segments, 1 ≤ n_segments ≤ number of observations.
    - `continuity_weight`: positive float (default 10).
    - `segment_states`: optional initial guesses for the start states of segments 1 … n−1:
      a pytree like the state with a leading axis of length n_segments − 1. By default the
      observations are used where `observe` is the identity and the whole state is observed at
      a segment start; elsewhere, the state of a single-shooting run with the initial
      parameters.
    """

    n_segments: int = eqx.field(static=True)
    continuity_weight: float = eqx.field(static=True)
    segment_states: object = None

    def __init__(self, n_segments: int, continuity_weight=10.0, segment_states=None):
        if isinstance(n_segments, bool) or not isinstance(n_segments, (int, np.integer)) or n_segments < 1:
            raise ValueError(f"MultipleShooting: `n_segments` must be a positive int, got {n_segments!r}.")
        w = real_scalar("continuity_weight", continuity_weight, owner="MultipleShooting")
        if not (math.isfinite(w) and w > 0):
            raise ValueError(f"MultipleShooting: `continuity_weight` must be positive and finite, got {w!r}.")
        self.n_segments = int(n_segments)
        self.continuity_weight = w
        self.segment_states = segment_states


def segment_bounds(n_times: int, n_segments: int) -> list[int]:
    """Observation index of each segment's start (segment 0 starts at t0), then n_times."""
    if n_segments > n_times:
        raise ValueError(
            f"fit: MultipleShooting({n_segments}) needs at least one observation per segment, but there "
            f"are only {n_times} observations."
        )
    return [0] + [j * n_times // n_segments for j in range(1, n_segments)] + [n_times]


def initial_segment_states(problem, shooting, identity_observe, obs_leaves, mask_leaves, bounds, starts, dtype):
    """Start guesses `(n_segments − 1, state size)` for the segments after the first: given by
    the user, else the observed state at each segment start (entries that are missing there
    come from a single-shooting run with the initial parameters), else that run."""
    m, layout = problem.n_segments, problem.layout
    if m == 1:
        return to_device(np.zeros((0, layout.size)), dtype)
    if shooting.segment_states is not None:
        given = shooting.segment_states
        try:
            flat = jax.vmap(layout.flatten)(jtu.tree_map(lambda x: jnp.asarray(x, dtype=dtype), given))
        except Exception:  # noqa: BLE001
            flat = None
        if flat is None or flat.shape != (m - 1, layout.size):
            raise ValueError(
                f"MultipleShooting: `segment_states` must be states with a leading axis of length "
                f"n_segments − 1 = {m - 1} (state leaves {layout.shapes}), got {describe(given)}."
            )
        return flat
    guess = None
    if identity_observe and problem.obs_treedef == layout.treedef and \
            tuple(x.shape[1:] for x in obs_leaves) == layout.shapes:
        rows = np.stack([np.concatenate([x[b].ravel() for x in obs_leaves]) for b in bounds[1:-1]])
        known = np.stack([np.concatenate([mk[b].ravel() for mk in mask_leaves]) for b in bounds[1:-1]])
        if known.all():
            return to_device(rows, dtype)
        guess = (rows, known)
    simulated = np.asarray(_single_shooting_states(problem, starts, dtype))
    if guess is not None:
        rows, known = guess
        simulated = np.where(known, rows, simulated)
    if not np.all(np.isfinite(simulated)):
        raise ValueError(
            "fit: the single-shooting run that provides the initial segment states became non-finite; "
            "pass MultipleShooting(..., segment_states=...) or a better initial guess."
        )
    return to_device(simulated, dtype)


def _single_shooting_states(problem, starts, dtype):
    plan = problem.rollout.plan(starts[:1], [starts[1:]], dtype)
    v = problem.initial_physical(jnp.zeros((problem.n_segments - 1, problem.layout.size), dtype))
    system, flat0, _ = problem.values(v)
    return _run_segment(problem.rollout, system, problem.layout.unflatten(flat0), plan, problem.args)


def _run_segment_states(rollout, system, state0, plan, args):
    run = eqx.filter_vmap(lambda p: rollout.run_plan(system, state0, p, args))
    states = run(plan)
    return jax.vmap(jax.vmap(lambda s: jnp.concatenate([jnp.ravel(x) for x in jtu.tree_leaves(s)])))(states)[0]


_run_segment_without_checks = drop_host_checked(_run_segment_states)


@eqx.filter_jit
def _run_segment(rollout, system, state0, plan, args):
    # A `Solve`'s checks of the times `fit` made are left out (`_compile/host_checked.py`), so that
    # JAX's persistent cache keeps this program too.
    run = _run_segment_without_checks if isinstance(rollout, Solve) else _run_segment_states
    return run(rollout, system, state0, plan, args)
