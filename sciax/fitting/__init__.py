"""Fitting parameters of sciax systems to data: `fit` (also `sciax.fit`), its `FitResult` and
`FitError`, the parameter transforms (`Positive`, `Bounded`, `Fixed`, `Identity`), multiple
shooting (`MultipleShooting`) and `plot_fit`, all re-exported at the top of `sciax`."""

from ._fit import MultipleShooting as MultipleShooting, fit as fit
from ._plot import plot_fit as plot_fit
from ._result import FitError as FitError, FitResult as FitResult
from ._transforms import (
    AbstractTransform as AbstractTransform,
    Bounded as Bounded,
    Fixed as Fixed,
    Identity as Identity,
    Positive as Positive,
)
