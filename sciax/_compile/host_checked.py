"""Run-time checks that sciax has already made on the host, left out of a compiled program.

Diffrax checks its save times (`SaveAt(ts=...)` increasing and within [t0, t1]) and the sign
of `dt0` with `eqx.error_if` whenever they are traced, also with `throw=False`; so does
`sciax.solve` for `t1 >= t0` with traced constant steps. An `error_if` lowers to a host
callback (`jax.pure_callback`), and a program that holds one is kept neither by JAX's
persistent compilation cache ("uses host callbacks") nor by `jax.export`: every new process
compiled a `fit` with a `Solve` rollout from scratch. `fit` checks these same conditions on
the concrete times before it calls its program (`check_times`, `Solve.plan`), so there they
cannot fail.

A rollout wraps the solves whose times were checked that way in `checked_on_host()` (a
`jax.named_scope`). `drop_host_checked(fn)` is `fn`, traced, with the `error_if` of exactly
these checks (recognised by their messages) removed wherever they lie inside such a scope.
Every other `error_if` stays: a model's own, and Diffrax's in a solve that is not marked.
Dropping one changes no value: an `error_if` that does not fail returns its operand as it is.
"""

import functools

import equinox as eqx
import jax
import jax.tree_util as jtu
from jax.extend.core import ClosedJaxpr, Jaxpr, Var, jaxpr_as_fun

SCOPE = "sciax_checked_on_host"
# Messages of the checks that may be dropped: exact, or (Diffrax's `dt0` check, which prints the
# values) a prefix.
_MESSAGES = frozenset({
    "saveat.ts must be increasing or decreasing.",
    "saveat.ts must lie between t0 and t1.",
    "solve: `t1` must not be before `t0`.",
})
_PREFIXES = ("Must have (t1 - t0) * dt0 >= 0",)


def checked_on_host():
    """A context: the checks listed above that are traced inside it hold, as the caller has
    checked them on the host."""
    return jax.named_scope(SCOPE)


def drop_host_checked(fn):
    """`fn(*args)`, evaluated from its jaxpr with the host-checked `error_if`s removed (see the
    module docstring); meant to be called while tracing (under `jit`). `fn`'s outputs must be
    arrays (in any pytree); its non-array arguments are static."""

    @functools.wraps(fn)
    def without_checks(*args):
        dynamic, static = eqx.partition(args, eqx.is_array)
        leaves, treedef = jtu.tree_flatten(dynamic)
        closed, shape = jax.make_jaxpr(
            lambda *flat: fn(*eqx.combine(jtu.tree_unflatten(treedef, list(flat)), static)),
            return_shape=True)(*leaves)
        jaxpr = _rewrite(closed.jaxpr, False)
        if jaxpr is not None:
            closed = closed.replace(jaxpr=jaxpr)
        return jtu.tree_unflatten(jtu.tree_structure(shape), jaxpr_as_fun(closed)(*leaves))

    return without_checks


def holds_host_callback(jaxpr) -> bool:
    """Whether `jaxpr` (a `Jaxpr` or `ClosedJaxpr`), at any depth, holds a host callback."""
    if isinstance(jaxpr, ClosedJaxpr):
        jaxpr = jaxpr.jaxpr
    for eqn in jaxpr.eqns:
        if "callback" in eqn.primitive.name:
            return True
        if any(holds_host_callback(sub) for sub in jax.extend.core.jaxprs_in_params(eqn.params)):
            return True
    return False


def _rewrite(jaxpr: Jaxpr, marked: bool) -> Jaxpr | None:
    """`jaxpr` without the host-checked `error_if`s (inside the scope when `marked`, or inside
    an equation whose name stack holds it); None when there is none."""
    renamed: dict = {}  # output of a dropped check -> the operand it passes through
    eqns, changed = [], False
    for eqn in jaxpr.eqns:
        if renamed:
            eqn = eqn.replace(invars=[_rename(v, renamed) for v in eqn.invars])
        inside = marked or SCOPE in str(eqn.source_info.name_stack)
        if inside and eqn.primitive.name == "cond":
            passed = _passed_through(eqn)
            if passed is not None:
                for out, k in zip(eqn.outvars, passed, strict=True):
                    if isinstance(out, Var) and not isinstance(out, jax.extend.core.DropVar):
                        renamed[out] = eqn.invars[1 + k]  # the first operand is the branch index
                changed = True
                continue
        params = _rewrite_params(eqn.params, inside)
        if params is not None:
            eqn = eqn.replace(params=params)
            changed = True
        eqns.append(eqn)
    if not changed:
        return None
    return jaxpr.replace(eqns=eqns, outvars=[_rename(v, renamed) for v in jaxpr.outvars])


def _rename(v, renamed):
    return renamed.get(v, v) if isinstance(v, Var) else v


def _rewrite_params(params, marked):
    """`params` with their sub-jaxprs rewritten; None when none changed."""
    new, changed = {}, False
    for name, value in params.items():
        rewritten = _rewrite_value(value, marked)
        changed |= rewritten is not None
        new[name] = value if rewritten is None else rewritten
    return new if changed else None


def _rewrite_value(value, marked):
    if isinstance(value, ClosedJaxpr):
        jaxpr = _rewrite(value.jaxpr, marked)
        return None if jaxpr is None else value.replace(jaxpr=jaxpr)
    if isinstance(value, Jaxpr):
        return _rewrite(value, marked)
    if type(value) in (tuple, list):
        items = [_rewrite_value(v, marked) for v in value]
        if all(v is None for v in items):
            return None
        return type(value)(v if r is None else r for v, r in zip(value, items))
    return None


def _passed_through(eqn) -> list[int] | None:
    """For the `cond` of a droppable `error_if` (one branch raises one of the messages above
    through Equinox's callback, another returns its operands unchanged): for each output, the
    index of the branch operand it returns. None for any other `cond`."""
    branches = [b.jaxpr for b in eqn.params["branches"]]
    raising = [b for b in branches if _raises_only_host_checked(b)]
    identity = [b for b in branches if not b.eqns and all(v in b.invars for v in b.outvars)]
    if not raising or not identity or len(raising) + len(identity) != len(branches):
        return None
    first = identity[0]
    passed = [first.invars.index(v) for v in first.outvars]
    if any([b.invars.index(v) for v in b.outvars] != passed for b in identity[1:]):
        return None
    return passed


def _raises_only_host_checked(branch: Jaxpr) -> bool:
    """Whether `branch` is Equinox's error branch and every message it can raise is listed above."""
    messages = []
    for eqn in branch.eqns:
        if eqn.primitive.name != "pure_callback":
            continue
        function = getattr(eqn.params.get("callback"), "callback_func", None)
        if getattr(function, "__module__", None) != "equinox._errors" or function.__name__ != "raises":
            continue
        cells = dict(zip(function.__code__.co_freevars, function.__closure__ or ()))
        try:
            messages += list(cells["msgs"].cell_contents)
        except (KeyError, ValueError, TypeError):  # another Equinox: keep the check
            return False
    return bool(messages) and all(
        isinstance(m, str) and (m in _MESSAGES or m.startswith(_PREFIXES)) for m in messages)
