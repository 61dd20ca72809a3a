"""PyTorch baseline for the in.lj workload (CPU), eager and `torch.compile`, the NumPy baseline's
algorithm.

- Neighbour list: the same half list of pairs within r_c + skin as `md_numpy.build_pairs`
  (`scipy.spatial.cKDTree` on the host: PyTorch has no spatial tree; this is what PyTorch MD codes
  do on the CPU), rebuilt when some particle has moved more than skin/2 since the last build.
  The pair list is padded to a fixed capacity (1.25 x the first build's pair count; pad slots
  are the pair (0, 0), masked out by r² = 0), so the compiled step sees one shape; a list that
  outgrows the capacity is re-padded to 1.25 x its size (a new shape: `torch.compile` then
  recompiles, and `self.n_regrows` counts it).
- One step (half kick, drift, forces, half kick, and the largest squared displacement since
  the last build) is one function: eager, or compiled by Inductor (`torch.compile`, one
  compilation per N and dtype). Forces are accumulated with `index_add_`. The 100-step loop and
  the rebuild decision (a `.item()` on the displacement) stay in Python.

`import torch` happens here, never in the sciax package.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from . import md_workload as wl
from .md_numpy import build_pairs

CAPACITY_MARGIN = 1.25


def configure_torch() -> None:
    """Pin PyTorch's intra-op pool to BENCH_THREADS (set by `python -m benchmarks --threads`)."""
    threads = os.environ.get("BENCH_THREADS")
    if threads and torch.get_num_threads() != int(threads):
        torch.set_num_threads(int(threads))


def lj_forces(x, i, j, box_length: float, cutoff: float = wl.CUTOFF):
    """(potential energy, forces (N, 3), virial trace) over pairs (i, j) closer than `cutoff`;
    pairs with r = 0 (padding) are ignored. ε = σ = 1."""
    d = x[i] - x[j]
    d = d - box_length * torch.round(d / box_length)
    r2 = (d * d).sum(dim=1)
    inside = (r2 < cutoff * cutoff) & (r2 > 0)
    inv2 = torch.where(inside, 1.0 / torch.where(inside, r2, torch.ones_like(r2)), torch.zeros_like(r2))
    s6 = inv2 * inv2 * inv2
    energy = (4.0 * s6 * (s6 - 1.0)).sum()
    fd = d * (24.0 * s6 * (2.0 * s6 - 1.0) * inv2)[:, None]
    forces = torch.zeros_like(x).index_add_(0, i, fd).index_add_(0, j, -fd)
    virial = (fd * d).sum()
    return energy, forces, virial


def make_step(box_length: float, dt: float, cutoff: float):
    half_dt = 0.5 * dt / wl.MASS

    def step(x, v, f, ref, i, j):
        v = v + half_dt * f
        x = x + dt * v
        moved = x - ref
        max_moved2 = (moved * moved).sum(dim=1).max()
        return x, v, max_moved2

    def finish(x, v, i, j):
        energy, f, _ = lj_forces(x, i, j, box_length, cutoff)
        v = v + half_dt * f
        return v, f, energy

    return step, finish


class TorchLJ:
    """The in.lj NVE run in PyTorch (CPU). `run(n_steps)` starts from the given state every time.

    **Arguments:**

    - `positions`, `velocities`: (N, 3) NumPy arrays in reduced LJ units (float32 or float64).
    - `box_length`: the cubic box edge L (σ).
    - `compile`: compile the step with `torch.compile` (Inductor).
    """

    def __init__(self, positions, velocities, box_length: float, *, compile: bool = False,
                 cutoff: float = wl.CUTOFF, skin: float = wl.SKIN, dt: float = wl.DT):
        configure_torch()
        self.x0 = torch.as_tensor(np.asarray(positions))
        self.v0 = torch.as_tensor(np.asarray(velocities))
        self.dtype = np.asarray(positions).dtype
        self.box, self.cutoff, self.skin, self.dt = float(box_length), cutoff, skin, dt
        step, finish = make_step(self.box, dt, cutoff)
        if compile:
            torch._dynamo.reset()  # a fresh cache per (N, dtype): no dynamic-shape kernels
            step, finish = torch.compile(step), torch.compile(finish)
        self._step, self._finish = step, finish
        self.capacity = None
        self.n_builds = 0
        self.n_regrows = 0

    def _build(self, x: torch.Tensor):
        xw = wl.wrap(x.numpy(), self.box).astype(self.dtype)
        pairs = build_pairs(xw, self.box, self.cutoff + self.skin)
        if self.capacity is None or len(pairs) > self.capacity:
            if self.capacity is not None:
                self.n_regrows += 1
            self.capacity = int(np.ceil(CAPACITY_MARGIN * len(pairs)))
        padded = np.zeros((self.capacity, 2), np.int64)
        padded[: len(pairs)] = pairs
        self.n_builds += 1
        x = torch.from_numpy(xw)
        return x, x.clone(), torch.from_numpy(padded[:, 0].copy()), torch.from_numpy(padded[:, 1].copy())

    def step0(self, positions=None):
        """(potential energy, forces, virial trace) of the start state, or of `positions`
        ((N, 3) NumPy, the start's dtype) with a list built for them (eager)."""
        x, _, i, j = self._build(self.x0 if positions is None else torch.as_tensor(np.asarray(positions, self.dtype)))
        e, f, w = lj_forces(x, i, j, self.box, self.cutoff)
        return float(e), f.numpy(), float(w)

    def run(self, n_steps: int):
        """`n_steps` velocity-Verlet steps from the start state; returns NumPy (positions,
        velocities, potential energy) at the end."""
        self.n_builds = 0
        limit2 = (0.5 * self.skin) ** 2
        with torch.inference_mode():
            x, ref, i, j = self._build(self.x0)
            energy, f, _ = lj_forces(x, i, j, self.box, self.cutoff)
            v = self.v0.clone()
            for _ in range(n_steps):
                x, v, max_moved2 = self._step(x, v, f, ref, i, j)
                if float(max_moved2) > limit2:
                    x, ref, i, j = self._build(x)
                v, f, energy = self._finish(x, v, i, j)
        return x.numpy(), v.numpy(), float(energy)
