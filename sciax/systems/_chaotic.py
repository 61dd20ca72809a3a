"""Chaotic flows."""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp

from ._base import AbstractODE, components, in_system_precision, like


class Lorenz(AbstractODE):
    """The Lorenz (1963) convection model.

        dx/dt = σ (y − x),   dy/dt = x (ρ − z) − y,   dz/dt = x y − β z

    Dimensionless. Chaotic for the classic σ = 10, ρ = 28, β = 8/3.

    **Arguments:** `sigma`, `rho`, `beta` (scalars; array fields, so they can be
    differentiated and swept).
    """

    sigma: jax.Array = eqx.field(converter=jnp.asarray, default=10.0)
    rho: jax.Array = eqx.field(converter=jnp.asarray, default=28.0)
    beta: jax.Array = eqx.field(converter=jnp.asarray, default=8.0 / 3.0)
    n_components: ClassVar[int] = 3
    component_names: ClassVar[tuple[str, ...]] = ('x', 'y', 'z')

    def vector_field(self, t, y, args=None):
        x, yy, z = components(y, 3, "Lorenz")
        return like(y, self.sigma * (yy - x), x * (self.rho - z) - yy, x * yy - self.beta * z)

    @in_system_precision
    def default_state(self):
        return jnp.array([1.0, 1.0, 1.0])
