"""Fitting parameters of sciax systems to data (`sciax.fit`), with transforms, uncertainties,
multiple shooting and a plot helper."""

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
