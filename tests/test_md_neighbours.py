"""sciax.md neighbour enumeration: complete lists, rebuild by displacement, overflow status for every
buffer (detected inside jit), growth and replay."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sciax import md


def fcc(cells, density=0.8442, jiggle=0.1, seed=0):
    a = (4 / density) ** (1 / 3)
    basis = np.array([[0, 0, 0], [0.5, 0.5, 0], [0.5, 0, 0.5], [0, 0.5, 0.5]])
    grid = np.stack(np.meshgrid(*[np.arange(cells)] * 3, indexing="ij"), -1).reshape(-1, 3)
    x = ((grid[:, None, :] + basis[None]) * a).reshape(-1, 3)
    x = x + np.random.default_rng(seed).normal(0, jiggle, x.shape)
    return jnp.asarray(x % (cells * a)), cells * a


def brute_force_pairs(x, lengths, radius):
    x = np.asarray(x)
    d = x[:, None, :] - x[None, :, :]
    d -= lengths * np.round(d / lengths)
    r2 = np.sum(d * d, -1)
    i, j = np.nonzero((r2 < radius**2) & ~np.eye(len(x), dtype=bool))
    return set(zip(i.tolist(), j.tolist(), strict=True))


def listed_pairs(neighbours):
    lists = np.asarray(neighbours.neighbour_lists())
    n = len(lists)
    return {(i, int(j)) for i in range(n) for j in lists[i] if j < n}


compute = eqx.filter_jit(lambda system, x, nbrs: system.compute(x, nbrs))
build = eqx.filter_jit(lambda system, x: system.build_neighbours(x))
update = eqx.filter_jit(lambda system, x, nbrs: system.update_neighbours(x, nbrs))


@pytest.mark.parametrize("geometry", ["3d-grid", "3d-small-box", "2d"])
def test_verlet_list_holds_exactly_the_pairs_within_the_list_radius(geometry):
    rng = np.random.default_rng(1)
    if geometry == "3d-grid":  # 7 cells per axis: each particle meets 5 cells per axis
        x, box = fcc(4, jiggle=0.2)
        lengths = np.full(3, box)
    elif geometry == "3d-small-box":  # 4 cells on one axis and 3 on others: every cell met once per axis
        lengths = np.array([6.0, 5.2, 5.5])
        x = jnp.asarray(rng.uniform(0, 1, (150, 3)) * lengths)
    else:
        lengths = np.array([9.0, 7.5])
        x = jnp.asarray(rng.uniform(0, 1, (200, 2)) * lengths)
    system = md.MDSystem(md.Box(lengths), md.LennardJones(cutoff=2.2), jnp.ones(len(x)),
                         neighbours=md.VerletList(skin=0.3)).allocate(x)
    nbrs = build(system, x)
    assert int(nbrs.overflow) == 0
    assert listed_pairs(nbrs) == brute_force_pairs(x, lengths, 2.5)
    assert int(nbrs.required[0]) == max(np.bincount([i for i, _ in brute_force_pairs(x, lengths, 2.5)]))
    # the cell list's candidates hold every pair within the cutoff too
    cells = md.MDSystem(md.Box(lengths), md.LennardJones(cutoff=2.2), jnp.ones(len(x)),
                        neighbours=md.CellList()).allocate(x)
    assert brute_force_pairs(x, lengths, 2.2) <= listed_pairs(build(cells, x))


def test_rebuilt_when_a_particle_moved_more_than_half_the_skin():
    x, box = fcc(3)
    skin = 0.4
    system = md.MDSystem(md.Box(box), md.LennardJones(cutoff=2.0), jnp.ones(len(x)),
                         neighbours=md.VerletList(skin=skin)).allocate(x)
    nbrs = build(system, x)
    assert int(nbrs.n_builds) == 1
    small = update(system, x.at[5, 0].add(0.45 * skin), nbrs)
    assert int(small.n_builds) == 1  # kept
    np.testing.assert_array_equal(small.reference_positions, x)
    moved = x.at[5, 0].add(0.55 * skin)
    large = update(system, moved, nbrs)
    assert int(large.n_builds) == 2  # rebuilt at the new positions
    np.testing.assert_array_equal(large.reference_positions, moved)
    # across the periodic boundary a small move is still small (minimum image)
    edge = x.at[7, 1].set(box - 1e-3)
    nbrs_edge = build(system, edge)
    assert int(update(system, edge.at[7, 1].set(0.05), nbrs_edge).n_builds) == 1
    # the cell list is rebuilt at every update; all pairs need nothing
    cells = md.MDSystem(md.Box(box), md.LennardJones(cutoff=2.0), jnp.ones(len(x)),
                        neighbours=md.CellList()).allocate(x)
    assert int(update(cells, x, build(cells, x)).n_builds) == 2


def _resized(system, **capacities):
    strategy = system.neighbours
    fields = {"capacity": strategy.capacity, "cell_capacity": strategy.cell_capacity, "grid": strategy.grid}
    fields.update(capacities)
    return eqx.tree_at(lambda s: s.neighbours, system, md.VerletList(skin=strategy.skin, **fields))


@pytest.mark.parametrize("buffer", ["neighbours", "cell"])
def test_overflow_is_detected_in_jit_and_grow_replays(buffer):
    x, box = fcc(4)
    system = md.MDSystem(md.Box(box), md.LennardJones(cutoff=2.2), jnp.ones(len(x)),
                         neighbours=md.VerletList(skin=0.3)).allocate(x)
    expected = compute(system, x, build(system, x))
    if buffer == "neighbours":
        small, bit = _resized(system, capacity=10), md.OVERFLOW_NEIGHBOURS
    else:
        small, bit = _resized(system, cell_capacity=4), md.OVERFLOW_CELL
    nbrs = build(small, x)
    assert int(nbrs.overflow) & bit
    assert md.describe_overflow(nbrs.overflow) in ("neighbours per particle", "particles per cell")
    # the status is sticky through updates that do not rebuild
    assert int(update(small, x, nbrs).overflow) & bit
    grown = small.grow(nbrs)
    replay = build(grown, x)
    assert int(replay.overflow) == 0
    result = compute(grown, x, replay)
    np.testing.assert_allclose(result.forces, expected.forces, rtol=0, atol=1e-12)
    np.testing.assert_allclose(result.energy, expected.energy, rtol=1e-13)
    np.testing.assert_allclose(result.virial, expected.virial, rtol=0, atol=1e-10)


def test_box_too_small_for_the_cell_grid_is_detected_and_grow_replays():
    x, box = fcc(4)
    potential = md.LennardJones(cutoff=2.2)
    system = md.MDSystem(md.Box(box), potential, jnp.ones(len(x)), neighbours=md.VerletList(skin=0.3)).allocate(x)
    nbrs = build(system, x)
    # compress by 8%: the grid chosen for the old box now has cells below radius / 2
    squeezed = eqx.tree_at(lambda s: s.box, system, md.Box(0.92 * box))
    y = 0.92 * x
    stale = update(squeezed, y, nbrs)
    assert int(stale.overflow) & md.OVERFLOW_GRID
    fresh = build(squeezed, y)
    assert int(fresh.overflow) & md.OVERFLOW_GRID
    grown = squeezed.grow(fresh)
    assert all(g < h for g, h in zip(grown.neighbours.grid, system.neighbours.grid, strict=True))
    replay = build(grown, y)
    assert int(replay.overflow) == 0
    reference = md.MDSystem(md.Box(0.92 * box), potential, jnp.ones(len(x)), neighbours=md.AllPairs())
    expected = compute(reference, y, reference.build_neighbours(y))
    np.testing.assert_allclose(compute(grown, y, replay).forces, expected.forces, rtol=0, atol=1e-11)


def test_cell_list_overflow_and_grow():
    x, box = fcc(4)
    system = md.MDSystem(md.Box(box), md.LennardJones(cutoff=2.2), jnp.ones(len(x)),
                         neighbours=md.CellList()).allocate(x)
    small = eqx.tree_at(lambda s: s.neighbours, system, md.CellList(cell_capacity=3, grid=system.neighbours.grid))
    nbrs = build(small, x)
    assert int(nbrs.overflow) == md.OVERFLOW_CELL
    grown = small.grow(nbrs)
    np.testing.assert_allclose(compute(grown, x, build(grown, x)).forces, compute(system, x, build(system, x)).forces,
                               rtol=0, atol=1e-12)


def test_memory_is_linear_in_capacity():
    x, box = fcc(4)
    system = md.MDSystem(md.Box(box), md.LennardJones(cutoff=2.2), jnp.ones(len(x)),
                         neighbours=md.VerletList(skin=0.3)).allocate(x)
    nbrs = build(system, x)
    assert nbrs.indices.shape == (len(x), system.neighbours.capacity)
    assert system.neighbours.capacity < len(x) // 2
    # the default strategy above 1,000 particles is the Verlet list
    big, big_box = fcc(7)
    assert isinstance(md.MDSystem(md.Box(big_box), md.LennardJones(), jnp.ones(len(big))).neighbours, md.VerletList)


def test_unallocated_and_misused_strategies_are_refused():
    x, box = fcc(3)
    system = md.MDSystem(md.Box(box), md.LennardJones(cutoff=2.0), jnp.ones(len(x)),
                         neighbours=md.VerletList(skin=0.3))
    with pytest.raises(ValueError, match="call `system = system.allocate"):
        jax.jit(lambda p: system.build_neighbours(p))(x)
    with pytest.raises(TypeError, match="on the host"):
        jax.jit(lambda p: system.allocate(p).neighbours.capacity)(x)
    with pytest.raises(ValueError, match="only neighbours=AllPairs"):
        md.MDSystem(md.FreeSpace(), md.LennardJones(), jnp.ones(4), neighbours=md.CellList())
    with pytest.raises(ValueError, match="AllPairs needs O"):
        md.MDSystem(md.Box(40.0), md.LennardJones(), jnp.ones(5000), neighbours=md.AllPairs())
    # the AbstractHamiltonian API allocates on the fly on the host
    direct = float(system.potential_energy(x))
    allocated = system.allocate(x)
    assert direct == pytest.approx(float(compute(allocated, x, build(allocated, x)).energy), rel=1e-13)
