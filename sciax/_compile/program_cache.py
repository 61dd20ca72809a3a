"""Traced and lowered programs kept on disk, so that a fresh process skips tracing as well.

JAX's persistent compilation cache (`enable_compilation_cache`, or `jax_compilation_cache_dir`)
stores what XLA compiled. Its key is the lowered program, so a new process must still trace its
Python and lower the result before the cache is looked up; for a small `fit` that is most of a
warm first call (mostly tracing Optimistix and Lineax; figures in `benchmarks/results/2026-11-22-fit.md`).

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
  - The key is the jaxpr's text: constants as bytes, floats as bits, each equation's context
    (set by context managers such as `jax.threefry_partitionable` inside the model), and library
    functions with what they close over (`jax.grad(jnp.sin)` carries the name `sin`).
  - A jaxpr that holds something which cannot be written down completely makes the program
    uncacheable, and it runs through its ordinary `jit` as before. Examples: a `custom_jvp` or
    `custom_vjp` rule (also a library's, such as `jax.nn.relu`'s, and Diffrax's adjoints), a host
    callback, a primitive that no library module defines (its rules are not in any version), an
    object of a user class.

The probe costs one trace of the model. A hit then costs
deserialising, plus JAX's compilation-cache lookup when the compiled program is there too.

Not checked (assumed): the libraries above are not edited in place, or monkeypatched, without a
change of version.

Failures never fail the call; the ordinary path runs instead:
- An entry carries a SHA-256 of its payload, and a damaged one is written again. Flatbuffers checks
  almost nothing, and one flipped bit could otherwise crash the process that runs it.
- A failure to read, write or export an entry leaves the ordinary path.
- A kept program whose call fails (`ProgramCache.discard`) is dropped for the rest of the process,
  and its entry is removed.
"""

import collections
import contextlib
import dataclasses
import enum
import hashlib
import logging
import os
import sys
import threading
import types
import uuid
from pathlib import Path

import equinox as eqx
import jax
import jax.tree_util as jtu
import numpy as np

from .callable_key import _float_key, _library_code, _library_name

_FORMAT = b"sciax-program-cache-2"
_SUBDIRECTORY = "sciax-programs"
_SUFFIX = ".jaxexport"
# `jax.config` values that change neither tracing nor lowering: where the caches are, logging.
_NOT_IN_KEY = ("jax_compilation_cache", "jax_persistent_cache", "jax_raise_persistent_cache_errors", "jax_log",
               "jax_explain_cache_misses", "jax_debug_log_modules")
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

def _code_digest() -> bytes:
    """Python's and the libraries' versions and sciax's source."""
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
    return h.digest()


# Read when sciax is imported, so that it describes the code this process runs: read at the first
# fit, a source edited or upgraded in between was filed as the key of the old code's programs,
# and later processes running the new code loaded them.
_ENVIRONMENT = _code_digest()


def _environment_digest() -> bytes:
    """The code's digest (`_ENVIRONMENT`), with `jax.config` and the backend read at every key
    (they can change within a process)."""
    h = hashlib.sha256(_ENVIRONMENT)
    for name, value in sorted(jax.config.values.items()):
        if name.startswith(_NOT_IN_KEY):
            continue
        text = repr(value)
        if "0x" in text:  # a value without a stable text
            raise _Unkeyable(f"jax.config {name}")
        h.update(f"{name}={text};".encode())
    device = _default_device()
    h.update(f"{device.platform}:{device.device_kind}:{jax.device_count()}".encode())
    return h.digest()


def _export_platform() -> str:
    """The default device's platform as `jax.export` names it ('cuda' or 'rocm', not 'gpu')."""
    platform = _default_device().platform
    if platform == jax.default_backend():
        return jax.export.default_export_platform()
    if platform == "gpu":  # a GPU that is not the default backend: which kind is not known here
        raise _Unkeyable("a non-default GPU platform")
    return platform


def _default_device():
    """Where `jit` runs a program whose arguments are not committed to a device."""
    default = jax.config.values.get("jax_default_device")
    if isinstance(default, str):  # a platform name
        return jax.devices(default)[0]
    return default if default is not None else jax.devices()[0]


_primitives: dict = {}  # id -> primitive, for every primitive a library module holds as a global
_scanned = 0  # len(sys.modules) at the last scan
_scan_lock = threading.Lock()


def _library_primitive(primitive) -> bool:
    """Whether `primitive` is one a library defines (a global of one of its modules), so that its
    rules (abstract evaluation, lowering, derivatives) are fixed by the versions in the key. A
    user's primitive is not: its rules can change without anything else changing."""
    global _scanned
    with _scan_lock:
        if id(primitive) not in _primitives and len(sys.modules) != _scanned:
            modules = list(sys.modules.items())
            for name, module in modules:
                if module is not None and _library_name(name):
                    for value in list(vars(module).values()):
                        if isinstance(value, jax.extend.core.Primitive):
                            _primitives[id(value)] = value
            _scanned = len(modules)
        return _primitives.get(id(primitive)) is primitive


def _array_text(x) -> str:
    x = np.asarray(x)
    return f"array({x.dtype},{x.shape},{hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()})"


_NAMED_CODE = (type, types.BuiltinFunctionType, np.ufunc, types.ModuleType)  # library code its name identifies
_RULES = ("jvp", "fwd", "bwd", "nondiff_argnums", "symbolic_zeros", "optimize_remat")  # of custom_jvp / custom_vjp
_MAX_DEPTH = 16  # nested closures and modules written per value


class _Writer:
    """The canonical text of a value: equal texts mean equal behaviour, within one environment
    digest. Raises `_Unkeyable` for anything it cannot write down that way."""

    def __init__(self):
        self.parts: list[str] = []
        self.depth = 0

    @contextlib.contextmanager
    def deeper(self):
        self.depth += 1
        if self.depth > _MAX_DEPTH:  # a cycle (a closure that reaches itself), or too deep to key
            raise _Unkeyable("nested too deeply")
        try:
            yield
        finally:
            self.depth -= 1

    def text(self) -> bytes:
        return "\n".join(self.parts).encode()

    def value(self, x) -> str:
        if x is None or type(x) in (bool, int, str, bytes):
            return f"{type(x).__name__}:{x!r}"
        if type(x) is float:
            return f"float:{_float_key(x).hex()}"
        if type(x) is complex:
            return f"complex:{(_float_key(x.real) + _float_key(x.imag)).hex()}"
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
        if isinstance(x, enum.Enum) and _library_code(type(x)):
            return f"{_qualified(type(x))}.{x.name}"
        if type(x) in (tuple, list) or isinstance(x, tuple) and _library_code(type(x)):  # NamedTuples too
            return f"{_qualified(type(x))}({','.join(self.value(v) for v in x)})"
        if type(x) in (frozenset, set):
            return f"{type(x).__name__}({','.join(sorted(self.value(v) for v in x))})"
        if type(x) is dict:
            return "dict(" + ",".join(sorted(f"{self.value(k)}={self.value(v)}" for k, v in x.items())) + ")"
        if isinstance(x, types.FunctionType) and _library_code(x):
            # Its name, and what it closes over: `jax.grad(jnp.sin)` is named `sin` too (wraps),
            # and a checkpoint policy made by `save_from_both_policies(p, q)` is one closure.
            with self.deeper():
                cells = [self.value(cell.cell_contents) for cell in x.__closure__ or ()]
                defaults = self.value((x.__defaults__, x.__kwdefaults__))
            return f"code:{_qualified(x)}[{','.join(cells)}|{defaults}]"
        if hasattr(x, "__wrapped__") and not isinstance(x, type) and _library_code(x):
            # A jitted or custom-derivative library function: what it wraps, and its rules.
            with self.deeper():
                parts = [self.value(x.__wrapped__)] + [f"{n}={self.value(getattr(x, n))}" for n in _RULES
                                                       if hasattr(x, n)]
            return f"{_qualified(type(x))}<{','.join(parts)}>"
        if isinstance(x, _NAMED_CODE) and _library_code(x):
            return f"code:{_qualified(x)}"
        if isinstance(x, eqx.Module) and _library_code(type(x)):
            with self.deeper():
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
            if not _library_primitive(eqn.primitive):
                raise _Unkeyable(f"primitive {eqn.primitive.name} not defined by a library")
            params = ",".join(f"{k}={self.value(v)}" for k, v in sorted(eqn.params.items()))
            lines.append(f"{','.join(var(v) for v in eqn.outvars)} = {eqn.primitive.name}[{params}]"
                         f"({','.join(var(v) for v in eqn.invars)}) {self.context(eqn.ctx)}")
        lines += ["out " + ",".join(var(v) for v in jaxpr.outvars), "}"]
        self.parts.append("\n".join(lines))
        return f"jaxpr#{len(self.parts) - 1}"

    def context(self, ctx) -> str:
        """An equation's context (compute type, PRNG partitionability, XLA metadata, mesh), which
        its lowering reads: set by context managers inside the model, not by `jax.config`."""
        if ctx is None:
            return "ctx()"
        slots = [n for n in getattr(type(ctx), "__slots__", ()) if not n.startswith("__")]
        if not slots or hasattr(ctx, "__dict__"):  # a layout this code does not know
            raise _Unkeyable("equation context")
        return "ctx(" + ",".join(f"{n}={self.value(getattr(ctx, n, None))}" for n in slots) + ")"

    def aval(self, aval) -> str:
        text = repr(aval)
        if "0x" in text:
            raise _Unkeyable("aval")
        return text


def _qualified(x) -> str:
    if isinstance(x, types.ModuleType):
        return x.__name__
    return f"{getattr(x, '__module__', '?')}.{getattr(x, '__qualname__', type(x).__qualname__)}"


def _aval(leaf):
    aval = jax.typeof(leaf)
    return (tuple(aval.shape), str(aval.dtype), bool(getattr(aval, "weak_type", False)))


# ---------------------------------------------------------------------------------------------
# Entries: a header, the SHA-256 of the payload, the payload (`Exported.serialize()`)
# ---------------------------------------------------------------------------------------------

_HEADER = b"sciax-program\n"


def _load(path: Path):
    """The exported program in `path`, or None when there is none or it is damaged (its checksum
    does not match: flatbuffers itself checks almost nothing, and a flipped bit can crash the
    process that runs it)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    n = len(_HEADER)
    payload = data[n + 32:]
    if data[:n] != _HEADER or hashlib.sha256(payload).digest() != data[n:n + 32]:
        return None
    try:
        return jax.export.deserialize(bytearray(payload))
    except Exception:  # written by another version of this format: rewritten below
        return None


def _store(path: Path, payload: bytes) -> None:
    """Write atomically (a temporary file renamed over the entry), so that a reader never sees
    half an entry; a failure leaves nothing behind."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "xb") as f:  # the process's usual permissions, unlike mkstemp's 0600
                f.write(_HEADER + hashlib.sha256(payload).digest() + payload)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        pass  # a read-only or full disk: the program still runs, it is just not kept


class Kept:
    """A kept program: `compile(leaves)` returns the compiled program, to be called with the
    arguments' array leaves; it raises if the entry cannot be deserialised, lowered or compiled
    (then `ProgramCache.discard` it). Failures while running are the program's own."""

    def __init__(self, call, path: Path):
        self.call, self.path, self._compiled = call, path, None

    def compile(self, leaves):
        if self._compiled is None:
            self._compiled = self.call.lower(*leaves).compile()
        return self._compiled


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
        self._lock = threading.Lock()

    def lookup(self, args: tuple, compiler_options: dict | None = None) -> Kept | None:
        """The kept program for `fn(*args)`, compiled with `compiler_options`; or None when the
        disk cache is off or this program cannot be kept (the caller then runs its own `jit`).
        Never raises: whatever goes wrong here leaves the ordinary path."""
        try:
            root = directory()  # may raise: `~user/...` for a user that does not exist
            if root is None:
                return None
            leaves, rebuild, static = _split(args)
            if any(isinstance(x, jax.Array) and x.committed for x in leaves):
                return None  # placed on a device explicitly: jit's placement rules, not the default device
            from .async_dispatch import _Static  # the same hashable split as the jitted functions'

            options = tuple(sorted((compiler_options or {}).items()))
            memo_key = (root, options, _trace_context(), _Static(static), tuple(_aval(x) for x in leaves))
            hash(memo_key)
        except Exception as why:  # an unhashable static argument, an extended dtype, ...
            _log.debug("%s: not kept on disk: %s: %s", self.name, type(why).__name__, why)
            return None
        with self._lock:
            if memo_key in self._memo:
                self._memo.move_to_end(memo_key)
                return self._memo[memo_key]
        kept = self._build(root, leaves, rebuild, compiler_options)
        with self._lock:
            self._memo[memo_key] = kept
            if len(self._memo) > _MEMO_SIZE:
                self._memo.popitem(last=False)
        return kept

    def discard(self, kept: Kept, why: BaseException) -> None:
        """Stop using `kept` (it failed to compile): later calls in this process take the
        ordinary path, and its entry is removed so that the next process writes it again."""
        _log.warning("%s: the program kept in %s failed (%s: %s); running without it.", self.name, kept.path,
                     type(why).__name__, str(why)[:200])
        with self._lock:
            for k, v in self._memo.items():
                if v is kept:
                    self._memo[k] = None
        try:
            kept.path.unlink(missing_ok=True)
        except OSError:  # a read-only cache: it stays, and is dropped by each process that fails on it
            pass

    def _build(self, root, leaves, rebuild, compiler_options) -> Kept | None:
        try:
            key = self._key(leaves, rebuild)
            platform = _export_platform()
        except _Unkeyable as why:
            _log.debug("%s: not kept on disk, its key cannot be written down: %s", self.name, why)
            return None
        path = root / f"{self.name}-{key}{_SUFFIX}"
        exported = _load(path)
        if exported is None:
            try:
                exported = jax.export.export(
                    jax.jit(lambda *flat: self.fn(*rebuild(flat))),
                    platforms=(platform,),  # where the ordinary jit would run it
                    # Reloaded only by the same jax/jaxlib (the key): any custom call is fine.
                    disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("ALL")],
                )(*leaves)
                payload = bytes(exported.serialize())
            except Exception as why:  # effects, outputs it cannot write down, no `flatbuffers`: not kept
                _log.debug("%s: not kept on disk, export failed: %s: %s", self.name, type(why).__name__, why)
                return None
            _store(path, payload)
        options = dict(compiler_options) if compiler_options else None  # a snapshot: the caller's dict may change
        return Kept(jax.jit(exported.call, compiler_options=options), path)

    def key(self, *args) -> str | None:
        """The key of `fn(*args)`'s entry (a hex SHA-256), or None when it cannot be kept."""
        leaves, rebuild, _ = _split(args)
        try:
            return self._key(leaves, rebuild)
        except _Unkeyable:
            return None

    def _key(self, leaves, rebuild) -> str:
        try:
            args = rebuild(leaves)
            writer = _Writer()
            config = [writer.value(a) if i in self.config else "-" for i, a in enumerate(args)]
            closed = jax.make_jaxpr(lambda *flat: self.probe(*rebuild(flat)))(*leaves)
            writer.jaxpr(closed)
            h = hashlib.sha256(_environment_digest())
            h.update(self.name.encode())
            h.update(repr([_aval(x) for x in leaves]).encode())
            h.update(repr(config).encode())
            h.update(writer.text())
            return h.hexdigest()
        except _Unkeyable:
            raise
        except Exception as err:  # a model that does not trace (the ordinary path reports it), a typed key, ...
            raise _Unkeyable(f"{type(err).__name__}: {err}") from err


def _trace_context():
    """What jit's own cache keys on besides the arguments: the configuration and the contexts
    (`set_xla_metadata`, `compute_on`, meshes) that change how a program is traced."""
    try:
        from jax._src.config import trace_context
    except ImportError:  # not in this jax: the configuration alone
        return tuple(sorted((k, repr(v)) for k, v in jax.config.values.items()))
    return trace_context()


def _split(args):
    """(array leaves, leaves -> args, the rest) of a tuple of arguments."""
    dynamic, static = eqx.partition(args, eqx.is_array)
    leaves, treedef = jtu.tree_flatten(dynamic)
    return leaves, lambda flat: eqx.combine(jtu.tree_unflatten(treedef, list(flat)), static), static
