"""Drift of a conserved quantity over saved frames, as written to `summary.json` and plotted.

The error of frame k is |q_k − q_0| (Euclidean norm for vector quantities), relative to |q_0|
unless q_0 is zero up to rounding (|q_0| ≤ 1000 ulp of 1 in its dtype, e.g. the energy of a
double pendulum started with horizontal arms), where a relative error means nothing and the
absolute error is used instead.
"""

import numpy as np


def drift_errors(values) -> tuple[np.ndarray, float | None]:
    """`(errors, scale)`: per-frame error, divided by `scale = |q_0|` unless `scale` is `None`
    (q_0 is zero up to rounding: the errors are absolute)."""
    values = np.asarray(values)
    tiny = 1e3 * float(np.finfo(values.dtype).eps) if np.issubdtype(values.dtype, np.floating) else 0.0
    v = values.reshape(values.shape[0], -1).astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # a run that blew up may overflow here
        scale = float(np.linalg.norm(v[0]))
        err = np.linalg.norm(v - v[0], axis=1)
        if scale > tiny:
            return err / scale, scale
    return err, None


def drift_summary(values) -> dict:
    """Initial and final value, final and maximum error of a conserved quantity over the frames."""
    values = np.asarray(values)
    err, scale = drift_errors(values)
    with np.errstate(over="ignore", invalid="ignore"):
        abs_err = err * scale if scale is not None else err
    q0, q1 = values[0], values[-1]
    return {
        "initial": q0.tolist(),
        "final": q1.tolist(),
        "final_abs_drift": float(abs_err[-1]),
        "max_abs_error": float(np.max(abs_err)),
        "final_relative_drift": float(err[-1]) if scale is not None else None,
        "max_relative_error": float(np.max(err)) if scale is not None else None,
        "relative_to": "|initial value|" if scale is not None else
                       "none: the initial value is zero up to rounding, see max_abs_error",
    }
