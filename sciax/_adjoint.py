"""How rollouts are differentiated: `simulate`'s adjoints (orthogonal to what is stepped and
what is saved), and a marker for `solve`'s results that support forward mode only.

- `DirectAdjoint`: plain autodiff through `lax.scan`; reverse mode stores every step's
  residuals, so memory grows with `n_steps`. Also supports forward mode (`jax.jvp`, `jacfwd`).
- `CheckpointAdjoint`: rematerialises each saved block (the `save_every` steps between two
  frames) in the backward pass, so reverse-mode memory grows with the number of saved frames,
  not with the number of steps: one carry per frame, plus the carries of the block being
  differentiated (`save_every` of them, or ~2√save_every when `save_every` > `nest_above`
  = 64, where the block is checkpointed once more in ~√save_every sub-blocks). Forward mode works too.
  Gradients equal `DirectAdjoint`'s.
  The default: `DirectAdjoint`'s stored intermediates make its backward pass memory-bound,
  several times slower on the benchmark gradient (`benchmarks/README.md`, `gradient`).

`forward_only` marks results that support forward-mode differentiation only (`solve(adjoint="forward")`):
`forward_only(tree, message)` is the identity on values and on tangents (`jax.jvp`,
`jax.jacfwd`, `jax.linearize` pass through it unchanged), but transposing it, which every
reverse-mode derivative (`jax.grad`, `jax.vjp`, `jax.jacrev`) does, raises `ValueError(message)`.

Why. `solve(adjoint="forward")` computes derivatives with Diffrax's `ForwardMode`, whose
tangents flow through a `lax.while_loop`. Reverse mode transposes the tangent program from the
outputs back, and the while loop cannot be transposed: JAX then reports "Reverse-mode
differentiation does not work for lax.while_loop", which names neither the solve nor the fix.
Marking the solve's outputs puts this transpose first on the way back, so the error names them.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir


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
      save_every, for one more forward replay. `None`: never.
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

    **Error bound** (first order in ε). Let δ_j be the round-off of the backward step from
    step j + 1 to j, |δ_j| ≤ c ε |z_j| with z = (q, v) and c a small constant set by the
    integrator's stages, and D_{j→k} the Jacobian of stepping back from step j to step k. The
    rebuilt state at step k then misses the forward one by e_k = Σ_{j≥k} D_{j→k} δ_j, so

        |e_k| ≤ c ε Σ_{j=k}^{n-1} ‖D_{j→k}‖ |z_j| ≤ c ε K (n − k) max_j |z_j|

    when the dynamics keep ‖D‖ ≤ K (linearly stable); ‖D_{j→k}‖ grows like e^{λ (t_j − t_k)}
    for a chaotic system. The cotangent z̄_k pulled through step k at z_k + e_k instead of z_k
    comes out off by at most ‖∂²step/∂z²‖ |e_k| |z̄_k| to first order, and a parameter gradient
    sums these errors over the steps.

    **Accuracy.** In floating point the state rebuilt by stepping back differs from the
    forward state by round-off, which accumulates over the steps: for a stable (non-chaotic)
    system it grows at least like ε·n·|q| (ε the unit round-off: 1.1e-16 in float64, 6e-8 in
    float32), and faster where a round-off error in the energy shifts a phase that then grows
    with time (an orbit). A gradient with respect to a parameter is a sum of per-step
    contributions that can largely cancel, so its relative error can exceed the reconstruction
    error by the ratio Σ|contribution| / |Σ contribution|. Measured in float64 against
    `DirectAdjoint` (which `CheckpointAdjoint` matches to ~1e-14), relative error of the
    gradient of a weighted sum of final positions:

    | system, velocity Verlet | 10^3 steps | 10^4 steps | 10^5 steps |
    |---|---|---|---|
    | 8-mass spring chain (dt 0.05): d/d stiffness | 3e-13 | 1.3e-12 | 5.4e-10 |
    | same: d/d initial positions | 5e-14 | 1.9e-12 | 3.7e-11 |
    | Kepler, e ≈ 0.44 (dt 0.01): d/d GM | – | 4e-13 | 1.7e-12 |
    | same: d/d initial position | – | 2.5e-12 | 7.2e-12 |

    For chaotic dynamics the reconstruction error grows like e^{λ t} (λ the largest Lyapunov
    exponent), exactly as for the forward trajectory itself; use `CheckpointAdjoint` when
    λ·T ≳ 20 in float64. To check a case, compare with `CheckpointAdjoint` on the same run (or
    a shorter one, if its memory is too much). Flipping the velocities and running forward
    again measures the reconstruction error only, which can understate the gradient's error
    (on the chain above: ~1e-13 against 5.4e-10).

    Gradients reach `dt` and `t0` also through the time of each step and frame (a
    time-dependent force or observable), and the values an observable closes over through the
    frames. Not supported: stochastic integrators (noise is not reversible) and forward-mode
    autodiff (`jax.jvp`, `jax.jacfwd`; use `DirectAdjoint` or `CheckpointAdjoint`). Called
    directly under `jax.jvp`/`jax.jacfwd`, `simulate` says so; when the forward-mode transform
    is applied to an already jitted function around it (`jax.jacfwd(jax.jit(f))`), JAX reports
    it in its own words: "can't apply forward-mode autodiff (jvp) to a custom_vjp function".
    Forward over reverse (`jax.hessian`) works.
    """


# --------------------------------------------------------------- forward-mode-only results
_forward_only_p = Primitive("sciax_forward_only")
_forward_only_p.multiple_results = True


def forward_only(tree, message: str):
    """`tree` unchanged; a reverse-mode derivative through its floating arrays raises `message`."""
    leaves, treedef = jtu.tree_flatten(tree)
    marked = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jnp.inexact)]
    if not marked:
        return tree
    outs = _forward_only_p.bind(*[leaves[i] for i in marked], message=message)
    for i, out in zip(marked, outs, strict=True):
        leaves[i] = out
    return jtu.tree_unflatten(treedef, leaves)


def _jvp(primals, tangents, *, message):
    # Linear: the tangents go through the same marker (symbolic zeros stay zeros).
    live = [i for i, t in enumerate(tangents) if type(t) is not ad.Zero]
    tangents_out = list(tangents)
    if live:
        outs = _forward_only_p.bind(*[tangents[i] for i in live], message=message)
        for i, out in zip(live, outs, strict=True):
            tangents_out[i] = out
    return _forward_only_p.bind(*primals, message=message), tangents_out


def _transpose(cotangents, *args, message):
    if any(type(ct) is not ad.Zero for ct in cotangents):
        raise ValueError(message)
    return [ad.Zero(a.aval) if ad.is_undefined_primal(a) else None for a in args]


_forward_only_p.def_impl(lambda *args, message: list(args))
_forward_only_p.def_abstract_eval(lambda *avals, message: list(avals))
ad.primitive_jvps[_forward_only_p] = _jvp
ad.primitive_transposes[_forward_only_p] = _transpose
batching.primitive_batchers[_forward_only_p] = lambda args, dims, *, message: (
    _forward_only_p.bind(*args, message=message), list(dims))
mlir.register_lowering(_forward_only_p, lambda ctx, *args, message: list(args))
