"""Traced and lowered programs kept on disk, so that a fresh process skips tracing as well.

JAX's persistent compilation cache (`enable_compilation_cache`, or `jax_compilation_cache_dir`)
stores what XLA compiled. Its key is the lowered program, so a new process must still trace its
Python and lower the result before the cache is looked up. Measured for the damped-oscillator
`fit` of `benchmarks/suites/fit.py` (one core, float64), that cost was:
- 0.35 s of tracing, mostly inside Optimistix and Lineax;
- 0.17 s of lowering.
SciPy's whole first fit takes 0.43 s.

When that cache is on and is a local directory, `ProgramCache` also keeps the lowered program in
`<cache dir>/sciax-programs/`, written with `jax.export` as serialised StableHLO. The key is
computed without tracing the program; it is the SHA-256 of:

- the environment:
  - a format tag;
  - the versions of Python, jax, jaxlib, NumPy, Equinox, Optimistix, Lineax and Diffrax;
  - a hash of sciax's own source files;
  - every `jax.config` value;
  - the default backend's platform and device kind;
- the program's name and the shapes, dtypes and weak types of its array arguments;
- its *configuration* arguments (for `fit`: the solver, its options, the step limit, the Jacobian
  mode). These are accepted only when made of numbers, strings, dtypes, and classes, Equinox
  modules and functions defined in the libraries above;
- the jaxpr of a *probe*. The probe is the program's own code with the library part left out
  (for `fit`: everything except the Optimistix solve), traced for the actual arguments. It holds
  everything user code can change: the model, `observe` and the transforms.
  - The key is the jaxpr's text, with its constants' bytes.
  - A jaxpr that holds something which cannot be written down without a memory address makes the
    program uncacheable, and it runs through its ordinary `jit` as before. Examples: a `custom_jvp`
    or `custom_vjp` rule, a host callback, an object of a user class.

The probe costs one trace of the model (~0.05 s for the benchmark fit). A hit then costs
deserialising, plus JAX's compilation-cache lookup when the compiled program is there too.

Not checked (assumed): the libraries above are not edited in place without a change of version.
Any failure to read, write or export an entry falls back to the ordinary path: the cache can make
a call faster, never fail it.
"""

import collections
import dataclasses
import enum
import functools
import hashlib
import logging
import os
import struct
import sys
import types
import uuid
from pathlib import Path

import equinox as eqx
import jax
import jax.tree_util as jtu
import numpy as np

from ._callable_key import _library_code

_FORMAT = b"sciax-program-cache-1"
_SUBDIRECTORY = "sciax-programs"
_SUFFIX = ".jaxexport"
_MEMO_SIZE = 64  # programs kept per cached function in this process
_log = logging.getLogger("sciax.program_cache")


class _Unkeyable(Exception):
    """Something the program depends on cannot be written into a key that is valid across processes."""


def directory() -> Path | None:
    """Where programs are kept: `<jax_compilation_cache_dir>/sciax-programs`, or None when JAX's
    persistent cache is off or not a local directory."""
    root = jax.config.values.get("jax_compilation_cache_dir")
    if not root or "://" in str(root) or not jax.config.values.get("jax_enable_compilation_cache", True):
        return None
    return Path(root).expanduser() / _SUBDIRECTORY


# ---------------------------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------------------------

_environment = None


def _environment_digest() -> bytes:
    """Versions and sciax's source, once per process; `jax.config` and the backend are read at
    every key (they can change within a process)."""
    global _environment
    if _environment is None:
        import importlib
        import importlib.metadata

        h = hashlib.sha256(_FORMAT)
        h.update(sys.version.encode())
        for name in ("jax", "jaxlib", "numpy", "equinox", "optimistix", "lineax", "diffrax"):
            try:
                module = importlib.import_module(name)
                version = getattr(module, "__version__", None) or importlib.metadata.version(name)
            except Exception:  # not installed (or no version): part of the key all the same
                version = "?"
            h.update(f"{name}={version};".encode())
        package = Path(__file__).resolve().parent
        for path in sorted(package.rglob("*.py")):
            h.update(str(path.relative_to(package)).encode())
            h.update(hashlib.sha256(path.read_bytes()).digest())
        _environment = h.digest()
    h = hashlib.sha256(_environment)
    for name, value in sorted(jax.config.values.items()):
        text = repr(value)
        if "0x" in text:  # a value without a stable text
            raise _Unkeyable(f"jax.config {name}")
        h.update(f"{name}={text};".encode())
    device = jax.devices()[0]
    h.update(f"{device.platform}:{device.device_kind}:{jax.device_count()}".encode())
    return h.digest()


def _array_text(x) -> str:
    x = np.asarray(x)
    return f"array({x.dtype},{x.shape},{hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()})"


_CODE = (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, functools.partial, np.ufunc)


class _Writer:
    """The canonical text of a value: equal texts mean equal behaviour, within one environment
    digest. Raises `_Unkeyable` for anything it cannot write down that way."""

    def __init__(self):
        self.parts: list[str] = []

    def text(self) -> bytes:
        return "\n".join(self.parts).encode()

    def value(self, x) -> str:
        if x is None or type(x) in (bool, int, str, bytes):
            return f"{type(x).__name__}:{x!r}"
        if type(x) is float:
            return f"float:{struct.pack('<d', x).hex()}"
        if type(x) is complex:
            return f"complex:{struct.pack('<dd', x.real, x.imag).hex()}"
        if isinstance(x, int | float | complex) and isinstance(getattr(x, "dtype", None), np.dtype):
            # A typed Python scalar (jax's literals, NumPy's float64): the value with its dtype.
            base = complex if isinstance(x, complex) else float if isinstance(x, float) else int
            return f"{type(x).__name__}:{x.dtype.str}:{self.value(base(x))}"
        if isinstance(x, np.dtype):
            return f"dtype:{x.str}"
        if isinstance(x, np.generic):
            return f"{type(x).__name__}:{x.dtype.str}:{x.tobytes().hex()}"
        if isinstance(x, (np.ndarray, jax.Array)):
            return _array_text(x)
        if isinstance(x, (jax.extend.core.Jaxpr, jax.extend.core.ClosedJaxpr)):
            return self.jaxpr(x)
        if isinstance(x, enum.Enum):
            return f"{_qualified(type(x))}.{x.name}"
        if isinstance(x, tuple | list):
            return f"{_qualified(type(x))}({','.join(self.value(v) for v in x)})"
        if isinstance(x, frozenset | set):
            return f"{type(x).__name__}({','.join(sorted(self.value(v) for v in x))})"
        if isinstance(x, dict):
            return "dict(" + ",".join(sorted(f"{self.value(k)}={self.value(v)}" for k, v in x.items())) + ")"
        if isinstance(x, _CODE) or hasattr(x, "__wrapped__"):  # a class or function (or a jitted one)
            if not _library_code(x):
                raise _Unkeyable(f"user code {x!r}")
            return f"code:{_qualified(x)}"
        if isinstance(x, eqx.Module) and _library_code(type(x)):
            fields = ",".join(f"{f.name}={self.value(getattr(x, f.name, None))}" for f in dataclasses.fields(x))
            return f"{_qualified(type(x))}({fields})"
        if type(x).__module__.split(".")[0] == "jax":
            return self.jax_object(x)
        raise _Unkeyable(f"{type(x).__qualname__} value")

    def jax_object(self, x) -> str:
        """The parameter objects of jax's own that a model's jaxpr holds, each written in full;
        any other (a `WrappedFun` holding a derivative rule, ...) is refused."""
        name = type(x).__name__
        if name == "Mesh":  # its repr leaves out which devices (the empty mesh holds None)
            devices = [getattr(d, "id", d) for d in x.devices.flat]
            return f"Mesh({x.axis_names!r},{x.devices.shape!r},{devices!r},{x.axis_types!r})"
        if name == "AbstractMesh":
            return f"AbstractMesh({x.axis_names!r},{x.axis_sizes!r},{x.axis_types!r})"
        if name == "NamedSharding":
            return f"NamedSharding({self.jax_object(x.mesh)},{x.spec!r},{x.memory_kind!r})"
        if name in ("UnspecifiedValue", "PartitionSpec"):  # written in full by their repr
            return f"{name}:{x!r}"
        raise _Unkeyable(f"jax {name} value")

    def jaxpr(self, jaxpr) -> str:
        """Writes the jaxpr's equations (variables numbered in order of appearance) and returns
        a reference to them."""
        consts = ()
        if isinstance(jaxpr, jax.extend.core.ClosedJaxpr):
            jaxpr, consts = jaxpr.jaxpr, jaxpr.consts
        if jaxpr.effects:
            raise _Unkeyable("effects")
        names: dict = {}

        def var(v) -> str:
            if isinstance(v, jax.extend.core.Literal):
                return f"lit({self.aval(v.aval)},{self.value(v.val)})"
            if isinstance(v, jax.extend.core.DropVar):
                return "_"
            if v not in names:
                names[v] = f"v{len(names)}:{self.aval(v.aval)}"
            return names[v]

        lines = ["{", "consts " + ",".join(var(v) for v in jaxpr.constvars) + " = "
                 + ",".join(self.value(c) for c in consts), "in " + ",".join(var(v) for v in jaxpr.invars)]
        for eqn in jaxpr.eqns:
            params = ",".join(f"{k}={self.value(v)}" for k, v in sorted(eqn.params.items()))
            lines.append(f"{','.join(var(v) for v in eqn.outvars)} = {eqn.primitive.name}[{params}]"
                         f"({','.join(var(v) for v in eqn.invars)})")
        lines += ["out " + ",".join(var(v) for v in jaxpr.outvars), "}"]
        self.parts.append("\n".join(lines))
        return f"jaxpr#{len(self.parts) - 1}"

    def aval(self, aval) -> str:
        text = repr(aval)
        if "0x" in text:
            raise _Unkeyable("aval")
        return text


def _qualified(x) -> str:
    return f"{getattr(x, '__module__', '?')}.{getattr(x, '__qualname__', type(x).__qualname__)}"


def _aval(leaf):
    aval = jax.typeof(leaf)
    return (tuple(aval.shape), np.dtype(aval.dtype), bool(getattr(aval, "weak_type", False)))


# ---------------------------------------------------------------------------------------------
# Entries
# ---------------------------------------------------------------------------------------------


def _load(path: Path):
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        return jax.export.deserialize(bytearray(data))
    except Exception:  # an entry cut short, or from another format: rewritten below
        return None


def _store(path: Path, data: bytes) -> None:
    """Write atomically (a temporary file renamed over the entry), so that a reader never sees
    half an entry; a failure leaves nothing behind."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "xb") as f:  # the process's usual permissions, unlike mkstemp's 0600
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        pass  # a read-only or full disk: the program still runs, it is just not kept


class ProgramCache:
    """`fn(*args)` through an exported program kept on disk (see the module docstring).

    - `fn`: a pure function of a pytree of arguments whose outputs are arrays, `None`, and tuples,
      lists and dicts with string keys of these (what `jax.export` can write down).
    - `probe`: `probe(*args)`, everything `fn` runs except library code; traced for the key.
    - `config`: positions of the arguments that are configuration (written into the key by value,
      not covered by the probe).
    """

    def __init__(self, fn, probe, config: tuple[int, ...], name: str):
        self.fn, self.probe, self.config, self.name = fn, probe, frozenset(config), name
        self._memo: collections.OrderedDict = collections.OrderedDict()

    def lookup(self, args: tuple, compiler_options: dict | None = None):
        """A function of `args`' array leaves that returns `fn(*args)`, compiled with
        `compiler_options`; or None when the disk cache is off or this program cannot be kept
        (the caller then runs its own `jit`)."""
        root = directory()
        if root is None:
            return None
        leaves, rebuild, static = _split(args)
        if any(isinstance(x, jax.Array) and x.committed for x in leaves):
            return None  # placed on a device explicitly: jit's placement rules, not the default device
        from ._jit import _Static  # the same hashable split as the jitted functions'

        options = tuple(sorted((compiler_options or {}).items()))
        config = tuple(sorted((k, repr(v)) for k, v in jax.config.values.items()))  # as jit's trace context
        memo_key = (options, config, _Static(static), tuple(_aval(x) for x in leaves))
        if memo_key in self._memo:
            self._memo.move_to_end(memo_key)
            return self._memo[memo_key]
        call = self._build(root, leaves, rebuild, compiler_options)
        self._memo[memo_key] = call
        if len(self._memo) > _MEMO_SIZE:
            self._memo.popitem(last=False)
        return call

    def _build(self, root, leaves, rebuild, compiler_options):
        try:
            key = self._key(leaves, rebuild)
        except _Unkeyable as why:
            _log.debug("%s: not kept on disk, its key cannot be written down: %s", self.name, why)
            return None
        path = root / f"{self.name}-{key}{_SUFFIX}"
        exported = _load(path)
        if exported is None:
            try:
                exported = jax.export.export(
                    jax.jit(lambda *flat: self.fn(*rebuild(flat))),
                    # Reloaded only by the same jax/jaxlib (the key): any custom call is fine.
                    disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("ALL")],
                )(*leaves)
                data = exported.serialize()
            except Exception as why:  # effects, outputs it cannot write down, no `flatbuffers`: not kept
                _log.debug("%s: not kept on disk, export failed: %s: %s", self.name, type(why).__name__, why)
                return None
            _store(path, bytes(data))
        return jax.jit(exported.call, compiler_options=compiler_options or None)

    def key(self, *args) -> str | None:
        """The key of `fn(*args)`'s entry (a hex SHA-256), or None when it cannot be kept."""
        leaves, rebuild, _ = _split(args)
        try:
            return self._key(leaves, rebuild)
        except _Unkeyable:
            return None

    def _key(self, leaves, rebuild) -> str:
        args = rebuild(leaves)
        writer = _Writer()
        config = [writer.value(a) if i in self.config else "-" for i, a in enumerate(args)]
        try:
            closed = jax.make_jaxpr(lambda *flat: self.probe(*rebuild(flat)))(*leaves)
        except Exception as err:  # the model does not trace: the ordinary path reports it
            raise _Unkeyable("the probe failed to trace") from err
        writer.jaxpr(closed)
        h = hashlib.sha256(_environment_digest())
        h.update(self.name.encode())
        h.update(repr([_aval(x) for x in leaves]).encode())
        h.update(repr(config).encode())
        h.update(writer.text())
        return h.hexdigest()


def _split(args):
    """(array leaves, leaves -> args, the rest) of a tuple of arguments."""
    dynamic, static = eqx.partition(args, eqx.is_array)
    leaves, treedef = jtu.tree_flatten(dynamic)
    return leaves, lambda flat: eqx.combine(jtu.tree_unflatten(treedef, list(flat)), static), static
