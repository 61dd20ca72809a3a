"""MD set-up: lattices, random packings, Maxwell–Boltzmann velocities, units, extended XYZ and ASE."""

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from scipy.spatial import cKDTree

import sciax.md as md
from sciax.md import units

DATA = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "lammps_inlj"


def pair_distances(positions, lengths):
    """All minimum-image pair distances i < j (NumPy float64, small N)."""
    x = np.asarray(positions, np.float64)
    d = x[:, None, :] - x[None, :, :]
    d -= lengths * np.round(d / lengths)
    r = np.sqrt(np.sum(d * d, axis=-1))
    return r[np.triu_indices(len(x), 1)], r


# --- lattices ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind, per_cell, nearest, coordination",
                         [("sc", 1, 1.0, 6), ("bcc", 2, math.sqrt(3) / 2, 8), ("fcc", 4, 1 / math.sqrt(2), 12)])
def test_lattice_counts_distances_density(kind, per_cell, nearest, coordination):
    a = 1.7
    positions, box = md.lattice(kind, (3, 4, 5), lattice_constant=a)
    lengths = np.asarray(box.lengths)
    assert positions.shape == (per_cell * 60, 3) and positions.dtype == jnp.float64
    np.testing.assert_array_equal(lengths, np.array([3, 4, 5]) * a)
    x = np.asarray(positions)
    assert np.all((x >= 0) & (x < lengths))
    pairs, r = pair_distances(x, lengths)
    np.testing.assert_allclose(pairs.min(), nearest * a, rtol=1e-14)
    assert md.lattice_nearest_distance(kind, a) == pytest.approx(nearest * a, rel=1e-15)
    neighbours = np.sum(np.abs(r - nearest * a) < 1e-9, axis=1)  # every atom: the full shell
    np.testing.assert_array_equal(neighbours, coordination)
    assert len(np.unique(np.round(x, 9), axis=0)) == len(x)  # no duplicates

    density = 0.8442
    positions, box = md.lattice(kind, 4, density=density)
    assert positions.shape[0] / float(box.volume) == pytest.approx(density, rel=1e-14)
    assert float(box.lengths[0]) == pytest.approx(4 * (per_cell / density) ** (1 / 3), rel=1e-15)


def test_lattice_from_n_atoms_and_dtype():
    positions, box = md.lattice("fcc", n_atoms=108, density=1.0, dtype=jnp.float32)
    assert positions.shape == (108, 3) and positions.dtype == jnp.float32 and box.lengths.dtype == jnp.float32
    p2, _ = md.lattice("fcc", 3, density=1.0, n_atoms=108)
    np.testing.assert_allclose(np.asarray(positions), np.asarray(p2), rtol=1e-6)


def test_lattice_lammps_inlj():
    """LAMMPS in.lj: `lattice fcc 0.8442`, `region box block 0 10 0 10 0 10`, `create_atoms`."""
    data = np.load(DATA / "fcc_4000.npz")
    positions, box = md.lattice("fcc", 10, density=0.8442)
    assert float(box.lengths[0]) == pytest.approx(float(data["L"]), rel=1e-15)
    np.testing.assert_array_equal(np.asarray(box.lengths), np.full(3, float(data["L"])))
    x, ref = np.asarray(positions), data["x"]
    # the same set of positions, matched one to one (independent of the order)
    distance, index = cKDTree(ref).query(x)
    assert distance.max() < 1e-12 and len(np.unique(index)) == len(ref)
    np.testing.assert_array_equal(x, ref)  # and in LAMMPS's order (x fastest, basis innermost)


@pytest.mark.parametrize("kwargs, match", [
    (dict(kind="hcp", n_cells=2, density=1.0), "`kind` must be one of"),
    (dict(kind="fcc", n_cells=0, density=1.0), "`n_cells` must be a positive int"),
    (dict(kind="fcc", n_cells=(2, 2), density=1.0), "`n_cells` must be a positive int or a tuple of three"),
    (dict(kind="fcc", n_cells=2, density=-0.5), "`density` must be a positive finite number, got -0.5"),
    (dict(kind="fcc", n_cells=2, density=0.0), "`density` must be a positive finite number"),
    (dict(kind="fcc", n_cells=2, lattice_constant=float("nan")), "`lattice_constant` must be a positive finite"),
    (dict(kind="fcc", n_cells=2, density=1.0, lattice_constant=1.0), "exactly one of `density`"),
    (dict(kind="fcc", n_cells=2), "exactly one of `density`"),
    (dict(kind="fcc", n_cells=3, density=1.0, n_atoms=100), r"`n_atoms`=100 does not match .* 108 atoms"),
    (dict(kind="bcc", n_atoms=100, density=1.0), r"`n_atoms`=100 does not fill a cubic bcc lattice"),
    (dict(kind="fcc", density=1.0), "give `n_cells`"),
])
def test_lattice_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        md.lattice(**kwargs)


def test_lattice_bad_types():
    with pytest.raises(TypeError, match="`density` must be a positive number, got str"):
        md.lattice("fcc", 2, density="1.0")
    with pytest.raises(TypeError, match="`dtype` must be a floating dtype"):
        md.lattice("fcc", 2, density=1.0, dtype=jnp.int32)


# --- random packings ---------------------------------------------------------------------------------


def test_random_positions_minimum_distance(key):
    positions, box = md.random_positions(400, density=0.3, min_distance=0.95, key=key)
    lengths = np.asarray(box.lengths)
    assert positions.shape == (400, 3)
    assert 400 / float(box.volume) == pytest.approx(0.3, rel=1e-14)
    x = np.asarray(positions)
    assert np.all((x >= 0) & (x < lengths))
    tree = cKDTree(x, boxsize=lengths)  # an independent periodic neighbour search
    assert not tree.query_pairs(0.95)
    pairs, _ = pair_distances(x, lengths)
    assert pairs.min() >= 0.95
    # the same key (or seed) gives the same packing; another gives another
    np.testing.assert_array_equal(x, np.asarray(md.random_positions(400, density=0.3, min_distance=0.95,
                                                                    key=key)[0]))
    a = md.random_positions(50, density=0.1, min_distance=1.0, key=7)[0]
    np.testing.assert_array_equal(np.asarray(a), np.asarray(md.random_positions(50, density=0.1, min_distance=1.0,
                                                                                key=7)[0]))
    assert not np.array_equal(np.asarray(a), np.asarray(md.random_positions(50, density=0.1, min_distance=1.0,
                                                                            key=8)[0]))


def test_random_positions_in_a_given_box(key):
    box = md.Box(jnp.array([6.0, 4.0, 5.0], jnp.float32))
    positions, same = md.random_positions(30, box=box, min_distance=1.0, key=key)
    assert same is box and positions.dtype == jnp.float32
    x = np.asarray(positions, np.float64)
    assert np.all((x >= 0) & (x < np.array([6.0, 4.0, 5.0])))
    assert pair_distances(x, np.array([6.0, 4.0, 5.0]))[0].min() >= 1.0 - 1e-6


def test_random_positions_2d(key):
    box = md.Box(jnp.array([12.0, 9.0]))
    positions, _ = md.random_positions(60, box=box, min_distance=1.0, key=key)
    assert positions.shape == (60, 2)
    assert pair_distances(positions, np.array([12.0, 9.0]))[0].min() >= 1.0
    with pytest.raises(ValueError, match="impossible: denser than close packing"):  # φ = 0.93 > π/√12 in 2-D
        md.random_positions(130, box=box, min_distance=1.0, key=key)


def test_random_positions_bad_input(key):
    with pytest.raises(ValueError, match=r"packing fraction φ = 0\.78.*impossible: denser than close packing"):
        md.random_positions(100, density=1.5, min_distance=1.0, key=key)
    with pytest.raises(ValueError, match="beyond random sequential addition"):
        md.random_positions(100, density=0.8, min_distance=1.0, key=key)
    with pytest.raises(ValueError, match=r"atom \d+ of 500 found no place .* `max_tries`=1 draws"):
        md.random_positions(500, density=0.6, min_distance=1.0, key=key, max_tries=1)
    with pytest.raises(ValueError, match="`min_distance` must be a finite number >= 0, got -1.0"):
        md.random_positions(10, density=0.1, min_distance=-1.0, key=key)
    with pytest.raises(ValueError, match="exactly one of `box`"):
        md.random_positions(10, key=key)
    with pytest.raises(ValueError, match="`n_atoms` must be a positive int"):
        md.random_positions(0, density=0.1, key=key)
    with pytest.raises(TypeError, match="`key` must be a jax.random key or a non-negative int seed"):
        md.random_positions(10, density=0.1, key="seed")
    with pytest.raises(TypeError, match="`box` must be a periodic sciax.md.Box"):
        md.random_positions(10, box=md.FreeSpace(), key=key)


# --- velocities --------------------------------------------------------------------------------------


def test_maxwell_boltzmann_momentum_and_temperature(key):
    masses = jnp.asarray(np.random.default_rng(0).uniform(0.5, 3.0, 1000))
    kT = 1.37
    v = md.maxwell_boltzmann(masses, kT, key=key)
    assert v.shape == (1000, 3) and v.dtype == jnp.float64
    m, vv = np.asarray(masses), np.asarray(v)
    np.testing.assert_allclose(np.sum(m[:, None] * vv, axis=0), 0.0, atol=1e-12)
    dof = 3 * 1000 - 3
    assert md.degrees_of_freedom(1000) == dof
    assert np.sum(m[:, None] * vv**2) / dof == pytest.approx(kT, rel=1e-13)  # direct NumPy
    assert float(md.kinetic_temperature(v, masses)) == pytest.approx(kT, rel=1e-13)
    # jit gives the same velocities (traced masses and kT)
    jitted = jax.jit(lambda m, t, k: md.maxwell_boltzmann(m, t, key=k))(masses, kT, key)
    np.testing.assert_allclose(np.asarray(jitted), vv, rtol=1e-13, atol=1e-13)


def test_maxwell_boltzmann_float32_and_2d(key):
    v = md.maxwell_boltzmann(jnp.ones(64, jnp.float32), 2.0, key=key, dim=2)
    assert v.shape == (64, 2) and v.dtype == jnp.float32
    assert np.sum(np.asarray(v, np.float64) ** 2) / (2 * 64 - 2) == pytest.approx(2.0, rel=1e-5)
    assert np.allclose(np.asarray(v).sum(0), 0.0, atol=1e-5)


def test_maxwell_boltzmann_distribution(key):
    """Per component v ~ N(0, kT/m) for each mass, within sampling error of 30,000 components."""
    n = 20_000
    masses = jnp.where(jnp.arange(n) % 2 == 0, 1.0, 4.0)
    kT = 0.8
    v = np.asarray(md.maxwell_boltzmann(masses, kT, key=key))
    m = np.asarray(masses)
    for mass in (1.0, 4.0):
        sample = v[m == mass].ravel()  # 30,000 components
        variance = sample.var()
        assert abs(variance / (kT / mass) - 1) < 5 * math.sqrt(2 / sample.size)  # 5 standard errors
        assert stats.kstest(sample * math.sqrt(mass / kT), "norm").pvalue > 1e-3
        ke_per_dof = 0.5 * mass * np.mean(sample**2)
        assert abs(ke_per_dof / (kT / 2) - 1) < 5 * math.sqrt(2 / sample.size)


def test_maxwell_boltzmann_bad_input(key):
    with pytest.raises(ValueError, match=r"`masses` must be a 1-D array \(N,\) with N >= 2"):
        md.maxwell_boltzmann(jnp.ones(1), 1.0, key=key)
    with pytest.raises(ValueError, match=r"`masses` must be a 1-D array .* got array of shape \(4, 3\)"):
        md.maxwell_boltzmann(jnp.ones((4, 3)), 1.0, key=key)
    with pytest.raises(ValueError, match="`masses` must all be positive and finite"):
        md.maxwell_boltzmann(jnp.array([1.0, -1.0, 2.0]), 1.0, key=key)
    with pytest.raises(ValueError, match="`kT` must be a finite energy >= 0, got -1.0"):
        md.maxwell_boltzmann(jnp.ones(4), -1.0, key=key)
    with pytest.raises(ValueError, match="`kT` must be a scalar"):
        md.maxwell_boltzmann(jnp.ones(4), jnp.ones(4), key=key)
    with pytest.raises(ValueError, match="`dim` must be a positive int"):
        md.maxwell_boltzmann(jnp.ones(4), 1.0, key=key, dim=0)
    with pytest.raises(ValueError, match="leave 0 degrees of freedom"):
        md.kinetic_temperature(jnp.ones((1, 3)), jnp.ones(1))


# --- units -------------------------------------------------------------------------------------------


def test_units_constants_equal_ase_codata_2018():
    """Our constants typed from CODATA 2018 against ASE's independent `create_units("2018")`."""
    ase_units = pytest.importorskip("ase.units")
    u = ase_units.create_units("2018")
    assert units.BOLTZMANN == pytest.approx(u.kB, rel=1e-9)
    assert units.BOLTZMANN == pytest.approx(8.617333262e-5, rel=1e-9)  # CODATA 2018 table value
    # 1 amu Å²/ps² in eV: ASE's time unit is Å √(amu/eV), and 1 ps = 1000 u.fs of them
    assert units.AMU_A2_PER_PS2 == pytest.approx(1.0 / (1000 * u.fs) ** 2, rel=1e-9)
    assert units.ASE_TIME == pytest.approx(1.0 / (1000 * u.fs), rel=1e-9)
    assert units.EV_PER_A3_IN_BAR == pytest.approx(1.0 / u.bar, rel=1e-9)
    assert units.ATOMIC_MASS_CONSTANT == u._amu and units.ELEMENTARY_CHARGE == u._e


def test_units_round_trips_and_lj():
    x = np.array([0.5, 1.0, 300.0])
    np.testing.assert_allclose(units.kelvin_from_kT(units.kT_from_kelvin(x)), x, rtol=1e-15)
    np.testing.assert_allclose(units.amu_from_masses(units.masses_from_amu(x)), x, rtol=1e-15)
    np.testing.assert_allclose(units.pressure_from_bar(units.bar_from_pressure(x)), x, rtol=1e-15)
    assert units.kT_from_kelvin(jnp.float32(300.0)).dtype == jnp.float32  # follows the input dtype
    argon = md.LJUnits.from_kelvin(sigma=3.405, epsilon_kelvin=119.8, mass=39.948)
    # τ = σ √(m/ε) in SI, from the SI constants directly
    tau_si = 3.405e-10 * math.sqrt(39.948 * 1.66053906660e-27 / (119.8 * 1.380649e-23))
    assert argon.unit("time") == pytest.approx(tau_si * 1e12, rel=1e-12)
    assert argon.to_real(1.0, "temperature") == pytest.approx(119.8, rel=1e-14)
    assert argon.to_real(1.0, "pressure") * units.EV_PER_A3_IN_PA == pytest.approx(
        119.8 * 1.380649e-23 / 3.405e-10**3, rel=1e-12)
    assert argon.to_real(1.0, "velocity") == pytest.approx(3.405 / argon.unit("time"), rel=1e-15)
    for quantity in ("length", "energy", "mass", "time", "temperature", "velocity", "force", "pressure",
                     "density", "kT"):
        assert argon.from_real(argon.to_real(0.8442, quantity), quantity) == pytest.approx(0.8442, rel=1e-15)
    # kinetic energy of an argon atom at 1 Å/ps in reduced units, two ways
    ke_ev = 0.5 * 39.948 * 1.0**2 * units.AMU_A2_PER_PS2
    ke_reduced = 0.5 * 1.0 * argon.from_real(1.0, "velocity") ** 2
    assert argon.to_real(ke_reduced, "energy") == pytest.approx(ke_ev, rel=1e-13)
    with pytest.raises(ValueError, match="`quantity` must be one of length, energy"):
        argon.unit("speed")
    with pytest.raises(ValueError, match="`sigma` must be a positive finite number, got -1.0"):
        md.LJUnits(sigma=-1.0, epsilon=0.01, mass=1.0)


# --- extended XYZ ------------------------------------------------------------------------------------


def _frame(key, n=20):
    positions, box = md.random_positions(n, density=0.5, key=key)
    velocities = md.maxwell_boltzmann(jnp.ones(n), 1.0, key=jax.random.fold_in(key, 1))
    return positions, velocities, box


def test_xyz_round_trip_and_ase(tmp_path, key):
    ase_io = pytest.importorskip("ase.io")
    positions, velocities, box = _frame(key)
    species = jnp.arange(20) % 2
    images = jax.random.randint(jax.random.fold_in(key, 2), (20, 3), -3, 4).astype(jnp.int32)
    path = tmp_path / "run.xyz"
    for k in range(3):  # streamed frames
        md.write_xyz(path, positions + 0.01 * k, velocities=velocities * (k + 1), box=box, species=species,
                     symbols=("Ar", "Kr"), images=images if k == 2 else None, time=0.5 * k, step=100 * k,
                     append=k > 0)
    frames = md.read_xyz(path)
    assert len(frames) == 3
    for k, frame in enumerate(frames):
        np.testing.assert_array_equal(frame.positions, np.asarray(positions + 0.01 * k))  # bitwise
        np.testing.assert_array_equal(frame.velocities, np.asarray(velocities * (k + 1)))
        np.testing.assert_array_equal(frame.lengths, np.asarray(box.lengths))
        np.testing.assert_array_equal(frame.pbc, [True, True, True])
        np.testing.assert_array_equal(frame.species, np.asarray(species))
        assert frame.species_symbols == ("Ar", "Kr") and frame.symbols[:2] == ("Ar", "Kr")
        assert frame.time == 0.5 * k and frame.step == 100 * k
    np.testing.assert_array_equal(frames[2].images, np.asarray(images))
    np.testing.assert_allclose(frames[2].unwrapped_positions, np.asarray(box.unwrap(positions + 0.02, images)),
                               rtol=1e-15)
    assert frames[0].unwrapped_positions is None
    np.testing.assert_array_equal(np.asarray(frames[0].box().lengths), np.asarray(box.lengths))

    atoms = ase_io.read(path, index=":")
    assert len(atoms) == 3
    for k, a in enumerate(atoms):
        np.testing.assert_array_equal(a.positions, np.asarray(positions + 0.01 * k))
        np.testing.assert_array_equal(a.cell[:], np.diag(np.asarray(box.lengths)))
        np.testing.assert_array_equal(a.pbc, [True, True, True])
        assert a.get_chemical_symbols() == ["Ar", "Kr"] * 10
        np.testing.assert_array_equal(a.arrays["vel"], np.asarray(velocities * (k + 1)))
        assert a.info["time"] == 0.5 * k and a.info["step"] == 100 * k
    np.testing.assert_array_equal(atoms[2].arrays["unwrapped_pos"], frames[2].unwrapped_positions)


def test_xyz_float32_free_space_and_ase_written(tmp_path, key):
    ase_io = pytest.importorskip("ase.io")
    positions = jax.random.normal(key, (5, 3), jnp.float32)
    path = tmp_path / "free.xyz"
    md.write_xyz(path, positions, box=md.FreeSpace())
    (frame,) = md.read_xyz(path)
    np.testing.assert_array_equal(frame.positions.astype(np.float32), np.asarray(positions))
    assert frame.cell is None and not frame.pbc.any() and frame.velocities is None
    assert isinstance(frame.box(), md.FreeSpace)
    a = ase_io.read(path)
    assert not a.pbc.any() and a.get_chemical_symbols() == ["X"] * 5
    # a file ASE wrote is read by ours
    written = tmp_path / "ase.xyz"
    a.set_cell([4.0, 5.0, 6.0])
    a.set_pbc(True)
    ase_io.write(written, a, format="extxyz")
    (ours,) = md.read_xyz(written)
    np.testing.assert_allclose(ours.positions, a.positions, rtol=0, atol=5.1e-9)  # ASE writes 8 decimals
    np.testing.assert_array_equal(ours.lengths, [4.0, 5.0, 6.0])


def test_xyz_bad_input_leaves_file_whole(tmp_path, key):
    positions, velocities, box = _frame(key)
    path = tmp_path / "run.xyz"
    md.write_xyz(path, positions, velocities=velocities, box=box)
    before = path.read_text()
    with pytest.raises(ValueError, match=r"`velocities` must have shape \(20, 3\), got array of shape \(19, 3\)"):
        md.write_xyz(path, positions, velocities=velocities[:19], box=box, append=True)
    with pytest.raises(ValueError, match="2 species need `symbols`"):
        md.write_xyz(path, positions, species=jnp.arange(20) % 2, box=box, append=True)
    with pytest.raises(ValueError, match=r"`positions` must have shape \(N, 3\)"):
        md.write_xyz(path, positions[:, :2], append=True)
    with pytest.raises(ValueError, match="`images` .* needs a periodic `box`"):
        md.write_xyz(path, positions, images=jnp.zeros((20, 3), jnp.int32), append=True)
    with pytest.raises(TypeError, match="`images` must be an integer array"):
        md.write_xyz(path, positions, box=box, images=jnp.zeros((20, 3)), append=True)
    with pytest.raises(TypeError, match="`positions` must be a concrete array"):
        jax.jit(lambda x: md.write_xyz(path, x, append=True))(positions)
    assert path.read_text() == before
    path.write_text(before + "20\nProperties=species:S:1:pos:R:3\nX 0 0 0\n")
    with pytest.raises(ValueError, match="announces 20 atoms but the file ends after 1"):
        md.read_xyz(path)


def test_write_state_xyz(tmp_path, key):
    positions, velocities, box = _frame(key, n=8)
    system = md.MDSystem(box, md.LennardJones(1.0, 1.0, 1.0), jnp.ones(8))
    images = jnp.ones((8, 3), jnp.int32)
    state = md.MDState(positions, velocities, images)
    path = tmp_path / "s.xyz"
    md.write_state_xyz(path, state, system, symbols=("Ar",), time=1.5, step=3, unwrapped=True)
    (frame,) = md.read_xyz(path)
    np.testing.assert_array_equal(frame.positions, np.asarray(positions))
    np.testing.assert_array_equal(frame.images, np.asarray(images))
    assert frame.symbols == ("Ar",) * 8 and frame.time == 1.5 and frame.step == 3


# --- ASE ---------------------------------------------------------------------------------------------


def test_ase_round_trip(key):
    ase = pytest.importorskip("ase")
    positions, velocities, box = _frame(key)
    masses = units.masses_from_amu(jnp.where(jnp.arange(20) % 2 == 0, 39.948, 83.798))
    species = jnp.arange(20) % 2
    atoms = md.to_ase(positions, box=box, velocities=velocities, masses=masses, species=species,
                      symbols=("Ar", "Kr"))
    assert isinstance(atoms, ase.Atoms)
    np.testing.assert_array_equal(atoms.positions, np.asarray(positions))
    np.testing.assert_array_equal(atoms.cell[:], np.diag(np.asarray(box.lengths)))
    np.testing.assert_allclose(atoms.get_masses()[:2], [39.948, 83.798], rtol=1e-14)
    # ASE's kinetic energy (eV) = ours, ½ Σ m v² with m in eV ps²/Å² and v in Å/ps
    ke = 0.5 * np.sum(np.asarray(masses)[:, None] * np.asarray(velocities) ** 2)
    assert atoms.get_kinetic_energy() == pytest.approx(ke, rel=1e-12)
    back = md.from_ase(atoms)
    np.testing.assert_array_equal(np.asarray(back.positions), np.asarray(positions))
    np.testing.assert_allclose(np.asarray(back.velocities), np.asarray(velocities), rtol=1e-14)
    np.testing.assert_allclose(np.asarray(back.masses), np.asarray(masses), rtol=1e-14)
    np.testing.assert_array_equal(np.asarray(back.species), np.asarray(species))
    np.testing.assert_array_equal(np.asarray(back.images), 0)
    assert back.symbols == ("Ar", "Kr")
    np.testing.assert_array_equal(np.asarray(back.box.lengths), np.asarray(box.lengths))
    # positions outside the cell are wrapped, with their images
    atoms.positions[0] += np.asarray(box.lengths) * np.array([1, -2, 0])
    moved = md.from_ase(atoms)
    np.testing.assert_array_equal(np.asarray(moved.images[0]), [1, -2, 0])
    np.testing.assert_allclose(np.asarray(moved.positions[0]), np.asarray(positions[0]), atol=1e-12)
    free = md.from_ase(ase.Atoms("Ar2", positions=[[0, 0, 0], [0, 0, 3.0]]), units="none")
    assert isinstance(free.box, md.FreeSpace)
    np.testing.assert_allclose(np.asarray(free.masses), 39.948, rtol=1e-4)


def test_ase_bad_input():
    ase = pytest.importorskip("ase")
    with pytest.raises(TypeError, match="`atoms` must be an ase.Atoms, got list"):
        md.from_ase([1, 2])
    with pytest.raises(ValueError, match=r"periodic in every direction or none, the Atoms has pbc=\[True, False"):
        md.from_ase(ase.Atoms("Ar", cell=[3, 3, 3], pbc=[True, False, True]))
    with pytest.raises(ValueError, match="needs an orthorhombic cell"):
        md.from_ase(ase.Atoms("Ar", cell=[[3, 0, 0], [1, 3, 0], [0, 0, 3]], pbc=True))
    with pytest.raises(ValueError, match="`units` must be one of 'real', 'none'"):
        md.to_ase(jnp.zeros((2, 3)), units="metal")
    with pytest.raises(ValueError, match=r"`velocities` must have shape \(2, 3\)"):
        md.to_ase(jnp.zeros((2, 3)), velocities=jnp.zeros((3, 3)))
