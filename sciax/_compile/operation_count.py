"""An estimate of the arithmetic a traced function does, counted from its jaxpr before anything
is compiled: `operation_count`.

Each equation counts the number of elements it produces, except:

- a reduction (`reduce_sum`, `reduce_max`, `argmax`, ...) counts the elements it reads;
- a matrix product (`dot_general`) counts each output element once per contracted term, and a
  convolution (`conv_general_dilated`) once per kernel term (≈ flops / 2 for multiply-adds);
- a dense factorisation (`cholesky`, `lu`, `qr`, `eigh`, `svd`, ...) counts n per element of its
  matrix, for n its last dimension (n³ for an n × n matrix), and `triangular_solve` n per element
  of its right-hand side;
- a `scan` body counts `length` times; a `cond` counts its most expensive branch; anything that
  repeats an unknown number of times (`while_loop`, e.g. an adaptive Diffrax solve) makes the
  count infinite; calls (`jit`, `custom_jvp`, `custom_vjp`, `checkpoint`, ...) count their body
  once (all of their sub-programs: a `custom_linear_solve` counts its matvec and its solves).

Layout operations (reshape, broadcast, slicing, gathers) count like arithmetic. The figure is a
proxy for the work of the compiled program, good to an order of magnitude, not a flop count.
"""

import math

from jax.extend.core import ClosedJaxpr, Jaxpr

_UNBOUNDED = ("while",)  # trip count unknown before running
_FACTORISATIONS = ("cholesky", "lu", "qr", "geqrf", "householder_product", "eigh", "eig", "svd", "schur", "hessenberg",
                   "tridiagonal")


def operation_count(jaxpr) -> float:
    """Operations of `jaxpr` (a `Jaxpr` or `ClosedJaxpr`) as the module docstring counts them,
    loops unrolled by their trip count; `math.inf` when a loop's trip count is not known from the
    program."""
    if isinstance(jaxpr, ClosedJaxpr):
        jaxpr = jaxpr.jaxpr
    total = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in _UNBOUNDED:
            return math.inf
        inner = [operation_count(j) for j in _subjaxprs(eqn.params)]
        if name == "scan":
            total += eqn.params["length"] * sum(inner) if eqn.params["length"] else 0.0  # never 0 · inf
        elif name == "cond":
            total += max(inner, default=0.0)
        elif inner:
            total += sum(inner)
        else:
            total += _own_count(eqn)
    return total


def _subjaxprs(params):
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, (Jaxpr, ClosedJaxpr)):
                yield item


def _size(var) -> int:
    return math.prod(getattr(var.aval, "shape", ()))


def _own_count(eqn) -> float:
    """The count of one equation without sub-programs (see the module docstring)."""
    name = eqn.primitive.name
    produced = sum(_size(v) for v in eqn.outvars)
    if name.startswith("reduce_") or name in ("argmax", "argmin"):
        return max(produced, sum(_size(v) for v in eqn.invars))
    if name == "dot_general":
        (lhs_contract, _), _ = eqn.params["dimension_numbers"]
        shape = eqn.invars[0].aval.shape
        return produced * math.prod(shape[d] for d in lhs_contract)
    if name == "conv_general_dilated":
        kernel = eqn.invars[1].aval.shape
        out_features = kernel[eqn.params["dimension_numbers"].rhs_spec[0]]
        return produced * math.prod(kernel) / max(out_features, 1)
    if name in _FACTORISATIONS or name == "triangular_solve":
        shape = getattr(eqn.invars[0].aval, "shape", ())
        n = shape[-1] if shape else 1
        return n * _size(eqn.invars[1] if name == "triangular_solve" else eqn.invars[0])
    return produced
