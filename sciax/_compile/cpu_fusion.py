"""Fusion hints for XLA:CPU: compute several arrays of one shape in one loop.

Why. XLA:CPU's loop fusion gives every output of a time step its own fused loop, and each of
those loops recomputes everything its output depends on. One RK4 step of the Lorenz system
has three outputs (x, y, z), each of which depends on all four stages, so the step was emitted
as three loops of 66–70 operations each where about 55 in one loop would do.

How. `fuse_values(tree)` is the identity on values. On CPU it is lowered as one variadic
`reduce` over a new leading axis of size 2 whose rows are the arrays and −0.0 (0 for
integers): XLA emits a variadic reduce with all its fused producers as *one* loop, so the
step's outputs share their subexpressions. In IEEE 754 arithmetic x + (−0) = x for every x, and
LLVM folds `fadd x, -0.0` to x, so no addition is left in the loop. That folding is what makes it
exact on XLA:CPU, which flushes subnormals to zero in arithmetic: the tests check ±0, ±inf, NaN
and subnormals bit for bit. Without LLVM's optimisation (`xla_backend_optimization_level=0`,
which `fit(compilation="fast")` uses) the addition stays, and a subnormal passing through the
hint is flushed to zero, as it would be by any arithmetic in the step.
Arrays are grouped by shape and dtype (a variadic reduce needs one shape, and XLA one
precision); a group of one is left alone, and so are booleans and floating types narrower than
32 bits (XLA:CPU computes those in float32 and converts back: no single loop, and NaN payloads
are canonicalised). On other platforms the hint is lowered to nothing:
XLA:GPU fuses multiple outputs itself.

Differentiation. The hint is a linear primitive (the identity). Its tangent is the same hint,
so forward mode fuses the tangents of a step's outputs too, and its transpose fuses whatever
`fuse_transposed` says. `fuse_cotangents(tree)` is the identity with nothing to fuse going
forward, but in reverse mode it fuses the cotangents flowing back into `tree`: put it on a
step's *inputs* and the backward step computes all of their cotangents in one loop.

Effect on the Lorenz ensemble (about 1.7x on one core, bitwise the same):
`benchmarks/results/2026-11-22-design-measurements.md`.
"""

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

_hint_p = Primitive("sciax_fusion_hint")
_hint_p.multiple_results = True


def fuse_values(tree):
    """`tree`, with its arrays of one shape computed in one XLA:CPU loop (values and, in
    forward mode, tangents). The identity on values, exactly."""
    return _bind(tree, fuse=True, fuse_transposed=False)


def fuse_cotangents(tree):
    """`tree` unchanged; in reverse mode the cotangents of its arrays of one shape are
    computed in one XLA:CPU loop. Put it on a step's inputs."""
    return _bind(tree, fuse=False, fuse_transposed=True)


def _bind(tree, *, fuse, fuse_transposed):
    leaves, treedef = jtu.tree_flatten(tree)
    arrays = [i for i, leaf in enumerate(leaves) if _is_number_array(leaf)]
    if len(arrays) < 2:
        return tree
    outs = _hint_p.bind(*[leaves[i] for i in arrays], fuse=fuse, fuse_transposed=fuse_transposed)
    for i, out in zip(arrays, outs, strict=True):
        leaves[i] = out
    return jtu.tree_unflatten(treedef, leaves)


def _is_number_array(x) -> bool:
    """A JAX array or tracer of integers, or of floating/complex numbers of 32 bits and more
    (NumPy constants, booleans, bfloat16, float16 and float8 are left alone)."""
    if not isinstance(x, jax.Array) or not jnp.issubdtype(x.dtype, jnp.number):
        return False
    return not jnp.issubdtype(x.dtype, jnp.floating) or jnp.finfo(x.dtype).bits >= 32


def _is_live(t) -> bool:
    """A tangent or cotangent that holds numbers: not a symbolic zero, not float0 (integers')."""
    return type(t) is not ad.Zero and jnp.issubdtype(t.dtype, jnp.number)


# --- the primitive: identity everywhere except its CPU lowering ------------------------------


def _identity(*args, fuse, fuse_transposed):
    del fuse, fuse_transposed
    return list(args)


_hint_p.def_impl(_identity)
_hint_p.def_abstract_eval(lambda *avals, **params: list(avals))


def _jvp(primals, tangents, *, fuse, fuse_transposed):
    primals_out = _hint_p.bind(*primals, fuse=fuse, fuse_transposed=fuse_transposed)
    live = [i for i, t in enumerate(tangents) if _is_live(t)]
    tangents_out = list(tangents)
    if live:
        outs = _hint_p.bind(*[tangents[i] for i in live], fuse=fuse, fuse_transposed=fuse_transposed)
        for i, out in zip(live, outs, strict=True):
            tangents_out[i] = out
    return primals_out, tangents_out


def _transpose(cotangents, *args, fuse, fuse_transposed):
    live = [i for i, ct in enumerate(cotangents) if _is_live(ct) and ad.is_undefined_primal(args[i])]
    out = [ad.Zero(a.aval) if ad.is_undefined_primal(a) else None for a in args]
    if live:
        cts = _hint_p.bind(*[cotangents[i] for i in live], fuse=fuse_transposed, fuse_transposed=fuse)
        for i, ct in zip(live, cts, strict=True):
            out[i] = ct
    return out


def _batch(args, dims, *, fuse, fuse_transposed):
    # Elementwise identity per operand: every output keeps its operand's batch dimension.
    return _hint_p.bind(*args, fuse=fuse, fuse_transposed=fuse_transposed), list(dims)


ad.primitive_jvps[_hint_p] = _jvp
ad.primitive_transposes[_hint_p] = _transpose
batching.primitive_batchers[_hint_p] = _batch


def _fused(*arrays):
    """The CPU lowering of a fusing hint: one variadic reduce per group of arrays of one shape
    and dtype (XLA's verifier rejects a reduce mixing precisions)."""
    out = list(arrays)
    groups: dict[tuple, list[int]] = {}
    for i, a in enumerate(arrays):
        groups.setdefault((a.shape, a.dtype), []).append(i)
    for members in groups.values():
        if len(members) < 2:
            continue
        pads = [_neutral(arrays[i].dtype) for i in members]
        rows = [jnp.stack([arrays[i], jnp.full_like(arrays[i], p)]) for i, p in zip(members, pads, strict=True)]
        sums = lax.reduce(rows, pads, lambda a, b: tuple(x + y for x, y in zip(a, b, strict=True)), (0,))
        for i, s in zip(members, sums, strict=True):
            out[i] = s
    return out


def _neutral(dtype):
    """The exact additive identity: −0.0 for floating types, −0.0 − 0.0i for complex ones
    (+0.0 is not one: −0.0 + 0.0 = +0.0), 0 for integers."""
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return np.array(complex(-0.0, -0.0), dtype)
    return np.array(-0.0 if jnp.issubdtype(dtype, jnp.floating) else 0, dtype)


def _lower_identity(ctx, *args, fuse, fuse_transposed):
    del ctx, fuse, fuse_transposed
    return list(args)


def _lower_cpu(ctx, *args, fuse, fuse_transposed):
    if not fuse:
        return _lower_identity(ctx, *args, fuse=fuse, fuse_transposed=fuse_transposed)
    return mlir.lower_fun(_fused, multiple_results=True)(ctx, *args)


mlir.register_lowering(_hint_p, _lower_identity)
mlir.register_lowering(_hint_p, _lower_cpu, platform="cpu")
