"""`filter_jit` for the calls that the host dispatches in a loop: Equinox's filtering, JAX's
asynchronous dispatch.

`eqx.filter_jit` waits, at every call, until the compiled program has finished running (it
blocks on a marker output so that `eqx.error_if` errors are raised at the call, with their
message). A host loop that dispatches chunk k + 1 and then writes or copies chunk k therefore
runs the two one after the other: the device idles while the host works, and the host while
the device works. `async_filter_jit` splits the arguments the same way (array leaves are traced,
everything else is static and must be hashable) but returns as soon as the program is queued,
like `jax.jit`; its outputs are ready when they are read.

On CPU, XLA itself runs a program synchronously when its cost analysis (which counts a loop
body once) finds fewer than 1,000 flops, e.g. a long rollout that keeps only a few frames.

An `eqx.error_if` inside (in user code: a system, an observable, sweep's `run=`) is raised as
`eqx.EquinoxRuntimeError` with its message at the call when XLA runs the program synchronously
(on CPU, programs with host callbacks, which `error_if` uses, always run that way), and inside
`equinox_errors()` where sciax reads the outputs; elsewhere (on an accelerator, reading the
outputs of `simulate` yourself) it arrives as a `JaxRuntimeError` that carries the message.
"""

import contextlib
import functools
import inspect
import logging

import equinox as eqx
import jax
import jax.tree_util as jtu


class _Static:
    """The non-array part of a pytree, hashable (jax.jit's cache key): equal when the tree
    structure and every non-array leaf are equal."""

    __slots__ = ("treedef", "leaves")

    def __init__(self, tree):
        leaves, self.treedef = jtu.tree_flatten(tree)
        self.leaves = tuple(leaves)

    def tree(self):
        return jtu.tree_unflatten(self.treedef, self.leaves)

    def __hash__(self):
        return hash((self.treedef, self.leaves))

    def __eq__(self, other):
        return isinstance(other, _Static) and self.treedef == other.treedef and self.leaves == other.leaves


@jtu.register_pytree_node_class
class _Out:
    """A function's outputs: arrays as pytree children, the rest (None, Python scalars, static
    fields) as auxiliary data, so that any output `eqx.filter_jit` accepts is returned."""

    def __init__(self, dynamic, static):
        self.dynamic, self.static = dynamic, static

    def tree_flatten(self):
        return (self.dynamic,), self.static

    @classmethod
    def tree_unflatten(cls, static, children):
        return cls(children[0], static)

    def value(self):
        return eqx.combine(self.dynamic, self.static.tree())


_EQX_MARKER = "_EquinoxRuntimeError: "


class _QuietEquinoxCallbacks(logging.Filter):
    """Drops JAX's log record of a failed host callback when it is an `eqx.error_if`: the error
    is raised again below, with its message."""

    def filter(self, record):
        error = record.exc_info[1] if record.exc_info else None
        return type(error).__name__ != _EQX_MARKER[:-2]


@contextlib.contextmanager
def equinox_errors():
    """Raise an `eqx.error_if` failure that surfaces in this block (as a `JaxRuntimeError`, or a
    `ValueError` once the program is compiled, from running or reading it) as
    `eqx.EquinoxRuntimeError` with the check's message. Other errors pass unchanged."""
    logger, quiet = logging.getLogger("jax._src.callback"), _QuietEquinoxCallbacks()
    logger.addFilter(quiet)
    try:
        yield
    except (jax.errors.JaxRuntimeError, ValueError) as err:  # a compiled program's failure: ValueError
        text = str(err)
        if _EQX_MARKER not in text:
            raise
        message = text[text.rfind(_EQX_MARKER) + len(_EQX_MARKER):].split("\n\n\n--------------------")[0]
        raise eqx.EquinoxRuntimeError(message.strip()) from None
    finally:
        logger.removeFilter(quiet)


def _split(signature, args, kwargs):
    """(array leaves, hashable rest) of the arguments bound to `signature` (so that `f(x, 2)` and
    `f(x, n=2)` share a compiled program, as with `eqx.filter_jit`)."""
    bound = signature.bind(*args, **kwargs)
    dynamic, static = eqx.partition((bound.args, bound.kwargs), eqx.is_array)
    return dynamic, _Static(static)


class _Compiled:
    """An ahead-of-time compiled `async_filter_jit` function, called like the function itself.
    `.compiled` is JAX's `Compiled` (memory and cost analyses, HLO text)."""

    def __init__(self, compiled, static: _Static, signature, name: str):
        self.compiled, self._static, self._signature, self._name = compiled, static, signature, name

    def __call__(self, *args, **kwargs):
        dynamic, static = _split(self._signature, args, kwargs)
        if static != self._static:
            raise ValueError(f"{self._name}: called with static arguments other than those it was compiled for.")
        with equinox_errors():
            return self.compiled(dynamic).value()


class _Lowered:
    def __init__(self, lowered, static: _Static, signature, name: str):
        self.lowered, self._static, self._signature, self._name = lowered, static, signature, name

    def as_text(self):
        return self.lowered.as_text()

    def compile(self, compiler_options=None):
        return _Compiled(self.lowered.compile(compiler_options=compiler_options), self._static, self._signature,
                         self._name)


def async_filter_jit(fn=None, *, compiler_options: dict | None = None):
    """`eqx.filter_jit(fn)` that does not wait for the program to finish (see the module
    docstring). `.lower(*args, **kwargs)` lowers it for ahead-of-time compilation, with the same
    XLA `compiler_options` (`@async_filter_jit(compiler_options={...})`)."""
    if fn is None:
        return functools.partial(async_filter_jit, compiler_options=compiler_options)
    signature = inspect.signature(fn)

    def traced(dynamic, static: _Static):
        args, kwargs = eqx.combine(dynamic, static.tree())
        out_dynamic, out_static = eqx.partition(fn(*args, **kwargs), eqx.is_array)
        return _Out(out_dynamic, _Static(out_static))

    traced.__name__, traced.__qualname__ = fn.__name__, fn.__qualname__  # names the program: jit(<fn>)
    jitted = jax.jit(traced, static_argnums=1, compiler_options=compiler_options)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with equinox_errors():
            return jitted(*_split(signature, args, kwargs)).value()

    def lower(*args, **kwargs):
        dynamic, static = _split(signature, args, kwargs)
        return _Lowered(jitted.lower(dynamic, static), static, signature, fn.__name__)

    call.lower = lower
    return call
