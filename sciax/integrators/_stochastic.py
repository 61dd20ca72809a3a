"""Stochastic integrators. Keys are explicit: `simulate` hands each step its own key
(`jax.random.fold_in(key, step_index)`), so results do not depend on how steps are chunked."""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu

from .._phase_space import PhaseSpace
from ..systems._base import AbstractSDE, check_stepped_by_acceleration
from ._base import AbstractIntegrator


def _normal_like(key, tree):
    """N(0, 1) noise shaped like `tree`. A state of n scalar leaves of one dtype (how `simulate`
    steps a system with `n_components`) gets the same draws as the (n,) array it stands for,
    so a sample path does not depend on that internal layout."""
    leaves, treedef = jtu.tree_flatten(tree)
    dtypes = {jnp.result_type(x) for x in leaves}
    if len(leaves) > 1 and len(dtypes) == 1 and all(jnp.shape(x) == () for x in leaves):
        xi = jr.normal(jr.split(key, 1)[0], (len(leaves),), dtypes.pop())
        return jtu.tree_unflatten(treedef, [xi[i] for i in range(len(leaves))])
    keys = jr.split(key, len(leaves))
    return jtu.tree_unflatten(
        treedef, [jr.normal(k, jnp.shape(x), jnp.result_type(x)) for k, x in zip(keys, leaves)]
    )


class EulerMaruyama(AbstractIntegrator):
    """Euler–Maruyama for Itô SDEs with diagonal noise (strong order ½, weak order 1):

        y_{n+1} = y_n + f(t_n, y_n) h + g(t_n, y_n) ⊙ √h ξ_n,   ξ_n ~ N(0, I).
    """

    order: ClassVar[int] = 1
    stochastic: ClassVar[bool] = True

    def step(self, system, t, y, dt, key, args):
        drift = system.vector_field(t, y, args)
        g = system.diffusion(t, y, args)
        xi = _normal_like(key, y)
        sqrt_dt = jnp.sqrt(dt)
        return jtu.tree_map(lambda yi, fi, gi, ni: yi + fi * dt + gi * sqrt_dt * ni, y, drift, g, xi)

    def check_system(self, system) -> None:
        if not isinstance(system, AbstractSDE):
            raise TypeError(
                f"EulerMaruyama steps an AbstractSDE (drift vector_field and diffusion), "
                f"got {type(system).__name__}."
            )


class LangevinBAOAB(AbstractIntegrator):
    """BAOAB splitting for underdamped Langevin dynamics (Leimkuhler & Matthews 2013):

        dq = v dt,   m dv = F(q) dt − γ m v dt + √(2 γ m kT) dW.

    Each step: B (half kick), A (half drift), O (exact Ornstein–Uhlenbeck velocity update
    v ← c₁ v + √((1 − c₁²) kT/m) ξ with c₁ = e^{−γh}), A, B. Configurational averages are
    second-order accurate; for a harmonic potential the position distribution is exact.

    **Arguments:**

    - `kT`: thermal energy k_B T, in the system's energy units.
    - `friction`: collision rate γ, in inverse time units.
    """

    kT: jax.Array = eqx.field(converter=jnp.asarray)
    friction: jax.Array = eqx.field(converter=jnp.asarray)
    order: ClassVar[int] = 2
    stochastic: ClassVar[bool] = True

    def __check_init__(self):
        for name in ("kT", "friction"):
            value = getattr(self, name)
            if jnp.ndim(value) != 0:
                raise ValueError(f"LangevinBAOAB: `{name}` must be a scalar, got shape {jnp.shape(value)}.")
            if not isinstance(value, jax.core.Tracer) and not (float(value) >= 0 and float(value) < float("inf")):
                raise ValueError(f"LangevinBAOAB: `{name}` must be finite and >= 0, got {float(value)}.")

    def init(self, system, t0, state, args):
        return state, system.acceleration(state.positions)

    def step(self, system, t, carry, dt, key, args):
        state, accel = carry
        dtype = jnp.result_type(state.velocities)
        m = jnp.asarray(system.masses)[..., None]
        v = state.velocities + 0.5 * dt * accel
        q = state.positions + 0.5 * dt * v
        c1 = jnp.exp(-self.friction * dt).astype(dtype)
        sigma = jnp.sqrt((1.0 - c1**2) * self.kT / m).astype(dtype)
        v = c1 * v + sigma * jr.normal(key, jnp.shape(v), dtype)
        q = q + 0.5 * dt * v
        accel = system.acceleration(q)
        v = v + 0.5 * dt * accel
        return PhaseSpace(q, v), accel

    def state(self, carry):
        return carry[0]

    def check_system(self, system) -> None:
        check_stepped_by_acceleration("LangevinBAOAB", system,
                                      instead="use EulerMaruyama with an AbstractSDE for other stochastic dynamics")
