"""The benchmark harness: suite registry, timing, memory, machine info, and the report writers.

A suite is a module in `benchmarks/suites/` that defines ``SUITE = Suite(name, description,
run)``. ``run(ctx)`` returns a `SuiteResult` (measurements, targets, plots). The harness finds
suites by listing that package, so a new workload (for example molecular dynamics with JAX-MD,
LAMMPS and OpenMM as peers) is one new module there and nothing here changes.

Method (STYLE.md, Benchmarks):

- every implementation is called once as a warm-up; that first call is timed, and the compile
  time is reported apart (measured with ``jit(...).lower().compile()`` for JAX, as the
  first call minus the steady median for PyTorch/`torch.compile`, and as the gcc run for C);
- results are synchronised before the clock stops (``jax.block_until_ready``; PyTorch on
  CPU is synchronous, ``torch.cuda.synchronize`` on GPU);
- several steady repetitions; the median and the spread (min/max) are reported;
- throughput is in the field's unit (trajectory-steps/s, fits/s);
- peak memory is measured where it can be: tracemalloc for NumPy and C (its buffers are NumPy
  arrays), XLA's buffer assignment for JAX (``compiled.memory_analysis()``), and a sampled
  resident-set increase for the rest.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import importlib.metadata
import json
import math
import os
import pkgutil
import platform
import statistics
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# ---------------------------------------------------------------------------------------------
# Data model
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Context:
    """What a suite needs to know about this run.

    - `quick`: the `--quick` mode (whole run under ~2 minutes on one core).
    - `device`: "cpu" or "gpu" (JAX and PyTorch implementations run there; NumPy, SciPy
      and C always run on the CPU and are labelled so).
    - `threads`: the thread count the libraries were pinned to, or None (library defaults).
    - `reps`: steady repetitions per measurement (median and spread are over these).
    - `max_call_s`: an implementation is not run at a size where its predicted time per
      call (from the previous size) exceeds this; the row says so.
    - `budget_s`: steady repetitions stop early (after at least one) once they have taken
      this long; the row's `n=` says how many were made.
    - `out_dir`: the results folder; `scratch(name)` gives a private folder inside it.
    """

    quick: bool
    device: str
    threads: int | None
    reps: int
    max_call_s: float
    out_dir: Path
    budget_s: float = 20.0
    log: Callable[[str], None] = print

    def scratch(self, name: str) -> Path:
        """An absolute path (child processes may run in another working directory)."""
        path = (self.out_dir / "_build" / name).resolve()
        path.mkdir(parents=True, exist_ok=True)
        return path

    def threads_label(self) -> str:
        """How the libraries were threaded, for titles and notes."""
        return {1: "one core", None: "library default threads"}.get(self.threads, f"{self.threads} threads")

    def unjudged(self) -> str | None:
        """The CPU targets are one-core figures (benchmarks/README.md, "Targets"). None when
        this run is one; otherwise the note its verdicts carry, which are then not judged."""
        if self.threads == 1:
            return None
        return f"not judged: the bars are one-core figures and this run used {self.threads_label()}"

    def jax_device(self):
        import jax

        return jax.devices("gpu" if self.device == "gpu" else "cpu")[0]

    def torch_device(self):
        import torch

        return torch.device("cuda" if self.device == "gpu" else "cpu")


@dataclasses.dataclass
class Measurement:
    """One row: one implementation of one case at one size and precision."""

    suite: str
    case: str
    impl: str
    precision: str
    size: int
    size_name: str
    unit: str
    work: float | None = None  # units of work per call (throughput = work / median time)
    time_median_s: float | None = None
    time_min_s: float | None = None
    time_max_s: float | None = None
    first_call_s: float | None = None
    reps: int = 0
    compile_s: float | None = None
    compile_method: str = ""
    peak_mem_bytes: float | None = None
    mem_method: str = ""
    device: str = "cpu"
    threads: str = ""
    status: str = "ok"  # ok | skipped | failed
    note: str = ""
    reference: bool = False  # the sciax row that ratios in this (case, precision, size) refer to
    bar: str = ""  # a target that applies to this row, e.g. "sciax >= 10x"
    bar_met: bool | None = None
    extra: dict = dataclasses.field(default_factory=dict)

    @property
    def throughput(self) -> float | None:
        if self.status != "ok" or not self.work or not self.time_median_s:
            return None
        return self.work / self.time_median_s

    def apply_timing(self, timing: Timing) -> Measurement:
        self.time_median_s, self.time_min_s, self.time_max_s = timing.median, timing.min, timing.max
        self.first_call_s, self.reps = timing.first, timing.reps
        if self.compile_s is None and self.compile_method == "first-minus-steady":
            self.compile_s = max(timing.first - timing.median, 0.0)
        return self


@dataclasses.dataclass
class Target:
    """A target's bar, and whether this run met it."""

    suite: str
    name: str
    bar: str
    value: float | None
    value_text: str
    met: bool | None  # None: not measured in this run
    note: str = ""


@dataclasses.dataclass
class PlotSpec:
    """A line plot of one metric against `size`, one line per implementation."""

    filename: str
    title: str
    cases: Sequence[str]
    precision: str | None = None
    metric: str = "throughput"  # or any Measurement attribute, e.g. "time_median_s"
    xlabel: str = "size"
    ylabel: str = ""
    logx: bool = True
    logy: bool = True


@dataclasses.dataclass
class SuiteResult:
    measurements: list[Measurement] = dataclasses.field(default_factory=list)
    targets: list[Target] = dataclasses.field(default_factory=list)
    plots: list[PlotSpec] = dataclasses.field(default_factory=list)
    columns: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (extra key, header)
    notes: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Suite:
    """A named workload. `run(ctx)` measures every implementation and returns a `SuiteResult`."""

    name: str
    description: str
    run: Callable[[Context], SuiteResult]
    order: int = 100


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------


def discover_suites() -> dict[str, Suite]:
    """Every `SUITE` defined by a module of `benchmarks.suites`, by name, in run order."""
    from . import suites as suites_pkg

    found = []
    for info in pkgutil.iter_modules(suites_pkg.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{suites_pkg.__name__}.{info.name}")
        suite = getattr(module, "SUITE", None)
        if isinstance(suite, Suite):
            found.append(suite)
    found.sort(key=lambda s: (s.order, s.name))
    return {s.name: s for s in found}


def select_suites(spec: str | None) -> list[Suite]:
    registry = discover_suites()
    if not spec or spec == "all":
        return list(registry.values())
    chosen = []
    for name in (n.strip() for n in spec.split(",")):
        if not name:
            continue
        if name not in registry:
            raise SystemExit(f"unknown suite {name!r}; the suites are: {', '.join(registry)}")
        chosen.append(registry[name])
    return chosen


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Timing:
    first: float
    median: float
    min: float
    max: float
    reps: int
    times: list[float]


def no_sync(x):
    return x


def jax_sync(x):
    import jax

    return jax.block_until_ready(x)


def torch_sync_for(device: str):
    if device == "gpu":
        import torch

        def sync(x):
            torch.cuda.synchronize()
            return x

        return sync
    return no_sync  # PyTorch CPU kernels are synchronous


def time_call(fn: Callable[[], Any], *, sync: Callable[[Any], Any] = no_sync, reps: int = 3,
              max_total_s: float = 20.0, warmup: bool = True) -> Timing:
    """Time `fn()`: one warm-up call (timed as `first`), then up to `reps` steady calls.

    Stops early (after at least one steady call) once the steady calls have taken
    `max_total_s`, so a slow implementation does not blow the run's budget; `reps` records how
    many were made. With `warmup=False` the first call counts as a steady call as well.
    """
    t0 = time.perf_counter()
    sync(fn())
    first = time.perf_counter() - t0
    times = [] if warmup else [first]
    spent = 0.0
    while len(times) < reps:
        if times and spent >= max_total_s:
            break
        t0 = time.perf_counter()
        sync(fn())
        dt = time.perf_counter() - t0
        times.append(dt)
        spent += dt
    return Timing(first=first, median=statistics.median(times), min=min(times), max=max(times),
                  reps=len(times), times=times)


@dataclasses.dataclass
class Prepared:
    """An implementation ready to be timed: `call()` runs the workload once.

    - `sync`: applied to `call()`'s result before the clock stops.
    - `compile_s` / `compile_method`: a compile time measured while preparing (e.g.
      ``"lower+compile"``), or None with ``"first-minus-steady"`` to take the first call minus
      the steady median, or ``"none"`` (nothing is compiled).
    - `mem_method`: ``"xla"`` (give `xla_mem`), ``"tracemalloc"``, ``"rss"`` or ``""`` (not
      measured); see `measure`.
    """

    call: Callable[[], Any]
    sync: Callable[[Any], Any] = no_sync
    compile_s: float | None = None
    compile_method: str = "first-minus-steady"
    mem_method: str = ""
    xla_mem: float | None = None


def measure(prepared: Prepared, m: Measurement, ctx: Context, *, memory: bool = True) -> Any:
    """Time `prepared` into `m` (warm-up, steady repetitions, compile, memory); return the
    result of the last call (for agreement checks).

    Memory is taken during the warm-up call, where every buffer is allocated afresh:
    ``"tracemalloc"`` (NumPy and the C wrapper's arrays; its cost on large-array code is
    negligible) or ``"rss"`` (the resident-set increase, sampled every 2 ms, for PyTorch,
    whose allocations tracemalloc does not see). ``"xla"`` is XLA's buffer assignment, known
    from the compiled program without running it.
    """
    last = [None]

    def call():
        last[0] = prepared.call()
        return last[0]

    method = prepared.mem_method if memory else ""
    if method in ("tracemalloc", "rss"):
        peak = [None]

        def warm_call():
            if method == "tracemalloc":
                peak[0] = tracemalloc_peak(lambda: prepared.sync(call()))
            else:
                peak[0] = rss_peak_increase(call, prepared.sync)

        t0 = time.perf_counter()
        warm_call()
        first = time.perf_counter() - t0
        timing = time_call(call, sync=prepared.sync, reps=ctx.reps, max_total_s=ctx.budget_s,
                           warmup=False)
        timing.first = first
        m.peak_mem_bytes, m.mem_method = peak[0], method
    else:
        timing = time_call(call, sync=prepared.sync, reps=ctx.reps, max_total_s=ctx.budget_s)
        if method == "xla":
            m.peak_mem_bytes, m.mem_method = prepared.xla_mem, "xla"
    m.compile_s, m.compile_method = prepared.compile_s, prepared.compile_method
    if prepared.compile_method == "none":
        m.compile_s = None
    m.apply_timing(timing)
    m.device = m.device or ctx.device
    m.threads = str(ctx.threads) if ctx.threads else "default (multi-thread)"
    return last[0]


class CostCap:
    """Skip sizes whose predicted time per call exceeds the run's cap (linear in size)."""

    def __init__(self, max_call_s: float, quick: bool = False):
        self.max_call_s = max_call_s
        self.quick = quick
        self._last: dict[str, tuple[int, float]] = {}

    def skip_reason(self, key: str, size: int) -> str | None:
        if key not in self._last:
            return None
        last_size, last_time = self._last[key]
        predicted = last_time * size / last_size
        if predicted > self.max_call_s:
            return (f"not run: predicted {predicted:.1f} s per call (> {self.max_call_s:g} s, "
                    f"{'--quick mode' if self.quick else '--max-call-s'})")
        return None

    def record(self, key: str, size: int, seconds: float | None) -> None:
        if seconds:
            self._last[key] = (size, seconds)


# ---------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------


def tracemalloc_peak(fn: Callable[[], Any]) -> float:
    """Peak bytes allocated through Python's allocators (NumPy arrays included) during `fn()`."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return float(peak - base)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rss_peak_increase(fn: Callable[[], Any], sync: Callable[[Any], Any] = no_sync,
                      interval_s: float = 0.002) -> float | None:
    """Largest increase of this process's resident set during `fn()`, sampled every 2 ms.

    Approximate (allocator caches can hide reuse, short spikes can be missed); used where
    neither tracemalloc nor XLA's buffer assignment sees the allocations (PyTorch, C).
    """
    if not os.path.exists("/proc/self/statm"):
        return None
    base = _rss_bytes()
    peak = [base]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _rss_bytes())
            stop.wait(interval_s)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        sync(fn())
    finally:
        stop.set()
        thread.join()
    peak[0] = max(peak[0], _rss_bytes())
    return float(peak[0] - base)


def xla_memory_bytes(compiled) -> float | None:
    """Bytes of XLA's buffer assignment for one call: arguments + outputs + temporaries."""
    try:
        m = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend implements it
        return None
    if m is None:
        return None
    total = (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
             - getattr(m, "alias_size_in_bytes", 0))
    return float(total)


def jax_compile(jitted, *args):
    """`jitted.lower(*args).compile()`, timed: returns (compiled, seconds)."""
    t0 = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    return compiled, time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------
# Machine information
# ---------------------------------------------------------------------------------------------

_PACKAGES = ["numpy", "scipy", "jax", "jaxlib", "equinox", "diffrax", "optimistix", "torch",
             "torchdiffeq", "matplotlib", "sciax"]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    return sorted(x for x in flags if x.startswith(("avx", "fma", "sse4")))
    except OSError:
        pass
    return []


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_info(ctx: Context) -> dict:
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    gcc = _run(["gcc", "--version"]).splitlines()
    commit = _run(["git", "rev-parse", "--short", "HEAD"])
    dirty = bool(_run(["git", "status", "--porcelain", "--untracked-files=no"]))
    info = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags(),
        "cpu_count": os.cpu_count(),
        "cores_used": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "threads": ctx.threads,
        "device": ctx.device,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
        "gcc": gcc[0] if gcc else None,
        "git_commit": (commit + ("-dirty" if dirty else "")) if commit else None,
        "env": {k: os.environ.get(k) for k in ("XLA_FLAGS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                "OPENBLAS_NUM_THREADS", "JAX_PLATFORMS")},
    }
    if "jax" in sys.modules:

        try:
            dev = ctx.jax_device()
            info["jax_device"] = f"{dev.platform}: {dev.device_kind}"
        except Exception as e:  # noqa: BLE001
            info["jax_device"] = f"unavailable ({e})"
    if "torch" in sys.modules:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        if ctx.device == "gpu" and torch.cuda.is_available():
            info["torch_device"] = torch.cuda.get_device_name(0)
    return info


# ---------------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------------


def fmt_si(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if x == 0:
        return "0"
    exp = int(math.floor(math.log10(abs(x))))
    return f"{x / 10 ** exp:.{digits - 1}f}e{exp}"


def fmt_time(s: float | None) -> str:
    if s is None:
        return "–"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    return f"{s:.2f} s"


def fmt_bytes(b: float | None) -> str:
    if b is None:
        return "–"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b:.0f} B"


def fmt_size(n: int) -> str:
    if n >= 1000 and math.log10(n).is_integer():
        return f"1e{int(math.log10(n))}"
    return str(n)


_MEM_TAGS = {"tracemalloc": "t", "xla": "x", "rss": "r"}


def _ratios(measurements: list[Measurement]) -> dict[int, float]:
    """id(m) -> time(m) / time(reference) within the same (suite, case, precision, size)."""
    refs = {}
    for m in measurements:
        if m.reference and m.status == "ok" and m.time_median_s:
            refs.setdefault((m.suite, m.case, m.precision, m.size), m.time_median_s)
    out = {}
    for m in measurements:
        ref = refs.get((m.suite, m.case, m.precision, m.size))
        if ref and m.status == "ok" and m.time_median_s:
            out[id(m)] = m.time_median_s / ref
    return out


def table_rows(result: SuiteResult) -> tuple[list[str], list[list[str]], list[str]]:
    """Header, rows and case labels (one per row) of a suite's table."""
    ratios = _ratios(result.measurements)
    header = ["case", "implementation", "prec.", "size", "median time", "spread (min–max)",
              "throughput", "sciax speed-up", "compile", "peak mem"]
    header += [h for _, h in result.columns]
    header += ["bar"]
    rows, cases = [], []
    for m in result.measurements:
        if m.status != "ok":
            row = [m.case, m.impl, m.precision.replace("float", "f"), fmt_size(m.size),
                   m.status, m.note] + ["–"] * 4 + ["–"] * len(result.columns) + [m.bar or ""]
            rows.append(row)
            cases.append(m.case)
            continue
        thr = m.throughput
        ratio = ratios.get(id(m))
        speedup = ("ref" if m.reference else (f"{ratio:.2f}x" if ratio is not None else "–"))
        spread = f"{fmt_time(m.time_min_s)}–{fmt_time(m.time_max_s)} (n={m.reps})"
        mem = fmt_bytes(m.peak_mem_bytes)
        if m.peak_mem_bytes is not None and m.mem_method in _MEM_TAGS:
            mem += f" [{_MEM_TAGS[m.mem_method]}]"
        compile_s = fmt_time(m.compile_s) if m.compile_s is not None else "–"
        bar = ""
        if m.bar:
            bar = m.bar + (": **met**" if m.bar_met else ": **MISSED**" if m.bar_met is False else "")
        row = [m.case, m.impl + (f" ({m.note})" if m.note else ""), m.precision.replace("float", "f"),
               fmt_size(m.size), fmt_time(m.time_median_s), spread,
               f"{fmt_si(thr)} {m.unit}" if thr else "–", speedup, compile_s, mem]
        row += [str(m.extra.get(k, "–")) for k, _ in result.columns]
        row += [bar]
        rows.append(row)
        cases.append(m.case)
    return header, rows, cases


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def targets_rows(targets: list[Target]) -> tuple[list[str], list[list[str]]]:
    header = ["suite", "target", "bar", "measured", "result", "note"]
    rows = []
    for t in targets:
        res = "met" if t.met else ("MISSED" if t.met is False else
                                   ("not measured" if t.value is None else "inconclusive"))
        rows.append([t.suite, t.name, t.bar, t.value_text, res, t.note])
    return header, rows


def machine_markdown(info: dict, ctx: Context, load: tuple) -> str:
    v = info["versions"]
    libs = ", ".join(f"{k} {val}" for k, val in v.items() if val)
    cores = info["cores_used"]
    lines = [
        f"- date: {info['date']}",
        f"- CPU: {info['cpu_model']} ({info['cpu_count']} logical cores on the machine; "
        f"SIMD: {' '.join(x for x in info['cpu_flags'] if x in ('avx2', 'avx512f', 'fma'))})",
        f"- cores used: {cores} ({len(cores) if cores else '?'} core(s)); threads pinned to: "
        f"{ctx.threads if ctx.threads else 'library defaults (multi-threaded figures)'}",
        f"- device: {ctx.device}" + (f" (JAX: {info['jax_device']})" if "jax_device" in info else ""),
        f"- mode: {'--quick' if ctx.quick else 'full'}; load average (1 min) at start/end: "
        f"{load[0]:.2f} / {load[1]:.2f}"
        + (" — other processes were competing for the CPU; figures are indicative"
           if max(load) > 1.5 else ""),
        f"- libraries: python {info['python']}, {libs}; {info['gcc'] or 'gcc: none'}",
        f"- sciax commit: {info['git_commit']}",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------


def draw_plots(suite: str, result: SuiteResult, out_dir: Path, footnote: str = "") -> list[str]:
    if not result.plots:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # One colour per implementation across all of a suite's plots (sciax first, in blue).
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colours: dict[str, str] = {}
    for m in result.measurements:
        if m.impl not in colours:
            colours[m.impl] = palette[len(colours) % len(palette)]
    written = []
    for spec in result.plots:
        fig, ax = plt.subplots(figsize=(7.5, 5))
        drawn = False
        for case in spec.cases:
            impls = []
            for m in result.measurements:
                if m.case == case and m.impl not in impls:
                    impls.append(m.impl)
            for impl in impls:
                pts = sorted(
                    (m.size, getattr(m, spec.metric))
                    for m in result.measurements
                    if m.case == case and m.impl == impl and m.status == "ok"
                    and (spec.precision is None or m.precision == spec.precision)
                    and getattr(m, spec.metric)
                )
                if not pts:
                    continue
                xs, ys = zip(*pts)
                label = impl if len(spec.cases) == 1 else f"{impl} [{case}]"
                style = "-o" if "sciax" in impl else "--s"
                ax.plot(xs, ys, style, label=label, linewidth=2.2 if "sciax" in impl else 1.2,
                        markersize=4, color=colours[impl])
                drawn = True
        if not drawn:
            plt.close(fig)
            continue
        if spec.logx:
            ax.set_xscale("log")
        if spec.logy:
            ax.set_yscale("log")
        ax.set_xlabel(spec.xlabel)
        ax.set_ylabel(spec.ylabel or spec.metric)
        ax.set_title(spec.title, fontsize=10)
        if footnote:
            fig.text(0.01, 0.005, footnote, fontsize=7, color="0.35")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        path = out_dir / spec.filename
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path.name)
    return written


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def run_suites(suites: list[Suite], ctx: Context) -> dict:
    """Run `suites`, print their tables, and write JSON, Markdown and PNGs into `ctx.out_dir`."""
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()[0]
    t_start = time.perf_counter()
    results: dict[str, SuiteResult] = {}
    errors: dict[str, str] = {}
    for suite in suites:
        ctx.log(f"\n=== suite {suite.name}: {suite.description}")
        t0 = time.perf_counter()
        try:
            results[suite.name] = suite.run(ctx)
        except Exception as e:  # noqa: BLE001 - one broken suite must not lose the others
            import traceback

            traceback.print_exc()
            errors[suite.name] = f"{type(e).__name__}: {e}"
            continue
        ctx.log(f"=== suite {suite.name} took {time.perf_counter() - t0:.1f} s")
    load_end = os.getloadavg()[0]
    info = machine_info(ctx)
    info["wall_s"] = time.perf_counter() - t_start
    info["load_average_1min"] = [load_start, load_end]

    md = [f"# sciax benchmarks ({'--quick' if ctx.quick else 'full'})", "",
          machine_markdown(info, ctx, (load_start, load_end)), "",
          "Columns: *sciax speed-up* is this row's time divided by the sciax row's time for the "
          "same case, precision and size (above 1: sciax is faster). *compile* is measured apart "
          "and excluded from the median. Peak memory: [t] tracemalloc, [x] XLA buffer assignment "
          "(arguments + outputs + temporaries), [r] resident-set increase sampled during the first "
          "call (a lower bound: memory that earlier rows returned to the allocator is reused, so "
          "only the first row in a process is a fair peak).", ""]
    all_targets: list[Target] = []
    for name, res in results.items():
        header, rows, _ = table_rows(res)
        print(f"\n--- {name} ---")
        print(text_table(header, rows))
        md += [f"## {name}", "", markdown_table(header, rows), ""]
        md += [f"- {n}" for n in res.notes]
        footnote = (f"{info['cpu_model']}, CPU(s) {info['cores_used']}, {info['date'][:10]}"
                    + ("; machine shared with other processes: indicative figures"
                       if max(load_start, load_end) > 1.5 else ""))
        pngs = draw_plots(name, res, ctx.out_dir, footnote)
        md += [""] + [f"![{p}]({p})" for p in pngs] + [""]
        all_targets += res.targets
    for name, err in errors.items():
        md += [f"## {name}", "", f"The suite failed: `{err}`", ""]
    if all_targets:
        header, rows = targets_rows(all_targets)
        print("\n--- targets ---")
        print(text_table(header, rows))
        md += ["## Targets", "", markdown_table(header, rows), ""]

    payload = {
        "machine": info,
        "config": {"quick": ctx.quick, "device": ctx.device, "threads": ctx.threads,
                   "reps": ctx.reps, "max_call_s": ctx.max_call_s},
        "suites": {
            name: {
                "measurements": [dict(dataclasses.asdict(m), throughput=m.throughput)
                                 for m in res.measurements],
                "targets": [dataclasses.asdict(t) for t in res.targets],
                "notes": res.notes,
            }
            for name, res in results.items()
        },
        "errors": errors,
    }
    (ctx.out_dir / "results.json").write_text(json.dumps(payload, indent=2, default=str))
    (ctx.out_dir / "results.md").write_text("\n".join(md) + "\n")
    print(f"\nwrote {ctx.out_dir / 'results.json'}, {ctx.out_dir / 'results.md'} and the PNGs "
          f"({info['wall_s']:.0f} s in all)")
    return payload
