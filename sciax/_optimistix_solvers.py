"""Optimistix's solvers, stopping also on a rejected step settled by round-off: those `fit` builds
from a name, and `equilibrium`'s BFGS.

Optimistix tests its tolerances only after an *accepted* step: on y (the step |Δy| < atol +
rtol·|y|) and on the residuals or loss. Near an optimum whose loss is not zero (noisy data),
steps of the size `rtol` asks for change the loss by about as much as its round-off: with
(ω, ζ) ≈ (2, 0.1), 200 points and noise 0.05, a step of 2·10⁻¹⁰ changes ½Σr² ≈ 0.25 by
~5·10⁻¹⁷. Levenberg–Marquardt's trust region (or BFGS's line search) may then reject every step
and shrink it without testing again. Under jax 0.10.0 the compiled solve even gave the loss at
one point two values 4 ulp apart (the stored one and the one recomputed when the step had shrunk
to 10⁻²⁸, so that y + Δy = y), and rejected the unchanged point too: 10 of 60 noisy
damped-oscillator fits with rtol = atol = 10⁻¹⁰ ran to `max_steps` at the optimum and were
reported as not converged.

So these solvers also stop on a rejected step when both
- the step was within the tolerance on y: |Δy|/(atol + rtol·|y|) < 1 in the solver's norm, and
- the solver's own model predicted a change of the loss within its round-off:
  |∇Lᵀ Δy| ≤ 64·√m·ε·|L| (L the loss, m the number of residuals, 1 for a minimiser).
The last accepted point is then settled to the resolution asked for, and the rejection says
only that the loss cannot resolve smaller steps. The first condition alone is MINPACK's `xtol`
idea (a trust region shrunk below the tolerance; SciPy's `least_squares(method="lm")`), but is
not enough for a line search: BFGS's first steps are limited by the stiffest direction, so on
½(10¹²a² + b²) from (2·10⁻¹¹, 1) every rejected step is within 10⁻¹⁰ while b is still 1; the
second condition (there ∇LᵀΔy ~ 10⁻⁹ ≫ 10⁻¹⁶) keeps the solver going, to (0, 0). A rejection
the model did not predict (a wrong Jacobian, a kink) never stops it early. A solver instance
passed to `fit` is used as given.
"""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import optimistix as optx

_ROUND_OFF_ULPS = 64  # ×√m: the summation error of a loss over m terms grows like √m ulp
_STATE_FIELDS = ("y_eval", "num_accepted_steps", "first_step", "terminate", "f_info")  # Optimistix 0.1's


class _StopAtRoundOff(eqx.Module):
    """Mixin for an Optimistix solver whose state has `y_eval` (the point just evaluated, which
    the step accepts or rejects), `num_accepted_steps`, `first_step`, `terminate` and `f_info`
    (private fields of Optimistix 0.1's Gauss–Newton and quasi-Newton states). Where a state
    lacks them, the solver runs with Optimistix's own rule only."""

    def step(self, fn, y, args, options, state, tags):
        y_next, next_state, aux = super().step(fn, y, args, options, state, tags)
        if not all(hasattr(state, name) for name in _STATE_FIELDS) or not hasattr(state.f_info, "compute_grad_dot"):
            return y_next, next_state, aux  # another Optimistix's state layout: its own rule only
        rejected = (next_state.num_accepted_steps == state.num_accepted_steps) & ~state.first_step
        step = jtu.tree_map(lambda yi, ei: ei - yi, y, state.y_eval)
        ratios = jtu.tree_map(lambda yi, si: jnp.abs(si) / (self.atol + self.rtol * jnp.abs(yi)), y, step)
        within_tolerance = self.norm(ratios) < 1  # NaN (zero tolerances) is False: never stop on it
        settled = jax.lax.cond(rejected & within_tolerance, lambda: _round_off_change(state.f_info, step),
                               lambda: jnp.array(False))  # the model evaluated only when needed
        terminate = next_state.terminate | settled
        return y_next, eqx.tree_at(lambda s: s.terminate, next_state, terminate), aux


def _round_off_change(f_info, step):
    """Whether the solver's model changes the loss L by no more than its round-off along `step`:
    |∇Lᵀ step| ≤ 64·√m·ε·|L| (for least squares ∇Lᵀ step = rᵀ J step, one Jacobian product)."""
    loss = f_info.as_min()
    residual = getattr(f_info, "residual", None)
    terms = 1 if residual is None else sum(x.size for x in jtu.tree_leaves(residual))
    bound = _ROUND_OFF_ULPS * math.sqrt(max(terms, 1)) * jnp.finfo(loss.dtype).eps * jnp.abs(loss)
    return jnp.abs(f_info.compute_grad_dot(step)) <= bound


class LevenbergMarquardt(_StopAtRoundOff, optx.LevenbergMarquardt):
    """`optx.LevenbergMarquardt` that also stops on a rejected step settled by round-off."""

    __init__ = optx.LevenbergMarquardt.__init__


class GaussNewton(_StopAtRoundOff, optx.GaussNewton):
    """`optx.GaussNewton` (every step is accepted, so only Optimistix's own test stops it)."""

    __init__ = optx.GaussNewton.__init__


class BFGS(_StopAtRoundOff, optx.BFGS):
    """`optx.BFGS` that also stops on a rejected step settled by round-off."""

    __init__ = optx.BFGS.__init__


BY_NAME = {"levenberg_marquardt": LevenbergMarquardt, "gauss_newton": GaussNewton, "bfgs": BFGS}
