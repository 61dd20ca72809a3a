"""Neuron models written as first-order ODEs."""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp

from .._validation import check_parameter
from ._base import AbstractODE, components, in_system_precision, like


class FitzHughNagumo(AbstractODE):
    """FitzHugh–Nagumo model of an excitable neuron, y = (v, w):

        dv/dt = v − v³/3 − w + I,   dw/dt = (v + a − b w) / τ

    v is a membrane-potential-like variable, w a slow recovery variable; dimensionless
    (time in units of the fast time scale). The defaults a = 0.7, b = 0.8, τ = 12.5, I = 0.5
    (FitzHugh 1961) give a stable limit cycle (repetitive spiking).

    **Arguments:** `a`, `b` (dimensionless), `tau` τ > 0 (recovery time scale), `current` I
    (external stimulus).
    """

    a: jax.Array = eqx.field(converter=jnp.asarray, default=0.7)
    b: jax.Array = eqx.field(converter=jnp.asarray, default=0.8)
    tau: jax.Array = eqx.field(converter=jnp.asarray, default=12.5)
    current: jax.Array = eqx.field(converter=jnp.asarray, default=0.5)
    n_components: ClassVar[int] = 2
    component_names: ClassVar[tuple[str, ...]] = ('v', 'w')

    def __check_init__(self):
        check_parameter("FitzHughNagumo", "tau", self.tau, strict=True)

    def vector_field(self, t, y, args=None):
        v, w = components(y, 2, "FitzHughNagumo")
        return like(y, v - v**3 / 3 - w + self.current, (v + self.a - self.b * w) / self.tau)

    @in_system_precision
    def default_state(self):
        return jnp.array([-1.0, 1.0])
