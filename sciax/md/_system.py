r"""`MDSystem`: a box, a potential, masses and species, and how pairs are enumerated.

`compute(positions, neighbours)` returns the potential energy, forces and virial from one pair
expression. Neighbour capacities are static and chosen on the host (`allocate`, `grow`); builds
inside `jit` record an overflow status instead of returning wrong forces.
"""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._errors import StateMismatchError
from .._validation import describe, is_concrete
from ..systems._base import AbstractHamiltonian
from ._bonds import bonded_terms
from ._box import Box, FreeSpace
from ._neighbours import (
    AllPairs,
    CellList,
    Neighbours,
    VerletList,
    build_lists,
    grid_for,
    grid_status,
    pair_sums_all,
    pair_sums_listed,
    sort_by_cell,
)
from ._potentials import AbstractPairPotential, PotentialSum

ALL_PAIRS_LIMIT = 4096  # above this many particles AllPairs is refused (O(N²) memory)
DEFAULT_ALL_PAIRS_BELOW = 1000  # the default strategy: AllPairs below this many particles, else VerletList
CAPACITY_QUANTUM = 32  # Verlet-list capacities chosen on the host are multiples of this (see `quantised`)


def quantised(capacity: int) -> int:
    """`capacity` rounded up to a multiple of `CAPACITY_QUANTUM`.

    A Verlet list's pair sums then have the same bits at every capacity that holds the list:
    XLA:CPU sums a row of K slots in vector lanes and the last K mod W slots (W the vector width,
    which divides 32) in a separate remainder loop, so with K a multiple of 32 no occupied slot
    is summed in a different order when the capacity grows (`sciax.md._regrow`).
    """
    return -(-int(capacity) // CAPACITY_QUANTUM) * CAPACITY_QUANTUM


@eqx.filter_jit
def _largest_row(box, positions, grid):
    _, _, runs = sort_by_cell(box, positions, grid)
    return jnp.max(runs[..., 1] + runs[..., 3])


@eqx.filter_jit
def _largest_neighbour_count(box, positions, grid, window, radius):
    return build_lists(box, positions, grid, window, 1, radius)[3]


class ForceResult(eqx.Module):
    """Potential energy (energy units, scalar), forces `(N, d)` (energy / length) and virial
    $W_{ab} = \\sum_\\text{pairs} r_a f_b$ `(d, d)` (energy units), so that
    $P = (2K + \\operatorname{tr} W) / (d V)$."""

    energy: jax.Array
    forces: jax.Array
    virial: jax.Array


class MDState(eqx.Module):
    """The user-visible state of an MD run.

    **Fields:** `positions` `(N, d)` wrapped into the box (length units); `velocities` `(N, d)`
    (length / time); `images` `(N, d)` int32 image counts, so `box.unwrap(positions, images)` are
    the unwrapped positions; `thermostat`: the integrator's extended variables (`()` for NVE).
    """

    positions: jax.Array
    velocities: jax.Array
    images: jax.Array
    thermostat: object = ()

    def __init__(self, positions, velocities, images=None, thermostat=()):
        self.positions = jnp.asarray(positions)
        self.velocities = jnp.asarray(velocities)
        self.images = jnp.zeros(jnp.shape(self.positions), jnp.int32) if images is None else jnp.asarray(images)
        self.thermostat = thermostat


def _as_potential(potential):
    if isinstance(potential, AbstractPairPotential | PotentialSum) or hasattr(potential, "bonded_terms"):
        return potential
    raise TypeError(f"MDSystem: `potential` must be a pair potential, a bonded term or a sum of them, "
                    f"got {type(potential).__name__}.")


@eqx.filter_jit
def _build_and_compute(system, positions):
    return system.compute(positions, system.build_neighbours(positions))


class MDSystem(AbstractHamiltonian):
    r"""A molecular-dynamics system $H = \sum_i \tfrac12 m_i v_i^2 + U(r)$ in a box.

    $U$ sums the pair potentials over pairs within their cutoffs (minimum image) and the bonded
    terms over their bond lists.

    **Arguments:**

    - `box`: `Box` (periodic) or `FreeSpace`.
    - `potential`: a pair potential (`LennardJones`, `Morse`, ...), a bonded term, or a sum.
    - `masses`: `(N,)` positive (mass units).
    - `species`: `(N,)` int species index per particle (default all 0).
    - `neighbours`: `AllPairs()`, `CellList()` or `VerletList(skin)`; default `AllPairs` below
      1,000 particles (and in `FreeSpace`), else `VerletList(skin=0.12 * cutoff)`. Cell lists
      and Verlet lists need capacities: call `allocate(positions)` on the host.

    **Raises:** `ValueError` for non-positive masses, species of the wrong shape or out of range
    of the potential's parameters, bond indices out of range, a list radius (cutoff + skin) not
    below half the smallest box length, or `AllPairs` above 4,096 particles; `TypeError` for a
    potential of the wrong kind.

    **Example:**

        system = MDSystem(Box(L), LennardJones(cutoff=2.5), masses=jnp.ones(N)).allocate(x)
        nbrs = system.build_neighbours(x)
        result = system.compute(x, nbrs)   # energy, forces, virial
    """

    box: Box | FreeSpace
    potential: object
    masses: jax.Array = eqx.field(converter=jnp.asarray)
    species: jax.Array | None = None
    neighbours: AllPairs | CellList | VerletList | None = None

    def __init__(self, box, potential, masses, species=None, neighbours=None):
        self.box = box
        self.potential = _as_potential(potential)
        self.masses = masses
        n = jnp.shape(masses)[0] if jnp.ndim(masses) == 1 else 0
        self.species = None if species is None else jnp.asarray(species)
        if neighbours is None:
            if isinstance(box, FreeSpace) or n < DEFAULT_ALL_PAIRS_BELOW or not self.pair_terms:
                neighbours = AllPairs()
            else:
                neighbours = VerletList(skin=0.12 * self.cutoff)
        self.neighbours = neighbours

    def __check_init__(self):
        name = "MDSystem"
        if not isinstance(self.box, Box | FreeSpace):
            raise TypeError(f"{name}: `box` must be a sciax.md.Box or FreeSpace, got {type(self.box).__name__}.")
        if jnp.ndim(self.masses) != 1 or jnp.shape(self.masses)[0] < 1:
            raise ValueError(f"{name}: `masses` must have shape (N,) with N >= 1, got {describe(self.masses)}.")
        if not jnp.issubdtype(self.masses.dtype, jnp.floating):
            raise TypeError(f"{name}: `masses` must be floating point, got {describe(self.masses)}.")
        if is_concrete(self.masses):
            m = np.asarray(self.masses)
            if not np.all(np.isfinite(m) & (m > 0)):
                bad = int(np.argmax(~(np.isfinite(m) & (m > 0))))
                raise ValueError(f"{name}: `masses` must be positive and finite, got {float(m[bad])!r} for "
                                 f"particle {bad}.")
        n = self.n_particles
        if self.species is not None:
            if jnp.shape(self.species) != (n,) or not jnp.issubdtype(self.species.dtype, jnp.integer):
                raise ValueError(f"{name}: `species` must be an int array of shape ({n},) (one per particle, like "
                                 f"`masses`), got {describe(self.species)}.")
            if is_concrete(self.species):
                s = np.asarray(self.species)
                for term in self.pair_terms:
                    k = term.n_species
                    if k is not None and (s.min() < 0 or s.max() >= k):
                        raise ValueError(f"{name}: `species` must be in [0, {k}) for {type(term).__name__}'s "
                                         f"per-species parameters, got values in [{s.min()}, {s.max()}].")
        for term in self.bonded_terms:
            term.check_indices(name, n)
        if not isinstance(self.neighbours, AllPairs | CellList | VerletList):
            raise TypeError(f"{name}: `neighbours` must be AllPairs(), CellList() or VerletList(skin), got "
                            f"{type(self.neighbours).__name__}.")
        if isinstance(self.neighbours, AllPairs) and n > ALL_PAIRS_LIMIT:
            raise ValueError(f"{name}: AllPairs needs O(N²) memory and is refused for N = {n} > {ALL_PAIRS_LIMIT} "
                             f"particles; use neighbours=VerletList(skin) (or CellList()) in a periodic Box.")
        if isinstance(self.box, FreeSpace) and not isinstance(self.neighbours, AllPairs):
            raise ValueError(f"{name}: in FreeSpace only neighbours=AllPairs() applies (cell grids need a periodic "
                             f"Box), got {type(self.neighbours).__name__}.")
        if isinstance(self.box, Box) and self.pair_terms:
            if self.box.dimension not in (2, 3):
                raise ValueError(f"{name}: the box must be 2-D or 3-D, got {self.box.dimension}-D.")
            radius = self._list_radius()
            if is_concrete(radius) and is_concrete(self.box.lengths):
                half = float(np.min(np.asarray(self.box.lengths))) / 2
                if not float(radius) < half:
                    what = "cutoff + skin" if isinstance(self.neighbours, VerletList) else "cutoff"
                    raise ValueError(f"{name}: the {what} ({float(radius):g}) must be below half the smallest box "
                                     f"length ({half:g}) for the minimum image; use a larger box or a smaller "
                                     f"cutoff.")

    # ---------------------------------------------------------------- structure

    @property
    def n_particles(self) -> int:
        return jnp.shape(self.masses)[0]

    @property
    def dimension(self) -> int:
        return self.box.dimension

    @property
    def pair_terms(self) -> tuple:
        return self.potential.pair_terms

    @property
    def bonded_terms(self) -> tuple:
        return self.potential.bonded_terms

    @property
    def cutoff(self) -> jax.Array:
        """The largest cutoff of the pair terms (length units)."""
        cutoffs = [t.cutoff for t in self.pair_terms]
        if not cutoffs:
            return jnp.zeros(())
        return cutoffs[0] if len(cutoffs) == 1 else jnp.max(jnp.stack(jnp.broadcast_arrays(*cutoffs)))

    def _list_radius(self):
        if isinstance(self.neighbours, AllPairs):
            return self.cutoff
        return self.neighbours.list_radius(self.cutoff)

    def _pair_energy_r2(self, r2, si, sj):
        total = None
        for term in self.pair_terms:
            e = term.pair_energy_r2(r2, si, sj)
            total = e if total is None else total + e
        return total

    def _species_for_pairs(self):
        if any(t.n_species is not None for t in self.pair_terms):
            return jnp.zeros(self.n_particles, jnp.int32) if self.species is None else self.species
        return None

    # ---------------------------------------------------------------- host side

    def _check_positions(self, where: str, positions) -> None:
        n, d = self.n_particles, self.dimension
        if jnp.shape(positions) != (n, d):
            raise StateMismatchError(f"{where}: `positions` must have shape (N, d) = ({n}, {d}) (N from `masses`), "
                                     f"got {describe(positions)}.")
        if not jnp.issubdtype(jnp.result_type(positions), jnp.floating):
            raise TypeError(f"{where}: `positions` must be floating point, got {describe(positions)}.")
        if is_concrete(positions):
            x = np.asarray(positions)
            if not np.all(np.isfinite(x)):
                i = int(np.argmax(~np.all(np.isfinite(x), axis=-1)))
                raise ValueError(f"{where}: `positions` holds NaN or Inf (particle {i}: {x[i].tolist()}).")

    def allocate(self, positions, *, margin: float = 1.25) -> "MDSystem":
        """A copy with neighbour capacities chosen for `positions` (host side).

        The cell grid has as many cells per axis as fit with a side ≥ half the list radius
        (cutoff, plus the skin for a Verlet list); the row-of-cells and neighbour capacities are
        the largest counts found at `positions` times `margin` (plus two), the neighbour capacity
        rounded up to a multiple of `CAPACITY_QUANTUM` (32).

        **Arguments:** `positions` `(N, d)` (length units) on the host; `margin` ≥ 1.

        **Raises:** `TypeError` if called under a JAX transformation; `ValueError` for positions
        of the wrong shape, NaN, or outside the box.
        """
        where = "MDSystem.allocate"
        if not is_concrete(positions) or not all(is_concrete(x) for x in jax.tree_util.tree_leaves(self)):
            raise TypeError(f"{where} chooses static capacities on the host; call it outside jax.jit/vmap/grad.")
        self._check_positions(where, positions)
        self.box.check_inside(where, "positions", positions)
        if not margin >= 1:
            raise ValueError(f"{where}: `margin` must be >= 1, got {margin!r}.")
        strategy = self.neighbours
        if isinstance(strategy, AllPairs):
            return self
        positions = jnp.asarray(positions)
        radius = float(self._list_radius())
        grid = grid_for(self.box.lengths, radius)
        window = int(math.ceil(int(_largest_row(self.box, positions, grid)) * margin)) + 2
        if isinstance(strategy, CellList):
            return eqx.tree_at(lambda s: s.neighbours, self, CellList(cell_capacity=window, grid=grid))
        needed = _largest_neighbour_count(self.box, positions, grid, window, radius)
        capacity = quantised(math.ceil(int(needed) * margin) + 2)
        return eqx.tree_at(lambda s: s.neighbours, self, VerletList(
            skin=strategy.skin, capacity=capacity, cell_capacity=window, grid=grid))

    def grow(self, neighbours: Neighbours, *, margin: float = 1.25) -> "MDSystem":
        """A copy whose capacities hold what `neighbours.required` says was needed (host side),
        so a run that overflowed can be replayed; capacities never shrink, and the neighbour
        capacity is a multiple of `CAPACITY_QUANTUM` (32). For the `neighbours` of an ensemble
        (a leading member axis) it holds the largest need of any member.

        **Raises:** `TypeError` if called under a JAX transformation.
        """
        where = "MDSystem.grow"
        if not all(is_concrete(x) for x in jax.tree_util.tree_leaves((self, neighbours))):
            raise TypeError(f"{where} chooses static capacities on the host; call it outside jax.jit/vmap/grad.")
        strategy = self.neighbours
        if isinstance(strategy, AllPairs):
            return self
        required = np.asarray(neighbours.required)
        if required.ndim >= 2:  # neighbours of an ensemble (vmapped): the largest need of any member
            required = required.reshape(-1, required.shape[-1])
            required = np.concatenate([required[:, :2].max(0), required[:, 2:].min(0)])
        grid = tuple(int(min(g, max(1, a))) for g, a in zip(strategy.grid, required[2:], strict=True))
        cell_capacity = max(strategy.cell_capacity, int(math.ceil(required[1] * margin)) + 2)
        if grid != strategy.grid:  # bigger cells hold more particles: scale by the volume ratio
            ratio = np.prod(np.asarray(strategy.grid) / np.asarray(grid))
            cell_capacity = max(cell_capacity, int(math.ceil(cell_capacity * ratio)))
        if isinstance(strategy, CellList):
            return eqx.tree_at(lambda s: s.neighbours, self, CellList(cell_capacity=cell_capacity, grid=grid))
        capacity = quantised(max(strategy.capacity, math.ceil(required[0] * margin) + 2))
        return eqx.tree_at(lambda s: s.neighbours, self, VerletList(
            skin=strategy.skin, capacity=capacity, cell_capacity=cell_capacity, grid=grid))

    # ---------------------------------------------------------------- jittable

    def _require_allocated(self, where):
        strategy = self.neighbours
        if isinstance(strategy, CellList | VerletList) and not strategy.allocated:
            raise ValueError(f"{where}: the {type(strategy).__name__} has no capacities yet; call "
                             f"`system = system.allocate(positions)` on the host first.")

    def build_neighbours(self, positions) -> Neighbours:
        """Build the neighbour data at `positions` `(N, d)` (jittable; positions need not be wrapped).

        **Returns:** `Neighbours`, its `overflow` status set if a capacity was too small.
        """
        where = "MDSystem.build_neighbours"
        self._require_allocated(where)
        self._check_positions(where, positions)
        return self._build(positions, jnp.zeros((), jnp.int32))

    def _build(self, positions, n_builds):
        n, d = self.n_particles, self.dimension
        strategy = self.neighbours
        if isinstance(strategy, AllPairs):
            zero = jnp.zeros((), jnp.int32)
            return Neighbours(jnp.zeros((n, 0), jnp.int32), jnp.arange(n, dtype=jnp.int32), positions, zero,
                              n_builds + 1, jnp.zeros(2 + d, jnp.int32))
        radius = self._list_radius().astype(positions.dtype)
        grid_bits, allowed = grid_status(self.box, strategy.grid, radius)
        capacity = strategy.capacity if isinstance(strategy, VerletList) else None
        indices, order, bits, needed, window = build_lists(self.box, positions, strategy.grid,
                                                           strategy.cell_capacity, capacity, radius)
        required = jnp.concatenate([jnp.stack([needed, window]).astype(jnp.int32), allowed])
        return Neighbours(indices, order, positions, (bits | grid_bits).astype(jnp.int32), n_builds + 1, required)

    def update_neighbours(self, positions, neighbours: Neighbours) -> Neighbours:
        """Neighbours valid at `positions` (jittable): a Verlet list is rebuilt when some particle
        moved more than half the skin since its last build; a cell list is rebuilt every call;
        all pairs need nothing. The overflow status is kept (sticky) and the grid is re-checked
        against the current box."""
        strategy = self.neighbours
        if isinstance(strategy, AllPairs):
            return neighbours
        self._require_allocated("MDSystem.update_neighbours")
        if isinstance(strategy, CellList):
            new = self._build(positions, neighbours.n_builds)
        else:
            moved = self.box.displacement(positions, neighbours.reference_positions)
            half = 0.5 * strategy.skin.astype(positions.dtype)
            far = jnp.max(jnp.sum(moved * moved, axis=-1)) > half * half
            new = jax.lax.cond(far, lambda: self._build(positions, neighbours.n_builds), lambda: neighbours)
            grid_bits, allowed = grid_status(self.box, strategy.grid, self._list_radius().astype(positions.dtype))
            new = eqx.tree_at(lambda x: x.overflow, new, new.overflow | grid_bits)
        required = jnp.concatenate([jnp.maximum(new.required[:2], neighbours.required[:2]),
                                    jnp.minimum(new.required[2:], neighbours.required[2:])])
        return Neighbours(new.indices, new.order, new.reference_positions, new.overflow | neighbours.overflow,
                          new.n_builds, required)

    def compute(self, positions, neighbours: Neighbours) -> ForceResult:
        """Potential energy, forces `(N, d)` and virial `(d, d)` at `positions` (jittable).

        `neighbours` must be valid at `positions` (from `build_neighbours` / `update_neighbours`).
        """
        dtype = positions.dtype
        d = positions.shape[-1]
        energy = jnp.zeros((), dtype)
        forces = jnp.zeros_like(positions)
        virial = jnp.zeros((d, d), dtype)
        if self.pair_terms:
            species = self._species_for_pairs()
            if isinstance(self.neighbours, AllPairs):
                energy, forces, virial = pair_sums_all(self._pair_energy_r2, self.box, positions, species)
            else:
                energy, forces, virial = pair_sums_listed(self._pair_energy_r2, self.box, positions, neighbours,
                                                          species)
        if self.bonded_terms:
            e, f, w = bonded_terms(self.bonded_terms, self.box, positions)
            energy, forces, virial = energy + e, forces + f, virial + w
        return ForceResult(energy, forces, virial)

    # ---------------------------------------------------------------- AbstractHamiltonian API

    def _on_the_fly(self, positions) -> ForceResult:
        system = self
        strategy = self.neighbours
        if isinstance(strategy, CellList | VerletList) and not strategy.allocated:
            if not is_concrete(positions):
                self._require_allocated("MDSystem.potential_energy")
            system = self.allocate(positions)
        if isinstance(strategy, AllPairs):
            return system.compute(positions, system.build_neighbours(positions))
        return _build_and_compute(system, positions)

    def potential_energy(self, positions) -> jax.Array:
        """U(positions) (energy units), building the neighbours on the fly."""
        return self._on_the_fly(positions).energy

    def force(self, positions) -> jax.Array:
        """Forces `(N, d)` (energy / length), building the neighbours on the fly."""
        return self._on_the_fly(positions).forces

    def virial(self, positions) -> jax.Array:
        """Virial `(d, d)` (energy units), building the neighbours on the fly."""
        return self._on_the_fly(positions).virial

    def _volume(self, where):
        if isinstance(self.box, FreeSpace):
            raise ValueError(f"{where}: pressure and stress need a periodic Box; in FreeSpace the volume is infinite.")
        return self.box.volume

    def stress(self, state: MDState, result: ForceResult | None = None) -> jax.Array:
        """Stress (pressure) tensor $(\\sum_i m_i v_i \\otimes v_i + W)/V$, `(d, d)`, energy / length^d.

        **Arguments:** `state`; optionally the `ForceResult` at `state.positions` (else computed)."""
        volume = self._volume("MDSystem.stress")
        if result is None:
            result = self._on_the_fly(state.positions)
        v = state.velocities
        kinetic = jnp.einsum("i,ia,ib->ab", self.masses.astype(v.dtype), v, v)
        return (kinetic + result.virial) / volume

    def pressure(self, state: MDState, result: ForceResult | None = None) -> jax.Array:
        """$P = (2K + \\operatorname{tr} W) / (d V)$ (energy / length^d), K from all N particles' velocities."""
        return jnp.trace(self.stress(state, result)) / self.dimension

    def kinetic_energy(self, velocities) -> jax.Array:
        """K = Σ ½ m |v|²."""
        return 0.5 * jnp.sum(self.masses.astype(velocities.dtype)[:, None] * velocities**2)

    def check_state(self, state) -> None:
        """Raise `StateMismatchError` unless `state` is an `MDState` whose arrays are `(N, d)` with N
        from `masses`; `ValueError` (host values) for NaN positions or positions outside the box
        (an `MDState` holds wrapped positions: fold them in with `box.wrap`, which also returns the
        image counts)."""
        if not isinstance(state, MDState):
            raise StateMismatchError(f"MDSystem expects a sciax.md.MDState(positions, velocities, images) state, "
                                     f"got {type(state).__name__}.")
        n, d = self.n_particles, self.dimension
        for name in ("positions", "velocities", "images"):
            shape = jnp.shape(getattr(state, name))
            if shape != (n, d):
                raise StateMismatchError(f"MDSystem: state.{name} must have shape (N, d) = ({n}, {d}) (N from "
                                         f"`masses`), got {shape}.")
        self._check_positions("MDSystem", state.positions)
        self.box.check_inside("MDSystem", "state.positions", state.positions)

    def conserved_quantities(self, t, y) -> dict:
        return {"energy": self.kinetic_energy(y.velocities) + self.potential_energy(y.positions)}
