"""The `[sweep]` table of a scenario file, validated: `SweepSettings` and `parse_settings`
(called by `sciax.app.scenario` for a file with a `[sweep]` table; `sweep_job` runs it).


```toml
[sweep]
axes = { rho = { start = 1.0, stop = 180.0 } }  # axis name -> values (forms below)
n = 200                       # points of every range/sample axis that gives no n of its own
mode = "grid"                 # "grid" (every combination, last axis fastest) or "zip"
output = "maxima"             # what each member keeps: "final_state", "trajectory", "maxima"
component = "z"               # state component (name or index) for "maxima" and the plot
transient = 50.0              # "maxima" (and the bifurcation plot): only after t0 + transient
max_peaks = 512               # "maxima": the first max_peaks local maxima, NaN-padded
reduce = ["mean", "std"]      # reductions over members: mean std var min max sum count median
quantiles = [0.05, 0.5, 0.95] # exact quantiles over members (result "quantiles")
reduce_over = ["seed"]        # grid: the axes reduced over (default all); the others are kept
batch_size = 64               # members per chunk: the unit of progress, checkpoints and --resume
memory_budget = 2_000_000_000 # bytes of device memory a chunk may use (default: sciax.sweep's)
devices = 1                   # local devices to shard each chunk over (default all)
plot = "auto"                 # or "bifurcation", "heatmap", "band", "line", "none";
                              # or { kind = "heatmap", periodic = true } (angles: wrapped, cyclic map)
```

Axis names are those of `sciax.sweep`: a system field (`rho`, `masses[0]`), an initial-state
component (`"state0[1]"`) or `seed` (member key `fold_in(key, seed)`, key from `[run] seed`).
Axis values: an array (`[0.1, 0.2]`; for `seed`, integers), a range `{ start, stop, n,
spacing = "linear" | "log" }`, a seed count `{ n = 64 }` (seeds 0 .. n-1), or random samples
`{ distribution = "lognormal", median, sigma, n, seed }` (also `"normal"` with `mean`, `std`;
`"uniform"` with `low`, `high`), drawn with NumPy's generator from `seed` and the axis name,
so a scenario always gives the same samples.
"""

import dataclasses
import math
import zlib

import numpy as np

from .schema import (
    Expected,
    choice,
    did_you_mean,
    finite_number,
    got,
    is_number,
    numeric_array,
    positive_int,
    string_list,
    table,
)

KIND = "sweep"
OUTPUTS = ("final_state", "trajectory", "maxima")
REDUCTIONS = ("mean", "std", "var", "min", "max", "sum", "count", "median")
PLOTS = ("auto", "bifurcation", "heatmap", "band", "line", "none")
DISTRIBUTIONS = {"lognormal": ("median", "sigma"), "normal": ("mean", "std"), "uniform": ("low", "high")}
DEFAULT_BATCH = 64



def _nonnegative_number(value):
    if not is_number(value) or not math.isfinite(value) or value < 0:
        raise Expected("a non-negative finite number")
    return float(value)


def _component(value):
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    raise Expected('a state component: its name (e.g. "z") or index (0, 1, ...)')


def _names(value):
    return [value] if isinstance(value, str) else string_list(value)


def _quantiles(value):
    if not isinstance(value, list) or not value or not all(is_number(q) and 0 <= q <= 1 for q in value):
        raise Expected("a non-empty array of numbers in [0, 1], e.g. [0.05, 0.5, 0.95]")
    return tuple(float(q) for q in value)


def _plot(value):
    if isinstance(value, str):
        value = {"kind": value}
    if not isinstance(value, dict) or set(value) - {"kind", "periodic"} or value.get("kind", "auto") not in PLOTS \
            or not isinstance(value.get("periodic", False), bool):
        raise Expected(f"one of {', '.join(map(repr, PLOTS))}, or a table {{ kind = \"heatmap\", periodic = true }}")
    return {"kind": value.get("kind", "auto"), "periodic": value.get("periodic", False)}


_KEYS = {"axes": table, "n": positive_int, "mode": choice("grid", "zip"), "output": choice(*OUTPUTS),
         "component": _component, "transient": _nonnegative_number, "max_peaks": positive_int, "reduce": _names,
         "quantiles": _quantiles, "reduce_over": string_list, "batch_size": positive_int,
         "memory_budget": positive_int, "devices": positive_int, "plot": _plot}


@dataclasses.dataclass(frozen=True, eq=False)
class SweepSettings:
    """The `[sweep]` table, validated; `axes` maps each name to its coordinates (NumPy, first
    dimension = the axis), `specs` to the axis as written (with `n` filled in)."""

    axes: dict
    specs: dict
    mode: str = "grid"
    output: str = "final_state"
    component: int = 0
    component_name: str = "y[0]"
    transient: float = 0.0
    max_peaks: int = 512
    reduce: tuple = ()
    quantiles: tuple = ()
    reduce_over: tuple | None = None
    batch_size: int = DEFAULT_BATCH
    memory_budget: int | None = None
    devices: int | None = None
    plot: dict = dataclasses.field(default_factory=lambda: {"kind": "auto", "periodic": False})
    KIND = KIND

    @property
    def shape(self) -> tuple:
        lengths = tuple(len(c) for c in self.axes.values())
        return lengths if self.mode == "grid" else lengths[:1]

    @property
    def n_members(self) -> int:
        return math.prod(self.shape)

    @property
    def dims(self) -> tuple:
        return tuple(self.axes) if self.mode == "grid" else ("member",)

    def physics(self) -> dict:
        """What determines the members' outputs and the reductions (chunking, devices, the
        memory budget and the plot do not)."""
        out = {"axes": self.specs, "mode": self.mode, "output": self.output, "reduce": list(self.reduce),
               "quantiles": list(self.quantiles), "reduce_over": None if self.reduce_over is None
               else list(self.reduce_over)}
        if self.output == "maxima":
            out.update(component=self.component, transient=self.transient, max_peaks=self.max_peaks)
        return out


# --------------------------------------------------------------------------- parsing


def parse_settings(checker, table_: dict, scenario) -> SweepSettings:
    """Validate the `[sweep]` table of `scenario` (see the module docstring).

    **Raises:** `ScenarioError` naming the file, the key, what was expected and what was found.
    """
    s = checker.section(table_, "[sweep]", _KEYS, required=("axes",))
    system_cls = scenario.system_class()
    if not s["axes"]:
        raise checker.error("[sweep] axes", "expected at least one axis, e.g. axes = { rho = [10.0, 28.0] }.")
    valid = _valid_axis_names(system_cls, scenario)
    axes, specs = {}, {}
    for name, raw in s["axes"].items():
        where = f"[sweep] axes.{name}"
        if name not in valid and not _is_indexed_field(name, valid):
            raise checker.error(where, f"unknown axis {name!r}; valid names: {', '.join(valid)}."
                                f"{did_you_mean(name, valid)}")
        axes[name], specs[name] = _axis_values(checker, where, name, raw, s.get("n"))
    mode = s.get("mode", "grid")
    lengths = {k: len(v) for k, v in axes.items()}
    if mode == "zip" and len(set(lengths.values())) > 1:
        raise checker.error("[sweep] axes", f"in zip mode every axis must have the same length, got lengths "
                            f"{lengths}; use mode = \"grid\" for every combination.")
    if "seed" in axes and not _stochastic(scenario):
        raise checker.error("[sweep] axes.seed", "a seed axis needs a stochastic integrator (e.g. EulerMaruyama); "
                            f"{scenario.integrator_name or 'a [solve]'} is deterministic, so every seed would give "
                            "the same member.")
    output = s.get("output", "final_state")
    index, label = _component_index(checker, system_cls, s.get("component", 0))
    if output == "maxima" and scenario.run is not None and scenario.run.n_steps is not None \
            and s.get("transient", 0.0) >= scenario.run.dt * scenario.run.n_steps:
        raise checker.error("[sweep] transient", f"expected a time shorter than the run "
                            f"({scenario.run.dt * scenario.run.n_steps:g}), got {s['transient']!r}.")
    reduce = tuple(dict.fromkeys(s.get("reduce", [])))
    for r in reduce:
        if r not in REDUCTIONS:
            raise checker.error("[sweep] reduce", f"unknown reduction {r!r}; valid names: {', '.join(REDUCTIONS)} "
                                "(quantiles: quantiles = [0.05, 0.95]).{did_you_mean(r, REDUCTIONS)}")
    reduce_over = s.get("reduce_over")
    if reduce_over is not None:
        if not (reduce or "quantiles" in s):
            raise checker.error("[sweep] reduce_over", "given without reduce or quantiles; add e.g. "
                                "reduce = [\"mean\"].")
        for a in reduce_over:
            if a not in axes:
                raise checker.error("[sweep] reduce_over", f"{a!r} is not an axis; axes: {', '.join(axes)}.")
        if mode == "zip" and set(reduce_over) != set(axes):
            raise checker.error("[sweep] reduce_over", "in zip mode the axes form one member dimension and "
                                f"reductions run over all of it; leave reduce_over out, got {reduce_over}.")
        if not reduce_over:
            raise checker.error("[sweep] reduce_over", "expected at least one axis name, got [].")
        reduce_over = tuple(a for a in axes if a in reduce_over)
    settings = SweepSettings(axes=axes, specs=specs, mode=mode, output=output, component=index, component_name=label,
                             transient=s.get("transient", 0.0), max_peaks=s.get("max_peaks", 512), reduce=reduce,
                             quantiles=s.get("quantiles", ()), reduce_over=reduce_over,
                             batch_size=s.get("batch_size", DEFAULT_BATCH), memory_budget=s.get("memory_budget"),
                             devices=s.get("devices"), plot=s.get("plot", {"kind": "auto", "periodic": False}))
    if settings.n_members > 2**30:
        raise checker.error("[sweep] axes", f"{settings.n_members} members (lengths {lengths}) exceed the 2**30 "
                            "one sweep can index; split the sweep along an axis.")
    return settings


def _stochastic(scenario) -> bool:
    return scenario.integrator_name is not None and getattr(scenario.integrator_class(), "stochastic", False)


def _valid_axis_names(system_cls, scenario) -> list[str]:
    fields = [f.name for f in dataclasses.fields(system_cls) if not f.metadata.get("static", False)] \
        if dataclasses.is_dataclass(system_cls) else []
    values = scenario.initial_state.get("values")
    n = len(values) if isinstance(values, list) else getattr(system_cls, "n_components", None)
    state = [f"state0[{i}]" for i in range(n)] if isinstance(n, int) and n <= 16 else ["state0[i]"]
    return [*fields, *state, "seed"]


def _is_indexed_field(name: str, valid: list[str]) -> bool:
    """`masses[0]`, `spring.k`, `state0[12]`: a path below a valid root (sciax.sweep checks the rest)."""
    root = name.split("[")[0].split(".")[0]
    return root != name and (root in valid or (root == "state0" and name[len(root):].startswith("[")))


def _axis_values(checker, where: str, name: str, raw, default_n):
    """(coordinates, the spec as recorded) of one axis."""
    def need_n(spec):
        n = spec.get("n", default_n)
        if n is None:
            raise checker.error(where, "missing n: give n here or [sweep] n (the points of every range axis).")
        return checker.value(f"{where}.n", n, positive_int)

    if isinstance(raw, list):
        if not raw:
            raise checker.error(where, "expected at least one value, got an axis of zero length ([]).")
        checker.value(where, raw, numeric_array)
        values = np.asarray(raw)
        if name == "seed":
            _check_seeds(checker, where, raw)
        return values.astype(np.int64 if name == "seed" else np.float64), raw
    if not isinstance(raw, dict):
        raise checker.error(where, f"expected an array of values, {{ start, stop, n }}, or {{ distribution = ..., n }}"
                            f"{' or { n = 64 }' if name == 'seed' else ''}; got {got(raw)}.")
    if "distribution" in raw:
        kind = raw["distribution"]
        if kind not in DISTRIBUTIONS:
            raise checker.error(f"{where}.distribution", f"expected one of {', '.join(map(repr, DISTRIBUTIONS))}, "
                                f"got {got(kind)}.")
        a, b = DISTRIBUTIONS[kind]
        keys = {"distribution", "n", "seed", a, b}
        spec = checker.section(raw, where, dict.fromkeys(keys, lambda v: v), required=(a, b))
        pa, pb = (checker.value(f"{where}.{k}", spec[k], finite_number) for k in (a, b))
        if (kind == "lognormal" and (pa <= 0 or pb < 0)) or (kind == "normal" and pb < 0) or \
                (kind == "uniform" and pb <= pa):
            need = {"lognormal": "median > 0 and sigma >= 0", "normal": "std >= 0", "uniform": "low < high"}[kind]
            raise checker.error(where, f"expected {need}, got {a} = {pa!r}, {b} = {pb!r}.")
        seed = checker.value(f"{where}.seed", spec.get("seed", 0), _seed)
        n = need_n(spec)
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])  # axes with one seed draw apart
        values = {"lognormal": lambda: pa * np.exp(pb * rng.standard_normal(n)),
                  "normal": lambda: pa + pb * rng.standard_normal(n), "uniform": lambda: rng.uniform(pa, pb, n)}[kind]()
        if name == "seed":
            raise checker.error(where, "a seed axis takes integers: an array or { n = 64 }, not random samples.")
        return values, {**spec, "n": n, "seed": seed}
    if name == "seed":
        spec = checker.section(raw, where, {"n": positive_int}, required=("n",))
        return np.arange(spec["n"], dtype=np.int64), spec
    spec = checker.section(raw, where, {"start": finite_number, "stop": finite_number, "n": positive_int,
                                        "spacing": choice("linear", "log")}, required=("start", "stop"))
    n = need_n(spec)
    if spec.get("spacing") == "log":
        if spec["start"] <= 0 or spec["stop"] <= 0:
            raise checker.error(f"{where}.spacing", f"a log-spaced axis needs start and stop > 0, got "
                                f"{spec['start']!r} and {spec['stop']!r}.")
        return np.geomspace(spec["start"], spec["stop"], n), {**spec, "n": n}
    return np.linspace(spec["start"], spec["stop"], n), {**spec, "n": n}


def _seed(value):
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**32:
        raise Expected("an integer in [0, 2**32)")
    return value


def _check_seeds(checker, where, raw):
    for v in raw:
        checker.value(where, v, _seed)


def _component_index(checker, system_cls, value) -> tuple[int, str]:
    names = getattr(system_cls, "component_names", None) or ()
    n = getattr(system_cls, "n_components", None)
    if isinstance(value, str):
        if value not in names:
            raise checker.error("[sweep] component", f"unknown component {value!r} of {system_cls.__name__}; valid: "
                                f"{', '.join(names) or 'an index 0, 1, ... (it names no components)'}."
                                f"{did_you_mean(value, names)}")
        return names.index(value), value
    if isinstance(n, int) and value >= n:
        raise checker.error("[sweep] component", f"expected an index below {n} ({system_cls.__name__} has {n} "
                            f"components), got {value}.")
    return value, names[value] if value < len(names) else f"y[{value}]"


def member_coords(job: SweepSettings, index: np.ndarray) -> dict:
    """The coordinates of flat members `index` on every axis."""
    if job.mode == "zip":
        return {k: v[index] for k, v in job.axes.items()}
    positions = np.unravel_index(index, job.shape)
    return {k: v[p] for (k, v), p in zip(job.axes.items(), positions)}


def coords_of(job: SweepSettings, i: int) -> dict:
    return {k: np.asarray(v[0]).tolist() for k, v in member_coords(job, np.array([i])).items()}


def reduced_dims(job: SweepSettings) -> tuple:
    if job.mode == "zip" or job.reduce_over is None:
        return job.dims
    return job.reduce_over
