"""Physical systems as Equinox modules: ODEs, SDEs and Hamiltonian particle systems."""

from ._base import (
    AbstractHamiltonian as AbstractHamiltonian,
)
from ._base import (
    AbstractODE as AbstractODE,
)
from ._base import (
    AbstractSDE as AbstractSDE,
)
from ._base import (
    components as components,
)
from ._base import (
    like as like,
)
from ._chaotic import Lorenz as Lorenz
from ._chemistry import Robertson as Robertson
from ._neuro import FitzHughNagumo as FitzHughNagumo
from ._oscillators import (
    DampedDrivenOscillator as DampedDrivenOscillator,
)
from ._oscillators import (
    DoublePendulum as DoublePendulum,
)
from ._oscillators import (
    Pendulum as Pendulum,
)
from ._oscillators import (
    VanDerPol as VanDerPol,
)
from ._particles import (
    FIGURE_EIGHT_PERIOD as FIGURE_EIGHT_PERIOD,
)
from ._particles import (
    HarmonicOscillator as HarmonicOscillator,
)
from ._particles import (
    Kepler as Kepler,
)
from ._particles import (
    MassSpringChain as MassSpringChain,
)
from ._particles import (
    MassSpringLattice as MassSpringLattice,
)
from ._particles import (
    NBody as NBody,
)
from ._population import SEIR as SEIR
from ._population import SIR as SIR
from ._population import LotkaVolterra as LotkaVolterra
from ._sde import GeometricBrownianMotion as GeometricBrownianMotion
from ._sde import OrnsteinUhlenbeck as OrnsteinUhlenbeck
