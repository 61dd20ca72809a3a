"""An estimate of the arithmetic a traced function does, counted from its jaxpr before anything
is compiled: `operation_count`.

Each equation counts the number of elements it produces; a matrix product (`dot_general`)
counts each output element once per contracted term (≈ flops / 2 for a multiply-add); a
`scan` body counts `length` times; a `cond` counts its most expensive branch; anything that
repeats an unknown number of times (`while_loop`, e.g. an adaptive Diffrax solve) makes the
count infinite. Calls (`jit`, `custom_jvp`, `custom_vjp`, `checkpoint`, ...) count their body
once. Layout operations (reshape, broadcast, slicing) count like arithmetic: the figure is a
proxy for the work of the compiled program, good to an order of magnitude, not a flop count.
"""

import math

from jax.extend.core import ClosedJaxpr, Jaxpr

_UNBOUNDED = ("while",)  # trip count unknown before running


def operation_count(jaxpr) -> float:
    """Elements produced by the equations of `jaxpr` (a `Jaxpr` or `ClosedJaxpr`), loops
    unrolled by their trip count (see the module docstring); `math.inf` when a loop's trip
    count is not known from the program."""
    if isinstance(jaxpr, ClosedJaxpr):
        jaxpr = jaxpr.jaxpr
    total = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in _UNBOUNDED:
            return math.inf
        inner = [operation_count(j) for j in _subjaxprs(eqn.params)]
        if name == "scan":
            total += eqn.params["length"] * sum(inner)
        elif name == "cond":
            total += max(inner, default=0.0)
        elif inner:
            total += sum(inner)
        else:
            total += sum(_size(v) for v in eqn.outvars) * _contraction(eqn)
    return total


def _subjaxprs(params):
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, (Jaxpr, ClosedJaxpr)):
                yield item


def _size(var) -> int:
    return math.prod(getattr(var.aval, "shape", ()))


def _contraction(eqn) -> int:
    """Terms summed into each output element: the contracted extent of a `dot_general`, else 1."""
    if eqn.primitive.name != "dot_general":
        return 1
    (lhs_contract, _), _ = eqn.params["dimension_numbers"]
    shape = eqn.invars[0].aval.shape
    return math.prod(shape[d] for d in lhs_contract)
