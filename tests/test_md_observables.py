"""MD observables against direct NumPy computations: energies, temperature, pressure and virial,
radial distribution function, mean-squared displacement, diffusion coefficient and the VACF."""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciax
import sciax.md as md


def lj_reference(x, lengths, epsilon, sigma, cutoff):
    """Energy and virial tensor of a truncated (unshifted) LJ fluid by a direct float64 double loop."""
    x = np.asarray(x, np.float64)
    energy, virial = 0.0, np.zeros((3, 3))
    for i in range(len(x)):
        d = x[i] - x[i + 1:]
        d -= lengths * np.round(d / lengths)
        r = np.sqrt(np.sum(d * d, axis=1))
        keep = r < cutoff
        d, r = d[keep], r[keep]
        sr6 = (sigma / r) ** 6
        energy += np.sum(4 * epsilon * (sr6 * sr6 - sr6))
        f_over_r = 24 * epsilon * (2 * sr6 * sr6 - sr6) / r**2  # force on i from j = f_over_r * d
        virial += np.einsum("pa,pb->ab", d, f_over_r[:, None] * d)
    return energy, virial


@pytest.fixture
def liquid(key):
    """128 LJ atoms, random (no close pairs), masses 1 and 2, random velocities."""
    positions, box = md.random_positions(128, density=0.6, min_distance=0.9, key=key)
    masses = jnp.where(jnp.arange(128) % 2 == 0, 1.0, 2.0)
    velocities = jax.random.normal(jax.random.fold_in(key, 1), (128, 3), jnp.float64)
    system = md.MDSystem(box, md.LennardJones(epsilon=1.0, sigma=1.0, cutoff=2.5), masses)
    images = jax.random.randint(jax.random.fold_in(key, 2), (128, 3), -2, 3).astype(jnp.int32)
    return system, md.MDState(positions, velocities, images)


SCALARS = {"K": md.kinetic_energy, "T": md.temperature, "U": md.potential_energy, "E": md.total_energy,
           "W": md.virial, "Pab": md.pressure_tensor, "P": md.pressure}


@eqx.filter_jit
def evaluate(state, system):
    """Every observable of one frame, in one compiled program (as `simulate` evaluates them)."""
    return {name: fn(0.0, state, system) for name, fn in SCALARS.items()}


def test_energies_temperature_pressure_vs_numpy(liquid):
    system, state = liquid
    values = evaluate(state, system)
    m, v = np.asarray(system.masses), np.asarray(state.velocities)
    lengths = np.asarray(system.box.lengths)
    kinetic = 0.5 * np.sum(m[:, None] * v**2)
    assert float(values["K"]) == pytest.approx(kinetic, rel=1e-14)
    # kT = 2K / (dN - d): the momentum of the centre of mass removed
    assert float(values["T"]) == pytest.approx(2 * kinetic / (3 * 128 - 3), rel=1e-14)
    energy, virial = lj_reference(state.positions, lengths, 1.0, 1.0, 2.5)
    assert float(values["U"]) == pytest.approx(energy, rel=1e-12)
    assert float(values["E"]) == pytest.approx(kinetic + energy, rel=1e-12)
    np.testing.assert_allclose(np.asarray(values["W"]), virial, rtol=1e-11, atol=1e-11)
    volume = float(np.prod(lengths))
    tensor = (np.einsum("i,ia,ib->ab", m, v, v) + virial) / volume
    np.testing.assert_allclose(np.asarray(values["Pab"]), tensor, rtol=1e-11, atol=1e-12)
    pressure = (2 * kinetic + np.trace(virial)) / (3 * volume)
    assert float(values["P"]) == pytest.approx(pressure, rel=1e-11)


def test_temperature_of_maxwell_boltzmann_and_float32(key):
    positions, box = md.lattice("fcc", 2, density=0.5, dtype=jnp.float32)
    masses = jnp.full(32, 1.5, jnp.float32)
    state = md.MDState(positions, md.maxwell_boltzmann(masses, 0.7, key=key))
    system = md.MDSystem(box, md.LennardJones(cutoff=1.5), masses)
    values = evaluate(state, system)
    assert all(value.dtype == jnp.float32 for value in values.values())
    assert float(values["T"]) == pytest.approx(0.7, rel=1e-5)


def test_ideal_gas_pressure(key):
    """No interactions (ε = 0): P = N kT / V with kT = 2K / (d N)."""
    n, kT = 50, 1.3
    positions, box = md.random_positions(n, density=0.2, key=key)
    masses = jnp.linspace(1.0, 3.0, n)
    v = jax.random.normal(jax.random.fold_in(key, 1), (n, 3), jnp.float64)
    v = v * jnp.sqrt(3 * n * kT / jnp.sum(masses[:, None] * v**2))  # Σ m v² = d N kT exactly
    system = md.MDSystem(box, md.LennardJones(epsilon=0.0, cutoff=2.0), masses)
    values = evaluate(md.MDState(positions, v), system)
    volume = float(box.volume)
    assert float(values["P"]) == pytest.approx(n * kT / volume, rel=1e-13)
    assert float(jnp.trace(values["Pab"])) / 3 == pytest.approx(n * kT / volume, rel=1e-13)


def test_pressure_in_free_space_is_refused():
    system = md.MDSystem(md.FreeSpace(), md.LennardJones(cutoff=2.5), jnp.ones(3))
    state = md.MDState(jnp.eye(3) * 1.2, jnp.zeros((3, 3)))
    with pytest.raises(ValueError, match="pressure and stress need a periodic Box"):
        md.pressure(0.0, state, system)


def test_observables_inside_simulate(liquid):
    """Per-frame values in `simulate` equal the functions applied to the saved states."""
    system, state = liquid
    reference = system.box.unwrap(state.positions, state.images)
    observables = {"K": md.kinetic_energy, "T": md.temperature, "U": md.potential_energy, "E": md.total_energy,
                   "P": md.pressure, "Pab": md.pressure_tensor, "rdf": md.rdf_histogram(2.9, 29),
                   "msd": md.mean_squared_displacement(reference), "x": md.unwrapped_positions}
    traj = sciax.simulate(system, state, integrator=md.VelocityVerlet(), dt=0.002, n_steps=20, save_every=10,
                          observables=observables)
    direct = eqx.filter_jit(lambda frame, system: {name: fn(0.0, frame, system) for name, fn in observables.items()})
    for k in range(3):
        values = direct(jax.tree.map(lambda a, k=k: a[k], traj.states), system)
        for name in observables:
            np.testing.assert_allclose(np.asarray(traj.observables[name][k]), np.asarray(values[name]),
                                       rtol=1e-12, atol=1e-12, err_msg=name)
    assert float(traj.observables["msd"][0]) == 0.0 and float(traj.observables["msd"][-1]) > 0.0


# --- radial distribution function ------------------------------------------------------------------


def numpy_pair_histogram(x, lengths, r_max, n_bins):
    x = np.asarray(x, np.float64)
    d = x[:, None, :] - x[None, :, :]
    d -= lengths * np.round(d / lengths)
    r = np.sqrt(np.sum(d * d, axis=-1))[np.triu_indices(len(x), 1)]
    return np.histogram(r[r < r_max], bins=n_bins, range=(0.0, r_max))[0]


@pytest.mark.parametrize("n", [
    203, 202,  # odd and even N (the pairs at offset N/2)
    # covered by [202] (even N: the pairs at offset N/2 counted once) and [3] (fewer atoms than every block size)
    pytest.param(2, marks=pytest.mark.slow),
    3,
])
def test_rdf_histogram_equals_numpy_and_blocks(key, n):
    box = md.Box(jnp.full(3, (203 / 0.5) ** (1 / 3)))
    positions, _ = md.random_positions(n, box=box, key=key)
    if n < 4:
        positions = jnp.array([[1.0, 1.0, 1.0], [2.0, 1.5, 1.0], [1.0, 3.0, 6.5]])[:n]
    system = md.MDSystem(box, md.LennardJones(cutoff=2.0), jnp.ones(n))
    state = md.MDState(positions, jnp.zeros((n, 3)))
    expected = numpy_pair_histogram(positions, np.asarray(box.lengths), 3.5, 25)
    assert expected.sum() > 0
    for block_size in (None, 1, 17, n, 500):  # blocks that do not divide N as well
        counts = md.rdf_histogram(3.5, 25, block_size=block_size)(0.0, state, system)
        assert counts.dtype == jnp.int32
        np.testing.assert_array_equal(np.asarray(counts), expected)


def test_rdf_histogram_from_a_neighbour_list(key):
    """`like=`: pairs from a Verlet list of radius r_max give the all-pairs histogram; a configuration
    that needs more slots than the sized one is an error, not a wrong histogram."""
    positions, box = md.random_positions(500, density=0.8, min_distance=0.8, key=key)
    system = md.MDSystem(box, md.LennardJones(cutoff=2.5), jnp.ones(500))
    state = md.MDState(positions, jnp.zeros((500, 3)))
    listed = md.rdf_histogram(3.0, 30, like=(system, positions))
    listed_jit = eqx.filter_jit(listed)
    counts = listed_jit(0.0, state, system)
    np.testing.assert_array_equal(np.asarray(counts), numpy_pair_histogram(positions, np.asarray(box.lengths), 3.0, 30))
    clustered = md.MDState(positions * 0.5, state.velocities)  # 8 times denser in one corner
    with pytest.raises(eqx.EquinoxRuntimeError, match="needs more neighbour slots than the `like` configuration"):
        listed_jit(0.0, clustered, system)
    with pytest.raises(ValueError, match=r"`like` must be a pair \(system, positions\)"):
        md.rdf_histogram(3.0, 30, like=system)
    with pytest.raises(ValueError, match="`margin` must be a number >= 1"):
        md.rdf_histogram(3.0, 30, like=(system, positions), margin=0.5)


def test_rdf_of_an_ideal_gas_is_one(key):
    """Uniform random positions: g(r) = 1 within sampling error in every bin."""
    n, density, r_max, n_bins, frames = 800, 0.8, 4.0, 20, 4
    histogram = md.rdf_histogram(r_max, n_bins)
    counts, volume = [], None
    for f in range(frames):
        positions, box = md.random_positions(n, density=density, key=jax.random.fold_in(key, f))
        system = md.MDSystem(box, md.LennardJones(cutoff=2.0), jnp.ones(n))
        counts.append(np.asarray(histogram(0.0, md.MDState(positions, jnp.zeros((n, 3))), system)))
        volume = float(box.volume)
    r, g = md.radial_distribution(np.stack(counts), r_max=r_max, n_atoms=n, volume=volume)
    np.testing.assert_allclose(r, (np.arange(n_bins) + 0.5) * r_max / n_bins, rtol=1e-14)
    edges = np.linspace(0, r_max, n_bins + 1)
    expected = frames * 0.5 * n * (n - 1) * 4 / 3 * np.pi * np.diff(edges**3) / volume  # pairs per bin
    sigma = 1 / np.sqrt(expected)  # Poisson error of g in each bin
    assert np.all(np.abs(g - 1) < 5 * sigma), np.abs(g - 1) / sigma
    assert np.sum(((g - 1) / sigma) ** 2) < n_bins + 5 * math.sqrt(2 * n_bins)  # chi-square


def test_rdf_of_fcc_peaks_and_coordination():
    a = 1.0
    positions, box = md.lattice("fcc", 4, lattice_constant=a)
    n = positions.shape[0]
    system = md.MDSystem(box, md.LennardJones(cutoff=1.5), jnp.ones(n))
    state = md.MDState(positions, jnp.zeros((n, 3)))
    r_max, n_bins = 1.5, 150
    counts = np.asarray(md.rdf_histogram(r_max, n_bins)(0.0, state, system))
    shells = {a / math.sqrt(2): 12, a: 6, a * math.sqrt(1.5): 24, a * math.sqrt(2): 12}
    occupied = np.nonzero(counts)[0]
    np.testing.assert_array_equal(occupied, [int(r / r_max * n_bins) for r in shells])
    np.testing.assert_array_equal(counts[occupied], [z * n // 2 for z in shells.values()])
    running = md.coordination_numbers(counts, n)
    np.testing.assert_allclose(running[occupied], np.cumsum(list(shells.values())), rtol=1e-15)
    r, g = md.radial_distribution(counts, r_max=r_max, n_atoms=n, volume=float(box.volume))
    assert r[np.argmax(g)] == pytest.approx(a / math.sqrt(2), abs=r_max / n_bins)


def test_rdf_bad_input(liquid):
    with pytest.raises(ValueError, match="`r_max` must be a positive finite number"):
        md.rdf_histogram(-1.0, 10)
    with pytest.raises(ValueError, match="`n_bins` must be a positive int, got float"):
        md.rdf_histogram(2.0, 10.0)
    with pytest.raises(ValueError, match="`block_size` must be a positive int"):
        md.rdf_histogram(2.0, 10, block_size=0)
    system, state = liquid
    with pytest.raises(eqx.EquinoxRuntimeError, match="`r_max` exceeds half the shortest box side"):
        md.rdf_histogram(float(system.box.lengths[0]), 10)(0.0, state, system)
    with pytest.raises(ValueError, match=r"`volume` must be a positive finite scalar or one per frame \(2,\)"):
        md.radial_distribution(np.ones((2, 10)), r_max=2.0, n_atoms=10, volume=np.ones(3))
    with pytest.raises(ValueError, match="`n_atoms` must be an int >= 2"):
        md.radial_distribution(np.ones(10), r_max=2.0, n_atoms=1, volume=10.0)


# --- mean-squared displacement and diffusion -------------------------------------------------------


def test_msd_of_a_known_displacement(liquid, key):
    """Atoms moved by known vectors, some across the box several times: MSD = mean |Δ|² exactly."""
    system, state = liquid
    lengths = system.box.lengths
    reference = system.box.unwrap(state.positions, state.images)
    displacement = jax.random.normal(key, (128, 3), jnp.float64) * lengths  # crosses the box
    wrapped, shift = system.box.wrap(state.positions + displacement)
    moved = md.MDState(wrapped, state.velocities, state.images + shift)
    msd = md.mean_squared_displacement(reference)
    expected = np.mean(np.sum(np.asarray(displacement) ** 2, axis=1))
    assert float(msd(0.0, moved, system)) == pytest.approx(expected, rel=1e-12)
    assert float(msd(0.0, state, system)) == 0.0
    with pytest.raises(ValueError, match=r"the state has positions of shape \(128, 3\), the reference \(10, 3\)"):
        md.mean_squared_displacement(reference[:10])(0.0, state, system)
    with pytest.raises(ValueError, match=r"`reference` must be floating positions \(N, d\)"):
        md.mean_squared_displacement(jnp.zeros(3))


def test_diffusion_coefficient_of_a_synthetic_msd():
    d_true = 0.0713
    t = np.linspace(0.0, 10.0, 101)
    msd = 6 * d_true * t + 0.25
    fit = md.diffusion_coefficient(t, msd)
    assert fit.coefficient == pytest.approx(d_true, rel=1e-12)
    assert fit.intercept == pytest.approx(0.25, rel=1e-10)
    ballistic = np.where(t < 1.0, 3.0 * t**2, msd)  # a ballistic start, left out by t_min
    assert md.diffusion_coefficient(t, ballistic, t_min=1.0).coefficient == pytest.approx(d_true, rel=1e-12)
    assert md.diffusion_coefficient(t, 4 * d_true * t, dim=2).coefficient == pytest.approx(d_true, rel=1e-12)
    with pytest.raises(ValueError, match="fewer than 2 distinct times"):
        md.diffusion_coefficient(t, msd, t_min=20.0)
    with pytest.raises(ValueError, match="`times` and `msd` must be 1-D arrays of one length"):
        md.diffusion_coefficient(t, msd[:-1])


def test_msd_time_average_vs_direct(key):
    x = np.cumsum(np.asarray(jax.random.normal(key, (40, 7, 3), jnp.float64)), axis=0)
    expected = [np.mean(np.sum((x[k:] - x[:len(x) - k]) ** 2, axis=-1)) for k in range(40)]
    np.testing.assert_allclose(md.msd_time_average(x), expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(md.msd_time_average(x, max_lag=5), expected[:6], rtol=1e-10, atol=1e-12)


# --- velocity autocorrelation -----------------------------------------------------------------------


def test_velocity_autocorrelation_vs_direct(key):
    v = np.asarray(jax.random.normal(key, (50, 9, 3), jnp.float64))
    v = v + 0.5 * np.roll(v, 1, axis=0)  # correlated in time
    expected = np.array([np.mean(np.sum(v[:len(v) - k] * v[k:], axis=-1)) for k in range(50)])
    np.testing.assert_allclose(md.velocity_autocorrelation(v), expected, rtol=1e-10, atol=1e-13)
    normalized = md.velocity_autocorrelation(v, max_lag=10, normalize=True)
    np.testing.assert_allclose(normalized, expected[:11] / expected[0], rtol=1e-10, atol=1e-13)
    # a constant velocity: C(k) = |v|² at every lag
    constant = np.broadcast_to(np.array([1.0, -2.0, 0.5]), (20, 4, 3))
    np.testing.assert_allclose(md.velocity_autocorrelation(constant), 5.25, rtol=1e-12)
    with pytest.raises(ValueError, match=r"`max_lag` must be an int in \[0, 49\]"):
        md.velocity_autocorrelation(v, max_lag=50)
    with pytest.raises(ValueError, match=r"`velocities` must be \(n_frames, N, d\)"):
        md.velocity_autocorrelation(v[0])


def test_green_kubo_of_a_linear_vacf():
    """C(t) = 3 (1 - t/2) on [0, 2]: ∫ C dt = 3 exactly (the trapezoidal rule is exact), D = 1."""
    t = np.linspace(0.0, 2.0, 21)
    assert md.green_kubo_diffusion(0.1, 3 * (1 - t / 2)) == pytest.approx(1.0, rel=1e-13)
