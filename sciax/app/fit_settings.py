"""The `[fit]` table of a scenario file, validated: `FitSettings` and `parse_settings`
(called by `sciax.app.scenario` for a file with a `[fit]` table; `fit_job` runs it), with the
data file it names read and checked against it.

The system, initial state and how to integrate come from the scenario as for a run
(`[system]`, `[initial_state]`, `[integrator]` + `[run]` or `[solve]`); the data's times set
the run length, so a fit leaves out `[run] n_steps` and `[solve] t1` (and `save_at`, `t0`:
the start is `[fit] t0`).

```toml
[fit]
data = "data/hudson_bay_lynx_hare.csv"  # CSV: a header row; lines starting with # are comments;
                                        # empty, "nan" or "NA" cells are missing values (masked)
time = "year"                           # the time column
columns = { hare = { component = "prey", transform = "log" }, lynx = "predator" }
                                        # data column -> observed state component: its name
                                        # (the system's component_names) or index into the
                                        # flattened state, optionally through "log" or "log10"
                                        # (the fit then compares the logs: log-normal errors)
params = ["alpha", "beta"]              # system parameters to fit, or a table of them with
                                        # starting values: { alpha = 0.5 } (overrides [system])
transforms = { alpha = "positive", beta = { bounded = [0.0, 1.0] }, state0 = "positive" }
                                        # per parameter: "positive", "identity", "fixed",
                                        # { bounded = [lo, hi] }; "state0": the fitted initial state
fit_initial_state = false               # true, false, or components: ["prey"], [0]
sigma = 0.05                            # observation sd: a number, a column of uncertainties
                                        # ("x_err"), or a table per data column of either;
                                        # for a log column, the sd of the log. Without sigma
                                        # the covariance is rescaled by the residual variance.
t0 = 1900.0                             # start of the integration (default: the first time)
shooting = 1                            # multiple shooting: number of segments, or
                                        # { segments = 4, continuity_weight = 10.0 }
solver = "levenberg_marquardt"          # or "gauss_newton", "bfgs"
max_steps = 256                         # optimiser steps
jacobian = "auto"                       # or "forward", "reverse"
rtol = 1e-8                             # optimiser tolerances (default: sciax.fit's for the precision)
atol = 1e-8
scale_covariance = true                 # default: only without sigma
compilation = "auto"                    # or "fast", "optimised" (sciax.fit)
band_samples = 200                      # parameter draws for the plot's 95% band (0: none)
```
"""

import dataclasses
import hashlib
import math
from pathlib import Path
from typing import ClassVar

from .schema import (
    Checker,
    Expected,
    boolean,
    choice,
    did_you_mean,
    finite_number,
    got,
    nonnegative_int,
    numeric_array,
    positive_int,
    positive_number,
    string,
    table,
)

__all__ = ["Column", "DataTable", "FitSettings", "parse_settings"]

MISSING = ("", "nan", "NaN", "NA", "N/A", "na")
OBSERVE_TRANSFORMS = ("identity", "log", "log10")
TRANSFORMS = ("positive", "identity", "fixed")
SOLVERS = ("levenberg_marquardt", "gauss_newton", "bfgs")


@dataclasses.dataclass(frozen=True, eq=False)
class DataTable:
    """A CSV file's numeric columns (NaN where missing), in file order."""

    header: tuple[str, ...]
    values: dict  # column -> float64 array
    lines: tuple[int, ...]  # the file line of each row (for messages)


@dataclasses.dataclass(frozen=True)
class Column:
    """One observed data column: the flattened-state `index` it observes (`component` as
    written), through `transform`, with `sigma` (a number, a column name, or None)."""

    name: str
    component: str | int
    index: int
    transform: str = "identity"
    sigma: float | str | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class FitSettings:
    """The `[fit]` table, validated, with the data it names already read."""

    KIND: ClassVar[str] = "fit"

    data: str  # as written
    path: Path  # where it was found
    sha256: str
    time: str
    columns: tuple[Column, ...]
    params: tuple[str, ...]
    start: dict  # starting values given in [fit] params
    transforms: dict  # name -> "positive" | "identity" | "fixed" | (lo, hi)
    fit_initial_state: bool | tuple[int, ...] = False
    t0: float | None = None
    segments: int = 1
    continuity_weight: float = 10.0
    solver: str = "levenberg_marquardt"
    max_steps: int = 256
    jacobian: str = "auto"
    rtol: float | None = None
    atol: float | None = None
    scale_covariance: bool | None = None
    compilation: str = "auto"
    band_samples: int = 200
    table: DataTable = None

    @property
    def sigma_given(self) -> bool:
        return any(c.sigma is not None for c in self.columns)

    def physics(self) -> dict:
        """The settings that determine the fit (JSON-able; the data by their SHA-256)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("path", "table")}
        out["columns"] = [dataclasses.asdict(c) for c in self.columns]
        out["params"] = list(self.params)
        out["transforms"] = {k: list(v) if isinstance(v, tuple) else v for k, v in self.transforms.items()}
        if isinstance(self.fit_initial_state, tuple):
            out["fit_initial_state"] = list(self.fit_initial_state)
        return out


_FIT_KEYS = {"data": string, "time": string, "columns": lambda v: _table_of(v, "data column"),
             "params": lambda v: v, "transforms": table,
             "fit_initial_state": lambda v: v, "sigma": lambda v: v, "t0": finite_number,
             "shooting": lambda v: v, "solver": choice(*SOLVERS), "max_steps": positive_int,
             "jacobian": choice("auto", "forward", "reverse"), "rtol": positive_number,
             "atol": positive_number, "scale_covariance": boolean,
             "compilation": choice("auto", "fast", "optimised"), "band_samples": nonnegative_int}


def _table_of(value, what):
    if not isinstance(value, dict) or not value:
        raise Expected(f"a table keyed by {what}, e.g. {{ x = ... }}")
    return value


def parse_settings(checker: Checker, table: dict, scenario) -> FitSettings:
    """Validate the `[fit]` table of `scenario` (its other sections already validated) and read
    the data file it names (relative to the scenario's folder, then the current folder).

    **Raises:** `ScenarioError` naming the file, the key (`[fit] columns.hare`), what was
    expected and what was found.
    """
    w = "[fit]"
    s = checker.section(table, w, _FIT_KEYS, required=("data", "time", "columns", "params"))
    _refuse_run_length(checker, scenario)
    path = _find_data(checker, s["data"], scenario.folder)
    data = _read_csv(checker, path)
    cols = list(data.header)
    if s["time"] not in data.values:
        raise checker.error(f"{w} time", f"no column {s['time']!r} in {path}; its columns: {', '.join(cols)}."
                            f"{did_you_mean(s['time'], cols)}")
    times = data.values[s["time"]]
    bad = [i for i in range(len(times)) if not math.isfinite(times[i]) or (i and times[i] <= times[i - 1])]
    if bad:
        raise checker.error(f"{w} time", f"expected finite, strictly increasing times in column {s['time']!r} of "
                            f"{path}, got {times[bad[0]]!r} at line {data.lines[bad[0]]}.")
    if len(times) < 1:
        raise checker.error(f"{w} data", f"{path} has a header but no data rows.")

    system_cls = scenario.system_class()
    columns = [_column(checker, f"{w} columns.{name}", name, spec, system_cls, data, path)
               for name, spec in s["columns"].items()]
    columns = _with_sigma(checker, s.get("sigma"), columns, data, path)
    params, start = _params(checker, s["params"], system_cls)
    fis = _fit_initial_state(checker, s.get("fit_initial_state", False), system_cls)
    transforms = _transforms(checker, s.get("transforms", {}), params, bool(fis))
    segments, weight = _shooting(checker, s.get("shooting", 1), len(times))
    t0 = s.get("t0")
    if t0 is not None and t0 > times[0]:
        raise checker.error(f"{w} t0", f"expected a time at or before the first data time ({times[0]:g}), got {t0!r}.")
    if scenario.run is not None:
        _check_grid(checker, times, times[0] if t0 is None else t0, scenario.run.dt, s["time"])
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    options = {k: s[k] for k in ("solver", "max_steps", "jacobian", "rtol", "atol", "scale_covariance",
                                 "compilation", "band_samples") if k in s}
    return FitSettings(data=s["data"], path=path, sha256=digest, time=s["time"], columns=tuple(columns),
                       params=params, start=start, transforms=transforms, fit_initial_state=fis, t0=t0,
                       segments=segments, continuity_weight=weight, table=data, **options)


def _refuse_run_length(checker, scenario):
    """A fit takes its run length and save times from the data, and its start from [fit] t0."""
    run, solve = scenario.run, scenario.solve
    given = []
    if run is not None:
        given += [("[run] n_steps", run.n_steps is not None), ("[run] t0", run.t0 != 0.0),
                  ("[run] save_every", run.save_every != 1)]
    if solve is not None:
        given += [("[solve] t1", solve.t1 is not None), ("[solve] save_at", solve.save_at is not None),
                  ("[solve] t0", solve.t0 != 0.0), ("[solve] save_from", solve.save_from is not None)]
    for where, present in given:
        if present:
            raise checker.error(where, "not used by a fit: the data's times set the run length and save times, "
                                "and [fit] t0 the start (default: the first data time); remove it.")


def _find_data(checker, name: str, folder) -> Path:
    where = Path(name).expanduser()
    candidates = [where] if where.is_absolute() else list(dict.fromkeys([Path(folder) / where, where]))
    for c in candidates:
        if c.is_file():
            return c
    raise checker.error("[fit] data", f"no data file {name!r} (looked for {' and '.join(map(str, candidates))}).")


def _read_csv(checker, path: Path) -> DataTable:
    """A CSV file with a header row; `#` lines and blank lines are skipped; missing values
    (`MISSING`) are NaN."""
    import csv

    import numpy as np

    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise checker.error("[fit] data", f"cannot read {path}: {e}.") from None
    header, rows, lines = None, [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = [f.strip() for f in next(csv.reader([line]))]
        if header is None:
            if len(set(fields)) != len(fields) or not all(fields):
                raise checker.error("[fit] data", f"expected a header row of distinct, non-empty column names in "
                                    f"{path} (line {number}), got {fields}.")
            header = fields
            continue
        if len(fields) != len(header):
            raise checker.error("[fit] data", f"line {number} of {path} has {len(fields)} fields, expected "
                                f"{len(header)} (the header's: {', '.join(header)}).")
        row = []
        for col, field in zip(header, fields):
            try:
                row.append(float("nan") if field in MISSING else float(field))
            except ValueError:
                raise checker.error("[fit] data", f"expected a number (or an empty cell for a missing value) in "
                                    f"column {col!r} at line {number} of {path}, got {field!r}.") from None
        rows.append(row)
        lines.append(number)
    if header is None:
        raise checker.error("[fit] data", f"{path} has no header row (no lines other than comments).")
    block = np.asarray(rows, dtype=np.float64).reshape(len(rows), len(header))
    return DataTable(tuple(header), {c: block[:, i] for i, c in enumerate(header)}, tuple(lines))


def _component(checker, where, value, system_cls) -> int:
    names = getattr(system_cls, "component_names", None) or ()
    size = getattr(system_cls, "n_components", None)
    if isinstance(value, str):
        if value not in names:
            known = f"its components: {', '.join(names)}" if names else "it names no components (give an index)"
            raise checker.error(where, f"{system_cls.__name__} has no component {value!r}; {known}."
                                f"{did_you_mean(value, names)}")
        return names.index(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        if size is not None and value >= size:
            raise checker.error(where, f"expected a component index 0..{size - 1} of {system_cls.__name__}, "
                                f"got {value}.")
        return value
    raise checker.error(where, f"expected a component name ({', '.join(names) or 'none'}) or a non-negative "
                        f"index, got {got(value)}.")


def _column(checker, where, name, spec, system_cls, data: DataTable, path) -> Column:
    if name not in data.values:
        raise checker.error(where, f"no column {name!r} in {path}; its columns: {', '.join(data.header)}."
                            f"{did_you_mean(name, data.header)}")
    table_form = isinstance(spec, dict)
    if table_form:
        spec = checker.section(spec, where, {"component": lambda v: v, "transform": choice(*OBSERVE_TRANSFORMS)},
                               required=("component",))
    else:
        spec = {"component": spec}
    index = _component(checker, f"{where} component" if table_form else where, spec["component"], system_cls)
    transform = spec.get("transform", "identity")
    if transform != "identity":
        values = data.values[name]
        bad = [i for i, v in enumerate(values) if math.isfinite(v) and v <= 0]
        if bad:
            raise checker.error(f"{where} transform", f"{transform!r} needs positive data, but column {name!r} of "
                                f"{path} holds {values[bad[0]]!r} at line {data.lines[bad[0]]}.")
    return Column(name, spec["component"], index, transform)


def _with_sigma(checker, sigma, columns, data: DataTable, path):
    if sigma is None:
        return columns
    where = "[fit] sigma"
    names = [c.name for c in columns]
    if isinstance(sigma, dict):
        unknown = [k for k in sigma if k not in names]
        if unknown:
            raise checker.error(f"{where}.{unknown[0]}", f"not one of the fitted data columns ({', '.join(names)}).")
        missing = [n for n in names if n not in sigma]
        if missing:
            raise checker.error(where, f"expected a sigma for every fitted data column, missing: {', '.join(missing)}.")
        per = {n: (f"{where}.{n}", sigma[n]) for n in names}
    elif isinstance(sigma, str) and len(names) > 1:
        raise checker.error(where, f"a column name of uncertainties, {sigma!r}, is ambiguous with {len(names)} data "
                            f"columns; give a table, e.g. {{ {names[0]} = \"{names[0]}_err\", ... }}.")
    else:
        per = {n: (where, sigma) for n in names}
    out = []
    for column in columns:
        key, value = per[column.name]
        if isinstance(value, str):
            if value not in data.values:
                raise checker.error(key, f"no column {value!r} in {path}; its columns: {', '.join(data.header)}."
                                    f"{did_you_mean(value, data.header)}")
            sd, observed = data.values[value], data.values[column.name]
            bad = [i for i in range(len(sd)) if math.isfinite(observed[i]) and not (math.isfinite(sd[i]) and sd[i] > 0)]
            if bad:
                raise checker.error(key, f"expected positive uncertainties in column {value!r} of {path} wherever "
                                    f"{column.name!r} has a value, got {sd[bad[0]]!r} at line {data.lines[bad[0]]}.")
        else:
            value = checker.value(key, value, positive_number)
        out.append(dataclasses.replace(column, sigma=value))
    return out


def _fields(system_cls) -> dict:
    """The fittable fields of a system class: constructor fields that are not static."""
    return {f.name: f for f in dataclasses.fields(system_cls) if f.init and not f.metadata.get("static", False)}


def _params(checker, value, system_cls):
    where = "[fit] params"
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        names, start = list(value), {}
    elif isinstance(value, dict) and value:
        names, start = list(value), {k: checker.value(f"{where}.{k}", v, numeric_array) for k, v in value.items()}
    else:
        raise checker.error(where, f"expected an array of parameter names, e.g. [\"alpha\", \"beta\"], or a table of "
                            f"starting values, e.g. {{ alpha = 0.5 }}, got {got(value)}.")
    fields = _fields(system_cls)
    for name in names:
        if name not in fields:
            raise checker.error(f"{where}.{name}" if start else where,
                                f"{name!r} is not a parameter of {system_cls.__name__}; its parameters: "
                                f"{', '.join(fields) or '(none)'}.{did_you_mean(name, fields)}")
    if len(set(names)) != len(names):
        raise checker.error(where, f"expected distinct names, got {names}.")
    return tuple(names), start


def _fit_initial_state(checker, value, system_cls):
    where = "[fit] fit_initial_state"
    if isinstance(value, bool):
        return value
    if isinstance(value, list) and value:
        indices = tuple(_component(checker, where, v, system_cls) for v in value)
        if len(set(indices)) != len(indices):
            raise checker.error(where, f"expected distinct components, got {value}.")
        return indices
    raise checker.error(where, f"expected true, false or an array of components (names or indices), got "
                        f"{got(value)}.")


def _transforms(checker, given: dict, params, fits_state):
    out = {}
    valid = list(params) + (["state0"] if fits_state else [])
    for name, value in given.items():
        where = f"[fit] transforms.{name}"
        if name not in valid:
            why = " (state0 needs fit_initial_state)" if name == "state0" else ""
            raise checker.error(where, f"not a fitted parameter{why}; fitted: {', '.join(valid)}."
                                f"{did_you_mean(name, valid)}")
        if isinstance(value, str) and value in TRANSFORMS:
            out[name] = value
            continue
        if isinstance(value, dict) and list(value) == ["bounded"]:
            b = value["bounded"]
            if (isinstance(b, list) and len(b) == 2 and all(isinstance(x, int | float) and not isinstance(x, bool)
                                                             and math.isfinite(x) for x in b) and b[0] < b[1]):
                out[name] = (float(b[0]), float(b[1]))
                continue
            raise checker.error(where, f"expected bounded = [lower, upper] with finite lower < upper, got "
                                f"{got(b)}.")
        raise checker.error(where, f"expected one of {', '.join(map(repr, TRANSFORMS))} or {{ bounded = [lo, hi] }}, "
                            f"got {got(value)}.")
    return out


def _shooting(checker, value, n_times):
    where = "[fit] shooting"
    if isinstance(value, dict):
        s = checker.section(value, where, {"segments": positive_int, "continuity_weight": positive_number},
                            required=("segments",))
        segments, weight = s["segments"], s.get("continuity_weight", 10.0)
    else:
        segments, weight = checker.value(where, value, positive_int), 10.0
    if segments > n_times:
        raise checker.error(where, f"expected at most one segment per data time ({n_times}), got {segments}.")
    return segments, weight


def _check_grid(checker, times, t0, dt, time_column):
    """Fixed steps save on the grid t0 + k·dt: every data time must lie on it."""
    import numpy as np

    k = np.rint((times - t0) / dt)
    off = np.abs(times - (t0 + k * dt)) > 1e-6 * dt + 16 * np.finfo(np.float64).eps * (np.abs(times) + abs(t0))
    if np.any(off):
        i = int(np.flatnonzero(off)[0])
        raise checker.error("[run] dt", f"a fit with fixed steps saves on the grid t0 + k·dt (t0 = {t0:g}); the data "
                            f"time {times[i]!r} (column {time_column!r}) is not on it for dt = {dt:g}. Choose dt "
                            "dividing the data's time steps, or use [solve], which saves at any times.")
