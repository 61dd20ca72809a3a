"""NumPy baseline for the gradient workload: forward sensitivities (not finite differences).

Loss per member i: L_i = mean over the 100 observation times and 3 components of
(u(t_k) − obs_k)², with u from classical RK4; the total loss is Σ_i L_i, so its gradient with
respect to the `(B, 3)` parameters holds each member's dL_i/d(σ, ρ, β).

The gradient is computed by integrating the forward sensitivity equations
S' = (∂f/∂u) S + ∂f/∂θ (S = du/dθ, 3×3 per member) with the same RK4 steps as u. For an
explicit Runge–Kutta method this gives exactly the derivative of the discrete RK4 solution
(the method commutes with differentiation), i.e. the same numbers that reverse-mode autodiff
of the discrete solver gives, up to rounding. Vectorised over the members: the augmented
state is one `(12, B)` array.
"""

from __future__ import annotations

import numpy as np

_RK4_B = (1 / 6, 1 / 3, 1 / 3, 1 / 6)


def _rhs(u, params):
    x, y, z = u
    s, r, b = params
    return np.stack([s * (y - x), x * (r - z) - y, x * y - b * z])


def loss(params: np.ndarray, u0, obs: np.ndarray, *, t_end: float = 10.0, n_steps: int = 1000) -> float:
    """Forward only: Σ_i L_i for `params` of shape `(B, 3)`; `obs` is `(n_obs, 3)`."""
    p = np.ascontiguousarray(params.T)
    n_obs = obs.shape[0]
    save_every = n_steps // n_obs
    dt = t_end / n_steps
    u = np.repeat(np.asarray(u0, dtype=p.dtype)[:, None], p.shape[1], axis=1)
    total = np.zeros(p.shape[1], dtype=p.dtype)
    for n in range(1, n_steps + 1):
        k1 = _rhs(u, p)
        k2 = _rhs(u + dt * (0.5 * k1), p)
        k3 = _rhs(u + dt * (0.5 * k2), p)
        k4 = _rhs(u + dt * k3, p)
        u = u + dt * (_RK4_B[0] * k1 + _RK4_B[1] * k2 + _RK4_B[2] * k3 + _RK4_B[3] * k4)
        if n % save_every == 0:
            d = u - obs[n // save_every - 1][:, None]
            total += np.sum(d * d, axis=0)
    return float(np.sum(total / (3 * n_obs)))


def _augmented_rhs(w, params):
    """(12, B) augmented state [u (3), S (3x3, row-major)] -> its time derivative."""
    x, y, z = w[0], w[1], w[2]
    s, r, b = params
    S = w[3:].reshape(3, 3, -1)
    out = np.empty_like(w)
    out[0] = s * (y - x)
    out[1] = x * (r - z) - y
    out[2] = x * y - b * z
    # J = ∂f/∂u per member, (3, 3, B)
    zero = np.zeros_like(x)
    J = np.array([[-s, s, zero], [r - z, -np.ones_like(x), -x], [y, x, -b]])
    dS = np.einsum("ikb,kjb->ijb", J, S)
    # ∂f/∂θ: row 0 depends on σ, row 1 on ρ, row 2 on β.
    dS[0, 0] += y - x
    dS[1, 1] += x
    dS[2, 2] -= z
    out[3:] = dS.reshape(9, -1)
    return out


def loss_and_grad(params: np.ndarray, u0, obs: np.ndarray, *, t_end: float = 10.0,
                  n_steps: int = 1000) -> tuple[float, np.ndarray]:
    """Σ_i L_i and its gradient `(B, 3)` by forward sensitivities through the RK4 steps."""
    p = np.ascontiguousarray(params.T)
    n_members = p.shape[1]
    n_obs = obs.shape[0]
    save_every = n_steps // n_obs
    dt = t_end / n_steps
    w = np.zeros((12, n_members), dtype=p.dtype)
    w[:3] = np.asarray(u0, dtype=p.dtype)[:, None]
    total = np.zeros(n_members, dtype=p.dtype)
    grad = np.zeros((3, n_members), dtype=p.dtype)
    for n in range(1, n_steps + 1):
        k1 = _augmented_rhs(w, p)
        k2 = _augmented_rhs(w + dt * (0.5 * k1), p)
        k3 = _augmented_rhs(w + dt * (0.5 * k2), p)
        k4 = _augmented_rhs(w + dt * k3, p)
        w = w + dt * (_RK4_B[0] * k1 + _RK4_B[1] * k2 + _RK4_B[2] * k3 + _RK4_B[3] * k4)
        if n % save_every == 0:
            d = w[:3] - obs[n // save_every - 1][:, None]  # (3, B)
            total += np.sum(d * d, axis=0)
            grad += np.einsum("ib,ijb->jb", d, w[3:].reshape(3, 3, -1))
    scale = 1.0 / (3 * n_obs)
    return float(np.sum(total * scale)), (2.0 * scale * grad).T
