"""The fit job: a scenario with a `[fit]` table fits physical parameters of its system to data.

The system, initial state and how to integrate come from the scenario as for a run
(`[system]`, `[initial_state]`, `[integrator]` + `[run]` or `[solve]`); the data's times set
the run length, so a fit leaves out `[run] n_steps` and `[solve] t1` (and `save_at`, `t0`:
the start is `[fit] t0`). The fit is one call of `sciax.fit`.

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

Outputs in the output folder: `fit.json` (fitted values, standard errors, covariance and
correlation, χ² (the sum of squared errors without sigma), degrees of freedom, convergence,
iterations, unidentifiable parameters), `fit.txt` (`FitResult.summary()` with the data file and
settings), `fit.png` (`sciax.plot_fit`, with its uncertainty band; `[output] plot = false`
leaves it out), `residuals.csv` (per time: each data column, the model and the residual),
`summary.json` (status, wall time, files) and `scenario.toml` (the marked copy).
"""

import dataclasses
import hashlib
import io
import json
import math
import sys
import time
import warnings
from pathlib import Path
from typing import ClassVar

from .folder import FolderLock, Progress, RunResult, copied_by_sciax, json_safe, write_scenario_copy
from .schema import (
    Checker,
    Expected,
    ScenarioError,
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

FILES = ("scenario.toml", "fit.json", "fit.txt", "fit.png", "residuals.csv", "summary.json")
MISSING = ("", "nan", "NaN", "NA", "N/A", "na")
OBSERVE_TRANSFORMS = ("identity", "log", "log10")
TRANSFORMS = ("positive", "identity", "fixed")
SOLVERS = ("levenberg_marquardt", "gauss_newton", "bfgs")
_CHI2_TEXT = {"chi2": "χ²", "SSE": "SSE (no sigma)"}


# --------------------------------------------------------------------------- settings


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


# --------------------------------------------------------------------------- the model


@dataclasses.dataclass(frozen=True)
class ColumnObserve:
    """`observe(state)` of a fit: the flattened state's entries `indices`, each through its
    transform (`"identity"`, `"log"`, `"log10"`). A hashable value, so equal fits share their
    compiled solve."""

    indices: tuple[int, ...]
    transforms: tuple[str, ...]

    def __call__(self, state):
        import jax
        import jax.numpy as jnp

        flat = jnp.concatenate([jnp.ravel(x) for x in jax.tree_util.tree_leaves(state)])
        apply = {"identity": lambda x: x, "log": jnp.log, "log10": jnp.log10}
        return jnp.stack([apply[t](flat[i]) for i, t in zip(self.indices, self.transforms)])


def _forward(transform, x):
    import numpy as np

    return {"identity": lambda v: v, "log": np.log, "log10": np.log10}[transform](x)


def _inverse(transform, x):
    import numpy as np

    return {"identity": lambda v: v, "log": np.exp, "log10": lambda v: 10.0 ** v}[transform](x)


def _arguments(scenario, built, fit: FitSettings):
    """`sciax.fit`'s arguments for this scenario (after `build()`), and the data it fits."""
    import jax
    import numpy as np

    import sciax

    data = fit.table
    times = data.values[fit.time]
    raw = np.stack([data.values[c.name] for c in fit.columns], axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        observed = np.stack([_forward(c.transform, raw[:, j]) for j, c in enumerate(fit.columns)], axis=1)
    present = np.isfinite(observed)
    size = sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(built.state0))
    indices = [c.index for c in fit.columns] + list(fit.fit_initial_state if isinstance(fit.fit_initial_state,
                                                                                          tuple) else ())
    if max(indices) >= size:
        raise ScenarioError(f"{scenario.source}: [fit]: component index {max(indices)} is beyond the initial state, "
                            f"which has {size} entries.")
    sigma = None
    if fit.sigma_given:
        sigma = np.stack([np.full(len(times), c.sigma) if not isinstance(c.sigma, str) else data.values[c.sigma]
                          for c in fit.columns], axis=1)
        sigma = np.where(present, sigma, 1.0)  # missing entries are masked; their sigma is not used
    fis = fit.fit_initial_state
    if isinstance(fis, tuple):
        if not isinstance(built.state0, jax.Array):
            raise ScenarioError(f"{scenario.source}: [fit] fit_initial_state: components need an array state; "
                                f"{scenario.system_name}'s is a {type(built.state0).__name__}: give true or false.")
        mask = np.zeros(np.shape(built.state0), bool).ravel()
        mask[list(fis)] = True
        fis = mask.reshape(np.shape(built.state0))
    make = {"positive": sciax.Positive, "identity": sciax.Identity, "fixed": sciax.Fixed}
    transforms = {k: sciax.Bounded(*v) if isinstance(v, tuple) else make[v]() for k, v in fit.transforms.items()}
    if scenario.run is not None:
        rollout = sciax.Simulate(built.integrator, scenario.run.dt)
    else:
        s = scenario.solve
        rollout = sciax.Solve(s.solver, rtol=s.rtol, atol=s.atol, dt0=s.dt0, max_steps=s.max_steps)
    kwargs = dict(params=fit.params, rollout=rollout, transforms=transforms or None, fit_initial_state=fis,
                  observe=ColumnObserve(tuple(c.index for c in fit.columns), tuple(c.transform for c in fit.columns)),
                  sigma=sigma, mask=None if present.all() else present, t0=fit.t0,
                  shooting=None if fit.segments == 1 else sciax.MultipleShooting(fit.segments, fit.continuity_weight),
                  solver=fit.solver, jacobian=fit.jacobian, rtol=fit.rtol, atol=fit.atol, max_steps=fit.max_steps,
                  scale_covariance=fit.scale_covariance, throw=False, compilation=fit.compilation)
    return times, observed, raw, sigma, present, kwargs


# --------------------------------------------------------------------------- the run


def run(scenario, out_dir=None, *, resume: bool = False, progress: bool = True, stream=None) -> RunResult:
    """Fit `scenario`'s system to its `[fit]` data and write the outputs to `out_dir` (default
    `[output] dir`).

    A fit is one job with nothing to continue: `resume=True` runs it again from the start, like
    `resume=False`. The outputs of a previous fit in the folder are replaced; files of those names
    that no sciax run wrote are refused. Every file is written atomically after the fit, so a fit
    that fails or is interrupted leaves the folder as it was. Progress (`progress=True`, on
    `stream`, default `sys.stderr`): a line when the fit starts (it compiles, then solves in one
    program) and one with the iterations, loss and χ² when it ends.

    **Returns:** a `RunResult` with status `"completed"`, `steps_done` = optimiser iterations,
    and the `summary.json` dict as `summary`.

    **Raises:** `ScenarioError` (the scenario or its data cannot be fitted as given: `sciax.fit`
    refused its input; an output folder that holds files no sciax run wrote; nothing is
    written), `sciax.FitError` (a `RuntimeError`: the fit did not converge; its outputs are
    written first, with status `"not-converged"`, and the error's `run_result` is their
    `RunResult`), `OSError` (the outputs cannot be written).
    """

    import sciax

    del resume  # a fit always runs from the start (see the docstring)
    stream = sys.stderr if stream is None else stream
    fit: FitSettings = scenario.job
    start_wall = time.monotonic()
    built = dataclasses.replace(scenario, system_params={**scenario.system_params, **fit.start}).build()
    times, observed, raw, sigma, present, kwargs = _arguments(scenario, built, fit)
    root = Path(out_dir) if out_dir is not None else scenario.output_dir
    report = Progress(scenario.name, 0, stream, progress)
    with FolderLock(root):
        _refuse_foreign_files(root)
        n_obs = int(present.sum())
        report.message(f"{scenario.name}: fitting {', '.join(fit.params)}"
                       f"{' and the initial state' if fit.fit_initial_state else ''} to {n_obs} values of "
                       f"{fit.path} (compiling, then solving) ...")
        try:
            result = sciax.fit(built.system, built.state0, times, observed, **kwargs)
        except (ValueError, TypeError) as e:  # sciax.fit's contract: bad input
            raise ScenarioError(f"{scenario.source}: [fit]: sciax.fit refused the problem: {e}") from None
        fit_s = time.monotonic() - start_wall
        status = "completed" if result.converged else "not-converged"
        stats = _statistics(result, fit)
        report.message(f"{scenario.name}: {'converged' if result.converged else 'NOT converged'} after "
                       f"{result.n_steps} iterations, loss ½Σr² = {stats['loss']:.6g}, "
                       f"{_CHI2_TEXT[stats['chi_square_name']]} = {stats['chi_square']:.6g} ({fit_s:.1f} s)")
        png, plot_error, plot_warnings = None, None, []
        if scenario.output.plot:
            if fit.band_samples:
                report.message(f"{scenario.name}: drawing the fit with its band ({fit.band_samples} draws) ...")
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    png = _plot_png(scenario, result, times, observed, present, fit)
                plot_warnings = [str(w.message) for w in caught]
            except Exception as e:  # a picture must not cost the fit's other outputs
                plot_error = f"{type(e).__name__}: {e}"
                report.message(f"{scenario.name}: warning: the plot failed ({plot_error}).")
        texts = {"residuals.csv": _residuals_csv(result, fit, times, observed, raw, sigma, present),
                 "fit.txt": _fit_text(scenario, result, fit, stats, built.dtype)}
        record = {**stats, "scenario": scenario.name, "system": scenario.system_name,
                  "data": _data_record(fit), "settings": fit.physics()}
        texts["fit.json"] = json.dumps(json_safe(record), indent=2, allow_nan=False) + "\n"
        files = ["scenario.toml", "fit.json", "fit.txt", "residuals.csv"] + (["fit.png"] if png else [])
        files.append("summary.json")
        summary = _summary(scenario, result, fit, status, stats, start_wall, fit_s, plot_error, plot_warnings, files)
        _write(root, scenario, texts, png, summary)
    outcome = RunResult(out_dir=root, status=status, steps_done=int(result.n_steps), summary=summary)
    if not result.converged:
        error = sciax.FitError(
            f"{scenario.name}: the fit did not converge after {result.n_steps} iterations"
            f"{': ' + result.message if result.message else ''} (loss ½Σr² = {stats['loss']:.6g}); its outputs are in "
            f"{root}/ (fit.txt). Try closer starting values ([fit] params), transforms that keep the parameters in "
            "range, a larger [fit] max_steps, or [fit] shooting for long or chaotic series.", result=result)
        error.run_result = outcome
        raise error
    return outcome


def _refuse_foreign_files(root: Path):
    if copied_by_sciax(root / "scenario.toml"):
        return
    clashes = [n for n in FILES if (root / n).exists()]
    if clashes:
        raise ScenarioError(f"the output folder {root} holds {', '.join(clashes)}, which a fit would overwrite, and "
                            "no sciax run wrote them (no scenario.toml copied by sciax there). Choose another folder "
                            "with --out or [output] dir, or move those files away.")


def _write(root: Path, scenario, texts: dict, png: bytes | None, summary: dict):
    """Every output atomically; summary.json last (its presence says the others are whole)."""
    from .. import io as sio

    for stale in [p for n in FILES for p in root.glob(f".{n}.*.tmp")]:
        stale.unlink(missing_ok=True)  # temporaries of a killed run's atomic writes
    (root / "summary.json").unlink(missing_ok=True)
    write_scenario_copy(root / "scenario.toml", scenario)
    for name, text in texts.items():
        with sio.atomic_write(root / name, "w") as f:
            f.write(text)
    if png is None:
        (root / "fit.png").unlink(missing_ok=True)  # an earlier fit's picture must not stand in for this one's
    else:
        sio.atomic_write_bytes(root / "fit.png", png)
    with sio.atomic_write(root / "summary.json", "w") as f:
        json.dump(json_safe(summary), f, indent=2, allow_nan=False)
        f.write("\n")


def _number(x):
    import numpy as np

    a = np.asarray(x, dtype=np.float64)
    return float(a) if a.ndim == 0 else a.tolist()


def _statistics(result, fit: FitSettings) -> dict:
    import numpy as np

    dof = result.n_observations - result.n_parameters
    chi2 = result.chi_square
    errors = np.sqrt(np.diag(np.asarray(result.covariance, dtype=np.float64)))
    state0_se = result.state0_standard_errors
    return {
        "converged": bool(result.converged), "message": result.message, "iterations": int(result.n_steps),
        "params": {k: _number(v) for k, v in result.params.items()},
        "standard_errors": {k: _number(v) for k, v in result.standard_errors.items()},
        "state0": _number(np.concatenate([np.ravel(x) for x in _leaves(result.state0)])),
        "state0_standard_errors": None if state0_se is None else _number(
            np.concatenate([np.ravel(x) for x in _leaves(state0_se)])),
        "labels": list(result.labels), "values": _number(np.asarray(result.optimum)[:len(result.labels)]),
        "errors": errors.tolist(),
        "correlation": _number(result.correlation), "covariance": _number(result.covariance),
        "chi_square_name": "chi2" if fit.sigma_given else "SSE", "chi_square": chi2,
        "loss": float(result.loss), "degrees_of_freedom": dof,
        "reduced_chi_square": chi2 / dof if dof > 0 else None,
        "residual_variance": float(result.residual_variance),
        "noise_sd": None if fit.sigma_given else float(np.sqrt(result.residual_variance)),
        "n_observations": int(result.n_observations), "n_parameters": int(result.n_parameters),
        "unidentifiable": list(result.unidentifiable), "at_bounds": list(result.at_bounds),
        "compilation": result.compilation,
    }


def _leaves(tree):
    import jax

    return jax.tree_util.tree_leaves(tree)


def _data_record(fit: FitSettings) -> dict:
    return {"file": str(fit.path), "sha256": fit.sha256, "rows": len(fit.table.lines), "time": fit.time,
            "columns": {c.name: {"component": c.component, "index": c.index, "transform": c.transform,
                                 "sigma": c.sigma} for c in fit.columns}}


def _model(result, observed, sigma, present):
    """The model the fit compared with each observed entry (NaN where the data are missing), in
    the fitted (transformed) space, from the residuals r = (model − observed)/sigma."""
    import numpy as np

    keep = np.flatnonzero(present.ravel())
    s = np.ones(observed.shape) if sigma is None else sigma
    flat = np.full(observed.size, np.nan)
    residual = np.full(observed.size, np.nan)
    r = np.asarray(result.residuals, dtype=np.float64)
    residual[keep] = r
    flat[keep] = observed.ravel()[keep] + r * s.ravel()[keep]
    return flat.reshape(observed.shape), residual.reshape(observed.shape)


def _residuals_csv(result, fit, times, observed, raw, sigma, present) -> str:
    model, residual = _model(result, observed, sigma, present)
    header = [fit.time]
    for c in fit.columns:
        header += [c.name, f"{c.name}_model", f"{c.name}_residual"]
    lines = [",".join(header)]
    fmt = lambda v: repr(float(v)) if math.isfinite(v) else ""  # noqa: E731  (shortest exact form)
    for i, t in enumerate(times):
        row = [fmt(t)]
        for j, c in enumerate(fit.columns):
            row += [fmt(raw[i, j]), fmt(_inverse(c.transform, model[i, j])), fmt(residual[i, j])]
        lines.append(",".join(row))
    return "\n".join(lines) + "\n"


def _labels(fit: FitSettings) -> list[str]:
    prefix = {"identity": "", "log": "ln ", "log10": "log10 "}
    return [f"{prefix[c.transform]}{c.name}" for c in fit.columns]


def _plot_png(scenario, result, times, observed, present, fit) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import sciax

    title = f"{scenario.name}: {scenario.system_name} fitted to {fit.path.name}"
    if fit.band_samples:
        title += "\nwith the 95% band of the parameter uncertainty"
    fig = sciax.plot_fit(result, times, observed, mask=present, labels=_labels(fit), title=title,
                         n_samples=fit.band_samples)
    fig.axes[-1].set_xlabel(fit.time)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    return buffer.getvalue()


def _fit_text(scenario, result, fit: FitSettings, stats: dict, dtype) -> str:
    import numpy as np

    mapping = ", ".join(f"{c.name} -> {c.component}" + (f" ({c.transform})" if c.transform != "identity" else "")
                        for c in fit.columns)
    rollout = (f"fixed steps: {scenario.integrator_name}, dt = {scenario.run.dt:g}" if scenario.run is not None else
               f"adaptive: {scenario.solve.solver}, rtol = {scenario.solve.rtol:g}, atol = {scenario.solve.atol:g}")
    sigma = ("not given (covariance rescaled by the residual variance)" if not fit.sigma_given else
             ", ".join(f"{c.name}: {c.sigma if not isinstance(c.sigma, str) else 'column ' + c.sigma}"
                       for c in fit.columns))
    lines = [f"{scenario.name}: fit of {scenario.system_name} ({scenario.description})" if scenario.description
             else f"{scenario.name}: fit of {scenario.system_name}",
             f"data: {fit.path} ({len(fit.table.lines)} rows, sha256 {fit.sha256[:16]}...), time column {fit.time!r}",
             f"columns: {mapping}",
             f"sigma: {sigma}",
             f"t0: {fit.t0 if fit.t0 is not None else fit.table.values[fit.time][0]:g}; integration: {rollout}; "
             f"precision: {np.dtype(dtype).name}",
             f"optimiser: {fit.solver}, max_steps = {fit.max_steps}, jacobian = {fit.jacobian}, "
             f"compilation = {result.compilation}"
             + (f"; multiple shooting: {fit.segments} segments (continuity weight {fit.continuity_weight:g})"
                if fit.segments > 1 else ""),
             "", result.summary()]
    if stats["noise_sd"] is not None:
        lines.append(f"noise estimate (sd of the residuals, fitted space): s = {stats['noise_sd']:.4g}")
    return "\n".join(lines) + "\n"


def _summary(scenario, result, fit, status, stats, start_wall, fit_s, plot_error, plot_warnings, files) -> dict:
    import equinox as eqx
    import jax

    from .._version import __version__

    return {
        "scenario": scenario.name, "source": scenario.source, "description": scenario.description, "kind": "fit",
        "status": status, "system": scenario.system_name, "precision": scenario.precision,
        "overrides": scenario.overrides, "data": str(fit.path),
        "fit": {k: stats[k] for k in ("converged", "message", "iterations", "loss", "chi_square_name", "chi_square",
                                      "degrees_of_freedom", "labels", "values", "errors", "unidentifiable")},
        "fit_time_s": fit_s, "wall_time_s": time.monotonic() - start_wall,
        "plot_error": plot_error, "warnings": plot_warnings,
        "backend": jax.default_backend(), "x64_enabled": bool(jax.config.jax_enable_x64),
        "versions": {"sciax": __version__, "jax": jax.__version__, "equinox": eqx.__version__},
        "scenario_hash": scenario.hash(), "files": files,
    }


def report(scenario, result: RunResult) -> list[str]:
    """A short human summary of a fit of `scenario` (`run`'s `result`): its status, iterations,
    χ² (or SSE) and the fitted values ± standard errors."""
    s = result.summary
    f = s["fit"]
    name = _CHI2_TEXT[f["chi_square_name"]]
    dof = f["degrees_of_freedom"]
    lines = [f"{s['scenario']}: {'fitted' if f['converged'] else 'NOT converged'} in {s['wall_time_s']:.2f} s "
             f"({s['precision']}, {s['backend']}): {f['iterations']} iterations, {name} = {f['chi_square']:.6g} "
             f"with {dof} degrees of freedom"]
    if f["message"]:
        lines.append(f"  {f['message']}")
    width = max((len(n) for n in f["labels"]), default=4)
    for label, value, error in zip(f["labels"], f["values"], f["errors"]):
        lines.append(f"  {label:<{width}}  {value: .6g} ± {error:.3g}")
    if f["unidentifiable"]:
        lines.append(f"  not identifiable from these data: {', '.join(f['unidentifiable'])}")
    return lines
