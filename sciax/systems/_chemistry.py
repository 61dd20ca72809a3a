"""Chemical kinetics."""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp

from .._validation import check_parameter
from ._base import AbstractODE, components, in_system_precision, like


class Robertson(AbstractODE):
    """Robertson's (1966) autocatalytic reaction network, the classic stiff test problem,
    y = (y₁, y₂, y₃) concentrations:

        dy₁/dt = −k₁ y₁ + k₃ y₂ y₃
        dy₂/dt =  k₁ y₁ − k₂ y₂² − k₃ y₂ y₃
        dy₃/dt =  k₂ y₂²

    Rate constants k₁ = 0.04, k₂ = 3·10⁷, k₃ = 10⁴ (concentration and time units as in
    Robertson's paper). The time scales span ~10¹¹, so explicit methods need tiny steps; use
    an implicit solver for long runs. The total y₁ + y₂ + y₃ is conserved (mass balance).

    **Arguments:** `k1`, `k2`, `k3` (≥ 0).
    """

    k1: jax.Array = eqx.field(converter=jnp.asarray, default=0.04)
    k2: jax.Array = eqx.field(converter=jnp.asarray, default=3e7)
    k3: jax.Array = eqx.field(converter=jnp.asarray, default=1e4)
    n_components: ClassVar[int] = 3
    component_names: ClassVar[tuple[str, ...]] = ('y1', 'y2', 'y3')

    def __check_init__(self):
        for name in ("k1", "k2", "k3"):
            check_parameter("Robertson", name, getattr(self, name))

    def vector_field(self, t, y, args=None):
        y1, y2, y3 = components(y, 3, "Robertson")
        r1 = self.k1 * y1
        r2 = self.k2 * y2**2
        r3 = self.k3 * y2 * y3
        return like(y, -r1 + r3, r1 - r2 - r3, r2)

    @in_system_precision
    def default_state(self):
        return jnp.array([1.0, 0.0, 0.0])

    def conserved_quantities(self, t, y):
        y1, y2, y3 = components(y, 3, "Robertson")
        return {"total": y1 + y2 + y3}
