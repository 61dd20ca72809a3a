"""The sections of a scenario file that describe the model and how to integrate it (`[system]`,
`[initial_state]`, `[integrator]` + `[run]` or `[solve]`, `[output]`): their validated settings
and the checks that make them, each error naming the file and the key. `scenario.py` puts them
together (`parse_scenario`) and builds the objects.
"""

import dataclasses
import inspect
import math
import typing

from .classes import init_fields, presets, resolve_class
from .schema import (
    PRECISIONS,
    Checker,
    Expected,
    bool_or_auto,
    boolean,
    choice,
    did_you_mean,
    finite_number,
    folder,
    nonnegative_int,
    numeric_array,
    positive_int,
    positive_number,
    string,
    string_list,
    table,
    vector,
)

DEFAULT_CHUNK_STEPS = 10_000
MAX_AUTO_STATE_COLUMNS = 64


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """The `[run]` section, validated."""

    dt: float
    n_steps: int | None = None  # None only in a fit (the data's times set the run length)
    save_every: int = 1
    t0: float = 0.0
    precision: str = "float64"
    seed: int = 0
    chunk_steps: int = DEFAULT_CHUNK_STEPS
    observables: tuple[str, ...] = ("conserved",)
    check_finite: bool = True


@dataclasses.dataclass(frozen=True)
class SolveSettings:
    """The `[solve]` section, validated: an adaptive (or stiff) Diffrax solve, `sciax.Solve`.

    Save times: `save_at` (explicit, increasing, within [t0, t1]) or `n_save` times spaced
    `"linear"`ly from `save_from` (default t0) to t1, or `"log"`arithmically (`save_from` > 0).
    """

    t1: float | None = None  # None only in a fit (the data's times)
    solver: str = "tsit5"
    t0: float = 0.0
    rtol: float = 1e-8
    atol: float = 1e-10
    dt0: float | None = None
    max_steps: int = 100_000
    save_at: tuple[float, ...] | None = None
    n_save: int = 201
    spacing: str = "linear"
    save_from: float | None = None
    precision: str = "float64"
    observables: tuple[str, ...] = ("conserved",)

    def times(self):
        """The save times, a NumPy float64 array."""
        import numpy as np

        if self.save_at is not None:
            return np.asarray(self.save_at, dtype=np.float64)
        start = self.t0 if self.save_from is None else self.save_from
        if self.spacing == "log":
            return np.geomspace(start, self.t1, self.n_save)
        return np.linspace(start, self.t1, self.n_save)


@dataclasses.dataclass(frozen=True)
class OutputSettings:
    """The `[output]` section, validated."""

    dir: str
    plot: bool = True
    states_csv: bool | str = "auto"


TOP_KEYS = {"name": string, "description": string, "system": table, "initial_state": table,
             "integrator": table, "run": table, "solve": table, "output": table}
SYSTEM_KEYS = {"name": string, "params": table}
INTEGRATOR_KEYS = {"name": string, "params": table}
_STATE_KEYS = {"values": vector, "positions": vector, "velocities": vector, "preset": string,
               "default": boolean}
_RUN_KEYS = {"dt": positive_number, "n_steps": positive_int, "save_every": positive_int,
             "t0": finite_number, "precision": choice(*PRECISIONS), "seed": nonnegative_int,
             "chunk_steps": positive_int, "observables": string_list, "check_finite": boolean}
OUTPUT_KEYS = {"dir": folder, "plot": boolean, "states_csv": bool_or_auto}


def solver_names() -> tuple[str, ...]:
    from .._solve import SolverName

    return typing.get_args(SolverName)


def _increasing_times(value):
    vector(value)
    if any(isinstance(v, list) for v in value) or len(value) < 1 or any(b <= a for a, b in zip(value, value[1:])):
        raise Expected("an increasing array of times, e.g. [0.0, 1.0, 10.0]")
    return tuple(float(v) for v in value)


_SOLVE_KEYS = {"solver": string, "t0": finite_number, "t1": finite_number, "rtol": positive_number,
               "atol": positive_number, "dt0": positive_number, "max_steps": positive_int,
               "save_at": _increasing_times, "n_save": positive_int, "spacing": choice("linear", "log"),
               "save_from": finite_number, "precision": choice(*PRECISIONS), "observables": string_list}

# Job tables: a scenario with one of these runs that job with the model above; each module has
# `parse_settings(checker, table, scenario) -> settings` and `run(scenario, out_dir, ...)`.
def lookup(checker: Checker, where: str, name: str, kind: str, folder) -> type:
    try:
        return resolve_class(name, kind, folder)
    except (LookupError, TypeError) as e:
        raise checker.error(where, str(e).rstrip(".") + ".") from None


def check_params(checker: Checker, where: str, cls, params: dict) -> dict:
    fields = init_fields(cls)
    out = {}
    for key, value in params.items():
        if key not in fields:
            valid = ", ".join(fields) or "(none)"
            raise checker.error(f"{where}.{key}",
                                f"unknown parameter of {cls.__name__}; valid parameters: {valid}."
                                f"{did_you_mean(key, fields)}")
        field = fields[key]
        static = field is not None and field.metadata.get("static", False)
        out[key] = value if static else checker.value(f"{where}.{key}", value, numeric_array)
    return out


def check_initial_state(checker: Checker, table: dict, system_cls) -> dict:
    where = "[initial_state]"
    by_name = presets(system_cls)
    if "preset" in table:
        preset = checker.value(f"{where} preset", table["preset"], string)
        if preset not in by_name:
            raise checker.error(f"{where} preset",
                                f"unknown preset {preset!r} for {system_cls.__name__}; "
                                f"valid presets: {', '.join(by_name) or '(none)'}.{did_you_mean(preset, by_name)}")
        params = inspect.signature(by_name[preset]).parameters
        valid = [p for p in params if p != "self"]
        out = {"preset": preset}
        for key, value in table.items():
            if key == "preset":
                continue
            if key not in valid:
                raise checker.error(f"{where} {key}",
                                    f"unknown key for preset {preset!r} ({system_cls.__name__}."
                                    f"{preset}_state); valid keys: {', '.join(['preset', *valid])}.")
            out[key] = checker.value(f"{where} {key}", value, numeric_array)
        return out
    out = checker.section(table, where, _STATE_KEYS)
    forms = [k for k in ("values", "positions", "default") if k in out]
    if "velocities" in out and "positions" not in out:
        raise checker.error(f"{where} velocities", "given without positions; give both.")
    if "positions" in out and "velocities" not in out:
        raise checker.error(f"{where} positions", "given without velocities; give both.")
    if out.get("default") is False:
        raise checker.error(f"{where} default", "expected true (or leave it out and give values).")
    if len(forms) != 1:
        raise checker.error(
            where, "expected exactly one of: values = [...]; positions = [...] with velocities = [...]; "
                   f"preset = \"...\" (valid presets: {', '.join(by_name) or 'none'}); default = true. "
                   f"Got keys: {', '.join(table) or '(none)'}.")
    return out


def parse_run(checker: Checker, table: dict, *, need_length: bool) -> RunSettings:
    run_table = checker.section(table, "[run]", _RUN_KEYS, required=("dt", "n_steps") if need_length else ("dt",))
    save_every = run_table.get("save_every", 1)
    for key in ("n_steps", "chunk_steps"):
        if key in run_table and run_table[key] % save_every:
            raise checker.error(f"[run] {key}",
                                f"expected a multiple of save_every ({save_every}), got {run_table[key]}.")
    if "chunk_steps" not in run_table:
        run_table["chunk_steps"] = max(save_every, DEFAULT_CHUNK_STEPS // save_every * save_every)
    if "observables" in run_table:
        run_table["observables"] = tuple(dict.fromkeys(run_table["observables"]))
    return RunSettings(**run_table)


def parse_solve(checker: Checker, table: dict, *, need_span: bool) -> SolveSettings:
    where = "[solve]"
    s = checker.section(table, where, _SOLVE_KEYS, required=("t1",) if need_span else ())
    solvers = solver_names()
    if s.get("solver", "tsit5") not in solvers:
        raise checker.error(f"{where} solver", f"unknown solver {s['solver']!r}; valid solvers: {', '.join(solvers)} "
                            f"(stiff problems: implicit_euler, kvaerno3/4/5).{did_you_mean(s['solver'], solvers)}")
    t0 = s.get("t0", 0.0)
    if "t1" in s and s["t1"] <= t0:
        raise checker.error(f"{where} t1", f"expected a time after t0 ({t0:g}), got {s['t1']!r}.")
    if "save_at" in s:
        clash = [k for k in ("n_save", "spacing", "save_from") if k in s]
        if clash:
            raise checker.error(f"{where} save_at", f"give either save_at = [...] or n_save/spacing/save_from, "
                                f"not both (also given: {', '.join(clash)}).")
        if "t1" in s and not (t0 <= s["save_at"][0] and s["save_at"][-1] <= s["t1"]):
            raise checker.error(f"{where} save_at", f"expected times within [t0, t1] = [{t0:g}, {s['t1']:g}], got "
                                f"{s['save_at'][0]:g} ... {s['save_at'][-1]:g}.")
    start = s.get("save_from", t0)
    if "save_from" in s and not (t0 <= start < s.get("t1", math.inf)):
        raise checker.error(f"{where} save_from", f"expected a time in [t0, t1), got {start!r}.")
    if s.get("spacing") == "log" and start <= 0:
        raise checker.error(f"{where} spacing", f"log-spaced save times need a positive first time; set save_from "
                            f"(e.g. save_from = 1e-6), got {start!r}.")
    if "observables" in s:
        s["observables"] = tuple(dict.fromkeys(s["observables"]))
    return SolveSettings(**s)
