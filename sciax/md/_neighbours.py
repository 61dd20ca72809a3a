r"""How pairs are enumerated: `AllPairs`, `CellList`, `VerletList`, and the `Neighbours` they build.

Cell lists and Verlet lists work on the particles sorted by cell (an internal permutation
`Neighbours.order`; the user-visible particle order never changes): the particles of a row of
neighbouring cells along the last axis are then contiguous, so a particle's candidates are a few
contiguous index ranges without per-cell padding, and the force loop reads positions that sit
close together in memory.

Capacities (neighbours per particle, particles per row of cells, the cell grid) are static and
chosen on the host (`MDSystem.allocate`). Inside `jit` every build checks them and records an
overflow status in `Neighbours.overflow` (a bitmask) together with what would have been needed
(`Neighbours.required`), so the host can grow the capacities (`MDSystem.grow`) and replay.
Empty slots hold the sentinel index N and are masked in one place, `_slot_terms`.
"""

import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._validation import describe

OVERFLOW_NEIGHBOURS = 1  # some particle has more neighbours than `capacity`
OVERFLOW_CELL = 2  # some row of cells holds more particles than `cell_capacity`
OVERFLOW_GRID = 4  # a cell is smaller than its share of the list radius (the box shrank below the grid)
_OVERFLOW_NAMES = {OVERFLOW_NEIGHBOURS: "neighbours per particle", OVERFLOW_CELL: "particles per cell",
                   OVERFLOW_GRID: "box too small for the cell grid"}
CELL_DIVISIONS = 2  # cells have side >= radius / CELL_DIVISIONS; a particle meets (2 * 2 + 1)^d cells
BLOCK = 128  # rows of the neighbour list handled together (their temporaries stay in cache)


def describe_overflow(status) -> str:
    """Words for an overflow bitmask (host)."""
    names = [text for bit, text in _OVERFLOW_NAMES.items() if int(status) & bit]
    return ", ".join(names) if names else "none"


class Neighbours(eqx.Module):
    """Neighbour data carried through a run (in the integrator's carry).

    **Fields:**

    - `indices`: `(N, K)` int32. Verlet list: row r lists every neighbour within cutoff + skin
      (both directions) of particle `order[r]`, as positions in `order`; cell list: the candidates
      in the surrounding cells; all pairs: `(N, 0)`. Empty slots hold the sentinel N.
      `neighbour_lists()` translates to the user's particle indices.
    - `order`: `(N,)` int32, the particles sorted by cell at the last build (internal).
    - `reference_positions`: `(N, d)` positions at the last build (length units).
    - `overflow`: int32 bitmask, 0 when every buffer was large enough: 1 neighbours per particle,
      2 particles per cell, 4 box too small for the cell grid. Sticky until the next allocation.
    - `n_builds`: int32 count of (re)builds.
    - `required`: int32 `(2 + d,)`: the largest neighbour count and row-of-cells occupancy seen,
      then the largest cell grid the box allows per axis (read on the host by `MDSystem.grow`).
    """

    indices: jax.Array
    order: jax.Array
    reference_positions: jax.Array
    overflow: jax.Array
    n_builds: jax.Array
    required: jax.Array

    @property
    def ok(self) -> jax.Array:
        """True where no buffer overflowed."""
        return self.overflow == 0

    def neighbour_lists(self) -> jax.Array:
        """`(N, K)` int32: row i holds the neighbours of particle i in the user's numbering (then
        the sentinel N)."""
        n = self.order.shape[0]
        ext = jnp.concatenate([self.order, jnp.array([n], jnp.int32)])
        lists = ext[self.indices]
        return jnp.zeros_like(lists).at[self.order].set(lists)


class AllPairs(eqx.Module):
    """Every pair, O(N²) memory and work: for small systems (and `FreeSpace`)."""


class CellList(eqx.Module):
    """A cell list rebuilt at every step: each particle meets the particles of the cells within the
    cutoff (cells of side ≥ cutoff / 2 on a static grid). O(N) build.

    **Arguments:** `cell_capacity`: particles per row of neighbouring cells (int), `grid`: cells
    per axis (tuple of ints). Leave them `None` and let `MDSystem.allocate` choose them.
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
    """Cells per axis (host): as many as fit with a side ≥ radius / CELL_DIVISIONS, at least 1."""
    return tuple(max(1, int(np.floor(float(length) * CELL_DIVISIONS / float(radius))))
                 for length in np.asarray(lengths))


def cell_index(box, positions, grid):
    """Flat (row-major) cell index `(N,)` int32 of each particle on `grid` (positions folded in)."""
    grid_a = jnp.asarray(grid, jnp.int32)
    wrapped, _ = box.wrap(positions)
    c = jnp.floor(wrapped / box.lengths * grid_a.astype(positions.dtype)).astype(jnp.int32)
    c = jnp.clip(c, 0, grid_a - 1)
    strides = np.cumprod((1,) + tuple(grid[::-1]))[:-1][::-1].astype(np.int32)
    return jnp.sum(c * jnp.asarray(strides), axis=-1)


def grid_status(box, grid, radius):
    """(overflow bit, largest allowed grid per axis): a cell side below radius / CELL_DIVISIONS,
    or a box not longer than twice `radius` (ambiguous minimum image), sets `OVERFLOW_GRID`."""
    lengths = box.lengths
    radius = jnp.asarray(radius, lengths.dtype)
    allowed = jnp.floor(lengths * CELL_DIVISIONS / radius).astype(jnp.int32)
    side = lengths / jnp.asarray(grid, lengths.dtype)
    bad = jnp.any(side * CELL_DIVISIONS < radius) | jnp.any(lengths <= 2 * radius)
    return jnp.where(bad, OVERFLOW_GRID, 0).astype(jnp.int32), allowed


def _axis_offsets(g: int) -> tuple[bool, tuple]:
    """(relative?, offsets) of the cells a cell meets along an axis with `g` cells: -m..m relative,
    or every cell once (absolute) when the axis has fewer than 2m + 1 cells."""
    m = CELL_DIVISIONS
    return (True, tuple(range(-m, m + 1))) if g >= 2 * m + 1 else (False, tuple(range(g)))


def _row_runs(starts, counts, grid):
    """For each cell and each row of cells it meets (rows run along the last axis), the row's
    particles in sorted order as at most two contiguous runs: `(n_cells, R, 4)` int32
    (start₁, length₁, start₂, length₂)."""
    m = CELL_DIVISIONS
    d = len(grid)
    n_cells = int(np.prod(grid))
    coords = jnp.stack(jnp.unravel_index(jnp.arange(n_cells, dtype=jnp.int32), grid), -1)  # (n_cells, d)
    g_last = grid[-1]
    # rows: offsets over the first d - 1 axes
    per_axis = [_axis_offsets(g) for g in grid[:-1]]
    row_offsets = list(itertools.product(*[o for _, o in per_axis]))
    base = jnp.zeros((n_cells, len(row_offsets)), jnp.int32)
    for a in range(d - 1):
        relative = per_axis[a][0]
        off = jnp.asarray([r[a] for r in row_offsets], jnp.int32)
        ca = (coords[:, a:a + 1] + off) % grid[a] if relative else jnp.broadcast_to(off, base.shape)
        base = base * grid[a] + ca
    base = base * g_last  # flat index of the row's first cell
    cz = coords[:, -1:]
    if g_last >= 2 * m + 1:
        lo, hi = cz - m, cz + m
        first1 = jnp.where(lo < 0, lo + g_last, lo)
        last1 = jnp.where(lo < 0, g_last - 1, jnp.minimum(hi, g_last - 1))
        has2 = (lo < 0) | (hi >= g_last)
        first2 = jnp.zeros_like(lo)
        last2 = jnp.where(lo < 0, hi, jnp.where(hi >= g_last, hi - g_last, 0))
    else:
        first1, last1 = jnp.zeros_like(cz), jnp.full_like(cz, g_last - 1)
        has2 = jnp.zeros(cz.shape, bool)
        first2, last2 = first1, first1

    def run(first, last):
        a, b = base + first, base + last
        return starts[a], starts[b] + counts[b] - starts[a]

    s1, n1 = run(first1, last1)
    s2, n2 = run(first2, last2)
    n2 = jnp.where(has2, n2, 0)
    return jnp.stack([s1, n1, s2, n2], -1).astype(jnp.int32)


def sort_by_cell(box, positions, grid):
    """The permutation sorting particles by cell, and each cell's runs of candidate rows."""
    n_cells = int(np.prod(grid))
    cells = cell_index(box, positions, grid)
    order = jnp.argsort(cells, stable=True).astype(jnp.int32)
    counts = jnp.zeros(n_cells, jnp.int32).at[cells].add(1)
    starts = (jnp.cumsum(counts) - counts).astype(jnp.int32)
    runs = _row_runs(starts, counts, grid)
    return order, cells[order], runs


def _candidates(runs_of_rows, rows_index, window: int, n: int):
    """Candidate sorted indices `(B, R * window)` for particles with rows `runs_of_rows` (B, R, 4),
    themselves at sorted positions `rows_index` (B,); itself and slots past the rows' particles
    get the sentinel `n`."""
    s1, n1, s2, n2 = (runs_of_rows[..., k:k + 1] for k in range(4))
    t = jnp.arange(window, dtype=jnp.int32)
    cand = jnp.where(t < n1, s1 + t, s2 + t - n1)
    valid = t < n1 + n2
    cand = cand.reshape(cand.shape[0], -1)
    valid = valid.reshape(cand.shape) & (cand != rows_index[:, None])
    return jnp.where(valid, cand, n)


def _blocks(n: int):
    nb = -(-n // BLOCK)
    return nb, nb * BLOCK - n


def build_lists(box, positions, grid, window: int, capacity: int | None, radius):
    """Sort by cell and list neighbours.

    With `capacity` None (cell list): indices are every candidate, `(N, R * window)`. Otherwise
    (Verlet list): the candidates closer than `radius`, compacted to `(N, capacity)`.

    **Returns:** (indices, order, overflow bits, needed neighbours, needed window).
    """
    n, d = positions.shape
    order, sorted_cells, runs = sort_by_cell(box, positions, grid)
    needed_window = jnp.max(runs[..., 1] + runs[..., 3])
    bits = jnp.where(needed_window > window, OVERFLOW_CELL, 0)
    xs = positions[order]
    runs_p = runs[sorted_cells]  # (N, R, 4)
    if capacity is None:
        indices = _candidates(runs_p, jnp.arange(n, dtype=jnp.int32), window, n)
        return indices, order, bits.astype(jnp.int32), jnp.zeros((), jnp.int32), needed_window

    nb, pad = _blocks(n)
    runs_b = jnp.pad(runs_p, ((0, pad), (0, 0), (0, 0))).reshape(nb, BLOCK, *runs_p.shape[1:])
    xs_b = jnp.pad(xs, ((0, pad), (0, 0))).reshape(nb, BLOCK, d)
    rows_b = jnp.arange(nb * BLOCK, dtype=jnp.int32).reshape(nb, BLOCK)
    r2max = jnp.asarray(radius, positions.dtype) ** 2

    def block(_, args):
        runs_k, xi, rows = args
        cand = _candidates(runs_k, rows, window, n)
        safe = jnp.minimum(cand, n - 1)
        r2 = sum(box.axis_displacement(xi[:, a:a + 1], xs[:, a][safe], a) ** 2 for a in range(d))
        mask = (cand < n) & (r2 < r2max) & (rows < n)[:, None]
        out, count = _compact_windows(mask.reshape(BLOCK, -1, window), runs_k, capacity, n)
        return None, (out, count)

    _, (indices, counts) = jax.lax.scan(block, None, (runs_b, xs_b, rows_b))
    indices = indices.reshape(-1, capacity)[:n]
    needed = jnp.max(counts)
    bits = bits | jnp.where(needed > capacity, OVERFLOW_NEIGHBOURS, 0)
    return indices, order, bits.astype(jnp.int32), needed.astype(jnp.int32), needed_window


def _select_bit(word, j):
    """Position of the j-th (0-based) set bit of each uint32 `word` (binary search on popcounts)."""
    position = jnp.zeros(word.shape, jnp.int32)
    j = j.astype(jnp.uint32)
    for width in (16, 8, 4, 2, 1):
        low = jax.lax.population_count(word & jnp.uint32((1 << width) - 1))
        high = j >= low
        j = jnp.where(high, j - low, j)
        word = jnp.where(high, word >> width, word)
        position = position + jnp.where(high, width, 0)
    return position


def _compact_windows(mask, runs, capacity: int, n: int):
    """Stream compaction of a block's candidate mask `(B, R, W)` into `(B, capacity)` sorted
    indices without a scatter: each 32-slot piece of a window becomes one bit word; output slot k
    finds its word by counting the words that end at or before k, then its bit by a binary search
    on popcounts. Returns the indices (sentinel `n`) and each row's count."""
    b, r, w = mask.shape
    nw = -(-w // 32)
    mask = jnp.pad(mask, ((0, 0), (0, 0), (0, nw * 32 - w))).reshape(b, r * nw, 32)
    shifts = jnp.arange(32, dtype=jnp.uint32)
    words = jnp.sum(mask.astype(jnp.uint32) << shifts, axis=-1, dtype=jnp.uint32)  # (B, S)
    counts = jax.lax.population_count(words).astype(jnp.int32)
    ends = jnp.cumsum(counts, axis=1, dtype=jnp.int32)
    total = ends[:, -1]
    k = jnp.arange(capacity, dtype=jnp.int32)
    segment = jnp.sum(ends[:, None, :] <= k[None, :, None], axis=-1, dtype=jnp.int32)  # (B, capacity)
    segment = jnp.minimum(segment, r * nw - 1)
    first = jnp.take_along_axis(ends - counts, segment, axis=1)
    word = jnp.take_along_axis(words, segment, axis=1)
    t = 32 * (segment % nw) + _select_bit(word, k[None, :] - first)
    run = jnp.take_along_axis(runs, (segment // nw)[..., None], axis=1)  # (B, capacity, 4)
    s1, n1, s2 = run[..., 0], run[..., 1], run[..., 2]
    cand = jnp.where(t < n1, s1 + t, s2 + t - n1)
    return jnp.where(k[None, :] < total[:, None], cand, n).astype(jnp.int32), total


# --------------------------------------------------------------------------------------------
# the pair sums: energy, forces and virial from one pair expression


def _slot_terms(pair_energy_r2, box, xi, xs, idx, si, species_sorted):
    """For rows `xi` (B, d) with neighbour slots `idx` (B, K) into `xs`: per-slot energies `e`,
    their derivatives `de` in r², and the minimum-image displacement components. The sentinel
    (index N) is masked here, and only here: its r² is +inf, beyond every cutoff."""
    n, d = xs.shape
    valid = idx < n
    safe = jnp.where(valid, idx, 0)
    comps = [box.axis_displacement(xi[:, a:a + 1], xs[:, a][safe], a) for a in range(d)]
    r2 = jnp.where(valid, sum(c * c for c in comps), jnp.inf)
    sj = None if species_sorted is None else species_sorted[safe]
    e, de = jax.jvp(lambda x: pair_energy_r2(x, si, sj), (r2,), (jnp.ones_like(r2),))
    return e, de, comps


def pair_sums_listed(pair_energy_r2, box, positions, neighbours, species=None):
    r"""Energy, forces and virial of a pair energy over a full neighbour list (both directions).

    With $\varphi'$ the derivative of the pair energy in $r^2$ (forward mode, elementwise, from the
    same expression as the energy) and $\Delta_{ij}$ the minimum-image $r_i - r_j$:
    $U = \frac12\sum_{i,j}\varphi$, $F_i = -2\sum_j \varphi'\Delta_{ij}$,
    $W = -\sum_{i,j} \varphi' \Delta_{ij} \otimes \Delta_{ij}$ (each pair is seen twice). Rows are
    processed in blocks of `BLOCK` so that their temporaries stay in cache.
    """
    n, d = positions.shape
    order, indices = neighbours.order, neighbours.indices
    xs = positions[order]
    ss = None if species is None else species[order]
    k = indices.shape[1]
    nb, pad = _blocks(n)
    idx_b = jnp.pad(indices, ((0, pad), (0, 0)), constant_values=n).reshape(nb, BLOCK, k)
    xs_b = jnp.pad(xs, ((0, pad), (0, 0))).reshape(nb, BLOCK, d)
    ss_b = None if ss is None else jnp.pad(ss, (0, pad)).reshape(nb, BLOCK)
    dtype = positions.dtype

    def block(carry, args):
        energy, virial = carry
        idx, xi = args[0], args[1]
        si = None if ss is None else args[2][:, None]
        e, de, comps = _slot_terms(pair_energy_r2, box, xi, xs, idx, si, ss)
        forces = jnp.stack([-2 * jnp.sum(de * c, axis=1) for c in comps], -1)
        w = jnp.stack([jnp.stack([-jnp.sum(de * comps[a] * comps[b]) for b in range(d)]) for a in range(d)])
        return (energy + 0.5 * jnp.sum(e), virial + w), forces

    init = (jnp.zeros((), dtype), jnp.zeros((d, d), dtype))
    args = (idx_b, xs_b) if ss is None else (idx_b, xs_b, ss_b)
    (energy, virial), forces = jax.lax.scan(block, init, args)
    forces_sorted = forces.reshape(-1, d)[:n]
    forces = jnp.zeros_like(forces_sorted).at[order].set(forces_sorted, unique_indices=True)
    return energy, forces, virial


def pair_sums_all(pair_energy_r2, box, positions, species=None):
    """As `pair_sums_listed` over every pair (the diagonal masked): O(N²), for small N."""
    n = positions.shape[0]
    dr = box.displacement(positions[:, None, :], positions[None, :, :])
    valid = ~jnp.eye(n, dtype=bool)
    si = None if species is None else species[:, None]
    sj = None if species is None else species[None, :]
    r2 = jnp.where(valid, jnp.sum(dr * dr, axis=-1), jnp.inf)
    e, de = jax.jvp(lambda x: pair_energy_r2(x, si, sj), (r2,), (jnp.ones_like(r2),))
    energy = 0.5 * jnp.sum(e)
    forces = -2 * jnp.einsum("ij,ija->ia", de, dr)
    virial = -jnp.einsum("ij,ija,ijb->ab", de, dr, dr)
    return energy, forces, virial
