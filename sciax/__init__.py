"""sciax: differentiable physics and scientific computing on JAX.

Systems (`sciax.systems`) are Equinox modules; integrators (`sciax.integrators`) take one step;
`simulate` (fixed step, `lax.scan`) and `solve` (Diffrax, adaptive/stiff) roll them out into a
`Trajectory`; `sweep` runs ensembles; `fit` fits parameters to data with uncertainties.
"""

import sys as _sys

from . import ensemble as ensemble, fitting as fitting, integrators as integrators, md as md, systems as systems
from .ensemble import _devices as parallel

_sys.modules[__name__ + ".parallel"] = parallel  # `sciax.parallel` as released: the ensemble package's devices
from ._adjoint import (
    AbstractAdjoint as AbstractAdjoint,
    CheckpointAdjoint as CheckpointAdjoint,
    DirectAdjoint as DirectAdjoint,
    ReversibleAdjoint as ReversibleAdjoint,
)
from ._compile.compilation_cache import enable_compilation_cache as enable_compilation_cache
from ._equilibrium import Equilibrium as Equilibrium, equilibrium as equilibrium
from ._errors import NonFiniteStateError as NonFiniteStateError, StateMismatchError as StateMismatchError
from ._phase_space import PhaseSpace as PhaseSpace
from ._rollout import AbstractRollout as AbstractRollout, Simulate as Simulate, Solve as Solve
from ._simulate import simulate as simulate
from ._solve import MaxStepsError as MaxStepsError, solve as solve
from ._trajectory import Trajectory as Trajectory
from ._validation import astype as astype
from ._version import __version__ as __version__
from .ensemble import SweepResult as SweepResult, sweep as sweep
from .fitting import (
    AbstractTransform as AbstractTransform,
    Bounded as Bounded,
    FitError as FitError,
    FitResult as FitResult,
    Fixed as Fixed,
    Identity as Identity,
    MultipleShooting as MultipleShooting,
    Positive as Positive,
    fit as fit,
    plot_fit as plot_fit,
)
