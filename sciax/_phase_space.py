"""State pytrees shared by particle systems and their integrators."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np


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
        self.positions = _as_array(positions)
        self.velocities = _as_array(velocities)


def _as_array(x):
    """Numbers, lists and NumPy arrays become JAX arrays; anything else (a JAX array or tracer,
    and the spec leaves of JAX's pytree prefixes: `None`, an int axis, a `ShapeDtypeStruct`)
    is kept, so `PhaseSpace(0, None)` works as `vmap`'s `in_axes` and
    `PhaseSpace(ShapeDtypeStruct, ShapeDtypeStruct)` in `eval_shape`."""
    if isinstance(x, list | tuple | float | complex | np.ndarray | np.generic):
        return jnp.asarray(x)
    return x
