"""Host-side argument checks. Each failure names the argument, what was expected and what was
received, so that the message alone tells the user how to fix the call."""

import math
import numbers

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from ._errors import StateMismatchError


def is_concrete(x) -> bool:
    """True if `x` holds a value on the host (not a tracer inside jit/vmap/grad)."""
    return not isinstance(x, jax.core.Tracer)


def refuse_tracers(where: str, why: str, **arguments) -> None:
    """Raise `TypeError` naming the first argument that holds a JAX tracer (a value being traced
    by `jax.jit`, `jax.grad`, `jax.vmap`, ...), in its leaves or among the values a function in
    it closes over or takes as defaults: `where` runs on the host, for the reason `why`."""
    for name, value in arguments.items():
        if any(_holds_tracer(leaf) for leaf in jtu.tree_leaves(value)):
            raise TypeError(
                f"{where}: `{name}` is being traced by a JAX transformation (jax.jit, jax.grad, jax.vmap, ...), "
                f"but {where} runs on the host: {why} Call it outside the transformation."
            )


def _holds_tracer(leaf) -> bool:
    if not is_concrete(leaf):
        return True
    if not callable(leaf) or isinstance(leaf, type):
        return False
    captured = list(getattr(leaf, "__defaults__", None) or ())
    for cell in getattr(leaf, "__closure__", None) or ():
        try:
            captured.append(cell.cell_contents)
        except ValueError:  # a cell not filled yet
            pass
    return not all(is_concrete(x) for x in jtu.tree_leaves(captured))


def describe(x) -> str:
    """Short description of a value for error messages: shape and dtype for arrays."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"array of shape {tuple(x.shape)} and dtype {x.dtype}"
    return f"{type(x).__name__} {x!r}"


def positive_int(name: str, value, where: str | None = None) -> int:
    """`value` as an int, if it is an integer > 0 (`where`, the calling function, starts the message)."""
    at = f"{where}: " if where else ""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{at}`{name}` must be a Python int, got {describe(value)}.")
    if value <= 0:
        raise ValueError(f"{at}`{name}` must be a positive integer, got {value}.")
    return int(value)


def real_number(where: str, name: str, value) -> None:
    """Raise `TypeError` unless `value` is a real number: a Python int or float, or a NumPy/JAX
    scalar, 0-d array or tracer of integer or floating dtype. Strings, bools and complex numbers
    are refused (float("0.1") and float(True) would accept them silently)."""
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool)  # int, float, Fraction, ...
    else:
        ok = jnp.issubdtype(dtype, jnp.integer) or jnp.issubdtype(dtype, jnp.floating)
    if not ok:
        raise TypeError(f"{where}: `{name}` must be a real number, got {describe(value)}.")


def positive_finite_scalar(name: str, value, where: str = "solve", *, allow_zero: bool = False) -> float | None:
    """Check a tolerance when its value is known on the host (`where`: the calling function);
    returns it as a float then, else None (a tracer)."""
    if jnp.ndim(value) != 0:
        raise ValueError(f"{where}: `{name}` must be a scalar, got {describe(value)}.")
    real_number(where, name, value)
    if not is_concrete(value):
        return None
    v = float(value)
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        wanted = "finite and >= 0" if allow_zero else "positive and finite"
        raise ValueError(f"{where}: `{name}` must be {wanted}, got {v}.")
    return v


def check_tolerances(where: str, rtol, atol) -> None:
    """`rtol`, `atol`: `None` (a default) or real scalars; when known on the host (not traced
    inside `jit`/`grad`), finite, ≥ 0 and not both 0. (`rtol=0` asks for an absolute tolerance
    only; with both 0 the step test |Δx| < rtol·|x| + atol can never pass, and an infinite one
    passes at once.)"""
    values = [positive_finite_scalar(name, value, where, allow_zero=True)
              for name, value in (("rtol", rtol), ("atol", atol)) if value is not None]
    if len(values) == 2 and values == [0.0, 0.0]:
        raise ValueError(f"{where}: `rtol` and `atol` are both 0, a tolerance no step can meet; "
                         "make at least one of them positive.")


def check_time_scalar(where: str, name: str, value, dtype, *, positive: bool = False) -> None:
    """Check a time or step size that will be cast to the state's `dtype`: a scalar and, when its
    value is known on the host, finite (and > 0 if `positive`) after the cast, which in float32
    turns 1e-46 into 0 and 1e39 into inf."""
    if jnp.ndim(value) != 0:
        raise ValueError(f"{where}: `{name}` must be a scalar, got {describe(value)}.")
    real_number(where, name, value)
    if is_concrete(value):
        with np.errstate(over="ignore", under="ignore"):
            cast = float(np.asarray(value).astype(dtype))

        def valid(x):
            return math.isfinite(x) and (x > 0 or not positive)

        if not valid(cast):
            need = "positive and finite" if positive else "finite"
            got = f"{float(value)!r}" if not valid(float(value)) else \
                f"{float(value)!r}, which is {cast!r} in {jnp.dtype(dtype).name}"
            raise ValueError(f"{where}: `{name}` must be {need}, got {got}.")


def check_finite_state(where: str, name: str, state, need: str = "the run needs a finite initial state") -> None:
    """Raise `ValueError` if an initial state known on the host holds NaN or Inf (every frame
    of the run would be non-finite, and an adaptive solver would spend its `max_steps`);
    `need` ends the message."""
    for path, leaf in jtu.tree_flatten_with_path(state)[0]:
        if not is_concrete(leaf):
            return
        bad = ~np.isfinite(np.asarray(leaf))
        if bad.any():
            at = jtu.keystr(path) + (str(np.argwhere(bad)[0].tolist()) if bad.ndim else "")
            raise ValueError(f"{where}: `{name}` holds NaN or Inf ({np.count_nonzero(bad)} value(s), the "
                             f"first at {name}{at}); {need}.")


def state_dtype(state):
    """The floating dtype of a state pytree; raises if a leaf is not floating (integer leaves are
    allowed beside floating ones in a structured state, e.g. image counts) or floating leaves
    disagree."""
    leaves = jtu.tree_leaves(state)
    if not leaves:
        raise StateMismatchError("the state has no array leaves; expected floating arrays.")
    if not jtu.treedef_is_leaf(jtu.tree_structure(state)) and any(
            type(leaf) in (bool, int, float, complex) for leaf in leaves):
        # A list or tuple of Python numbers is not an array (it failed inside the traced step);
        # a bare Python float and NumPy scalars (np.float64 subclasses float) are fine.
        raise StateMismatchError(
            f"state leaves must be arrays, got {describe(state)} holding Python numbers; convert the "
            "initial state with jnp.asarray(...) (e.g. jnp.array([1.0, 0.0, 0.0]))."
        )
    dtypes = {jnp.result_type(leaf) for leaf in leaves}
    structured = not jtu.treedef_is_leaf(jtu.tree_structure(state))
    if structured and any(jnp.issubdtype(d, jnp.floating) for d in dtypes):
        # Integer leaves beside floating ones are counters (an MD state's image counts): the
        # floating leaves set the precision.
        dtypes = {d for d in dtypes if not jnp.issubdtype(d, jnp.integer)}
    for d in dtypes:
        if not jnp.issubdtype(d, jnp.floating):
            raise StateMismatchError(
                f"state leaves must be floating point (float64, float32, or the half precisions float16 and "
                f"bfloat16), got dtype {d}; "
                "convert the initial state with jnp.asarray(..., dtype=jnp.float64) or float32."
            )
    if len(dtypes) > 1:
        raise StateMismatchError(
            f"state leaves have mixed dtypes {sorted(map(str, dtypes))}; use one precision."
        )
    return dtypes.pop()


def check_parameter(system: str, name: str, value, *, minimum: float = 0.0, strict: bool = False,
                     scalar: bool = False) -> None:
    """Raise `ValueError` unless every entry of `value` is ≥ (or >, if `strict`) `minimum`.

    With `scalar=True` the value must also be 0-d. The value check is skipped for traced
    values (a system built inside `jit`/`vmap`); NaN fails it. Shared by the system classes.
    """
    if scalar and jnp.ndim(value) != 0:
        raise ValueError(
            f"{system}: `{name}` must be a scalar, got an array of shape {jnp.shape(value)}; "
            "to sweep it, vmap over systems instead."
        )
    if not is_concrete(value):
        return
    v = np.asarray(value)
    ok = np.all(v > minimum) if strict else np.all(v >= minimum)
    if not ok:
        relation = ">" if strict else ">="
        shown = v.item() if v.ndim == 0 else f"an array with minimum {np.nanmin(v)!r}"
        raise ValueError(f"{system}: `{name}` must be {relation} {minimum:g}, got {shown}.")


def check_precision(system, state_dtype, where: str, what: str = "the system") -> None:
    """Refuse float parameters wider than the state: a float64 parameter would promote a float32
    state to float64 inside the step (and `lax.scan` needs a fixed carry type). Casting the
    result back would be a silent downcast, so the user is asked to choose one precision."""
    wider = [
        jtu.keystr(path) or "(the value itself)"
        for path, leaf in jtu.tree_flatten_with_path(system)[0]
        if isinstance(leaf, jax.Array | np.ndarray | np.generic) and jnp.issubdtype(leaf.dtype, jnp.floating)
        and not getattr(leaf, "weak_type", False)
        # a NumPy float64 array becomes float32 in JAX when x64 is off: judge what JAX will see
        and jnp.promote_types(jax.dtypes.canonicalize_dtype(leaf.dtype), state_dtype) != state_dtype
    ]
    if wider:
        raise TypeError(
            f"{where}: the state is {jnp.dtype(state_dtype).name} but {what} has wider float "
            f"parameters at {', '.join(wider)}, which would promote the state. Use one precision: "
            f"convert the state, or {what} with sciax.astype(..., jnp.{jnp.dtype(state_dtype).name})."
        )


def astype(tree, dtype):
    """Cast every floating-point array leaf of a pytree (a system, a state) to `dtype`, a floating
    dtype (float64, float32, or the half precisions float16 and bfloat16)."""
    try:
        wanted = None if dtype is None else jnp.dtype(dtype)
    except TypeError:  # not a dtype at all, e.g. "foo"
        wanted = None
    if wanted is None or not jnp.issubdtype(wanted, jnp.floating):
        got = repr(dtype) if wanted is None else wanted.name
        raise TypeError(f"astype: `dtype` must be a floating dtype (float64, float32, float16 or bfloat16), got {got}.")
    if wanted.itemsize == 8 and not jax.config.jax_enable_x64:  # JAX would give float32, silently
        raise ValueError("astype: float64 needs x64 on (jax.config.update('jax_enable_x64', True) before any "
                         "array is created); without it JAX makes float32 arrays.")
    return jtu.tree_map(
        lambda x: x.astype(dtype)
        if isinstance(x, jax.Array | np.ndarray | np.generic) and jnp.issubdtype(x.dtype, jnp.floating) else x,
        tree,
    )


def describe_structure(tree) -> str:
    """The structure, shapes and dtypes of a pytree, for error messages: `array of shape (2,) and
    dtype float64`, or `PhaseSpace(positions=(3, 2) float64, velocities=(3, 2) float64)`."""
    leaves, treedef = jtu.tree_flatten(tree)
    if jtu.treedef_is_leaf(treedef):
        return describe(tree)
    shown = jtu.tree_unflatten(treedef, [_Shown(x) for x in leaves])
    return f"{type(tree).__name__} {shown!r}" if not isinstance(tree, (tuple, list, dict)) else repr(shown)


class _Shown:
    def __init__(self, x):
        self.text = f"{tuple(np.shape(x))} {jnp.result_type(x)}" if hasattr(x, "dtype") else type(x).__name__

    def __repr__(self):
        return self.text


def check_derivative(where: str, system, method: str, t, y, args) -> None:
    """Raise `StateMismatchError` unless `system.<method>(t, y, args)` (the vector field, or an
    SDE's diffusion) returns a pytree of the structure, shapes and dtypes of the state `y`.

    Evaluated abstractly (`jax.eval_shape`: no computation), so it may be called while a
    program is being traced. Without it, a vector field returning shape `(1,)` for a state of
    shape `(2,)` would be broadcast by `y + dt * f` and give a wrong trajectory without error.
    """
    import equinox as eqx

    try:
        got = eqx.filter_eval_shape(lambda s, t_, y_, a: getattr(s, method)(t_, y_, a), system, t, y, args)
    except NotImplementedError:  # a system whose integrator steps it without this method
        return
    want = jtu.tree_map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)), y)
    same = jtu.tree_structure(got) == jtu.tree_structure(want) and all(
        hasattr(g, "shape") and tuple(g.shape) == tuple(w.shape) and g.dtype == w.dtype
        for g, w in zip(jtu.tree_leaves(got), jtu.tree_leaves(want), strict=True))
    if not same:
        raise StateMismatchError(
            f"{where}: {type(system).__name__}.{method}(t, y, args) returned {describe_structure(got)} for a "
            f"state y that is {describe_structure(want)}; it must return one value per state component, "
            "with the state's structure, shapes and dtype (a smaller array would be broadcast against "
            "the state and give a wrong trajectory).")


def to_device(x, dtype):
    """`x` as a JAX array of `dtype`, converted on the host (an eager `jnp.asarray` compiles
    a small conversion kernel per new shape and dtype, which a fit's first call would pay)."""
    return jax.device_put(np.asarray(x, dtype=dtype))


def real_scalar(name, value, owner="fit") -> float:
    """`value` as a Python float, or an error naming `owner` and the argument (strings, complex
    numbers, booleans and arrays with more than one entry are refused, not converted)."""
    if isinstance(value, bool | np.bool_):
        raise TypeError(f"{owner}: `{name}` must be a real number, got {describe(value)}.")
    refuse_tracers(owner, f"`{name}` is a setting it keeps as a Python number.", **{name: value})
    if isinstance(value, numbers.Real):  # int, float, NumPy scalars, Fraction, Decimal
        return float(value)
    if np.iscomplexobj(value) or np.ndim(value) != 0 or np.asarray(value).dtype.kind not in "iuf":
        raise TypeError(f"{owner}: `{name}` must be a real number, got {describe(value)}.")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{owner}: `{name}` must be a real number, got {describe(value)}.") from None
