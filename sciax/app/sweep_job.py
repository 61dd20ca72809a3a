"""The `[sweep]` job: an ensemble sweep (`sciax.sweep`) described in a scenario file, run in
chunks of members with progress, whole-chunk outputs on disk and `--resume`.

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

Member `i` (flat, row-major over the grid; in zip mode the i-th value of every axis) is run in
chunk `i // batch_size`; each chunk is one `sciax.sweep` over its members' coordinates, zipped
(the last chunk padded with copies of its last member, so one compiled program serves every
chunk). A member's bits do not depend on the chunk it runs in (`sciax.sweep`, with
`batch_size` a multiple of 32 on CPU), so a chunked sweep equals one `sciax.sweep` call.
Without a `seed` axis a stochastic member gets `fold_in(key, i)`, as in one call.

Files in the output folder (default `runs/<name>/`):

- `members.npz`: `axis.<name>` (coordinates), `dims`, `ok` and every output leaf
  (`final_state`, `states`, `observables.<name>`, `maxima`) shaped `(*dims, ...)`; `times`
  for trajectories. `members.csv`: one row per member: index, coordinates, ok, and the output
  flattened when it has at most 64 values.
- `reductions.npz` / `reductions.csv` (with `reduce`/`quantiles`): `<reduction>.<leaf>` shaped
  `(kept dims..., [quantile], ...)`; the CSV has a row per kept coordinate (and time).
  Reductions are computed once, at the end, from every stored member output (failed members
  left out), so a resumed sweep gives the same bytes as an uninterrupted one.
- `plot.png`, `summary.json` (status, members, failures with coordinates, wall time,
  members/s, precision, backend, files), `scenario.toml` (the marked copy).
- `chunks/members_<first>.npz` (each written atomically once its chunk is done) and
  `checkpoint.npz` (atomic; the finished chunks with their size and CRC-32). A killed sweep
  resumes after its last finished chunk; a resume with a changed scenario is refused.
"""

import dataclasses
import io
import json
import math
import sys
import time
import zlib
from pathlib import Path

import numpy as np

from .. import io as sio
from .._version import __version__
from .folder import (
    FolderLock,
    Progress,
    ResumeError,
    RunResult,
    copied_by_sciax,
    diff,
    json_safe,
    write_scenario_copy,
)
from .schema import (
    Expected,
    ScenarioError,
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
CHECKPOINT_FORMAT = "sciax-sweep-checkpoint-1"
MAX_CSV_VALUES = 64
MAX_LISTED_FAILURES = 100
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


# --------------------------------------------------------------------------- one member's output


@dataclasses.dataclass(frozen=True)
class MemberOutput:
    """`output(traj)` of one member (a hashable value: equal settings reuse the compiled chunk).

    `"final_state"`: the last saved state; `"trajectory"`: times, states and observables of every
    saved frame; `"maxima"`: the first `count` local maxima of state component `component` at
    times after `after`, NaN-padded (computed in the compiled rollout)."""

    kind: str
    component: int = 0
    after: float = 0.0
    count: int = 512

    def __call__(self, traj):
        import jax.numpy as jnp

        if self.kind == "final_state":
            return {"final_state": traj.final_state}
        if self.kind == "trajectory":
            return {"times": traj.times, "states": traj.states, "observables": traj.observables}
        z = traj.states[:, self.component]
        inner = z[1:-1]
        peak = (inner > z[:-2]) & (inner >= z[2:]) & (traj.times[1:-1] > self.after)
        first = jnp.argsort(~peak, stable=True)[:self.count]  # the peaks first, in time order
        values = jnp.where(peak[first], inner[first], jnp.nan)
        return {"maxima": jnp.pad(values, (0, max(0, self.count - values.shape[0])), constant_values=jnp.nan)}


def _flat(outputs: dict) -> dict:
    """A member-output dict as flat named arrays: `final_state`, `states`, `states.positions`,
    `observables.<name>`, `maxima`, `times`."""
    import jax.tree_util as jtu

    out = {}
    for key, tree in outputs.items():
        if key == "observables":
            out.update({f"observables.{k}": np.asarray(v) for k, v in tree.items()})
        elif tree is not None:
            out.update({key + jtu.keystr(p): np.asarray(x) for p, x in jtu.tree_flatten_with_path(tree)[0]})
    return out


# --------------------------------------------------------------------------- the run


def run(scenario, out_dir=None, *, resume: bool = False, progress: bool = True, stream=None,
        max_chunks: int | None = None) -> RunResult:
    """Run the sweep `scenario` (a `Scenario` whose `kind` is `"sweep"`) chunk by chunk into
    `out_dir` (default `[output] dir`).

    - `resume`: continue after the last finished chunk of `out_dir/checkpoint.npz` (refused,
      `ResumeError`, when the scenario's physics or `batch_size` changed); without a checkpoint
      the sweep starts fresh.
    - `progress`: members done / total, members/s and ETA on `stream` (default stderr).
    - `max_chunks`: stop after this many chunks in this call (status `"interrupted"`).

    **Returns:** a `RunResult` (`steps_done`: members done).

    **Raises:** `ScenarioError` (bad axes, devices or component, found before anything is
    written), `ResumeError`, `OSError`; `KeyboardInterrupt` after writing an "interrupted"
    summary of the finished chunks.
    """
    stream = sys.stderr if stream is None else stream
    job = scenario.job
    built = scenario.build()
    _check_built(scenario, built)
    root = Path(out_dir) if out_dir is not None else scenario.output_dir
    report = Progress(scenario.name, job.n_members, stream, progress, unit="members")
    with FolderLock(root):
        driver = _Driver(scenario, built, root, report)
        driver.prepare(resume)
        return driver.loop(max_chunks)


def _check_built(scenario, built):
    """What only the built objects show, checked before the output folder is touched."""
    import jax

    from ..ensemble._axes import resolve_axes

    job = scenario.job
    try:
        resolve_axes({k: v[:1] for k, v in job.axes.items()}, built.system, built.state0)
    except (TypeError, ValueError) as e:
        raise ScenarioError(f"{scenario.source}: [sweep] axes: {str(e).removeprefix('sweep: ')}") from None
    n_local = len(jax.local_devices())
    if job.devices is not None and job.devices > n_local:
        raise ScenarioError(f"{scenario.source}: [sweep] devices: expected at most the {n_local} local device(s), "
                            f"got {job.devices}.")
    if (job.output == "maxima" or job.plot["kind"] != "none") and not isinstance(built.state0, jax.Array):
        if job.output == "maxima" or job.plot["kind"] in ("bifurcation", "heatmap", "band", "line"):
            raise ScenarioError(f"{scenario.source}: [sweep] output: \"maxima\" and the sweep plots read one "
                                f"component of an array state; {scenario.system_name}'s state is a "
                                f"{type(built.state0).__name__}. Use output = \"final_state\" and plot = \"none\".")
    if job.output == "maxima" and built.state0.shape[-1] <= job.component:
        raise ScenarioError(f"{scenario.source}: [sweep] component: the state has {built.state0.shape[-1]} "
                            f"components, got index {job.component}.")


class _Driver:
    """prepare (fresh or resume) -> loop over chunks -> finalize."""

    def __init__(self, scenario, built, root: Path, report: Progress):
        self.sc, self.b, self.job, self.root, self.report = scenario, built, scenario.job, root, report
        self.chunks_dir = root / "chunks"
        self.checkpoint = root / "checkpoint.npz"
        self.start_wall = time.monotonic()
        self.compute_s = 0.0
        self.prior_elapsed = 0.0
        self.session_members = 0
        self.resumed_from = None
        rs = scenario.run
        t0 = rs.t0 if rs is not None else scenario.solve.t0
        self.output_fn = MemberOutput(self.job.output, self.job.component, t0 + self.job.transient,
                                      self.job.max_peaks)
        self.check_finite = rs.check_finite if rs is not None else True
        self.add_seed = "seed" not in self.job.axes and built.key is not None  # fold_in(key, i) as in one call

    # -- identity

    def identity(self) -> dict:
        """`Scenario.physics()` plus what it leaves out of a run but a sweep's members depend on."""
        physics = self.sc.physics()
        if self.sc.run is not None:
            physics["run_length"] = {"n_steps": self.sc.run.n_steps}
        return physics

    def files(self) -> dict:
        return {k: self.root / v for k, v in (
            ("scenario", "scenario.toml"), ("members_npz", "members.npz"), ("members_csv", "members.csv"),
            ("reductions_npz", "reductions.npz"), ("reductions_csv", "reductions.csv"), ("plot", "plot.png"),
            ("summary", "summary.json"))}

    def chunk_path(self, first: int) -> Path:
        return self.chunks_dir / f"members_{first:010d}.npz"

    def _stray(self) -> list[Path]:
        found = [p for n in [*self.files().values(), self.checkpoint] for p in self.root.glob(f".{n.name}.*.tmp")]
        if self.chunks_dir.is_dir():
            found += [p for p in self.chunks_dir.iterdir() if p.name.startswith((".members_", "members_"))]
        return found

    # -- setup

    def prepare(self, resume: bool):
        if resume and self.checkpoint.exists():
            return self._resume()
        self._refuse_foreign_files()
        if resume:
            self.report.message(f"{self.sc.name}: no checkpoint in {self.root}; starting from member 0.")
        for p in [self.checkpoint, *self.files().values(), *self._stray()]:
            p.unlink(missing_ok=True)
        write_scenario_copy(self.files()["scenario"], self.sc)
        self.done, self.chunk_names, self.digests = 0, [], {}
        self._write_checkpoint()

    def _refuse_foreign_files(self):
        if copied_by_sciax(self.files()["scenario"]) or self._checkpoint_meta(quiet=True) is not None:
            return
        clashes = [p.name for p in [*self.files().values(), self.checkpoint] if p.exists()]
        if clashes:
            raise ScenarioError(f"the output folder {self.root} holds {', '.join(clashes)}, which a sweep would "
                                "overwrite, and no sciax run wrote them. Choose another folder with --out or "
                                "[output] dir, or move those files away.")

    def _checkpoint_meta(self, quiet=False):
        try:
            meta = sio.checkpoint_meta(self.checkpoint)
            if meta.get("format") != CHECKPOINT_FORMAT:
                raise ValueError(f"{self.checkpoint} is not a {CHECKPOINT_FORMAT} checkpoint (a sweep's).")
            return meta
        except (ValueError, OSError):
            if quiet:
                return None
            raise

    def _resume(self):
        try:
            meta = self._checkpoint_meta()
        except ValueError as e:
            raise ResumeError(f"cannot resume from {self.checkpoint}: {e} Run without --resume to start over.") \
                from None
        changes = diff(meta["physics"], self.identity())
        if changes:
            raise ResumeError(f"refusing to resume: the scenario {self.sc.source} differs from the one the checkpoint "
                              f"in {self.root} was written for ({'; '.join(changes)}). Restore the scenario, or run "
                              "without --resume to start over (this replaces the outputs).")
        if meta["batch_size"] != self.job.batch_size:
            raise ResumeError(f"refusing to resume: [sweep] batch_size is {self.job.batch_size}, the checkpoint in "
                              f"{self.root} was written with {meta['batch_size']} (its chunks would not line up). "
                              "Restore it, or run without --resume to start over.")
        for name in meta["chunk_files"]:
            path = self.chunks_dir / name
            try:
                ok = _digest(path.read_bytes()) == meta["chunk_digests"][name]
            except OSError:
                ok = False
            if not ok:
                raise ResumeError(f"cannot resume: {path} is missing or differs from what the checkpoint records. "
                                  "Run without --resume to start over.")
        for p in self._stray():
            if p.name not in meta["chunk_files"]:
                p.unlink(missing_ok=True)  # a chunk in flight when the sweep stopped, or a temporary file
        self.done, self.chunk_names, self.digests = meta["members_done"], meta["chunk_files"], meta["chunk_digests"]
        self.prior_elapsed, self.resumed_from = meta.get("elapsed_s", 0.0), meta["members_done"]
        if copied_by_sciax(self.files()["scenario"]) is False:
            write_scenario_copy(self.files()["scenario"], self.sc)
        self.report.message(f"{self.sc.name}: resuming after member {self.done} of {self.job.n_members}.")

    def _write_checkpoint(self):
        meta = {"format": CHECKPOINT_FORMAT, "physics": self.identity(), "batch_size": self.job.batch_size,
                "n_members": self.job.n_members, "members_done": self.done, "chunk_files": self.chunk_names,
                "chunk_digests": self.digests, "elapsed_s": self.prior_elapsed + time.monotonic() - self.start_wall,
                "sciax_version": __version__}
        sio.save_checkpoint(self.checkpoint, {}, meta)

    # -- the loop

    def loop(self, max_chunks) -> RunResult:
        n, batch = self.job.n_members, self.job.batch_size
        ran = 0
        try:
            while self.done < n and (max_chunks is None or ran < max_chunks):
                clock = time.monotonic()
                first, stop = self.done, min(self.done + batch, n)
                arrays = self._run_chunk(first, stop)
                data = io.BytesIO()
                np.savez(data, **arrays)
                path = self.chunk_path(first)
                sio.atomic_write_bytes(path, data.getvalue())  # the whole chunk, then the checkpoint
                self.chunk_names = [*self.chunk_names, path.name]
                self.digests = {**self.digests, path.name: _digest(data.getvalue())}
                self.done = stop
                self._write_checkpoint()
                ran += 1
                self.session_members += stop - first
                self.compute_s += time.monotonic() - clock
                self.report.update(self.done, self.session_members, self.compute_s, final=self.done == n)
            return self._finalize("completed" if self.done == n else "interrupted")
        except KeyboardInterrupt:
            self.report.message("")
            self._finalize("interrupted")
            raise

    def _run_chunk(self, first: int, stop: int) -> dict:
        """Members first .. stop-1 by one zipped `sciax.sweep` (padded to `batch_size` with copies of
        the last member): flat arrays `index`, `ok`, the output leaves and (trajectories) `times`."""
        from ..ensemble import sweep

        index = np.arange(first, stop)
        padded = np.concatenate([index, np.full(self.job.batch_size - len(index), stop - 1)])
        axes = _member_coords(self.job, padded)
        if self.add_seed:
            axes["seed"] = padded.astype(np.int64)
        res = sweep(self.b.system, self.b.state0, axes=axes, mode="zip", rollout=self.b.rollout,
                    output=self.output_fn, key=self.b.key, batch_size=self.job.batch_size,
                    memory_budget=self.job.memory_budget, devices=self.job.devices, check_finite=self.check_finite)
        flat = _flat(res.outputs)
        times = flat.pop("times", None)
        arrays = {"index": index, "ok": np.ones(len(index), bool) if res.ok is None else res.ok[:len(index)]}
        arrays.update({f"output.{k}": v[:len(index)] for k, v in flat.items()})
        if times is not None:
            arrays["times"] = times[0]
        return arrays

    # -- outputs

    def _merge(self) -> dict | None:
        parts = [sio.load_npz(self.chunks_dir / name) for name in self.chunk_names]
        if not parts:
            return None
        merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0] if k != "times"}
        if "times" in parts[0]:
            merged["times"] = parts[0]["times"]
        return merged

    def _finalize(self, status: str) -> RunResult:
        f = self.files()
        files = [f["scenario"].name]
        complete = status == "completed"
        merged = self._merge() if complete else None
        plot_error = plot_note = None
        failures = []
        if merged is not None:
            job = self.job
            grid = lambda x: x.reshape(job.shape + x.shape[1:])  # noqa: E731
            outputs = {k[len("output."):]: grid(v) for k, v in merged.items() if k.startswith("output.")}
            ok = grid(merged["ok"])
            times = merged.get("times")
            coords = {f"axis.{k}": v for k, v in job.axes.items()}
            sio.save_npz(f["members_npz"], {"dims": np.array(job.dims), **coords, "ok": ok, **outputs,
                                            **({} if times is None else {"times": times})})
            self._members_csv(f["members_csv"], merged)
            files += [f["members_npz"].name, f["members_csv"].name]
            failures = [{"index": int(i), **_coords_of(job, int(i))} for i in np.flatnonzero(~merged["ok"])]
            reductions = _reductions(job, outputs, ok, self.check_finite)
            if reductions:
                kept = [a for a in job.dims if a not in _reduced_dims(job)]
                sio.save_npz(f["reductions_npz"], {"kept_dims": np.array(kept, dtype=str),
                                                   **{f"axis.{a}": job.axes[a] for a in kept},
                                                   **reductions, **({} if times is None else {"times": times})})
                self._reductions_csv(f["reductions_csv"], reductions, kept, times)
                files += [f["reductions_npz"].name, f["reductions_csv"].name]
            if self.sc.output.plot:
                try:
                    plot_note = _plot(self.sc, self.b, outputs, ok, reductions, times, f["plot"])
                    if plot_note is None:
                        files.append(f["plot"].name)
                except Exception as e:  # a picture must not cost the other outputs
                    f["plot"].unlink(missing_ok=True)
                    plot_error = f"{type(e).__name__}: {e}"
                    self.report.message(f"{self.sc.name}: warning: the plot failed ({plot_error}).")
        files += [f["summary"].name, self.checkpoint.name, self.chunks_dir.name + "/"]
        summary = self._summary(status, failures, files, plot_error, plot_note)
        with sio.atomic_write(f["summary"], "w") as fh:
            json.dump(json_safe(summary), fh, indent=2, allow_nan=False)
            fh.write("\n")
        return RunResult(out_dir=self.root, status=status, steps_done=self.done, summary=summary)

    def _digits(self) -> int:
        return 17 if self.sc.precision == "float64" else 9

    def _members_csv(self, path, merged):
        job = self.job
        index = merged["index"]
        cols, blocks = ["index"], [index[:, None]]
        for name, c in job.axes.items():
            values = c[np.unravel_index(index, job.shape)[list(job.axes).index(name)]] if job.mode == "grid" \
                else c[index]
            cols += _labels(name, values.shape[1:])
            blocks.append(values.reshape(len(index), -1))
        cols.append("ok")
        blocks.append(merged["ok"][:, None])
        out = {k[len("output."):]: v for k, v in merged.items() if k.startswith("output.")}
        if sum(int(np.prod(v.shape[1:])) for v in out.values()) <= MAX_CSV_VALUES:
            for k, v in out.items():
                cols += self._labels(k, v.shape[1:])
                blocks.append(v.reshape(len(index), -1))
        _write_csv(path, cols, np.concatenate([b.astype(np.float64) for b in blocks], axis=1), self._digits())

    def _labels(self, name: str, shape) -> list[str]:
        """Column names of a leaf of `shape`: `final_state.theta1` where the state's components have
        names, else `name[i]...`."""
        names = getattr(self.b.system, "component_names", None)
        if names and name.endswith(("final_state", "states")) and tuple(shape) == (len(names),):
            return [f"{name}.{c}" for c in names]
        return _labels(name, shape)

    def _reductions_csv(self, path, reductions, kept, times):
        """One row per kept coordinate (and per saved time for trajectories): the kept axes' coordinates,
        `time`, then `<reduction>.<leaf>` columns (quantiles as `q0.05.<leaf>`)."""
        job = self.job
        kept_shape = tuple(len(job.axes[a]) for a in kept)
        n_kept = math.prod(kept_shape)
        n_t = 1 if times is None else len(times)
        cols, blocks = [], []
        mesh = np.unravel_index(np.arange(n_kept), kept_shape) if kept else ()
        for a, pos in zip(kept, mesh):
            cols += _labels(a, job.axes[a].shape[1:])
            blocks.append(np.repeat(job.axes[a][pos].reshape(n_kept, -1), n_t, axis=0))
        if times is not None:
            cols.append("time")
            blocks.append(np.tile(times, n_kept)[:, None])
        for key, v in reductions.items():
            name, leaf = key.split(".", 1)
            v = v.reshape((n_kept,) + v.shape[len(kept):])
            series = [(f"q{q:g}.{leaf}" if name == "quantiles" else key, v[:, i] if name == "quantiles" else v)
                      for i, q in enumerate(job.quantiles if name == "quantiles" else [None])]
            for label, x in series:
                cols += self._labels(label, x.shape[2 if times is not None else 1:])
                blocks.append(x.reshape(n_kept * n_t, -1))
        if sum(b.shape[1] for b in blocks) > 4096:
            return  # too wide to read as a table: reductions.npz holds it
        _write_csv(path, cols, np.concatenate([b.astype(np.float64) for b in blocks], axis=1), self._digits())

    def _summary(self, status, failures, files, plot_error, plot_note) -> dict:
        import jax

        wall = time.monotonic() - self.start_wall
        job = self.job
        return {
            "scenario": self.sc.name, "source": self.sc.source, "description": self.sc.description, "job": KIND,
            "status": status, "system": self.sc.system_name, "precision": self.sc.precision,
            "axes": {k: len(v) for k, v in job.axes.items()}, "mode": job.mode, "output": job.output,
            "members": job.n_members, "members_done": self.done, "batch_size": job.batch_size,
            "chunks_done": len(self.chunk_names), "resumed_from_member": self.resumed_from,
            "failed_members": len(failures), "failures": failures[:MAX_LISTED_FAILURES],
            "wall_time_s": wall, "total_wall_time_s": self.prior_elapsed + wall, "compute_time_s": self.compute_s,
            "members_per_second": self.session_members / self.compute_s if self.compute_s > 0 else None,
            "overrides": self.sc.overrides, "plot_error": plot_error, "plot_note": plot_note,
            "backend": jax.default_backend(), "devices": [str(d) for d in jax.local_devices()[:job.devices]],
            "x64_enabled": bool(jax.config.jax_enable_x64), "versions": {"sciax": __version__, "jax": jax.__version__},
            "scenario_hash": self.sc.hash(), "files": files,
        }


def report(scenario, result: RunResult) -> list[str]:
    """A short human summary of the sweep `scenario`'s `RunResult` (the lines `sciax run` prints
    before the list of output files)."""
    s = result.summary
    rate = f", {s['members_per_second']:.3g} members/s" if s.get("members_per_second") else ""
    shape = " x ".join(f"{k}: {n}" for k, n in s["axes"].items()) if s["mode"] == "grid" else \
        f"zipped {', '.join(s['axes'])}"
    lines = [f"{s['scenario']}: {result.status}, {s['members_done']}/{s['members']} members ({shape}), "
             f"{s['wall_time_s']:.2f} s{rate} ({s['precision']}, {s['backend']})"]
    if s.get("resumed_from_member") is not None:
        lines.append(f"  resumed after member {s['resumed_from_member']}")
    if s["failed_members"]:
        first = {k: v for k, v in s["failures"][0].items() if k != "index"}
        lines.append(f"  failed members (NaN/Inf or solver failure): {s['failed_members']}, first at {first}; "
                     "listed in summary.json, left out of the reductions")
    if s.get("plot_note"):
        lines.append(f"  no plot: {s['plot_note']}")
    return lines


# --------------------------------------------------------------------------- helpers


def _digest(data: bytes) -> str:
    return f"{len(data)}:{zlib.crc32(data):08x}"


def _labels(name: str, shape) -> list[str]:
    return [name] if not shape else [name + "".join(f"[{i}]" for i in idx) for idx in np.ndindex(*shape)]


def _write_csv(path, columns, rows, digits):
    """`path` written atomically: a header, then `rows` (the text of `sciax.io.append_csv_rows`)."""
    tmp = path.with_name(f".{path.name}.rows.tmp")
    try:
        sio.write_csv_header(tmp, columns)
        sio.append_csv_rows(tmp, rows, digits=digits)
        sio.atomic_write_bytes(path, tmp.read_bytes())
    finally:
        tmp.unlink(missing_ok=True)


def _member_coords(job: SweepSettings, index: np.ndarray) -> dict:
    """The coordinates of flat members `index` on every axis."""
    if job.mode == "zip":
        return {k: v[index] for k, v in job.axes.items()}
    positions = np.unravel_index(index, job.shape)
    return {k: v[p] for (k, v), p in zip(job.axes.items(), positions)}


def _coords_of(job: SweepSettings, i: int) -> dict:
    return {k: np.asarray(v[0]).tolist() for k, v in _member_coords(job, np.array([i])).items()}


def _reduced_dims(job: SweepSettings) -> tuple:
    if job.mode == "zip" or job.reduce_over is None:
        return job.dims
    return job.reduce_over


def _reductions(job: SweepSettings, outputs: dict, ok: np.ndarray, check_finite: bool) -> dict:
    """`<name>.<leaf>` -> reduced array `(kept dims..., ...)`, by the `sciax.ensemble` reductions
    over every member at once (failed members left out; NaN-padded maxima: see `Mean`)."""
    import jax.numpy as jnp

    from ..ensemble import Count, Max, Mean, Median, Min, Quantile, Std, Sum, Variance

    named = {"mean": Mean(), "std": Std(), "var": Variance(), "min": Min(), "max": Max(), "sum": Sum(),
             "count": Count(), "median": Median()}
    chosen = {r: named[r] for r in job.reduce}
    if job.quantiles:
        chosen["quantiles"] = Quantile(list(job.quantiles))
    if not chosen:
        return {}
    reduce_axes = tuple(job.dims.index(d) for d in _reduced_dims(job))
    kept = [i for i in range(ok.ndim) if i not in reduce_axes]
    kept_shape = tuple(ok.shape[i] for i in kept)
    n_kept = math.prod(kept_shape)
    valid = ok if check_finite else np.ones_like(ok)
    order = [*kept, *reduce_axes]
    mask = jnp.asarray(np.transpose(valid, order).reshape(-1))
    groups = jnp.asarray(np.repeat(np.arange(n_kept), valid.size // n_kept))
    out = {}
    for name, red in chosen.items():
        if red.needs_values:
            result = red.from_values(outputs, valid, reduce_axes, True)
            out.update({f"{name}.{k}": np.asarray(v) for k, v in result.items()})
            continue
        for leaf, x in outputs.items():
            x = np.transpose(x, order + list(range(ok.ndim, x.ndim))).reshape((-1,) + x.shape[ok.ndim:])
            x = jnp.asarray(x.astype(np.int64) if x.dtype == bool else x)
            value = red.finalize(red.partial(x, mask, groups, n_kept))
            out[f"{name}.{leaf}"] = np.asarray(value).reshape(kept_shape + np.shape(value)[1:])
    return out


# --------------------------------------------------------------------------- plots


def _plot_kind(job: SweepSettings, reductions: dict) -> str | None:
    kind = job.plot["kind"]
    if kind != "auto":
        return None if kind == "none" else kind
    if job.output == "trajectory" and reductions:
        return "band"
    if job.output in ("maxima", "trajectory") and len(job.axes) == 1:
        return "bifurcation"
    if job.output == "final_state" and job.mode == "grid" and len(job.axes) == 2:
        return "heatmap"
    if job.output == "final_state" and len(job.axes) == 1:
        return "line"
    return None


def _plot(scenario, built, outputs, ok, reductions, times, path) -> str | None:
    """Write `path`; returns None, or why there is no plot for this sweep."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..plot import save_figure

    job = scenario.job
    kind = _plot_kind(job, reductions)
    if kind is None:
        path.unlink(missing_ok=True)
        return f"plot = \"{job.plot['kind']}\" (\"auto\" draws one axis with maxima, trajectories or final states; " \
               "two grid axes with final states; trajectories with reductions)"
    c, label = job.component, job.component_name
    names = list(job.axes)
    components = getattr(built.system, "component_names", None) or ()

    def axis_label(a):
        if a.startswith("state0[") and a[7:-1].isdigit() and int(a[7:-1]) < len(components):
            return f"initial {components[int(a[7:-1])]} ({a})"
        return a
    fig, ax = plt.subplots(figsize=(8, 5))
    title = f"{scenario.name}: {scenario.system_name}, {job.n_members} members"
    if kind == "bifurcation":
        if len(names) != 1:
            raise ValueError(f"a bifurcation plot needs one axis, this sweep has {len(names)} ({', '.join(names)})")
        x = job.axes[names[0]]
        if "maxima" in outputs:
            peaks = outputs["maxima"]
        else:
            z, t = outputs["states"][..., c], times
            after = t[1:-1] > (t[0] + job.transient)
            inner = z[:, 1:-1]
            peaks = np.where((inner > z[:, :-2]) & (inner >= z[:, 2:]) & after, inner, np.nan)
        rows, cols = np.nonzero(np.isfinite(peaks) & ok.reshape(-1, *([1] * (peaks.ndim - 1))))
        ax.plot(x[rows], peaks[rows, cols], ",k", alpha=0.5)
        ax.set(xlabel=axis_label(names[0]), ylabel=f"local maxima of {label}",
               title=f"{title}; maxima after t = {job.transient:g}")
    elif kind == "heatmap":
        if job.mode != "grid" or len(names) != 2 or "final_state" not in outputs:
            raise ValueError("a heat map needs two grid axes and output = \"final_state\"")
        value = np.where(ok, outputs["final_state"][..., c], np.nan)
        cmap = "viridis"
        if job.plot["periodic"]:
            value, cmap = np.angle(np.exp(1j * value)), "twilight"
        a, b = (job.axes[n] for n in names)
        image = ax.pcolormesh(a, b, value.T, shading="nearest", cmap=cmap,
                              **({"vmin": -np.pi, "vmax": np.pi} if job.plot["periodic"] else {}))
        fig.colorbar(image, ax=ax, label=f"final {label}" + (" (wrapped to (-pi, pi])" if job.plot["periodic"] else ""))
        ax.set(xlabel=axis_label(names[0]), ylabel=axis_label(names[1]), title=title)
        ax.set_aspect("equal" if np.ptp(job.axes[names[0]]) == np.ptp(job.axes[names[1]]) else "auto")
    elif kind == "line":
        x = job.axes[names[0]]
        ax.plot(x, np.where(ok, outputs["final_state"][..., c], np.nan), ".-")
        ax.set(xlabel=axis_label(names[0]), ylabel=f"final {label}", title=title)
    else:  # band
        if times is None or not reductions:
            raise ValueError("a band needs output = \"trajectory\" and reduce or quantiles")
        kept = [a for a in job.dims if a not in _reduced_dims(job)]
        groups = [()] if not kept else list(np.ndindex(*(len(job.axes[a]) for a in kept)))[:8]
        for g, color in zip(groups, plt.rcParams["axes.prop_cycle"].by_key()["color"]):
            tag = ", ".join(f"{a} = {job.axes[a][i]:.4g}" for a, i in zip(kept, g))
            pick = lambda key, g=g: reductions[key][g][..., c] if key in reductions else None  # noqa: E731
            q = reductions.get("quantiles.states")
            if q is not None:
                q = q[g][..., c]
                for lo in range(len(job.quantiles) // 2):
                    hi = len(job.quantiles) - 1 - lo
                    ax.fill_between(times, q[lo], q[hi], color=color, alpha=0.15 + 0.15 * lo,
                                    label=f"{job.quantiles[lo]:g} to {job.quantiles[hi]:g} quantiles {tag}".strip())
            centre = pick("median.states")
            if centre is None and q is not None and 0.5 in job.quantiles:
                centre = q[job.quantiles.index(0.5)]
            if centre is not None:
                ax.plot(times, centre, color=color, lw=2, label=f"median {tag}".strip())
            mean, std = pick("mean.states"), pick("std.states")
            if mean is not None:
                ax.plot(times, mean, color=color, lw=1, ls="--", label=f"mean {tag}".strip())
                if std is not None and q is None:
                    ax.fill_between(times, mean - std, mean + std, color=color, alpha=0.25, label="mean +- std")
        over = "members" if job.mode == "zip" else ", ".join(_reduced_dims(job))
        ax.set(xlabel="time", ylabel=label, title=f"{title} (over {over})")
        ax.legend(fontsize="small")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return None
