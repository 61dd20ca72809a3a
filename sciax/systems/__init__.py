"""Physical systems as Equinox modules: ODEs, SDEs and Hamiltonian particle systems."""

from ._base import (
    AbstractHamiltonian as AbstractHamiltonian,
    AbstractODE as AbstractODE,
    AbstractSDE as AbstractSDE,
    components as components,
    like as like,
)
from ._chaotic import Lorenz as Lorenz
from ._particles import HarmonicOscillator as HarmonicOscillator, Kepler as Kepler
from ._oscillators import VanDerPol as VanDerPol
