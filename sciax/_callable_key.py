"""User functions compared by what they compute, so that re-creating one does not recompile.

JAX (and `eqx.filter_jit`) caches a compiled program per static argument, and a Python
function is equal only to itself. A `lambda` written in a loop or in a function body is a new
object at every call, so passing it as `observe=` to `fit` (or as `output=` to `sweep`, or as
an observable to `simulate`) recompiled every call: measured 1.1 s per fit against 13 ms.

`by_code(fn)` wraps a plain Python function so that two wrappers are equal when the functions
run the same code on the same inputs: the same code object, the same defaults, closure
values and referenced globals equal by value when they are numbers, strings, bytes, None, or
tuples/frozensets of those, and otherwise the *same object* (arrays, modules, classes, other
objects: held by the key, so an identity is never reused by another object). Nested functions
found in closures, defaults or globals are compared the same way.

Semantics, exactly as for any jitted function: values are captured when the function is
traced. Rebinding a referenced global number (`SCALE = 2.0`) or passing a lambda that closes
over another value makes a new key (a new compile, the new value is used); mutating an array
in place that a function closes over is not seen (as for `jax.jit`). Anything that is not a
plain function (`functools.partial`, bound methods, callable objects, Equinox modules) is
returned unchanged and keeps its own equality.
"""

import types

_PLAIN = (int, float, complex, str, bytes, bool, type(None))
_MAX_DEPTH = 4


class _Same:
    """An object compared by identity, kept alive by the key that holds it."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other):
        return isinstance(other, _Same) and other.obj is self.obj

    def __hash__(self):
        return id(self.obj)


def _value_key(x, depth):
    if isinstance(x, (float, complex)):
        return (type(x), repr(x))  # repr tells 0.0 from -0.0; NaN keys stay equal to themselves
    if isinstance(x, _PLAIN):
        return (type(x), x)
    if isinstance(x, (tuple, frozenset)) and type(x) in (tuple, frozenset):
        return (type(x), tuple(_value_key(v, depth) for v in x))
    if isinstance(x, types.FunctionType) and depth < _MAX_DEPTH:
        return ("function", _function_key(x, depth + 1))
    if isinstance(x, CodeKeyed):
        return ("function", x.key)
    return _Same(x)


def _global_names(code):
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _function_key(fn, depth=0):
    code = fn.__code__
    namespace = fn.__globals__
    referenced = sorted(name for name in _global_names(code) if name in namespace)
    return (
        code,
        _Same(namespace),
        tuple(_value_key(v, depth) for v in fn.__defaults__ or ()),
        tuple(sorted((k, _value_key(v, depth)) for k, v in (fn.__kwdefaults__ or {}).items())),
        tuple(_value_key(cell.cell_contents, depth) for cell in fn.__closure__ or ()),
        tuple((name, _value_key(namespace[name], depth)) for name in referenced),
    )


class CodeKeyed:
    """A plain function, equal to another `CodeKeyed` that runs the same code on equal values."""

    def __init__(self, fn):
        self.fn = fn
        self.key = _function_key(fn)
        self._hash = hash(self.key)
        self.__wrapped__ = fn

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __getattr__(self, name):  # __name__, __qualname__, __doc__, ... of the function
        if name == "fn":
            raise AttributeError(name)
        return getattr(self.fn, name)

    def __eq__(self, other):
        return isinstance(other, CodeKeyed) and self._hash == other._hash and self.key == other.key

    def __hash__(self):
        return self._hash

    def __repr__(self):
        return f"by_code({self.fn!r})"


def by_code(fn):
    """`fn` keyed by its code and captured values if it is a plain function, else `fn` itself.

    A closure cell that is still empty (a function that refers to itself before its definition
    finished) cannot be keyed; such functions are returned unchanged.
    """
    if isinstance(fn, CodeKeyed) or not isinstance(fn, types.FunctionType):
        return fn
    try:
        return CodeKeyed(fn)
    except (ValueError, TypeError):  # empty closure cell, or an unhashable key part
        return fn
