"""Physical systems as Equinox modules: ODEs, SDEs and Hamiltonian particle systems."""

from ._base import (
    AbstractHamiltonian as AbstractHamiltonian,
    AbstractODE as AbstractODE,
    AbstractSDE as AbstractSDE,
    components as components,
    like as like,
)
from ._chaotic import Lorenz as Lorenz
from ._chemistry import Robertson as Robertson
from ._neuro import FitzHughNagumo as FitzHughNagumo
from ._oscillators import (
    DampedDrivenOscillator as DampedDrivenOscillator,
    DoublePendulum as DoublePendulum,
    Pendulum as Pendulum,
    VanDerPol as VanDerPol,
)
from ._particles import (
    FIGURE_EIGHT_PERIOD as FIGURE_EIGHT_PERIOD,
    HarmonicOscillator as HarmonicOscillator,
    Kepler as Kepler,
    MassSpringChain as MassSpringChain,
    MassSpringLattice as MassSpringLattice,
    NBody as NBody,
)
from ._population import SEIR as SEIR, SIR as SIR, LotkaVolterra as LotkaVolterra
from ._sde import GeometricBrownianMotion as GeometricBrownianMotion, OrnsteinUhlenbeck as OrnsteinUhlenbeck
