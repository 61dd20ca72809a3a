"""Host-side argument checks. Each failure names the argument, what was expected and what was
received, so that the message alone tells the user how to fix the call."""

import math

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from ._errors import StateMismatchError


def is_concrete(x) -> bool:
    """True if `x` holds a value on the host (not a tracer inside jit/vmap/grad)."""
    return not isinstance(x, jax.core.Tracer)


def describe(x) -> str:
    """Short description of a value for error messages: shape and dtype for arrays."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return f"array of shape {tuple(x.shape)} and dtype {x.dtype}"
    return f"{type(x).__name__} {x!r}"


def positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"`{name}` must be a Python int, got {describe(value)}.")
    if value <= 0:
        raise ValueError(f"`{name}` must be a positive integer, got {value}.")
    return int(value)


def positive_finite_scalar(name: str, value) -> None:
    """Check a step size or duration when its value is known on the host."""
    if jnp.ndim(value) != 0:
        raise ValueError(f"`{name}` must be a scalar, got {describe(value)}.")
    if is_concrete(value):
        v = float(value)
        if not math.isfinite(v) or v <= 0:
            raise ValueError(f"`{name}` must be positive and finite, got {v}.")


def state_dtype(state):
    """The floating dtype of a state pytree; raises if a leaf is not floating or leaves disagree."""
    leaves = jtu.tree_leaves(state)
    if not leaves:
        raise StateMismatchError("the state has no array leaves; expected floating arrays.")
    dtypes = {jnp.result_type(leaf) for leaf in leaves}
    for d in dtypes:
        if not jnp.issubdtype(d, jnp.floating):
            raise StateMismatchError(
                f"state leaves must be floating point (float32 or float64), got dtype {d}; "
                "convert the initial state with jnp.asarray(..., dtype=jnp.float64) or float32."
            )
    if len(dtypes) > 1:
        raise StateMismatchError(
            f"state leaves have mixed dtypes {sorted(map(str, dtypes))}; use one precision."
        )
    return dtypes.pop()
