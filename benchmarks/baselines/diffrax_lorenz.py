"""Diffrax as a peer: `jax.vmap(diffrax.diffeqsolve)` for the ensemble and the gradient workloads.

Fixed steps with `ConstantStepSize`. Diffrax has no classical RK4 solver, so `DiffraxRK4`
builds one from a Butcher tableau as Diffrax's own solvers are built (its error weights are
zero; a fixed-step solve never uses them); `diffrax.Tsit5()` is used as shipped.

Known trap (DESIGN.md; diffrax 0.7.2 with equinox 0.13.8): `RecursiveCheckpointAdjoint` with
`SaveAt(ts=...)` returns gradients that are wrong by 1e-4 to 30% for some values of
`max_steps` and not for others, with no pattern we could find. For this workload (Lorenz,
t in [0, 10], 100 save times; measured 2026-11-22): N = 1000 steps was wrong with max_steps =
N, N+5, N+64 and 2N and right with 1100, 2048 and 4096; N = 100 was wrong with 4096 and right
with 8192; N = 3000 was wrong with 4096 and 8192; N = 10,000 was right with N+64 and 16384.
`max_steps` here is Diffrax's default 4096 where it covers the solve (right for the 1,000-step
benchmark and for the 200-step test), else N + 64. The gradient suite compares every Diffrax
gradient with sciax's in the same run and says so in the row when it is wrong, and
`tests/test_baselines.py` checks the test instance.
"""

from __future__ import annotations

from typing import ClassVar

import diffrax as dfx
import jax
import jax.numpy as jnp
import numpy as np


class DiffraxRK4(dfx.AbstractERK):
    """Classical fourth-order Runge–Kutta as a Diffrax solver (fixed steps only)."""

    tableau: ClassVar[dfx.ButcherTableau] = dfx.ButcherTableau(
        c=np.array([0.5, 0.5, 1.0]),
        b_sol=np.array([1 / 6, 1 / 3, 1 / 3, 1 / 6]),
        b_error=np.zeros(4),
        a_lower=(np.array([0.5]), np.array([0.0, 0.5]), np.array([0.0, 0.0, 1.0])),
    )
    interpolation_cls: ClassVar = dfx.ThirdOrderHermitePolynomialInterpolation.from_k

    def order(self, terms):
        return 4


SOLVERS = {"rk4": DiffraxRK4, "tsit5": dfx.Tsit5}


def _max_steps(n_steps: int) -> int:
    """Diffrax's default 4096 where it covers the solve, else N + 64 (see the module docstring)."""
    return 4096 if n_steps + 64 <= 4096 else n_steps + 64


def lorenz_vf(t, u, args):
    sigma, rho, beta = args
    x, y, z = u[0], u[1], u[2]
    return jnp.stack([sigma * (y - x), x * (rho - z) - y, x * y - beta * z])


def make_ensemble(method: str, dtype, *, u0=(1.0, 0.0, 0.0), dt: float = 0.001, n_steps: int = 1000,
                  sigma: float = 10.0, beta: float = 8.0 / 3.0):
    """A jitted `rho (B,) -> final states (B, 3)` by `vmap(diffeqsolve)`."""
    solver = SOLVERS[method]()
    term = dfx.ODETerm(lorenz_vf)

    def one(rho):
        y0 = jnp.asarray(u0, dtype)
        sol = dfx.diffeqsolve(
            term, solver, t0=jnp.asarray(0.0, dtype), t1=jnp.asarray(n_steps * dt, dtype),
            dt0=jnp.asarray(dt, dtype), y0=y0,
            args=(jnp.asarray(sigma, dtype), rho, jnp.asarray(beta, dtype)),
            stepsize_controller=dfx.ConstantStepSize(), saveat=dfx.SaveAt(t1=True),
            max_steps=_max_steps(n_steps),
        )
        return sol.ys[-1]

    return jax.jit(jax.vmap(one))


def make_gradient_loss(n_steps: int, n_obs: int = 100, t_end: float = 10.0):
    """`loss(params (B, 3), u0, obs) -> Σ_i mean (u(t_k) − obs_k)²` with Diffrax's default
    `RecursiveCheckpointAdjoint`, classical RK4 at dt = t_end / n_steps, saved at the
    observation times t_k = k · t_end / n_obs."""
    term = dfx.ODETerm(lorenz_vf)
    solver = DiffraxRK4()

    def member(p, u0, obs):
        dtype = p.dtype
        ts = jnp.arange(1, n_obs + 1, dtype=dtype) * (t_end / n_obs)
        sol = dfx.diffeqsolve(
            term, solver, t0=jnp.asarray(0.0, dtype), t1=jnp.asarray(t_end, dtype),
            dt0=jnp.asarray(t_end / n_steps, dtype), y0=u0, args=(p[0], p[1], p[2]),
            stepsize_controller=dfx.ConstantStepSize(), saveat=dfx.SaveAt(ts=ts),
            adjoint=dfx.RecursiveCheckpointAdjoint(), max_steps=_max_steps(n_steps),
        )
        return jnp.mean((sol.ys - obs) ** 2)

    def loss(params, u0, obs):
        return jnp.sum(jax.vmap(member, in_axes=(0, None, None))(params, u0, obs))

    return loss
