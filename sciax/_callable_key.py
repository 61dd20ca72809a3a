"""User functions compared by what they compute, so that re-creating one does not recompile.

JAX (and `eqx.filter_jit`) caches a compiled program per static argument, and a Python
function is equal only to itself. A `lambda` written in a loop or in a function body is a new
object at every call, so passing it as `observe=` to `fit`, as `output=`/`run=` to `sweep`, or
as an observable to `simulate` recompiled every call: measured 1.1 s per fit against 13 ms.

`by_code(fn)` wraps a plain Python function so that two wrappers are equal when they run the
same code object on values that cannot have changed in between. The key holds:

- every default, keyword default and closure cell, and every global the code (or a function
  nested in it) names, by **value** when it is a number, string, bytes, None, NumPy scalar or
  a plain tuple/frozenset of those; a function is keyed the same way, recursively;
- JAX arrays (immutable) and the modules, classes and functions of the numerical libraries
  sciax builds on (`jnp`, `jnp.sin`, `lax.scan`, `np.sum`, `sciax.systems.Lorenz`, builtins) by
  **identity**, held by the key so an identity is never reused;
- for a referenced *user* module, the values of the attributes the code reads from it, by the
  rules above.

Anything else that the function can reach (a dict, list, NumPy array, `self`, an instance, a
user class, a function with attributes, a `functools.partial`, a recursive function, or more
than `_BUDGET` nested values) could change between calls without the function changing, so
such a function is **not** keyed: `by_code` returns it unchanged, and it compiles anew at every
call exactly as before. So does every callable that is not a plain function (its own equality
applies). The one difference from retracing every time: Python run at trace time (a print,
`np.random.rand()` drawn while tracing) runs once per key, as it does for any `jax.jit`-ed
function called twice.
"""

import functools
import types

import jax
import numpy as np

_LIBRARIES = frozenset({
    "builtins", "math", "cmath", "operator", "functools", "jax", "jaxlib", "numpy", "scipy",
    "equinox", "diffrax", "optimistix", "lineax", "sciax",
})
_BUDGET = 256  # values visited per key before giving up (keeps the key cheap to build)


class _Unkeyable(Exception):
    """Something the function can reach could change without the function changing."""


class _Same:
    """An immutable object compared by identity, kept alive by the key that holds it."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other):
        return isinstance(other, _Same) and other.obj is self.obj

    def __hash__(self):
        return id(self.obj)


def _from_library(obj) -> bool:
    module = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None)
    return isinstance(module, str) and module.split(".")[0] in _LIBRARIES


def _library_code(x) -> bool:
    """A module, class or function of the libraries sciax builds on (not an instance: a
    `functools.partial`, a bound method of a random state, a user object are not)."""
    if not _from_library(x):
        return False
    if isinstance(x, (types.ModuleType, type, types.FunctionType, np.ufunc)):
        return True
    if isinstance(x, types.BuiltinFunctionType):  # `len`, `math.sin`; not `np.random.rand`
        return isinstance(x.__self__, (types.ModuleType, type(None)))
    return hasattr(x, "__wrapped__") and not isinstance(x, functools.partial)  # jit/custom_jvp-wrapped


def _global_names(code):
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


class _KeyBuilder:
    def __init__(self):
        self.budget = _BUDGET
        self.functions = {}  # id(fn) -> key, within one build (shared helpers are keyed once)
        self.active = set()

    def value(self, x):
        self.budget -= 1
        if self.budget < 0:
            raise _Unkeyable
        if x is None or type(x) in (bool, int, str, bytes):
            return (type(x), x)
        if type(x) in (float, complex):
            return (type(x), repr(x))  # repr tells 0.0 from -0.0
        if isinstance(x, np.generic):
            return (type(x), x.tobytes())
        if type(x) is tuple:
            return (tuple, tuple(self.value(v) for v in x))
        if type(x) is frozenset:
            return (frozenset, frozenset(self.value(v) for v in x))
        if isinstance(x, jax.Array):  # immutable (a tracer too, within its trace)
            return _Same(x)
        if _library_code(x):  # jnp, jnp.sin, lax.scan, np.sum, Lorenz, len, ...: fixed code
            return _Same(x)
        if isinstance(x, types.FunctionType):
            return ("function", self.function(x))
        raise _Unkeyable

    def function(self, fn):
        if id(fn) in self.functions:
            return self.functions[id(fn)]
        if id(fn) in self.active or fn.__dict__:  # recursive, or carries attributes
            raise _Unkeyable
        self.active.add(id(fn))
        code, namespace = fn.__code__, fn.__globals__
        names = _global_names(code)
        referenced = []
        for name in sorted(n for n in names if n in namespace):
            obj = namespace[name]
            if isinstance(obj, types.ModuleType) and not _from_library(obj):
                attrs = vars(obj)
                read = tuple((a, self.value(attrs[a])) for a in sorted(names) if a in attrs)
                referenced.append((name, _Same(obj), read))
            else:
                referenced.append((name, self.value(obj)))
        try:
            cells = tuple(self.value(cell.cell_contents) for cell in fn.__closure__ or ())
        except ValueError as err:  # a cell not yet filled
            raise _Unkeyable from err
        key = (
            code,
            _Same(namespace),
            tuple(self.value(v) for v in fn.__defaults__ or ()),
            tuple(sorted((k, self.value(v)) for k, v in (fn.__kwdefaults__ or {}).items())),
            cells,
            tuple(referenced),
        )
        self.active.discard(id(fn))
        self.functions[id(fn)] = key
        return key


class CodeKeyed:
    """A plain function, equal to another `CodeKeyed` that runs the same code on equal values."""

    def __init__(self, fn, key):
        self.fn = fn
        self.key = key
        self._hash = hash(key)
        self.__wrapped__ = fn
        self.__doc__ = fn.__doc__
        self.__module__ = fn.__module__

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __get__(self, obj, objtype=None):  # binds like the function it wraps
        return self if obj is None else types.MethodType(self, obj)

    def __getattr__(self, name):  # __name__, __qualname__, ... of the function
        if name in ("fn", "key", "_hash"):
            raise AttributeError(name)
        return getattr(self.fn, name)

    def __eq__(self, other):
        return isinstance(other, CodeKeyed) and self._hash == other._hash and self.key == other.key

    def __hash__(self):
        return self._hash

    def __reduce__(self):  # the key holds code objects and namespaces: rebuild it instead
        return (by_code, (self.fn,))

    def __deepcopy__(self, memo):
        return self  # functions are not copied by deepcopy either

    def __repr__(self):
        return f"by_code({self.fn!r})"


def by_code(fn):
    """`fn` keyed by its code and captured values when that is safe (module docstring), else
    `fn` itself."""
    if isinstance(fn, CodeKeyed) or not isinstance(fn, types.FunctionType):
        return fn
    try:
        key = _KeyBuilder().function(fn)
        hash(key)
    except (_Unkeyable, TypeError, RecursionError):
        return fn
    return CodeKeyed(fn, key)
