"""sciax: differentiable physics and scientific computing on JAX."""

from . import integrators as integrators, systems as systems
from ._adjoint import (
    AbstractAdjoint as AbstractAdjoint,
    CheckpointAdjoint as CheckpointAdjoint,
    DirectAdjoint as DirectAdjoint,
    ReversibleAdjoint as ReversibleAdjoint,
)
from ._errors import NonFiniteStateError as NonFiniteStateError, StateMismatchError as StateMismatchError
from ._simulate import simulate as simulate
from ._state import PhaseSpace as PhaseSpace
from ._trajectory import Trajectory as Trajectory
from ._version import __version__ as __version__
