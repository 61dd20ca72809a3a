"""User functions compared by what they compute, so that re-creating one does not recompile.

JAX (and `eqx.filter_jit`) caches a compiled program per static argument, and a Python
function is equal only to itself. A `lambda` written in a loop or in a function body is a new
object at every call, so passing it as `observe=` to `fit`, as `output=`/`run=` to `sweep`, or
as an observable to `simulate` recompiled every call.

`by_code(fn)` wraps a plain Python function so that two wrappers are equal when they run the
same code object on values that cannot have changed in between. The rules are deliberately
narrow; a function outside them is returned unchanged and compiles anew at every call, exactly
as without this module. A function is keyed only when everything it can reach is

- a number, string, bytes, bool, None, NumPy scalar (with its dtype) or a plain tuple of these,
  compared by value (floats by their bits, so -0.0 and the sign of NaN count);
- a JAX array (immutable), compared by identity;
- a module, class or function *defined in* one of the numerical libraries sciax builds on
  (`jnp`, `jnp.sin`, `lax.scan`, `np.sum`, `math.sqrt`, `sciax.systems.Lorenz`, builtins),
  compared by identity; a function's library status comes from the module it was defined in,
  a class's from being found under its name in its module, a jitted wrapper's from the
  function it wraps; a library function that wraps or closes over anything but immutable
  values and library code (`jax.grad(f)`, `jax.vmap(f)`, `jnp.vectorize(f)` of a user `f`)
  is not library code; nothing bound to an object (`self`) counts;
- another plain function that satisfies these rules (to a depth of `_MAX_DEPTH`),

reached through its defaults, closure cells and the globals its code loads (attribute names
such as `s.omega` are not globals), and when its code
does not import, nor name `getattr`, `setattr`, `vars`, `globals`, `locals`, `eval`, `exec`,
`__import__` or `__dict__` (reads the key cannot see). Everything else — a dict, list, set,
NumPy array, user module, user class or instance, `functools.partial`, a function with
attributes, a recursive helper, more than `_BUDGET` values — leaves the function unwrapped.

Not detected (assumed not to happen between two calls): monkeypatching a library module or
class, and Python that runs at trace time only (a print, `np.random.rand()` while tracing) runs
once per key, as for any jitted function called twice.
"""

import dis
import inspect
import struct
import sys
import types

import jax
import numpy as np

_LIBRARIES = frozenset({
    "builtins", "math", "cmath", "operator", "jax", "jaxlib", "numpy", "scipy", "equinox", "diffrax",
    "optimistix", "lineax", "sciax",
})
_HIDDEN_READS = frozenset({"getattr", "setattr", "delattr", "vars", "globals", "locals", "eval", "exec",
                           "__import__", "__dict__"})
_IMPORTS = frozenset({"IMPORT_NAME", "IMPORT_FROM", "IMPORT_STAR"})
_BUDGET = 128  # values visited per key (shared helpers counted at every use): keys stay small
_MAX_DEPTH = 6  # nested user functions


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


def _library_name(name) -> bool:
    return isinstance(name, str) and name.split(".")[0] in _LIBRARIES


def _library_code(x) -> bool:
    """A module, class or function defined in one of the libraries (see the module docstring)."""
    if isinstance(x, types.ModuleType):
        return _library_name(x.__name__) and sys.modules.get(x.__name__) is x
    if isinstance(x, type):
        home = sys.modules.get(x.__module__)
        return _library_name(x.__module__) and getattr(home, x.__name__, None) is x
    if isinstance(x, types.FunctionType):
        return _library_function(x, _MAX_DEPTH)
    if isinstance(x, types.BuiltinFunctionType):  # `len`, `math.sqrt`; not `np.random.rand`
        return isinstance(x.__self__, types.ModuleType) and _library_name(x.__self__.__name__)
    if type(x) is np.ufunc:
        return True
    if type(x).__module__.split(".")[0] in ("jax", "jaxlib") and getattr(x, "__self__", None) is None:
        target = inspect.unwrap(x)  # a jitted / custom_jvp library function: judge what it wraps
        return target is not x and isinstance(target, types.FunctionType) and _library_code(target)
    return False


def _library_function(fn, depth) -> bool:
    """A plain function defined in a library that runs only library code: a wrapper a library
    made around user code (`jax.grad(f)`, `jax.vmap(f)`, `jnp.vectorize(f)`) lives in the
    library but runs `f`, so what it wraps and what it closes over are judged too
    (`jax.grad(jnp.sin)` is library code, `jax.grad(f)` of a user `f` is not)."""
    if depth <= 0 or not _library_name(fn.__globals__.get("__name__")):
        return False
    target = inspect.unwrap(fn)
    if target is not fn and not _inert(target, depth - 1):
        return False
    try:
        return all(_inert(cell.cell_contents, depth - 1) for cell in fn.__closure__ or ())
    except ValueError:  # an empty closure cell
        return False


def _inert(x, depth) -> bool:
    """Captured by a library function without making it depend on user code: an immutable value
    (number, string, None, NumPy scalar, JAX array, a bare `object()` sentinel, a tuple or
    frozenset of these) or library code."""
    if depth <= 0:
        return False
    if x is None or type(x) in (bool, int, float, complex, str, bytes) or isinstance(x, jax.Array):
        return True
    if isinstance(x, np.generic) and not isinstance(x, np.void):
        return True
    if type(x) is object:  # a sentinel (`object()`): no state
        return True
    if type(x) in (tuple, frozenset):
        return all(_inert(v, depth - 1) for v in x)
    if isinstance(x, types.FunctionType):
        return _library_function(x, depth)  # which counts the level
    return bool(_library_code(x))


_GLOBAL_READS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL", "STORE_NAME", "DELETE_NAME"})


def _code_names(code):
    """Global names the code (and code nested in it) reads; refuses imports and hidden reads."""
    instructions = list(dis.get_instructions(code))
    if any(ins.opname in _IMPORTS for ins in instructions):
        raise _Unkeyable
    if set(code.co_names) & _HIDDEN_READS:  # attribute names too: `x.__dict__`
        raise _Unkeyable
    # Only names the code looks up as globals (not attribute names such as `s.omega`, which a
    # user global `omega` holding an array would otherwise make unkeyable).
    names = {ins.argval for ins in instructions if ins.opname in _GLOBAL_READS}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _float_key(x):
    return struct.pack("<d", x)  # the bits: -0.0 and the sign of NaN count


class _KeyBuilder:
    def __init__(self):
        self.budget = _BUDGET
        self.functions = {}  # id(fn) -> (key, cost), within one build
        self.active = set()

    def spend(self, n=1):
        self.budget -= n
        if self.budget < 0:
            raise _Unkeyable

    def value(self, x, depth):
        self.spend()
        if x is None or type(x) in (bool, int, str, bytes):
            return (type(x), x)
        if type(x) is float:
            return (float, _float_key(x))
        if type(x) is complex:
            return (complex, _float_key(x.real), _float_key(x.imag))
        if isinstance(x, np.generic) and not isinstance(x, np.void):
            return (type(x), str(x.dtype), x.tobytes())
        if type(x) is tuple:
            return (tuple, tuple(self.value(v, depth) for v in x))
        if isinstance(x, jax.Array):  # immutable (a tracer too, within its trace)
            return _Same(x)
        if _library_code(x):
            return _Same(x)
        if isinstance(x, types.FunctionType) and depth < _MAX_DEPTH:
            return ("function", self.function(x, depth + 1))
        raise _Unkeyable

    def function(self, fn, depth=0):
        if id(fn) in self.functions:
            key, cost = self.functions[id(fn)]
            self.spend(cost)  # hashing and comparing walk it again
            return key
        if id(fn) in self.active or fn.__dict__:  # recursive, or carries attributes
            raise _Unkeyable
        self.active.add(id(fn))
        before = self.budget
        code, namespace = fn.__code__, fn.__globals__
        if type(namespace) is not dict:
            raise _Unkeyable
        referenced = tuple((name, self.value(namespace[name], depth))
                           for name in sorted(_code_names(code)) if name in namespace)
        try:
            cells = tuple(self.value(cell.cell_contents, depth) for cell in fn.__closure__ or ())
        except ValueError as err:  # a cell not yet filled
            raise _Unkeyable from err
        key = (
            code,
            _Same(namespace),
            tuple(self.value(v, depth) for v in fn.__defaults__ or ()),
            tuple(sorted((k, self.value(v, depth)) for k, v in (fn.__kwdefaults__ or {}).items())),
            cells,
            referenced,
        )
        self.active.discard(id(fn))
        self.functions[id(fn)] = (key, before - self.budget)
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
        return CodeKeyed(fn, _KeyBuilder().function(fn))
    except Exception:  # noqa: BLE001 - anything unusual: leave the function as it is
        return fn
