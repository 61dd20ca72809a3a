"""A marker for results that support forward-mode differentiation only.

`forward_only(tree, message)` is the identity on values and on tangents (`jax.jvp`,
`jax.jacfwd`, `jax.linearize` pass through it unchanged), but transposing it, which every
reverse-mode derivative (`jax.grad`, `jax.vjp`, `jax.jacrev`) does, raises `ValueError(message)`.

Why. `solve(adjoint="forward")` computes derivatives with Diffrax's `ForwardMode`, whose
tangents flow through a `lax.while_loop`. Reverse mode transposes the tangent program from the
outputs back, and the while loop cannot be transposed: JAX then reports "Reverse-mode
differentiation does not work for lax.while_loop", which names neither the solve nor the fix.
Marking the solve's outputs puts this transpose first on the way back, so the error names them.
"""

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

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
