"""The one interface every fixed-step integrator implements.

An integrator is an Equinox module with three methods:

- `init(system, t0, state, args) -> carry`: build the loop carry (the state plus anything a
  method reuses between steps, e.g. the last acceleration of velocity Verlet).
- `step(system, t, carry, dt, key, args) -> carry`: advance one step from time `t` to `t + dt`.
  `key` is a `jax.random` key for stochastic methods (a fresh key per step), else `None`.
- `state(carry) -> state`: the user-visible state inside a carry.

`simulate` drives these inside `lax.scan`; nothing here touches files, clocks or globals.
"""

from typing import ClassVar

import equinox as eqx


class AbstractIntegrator(eqx.Module):
    """Base class of fixed-step integrators (see module docstring for the interface)."""

    order: ClassVar[int]
    stochastic: ClassVar[bool] = False
    reversible: ClassVar[bool] = False

    def init(self, system, t0, state, args):
        return state

    def step(self, system, t, carry, dt, key, args):
        raise NotImplementedError

    def state(self, carry):
        return carry

    def check_system(self, system) -> None:
        """Raise `TypeError` if this method cannot step `system`."""
