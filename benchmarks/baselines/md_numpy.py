"""NumPy baseline for the in.lj workload: a Verlet pair list from `scipy.spatial.cKDTree`,
vectorised Lennard-Jones forces, velocity Verlet.

Written as a competent NumPy user would:

- neighbour list: a half list of pairs (i < j) within r_c + skin from
  ``cKDTree(wrapped positions, boxsize=L).query_pairs(r_c + skin, output_type="ndarray")``
  (sorted by i for locality), rebuilt when some particle has moved more than skin/2 since the
  last build (the positions are wrapped into the box at each build);
- forces: minimum-image pair vectors ``d = x_i − x_j − L round((x_i − x_j)/L)``, the pairs
  beyond r_c masked out, f_ij = 24 ε (2 (σ/r)^12 − (σ/r)^6) d / r², accumulated per atom with
  ``np.bincount`` (which sums in float64 whatever the input; the result is cast back to the
  working dtype);
- velocity Verlet: v += ½ dt f/m; x += dt v; rebuild if needed; f = F(x); v += ½ dt f/m.

Every array follows the dtype of the start state (float32 or float64); cKDTree itself works in
float64 (its input is converted at each build).
"""

from __future__ import annotations

import numpy as np
from scipy.spatial import cKDTree

from . import md_workload as wl


def build_pairs(positions: np.ndarray, box_length: float, radius: float) -> np.ndarray:
    """(P, 2) int64 pairs (i < j) within `radius` under periodic boundaries, sorted by i.
    `positions` must lie in [0, L)."""
    tree = cKDTree(np.asarray(positions, np.float64), boxsize=box_length)
    pairs = tree.query_pairs(radius, output_type="ndarray")
    pairs = np.sort(pairs, axis=1)
    return pairs[np.argsort(pairs[:, 0], kind="stable")]


def lj_forces(positions: np.ndarray, pairs: np.ndarray, box_length: float, cutoff: float = wl.CUTOFF,
              epsilon: float = wl.EPSILON, sigma: float = wl.SIGMA):
    """(potential energy, forces (N, 3), virial trace Σ r·f) over the pairs of `pairs` closer
    than `cutoff` (hard truncation), minimum image. Energy and virial are float64 scalars."""
    dtype = positions.dtype
    i, j = pairs[:, 0], pairs[:, 1]
    d = positions[i] - positions[j]
    d -= dtype.type(box_length) * np.round(d / dtype.type(box_length))
    r2 = np.einsum("pk,pk->p", d, d)
    inside = r2 < dtype.type(cutoff * cutoff)
    d, r2, i, j = d[inside], r2[inside], i[inside], j[inside]
    s2 = dtype.type(sigma * sigma) / r2
    s6 = s2 * s2 * s2
    energy = float(np.sum(dtype.type(4 * epsilon) * s6 * (s6 - dtype.type(1)), dtype=np.float64))
    scale = dtype.type(24 * epsilon) * s6 * (dtype.type(2) * s6 - dtype.type(1)) / r2
    fd = d * scale[:, None]
    n = len(positions)
    forces = np.empty_like(positions)
    for k in range(3):
        forces[:, k] = np.bincount(i, fd[:, k], minlength=n) - np.bincount(j, fd[:, k], minlength=n)
    virial = float(np.sum(fd * d, dtype=np.float64))
    return energy, forces, virial


class NumpyLJ:
    """The in.lj NVE run in NumPy. `run(n_steps)` starts from the given state every time.

    **Arguments:**

    - `positions`, `velocities`: (N, 3) arrays in reduced LJ units (float32 or float64).
    - `box_length`: the cubic box edge L (σ).
    """

    def __init__(self, positions, velocities, box_length: float, *, cutoff: float = wl.CUTOFF,
                 skin: float = wl.SKIN, dt: float = wl.DT):
        self.x0 = np.asarray(positions)
        self.v0 = np.asarray(velocities)
        if self.x0.dtype != self.v0.dtype or self.x0.dtype.kind != "f":
            raise TypeError(f"positions and velocities must share one floating dtype, got "
                            f"{self.x0.dtype} and {self.v0.dtype}")
        self.box = float(box_length)
        self.cutoff, self.skin, self.dt = cutoff, skin, dt
        self.n_builds = 0

    def _build(self, x):
        x = wl.wrap(x, self.box).astype(self.x0.dtype)
        self.n_builds += 1
        return x, x.copy(), build_pairs(x, self.box, self.cutoff + self.skin)

    def step0(self, positions=None):
        """(potential energy, forces, virial trace) of the start state, or of `positions`
        ((N, 3), the start's dtype) with a list built for them."""
        x, _, pairs = self._build(self.x0 if positions is None else np.asarray(positions, self.x0.dtype))
        return lj_forces(x, pairs, self.box, self.cutoff)

    def run(self, n_steps: int):
        """`n_steps` velocity-Verlet steps from the start state; returns (positions, velocities,
        potential energy) at the end. `self.n_builds` counts the list builds of this call."""
        self.n_builds = 0
        dtype = self.x0.dtype
        half_dt, dt = dtype.type(0.5 * self.dt / wl.MASS), dtype.type(self.dt)
        limit2 = (0.5 * self.skin) ** 2
        x, ref, pairs = self._build(self.x0)
        v = self.v0.copy()
        energy, f, _ = lj_forces(x, pairs, self.box, self.cutoff)
        for _ in range(n_steps):
            v += half_dt * f
            x += dt * v
            moved = x - ref
            if np.max(np.einsum("nk,nk->n", moved, moved)) > limit2:
                x, ref, pairs = self._build(x)
            energy, f, _ = lj_forces(x, pairs, self.box, self.cutoff)
            v += half_dt * f
        return x, v, energy
