"""Fitting parameters of sciax systems to data (`sciax.fit`), with transforms, uncertainties,
multiple shooting and a plot helper."""

from ._fit import MultipleShooting as MultipleShooting
from ._fit import fit as fit
from ._plot import plot_fit as plot_fit
from ._result import FitError as FitError
from ._result import FitResult as FitResult
from ._rollout import AbstractRollout as AbstractRollout
from ._rollout import Simulate as Simulate
from ._rollout import Solve as Solve
from ._transforms import (
    AbstractTransform as AbstractTransform,
)
from ._transforms import (
    Bounded as Bounded,
)
from ._transforms import (
    Fixed as Fixed,
)
from ._transforms import (
    Identity as Identity,
)
from ._transforms import (
    Positive as Positive,
)
