r"""How pairs are enumerated: `AllPairs`, `CellList`, `VerletList`, and the `Neighbours` they build.

Capacities (neighbours per particle, particles per cell, the cell grid) are static and chosen on
the host (`MDSystem.allocate`). Inside `jit` every build checks them and records an overflow
status in `Neighbours.overflow` (a bitmask) together with what would have been needed
(`Neighbours.required`), so the host can grow the capacities (`MDSystem.grow`) and replay.
Empty slots hold the sentinel index N and are masked in one place, `pair_sums`.
"""

import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._validation import describe

OVERFLOW_NEIGHBOURS = 1  # some particle has more neighbours than `capacity`
OVERFLOW_CELL = 2  # some cell holds more particles than `cell_capacity`
OVERFLOW_GRID = 4  # a cell is smaller than the list radius (the box shrank below the grid)
_OVERFLOW_NAMES = {OVERFLOW_NEIGHBOURS: "neighbours per particle", OVERFLOW_CELL: "particles per cell",
                   OVERFLOW_GRID: "box too small for the cell grid"}


def describe_overflow(status: int) -> str:
    """Words for an overflow bitmask (host)."""
    names = [text for bit, text in _OVERFLOW_NAMES.items() if int(status) & bit]
    return ", ".join(names) if names else "none"


class Neighbours(eqx.Module):
    """Neighbour data carried through a run (in the integrator's carry).

    **Fields:**

    - `indices`: `(N, K)` int32 neighbour indices (Verlet list: every neighbour within
      cutoff + skin, both directions; cell list: the candidates in the 27 surrounding cells;
      all pairs: `(N, 0)`). Empty slots hold the sentinel N.
    - `reference_positions`: `(N, d)` positions at the last build (length units).
    - `overflow`: int32 bitmask, 0 when every buffer was large enough: 1 neighbours per particle,
      2 particles per cell, 4 box too small for the cell grid. Sticky until the next allocation.
    - `n_builds`: int32 count of (re)builds.
    - `required`: int32 `(2 + d,)`: the largest neighbour count and cell occupancy seen, then the
      largest cell grid the box allows per axis (read on the host by `MDSystem.grow`).
    """

    indices: jax.Array
    reference_positions: jax.Array
    overflow: jax.Array
    n_builds: jax.Array
    required: jax.Array

    @property
    def ok(self) -> jax.Array:
        """True where no buffer overflowed."""
        return self.overflow == 0


class AllPairs(eqx.Module):
    """Every pair, O(N²) memory and work: for small systems (and `FreeSpace`)."""


class CellList(eqx.Module):
    """A cell list rebuilt at every step: cells of side ≥ cutoff on a static grid; each particle
    meets the particles of its own and the neighbouring cells. O(N) build.

    **Arguments:** `cell_capacity`: particles per cell (int), `grid`: cells per axis (tuple of
    ints). Leave them `None` and let `MDSystem.allocate` choose them.
    """

    cell_capacity: int | None = eqx.field(static=True, default=None)
    grid: tuple | None = eqx.field(static=True, default=None)

    @property
    def allocated(self) -> bool:
        return self.cell_capacity is not None and self.grid is not None

    def list_radius(self, cutoff):
        return cutoff


class VerletList(eqx.Module):
    """A Verlet list with a skin, built from a cell list and rebuilt when some particle has moved
    more than half the skin since the last build (not on a schedule).

    **Arguments:**

    - `skin`: extra list radius beyond the cutoff (length units, scalar).
    - `capacity`: neighbours per particle (int); `cell_capacity`, `grid` as for `CellList`.
      Leave them `None` and let `MDSystem.allocate` choose them.
    """

    skin: jax.Array = eqx.field(converter=jnp.asarray, default=0.3)
    capacity: int | None = eqx.field(static=True, default=None)
    cell_capacity: int | None = eqx.field(static=True, default=None)
    grid: tuple | None = eqx.field(static=True, default=None)

    def __check_init__(self):
        if jnp.ndim(self.skin) != 0:
            raise ValueError(f"VerletList: `skin` must be a scalar, got {describe(self.skin)}.")

    @property
    def allocated(self) -> bool:
        return self.capacity is not None and self.cell_capacity is not None and self.grid is not None

    def list_radius(self, cutoff):
        return cutoff + self.skin


# --------------------------------------------------------------------------------------------
# cells


def grid_for(lengths, radius) -> tuple:
    """Cells per axis (host): as many as fit with a side ≥ `radius`, at least 1."""
    return tuple(max(1, int(np.floor(float(length) / float(radius)))) for length in np.asarray(lengths))


def _stencil(grid) -> np.ndarray:
    """(n_cells, S) flat indices of each cell's neighbourhood (itself and its neighbours, each once
    even when an axis has fewer than three cells); built on the host at trace time."""
    axes = [(-1, 0, 1) if n >= 3 else tuple(range(n)) for n in grid]
    coords = np.stack(np.meshgrid(*[np.arange(n) for n in grid], indexing="ij"), -1).reshape(-1, len(grid))
    offsets = np.array(list(itertools.product(*axes)))
    grid_a = np.array(grid)
    relative = (coords[:, None, :] + offsets[None]) % grid_a
    neighbour = np.where(grid_a >= 3, relative, offsets[None] + 0 * coords[:, None])
    return np.ravel_multi_index(tuple(np.moveaxis(neighbour, -1, 0)), grid).astype(np.int32)


def cell_index(box, positions, grid):
    """Flat cell index (N,) int32 of each particle on a `grid` over the box (positions folded in)."""
    grid_a = jnp.asarray(grid, jnp.int32)
    wrapped, _ = box.wrap(positions)
    c = jnp.floor(wrapped / box.lengths * grid_a.astype(positions.dtype)).astype(jnp.int32)
    c = jnp.clip(c, 0, grid_a - 1)
    strides = np.cumprod((1,) + tuple(grid[::-1]))[:-1][::-1].astype(np.int32)  # row-major
    return jnp.sum(c * jnp.asarray(strides), axis=-1)


def cell_table(cells, n_cells: int, capacity: int):
    """Particles of each cell, `(n_cells, capacity)` int32 (sentinel N), and each cell's count."""
    n = cells.shape[0]
    order = jnp.argsort(cells, stable=True).astype(jnp.int32)
    sorted_cells = cells[order]
    counts = jnp.zeros(n_cells, jnp.int32).at[cells].add(1)
    starts = jnp.cumsum(counts) - counts
    slot = jnp.arange(n, dtype=jnp.int32) - starts[sorted_cells]
    table = jnp.full((n_cells, capacity), n, jnp.int32).at[sorted_cells, slot].set(order, mode="drop")
    return table, counts


def grid_status(box, grid, radius):
    """(overflow bit, largest allowed grid per axis): a cell side below `radius`, or a box not
    longer than twice `radius` (the minimum image would be ambiguous), sets `OVERFLOW_GRID`."""
    lengths = box.lengths
    radius = jnp.asarray(radius, lengths.dtype)
    allowed = jnp.floor(lengths / radius).astype(jnp.int32)
    bad = jnp.any(lengths / jnp.asarray(grid, lengths.dtype) < radius) | jnp.any(lengths <= 2 * radius)
    return jnp.where(bad, OVERFLOW_GRID, 0).astype(jnp.int32), allowed


def cell_candidates(box, positions, grid, cell_capacity):
    """Each particle's candidates: the particles of its cell neighbourhood, `(N, S * capacity)`
    int32 with itself and empty slots set to the sentinel N; plus (overflow bits, largest count)."""
    n = positions.shape[0]
    n_cells = int(np.prod(grid))
    cells = cell_index(box, positions, grid)
    table, counts = cell_table(cells, n_cells, cell_capacity)
    stencil = jnp.asarray(_stencil(grid))
    cand = table[stencil].reshape(n_cells, -1)[cells]
    cand = jnp.where(cand == jnp.arange(n, dtype=jnp.int32)[:, None], n, cand)
    most = jnp.max(counts)
    bits = jnp.where(most > cell_capacity, OVERFLOW_CELL, 0).astype(jnp.int32)
    return cand, bits, most


def compact(mask, values, capacity: int, fill: int):
    """The first `capacity` entries of each row of `values` where `mask` holds, `(rows, capacity)`,
    padded with `fill`; and each row's count of true entries."""
    rows = mask.shape[0]
    position = jnp.cumsum(mask, axis=1, dtype=jnp.int32) - 1
    count = position[:, -1] + 1
    target = jnp.where(mask, position, capacity)
    out = jnp.full((rows, capacity), fill, jnp.int32)
    out = out.at[jnp.arange(rows)[:, None], target].set(values, mode="drop")
    return out, count


# --------------------------------------------------------------------------------------------
# the pair sums: energy, forces and virial from one pair expression


def pair_sums(pair_energy_r2, box, positions, indices, species=None):
    r"""Energy, forces and virial of a pair energy over a full neighbour list.

    `pair_energy_r2(r2, species_i, species_j)` gives $\varphi$ per pair from $r^2$ (0 beyond
    the cutoff); the sentinel slots (index N) get $r^2 = \infty$ here and nowhere else. With
    $\varphi'$ its derivative in $r^2$ (forward-mode, elementwise) and $\Delta_{ij}$ the
    minimum-image $r_i - r_j$: $U = \frac12\sum_{i,j}\varphi$, $F_i = -2\sum_j \varphi'\Delta_{ij}$,
    $W = -\sum_{i,j} \varphi' \Delta_{ij} \otimes \Delta_{ij}$ (each pair seen twice).
    `indices=None` means all pairs (the diagonal is masked).
    """
    n = positions.shape[0]
    if indices is None:
        dr = box.displacement(positions[:, None, :], positions[None, :, :])
        valid = ~jnp.eye(n, dtype=bool)
        sj = None if species is None else species[None, :]
    else:
        valid = indices < n
        safe = jnp.where(valid, indices, 0)
        dr = box.displacement(positions[:, None, :], positions[safe])
        sj = None if species is None else species[safe]
    si = None if species is None else species[:, None]
    r2 = jnp.where(valid, jnp.sum(dr * dr, axis=-1), jnp.inf)
    e, de = jax.jvp(lambda x: pair_energy_r2(x, si, sj), (r2,), (jnp.ones_like(r2),))
    energy = 0.5 * jnp.sum(e)
    forces = -2 * jnp.einsum("ij,ija->ia", de, dr)
    virial = -jnp.einsum("ij,ija,ijb->ab", de, dr, dr)
    return energy, forces, virial
