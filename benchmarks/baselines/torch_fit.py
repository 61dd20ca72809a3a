"""PyTorch + torchdiffeq baseline for the damped-oscillator fit: `odeint` + `torch.optim.LBFGS`.

What a torchdiffeq user writes: the vector field as a closure over a `(2,)` parameter tensor
(ω, ζ), `torchdiffeq.odeint` with its default adaptive Dormand–Prince 5(4) at the same
tolerances as the SciPy baseline (rtol=1e-8, atol=1e-10; the same accuracy as sciax's RK4 at
dt = 0.01), gradients by backpropagation through the solver, and L-BFGS with a strong-Wolfe
line search on the same objective ½ Σ r² in float64.
"""

from __future__ import annotations

import numpy as np
import torch

from ..workloads import FIT_Y0
from .numpy_fit import SOLVE_IVP_ATOL, SOLVE_IVP_RTOL
from .torch_lorenz import configure_torch


def _objective(t: np.ndarray, x_obs: np.ndarray, theta: torch.Tensor):
    """½ Σ (x(t_k; θ) − x_obs,k)² by `torchdiffeq.odeint` (dopri5), differentiable in θ."""
    import torchdiffeq

    ts = torch.as_tensor(np.concatenate([[0.0], t]))
    xs = torch.as_tensor(x_obs)
    y0 = torch.tensor(FIT_Y0, dtype=torch.float64)

    def vector_field(_, y):
        omega, zeta = theta[0], theta[1]
        return torch.stack([y[1], -2.0 * zeta * omega * y[1] - omega**2 * y[0]])

    sol = torchdiffeq.odeint(vector_field, y0, ts, rtol=SOLVE_IVP_RTOL, atol=SOLVE_IVP_ATOL,
                             method="dopri5")
    return 0.5 * torch.sum((sol[1:, 0] - xs) ** 2)


def evaluate_once(t: np.ndarray, x_obs: np.ndarray, start=(1.5, 0.3)) -> float:
    """One objective + gradient evaluation (what each L-BFGS iteration costs at least)."""
    configure_torch()
    theta = torch.tensor(start, dtype=torch.float64, requires_grad=True)
    loss = _objective(t, x_obs, theta)
    loss.backward()
    return float(loss.detach())


def fit(t: np.ndarray, x_obs: np.ndarray, start=(1.5, 0.3), *, max_iter: int = 100) -> dict:
    configure_torch()
    theta = torch.tensor(start, dtype=torch.float64, requires_grad=True)

    optimiser = torch.optim.LBFGS([theta], lr=1.0, max_iter=max_iter, tolerance_grad=1e-9,
                                  tolerance_change=1e-12, line_search_fn="strong_wolfe")
    n_eval, last = [0], [float("nan")]

    def closure():
        optimiser.zero_grad()
        loss = _objective(t, x_obs, theta)
        loss.backward()
        n_eval[0] += 1
        last[0] = float(loss.detach())
        return loss

    optimiser.step(closure)
    return {"params": theta.detach().numpy().copy(), "cost_last_evaluation": last[0], "nfev": n_eval[0]}
