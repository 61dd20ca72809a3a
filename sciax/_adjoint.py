"""How `simulate` is differentiated. Orthogonal to what is stepped and what is saved.

- `DirectAdjoint`: plain autodiff through `lax.scan`; reverse mode stores every step's
  residuals, so memory grows with `n_steps`. Also supports forward mode (`jax.jvp`, `jacfwd`).
- `CheckpointAdjoint`: rematerialises each saved block (the `save_every` steps between two
  frames) in the backward pass, so reverse-mode memory grows with the number of saved frames,
  not with the number of steps; forward mode works too. Gradients equal `DirectAdjoint`'s.
"""

import equinox as eqx


class AbstractAdjoint(eqx.Module):
    """Base class of the differentiation strategies of `simulate`."""


class DirectAdjoint(AbstractAdjoint):
    """Differentiate straight through the scan (stores every step for reverse mode)."""


class CheckpointAdjoint(AbstractAdjoint):
    """Recompute each saved block in the backward pass (memory ∝ saved frames, not steps).

    **Arguments:**

    - `checkpoint_steps`: also rematerialise inside each step while a block is replayed, so
      only the per-step carry (not every intermediate of the vector field) is stored.
    """

    checkpoint_steps: bool = eqx.field(static=True, default=True)
