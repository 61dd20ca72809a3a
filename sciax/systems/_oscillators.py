"""Oscillators written as first-order ODEs."""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp

from ._base import AbstractODE, components, like


class VanDerPol(AbstractODE):
    """Van der Pol relaxation oscillator, y = (x, v):

        dx/dt = v,   dv/dt = μ (1 − x²) v − x

    Dimensionless. Stiff for large μ (relaxation time ~ μ): use `solve(..., solver="kvaerno5")`.

    **Arguments:** `mu` (damping strength μ ≥ 0).
    """

    mu: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    n_components: ClassVar[int] = 2

    def vector_field(self, t, y, args=None):
        x, v = components(y, 2, "VanDerPol")
        return like(y, v, self.mu * (1 - x**2) * v - x)

    def default_state(self):
        return jnp.array([2.0, 0.0])
