"""PyTorch baselines for the gradient workload: autograd through RK4, and torchdiffeq's adjoint.

- `loss_autograd`: classical RK4 written out on `(B,)` tensors (struct of arrays), a Python
  loop over the steps, `torch.autograd.grad` of the summed loss. Same arithmetic as sciax.
- `TorchdiffeqAdjoint`: `torchdiffeq.odeint_adjoint(method="rk4", step_size=dt)`, the
  continuous adjoint (solves a backward ODE). torchdiffeq's "rk4" is the 3/8-rule variant
  (`rk4_alt_step_func`: same four stages per step, different coefficients), and the adjoint
  gradient is that of the ODE, not of the discrete solver, so its numbers differ from sciax's
  by the discretisation error; it is a peer for timing, not an equivalence baseline.
"""

from __future__ import annotations

import numpy as np
import torch

from .torch_lorenz import configure_torch


def loss_autograd(params: torch.Tensor, u0, obs: torch.Tensor, *, n_steps: int = 1000,
                  t_end: float = 10.0) -> torch.Tensor:
    """Σ_i mean_k,c (u_c(t_k) − obs_kc)² for `params (B, 3)`; differentiable by autograd."""
    n_obs = obs.shape[0]
    save_every = n_steps // n_obs
    dt = t_end / n_steps
    s, r, b = params.unbind(1)

    def f(x, y, z):
        return s * (y - x), x * (r - z) - y, x * y - b * z

    x, y, z = (torch.full_like(s, float(c)) for c in u0)
    total = torch.zeros_like(s)
    for n in range(1, n_steps + 1):
        k1 = f(x, y, z)
        k2 = f(x + dt * (0.5 * k1[0]), y + dt * (0.5 * k1[1]), z + dt * (0.5 * k1[2]))
        k3 = f(x + dt * (0.5 * k2[0]), y + dt * (0.5 * k2[1]), z + dt * (0.5 * k2[2]))
        k4 = f(x + dt * k3[0], y + dt * k3[1], z + dt * k3[2])
        x, y, z = (c + dt * (k1[i] / 6 + k2[i] / 3 + k3[i] / 3 + k4[i] / 6)
                   for i, c in enumerate((x, y, z)))
        if n % save_every == 0:
            ob = obs[n // save_every - 1]
            total = total + (x - ob[0]) ** 2 + (y - ob[1]) ** 2 + (z - ob[2]) ** 2
    return torch.sum(total / (3 * n_obs))


def autograd_forward(params: np.ndarray, u0, obs: np.ndarray, **kw) -> float:
    configure_torch()
    with torch.inference_mode():
        return float(loss_autograd(torch.as_tensor(params), u0, torch.as_tensor(obs), **kw))


def autograd_value_and_grad(params: np.ndarray, u0, obs: np.ndarray, **kw) -> tuple[float, np.ndarray]:
    configure_torch()
    p = torch.as_tensor(params).clone().requires_grad_(True)
    value = loss_autograd(p, u0, torch.as_tensor(obs), **kw)
    (g,) = torch.autograd.grad(value, p)
    return float(value.detach()), g.numpy()


class _LorenzFunc(torch.nn.Module):
    def __init__(self, params: torch.Tensor):
        super().__init__()
        self.params = torch.nn.Parameter(params)

    def forward(self, t, u):  # u: (3, B)
        s, r, b = self.params.unbind(1)
        x, y, z = u.unbind(0)
        return torch.stack([s * (y - x), x * (r - z) - y, x * y - b * z])


def torchdiffeq_value_and_grad(params: np.ndarray, u0, obs: np.ndarray, *, n_steps: int = 1000,
                               t_end: float = 10.0, adjoint: bool = True) -> tuple[float, np.ndarray]:
    """Loss and gradient by `torchdiffeq.odeint_adjoint` (or plain `odeint` + autograd)."""
    import torchdiffeq

    configure_torch()
    n_obs = obs.shape[0]
    p = torch.as_tensor(params)
    func = _LorenzFunc(p.clone())
    u = torch.as_tensor(np.asarray(u0, dtype=params.dtype))[:, None].expand(3, p.shape[0]).contiguous()
    ts = torch.arange(0, n_obs + 1, dtype=p.dtype) * (t_end / n_obs)
    solve = torchdiffeq.odeint_adjoint if adjoint else torchdiffeq.odeint
    kwargs = {"adjoint_params": (func.params,)} if adjoint else {}
    sol = solve(func, u, ts, method="rk4", options={"step_size": t_end / n_steps}, **kwargs)
    ob = torch.as_tensor(obs)[:, :, None]  # (n_obs, 3, 1)
    value = torch.sum(torch.mean((sol[1:] - ob) ** 2, dim=(0, 1)))
    (g,) = torch.autograd.grad(value, func.params)
    return float(value.detach()), g.numpy()


def torchdiffeq_forward(params: np.ndarray, u0, obs: np.ndarray, *, n_steps: int = 1000,
                        t_end: float = 10.0) -> float:
    import torchdiffeq

    configure_torch()
    n_obs = obs.shape[0]
    with torch.no_grad():
        p = torch.as_tensor(params)
        func = _LorenzFunc(p)
        u = torch.as_tensor(np.asarray(u0, dtype=params.dtype))[:, None].expand(3, p.shape[0]).contiguous()
        ts = torch.arange(0, n_obs + 1, dtype=p.dtype) * (t_end / n_obs)
        sol = torchdiffeq.odeint(func, u, ts, method="rk4", options={"step_size": t_end / n_steps})
        return float(torch.sum(torch.mean((sol[1:] - torch.as_tensor(obs)[:, :, None]) ** 2, dim=(0, 1))))
