"""MD integrators and thermostats: NVE energy conservation and its dt² scaling, the thermostats'
extended energies, canonical kinetic-energy statistics, gradients against finite differences,
the reversible adjoint, bitwise continuation from a final carry, dtypes and argument errors."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciax
from sciax.md import (
    AllPairs,
    Box,
    Bussi,
    Langevin,
    LennardJones,
    MDCarry,
    MDState,
    MDSystem,
    NoseHooverChain,
    NoseHooverChainState,
    VelocityVerlet,
    VerletList,
)


def fcc(n_cells, density):
    """fcc positions (offset a/4 from the box corner) and the box length, NumPy float64."""
    a = (4 / density) ** (1 / 3)
    basis = np.array([[0, 0, 0], [0.5, 0.5, 0], [0.5, 0, 0.5], [0, 0.5, 0.5]]) + 0.25
    cells = np.stack(np.meshgrid(*[np.arange(n_cells)] * 3, indexing="ij"), -1).reshape(-1, 1, 3)
    return ((cells + basis) * a).reshape(-1, 3), n_cells * a


def velocities_at(n, kT, seed, dtype=np.float64):
    """Zero-momentum velocities (unit masses) with 2K / (3N - 3) = kT exactly."""
    v = np.random.default_rng(seed).normal(size=(n, 3))
    v -= v.mean(0)
    return (v * np.sqrt(kT * (3 * n - 3) / np.sum(v**2))).astype(dtype)


def liquid(n_cells=3, density=0.85, kT=0.85, *, cutoff=2.4, shift="energy", neighbours=None, dtype=jnp.float64,
           epsilon=1.0, sigma=1.0, seed=0):
    q, length = fcc(n_cells, density)
    n = len(q)
    potential = LennardJones(jnp.asarray(epsilon, dtype), jnp.asarray(sigma, dtype), jnp.asarray(cutoff, dtype),
                             shift=shift)
    system = MDSystem(Box(jnp.full(3, length, dtype)), potential, jnp.ones(n, dtype),
                      neighbours=AllPairs() if neighbours is None else neighbours)
    if not isinstance(system.neighbours, AllPairs):
        system = system.allocate(jnp.asarray(q, dtype), margin=1.5)
    state = MDState(jnp.asarray(q, dtype), jnp.asarray(velocities_at(n, kT, seed), dtype))
    return system, state


def energy_observable(integrator):
    return {"H": lambda t, s, system: integrator.extended_energy(system, s)}


@eqx.filter_jit
def initial_carry(integrator, system, state):
    return integrator.init(system, 0.0, state, None)


def observed_in_chunks(system, state, integrator, dt, n_chunks, chunk_steps, save_every, observables, key=None):
    """(observables, final carry) of `simulate` over `n_chunks * chunk_steps` steps, run as
    `n_chunks` calls continuing from the previous final carry (bitwise one call): every step
    size and length reuses one compiled program instead of compiling one per length."""
    carry, chunks = initial_carry(integrator, system, state), []
    for c in range(n_chunks):
        traj = sciax.simulate(system, integrator=integrator, dt=dt, n_steps=chunk_steps, save_every=save_every,
                              observables=observables, save_states=False, key=key, carry0=carry,
                              step_offset=c * chunk_steps)
        chunks.append({k: np.asarray(v)[0 if c == 0 else 1:] for k, v in traj.observables.items()})
        carry = traj.final_carry
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}, carry


def assert_float64_carry(carry, observables):
    """A float64 run keeps float64 (and int32 images and counters) everywhere (test_dtype_is_kept
    checks float32)."""
    for leaf in jax.tree.leaves(carry):
        assert leaf.dtype in (jnp.float64, jnp.int32), leaf.dtype
    assert all(v.dtype == jnp.float64 for v in observables.values())


def batch_means(x, n_batches=20):
    """Mean and its standard error from batch means (correlated samples)."""
    x = np.asarray(x)[: len(x) // n_batches * n_batches].reshape(n_batches, -1)
    means = x.mean(1)
    return means.mean(), means.std(ddof=1) / np.sqrt(n_batches)


# ---------------------------------------------------------------------------------------------
# NVE


def lj_forces_numpy(q, length, cutoff, shift_energy=True):
    """Direct all-pairs LJ (ε = σ = 1) energy and forces in float64, minimum image."""
    d = q[:, None, :] - q[None, :, :]
    d -= length * np.round(d / length)
    r2 = np.sum(d**2, -1)
    np.fill_diagonal(r2, np.inf)
    inside = r2 < cutoff**2
    s6 = np.where(inside, 1 / r2**3, 0.0)
    shift = 4 * (cutoff**-12 - cutoff**-6) if shift_energy else 0.0
    energy = 0.5 * np.sum(np.where(inside, 4 * (s6**2 - s6) - shift, 0.0))
    f_over_r = np.where(inside, 24 * (2 * s6**2 - s6) / np.where(inside, r2, 1.0), 0.0)
    return energy, np.sum(f_over_r[..., None] * d, axis=1)


def test_velocity_verlet_matches_numpy_reference():
    system, state = liquid(3, density=0.5, cutoff=2.5)
    length = float(system.box.lengths[0])
    traj = sciax.simulate(system, state, integrator=VelocityVerlet(), dt=0.004, n_steps=20, save_every=20)
    q, v = np.asarray(state.positions), np.asarray(state.velocities)
    images = np.zeros_like(q)
    f = lj_forces_numpy(q, length, 2.5)[1]
    for _ in range(20):
        v = v + 0.002 * f
        q = q + 0.004 * v
        k = np.floor(q / length)
        q, images = q - k * length, images + k
        f = lj_forces_numpy(q, length, 2.5)[1]
        v = v + 0.002 * f
    final = traj.final_state
    np.testing.assert_allclose(final.positions, q, rtol=0, atol=1e-12)
    np.testing.assert_allclose(final.velocities, v, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(final.images, images)
    np.testing.assert_allclose(traj.final_carry.energy, lj_forces_numpy(q, length, 2.5)[0], rtol=1e-13)


def test_nve_energy_fluctuation_scales_as_dt_squared():
    """LJ liquid (N = 108, ρ* = 0.85, T* = 0.85, energy-shifted at 2.4σ), the same 1.5 τ run at
    three step sizes (75 frames each; 375 steps per call): the largest |H(t) − H(0)| falls as dt²
    (fitted slope 2 ± 0.3)."""
    system, state = liquid()
    integrator = VelocityVerlet()
    deviations = []
    steps = (0.004, 0.002, 0.001)
    observables = energy_observable(integrator)  # one object: one compiled program for every step size
    for n_chunks, dt in enumerate(steps, start=1):
        n_chunks = 2 ** (n_chunks - 1)  # 375, 750 and 1,500 steps
        observed, carry = observed_in_chunks(system, state, integrator, dt, n_chunks, 375, 5, observables)
        assert_float64_carry(carry, observed)
        h = observed["H"][::n_chunks]  # every 5, 10, 20 steps: 75 intervals of 0.02 τ
        assert len(h) == 76
        deviations.append(np.max(np.abs(h - h[0])) / 108)
    slope = np.polyfit(np.log(steps), np.log(deviations), 1)[0]
    assert 1.7 < slope < 2.3, (slope, deviations)
    assert deviations[0] < 1e-3  # per particle, dt = 0.004


def _nve_drift(n_cells, n_steps):
    """(drift, largest deviation) of H per particle (ε) over an NVE run of the LJ liquid."""
    system, state = liquid(n_cells, cutoff=2.5, neighbours=VerletList(skin=0.3))
    integrator = VelocityVerlet()
    traj = sciax.simulate(system, state, integrator=integrator, dt=0.005, n_steps=n_steps, save_every=50,
                          observables=energy_observable(integrator), save_states=False)
    assert not sciax.md.overflowed(traj.final_carry)
    assert int(traj.final_carry.neighbours.n_builds) > n_steps // 50  # the list was rebuilt along the way
    h = np.asarray(traj.observables["H"]) / system.n_particles
    tenth = len(h) // 10
    return abs(h[-tenth:].mean() - h[:tenth].mean()), np.max(np.abs(h - h[0]))


def test_nve_drift_lj_liquid_short():
    """N = 256, ρ* = 0.85, T* = 0.85, dt = 0.005, 1,000 steps, energy-shifted LJ at 2.5σ with a
    Verlet list: drift per particle (mean of the last tenth − mean of the first tenth) < 2e-4 ε and
    every |H(t) − H(0)| < 2e-3 ε per particle."""
    drift, deviation = _nve_drift(4, 1000)
    assert drift < 2e-4 and deviation < 2e-3, (drift, deviation)


@pytest.mark.slow
def test_nve_drift_lj_liquid_long():
    """N = 500 (fcc 5³), ρ* = 0.85, T* = 0.85, dt = 0.005, 10⁴ steps: drift per particle < 5e-4 ε."""
    drift, deviation = _nve_drift(5, 10_000)
    print(f"N = 500, 10^4 steps: drift {drift:.3g}, largest deviation {deviation:.3g} (ε per particle)")
    assert drift < 5e-4 and deviation < 2e-3, (drift, deviation)


# ---------------------------------------------------------------------------------------------
# thermostats: extended energy


@pytest.mark.parametrize("integrator", [Langevin(0.85, 2.0), NoseHooverChain(0.85, 0.1), Bussi(0.85, 0.1)],
                         ids=["langevin", "nose-hoover", "bussi"])
def test_thermostat_extended_energy_conserved(integrator, key):
    """The 108-particle LJ liquid started at T* = 1.5, thermostatted at T* = 0.85 while it melts
    (the thermostat takes out more than 0.2 ε per particle): K + U + the thermostat's energy
    stays within 2e-3 ε per particle of its start over 2.4 τ at dt = 0.004 (measured 0.8-1.0e-3
    with two keys), and its largest deviation shrinks by more than 2.5x at dt = 0.002 (measured
    ~4x: an integration error, not bookkeeping, which would be of the order of the heat)."""
    system, state = liquid(kT=1.5)  # starts hotter than the bath: heat flows out
    deviations, heat = [], None
    observables = {**energy_observable(integrator), "Q": lambda t, s, sy: integrator.thermostat_energy(sy, s)}
    for n_chunks, dt in ((1, 0.004), (2, 0.002)):  # 600 and 1,200 steps, 600 per call
        observed, carry = observed_in_chunks(system, state, integrator, dt, n_chunks, 600, 10, observables, key=key)
        assert_float64_carry(carry, observed)
        h = observed["H"][::n_chunks] / 108  # 60 intervals of 0.04 τ
        assert len(h) == 61
        deviations.append(np.max(np.abs(h - h[0])))
        heat = heat if heat is not None else np.max(np.abs(observed["Q"])) / 108
    assert heat > 0.2  # the thermostat moved a lot of energy
    assert deviations[0] < 2e-3, deviations
    assert deviations[1] < deviations[0] / 2.5, deviations


# ---------------------------------------------------------------------------------------------
# thermostats: canonical statistics


def dilute_gas(n=16, dtype=jnp.float64):
    """N weakly interacting LJ particles at ρ* = 0.02 (a near-ideal gas)."""
    length = (n / 0.02) ** (1 / 3)
    side = int(np.ceil(n ** (1 / 3)))
    grid = np.stack(np.meshgrid(*[np.arange(side)] * 3, indexing="ij"), -1).reshape(-1, 3)[:n]
    q = (grid + 0.5) * (length / side)
    system = MDSystem(Box(jnp.full(3, length, dtype)), LennardJones(1.0, 1.0, 2.5, shift="energy"),
                      jnp.ones(n, dtype), neighbours=AllPairs())
    return system, MDState(jnp.asarray(q, dtype), jnp.asarray(velocities_at(n, 1.0, 1), dtype))


@pytest.mark.parametrize("which", ["langevin", "bussi"])
def test_kinetic_energy_is_canonical(which, key):
    """⟨K⟩ = d_f kT/2 and Var(K) = d_f (kT)²/2 (a Gamma(d_f/2, kT) law), within 4 standard
    errors (batch means over 20 batches, 4,000 samples), for a 16-particle dilute LJ gas at
    kT = 0.7: d_f = 3N for Langevin (no momentum conservation), 3N − 3 for Bussi (momentum zero
    and conserved). The two d_f differ by 6%, more than 4 standard errors of the mean."""
    kT = 0.7
    system, state = dilute_gas()
    if which == "langevin":
        integrator, d_f = Langevin(kT, 5.0), 48
    else:
        integrator, d_f = Bussi(kT, 0.05), 45
        assert integrator.n_degrees_of_freedom(system, state) == 45
    kinetic = {"K": lambda t, s, sy: sy.kinetic_energy(s.velocities)}
    traj = sciax.simulate(system, state, integrator=integrator, dt=0.01, n_steps=41_000, save_every=10,
                          observables=kinetic, save_states=False, key=key)
    k = np.asarray(traj.observables["K"])[100:]
    mean, mean_err = batch_means(k)
    var, var_err = batch_means((k - mean) ** 2)
    assert abs(mean - d_f * kT / 2) < 4 * mean_err, (mean, d_f * kT / 2, mean_err)
    assert abs(var - d_f * kT**2 / 2) < 4 * var_err, (var, d_f * kT**2 / 2, var_err)
    assert mean_err < 0.015 * d_f * kT / 2 and var_err < 0.08 * d_f * kT**2 / 2  # enough samples to tell


def test_nose_hoover_chain_mean_temperature():
    """LJ liquid, 108 particles, started at T* = 1.5 with the chain at T* = 0.85: the mean kinetic
    energy over the last 4,000 steps is d_f kT/2 (d_f = 3N − 3) within 4 standard errors."""
    kT = 0.85
    system, state = liquid(kT=1.5)
    integrator = NoseHooverChain(kT, 0.1)
    d_f = integrator.n_degrees_of_freedom(system, state)
    assert d_f == 3 * 108 - 3
    traj = sciax.simulate(system, state, integrator=integrator, dt=0.004, n_steps=5000, save_every=5,
                          observables={"K": lambda t, s, sy: sy.kinetic_energy(s.velocities)}, save_states=False)
    k = np.asarray(traj.observables["K"])[200:]
    mean, err = batch_means(k)
    assert abs(mean - d_f * kT / 2) < 4 * err, (mean, d_f * kT / 2, err)
    assert err < 0.01 * d_f * kT / 2


# ---------------------------------------------------------------------------------------------
# gradients


def gradient_gas():
    """64 LJ particles at ρ* = 0.3, T* = 1.5 in a Verlet list (skin 0.3): the list is rebuilt
    every ~20 steps, and pairs cross the (unshifted, hard) cutoff."""
    n = 64
    length = (n / 0.3) ** (1 / 3)
    grid = np.stack(np.meshgrid(*[np.arange(4)] * 3, indexing="ij"), -1).reshape(-1, 3)
    q = np.mod((grid + 0.5) * (length / 4) + np.random.default_rng(3).normal(scale=0.1, size=(n, 3)), length)
    system = MDSystem(Box(jnp.full(3, length)), LennardJones(1.0, 1.0, 2.5, shift="none"), jnp.ones(n),
                      neighbours=VerletList(skin=0.3)).allocate(jnp.asarray(q), margin=2.0)
    return system, MDState(jnp.asarray(q), jnp.asarray(velocities_at(n, 1.5, 2)))


def _loss(epsilon, sigma, positions, system, state, integrator, adjoint, n_steps=300):
    system = eqx.tree_at(lambda s: (s.potential.epsilon, s.potential.sigma), system, (epsilon, sigma))
    state = eqx.tree_at(lambda s: s.positions, state, positions)
    traj = sciax.simulate(system, state, integrator=integrator, dt=0.004, n_steps=n_steps, save_every=n_steps,
                          adjoint=adjoint)
    final = traj.final_state
    unwrapped = system.box.unwrap(final.positions, final.images)
    weights = jnp.linspace(-1.0, 1.0, unwrapped.size).reshape(unwrapped.shape)
    return jnp.sum(weights * unwrapped) + system.kinetic_energy(final.velocities), traj


@pytest.mark.parametrize("integrator, shift, n_steps", [
    # 144 = 12²: CheckpointAdjoint's nested blocks (12 of 12 steps) leave no remainder loop, whose
    # extra copy of the step and its derivative cost ~2 s of compilation at 150 steps
    (VelocityVerlet(), "none", 144),
    pytest.param(VelocityVerlet(), "force", 300, marks=pytest.mark.slow),
    pytest.param(NoseHooverChain(1.0, 0.2), "none", 150, marks=pytest.mark.slow),
], ids=["verlet-hard-cutoff", "verlet-force-shifted", "nose-hoover-hard-cutoff"])
def test_gradients_match_finite_differences(integrator, shift, n_steps):
    """d/dε, d/dσ and d/d(initial positions) (along a random direction) of an observable after
    144-300 steps, through ~10 Verlet-list rebuilds, with pairs crossing the cutoff, are finite
    and equal central differences (h = 1e-7) to 1e-5 relative; the reversible adjoint equals the
    checkpointed one to 1e-9.

    With a hard cutoff the final state is a piecewise smooth function of the parameters: it jumps
    where a pair's crossing of the cutoff moves from one step to the next. Autodiff gives the
    derivative of the smooth piece; a difference quotient agrees when no jump lies within ±h
    (at 200 steps σ's quotient with h = 1e-6 straddled one, at 1e-7 it did not)."""
    system, state = gradient_gas()
    system = eqx.tree_at(lambda s: s.potential, system, LennardJones(1.0, 1.0, 2.5, shift=shift))
    eps, sig = jnp.asarray(1.0), jnp.asarray(1.0)

    def loss(e, s, q, adjoint=sciax.CheckpointAdjoint()):
        return _loss(e, s, q, system, state, integrator, adjoint, n_steps)[0]

    # one compiled program gives the gradients, the trajectory checked here and the losses of the differences
    value_and_grads = jax.jit(jax.value_and_grad(
        lambda e, s, q: _loss(e, s, q, system, state, integrator, sciax.CheckpointAdjoint(), n_steps),
        argnums=(0, 1, 2), has_aux=True))
    (value, traj), grads = value_and_grads(eps, sig, state.positions)
    assert int(traj.final_carry.neighbours.n_builds) >= 6
    assert not sciax.md.overflowed(traj.final_carry)

    def inside(q):  # pairs within the cutoff
        d = system.box.displacement(q[:, None], q[None])
        return np.asarray(jnp.sum(d**2, -1) < 2.5**2)

    assert np.sum(inside(state.positions) != inside(traj.final_state.positions)) > 20

    assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)

    def loss_jit(e, s, q):
        return value_and_grads(e, s, q)[0][0]

    h = 1e-7
    fd_eps = (loss_jit(eps + h, sig, state.positions) - loss_jit(eps - h, sig, state.positions)) / (2 * h)
    fd_sig = (loss_jit(eps, sig + h, state.positions) - loss_jit(eps, sig - h, state.positions)) / (2 * h)
    np.testing.assert_allclose(grads[0], fd_eps, rtol=1e-5)
    np.testing.assert_allclose(grads[1], fd_sig, rtol=1e-5)
    direction = jnp.asarray(np.random.default_rng(5).normal(size=state.positions.shape))
    fd_q = (loss_jit(eps, sig, state.positions + h * direction)
            - loss_jit(eps, sig, state.positions - h * direction)) / (2 * h)
    np.testing.assert_allclose(jnp.sum(grads[2] * direction), fd_q, rtol=1e-5)

    reversible = jax.jit(jax.grad(lambda e, s, q: loss(e, s, q, sciax.ReversibleAdjoint()), argnums=(0, 1, 2)))(
        eps, sig, state.positions)
    for a, b in zip(grads, reversible):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-9 * float(jnp.max(jnp.abs(a))))


def test_reversible_step_inverts_a_step():
    """A velocity-Verlet step with −dt from the new carry gives back the old state (what the
    reversible adjoint relies on), through a wrap across the box boundary."""
    system, state = gradient_gas()
    length = float(system.box.lengths[0])
    spacing = length / 4  # particle 0 sits on the boundary, between the lattice's rows, moving out
    state = eqx.tree_at(lambda s: (s.positions, s.velocities), state,
                        (state.positions.at[0].set(jnp.array([length - 1e-3, 2 * spacing, 2 * spacing])),
                         state.velocities.at[0].set(jnp.array([2.0, 0.3, -0.2]))))
    integrator = VelocityVerlet()
    step = eqx.filter_jit(lambda c, h: integrator.step(system, 0.0, c, h, None, None))
    carry = eqx.filter_jit(integrator.init)(system, 0.0, state, None)
    after = step(carry, jnp.asarray(0.004))  # arrays: one program for both signs
    assert after.state.images[0].tolist() == [1, 0, 0]
    back = step(after, jnp.asarray(-0.004))
    np.testing.assert_allclose(back.state.positions, carry.state.positions, atol=1e-12)
    np.testing.assert_allclose(back.state.velocities, carry.state.velocities, atol=1e-12)
    np.testing.assert_array_equal(back.state.images, carry.state.images)


# ---------------------------------------------------------------------------------------------
# continuation, dtypes, errors


# Nosé–Hoover (thermostat variables) and Bussi (per-step keys, heat) cover what the carry must
# hold; velocity Verlet and Langevin repeat them with less in the carry. Bussi is covered by
# test_md_sweep.py::test_members_at_different_densities_with_a_thermostat_axis (Bussi members run in
# chunks, each from the last one's carry, equal one simulate to 1e-12 in positions and velocities and
# 1e-11 in the heat, not bit for bit: the vmapped gamma sampler rounds a few draws 1 ulp differently;
# a wrong key, heat or neighbour list would differ at O(1))
# and test_md_run.py::test_resume_bitwise (Langevin chunks continued from a carry: per-step keys).
@pytest.mark.parametrize("integrator", [pytest.param(VelocityVerlet(), marks=pytest.mark.slow),
                                        pytest.param(Langevin(1.0, 1.0), marks=pytest.mark.slow),
                                        NoseHooverChain(1.0, 0.2),
                                        pytest.param(Bussi(1.0, 0.2), marks=pytest.mark.slow)],
                         ids=["verlet", "langevin", "nose-hoover", "bussi"])
def test_continuing_from_final_carry_is_bitwise(integrator, key):
    """Two runs of 60 steps, the second from the first's final carry, equal one run of 120 steps
    bit for bit: states, thermostat variables and the neighbour list (rebuilt on the way). (The
    first run starts from the integrator's initial carry: the two runs of 60 steps are one
    compiled program.)"""
    system, state = gradient_gas()
    whole = sciax.simulate(system, state, integrator=integrator, dt=0.004, n_steps=120, save_every=20, key=key)
    first = sciax.simulate(system, integrator=integrator, dt=0.004, n_steps=60, save_every=20, key=key,
                           carry0=initial_carry(integrator, system, state))
    for a, b in zip(jax.tree.leaves(whole.states), jax.tree.leaves(first.states), strict=True):
        np.testing.assert_array_equal(a[:4], b)
    second = sciax.simulate(system, integrator=integrator, dt=0.004, n_steps=60, save_every=20, key=key,
                            carry0=first.final_carry, step_offset=60)
    assert isinstance(whole.final_carry, MDCarry)
    assert int(whole.final_carry.neighbours.n_builds) > 2
    for a, b in zip(jax.tree.leaves(whole.final_carry), jax.tree.leaves(second.final_carry), strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    for a, b in zip(jax.tree.leaves(whole.states), jax.tree.leaves(second.states), strict=True):
        np.testing.assert_array_equal(a[3:], b)


@pytest.mark.parametrize("integrator", [VelocityVerlet(), Langevin(1.0, 1.0), NoseHooverChain(1.0, 0.2),
                                        Bussi(1.0, 0.2)], ids=["verlet", "langevin", "nose-hoover", "bussi"])
@pytest.mark.parametrize("dtype", [
    jnp.dtype("float32"),
    # covered by assert_float64_carry in test_nve_energy_fluctuation_scales_as_dt_squared (velocity Verlet) and
    # test_thermostat_extended_energy_conserved (Langevin, Nosé–Hoover, Bussi): float64 carries and observables
    pytest.param(jnp.dtype("float64"), marks=pytest.mark.slow),
], ids=["float32", "float64"])
def test_dtype_is_kept(integrator, dtype, key):
    system, state = liquid(3, density=0.5, dtype=dtype)
    traj = sciax.simulate(system, state, integrator=integrator, dt=0.004, n_steps=10, save_every=5, key=key,
                          observables=energy_observable(integrator))
    for leaf in jax.tree.leaves(traj.final_carry):
        assert leaf.dtype in (dtype, jnp.int32), leaf.dtype
    assert traj.final_carry.state.positions.dtype == dtype
    assert traj.observables["H"].dtype == dtype
    assert bool(jnp.all(jnp.isfinite(traj.observables["H"])))


def test_thermostat_variables_in_state():
    system, state = liquid(3, density=0.5)
    carry = initial_carry(NoseHooverChain(1.0, 0.2, chain_length=4), system, state)
    assert isinstance(carry.state.thermostat, NoseHooverChainState)
    assert carry.state.thermostat.xi.shape == (4,)
    assert initial_carry(Bussi(1.0, 0.2), system, state).state.thermostat.shape == ()
    assert initial_carry(VelocityVerlet(), system, state).state.thermostat == ()


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"Langevin: `kT` must be finite and >= 0.*got -1.0"):
        Langevin(-1.0, 1.0)
    with pytest.raises(ValueError, match=r"Langevin: `friction` must be finite and >= 0"):
        Langevin(1.0, -0.5)
    with pytest.raises(ValueError, match=r"NoseHooverChain: `kT` must be finite and > 0.*got -0.5"):
        NoseHooverChain(-0.5, 0.1)
    with pytest.raises(ValueError, match=r"NoseHooverChain: `tau` must be finite and > 0.*got 0.0"):
        NoseHooverChain(1.0, 0.0)
    with pytest.raises(ValueError, match=r"NoseHooverChain: `chain_length` must be an int >= 1, got 0"):
        NoseHooverChain(1.0, 0.1, chain_length=0)
    with pytest.raises(TypeError, match=r"NoseHooverChain: `chain_length` must be a Python int"):
        NoseHooverChain(1.0, 0.1, chain_length=2.0)
    with pytest.raises(ValueError, match=r"`suzuki_yoshida` must be 1, 3 or 5, got 2"):
        NoseHooverChain(1.0, 0.1, suzuki_yoshida=2)
    with pytest.raises(ValueError, match=r"Bussi: `tau` must be finite and > 0.*got -1.0"):
        Bussi(1.0, -1.0)
    with pytest.raises(ValueError, match=r"Bussi: `kT` must be finite and >= 0.*got -2.0"):
        Bussi(-2.0, 1.0)
    with pytest.raises(ValueError, match=r"Bussi: `degrees_of_freedom` must be an int >= 1, got 0"):
        Bussi(1.0, 1.0, degrees_of_freedom=0)
    with pytest.raises(ValueError, match=r"Bussi: `kT` must be a scalar"):
        Bussi(jnp.ones(2), 1.0)


def test_wrong_system_or_thermostat_state():
    system, state = liquid(3, density=0.5)
    with pytest.raises(TypeError, match=r"VelocityVerlet steps a sciax.md.MDSystem.*got Lorenz"):
        sciax.simulate(sciax.systems.Lorenz(), jnp.ones(3), integrator=VelocityVerlet(), dt=0.01, n_steps=2)
    bussi_state = Bussi(1.0, 0.2).init(system, 0.0, state, None).state
    with pytest.raises(TypeError, match=r"NoseHooverChain: `state.thermostat` must be \(\) \(a new run\) or a "
                                        r"NoseHooverChainState"):
        NoseHooverChain(1.0, 0.2).init(system, 0.0, bussi_state, None)
    with pytest.raises(TypeError, match=r"VelocityVerlet: `state.thermostat` must be \(\)"):
        VelocityVerlet().init(system, 0.0, bussi_state, None)
