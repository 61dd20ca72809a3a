"""Hand-written JAX baseline for the gradient workload: one `lax.scan` over a struct-of-arrays batch.

What a JAX user writes without a library: x, y, z as `(B,)` arrays, classical RK4 written out,
an outer scan over the observation times and an inner scan over the steps between them, and
`jax.grad` of the summed loss. The `checkpoint=True` variant wraps the step in
`jax.checkpoint`, so the backward pass recomputes each step's stages instead of storing them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def make_loss(n_steps: int, n_obs: int = 100, t_end: float = 10.0, checkpoint: bool = False):
    """`loss(params (B, 3), u0 (3,), obs (n_obs, 3)) -> Σ_i mean_k,c (u_c(t_k) − obs_kc)²`."""
    save_every = n_steps // n_obs
    dt_value = t_end / n_steps

    def loss(params, u0, obs):
        dt = jnp.asarray(dt_value, params.dtype)
        s, r, b = params[:, 0], params[:, 1], params[:, 2]

        def f(x, y, z):
            return s * (y - x), x * (r - z) - y, x * y - b * z

        def step(carry, _):
            x, y, z = carry
            k1 = f(x, y, z)
            k2 = f(x + dt * (0.5 * k1[0]), y + dt * (0.5 * k1[1]), z + dt * (0.5 * k1[2]))
            k3 = f(x + dt * (0.5 * k2[0]), y + dt * (0.5 * k2[1]), z + dt * (0.5 * k2[2]))
            k4 = f(x + dt * k3[0], y + dt * k3[1], z + dt * k3[2])
            new = tuple(
                c + dt * (k1[i] / 6 + k2[i] / 3 + k3[i] / 3 + k4[i] / 6) for i, c in enumerate(carry)
            )
            return new, None

        if checkpoint:
            step = jax.checkpoint(step)

        def block(carry, ob):
            carry, _ = lax.scan(step, carry, None, length=save_every)
            x, y, z = carry
            return carry, (x - ob[0]) ** 2 + (y - ob[1]) ** 2 + (z - ob[2]) ** 2

        carry0 = tuple(jnp.full_like(s, u0[i]) for i in range(3))
        _, sq = lax.scan(block, carry0, obs)  # (n_obs, B)
        return jnp.sum(jnp.sum(sq, axis=0) / (3 * n_obs))

    return loss
