"""sciax: differentiable physics and scientific computing on JAX."""

from . import ensemble as ensemble
from . import integrators as integrators
from . import parallel as parallel
from . import systems as systems
from ._adjoint import (
    AbstractAdjoint as AbstractAdjoint,
)
from ._adjoint import (
    CheckpointAdjoint as CheckpointAdjoint,
)
from ._adjoint import (
    DirectAdjoint as DirectAdjoint,
)
from ._adjoint import (
    ReversibleAdjoint as ReversibleAdjoint,
)
from ._errors import NonFiniteStateError as NonFiniteStateError
from ._errors import StateMismatchError as StateMismatchError
from ._fit import (
    Bounded as Bounded,
)
from ._fit import (
    FitError as FitError,
)
from ._fit import (
    FitResult as FitResult,
)
from ._fit import (
    Fixed as Fixed,
)
from ._fit import (
    Identity as Identity,
)
from ._fit import (
    MultipleShooting as MultipleShooting,
)
from ._fit import (
    Positive as Positive,
)
from ._fit import (
    Simulate as Simulate,
)
from ._fit import (
    Solve as Solve,
)
from ._fit import (
    fit as fit,
)
from ._fit import (
    plot_fit as plot_fit,
)
from ._simulate import simulate as simulate
from ._solve import solve as solve
from ._state import PhaseSpace as PhaseSpace
from ._trajectory import Trajectory as Trajectory
from ._validation import astype as astype
from ._version import __version__ as __version__
from .ensemble import SweepResult as SweepResult
from .ensemble import sweep as sweep
