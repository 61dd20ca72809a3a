"""Optimistix's solvers, stopping also when the steps vanish: those `fit` builds from a name,
and `equilibrium`'s BFGS.

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

So these solvers also stop when a step is rejected that was already within the tolerance on y,
|Δy|/(atol + rtol·|y|) < 1 in the solver's norm: the last accepted point is then known to the
resolution asked for, as MINPACK's `xtol` test (the trust radius below xtol·|x|, rejected steps
included) and hence SciPy's `least_squares(method="lm")` decide. A solver instance passed to
`fit` is used as given.
"""

import equinox as eqx
import jax.numpy as jnp
import jax.tree_util as jtu
import optimistix as optx


class _StopWhenStepsVanish(eqx.Module):
    """Mixin for an Optimistix solver whose state has `y_eval` (the point just evaluated, which
    the step accepts or rejects), `num_accepted_steps`, `first_step` and `terminate`."""

    def step(self, fn, y, args, options, state, tags):
        y_next, next_state, aux = super().step(fn, y, args, options, state, tags)
        rejected = (next_state.num_accepted_steps == state.num_accepted_steps) & ~state.first_step
        ratios = jtu.tree_map(lambda yi, ei: jnp.abs(ei - yi) / (self.atol + self.rtol * jnp.abs(yi)),
                              y, state.y_eval)
        vanished = self.norm(ratios) < 1  # NaN (zero tolerances) is False: never stop on it
        terminate = next_state.terminate | (rejected & vanished)
        return y_next, eqx.tree_at(lambda s: s.terminate, next_state, terminate), aux


class LevenbergMarquardt(_StopWhenStepsVanish, optx.LevenbergMarquardt):
    """`optx.LevenbergMarquardt` that also stops when a rejected step is within tolerance."""

    __init__ = optx.LevenbergMarquardt.__init__


class GaussNewton(_StopWhenStepsVanish, optx.GaussNewton):
    """`optx.GaussNewton` (every step is accepted, so only Optimistix's own test stops it)."""

    __init__ = optx.GaussNewton.__init__


class BFGS(_StopWhenStepsVanish, optx.BFGS):
    """`optx.BFGS` that also stops when a step the line search rejects is within tolerance."""

    __init__ = optx.BFGS.__init__


BY_NAME = {"levenberg_marquardt": LevenbergMarquardt, "gauss_newton": GaussNewton, "bfgs": BFGS}
