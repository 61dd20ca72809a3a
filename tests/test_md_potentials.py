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
    result, nbrs = build_and_compute(system, x)
    assert int(nbrs.overflow) == 0
    return result


@eqx.filter_jit
def build_and_compute(system, x):
    """One compiled program per system: the neighbours at x, and the energy, forces and virial."""
    nbrs = system.build_neighbours(x)
    return system.compute(x, nbrs), nbrs


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


# Every case runs with AllPairs (the pair function of each potential, shift and mixing rule).
# CellList and VerletList share the listed pair sums (`pair_sums_listed`) and differ only in the
# build: the Verlet list keeps the dense and dilute geometries, the species lookup (a mixture) and
# Morse (the program test_morse_equals_ase[dense-verlet] reuses), the cell list the two geometries;
# the other listed cases repeat a pair function that AllPairs checks.
LISTED = {"verlet": ("lj-dense-energy", "lj-dilute-force", "lj-mixture-table", "morse-dense"),
          "cell": ("lj-dense-plain", "lj-dilute-force")}


def _sums_params():
    for case in CASES:
        for strategy in STRATEGIES:
            if strategy == "all" or case in LISTED[strategy]:
                yield pytest.param(case, strategy, id=f"{case}-{strategy}")
            else:  # covered by [<case>-all] (its pair function) and the kept listed cases (the listed sums)
                yield pytest.param(case, strategy, id=f"{case}-{strategy}", marks=pytest.mark.slow)


@pytest.mark.parametrize("case, strategy", list(_sums_params()))
def test_sums_equal_numpy_reference(case, strategy):
    make, reference, kind = CASES[case]
    x, box = case_configuration(kind)
    species = None
    if "mixture" in case:
        species = np.random.default_rng(1).integers(0, 2, len(x)).astype(np.int32)
    result = sciax_sums(make(), x, box, STRATEGIES[strategy], species)
    phi, dphi = reference()
    assert_close(result, reference_sums(x, box, phi, dphi, species))


def _ase_params():
    """ASE's conventions (shift, stress sign) are checked with AllPairs on both configurations and
    with the Verlet list on the dense one (the compiled sums of test_sums_equal_numpy_reference's
    dense cases, same potential and capacities); the listed sums of both strategies against the
    NumPy reference are test_sums_equal_numpy_reference's."""
    for kind in ("dense", "dilute"):
        for strategy in STRATEGIES:
            if strategy == "all" or (kind, strategy) == ("dense", "verlet"):
                yield pytest.param(kind, strategy, id=f"{kind}-{strategy}")
            else:  # covered by [<kind>-all] here and test_sums_equal_numpy_reference[...-<strategy>]
                yield pytest.param(kind, strategy, id=f"{kind}-{strategy}", marks=pytest.mark.slow)


@pytest.mark.parametrize("kind, strategy", list(_ase_params()))
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


@pytest.mark.parametrize("kind, strategy", list(_ase_params()))
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


@pytest.mark.parametrize("strategy", [
    # covered by [verlet] (LAMMPS's values) and test_sums_equal_numpy_reference[...-cell] (the cell list's sums)
    pytest.param("cell", marks=pytest.mark.slow),
    "verlet",
])
def test_lammps_in_lj_start(strategy):
    """LAMMPS `thermo` at step 0 of in.lj: PE/atom −6.7733681, pressure −3.7033504 (LAMMPS's
    pressure is (2K + tr W) / 3V with K from every atom: its 3N − 3 dof enter T and leave again)."""
    data = np.load("benchmarks/data/lammps_inlj/fcc_4000.npz")
    x, v, box = jnp.asarray(data["x"]), jnp.asarray(data["v"]), float(data["L"])
    n = len(x)
    neighbours = md.CellList() if strategy == "cell" else md.VerletList(skin=0.3)
    system = md.MDSystem(md.Box(box), md.LennardJones(1.0, 1.0, 2.5), jnp.ones(n), neighbours=neighbours)
    result, nbrs = build_and_compute(system.allocate(x), x)
    assert int(nbrs.overflow) == 0
    assert abs(float(result.energy) / n - (-6.7733681)) < 5e-8
    assert abs(float(system.pressure(md.MDState(x, v), result)) - (-3.7033504)) < 5e-8


def test_forces_are_minus_gradient_and_pressure_is_volume_derivative():
    """F = −∇U (jax.grad of the all-pairs energy) for every enumeration, and the virial pressure
    P_vir = tr W / 3V equals −∂U/∂V by central differences of a uniform scaling of box and positions."""
    x, box = lattice_configuration(4, 0.8442, seed=5, jiggle=0.08)
    x = jnp.asarray(x)
    potential = md.LennardJones(1.0, 1.0, 2.2, "force") + md.Morse(0.3, 2.0, 1.2, 2.0, "force")  # continuous U
    reference = md.MDSystem(md.Box(box), potential, jnp.ones(len(x)), neighbours=md.AllPairs())
    gradient = jax.jit(jax.grad(reference.potential_energy))(x)
    for strategy in STRATEGIES.values():
        system = md.MDSystem(md.Box(box), potential, jnp.ones(len(x)), neighbours=strategy).allocate(x)
        result, nbrs = build_and_compute(system, x)
        np.testing.assert_allclose(np.asarray(result.forces), -np.asarray(gradient), rtol=0, atol=1e-12)
        # float64 in, float64 out (test_float32_and_float64_keep_their_dtype checks float32)
        assert result.energy.dtype == result.forces.dtype == result.virial.dtype == jnp.float64
        assert nbrs.reference_positions.dtype == jnp.float64

    @jax.jit
    def energy_at(scale):
        system = md.MDSystem(md.Box(box * scale), potential, jnp.ones(len(x)), neighbours=md.AllPairs())
        return system.potential_energy(x * scale)

    h = 1e-5
    volume = box**3
    dU_dV = float(energy_at((1 + h) ** (1 / 3)) - energy_at((1 - h) ** (1 / 3))) / (2 * h * volume)
    virial = jax.jit(lambda q: reference.virial(q))(x)
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


def test_gradients_finite_at_the_cutoff_and_padded_slots_and_match_finite_differences():
    """A pair exactly at the cutoff, one just across it, and a Verlet list with empty (padded)
    slots: gradients of U w.r.t. ε, σ and positions are finite and equal central differences
    (force-shifted LJ: U and its first derivatives are continuous, so differences apply)."""
    rc = 2.0
    x = jnp.array([[1.0, 1.0, 1.0], [1.0 + rc, 1.0, 1.0], [1.0, 1.0 + rc + 1e-9, 1.0], [4.0, 4.0, 2.0],
                   [5.1, 4.2, 2.3], [2.5, 5.5, 5.0], [6.2, 3.0, 6.5], [3.0, 6.5, 3.5]])
    box = md.Box(7.5)

    def energy(params, positions, strategy):
        eps, sig = params
        system = md.MDSystem(box, md.LennardJones(eps, sig, rc, "force"), jnp.ones(len(x)), neighbours=strategy)
        return system.compute(positions, system.build_neighbours(positions)).energy

    verlet = md.MDSystem(box, md.LennardJones(1.0, 1.0, rc), jnp.ones(len(x)),
                         neighbours=md.VerletList(skin=0.2)).allocate(x).neighbours
    assert verlet.capacity > 3  # padded slots exist
    params = (jnp.asarray(0.9), jnp.asarray(1.05))

    def moved(i, a, step):  # x.at[i, a].add(step): the same float64 sum, on the host instead of eagerly in JAX
        y = np.array(x)
        y[i, a] += step
        return jnp.asarray(y)

    for strategy in (md.AllPairs(), verlet):
        # one compiled program gives the gradients and the energies of the differences
        value_and_grad = jax.jit(jax.value_and_grad(lambda p, q, s=strategy: energy(p, q, s), argnums=(0, 1)))

        def f(p, q, value_and_grad=value_and_grad):
            return value_and_grad(p, q)[0]

        g_params, g_x = value_and_grad(params, x)[1]
        assert all(np.isfinite(float(g)) for g in g_params) and np.all(np.isfinite(g_x))
        h = 1e-6
        for k in range(2):
            up = tuple(p + h * (i == k) for i, p in enumerate(params))
            down = tuple(p - h * (i == k) for i, p in enumerate(params))
            np.testing.assert_allclose(float(g_params[k]), float(f(up, x) - f(down, x)) / (2 * h), rtol=1e-7)
        # φ'' jumps at the cutoff, so there the central difference errs by O(h φ''): h = 1e-7, atol 1e-7
        h = 1e-7
        for i, a in [(0, 0), (1, 0), (2, 1), (4, 2)]:
            fd = float(f(params, moved(i, a, h)) - f(params, moved(i, a, -h))) / (2 * h)
            np.testing.assert_allclose(float(g_x[i, a]), fd, rtol=1e-6, atol=1e-7)
    # second derivatives through the jvp of the pair function stay finite too
    hessian_row = jax.jit(jax.grad(lambda p: jax.grad(energy, argnums=1)(params, p, md.AllPairs())[0, 0]))(x)
    assert np.all(np.isfinite(hessian_row))
    # the pair energy itself: exactly 0 at and beyond the cutoff, finite zero gradients there
    lj = md.LennardJones(1.0, 1.0, rc)
    r = jnp.array([rc, rc + 1.0, jnp.inf, 0.0 + rc * 0.5])
    energies = jax.jit(lambda d: lj.pair_energy(d))(r)
    assert float(energies[0]) == 0.0 and float(energies[1]) == 0.0
    grads = jax.jit(jax.vmap(jax.grad(lj.pair_energy)))(r)
    assert float(grads[0]) == 0.0 and float(grads[1]) == 0.0 and float(grads[2]) == 0.0


@pytest.mark.parametrize("dtype", [
    jnp.dtype("float32"),
    # covered by test_forces_are_minus_gradient_and_pressure_is_volume_derivative (LJ + Morse, every strategy,
    # float64 dtypes) and test_sums_equal_numpy_reference (float64 sums to 1e-10)
    pytest.param(jnp.dtype("float64"), marks=pytest.mark.slow),
], ids=["float32", "float64"])
def test_float32_and_float64_keep_their_dtype(dtype):
    x, box = lattice_configuration(3, 0.8442, seed=6)
    x = jnp.asarray(x, dtype)
    box = float(jnp.asarray(box, dtype))
    (lj, dlj), (morse, dmorse) = lj_reference(1.0, 1.0, 2.0), morse_reference(0.5, 2.0, 1.2, 2.0, "energy")
    reference = reference_sums(np.asarray(x, np.float64), box, lambda r, a, b: lj(r, a, b) + morse(r, a, b),
                               lambda r, a, b: dlj(r, a, b) + dmorse(r, a, b))
    for strategy in STRATEGIES.values():
        potential = md.LennardJones(cutoff=2.0) + md.Morse(0.5, 2.0, 1.2, 2.0, "energy")
        system = md.MDSystem(md.Box(jnp.asarray(box, dtype)), potential, jnp.ones(len(x), dtype),
                             neighbours=strategy).allocate(x)
        result, nbrs = build_and_compute(system, x)
        assert result.energy.dtype == result.forces.dtype == result.virial.dtype == dtype
        assert nbrs.reference_positions.dtype == dtype
        # float32 arithmetic (the reference is float64 from the same rounded positions)
        assert_close(result, reference, rtol=1e-10 if dtype == jnp.float64 else 2e-5)


def test_bonds_and_kremer_grest_chains():
    """Harmonic and FENE bonds against a NumPy sum; a Kremer–Grest chain (FENE k=30, R0=1.5 plus WCA
    between all pairs) has forces −∇U and its virial equals the sum of b ⊗ f over bonds and pairs."""
    rng = np.random.default_rng(7)
    n, box = 24, 8.0
    walk = [np.full(3, box / 2)]
    while len(walk) < n:  # a self-avoiding random walk of bond length 0.97
        step = rng.normal(0, 1, 3)
        trial = walk[-1] + 0.97 * step / np.linalg.norm(step)
        d = np.asarray(walk) - trial
        d -= box * np.round(d / box)
        if np.min(np.sum(d * d, 1)) > 0.9**2:
            walk.append(trial)
    x = np.asarray(walk) % box
    bonds = np.stack([np.arange(n - 1), np.arange(1, n)], 1)
    k_values = rng.uniform(10, 20, n - 1)
    harmonic = md.HarmonicBond(bonds, jnp.asarray(k_values), 1.0)
    fene = md.FENEBond(bonds, k=30.0, r0=1.5)
    b = x[bonds[:, 0]] - x[bonds[:, 1]]
    b -= box * np.round(b / box)
    r = np.linalg.norm(b, axis=1)
    for term, energy, dphi in [
        (harmonic, 0.5 * k_values * (r - 1.0) ** 2, k_values * (r - 1.0)),
        (fene, -0.5 * 30 * 1.5**2 * np.log(1 - (r / 1.5) ** 2), 30 * r / (1 - (r / 1.5) ** 2)),
    ]:
        system = md.MDSystem(md.Box(box), term, jnp.ones(n))
        result = build_and_compute(system, jnp.asarray(x))[0]
        fij = -(dphi / r)[:, None] * b
        forces = np.zeros_like(x)
        np.add.at(forces, bonds[:, 0], fij)
        np.add.at(forces, bonds[:, 1], -fij)
        assert_close(result, (energy.sum(), forces, np.einsum("pa,pb->ab", b, fij)))
    chain = md.MDSystem(md.Box(box), md.FENEBond(bonds, k=30.0, r0=1.5) + md.WCA(1.0, 1.0), jnp.ones(n),
                        neighbours=md.VerletList(skin=0.3)).allocate(jnp.asarray(x))
    xj = jnp.asarray(x)
    result = build_and_compute(chain, xj)[0]
    # U and the sum of b ⊗ f by all pairs (as test_forces_are_minus_gradient_and_pressure_is_volume_derivative's
    # reference), in one program
    wca_only = md.MDSystem(md.Box(box), md.WCA(), jnp.ones(n))
    fene_only = md.MDSystem(md.Box(box), fene, jnp.ones(n))
    assert isinstance(wca_only.neighbours, md.AllPairs) and isinstance(fene_only.neighbours, md.AllPairs)
    gradient, virial = jax.jit(lambda q: (jax.grad(lambda y: wca_only.potential_energy(y)
                                                   + fene_only.potential_energy(y))(q),
                                          wca_only.virial(q) + fene_only.virial(q)))(xj)
    scale = float(jnp.max(jnp.abs(result.forces)))
    np.testing.assert_allclose(result.forces, -gradient, rtol=0, atol=1e-13 * scale)
    np.testing.assert_allclose(result.virial, virial, rtol=1e-12)
    wca = md.WCA(1.0, 1.0)
    assert float(wca.cutoff) == pytest.approx(2 ** (1 / 6))
    assert float(wca.pair_energy(jnp.asarray(1.0))) == pytest.approx(1.0)  # 4(1 - 1) + ε


def test_box_wrap_unwrap_and_minimum_image():
    box = md.Box(jnp.array([3.0, 4.0, 5.0]))
    x = jnp.array([[-0.5, 4.5, 12.0], [3.0, 0.0, -10.0]])
    wrapped, images = box.wrap(x)
    np.testing.assert_allclose(wrapped, [[2.5, 0.5, 2.0], [0.0, 0.0, 0.0]], atol=1e-15)
    np.testing.assert_array_equal(images, [[-1, 1, 2], [1, 0, -2]])
    assert images.dtype == jnp.int32
    np.testing.assert_allclose(box.unwrap(wrapped, images), x, atol=1e-14)
    np.testing.assert_allclose(box.displacement(jnp.array([0.1, 0.1, 0.1]), jnp.array([2.9, 3.9, 4.9])),
                               [0.2, 0.2, 0.2], atol=1e-14)
    assert float(box.volume) == 60.0
    free = md.FreeSpace()
    assert float(free.volume) == np.inf
    np.testing.assert_array_equal(free.wrap(x)[0], x)
    # FreeSpace: all pairs, plain displacements; pressure is refused
    system = md.MDSystem(free, md.LennardJones(cutoff=2.5), jnp.ones(2))
    y = jnp.array([[0.0, 0.0, 0.0], [1.2, 0.0, 0.0]])
    assert float(system.potential_energy(y)) == pytest.approx(4 * (1.2**-12 - 1.2**-6))
    with pytest.raises(ValueError, match="periodic Box"):
        system.pressure(md.MDState(y, jnp.zeros_like(y)))


def test_bad_input_is_refused_with_a_message_naming_the_argument():
    x, box = lattice_configuration(3, 0.8442, seed=8)
    x = jnp.asarray(x)
    n = len(x)
    lj = md.LennardJones(cutoff=2.0)
    verlet = md.VerletList(skin=0.3)
    with pytest.raises(ValueError, match="`positions` must lie inside the box"):
        md.MDSystem(md.Box(box), lj, jnp.ones(n), neighbours=verlet).allocate(x.at[3, 1].set(box + 0.1))
    with pytest.raises(ValueError, match=r"cutoff \+ skin \(3.4\) must be below half the smallest box length"):
        md.MDSystem(md.Box(box), md.LennardJones(cutoff=3.1), jnp.ones(n), neighbours=verlet)
    with pytest.raises(ValueError, match=r"the cutoff \(2.5\) must be below half"):
        md.MDSystem(md.Box(4.0), md.LennardJones(cutoff=2.5), jnp.ones(3))
    with pytest.raises(ValueError, match=r"`species` must be an int array of shape \(108,\)"):
        md.MDSystem(md.Box(box), lj, jnp.ones(n), species=jnp.zeros(n - 1, jnp.int32))
    with pytest.raises(ValueError, match=r"`species` must be in \[0, 2\)"):
        md.MDSystem(md.Box(box), md.LennardJones(jnp.ones(2), jnp.ones(2)), jnp.ones(n),
                    species=jnp.full(n, 2, jnp.int32))
    with pytest.raises(ValueError, match="`masses` must be positive and finite, got 0.0 for particle 4"):
        md.MDSystem(md.Box(box), lj, jnp.ones(n).at[4].set(0.0))
    with pytest.raises(ValueError, match="`masses` must be positive and finite, got -1.0"):
        md.MDSystem(md.Box(box), lj, -jnp.ones(n))
    system = md.MDSystem(md.Box(box), lj, jnp.ones(n), neighbours=verlet)
    with pytest.raises(ValueError, match=r"`positions` holds NaN or Inf \(particle 7"):
        system.allocate(x.at[7, 2].set(jnp.nan))
    with pytest.raises(ValueError, match="`positions` holds NaN"):
        system.allocate(x).build_neighbours(x.at[7, 2].set(jnp.nan))
    with pytest.raises(md._system.StateMismatchError, match=r"`positions` must have shape \(N, d\) = \(108, 3\)"):
        system.allocate(x[:5])
    with pytest.raises(ValueError, match="`state.positions` must lie inside the box"):
        system.check_state(md.MDState(x.at[0, 0].set(-0.1), jnp.zeros_like(x)))
    with pytest.raises(md._system.StateMismatchError, match=r"state.velocities must have shape \(N, d\)"):
        system.check_state(md.MDState(x, jnp.zeros((n, 2))))
    system.check_state(md.MDState(x, jnp.zeros_like(x)))
    with pytest.raises(ValueError, match="`FENEBond.bonds` refers to particle 108"):
        md.MDSystem(md.Box(box), md.FENEBond(jnp.array([[0, 1], [107, 108]])), jnp.ones(n))
    with pytest.raises(ValueError, match=r"`bonds` must be an integer array of shape \(M, 2\)"):
        md.HarmonicBond(jnp.array([0, 1, 2]), 1.0, 1.0)
    with pytest.raises(ValueError, match="`shift` must be one of"):
        md.LennardJones(shift="smooth")
    with pytest.raises(ValueError, match="`sigma` must be positive"):
        md.LennardJones(sigma=-1.0)
    with pytest.raises(ValueError, match="different numbers of species"):
        md.LennardJones(jnp.ones(2), jnp.ones(3))
    with pytest.raises(ValueError, match="`lengths` must be positive and finite"):
        md.Box(jnp.array([1.0, -2.0, 3.0]))
    with pytest.raises(TypeError, match="`potential` must be a pair potential"):
        md.MDSystem(md.Box(box), "lj", jnp.ones(n))
