"""How `simulate` is differentiated. Orthogonal to what is stepped and what is saved.

- `DirectAdjoint`: plain autodiff through `lax.scan`; reverse mode stores every step's
  residuals, so memory grows with `n_steps`. Also supports forward mode (`jax.jvp`, `jacfwd`).
- `CheckpointAdjoint`: rematerialises each saved block (the `save_every` steps between two
  frames) in the backward pass, so reverse-mode memory grows with the number of saved frames,
  not with the number of steps: one carry per frame, plus the carries of the block being
  differentiated (`save_every` of them, or ~2√save_every when `save_every` > `nest_above`
  = 64, where the block is checkpointed once more in ~√save_every sub-blocks). Forward mode works too.
  Gradients equal `DirectAdjoint`'s.
  The default: measured on a 1,000-member, 1,000-step RK4 Lorenz loss (float64, one core)
  its forward+gradient took 5–6x the forward, against ~30x for `DirectAdjoint`, whose
  stored intermediates make the backward pass memory-bound.
"""

import equinox as eqx


class AbstractAdjoint(eqx.Module):
    """Base class of the differentiation strategies of `simulate`."""


class DirectAdjoint(AbstractAdjoint):
    """Differentiate straight through the scan (stores every step for reverse mode)."""


class CheckpointAdjoint(AbstractAdjoint):
    """Recompute each saved block in the backward pass (memory ∝ saved frames + √save_every,
    not steps: a single saved frame after 10^5 steps stores ~630 carries).

    **Arguments:**

    - `checkpoint_steps`: also rematerialise inside each step while a block is replayed, so
      only the per-step carry (not every intermediate of the vector field) is stored.
    - `nest_above`: blocks of more steps than this are checkpointed once more, in ~√save_every
      sub-blocks: the backward pass then stores ~2√save_every carries per block instead of
      save_every, for one more forward replay (measured on a 512-particle chain, float64, one
      core: 10^4 steps in 10 frames, 37.7 MB -> 3.2 MB and 410 -> 446 ms; 10^5 steps,
      370 MB -> 8.3 MB). `None`: never.
    """

    checkpoint_steps: bool = eqx.field(static=True, default=True)
    nest_above: int | None = eqx.field(static=True, default=64)

    def __check_init__(self):
        if self.nest_above is not None and (isinstance(self.nest_above, bool) or not isinstance(self.nest_above, int)
                                            or self.nest_above < 1):
            raise ValueError(f"CheckpointAdjoint: `nest_above` must be a positive int or None, "
                             f"got {self.nest_above!r}.")


class ReversibleAdjoint(AbstractAdjoint):
    """O(1)-memory reverse mode for time-reversible integrators (velocity Verlet, leapfrog,
    Yoshida 4).

    The forward pass keeps only the final carry. The backward pass walks the trajectory
    backwards: it rebuilds the state before each step by stepping the *same* integrator with
    `-dt` (these methods are their own inverse in exact arithmetic), then pulls the cotangent
    through that one step with `jax.vjp`. Memory is independent of `n_steps` (it is the
    saved frames plus a few states); the backward pass costs about three forward steps per
    step (one reverse step, one step replayed under `vjp`).

    **Error bound.** In floating point the reconstructed state differs from the forward state
    by round-off: for a stable (non-chaotic) system the reconstruction error after n steps is
    about ε·n·|q| at worst (ε the unit round-off: 1.1e-16 in float64, 6e-8 in float32), so the
    relative gradient error is of the same order — about 1e-11 after 10^5 float64 steps. For
    chaotic dynamics the reconstruction error grows like e^{λ t} (λ the largest Lyapunov
    exponent), exactly as for the forward trajectory itself; use `CheckpointAdjoint` when
    λ·T ≳ 20 in float64. To check a case, run forward, flip the velocities and run again:
    the distance to the initial state is the reconstruction error the backward pass sees.

    Gradients reach `dt` and `t0` also through the time of each step and frame (a
    time-dependent force or observable). Not supported: stochastic integrators (noise is not
    reversible), forward-mode autodiff (`jax.jvp`; use `DirectAdjoint` or
    `CheckpointAdjoint`), and observables that close over a value being differentiated (JAX
    raises `CustomVJPException`): pass such values in through the system or `args`.
    """
