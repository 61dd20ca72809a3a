"""The LAMMPS `in.lj` molecular-dynamics workload, defined once and shared by the `md` suite, its
baselines (`md_*.py`) and `tests/test_md_baselines.py`.

Lennard-Jones liquid in reduced units (ε = σ = m = 1): an fcc crystal at number density
ρ* = 0.8442 with velocities for T* = 3.0 (it melts within the first few hundred steps), pair
potential

    φ(r) = 4 ε [(σ/r)^12 − (σ/r)^6]   for r < r_c = 2.5 σ,   0 otherwise

(hard truncation: no energy or force shift, no tail correction), Verlet neighbour list with a
skin of 0.3 σ rebuilt when a particle has moved more than skin/2 since the last build, NVE
velocity Verlet with dt = 0.005 τ. Every implementation starts from the same positions and
velocities:

- N = 4,000 and 32,000: `benchmarks/data/lammps_inlj/fcc_<N>.npz` (arrays `x`, `v`, `L`),
  the fcc lattice of LAMMPS' in.lj (10^3 and 20^3 unit cells) with velocities for T* = 3.0
  (zero total momentum, T computed with 3N − 3 degrees of freedom);
- N = 256,000: the 32,000-atom lattice replicated 2 x 2 x 2 (box 2 L), with new velocities
  drawn from N(0, 1) with `numpy.random.default_rng(SEED_256K)`, total momentum removed and
  scaled to T* = 3.0 exactly (3N − 3 degrees of freedom).

Step-0 reference (LAMMPS, the in.lj lattice): potential energy −6.7733681 per atom, pressure
−3.7033504 (virial plus kinetic, T* = 3.0).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

DENSITY = 0.8442
TEMPERATURE = 3.0
EPSILON = 1.0
SIGMA = 1.0
MASS = 1.0
CUTOFF = 2.5
SKIN = 0.3
DT = 0.005
SIZES = (4_000, 32_000, 256_000)
QUICK_SIZES = (4_000, 32_000)
SEED_256K = 20_261_128

# LAMMPS' thermo output at step 0 of in.lj (the same lattice, T* = 3.0).
REFERENCE_POTENTIAL_ENERGY_PER_ATOM = -6.7733681
REFERENCE_PRESSURE = -3.7033504

# BENCH_MD_DATA overrides the folder (e.g. a copy outside the checkout).
DATA_DIR = Path(os.environ.get("BENCH_MD_DATA") or Path(__file__).resolve().parent.parent / "data" / "lammps_inlj")


def _load_npz(n_atoms: int):
    path = DATA_DIR / f"fcc_{n_atoms}.npz"
    if not path.exists():
        raise FileNotFoundError(f"the in.lj start state for N={n_atoms} is missing: expected {path}")
    with np.load(path) as data:
        return (np.asarray(data["x"], np.float64), np.asarray(data["v"], np.float64),
                float(data["L"]))


def thermal_velocities(n_atoms: int, temperature: float, seed: int) -> np.ndarray:
    """(N, 3) velocities: N(0, 1) draws, total momentum removed, scaled so that
    T = Σ m v² / (3N − 3) equals `temperature` exactly (unit masses, reduced units)."""
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((n_atoms, 3))
    v -= v.mean(axis=0)
    v *= np.sqrt(temperature * 3 * (n_atoms - 1) / np.sum(v * v))
    return v


def start_state(n_atoms: int, dtype=np.float64) -> tuple[np.ndarray, np.ndarray, float]:
    """(positions (N, 3), velocities (N, 3), box length L) of the in.lj start, in `dtype`.

    Positions lie in [0, L). N is 4,000, 32,000 or 256,000 (the module docstring says where each
    comes from).
    """
    if n_atoms in (4_000, 32_000):
        x, v, box = _load_npz(n_atoms)
    elif n_atoms == 256_000:
        x32, _, box32 = _load_npz(32_000)
        shifts = box32 * np.array([(a, b, c) for a in range(2) for b in range(2) for c in range(2)],
                                  dtype=np.float64)
        x = (x32[None, :, :] + shifts[:, None, :]).reshape(-1, 3)
        box = 2 * box32
        v = thermal_velocities(n_atoms, TEMPERATURE, SEED_256K)
    else:
        raise ValueError(f"n_atoms must be one of {SIZES} (the in.lj sizes), got {n_atoms}")
    dtype = np.dtype(dtype)
    return x.astype(dtype), v.astype(dtype), box


def kinetic_energy(velocities) -> float:
    """Σ ½ m v² (unit masses), accumulated in float64."""
    v = np.asarray(velocities, np.float64)
    return 0.5 * MASS * float(np.sum(v * v))


def temperature(velocities) -> float:
    """T* = 2 K / (3N − 3): the LAMMPS convention (momentum conserved)."""
    n = len(velocities)
    return 2 * kinetic_energy(velocities) / (3 * n - 3)


def pressure(box_length: float, kinetic: float, virial_trace: float) -> float:
    """P = (2K + tr W) / (3V), V = L³, W_ab = Σ_pairs r_a f_b: LAMMPS' pressure (its kinetic term
    is dof·T = 2K)."""
    return (2 * kinetic + virial_trace) / (3 * box_length**3)


def wrap(positions: np.ndarray, box_length: float) -> np.ndarray:
    """Positions mapped into [0, L) (strictly below L even after rounding)."""
    x = np.mod(positions, box_length)
    return np.where(x >= box_length, x - box_length, x)
