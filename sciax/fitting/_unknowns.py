"""Which values a fit moves: the selected system leaves, their transforms, and the fitted
entries of the initial state (with the flat layout of a state pytree)."""

import dataclasses
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .._validation import describe
from ._transforms import AbstractTransform, Identity

# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------


class Block(eqx.Module):
    """One fitted leaf of the system (or the fitted entries of the initial state)."""

    name: str = eqx.field(static=True)
    shape: tuple[int, ...] = eqx.field(static=True)
    transform: AbstractTransform
    start: int = eqx.field(static=True)  # offset in the unknown vector (-1 for a fixed block)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def fixed(self) -> bool:
        return self.transform.fixed


def leaf_name(path) -> str:
    name = jtu.keystr(path)
    return name.removeprefix(".")


def _is_float_leaf(x) -> bool:
    if isinstance(x, float):
        return True
    return isinstance(x, (jax.Array, np.ndarray)) and jnp.issubdtype(x.dtype, jnp.inexact)


def resolve_params(system, params, transforms):
    """Return (leaf indices, leaf names, transform keys that may name each leaf)."""
    with_paths = jtu.tree_flatten_with_path(system)[0]
    names = [leaf_name(p) for p, _ in with_paths]
    leaves = [x for _, x in with_paths]
    float_names = [n for n, x in zip(names, leaves) if _is_float_leaf(x)]
    system_name = type(system).__name__
    valid = ", ".join(repr(n) for n in float_names) or "(none)"

    if isinstance(params, str):
        params = (params,)
    if isinstance(params, eqx.Module) and not callable(params):
        selected = _from_filter(system, params, system_name)
        groups = [(names[i],) for i in selected]
    elif isinstance(params, (tuple, list)) and params and all(isinstance(p, str) for p in params):
        selected, groups = [], []
        for name in params:
            key = "." + name if not name.startswith((".", "[")) else name
            hits = [i for i, p in enumerate(with_paths) if jtu.keystr(p[0]) == key
                    or jtu.keystr(p[0]).startswith((key + ".", key + "["))]
            if not hits:
                top = name.lstrip(".").split(".")[0].split("[")[0]
                if top in float_names:
                    raise ValueError(
                        f"fit: `{name}` selects part of the parameter `{top}`; fit selects whole fields, "
                        f"so pass '{top}' to fit all of its entries (fittable fields: {valid})."
                    )
                under = [n for n in float_names if n.startswith((top + ".", top + "["))]
                if under:
                    raise ValueError(
                        f"fit: {system_name} has no parameter `{name}`; the parameters under `{top}` are "
                        f"{', '.join(repr(n) for n in under)}."
                    )
                if any(f.name == top for f in dataclasses.fields(system)):
                    raise ValueError(
                        f"fit: `{name}` is a field of {system_name} but not a fittable parameter (it is "
                        f"static configuration or not an array); fittable fields: {valid}."
                    )
                raise ValueError(
                    f"fit: {system_name} has no parameter field `{name}`; valid field names: {valid}."
                )
            for i in hits:
                if i in selected:
                    raise ValueError(f"fit: parameter `{names[i]}` is selected twice in `params`.")
                selected.append(i)
                groups.append((names[i], name))
    elif callable(params):
        selected = _from_selector(system, params, leaves, system_name)
        groups = [(names[i],) for i in selected]
    else:
        raise TypeError(
            "fit: `params` must be a field name, a list of field names (e.g. ('omega', 'zeta')), a "
            "selector function `lambda system: (system.omega, ...)` like eqx.tree_at's `where`, or a "
            f"boolean filter of the same structure as the system; got {describe(params)}."
        )
    if not selected:
        raise ValueError("fit: `params` selects no parameter; name at least one field to fit.")
    for i in selected:
        if not _is_float_leaf(leaves[i]):
            raise TypeError(
                f"fit: parameter `{names[i]}` of {system_name} is {describe(leaves[i])}; only "
                f"floating-point array fields can be fitted (fittable fields: {valid})."
            )
    return selected, [names[i] for i in selected], groups


def _from_filter(system, spec, system_name):
    flags, spec_def = jtu.tree_flatten(spec)
    if spec_def != jtu.tree_structure(system):
        raise ValueError(
            f"fit: a filter passed as `params` must have the structure of the {system_name} it selects "
            "from (build it with jtu.tree_map(lambda _: False, system) and eqx.tree_at)."
        )
    if not all(isinstance(f, (bool, np.bool_)) for f in flags):
        raise TypeError("fit: a filter passed as `params` must hold Python bools (True = fit this leaf).")
    return [i for i, f in enumerate(flags) if f]


class _Leaf:
    """Stand-in for leaf `index` of the system: a selector is applied to a copy of the system
    made of these, so what it returns is matched by position. Matching the real leaves by
    identity would also pick every other field holding the same object (two fields with the
    same float default, or one array passed to two fields)."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


def _from_selector(system, where, leaves, system_name):
    marked = jtu.tree_unflatten(jtu.tree_structure(system), [_Leaf(i) for i in range(len(leaves))])
    try:
        nodes = where(marked)
    except AttributeError as e:  # e.g. a misspelt field: name it, with the fields there are
        fields = [f.name for f in dataclasses.fields(system)] if dataclasses.is_dataclass(system) else []
        raise ValueError(f"fit: the `params` selector failed on the {system_name} passed in ({e}); "
                         f"its fields are {fields}.") from e
    except Exception:  # noqa: BLE001 - e.g. arithmetic on a field: reported below as not a field
        nodes = None
    if not isinstance(nodes, (tuple, list)):
        nodes = (nodes,)
    selected = []
    for node in nodes:
        node_leaves = jtu.tree_leaves(node)
        hits = [leaf.index for leaf in node_leaves if isinstance(leaf, _Leaf)]
        if not node_leaves or len(hits) < len(node_leaves):
            raise ValueError(
                f"fit: the `params` selector returned {describe(node)}, which is not a field of the "
                f"{system_name} passed in; return fields of its argument, e.g. "
                "lambda system: (system.omega, system.zeta)."
            )
        selected.extend(i for i in hits if i not in selected)
    return selected


def resolve_transforms(transforms, leaf_names, groups, fit_state: bool):
    """Map each fitted leaf (and "state0") to its transform; unknown keys are errors."""
    if transforms is None:
        transforms = {}
    if isinstance(transforms, AbstractTransform):
        return [transforms] * len(leaf_names), Identity()
    if not isinstance(transforms, dict):
        raise TypeError(
            "fit: `transforms` must be a dict mapping parameter names to transforms, e.g. "
            f"{{'rho': Positive()}}, or one transform for every parameter; got {describe(transforms)}."
        )
    valid = {n for g in groups for n in g} | ({"state0"} if fit_state else set())
    for key, value in transforms.items():
        if key not in valid:
            extra = "" if fit_state or key != "state0" else " ('state0' needs fit_initial_state)"
            raise ValueError(
                f"fit: `transforms` names `{key}`, which is not a fitted value{extra}; valid names: "
                f"{', '.join(repr(v) for v in sorted(valid))}."
            )
        if not isinstance(value, AbstractTransform):
            raise TypeError(
                f"fit: transforms[{key!r}] must be a transform such as Positive(), Bounded(lo, hi), "
                f"Identity() or Fixed(), got {describe(value)}."
            )
    per_leaf = []
    for g in groups:
        hits = [transforms[n] for n in g if n in transforms]
        per_leaf.append(hits[0] if hits else Identity())
    return per_leaf, transforms.get("state0", Identity())


# ---------------------------------------------------------------------------------------------
# State flattening
# ---------------------------------------------------------------------------------------------


class StateLayout(eqx.Module):
    """Static description of a state pytree, to pack it into and out of a flat vector."""

    treedef: object = eqx.field(static=True)
    shapes: tuple[tuple[int, ...], ...] = eqx.field(static=True)

    @property
    def size(self) -> int:
        return sum(math.prod(s) for s in self.shapes)

    def flatten(self, state):
        return jnp.concatenate([jnp.ravel(x) for x in jtu.tree_leaves(state)])

    def unflatten(self, flat):
        out, start = [], 0
        for shape in self.shapes:
            n = math.prod(shape)
            out.append(flat[start:start + n].reshape(shape))
            start += n
        return jtu.tree_unflatten(self.treedef, out)

    def labels(self, prefix: str) -> list[str]:
        paths = [leaf_name(p) for p, _ in jtu.tree_flatten_with_path(
            jtu.tree_unflatten(self.treedef, [0] * len(self.shapes)))[0]]
        out = []
        for path, shape in zip(paths, self.shapes):
            base = prefix + ("." + path if path and not path.startswith("[") else path)
            out.extend(entry_labels(base, shape))
        return out


def entry_labels(base: str, shape) -> list[str]:
    if shape == ():
        return [base]
    return [f"{base}[{','.join(map(str, idx))}]" for idx in np.ndindex(*shape)]


def state_layout(state) -> StateLayout:
    leaves, treedef = jtu.tree_flatten(state)
    return StateLayout(treedef, tuple(tuple(np.shape(x)) for x in leaves))


def resolve_state_mask(fit_initial_state, state0, layout: StateLayout) -> np.ndarray:
    """Flat indices of the initial-state entries to fit."""
    if isinstance(fit_initial_state, (bool, np.bool_)):
        flags = [np.full(s, bool(fit_initial_state)) for s in layout.shapes]
    else:
        try:
            leaves = jtu.tree_leaves(jtu.tree_map(lambda m, x: np.broadcast_to(np.asarray(m), np.shape(x)),
                                                  fit_initial_state, state0))
        except (ValueError, TypeError) as err:
            raise ValueError(
                "fit: `fit_initial_state` must be True/False or a boolean mask with the structure of "
                f"state0 (one bool array per leaf, broadcastable to its shape); got {describe(fit_initial_state)} "
                f"({err})."
            ) from None
        if not all(np.asarray(x).dtype == np.bool_ for x in leaves):
            raise TypeError("fit: a `fit_initial_state` mask must hold booleans (True = fit this entry).")
        flags = leaves
    return np.flatnonzero(np.concatenate([np.ravel(f) for f in flags]))


# ---------------------------------------------------------------------------------------------
# Data
