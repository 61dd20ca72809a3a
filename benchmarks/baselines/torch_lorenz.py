"""PyTorch baseline: the Lorenz ensemble with fixed-step RK4/Tsit5, eager and `torch.compile`.

Written as a competent PyTorch user would: struct-of-arrays tensors `(B,)` for x, y, z,
`torch.inference_mode()`, one Python loop over the steps. The `torch.compile` variant compiles
the one-step function (Inductor fuses the whole Runge–Kutta step into one vectorised C++
loop on the CPU); compiling the 1,000-step loop itself would unroll it into a graph of
~100,000 nodes. The tableaux and the stage arithmetic ``y + dt * (Σ_j a_ij k_j)`` are those of
the NumPy baseline and of sciax.

`import torch` happens here, never in the sciax package.
"""

from __future__ import annotations

import functools
import operator
import os

import numpy as np
import torch

from .numpy_lorenz import TABLEAUX


def configure_torch() -> None:
    """Pin PyTorch's intra-op pool to BENCH_THREADS (set by `python -m benchmarks --threads`)."""
    threads = os.environ.get("BENCH_THREADS")
    if threads and torch.get_num_threads() != int(threads):
        torch.set_num_threads(int(threads))


def make_step(method: str, sigma: float, beta: float, dt: float):
    a_tab, b_tab = TABLEAUX[method]

    def f(x, y, z, rho):
        return sigma * (y - x), x * (rho - z) - y, x * y - beta * z

    def combine(state, coeffs, ks):
        terms = [(c, k) for c, k in zip(coeffs, ks) if c != 0.0]
        return tuple(
            s + dt * functools.reduce(operator.add, [k[i] if c == 1.0 else c * k[i] for c, k in terms])
            for i, s in enumerate(state)
        )

    def step(x, y, z, rho):
        state = (x, y, z)
        ks = [f(x, y, z, rho)]
        for i in range(1, len(b_tab)):
            ks.append(f(*combine(state, a_tab[i], ks), rho))
        return combine(state, b_tab, ks)

    return step


class TorchLorenzEnsemble:
    """`TorchLorenzEnsemble(method, compile)(rho) -> (x, y, z)` final-state tensors."""

    def __init__(self, method: str = "rk4", *, compile: bool = False, u0=(1.0, 0.0, 0.0),
                 dt: float = 0.001, n_steps: int = 1000, sigma: float = 10.0, beta: float = 8.0 / 3.0):
        configure_torch()
        step = make_step(method, sigma, beta, dt)
        if compile:
            # Every instance compiles the same code object: without a reset, Dynamo's cache from
            # an earlier size turns a later one into a dynamic-shape kernel (~5% slower at 1e5)
            # and hides its compile time.
            torch._dynamo.reset()
        self.step = torch.compile(step) if compile else step
        self.u0, self.n_steps = u0, n_steps

    def __call__(self, rho: torch.Tensor):
        with torch.inference_mode():
            x, y, z = (torch.full_like(rho, float(c)) for c in self.u0)
            for _ in range(self.n_steps):
                x, y, z = self.step(x, y, z, rho)
        return x, y, z


def lorenz_ensemble(rho: np.ndarray, u0=(1.0, 0.0, 0.0), *, dt: float = 0.001, n_steps: int = 1000,
                    method: str = "rk4", compile: bool = False, device: str = "cpu") -> np.ndarray:
    """NumPy in, NumPy out: final states `(B, 3)` (for the equivalence tests)."""
    solver = TorchLorenzEnsemble(method, compile=compile, u0=u0, dt=dt, n_steps=n_steps)
    out = solver(torch.as_tensor(np.asarray(rho), device=device))
    return torch.stack(out, dim=-1).cpu().numpy()
