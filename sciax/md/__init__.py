"""Molecular dynamics: boxes, pair and bonded potentials, neighbour lists and MD systems."""

from ._bonds import FENEBond as FENEBond, HarmonicBond as HarmonicBond
from ._box import Box as Box, FreeSpace as FreeSpace
from ._neighbours import (
    OVERFLOW_CELL as OVERFLOW_CELL,
    OVERFLOW_GRID as OVERFLOW_GRID,
    OVERFLOW_NEIGHBOURS as OVERFLOW_NEIGHBOURS,
    AllPairs as AllPairs,
    CellList as CellList,
    Neighbours as Neighbours,
    VerletList as VerletList,
    describe_overflow as describe_overflow,
)
from ._potentials import (
    WCA as WCA,
    AbstractPairPotential as AbstractPairPotential,
    LennardJones as LennardJones,
    Morse as Morse,
    PotentialSum as PotentialSum,
    SoftSphere as SoftSphere,
)
from ._system import ForceResult as ForceResult, MDState as MDState, MDSystem as MDSystem
