"""sciax.md pair and bonded potentials: energies, forces and virials against an independent
float64 NumPy sum, ASE's calculators and LAMMPS; derivatives, tail corrections, dtypes, errors."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import quad

from sciax import md

STRATEGIES = {"all": md.AllPairs(), "cell": md.CellList(), "verlet": md.VerletList(skin=0.2)}


def configuration(n, density, seed, min_distance=0.85):
    """Random periodic positions with no pair closer than `min_distance` (rejection sampling)."""
    rng = np.random.default_rng(seed)
    box = (n / density) ** (1 / 3)
    x = np.empty((0, 3))
    while len(x) < n:
        p = rng.uniform(0, box, 3)
        d = x - p
        d -= box * np.round(d / box)
        if len(x) == 0 or np.min(np.sum(d * d, 1)) > min_distance**2:
            x = np.vstack([x, p])
    return x, box


def lattice_configuration(cells, density, seed, jiggle=0.05):
    """A jiggled fcc crystal (dense): 4 cells³ particles."""
    a = (4 / density) ** (1 / 3)
    basis = np.array([[0, 0, 0], [0.5, 0.5, 0], [0.5, 0, 0.5], [0, 0.5, 0.5]])
    grid = np.stack(np.meshgrid(*[np.arange(cells)] * 3, indexing="ij"), -1).reshape(-1, 3)
    x = ((grid[:, None, :] + basis[None]) * a).reshape(-1, 3)
    x += np.random.default_rng(seed).normal(0, jiggle, x.shape)
    box = cells * a
    return x % box, box


def reference_sums(x, box, phi, dphi, species=None):
    """Independent float64 reference: every pair i < j once, explicit minimum image; `phi(r, si, sj)`
    and `dphi` its derivative in r (written out by hand here). Returns energy, forces, virial."""
    n = len(x)
    i, j = np.triu_indices(n, 1)
    d = x[i] - x[j]
    d -= box * np.round(d / box)
    r = np.sqrt(np.sum(d * d, 1))
    si = np.zeros(n, int) if species is None else species
    e = phi(r, si[i], si[j])
    g = dphi(r, si[i], si[j])
    fij = -(g / r)[:, None] * d  # force on i from j
    forces = np.zeros_like(x)
    np.add.at(forces, i, fij)
    np.add.at(forces, j, -fij)
    virial = np.einsum("pa,pb->ab", d, fij)
    return e.sum(), forces, virial


def shifted_reference(bare, dbare, rc, shift):
    """phi(r) and dphi/dr with the cutoff and shift, from the bare function and its hand-written derivative."""

    def phi(r, si, sj):
        out = bare(r, si, sj)
        if shift in ("energy", "force"):
            out = out - bare(rc, si, sj)
        if shift == "force":
            out = out - (r - rc) * dbare(rc, si, sj)
        return np.where(r < rc, out, 0.0)

    def dphi(r, si, sj):
        out = dbare(r, si, sj)
        if shift == "force":
            out = out - dbare(rc, si, sj)
        return np.where(r < rc, out, 0.0)

    return phi, dphi


def lj_reference(eps, sig, rc, shift="none"):
    def params(si, sj):
        e, s = np.asarray(eps, float), np.asarray(sig, float)
        if e.ndim == 0:
            return e, s
        if e.ndim == 2:
            return e[si, sj], s[si, sj]
        return np.sqrt(e[si] * e[sj]), 0.5 * (s[si] + s[sj])

    def bare(r, si, sj):
        e, s = params(si, sj)
        return 4 * e * ((s / r) ** 12 - (s / r) ** 6)

    def dbare(r, si, sj):
        e, s = params(si, sj)
        return 4 * e * (-12 * s**12 / r**13 + 6 * s**6 / r**7)

    return shifted_reference(bare, dbare, rc, shift)


def morse_reference(depth, alpha, r0, rc, shift="none"):
    def bare(r, si, sj):
        e = np.exp(-alpha * (r - r0))
        return depth * (e * e - 2 * e)

    def dbare(r, si, sj):
        e = np.exp(-alpha * (r - r0))
        return depth * (-2 * alpha * e * e + 2 * alpha * e)

    return shifted_reference(bare, dbare, rc, shift)


def soft_reference(eps, sig, n, rc, shift="energy"):
    return shifted_reference(lambda r, a, b: eps * (sig / r) ** n, lambda r, a, b: -n * eps * sig**n / r ** (n + 1),
                             rc, shift)


def sciax_sums(potential, x, box, strategy, species=None, dtype=jnp.float64):
    x = jnp.asarray(x, dtype)
    system = md.MDSystem(md.Box(jnp.asarray(box, dtype)), potential, jnp.ones(len(x), dtype), species=species,
                         neighbours=strategy).allocate(x)
    nbrs = system.build_neighbours(x)
    assert int(nbrs.overflow) == 0
    return eqx.filter_jit(lambda s, p, nb: s.compute(p, nb))(system, x, nbrs)


def assert_close(result, reference, rtol=1e-10):
    energy, forces, virial = reference
    np.testing.assert_allclose(float(result.energy), energy, rtol=rtol)
    np.testing.assert_allclose(np.asarray(result.forces), forces, rtol=0, atol=rtol * np.max(np.abs(forces)))
    np.testing.assert_allclose(np.asarray(result.virial), virial, rtol=0, atol=rtol * np.max(np.abs(virial)))


CASES = {
    "lj-dense-plain": (lambda: md.LennardJones(cutoff=2.2), lambda: lj_reference(1.0, 1.0, 2.2), "dense"),
    "lj-dense-energy": (lambda: md.LennardJones(1.3, 0.9, 2.2, "energy"),
                        lambda: lj_reference(1.3, 0.9, 2.2, "energy"), "dense"),
    "lj-dilute-force": (lambda: md.LennardJones(0.7, 1.1, 2.5, "force"),
                        lambda: lj_reference(0.7, 1.1, 2.5, "force"), "dilute"),
    "lj-mixture-lorentz-berthelot": (lambda: md.LennardJones(jnp.array([1.0, 0.5]), jnp.array([1.0, 0.88]), 2.2,
                                                             "energy"),
                                     lambda: lj_reference([1.0, 0.5], [1.0, 0.88], 2.2, "energy"), "dense"),
    "lj-mixture-table": (lambda: md.LennardJones(jnp.array([[1.0, 1.5], [1.5, 0.5]]),
                                                 jnp.array([[1.0, 0.8], [0.8, 0.88]]), 2.2),
                         lambda: lj_reference([[1.0, 1.5], [1.5, 0.5]], [[1.0, 0.8], [0.8, 0.88]], 2.2), "dense"),
    "morse-dense": (lambda: md.Morse(0.8, 3.0, 1.1, 2.2), lambda: morse_reference(0.8, 3.0, 1.1, 2.2), "dense"),
    "morse-dilute-energy": (lambda: md.Morse(0.8, 3.0, 1.1, 2.5, "energy"),
                            lambda: morse_reference(0.8, 3.0, 1.1, 2.5, "energy"), "dilute"),
    "soft-sphere": (lambda: md.SoftSphere(1.2, 1.0, 9.0, 2.2), lambda: soft_reference(1.2, 1.0, 9.0, 2.2), "dense"),
}


def case_configuration(kind, seed=0):
    if kind == "dense":  # a jiggled fcc crystal at the in.lj density: 4 * 4^3 = 256 particles
        return lattice_configuration(4, 0.8442, seed)
    return configuration(120, 0.12, seed)  # dilute random gas, box 10.0


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("case", list(CASES))
def test_sums_equal_numpy_reference(case, strategy):
    make, reference, kind = CASES[case]
    x, box = case_configuration(kind)
    species = None
    if "mixture" in case:
        species = np.random.default_rng(1).integers(0, 2, len(x)).astype(np.int32)
    result = sciax_sums(make(), x, box, STRATEGIES[strategy], species)
    phi, dphi = reference()
    assert_close(result, reference_sums(x, box, phi, dphi, species))


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("kind", ["dense", "dilute"])
def test_lennard_jones_equals_ase(kind, strategy):
    """ASE's LennardJones with smooth=False shifts the energy to zero at rc: shift="energy"."""
    from ase import Atoms
    from ase.calculators.lj import LennardJones as AseLJ

    x, box = case_configuration(kind, seed=3)
    rc = 2.2 if kind == "dense" else 2.5
    atoms = Atoms("Ar" * len(x), positions=x, cell=[box] * 3, pbc=True)
    atoms.calc = AseLJ(epsilon=1.3, sigma=0.9, rc=rc, smooth=False)
    result = sciax_sums(md.LennardJones(1.3, 0.9, rc, "energy"), x, box, STRATEGIES[strategy])
    stress = atoms.get_stress(voigt=False)
    assert_close(result, (atoms.get_potential_energy(), atoms.get_forces(), -stress * box**3))


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("kind", ["dense", "dilute"])
def test_morse_equals_ase(kind, strategy):
    """ASE's MorsePotential always smooths between rcut1 and rcut2 (in units of r0): a window of
    1e-9 with no pair in it makes its cutoff sharp, the plainly truncated Morse (ε = D, ρ₀ = α r₀)."""
    from ase import Atoms
    from ase.calculators.morse import MorsePotential

    x, box = case_configuration(kind, seed=4)
    depth, alpha, r0, rc = 0.8, 3.0, 1.1, 2.2
    i, j = np.triu_indices(len(x), 1)
    d = x[i] - x[j]
    d -= box * np.round(d / box)
    r = np.sqrt(np.sum(d * d, 1))
    assert not np.any((r >= rc) & (r < rc + 1e-8))  # no pair inside ASE's smoothing window
    atoms = Atoms("Ar" * len(x), positions=x, cell=[box] * 3, pbc=True)
    atoms.calc = MorsePotential(epsilon=depth, rho0=alpha * r0, r0=r0, rcut1=rc / r0, rcut2=(rc + 1e-9) / r0)
    result = sciax_sums(md.Morse(depth, alpha, r0, rc), x, box, STRATEGIES[strategy])
    stress = atoms.get_stress(voigt=False)
    assert_close(result, (atoms.get_potential_energy(), atoms.get_forces(), -stress * box**3))


@pytest.mark.parametrize("strategy", ["cell", "verlet"])
def test_lammps_in_lj_start(strategy):
    """LAMMPS `thermo` at step 0 of in.lj: PE/atom −6.7733681, pressure −3.7033504 (LAMMPS's
    pressure is (2K + tr W) / 3V with K from every atom: its 3N − 3 dof enter T and leave again)."""
    data = np.load("benchmarks/data/lammps_inlj/fcc_4000.npz")
    x, v, box = jnp.asarray(data["x"]), jnp.asarray(data["v"]), float(data["L"])
    n = len(x)
    neighbours = md.CellList() if strategy == "cell" else md.VerletList(skin=0.3)
    system = md.MDSystem(md.Box(box), md.LennardJones(1.0, 1.0, 2.5), jnp.ones(n), neighbours=neighbours)
    system = system.allocate(x)
    result = system.compute(x, system.build_neighbours(x))
    assert abs(float(result.energy) / n - (-6.7733681)) < 5e-8
    assert abs(float(system.pressure(md.MDState(x, v), result)) - (-3.7033504)) < 5e-8


def test_forces_are_minus_gradient_and_pressure_is_volume_derivative():
    """F = −∇U (jax.grad of the all-pairs energy) for every enumeration, and the virial pressure
    P_vir = tr W / 3V equals −∂U/∂V by central differences of a uniform scaling of box and positions."""
    x, box = lattice_configuration(4, 0.8442, seed=5, jiggle=0.08)
    x = jnp.asarray(x)
    potential = md.LennardJones(1.0, 1.0, 2.2, "force") + md.Morse(0.3, 2.0, 1.2, 2.0, "force")  # continuous U
    reference = md.MDSystem(md.Box(box), potential, jnp.ones(len(x)), neighbours=md.AllPairs())
    gradient = jax.grad(reference.potential_energy)(x)
    for strategy in STRATEGIES.values():
        system = md.MDSystem(md.Box(box), potential, jnp.ones(len(x)), neighbours=strategy).allocate(x)
        forces = system.compute(x, system.build_neighbours(x)).forces
        np.testing.assert_allclose(np.asarray(forces), -np.asarray(gradient), rtol=0, atol=1e-12)

    @jax.jit
    def energy_at(scale):
        system = md.MDSystem(md.Box(box * scale), potential, jnp.ones(len(x)), neighbours=md.AllPairs())
        return system.potential_energy(x * scale)

    h = 1e-5
    volume = box**3
    dU_dV = float(energy_at((1 + h) ** (1 / 3)) - energy_at((1 - h) ** (1 / 3))) / (2 * h * volume)
    virial = reference.virial(x)
    np.testing.assert_allclose(float(jnp.trace(virial)) / (3 * volume), -dU_dV, rtol=1e-8)


def test_tail_corrections_equal_integrals():
    rc, rho = 2.5, 0.8442
    lj = md.LennardJones(1.3, 0.9, rc)
    phi = lambda r: 4 * 1.3 * ((0.9 / r) ** 12 - (0.9 / r) ** 6)
    dphi = lambda r: 4 * 1.3 * (-12 * 0.9**12 / r**13 + 6 * 0.9**6 / r**7)
    energy = 2 * np.pi * rho * quad(lambda r: r**2 * phi(r), rc, np.inf, epsabs=0, epsrel=1e-13)[0]
    pressure = -2 * np.pi / 3 * rho**2 * quad(lambda r: r**3 * dphi(r), rc, np.inf, epsabs=0, epsrel=1e-13)[0]
    np.testing.assert_allclose(float(lj.tail_energy(rho)), energy, rtol=1e-10)
    np.testing.assert_allclose(float(lj.tail_pressure(rho)), pressure, rtol=1e-10)
    # a mixture: Σ_ab x_a x_b of the pair integrals (Lorentz–Berthelot)
    mix = md.LennardJones(jnp.array([1.0, 0.5]), jnp.array([1.0, 0.8]), rc)
    fractions = np.array([0.3, 0.7])
    total = 0.0
    for a in range(2):
        for b in range(2):
            e, s = np.sqrt([1.0, 0.5][a] * [1.0, 0.5][b]), 0.5 * ([1.0, 0.8][a] + [1.0, 0.8][b])
            integral = quad(lambda r, e=e, s=s: r**2 * 4 * e * ((s / r) ** 12 - (s / r) ** 6), rc, np.inf,
                            epsrel=1e-13)[0]
            total += fractions[a] * fractions[b] * 2 * np.pi * rho * integral
    np.testing.assert_allclose(float(mix.tail_energy(rho, jnp.asarray(fractions))), total, rtol=1e-10)
    with pytest.raises(ValueError, match="shift='none'"):
        md.LennardJones(shift="energy").tail_energy(rho)
    with pytest.raises(ValueError, match="mole_fractions"):
        mix.tail_pressure(rho)
