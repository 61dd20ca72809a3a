"""`FitResult`, the answer of `fit`, and `FitError`, raised when a fit does not converge."""

import equinox as eqx
import jax
import numpy as np


class FitError(RuntimeError):
    """A fit did not converge (or produced non-finite residuals). The message carries the
    solver's own message; `result` holds the unconverged `FitResult` for inspection."""

    def __init__(self, message: str, result=None):
        super().__init__(message)
        self.result = result


_MAX_LISTED = 12  # correlations in summary()


class FitResult(eqx.Module):
    """What `sciax.fit` found.

    **Fields:**

    - `params`: dict name -> fitted value (physical units, the field's shape). Fields held by
      `Fixed()` keep their initial value.
    - `standard_errors`: dict name -> standard error, same shapes (0 for `Fixed()` values).
    - `system`: the system with the fitted parameters in place.
    - `state0`: the fitted initial state (the given one where not fitted); with multiple
      shooting, the first segment's start state.
    - `state0_standard_errors`: standard errors of `state0`, same structure (0 where not
      fitted), or `None` when no initial-state entry was fitted.
    - `loss`: the minimised objective ½ Σ rᵢ² over all residuals (data and, with multiple
      shooting, continuity). What other tools report is `chi_square` (below), Σ rᵢ² over the
      data residuals alone.
    - `residuals`: the data residuals (model − observed)/sigma (sigma = 1 when not given) over
      the observed (unmasked) entries: leaf by leaf of the `observe` output (one leaf for an
      array output), each flattened in time-major order.
    - `continuity_residuals`: `continuity_weight · (segment end − next segment start)`, shape
      `(n_segments − 1, state size)` (empty for single shooting).
    - `covariance`: `(p, p)` Gauss–Newton covariance of the fitted values in `labels` order,
      physical units: `(JᵀJ)⁻¹ · s²` with `J` the Jacobian of all residuals with respect to
      the physical values at the optimum. `s² = Σ r² / (n − p)` (the residual variance) when
      `sigma` was not given; `s² = 1` when it was (sigma taken as the true absolute errors).
      Multiple-shooting segment states are nuisance parameters: this is the marginal block of
      the full covariance. Values the data do not determine (a rank-deficient `J`) have NaN
      rows and columns, and are listed in `unidentifiable`; the others' covariance is that of the
      pseudo-inverse of `JᵀJ` (the identifiable subspace).
    - `standard_errors` / `correlation`: √diag(covariance) and covariance / (σᵢ σⱼ).
    - `labels`: name of each row of `covariance`, e.g. `"omega"`, `"stiffness[2]"`, `"state0[1]"`.
    - `unidentifiable`: labels of the fitted values the data do not determine (standard error NaN).
    - `residual_variance`: s² as defined above (computed in both cases).
    - `n_observations`, `n_parameters`: counts of data residuals and of fitted values
      (segment states excluded).
    - `n_steps`: optimiser steps taken. `converged`: the solver reported success and every
      residual is finite. `message`: the solver's own message (Optimistix `RESULTS`), empty
      on success, or what limits the result (non-identifiable values, values at a bound).
    - `at_bounds`: labels of the fitted values within one standard error of a bound of their
      `Bounded` transform: the best fit may lie on or beyond it (an optimum outside the bounds
      ends on them), and their standard errors are not confidence intervals there (compare
      SciPy's `active_mask`).
    - `compilation`: how the solve was compiled, `"optimised"` or `"fast"` (what `fit`'s
      `compilation="auto"` chose; always `"optimised"` off a CPU). The two can differ in the
      last digits, within the solver's tolerance.
    - `segment_times`, `segment_states`: start time and fitted start state of every shooting
      segment (one segment for single shooting).

    The statistics (`params`, `standard_errors`, `loss`, residuals, `covariance`, …) are NumPy
    arrays in the state's dtype, computed on the host; `system`, `state0` and `segment_states`
    are JAX pytrees.
    """

    params: dict
    standard_errors: dict
    system: eqx.Module
    state0: object
    state0_standard_errors: object
    loss: np.ndarray
    residuals: np.ndarray
    continuity_residuals: np.ndarray
    covariance: np.ndarray
    correlation: np.ndarray
    residual_variance: np.ndarray
    labels: tuple[str, ...] = eqx.field(static=True)
    n_observations: int = eqx.field(static=True)
    n_parameters: int = eqx.field(static=True)
    n_steps: int = eqx.field(static=True)
    converged: bool = eqx.field(static=True)
    message: str = eqx.field(static=True)
    segment_times: tuple[float, ...] = eqx.field(static=True)
    at_bounds: tuple[str, ...] = eqx.field(static=True, default=())
    unidentifiable: tuple[str, ...] = eqx.field(static=True, default=())
    compilation: str = eqx.field(static=True, default="optimised")
    segment_states: object = None
    # What `plot_fit` needs to re-run the model with sampled parameters.
    problem: eqx.Module | None = None
    optimum: jax.Array | None = None  # physical vector of all unknowns
    scale: jax.Array | None = None  # dv/du at the optimum (the transforms' derivatives)

    @property
    def chi_square(self) -> float:
        """Σ rᵢ² over the data residuals: χ² = Σ ((model − observed)/σ)² when `sigma` was given,
        the sum of squared errors Σ (model − observed)² when it was not. (`loss` is ½ Σ rᵢ² and
        includes multiple shooting's continuity residuals.)"""
        return float(np.sum(np.asarray(self.residuals, dtype=np.float64) ** 2))

    @property
    def sigma_given(self) -> bool | None:
        """Whether the residuals were divided by a `sigma` other than 1 (None if unknown)."""
        if self.problem is None:
            return None
        return any(bool(np.any(np.asarray(w) != 1)) for w in self.problem.inv_sigma)

    def summary(self, min_correlation: float = 0.1) -> str:
        """The fit's status, the loss and χ² (the sum of squared errors without `sigma`) with
        χ²/(n − p), the fitted values ± standard errors, the values the data do not determine, and
        the correlations C(a, b) with |C| ≥ `min_correlation`, strongest first (all of them:
        `correlation`)."""
        status = f"converged: {self.converged}" + (f" ({self.message})" if self.message else "")
        name = {True: "χ²", False: "SSE (no sigma)", None: "Σr² (data)"}[self.sigma_given]
        dof = self.n_observations - self.n_parameters
        reduced = f" ({self.chi_square / dof:.4g} per degree of freedom)" if dof > 0 else ""
        counts = (f"steps: {self.n_steps}   loss ½Σr²: {float(self.loss):.6g}   "
                  f"{name}: {self.chi_square:.6g}{reduced}   n = {self.n_observations}, p = {self.n_parameters}")
        lines = [status, counts]
        width = max((len(n) for n in self.labels), default=4)
        values = self._flat_values()
        errors = np.sqrt(np.diag(np.asarray(self.covariance)))
        for name, value, error in zip(self.labels, values, errors):
            near = "   (near a bound)" if name in self.at_bounds else ""
            lines.append(f"  {name:<{width}}  {value: .6g} ± {error:.3g}{near}")
        if self.unidentifiable:
            lines.append(f"not identifiable from these data: {', '.join(self.unidentifiable)}")
        q = len(self.labels)
        if q > 1:
            corr = np.asarray(self.correlation)
            pairs = sorted(((corr[i, j], self.labels[i], self.labels[j]) for i in range(q) for j in range(i)
                            if not abs(corr[i, j]) < min_correlation), key=lambda c: -abs(c[0]))
            lines.append(f"correlations (|C| ≥ {min_correlation:g}):" + ("" if pairs else " none"))
            lines += [f"  C({b}, {a}) = {c: .3f}" for c, a, b in pairs[:_MAX_LISTED]]
            if len(pairs) > _MAX_LISTED:
                lines.append(f"  … and {len(pairs) - _MAX_LISTED} more (all of them: .correlation)")
        return "\n".join(lines)

    def _flat_values(self):
        v = np.asarray(self.optimum)
        return v[: len(self.labels)]

    def __str__(self) -> str:
        return self.summary()
