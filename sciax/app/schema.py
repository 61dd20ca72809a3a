"""What every scenario file shares: `ScenarioError`, the value checkers of its schema, the
`Checker` that turns a failed check into an error naming the file and the key, and reading a
file. Each job's schema (`scenario`, `md_scenario`, ...) is a dict of key -> checker built from
these.

A checker takes a TOML value and returns it (possibly converted) or raises `Expected("what was
expected")`; `Checker.value` turns that into `ScenarioError("<file>: <key>: expected ..., got
<value> (<type>).")`.
"""

import difflib
import hashlib
import json
import math
from pathlib import Path

PRECISIONS = ("float64", "float32")


class ScenarioError(ValueError):
    """A scenario is invalid. The message names the file, the key and what was expected."""


class Expected(Exception):
    """Raised by value checkers; turned into a `ScenarioError` naming file and key."""


def toml_type(value) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string", list: "array",
            dict: "table"}.get(type(value), type(value).__name__)


def got(value) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({toml_type(value)})"


def is_number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def string(value):
    if not isinstance(value, str):
        raise Expected("a string")
    return value


def folder(value):
    if not isinstance(value, str) or not value.strip():
        raise Expected('a non-empty folder path, e.g. "runs/lorenz"')
    return value


def boolean(value):
    if not isinstance(value, bool):
        raise Expected("true or false")
    return value


def finite_number(value):
    if not is_number(value) or not math.isfinite(value):
        raise Expected("a finite number")
    return float(value)


def positive_number(value):
    if not is_number(value) or not math.isfinite(value) or value <= 0:
        raise Expected("a positive finite number")
    return float(value)


def positive_int(value):
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise Expected("a positive integer")
    return value


def nonnegative_int(value):
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise Expected("a non-negative integer")
    return value


def table(value):
    if not isinstance(value, dict):
        raise Expected("a table, e.g. { key = 1.0 }")
    return value


def string_list(value):
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise Expected('an array of strings, e.g. ["conserved"]')
    return list(value)


def numeric_array(value):
    """A number or a rectangular nested array of numbers."""

    def shape(v):
        if is_number(v):
            if not math.isfinite(v):
                raise Expected("finite numbers")
            return ()
        if isinstance(v, list) and v:
            shapes = {shape(x) for x in v}
            if len(shapes) != 1:
                raise Expected("a rectangular array of numbers (all rows the same length)")
            return (len(v),) + shapes.pop()
        raise Expected("a number or a (nested) array of numbers")

    shape(value)
    return value


def vector(value):
    if not isinstance(value, list):
        raise Expected("an array of numbers, e.g. [1.0, 0.0, 0.0]")
    return numeric_array(value)


def choice(*options):
    def check(value):
        if value not in options:
            raise Expected("one of " + ", ".join(repr(o) for o in options))
        return value

    return check


def bool_or_auto(value):
    if value == "auto" or isinstance(value, bool):
        return value
    raise Expected('true, false or "auto"')


class Checker:
    def __init__(self, source: str):
        self.source = source

    def error(self, where: str, message: str) -> ScenarioError:
        return ScenarioError(f"{self.source}: {where or 'top level'}: {message}")

    def section(self, table: dict, where: str, schema: dict, *, required=(), extra_ok=False) -> dict:
        """Check `table` against `schema` (key -> checker); return the checked values."""
        out = {}
        for key, value in table.items():
            if key not in schema:
                if extra_ok:
                    out[key] = value
                    continue
                valid = ", ".join(schema)
                raise self.error(where, f"unknown key {key!r}; valid keys are: {valid}.")
            out[key] = self.value(f"{where} {key}" if where else key, value, schema[key])
        for key in required:
            if key not in table:
                raise self.error(where or "top level", f"missing required key {key!r}.")
        return out

    def value(self, where: str, value, checker):
        try:
            return checker(value)
        except Expected as e:
            raise self.error(where, f"expected {e}, got {got(value)}.") from None


def did_you_mean(name: str, valid) -> str:
    """" Did you mean 'X'?" for the valid name closest to a misspelt `name` (same letters in
    another case first, then by similarity), or "" when none is close."""
    valid = list(valid)
    close = [n for n in valid if n.lower() == name.lower()]
    if not close:
        by_lower = {n.lower(): n for n in valid}
        close = [by_lower[n] for n in difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)]
    return f" Did you mean {close[0]!r}?" if close else ""


def physics_hash(physics: dict) -> str:
    """SHA-256 of a scenario's `physics()` dict (canonical JSON)."""
    blob = json.dumps(physics, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def set_precision(precision: str) -> None:
    """Enable JAX's 64-bit mode for `"float64"` (before arrays are made). `"float32"` leaves the
    setting alone; scenario objects are cast to float32 explicitly."""
    import jax

    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}.")
    if precision == "float64" and not jax.config.jax_enable_x64:
        jax.config.update("jax_enable_x64", True)


def read_scenario_text(path: Path) -> str:
    """The text of a scenario file, or a `ScenarioError` naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(f"{path}: no such scenario file.") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ScenarioError(f"{path}: cannot read the scenario file ({e}).") from None


def parse_toml(text: str, source: str, overrides=()) -> dict:
    """The TOML document `text` as a dict, with command-line `overrides` applied.

    `overrides` are `"key.path=value"` strings (`sciax run --set`): the value is read as a TOML
    value (`0.01`, `"rk4"`, `[1, 2]`, `{ start = 0, stop = 1, n = 5 }`; a bare word that is not
    TOML is taken as a string), and set at the key path, creating tables on the way. What the
    path names is then validated like the file itself, so a misspelt key is an unknown-key error
    listing the valid keys.

    **Raises:** `ScenarioError` naming the file (not valid TOML) or the override (malformed).
    """
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{source}: not valid TOML: {e}.") from None
    for item in overrides:
        path, value = _parse_override(item)
        node = data
        for i, key in enumerate(path):
            last = i == len(path) - 1
            if isinstance(node, list):  # an array of tables ([[stage]]): the key is an index
                if not key.isdigit() or int(key) >= len(node):
                    raise ScenarioError(f"--set {item}: {'.'.join(path[:i])} is an array of {len(node)} entries "
                                        f"in {source}; expected an index 0..{len(node) - 1}, got {key!r}.")
                key = int(key)
            elif not isinstance(node, dict):
                raise ScenarioError(f"--set {item}: {'.'.join(path[:i])} is a {toml_type(node)} in {source}, "
                                    f"not a table, so it has no key {key!r}.")
            if last:
                node[key] = value
            else:
                node = node.setdefault(key, {}) if isinstance(node, dict) else node[key]
    return data


def override_record(overrides) -> dict:
    """`["run.dt=0.01"]` -> `{"run.dt": 0.01}`: the overrides as recorded in a run's summary and
    its copy of the scenario file."""
    return {".".join(path): value for path, value in map(_parse_override, overrides)}


def _parse_override(item: str) -> tuple[list[str], object]:
    """`"run.dt=0.01"` -> (["run", "dt"], 0.01)."""
    import tomllib

    if not isinstance(item, str) or "=" not in item:
        raise ScenarioError(f"--set: expected key.path=value (e.g. --set run.dt=0.01), got {item!r}.")
    key, text = item.split("=", 1)
    if key.count('"') % 2:  # the value's own "=" came first: split at the "=" after the quoted key
        end = item.index('"', item.rindex('"', 0, item.index("=")) + 1) if '"' in item else 0
        key, text = item[:item.index("=", end)], item[item.index("=", end) + 1:]
    try:  # TOML's own dotted keys: run.dt, sweep.axes."state0[0]", system.params."spring.k"
        tree, path = tomllib.loads(f"{key.strip()} = 0"), []
        while isinstance(tree, dict):
            (name, tree), = tree.items()
            path.append(name)
    except (tomllib.TOMLDecodeError, ValueError):  # not a TOML key: brackets unquoted, state0[0]
        path = [k.strip() for k in key.strip().split(".")] if '"' not in key else []
        path = path if all(path) else []
    if not path:
        raise ScenarioError(f"--set {item}: expected a dotted key path such as run.dt or system.params.rho "
                            f"(quote a key holding dots or brackets: sweep.axes.\"state0[0]\"), got {key.strip()!r}.")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        if not text.strip() or any(c in text for c in "[]{}\"'="):
            raise ScenarioError(f"--set {item}: the value {text.strip()!r} is not a TOML value (numbers as "
                                "1.5, strings as \"rk4\", arrays as [1, 2]).") from None
        value = text.strip()  # a bare word: a string
    return path, value
