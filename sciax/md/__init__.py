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

# isort: split
# Set-up, units, files and observables.
from . import _units as units  # noqa: F401  (the module is the public namespace sciax.md.units)
from ._ase import ASEConfiguration as ASEConfiguration, from_ase as from_ase, to_ase as to_ase
from ._lattice import (
    lattice as lattice,
    lattice_nearest_distance as lattice_nearest_distance,
    random_positions as random_positions,
)
from ._observables import (
    DiffusionFit as DiffusionFit,
    coordination_numbers as coordination_numbers,
    diffusion_coefficient as diffusion_coefficient,
    green_kubo_diffusion as green_kubo_diffusion,
    kinetic_energy as kinetic_energy,
    mean_squared_displacement as mean_squared_displacement,
    msd_time_average as msd_time_average,
    potential_energy as potential_energy,
    pressure as pressure,
    pressure_tensor as pressure_tensor,
    radial_distribution as radial_distribution,
    rdf_histogram as rdf_histogram,
    temperature as temperature,
    total_energy as total_energy,
    unwrapped_positions as unwrapped_positions,
    velocity_autocorrelation as velocity_autocorrelation,
    virial as virial,
)
from ._units import LJUnits as LJUnits
from ._velocities import (
    degrees_of_freedom as degrees_of_freedom,
    kinetic_temperature as kinetic_temperature,
    maxwell_boltzmann as maxwell_boltzmann,
    zero_momentum as zero_momentum,
)
from ._xyz import (
    XYZFrame as XYZFrame,
    read_xyz as read_xyz,
    write_state_xyz as write_state_xyz,
    write_xyz as write_xyz,
)

# isort: split
# Dynamics: integrators, thermostats and the overflow-replaying drivers (one run, an ensemble).
from ._integrators import (
    Bussi as Bussi,
    Langevin as Langevin,
    MDCarry as MDCarry,
    NoseHooverChain as NoseHooverChain,
    NoseHooverChainState as NoseHooverChainState,
    VelocityVerlet as VelocityVerlet,
)
from ._regrow import (
    MDRun as MDRun,
    Regrowth as Regrowth,
    overflowed as overflowed,
    reallocate_carry as reallocate_carry,
    simulate_md as simulate_md,
)
from ._sweep import MDSweep as MDSweep, sweep_md as sweep_md
