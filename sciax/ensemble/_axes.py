"""Sweep axes: what each axis varies (a system field, a part of the initial state, or the
random seed) and how one member's system, initial state and key are built from its values.

Everything here is host-side validation plus one pure function, `apply_axes`, that runs under
`vmap` (one member at a time, in library style).
"""

import dataclasses
import re
import warnings
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np

from .._compile.callable_key import by_code
from .._validation import describe

SEED = "seed"
STATE = "state0"

_TOKEN = re.compile(r"\.([A-Za-z_]\w*)|\[\s*(-?\d+(?:\s*,\s*-?\d+)*)\s*\]")
_ROOT = re.compile(r"[A-Za-z_]\w*")


@dataclasses.dataclass(frozen=True)
class Axis:
    """An axis whose target is chosen by a function instead of by name.

    **Arguments:**

    - `values`: array `(n, *target_shape)`: the value of the target for each point of the axis.
    - `where`: `where(system, state0) -> array`, selecting the leaf to replace, in the style of
      `eqx.tree_at` (e.g. `lambda system, state0: system.spring.stiffness`).

    ```python
    sweep(system, y0, axes={"k": Axis(jnp.linspace(1, 2, 10), where=lambda s, y: s.spring.k)}, ...)
    ```
    """

    values: object
    where: Callable

    def __post_init__(self):
        if not callable(self.where):
            raise TypeError(f"Axis: `where` must be a function where(system, state0) -> array, got {self.where!r}.")


@dataclasses.dataclass(frozen=True)
class AxisSpec:
    """Where one axis's value goes (hashable: part of the compiled chunk's static config)."""

    name: str
    kind: str  # "system", "state", "where" or "seed"
    attrs: tuple = ()  # attribute path below the root
    index: tuple | None = None  # array index applied after the attribute path
    where: Callable | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class ResolvedAxis:
    """A validated axis: its spec, host coordinates and per-point values."""

    spec: AxisSpec
    coords: np.ndarray  # (n, ...) as given by the user, for lookup and display
    values: np.ndarray  # (n, *target_shape), in the target's dtype

    @property
    def name(self):
        return self.spec.name

    @property
    def kind(self):
        return self.spec.kind

    def __len__(self):
        return self.values.shape[0]


def _path_of(name: str):
    """Split 'a.b[1,2]' into ('a', ('b',), (1, 2)); None if `name` is not a path."""
    root = _ROOT.match(name)
    if root is None:
        return None
    attrs, index, pos = [], None, root.end()
    while pos < len(name):
        token = _TOKEN.match(name, pos)
        if token is None or index is not None:  # an index must come last
            return None
        if token.group(1) is not None:
            attrs.append(token.group(1))
        else:
            index = tuple(int(i) for i in token.group(2).split(","))
        pos = token.end()
    return root.group(0), tuple(attrs), index


def sweepable_fields(system) -> list[str]:
    """Names of the array fields of `system` that an axis may vary."""
    names = []
    if not dataclasses.is_dataclass(system):  # a plain pytree (with `run=`): no named fields
        return names
    for field in dataclasses.fields(system):
        if field.metadata.get("static", False):
            continue
        value = getattr(system, field.name, None)
        is_number = isinstance(value, int | float | np.number) and not isinstance(value, bool | np.bool_)
        if isinstance(value, jax.Array | np.ndarray | eqx.Module) or is_number:
            names.append(field.name)
    return names


def _valid_names(system, state0) -> str:
    state = [STATE, f"{STATE}[i]"] if isinstance(state0, jax.Array | np.ndarray) else [f"{STATE}.<field>[i]"]
    return ", ".join(repr(n) for n in sweepable_fields(system) + state + [SEED])


def _walk(obj, attrs, name, what):
    for attr in attrs:
        if isinstance(obj, eqx.Module) and attr in {f.name for f in dataclasses.fields(obj)}:
            field = next(f for f in dataclasses.fields(obj) if f.name == attr)
            if field.metadata.get("static", False):
                raise ValueError(
                    f"sweep: axis {name!r} names `{attr}`, a static field of {type(obj).__name__}; "
                    "static configuration cannot be swept (it would recompile per value). "
                    "Build one system per value and sweep each."
                )
            obj = getattr(obj, attr)
        else:
            valid = [f.name for f in dataclasses.fields(obj)] if dataclasses.is_dataclass(obj) else []
            raise ValueError(f"sweep: axis {name!r}: {what} has no field `{attr}`; valid fields: {valid}.")
    return obj


_MAX_SEED = 2**32 - 1


def resolve_axes(axes, system, state0) -> list[ResolvedAxis]:
    """Validate `axes` (dict name -> values or `Axis`) against `system` and `state0`."""
    if not isinstance(axes, dict) or not axes:
        raise TypeError(
            "sweep: `axes` must be a non-empty dict mapping names to values, e.g. "
            "{'rho': jnp.linspace(0, 30, 100), 'seed': jnp.arange(4)}; got "
            f"{describe(axes) if not isinstance(axes, dict) else 'an empty dict'}."
        )
    resolved = [_resolve(name, spec, system, state0) for name, spec in axes.items()]
    _check_disjoint(resolved, system, state0)
    return resolved


def _check_disjoint(resolved, system, state0):
    """Refuse two axes that write the same value (e.g. 'state0[0]' and 'state0[-3]', or 'rho' and
    an `Axis` whose `where` picks `rho`): the later one would silently win, and the result's
    coordinates would name values a member never ran with.

    Every element of every leaf of (system, state0) gets a unique integer id; each axis's
    target is looked up in that tree of ids, and two axes overlap if their ids intersect.
    """
    counter = [0]

    def ids(leaf):
        shape = np.shape(leaf)
        out = np.arange(counter[0], counter[0] + int(np.prod(shape)), dtype=np.int64).reshape(shape)
        counter[0] += out.size
        return out

    id_system, id_state = jtu.tree_map(ids, (system, state0))
    written = {}
    for axis in resolved:
        spec = axis.spec
        if spec.kind == "seed":
            continue
        try:
            if spec.kind == "where":
                target = spec.where(id_system, id_state)
            else:
                target = id_system if spec.kind == "system" else id_state
                for attr in spec.attrs:
                    target = getattr(target, attr)
                target = np.asarray(target)[spec.index] if spec.index is not None else target
            elements = set(np.asarray(target).ravel().tolist())
        except Exception:  # noqa: BLE001 - a `where` that cannot read the id tree: not checkable
            continue
        for other, seen in written.items():
            if elements & seen:
                raise ValueError(f"sweep: axes {other!r} and {axis.name!r} set the same value; one would "
                                 "silently overwrite the other. Give each value one axis.")
        written[axis.name] = elements


def _resolve(name, spec, system, state0) -> ResolvedAxis:
    if not isinstance(name, str):
        raise TypeError(f"sweep: axis names must be strings, got {name!r}.")
    where = spec.where if isinstance(spec, Axis) else None
    raw = spec.values if isinstance(spec, Axis) else spec
    try:
        coords = np.asarray(raw)
    except Exception as e:  # noqa: BLE001 - report what the user passed
        raise TypeError(f"sweep: axis {name!r}: values must be an array, got {describe(raw)}.") from e
    if coords.ndim == 0 or coords.shape[0] == 0:
        raise ValueError(f"sweep: axis {name!r} must hold at least one value along its first dimension, "
                         f"got {describe(coords)}.")
    if where is not None:
        try:
            target = where(system, state0)
        except (AttributeError, IndexError, KeyError, TypeError) as e:  # e.g. a misspelt field
            raise ValueError(f"sweep: axis {name!r}: its `where` failed on the system and initial state ({e}); "
                             f"valid names: {_valid_names(system, state0)}.") from e
        try:  # what apply_axes will do: fails here, naming the axis, if `where` built a new array
            eqx.tree_at(lambda p: where(p[0], p[1]), (system, state0), target)
        except Exception as e:  # noqa: BLE001 - tree_at's own message follows
            raise ValueError(
                f"sweep: axis {name!r}: `where` must return a leaf of the system or initial state as it "
                f"is (e.g. `lambda s, y: s.spring.k`), not a value computed from one such as an element "
                f"`y[0]`; for an element use a name such as 'state0[0]' or 'masses[1]'. ({e})"
            ) from e
        # keyed by code: a `where` lambda re-created at every call reuses the compiled chunk
        return _axis(name, coords, target, "where", state0, where=by_code(where))
    if name == SEED:
        if not np.issubdtype(coords.dtype, np.integer) or coords.ndim != 1:
            raise ValueError(f"sweep: axis 'seed' must be a 1-D array of integers, got {describe(coords)}.")
        if np.any(coords < 0) or np.any(coords > _MAX_SEED):
            bad = coords[(coords < 0) | (coords > _MAX_SEED)][0]
            raise ValueError(f"sweep: axis 'seed' values must be in [0, 2**32 - 1] (a random key folds in "
                             f"32 bits; larger or negative seeds would share noise), got {bad}.")
        return ResolvedAxis(AxisSpec(name, "seed"), coords, coords.astype(np.uint32))
    path = _path_of(name)
    if path is None:
        raise ValueError(
            f"sweep: cannot read axis name {name!r}; use a field name ('rho'), a nested field "
            f"('spring.k'), an indexed field ('masses[0]'), a state component ('state0[1]') or "
            f"'seed'. Valid names here: {_valid_names(system, state0)}."
        )
    root, attrs, index = path
    if root == STATE:
        kind, target = "state", _walk(state0, attrs, name, "the initial state")
    else:
        if root not in sweepable_fields(system):
            fields = {f.name: f for f in dataclasses.fields(system)} if dataclasses.is_dataclass(system) else {}
            if root not in fields:
                reason = "no such field"
            elif fields[root].metadata.get("static", False):
                reason = "a static field"
            else:
                reason = f"it holds {describe(getattr(system, root, None))}, not an array or number"
            raise ValueError(
                f"sweep: axis {name!r} does not name a field of {type(system).__name__} ({reason}); "
                f"valid names: {_valid_names(system, state0)}."
            )
        kind, target = "system", _walk(system, (root, *attrs), name, type(system).__name__)
    if index is not None:
        shape = jnp.shape(target)
        if len(index) > len(shape) or any(not -n <= i < n for i, n in zip(index, shape)):
            raise ValueError(f"sweep: axis {name!r}: index {list(index)} is out of range for an array "
                             f"of shape {shape}.")
        target = jnp.asarray(target)[index]
    return _axis(name, coords, target, kind, state0, attrs=attrs if kind == "state" else (root, *attrs), index=index)


def _axis(name, coords, target, kind, state0=None, **where) -> ResolvedAxis:
    if not isinstance(target, jax.Array | np.ndarray | float | int):
        raise ValueError(f"sweep: axis {name!r} targets {describe(target)}; an axis must target an array leaf.")
    shape, dtype = jnp.shape(target), jnp.result_type(target)
    weak_float = isinstance(target, float) or (
        getattr(target, "weak_type", False) and jnp.issubdtype(dtype, jnp.floating))
    if weak_float and state0 is not None:
        # A Python float, or a weakly typed array made from one (a field with converter=jnp.asarray,
        # float64 when x64 is on), takes the run's precision (the state's), as it does in the step.
        floats = [x for x in jtu.tree_leaves(state0) if jnp.issubdtype(jnp.result_type(x), jnp.floating)]
        dtype = jnp.result_type(*floats) if floats else dtype
    if coords.shape[1:] != shape:
        raise ValueError(
            f"sweep: axis {name!r}: each value must have the shape of its target {shape}, so the "
            f"values must have shape (n, *{shape}); got {coords.shape}."
        )
    if jnp.issubdtype(dtype, jnp.floating) and not np.issubdtype(coords.dtype, np.number):
        raise ValueError(f"sweep: axis {name!r}: values must be numbers, got dtype {coords.dtype}.")
    if not jnp.issubdtype(dtype, jnp.complexfloating) and np.issubdtype(coords.dtype, np.complexfloating):
        raise ValueError(f"sweep: axis {name!r}: its target holds real {dtype} values, got complex values "
                         f"({coords.dtype}); the imaginary part would be dropped.")
    with np.errstate(over="ignore", invalid="ignore"):
        values = np.asarray(coords, dtype=dtype)
    if jnp.issubdtype(dtype, jnp.inexact) and np.issubdtype(coords.dtype, np.number):
        overflowed = ~np.isfinite(values) & np.isfinite(coords)
        if overflowed.any():  # 1e40 in float32 would run as inf under the label 1e40
            lost = coords[overflowed].flat[0]
            raise ValueError(
                f"sweep: axis {name!r}: {lost.item()!r} overflows {jnp.dtype(dtype).name}, the precision of its target "
                f"(largest finite value {float(jnp.finfo(dtype).max):g}), and would run as inf. Give values in "
                f"range, or run in float64.")
    if not jnp.issubdtype(dtype, jnp.inexact) and not np.array_equal(values, coords):
        # e.g. Lorenz(rho=28) holds an integer: 24.5 would silently run as 24.
        lost = coords[values != coords].flat[0]
        raise ValueError(
            f"sweep: axis {name!r}: its target holds {dtype} values, and {lost} cannot be represented "
            f"as {dtype}. If the parameter is meant to be real, give the system a float value "
            f"(e.g. {name.split('[')[0].split('.')[-1]}=28.0, not 28)."
        )
    return ResolvedAxis(AxisSpec(name, kind, **where), coords, values)


def warn_merged_coordinates(axis: ResolvedAxis):
    """Warn when distinct coordinates of a grid axis round to one value of the target's precision
    (28.0 and 28.0000005 in float32): two members of the grid would run one value under two
    labels. A warning, not an error: random samples in float32 do this by chance (about 2% of
    10^6 uniform draws), where it is harmless; on a grid it is usually a resolution mistake."""
    if not np.issubdtype(axis.values.dtype, np.inexact) or axis.values.dtype == axis.coords.dtype:
        return
    rows = lambda a: a.reshape(len(a), -1)  # noqa: E731
    unique = (lambda a: np.unique(a[:, 0])) if rows(axis.values).shape[1] == 1 else (lambda a: np.unique(a, axis=0))
    merged = len(unique(rows(axis.coords))) - len(unique(rows(axis.values)))
    if merged <= 0:
        return
    seen = {}
    for c, v in zip(rows(axis.coords), rows(axis.values), strict=True):
        other = seen.setdefault(v.tobytes(), c)
        if not np.array_equal(other, c, equal_nan=True):
            show = lambda a: a.item() if a.size == 1 else a.tolist()  # noqa: E731
            count = "1 distinct value rounds" if merged == 1 else f"{merged} distinct values round"
            warnings.warn(
                f"sweep: axis {axis.name!r}: in {axis.values.dtype}, the precision of its target, {count} onto "
                f"another (e.g. {show(other)!r} and {show(c)!r} are both {show(v)!r}), so those grid members run "
                f"one value under two labels. Give values that differ in {axis.values.dtype}, or run in float64.",
                RuntimeWarning, stacklevel=4)  # the caller of sweep
            return


def _replace(obj, attrs, index, value):
    if not attrs:
        return jnp.asarray(obj).at[index].set(value) if index is not None else value

    def get(o):
        for a in attrs:
            o = getattr(o, a)
        return o

    leaf = get(obj)
    new = jnp.asarray(leaf).at[index].set(value) if index is not None else value
    return eqx.tree_at(get, obj, new)


def apply_axes(axes: tuple[AxisSpec, ...], system, state0, key, values, flat_index):
    """One member: the system, initial state and key given one value per axis (pure; vmappable).

    Keys: with a 'seed' axis, member key = `fold_in(key, seed)` (or `jax.random.key(seed)` if no
    `key` was given), so members that share a seed share noise; otherwise, with a `key`, member
    key = `fold_in(key, flat_index)`; otherwise None.
    """
    member_key = None if key is None else jr.fold_in(key, flat_index)
    for axis, value in zip(axes, values):
        if axis.kind == "seed":
            member_key = jr.key(value) if key is None else jr.fold_in(key, value)
        elif axis.kind == "system":
            system = _replace(system, axis.attrs, axis.index, value)
        elif axis.kind == "state":
            state0 = _replace(state0, axis.attrs, axis.index, value)
        else:
            system, state0 = eqx.tree_at(lambda p, w=axis.where: w(p[0], p[1]), (system, state0), value)
    return system, state0, member_key
