"""What a scenario file can name: the library's systems and integrators (every concrete class
exported by `sciax.systems` / `sciax.integrators` that TOML can configure) and the user's own
classes (`"package.module:ClassName"`, `"file.py:ClassName"`), with their constructor fields
and initial-state presets."""

import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import sys
import typing
from collections.abc import Callable
from pathlib import Path

from .schema import did_you_mean


def buildable_from_toml(cls) -> bool:
    """True if every required constructor argument can be written in TOML (numbers, arrays, strings)."""
    if not dataclasses.is_dataclass(cls):
        return True
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # unresolvable annotations: let the constructor decide
        return True
    import jax

    simple = (jax.Array, float, int, bool, str, tuple, list, dict)

    def expressible(hint) -> bool:
        if hint is typing.Any:
            return True
        origin = typing.get_origin(hint)
        if origin is not None and isinstance(origin, type):
            return issubclass(origin, simple)
        if origin is not None:  # a Union / Optional: any expressible member will do
            return any(expressible(a) for a in typing.get_args(hint) if a is not type(None))
        return isinstance(hint, type) and issubclass(hint, simple)

    for f in dataclasses.fields(cls):
        if not f.init or f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        if not expressible(hints.get(f.name, f.type)):
            return False
    return True


def _concrete_classes(module, base) -> dict[str, type]:
    classes = {}
    for name in dir(module):
        obj = getattr(module, name)
        if (name.startswith("_") or name.startswith("Abstract") or not isinstance(obj, type)
                or not issubclass(obj, base) or inspect.isabstract(obj)):
            continue
        if buildable_from_toml(obj):
            classes[name] = obj
    return dict(sorted(classes.items()))


def system_classes() -> dict[str, type]:
    """Every concrete system class exported by `sciax.systems`, by name."""
    from .. import systems

    return _concrete_classes(systems, systems.AbstractODE)


def integrator_classes() -> dict[str, type]:
    """Every concrete integrator exported by `sciax.integrators` that a TOML file can configure."""
    from .. import integrators

    return _concrete_classes(integrators, integrators.AbstractIntegrator)


def init_fields(cls) -> dict[str, dataclasses.Field]:
    if not dataclasses.is_dataclass(cls):
        params = inspect.signature(cls).parameters
        return {n: None for n in params if n != "self"}
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


def presets(cls) -> dict[str, Callable]:
    """Initial-state presets of a system class: every method named `<preset>_state`."""
    out = {}
    for attr in dir(cls):
        if attr.endswith("_state") and not attr.startswith("_") and attr != "check_state":
            if callable(getattr(cls, attr)):
                out[attr[: -len("_state")]] = getattr(cls, attr)
    return dict(sorted(out.items()))


def _kind_base(kind: str) -> type:
    from .. import integrators, systems

    return {"system": systems.AbstractODE, "integrator": integrators.AbstractIntegrator}[kind]


def user_class(name: str, kind: str, folder=None) -> type:
    """The user's class `name` = `"package.module:ClassName"` or `"path/to/file.py:ClassName"`
    (a relative path is looked for next to the scenario file, in `folder`, then in the current
    folder; a module is imported with both on `sys.path`), checked to be a concrete `kind`
    (`"system"`: a subclass of `sciax.systems.AbstractODE`; `"integrator"`: of
    `sciax.integrators.AbstractIntegrator`).

    **Raises:** `LookupError` (no such file, module or class) or `TypeError` (not a class of the
    right kind), with a message naming what was looked for.
    """
    where, _, class_name = name.rpartition(":")
    if not where or not class_name.isidentifier():
        raise LookupError(f"expected \"package.module:ClassName\" or \"file.py:ClassName\", got {name!r}")
    folders = [Path(folder) if folder is not None else Path("."), Path(".")]
    if where.endswith(".py"):
        candidates = [Path(where)] if Path(where).is_absolute() else [f / where for f in folders]
        path = next((c for c in candidates if c.is_file()), None)
        if path is None:
            raise LookupError(f"no file {where} (looked in {', '.join(str(c.parent) for c in candidates)})")
        path = path.resolve()
        module_name = f"sciax_user_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
        module = sys.modules.get(module_name)
        if module is None:
            spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module  # dataclasses (Equinox modules) look their module up
            try:
                spec.loader.exec_module(module)
            except Exception as e:
                del sys.modules[module_name]
                raise LookupError(f"importing {where} failed: {type(e).__name__}: {e}") from None
    else:
        added = [str(f.resolve()) for f in folders if str(f.resolve()) not in sys.path]
        sys.path[:0] = added
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise LookupError(f"cannot import the module {where!r}: {e}") from None
        except Exception as e:
            raise LookupError(f"importing {where} failed: {type(e).__name__}: {e}") from None
        finally:
            for a in added:
                sys.path.remove(a)
    cls = getattr(module, class_name, None)
    if cls is None:
        found = sorted(n for n, v in vars(module).items() if isinstance(v, type) and not n.startswith("_")
                       and issubclass(v, _kind_base(kind)) and not inspect.isabstract(v))
        raise LookupError(f"{where} has no class {class_name!r}; its {kind} classes: "
                          f"{', '.join(found) or '(none)'}.{did_you_mean(class_name, found)}")
    base = _kind_base(kind)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise TypeError(f"{name} is {'a class' if isinstance(cls, type) else 'a ' + type(cls).__name__} that is "
                        f"not a {kind}: a {kind} is a subclass of {base.__module__.split('.')[0]}."
                        f"{'systems' if kind == 'system' else 'integrators'}.{base.__name__}")
    missing = sorted(cls.__abstractmethods__) if inspect.isabstract(cls) else []
    if kind == "system" and cls.vector_field is base.vector_field:
        missing.append("vector_field(t, y, args)")
    if missing:
        raise TypeError(f"{name} is abstract (it does not define {', '.join(missing)}), so it cannot be built")
    return cls


def source_digest(cls) -> str | None:
    """SHA-256 of the file that defines a user's class (recorded so that `--resume` notices an
    edited system), or None if it has no file."""
    try:
        return hashlib.sha256(Path(inspect.getsourcefile(cls)).read_bytes()).hexdigest()
    except (TypeError, OSError):
        return None


def resolve_class(name: str, kind: str, folder) -> type:
    """A library class by name, or the user's (`user_class`) for a name with a colon."""
    if ":" in name:
        return user_class(name, kind, folder)
    registry = system_classes() if kind == "system" else integrator_classes()
    if name in registry:
        return registry[name]
    raise LookupError(f"unknown {kind} {name!r}; valid names: {', '.join(registry)} (or your own class: "
                      f"\"package.module:ClassName\" or \"file.py:ClassName\").{did_you_mean(name, registry)}")
