"""State pytrees shared by particle systems and their integrators."""

import equinox as eqx
import jax
import jax.numpy as jnp


class PhaseSpace(eqx.Module):
    """Positions and velocities of a particle system.

    **Arguments:**

    - `positions`: array `(N, d)` (or `(d,)` for a single relative coordinate), length units.
    - `velocities`: array of the same shape, length / time units.

    Under `jax.vmap` both gain a leading ensemble axis; saved trajectories stack frames on a
    leading axis, so `traj.states.positions` has shape `(n_frames, N, d)`.
    """

    positions: jax.Array
    velocities: jax.Array

    def __init__(self, positions, velocities):
        self.positions = jnp.asarray(positions)
        self.velocities = jnp.asarray(velocities)
