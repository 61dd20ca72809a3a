"""The result type shared by `simulate` (fixed-step scan) and `solve` (Diffrax)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np


class Trajectory(eqx.Module):
    """Saved frames of a rollout.

    **Fields:**

    - `times`: `(n_frames,)` times of the saved frames (the first is `t0`).
    - `states`: the state pytree with a leading `(n_frames,)` axis on every leaf, or `None`
      when states were not kept (`save_states=False`).
    - `observables`: dict name -> `(n_frames, ...)` array of each observable per frame.
    - `finite`: `(n_frames,)` bool, whether every leaf of that frame's state is finite.
    - `stats`: dict of solver statistics (e.g. Diffrax's accepted/rejected step counts).
    - `final_carry`: `simulate`'s integrator loop carry after the last step (the state plus
      whatever the integrator keeps between steps); pass it as `simulate(..., carry0=...)` to
      continue the run bitwise. `None` for `solve`.

    Under `jax.vmap` every field gains the ensemble axis in front.
    """

    times: jax.Array
    states: object
    observables: dict
    finite: jax.Array
    stats: dict = eqx.field(default_factory=dict)
    final_carry: object = None

    @property
    def final_state(self):
        """The last saved state (raises if states were not saved)."""
        if self.states is None:
            raise ValueError("this Trajectory was made with save_states=False; no states to return.")
        return jtu.tree_map(lambda x: _last_frame(x, self.times), self.states)

    def first_nonfinite_frame(self) -> int | None:
        """Index of the first frame holding NaN/Inf, or None (host-side; unbatched trajectories)."""
        finite = np.asarray(self.finite)
        if finite.ndim != 1:
            raise ValueError("first_nonfinite_frame() is for one trajectory; index the ensemble first.")
        bad = np.flatnonzero(~finite)
        return int(bad[0]) if bad.size else None


def _last_frame(x, times):
    """Select the last frame along the frame axis (the axis after any ensemble axes)."""
    frame_axis = jnp.ndim(times) - 1
    return jnp.take(x, -1, axis=frame_axis)
