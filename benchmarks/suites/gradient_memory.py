"""Suite `gradient_memory`: peak memory of each gradient mode against trajectory length.

The target: report the peak memory of each gradient mode at 10^3, 10^4 and 10^5 steps of a
512-particle system (for comparison: JAX-MD, differentiating 100 velocity-Verlet
steps of a 4,000-atom LJ system without checkpointing, used 2.6 GB in float32 and would
exhaust 24 GB at 1,000 steps).

Workload: `sciax.systems.MassSpringChain` of 512 unit masses in 3-D (511 springs, stiffness
k_s = 1 + 0.1 U(0, 1), rest length 1), laid out along x and centred, positions and velocities
perturbed by N(0, 0.01²) (a cold chain; fixed seed, zero total momentum); `VelocityVerlet`,
dt = 0.005 (ω_max dt ≈ 0.01); n_steps = 10^3, 10^4, 10^5 (t = 5, 50, 500) with save_every =
n_steps // 10 (11 frames, frame 0 included); loss = Σ over frames of Σ |q_i|²; the gradient with
respect to the 511 spring stiffnesses and the (512, 3) initial positions. A spring chain is one
of the cheapest 512-particle systems per step, so 10^5 steps stay affordable; memory per step is
set by the state size, not the force. Float64 (quick and full mode) and float32 (full mode).

The chain is weakly chaotic (its transverse modes are anharmonic at zero tension), so gradients
grow with the horizon (dL/dk about 10^4x from 10^3 to 10^5 steps here); with the 10x larger
perturbations and 4x longer step tried first they overflowed float32 by 10^5 steps and differed
between modes by 100% in float64: that is the dynamics, not the adjoints, and this regime keeps
every mode's gradient finite and comparable at every length.

For each adjoint (`DirectAdjoint`, `CheckpointAdjoint`, `ReversibleAdjoint`) and length:

- XLA's buffer assignment of the compiled `jit(grad(loss))` (arguments + outputs +
  temporaries, from `compiled.memory_analysis()`): the program's peak buffer memory, known
  from compiling alone, so it is reported at every length, including those not run;
- where affordable (XLA buffers ≤ `MEMORY_LIMIT` and predicted time ≤ `--max-call-s`), the
  wall time of one gradient evaluation and the resident-set increase of the process during
  its first call (sampled every 2 ms, `harness.rss_peak_increase`; approximate);
- the relative difference of each mode's gradient from `DirectAdjoint`'s at the same length
  (from `CheckpointAdjoint`'s where Direct was not run); the bar (the gradient tests'
  tolerance, 1e-6 in float64) applies at 10^3 steps.

Each adjoint is measured in its own fresh process (`python -m benchmarks.suites.gradient_memory
--child ...`, same environment and CPU affinity), compiling every length first and then running
them in increasing order, so one mode's freed buffers cannot hide another's growth.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ..harness import (
    Measurement,
    Suite,
    SuiteResult,
    Target,
    fmt_bytes,
    fmt_size,
    rss_peak_increase,
    time_call,
)

NAME = "gradient_memory"
N_PARTICLES = 512
DIMENSION = 3
DT = 0.005
PERTURBATION = 0.01  # standard deviation of the position and velocity perturbations
N_FRAMES = 10
STEPS = (1_000, 10_000, 100_000)
MEMORY_LIMIT = 4e9  # bytes of XLA buffers: a program that needs more is compiled but not run
CASE = "grad wrt (k, q0)"
ADJOINTS = {  # row label -> sciax class name
    "sciax DirectAdjoint": "DirectAdjoint",
    "sciax CheckpointAdjoint": "CheckpointAdjoint",
    "sciax ReversibleAdjoint": "ReversibleAdjoint",
}
REFERENCE = "sciax DirectAdjoint"
# JAX-MD's reference figure: 2.6 GB for 100 steps x 4,000 atoms (float32, no checkpointing).
JAXMD_BYTES_PER_ATOM_STEP = 2.6e9 / (100 * 4000)


def problem(dtype: str, seed: int = 0):
    """(masses, stiffness, q0, v0) as NumPy arrays of `dtype`: the 512-mass chain in 3-D."""
    rng = np.random.default_rng(seed)
    n = N_PARTICLES
    q0 = np.zeros((n, DIMENSION))
    q0[:, 0] = np.arange(n) - (n - 1) / 2  # centred: smaller |q| keeps float32 round-off small
    q0 += PERTURBATION * rng.standard_normal((n, DIMENSION))
    v0 = PERTURBATION * rng.standard_normal((n, DIMENSION))
    v0 -= v0.mean(axis=0)
    stiffness = 1.0 + 0.1 * rng.random(n - 1)
    masses = np.ones(n)
    return tuple(a.astype(dtype) for a in (masses, stiffness, q0, v0))


def make_loss(n_steps: int, adjoint, masses, v0):
    """loss(stiffness, q0): Σ over the 11 saved frames of Σ_i |q_i|²."""
    import jax.numpy as jnp

    import sciax
    from sciax.integrators import VelocityVerlet
    from sciax.systems import MassSpringChain

    def loss(stiffness, q0):
        system = MassSpringChain(masses=masses, stiffness=stiffness, rest_length=1.0)
        traj = sciax.simulate(system, sciax.PhaseSpace(q0, jnp.asarray(v0)), integrator=VelocityVerlet(),
                              dt=DT, n_steps=n_steps, save_every=n_steps // N_FRAMES, adjoint=adjoint)
        return jnp.sum(traj.states.positions**2)

    return loss


# ---------------------------------------------------------------------------------------------
# The child process: compile every length, then run the affordable ones (increasing length).
# ---------------------------------------------------------------------------------------------


def _child(spec: dict) -> list[dict]:
    import jax  # (importing JAX does not start its backend; sciax's XLA options still apply)

    import sciax

    jax.config.update("jax_enable_x64", True)
    adjoint = getattr(sciax, spec["adjoint"])()
    masses, stiffness, q0, v0 = problem(spec["dtype"])
    args = (jax.device_put(stiffness), jax.device_put(q0))
    rows, compiled = [], {}
    for n in spec["steps"]:
        fn = jax.jit(jax.grad(make_loss(n, adjoint, masses, v0), argnums=(0, 1)))
        t0 = time.perf_counter()
        compiled[n] = fn.lower(*args).compile()
        compile_s = time.perf_counter() - t0
        ma = compiled[n].memory_analysis()
        parts = {k: int(getattr(ma, f"{k}_size_in_bytes", 0)) for k in ("argument", "output", "temp", "alias")}
        rows.append({"n_steps": n, "compile_s": compile_s, **parts,
                     "xla_bytes": parts["argument"] + parts["output"] + parts["temp"] - parts["alias"]})
    last = None  # (n_steps, seconds) of the previous run, for the time cap
    for row in rows:
        n = row["n_steps"]
        if row["xla_bytes"] > spec["mem_limit"]:
            row["skip"] = (f"compiled, not run: XLA buffers {fmt_bytes(row['xla_bytes'])} > "
                           f"{fmt_bytes(spec['mem_limit'])} (shared machine)")
            continue
        if last is not None:
            predicted = last[1] * n / last[0]
            if predicted > spec["max_call_s"]:
                row["skip"] = (f"compiled, not run: predicted {predicted:.1f} s per call (> "
                               f"{spec['max_call_s']:g} s, {'--quick mode' if spec['quick'] else '--max-call-s'})")
                continue
        out = [None]

        def call(c=compiled[n], out=out):
            out[0] = c(*args)
            return out[0]

        gc.collect()
        t0 = time.perf_counter()
        row["rss_increase"] = rss_peak_increase(call, jax.block_until_ready)
        first = time.perf_counter() - t0
        timing = time_call(call, sync=jax.block_until_ready, reps=spec["reps"], max_total_s=spec["budget_s"],
                           warmup=False)
        row.update(first_s=first, median_s=timing.median, min_s=timing.min, max_s=timing.max, reps=timing.reps)
        last = (n, timing.median)
        g_k, g_q = (np.asarray(g, dtype=np.float64) for g in out[0])
        row["finite"] = bool(np.all(np.isfinite(g_k)) and np.all(np.isfinite(g_q)))
        row["grad_k"], row["grad_q0"] = g_k.tolist(), g_q.ravel().tolist()
    return rows


def run_child(spec: dict) -> list[dict]:
    """`_child(spec)` in a fresh Python process (same environment and CPU affinity)."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "benchmarks.suites.gradient_memory", "--child", json.dumps(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=root, env=env, timeout=3600)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no stderr)"]
        raise RuntimeError(f"child {spec['adjoint']} {spec['dtype']} failed: {tail[0][:200]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# The suite
# ---------------------------------------------------------------------------------------------


def _rel_diff(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def _linear_extrapolation(by_n: dict[int, float], n: int) -> float | None:
    lo, hi = STEPS[0], STEPS[1]
    if lo not in by_n or hi not in by_n:
        return None
    return by_n[hi] + (by_n[hi] - by_n[lo]) * (n - hi) / (hi - lo)


def run(ctx) -> SuiteResult:
    precisions = ["float64"] if ctx.quick else ["float64", "float32"]
    result = SuiteResult(columns=[("xla_temp", "XLA temp"), ("rss", "RSS increase (run) [r]"),
                                  ("per_particle_step", "XLA B/(particle·step)"),
                                  ("agreement", "grad rel. diff")])
    for prec in precisions:
        xla: dict[str, dict[int, float]] = {}
        grads: dict[tuple[str, int], tuple] = {}
        rows: dict[tuple[str, int], Measurement] = {}
        for impl, cls in ADJOINTS.items():
            spec = {"dtype": prec, "adjoint": cls, "steps": list(STEPS), "mem_limit": MEMORY_LIMIT,
                    "max_call_s": ctx.max_call_s, "quick": ctx.quick, "reps": ctx.reps,
                    "budget_s": ctx.budget_s}
            ctx.log(f"  {prec} {impl}: compiling {', '.join(fmt_size(n) for n in STEPS)} steps, "
                    "running the affordable ones (fresh process) ...")
            try:
                out = run_child(spec)
            except Exception as e:  # noqa: BLE001 - report the failure in the rows
                for n in STEPS:
                    m = _row(ctx, impl, prec, n)
                    m.status, m.note = "failed", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                    result.measurements.append(m)
                continue
            for r in out:
                n = r["n_steps"]
                m = _row(ctx, impl, prec, n)
                rows[(impl, n)] = m
                m.compile_s, m.compile_method = r["compile_s"], "lower+compile"
                m.peak_mem_bytes, m.mem_method = float(r["xla_bytes"]), "xla"
                xla.setdefault(impl, {})[n] = float(r["xla_bytes"])
                m.extra.update(xla_bytes=r["xla_bytes"], xla_argument=r["argument"], xla_output=r["output"],
                               xla_temp_bytes=r["temp"], xla_temp=fmt_bytes(r["temp"]),
                               per_particle_step=f"{r['xla_bytes'] / (N_PARTICLES * n):.1f}")
                if "skip" in r:
                    m.status = "skipped"
                    m.note = f"{r['skip']}; XLA buffer assignment {fmt_bytes(r['xla_bytes'])} [x]"
                else:
                    m.time_median_s, m.time_min_s, m.time_max_s = r["median_s"], r["min_s"], r["max_s"]
                    m.first_call_s, m.reps = r["first_s"], r["reps"]
                    m.extra["rss_increase_bytes"] = r["rss_increase"]
                    m.extra["rss"] = fmt_bytes(r["rss_increase"])
                    m.extra["grad_max_abs"] = max(float(np.max(np.abs(r["grad_k"]))),
                                                  float(np.max(np.abs(r["grad_q0"]))))
                    grads[(impl, n)] = (r["grad_k"], r["grad_q0"])
                    if not r["finite"]:
                        m.note = "NON-FINITE GRADIENT"
                result.measurements.append(m)
        _agreement(prec, grads, rows)
        _targets(result, prec, xla, rows)
        predicted = {impl: _linear_extrapolation(by_n, STEPS[-1]) for impl, by_n in xla.items()}
        if any(v is not None for v in predicted.values()):
            result.notes.append(
                f"{prec}: XLA bytes at {fmt_size(STEPS[-1])} steps predicted by linear extrapolation from "
                f"{fmt_size(STEPS[0])}/{fmt_size(STEPS[1])}: "
                + ", ".join(f"{impl.split()[-1]} {fmt_bytes(v)} (compiled: {fmt_bytes(xla[impl].get(STEPS[-1]))})"
                            for impl, v in predicted.items() if v is not None) + ".")
    result.notes += [
        f"Workload: MassSpringChain of {N_PARTICLES} masses in 3-D, VelocityVerlet, dt = {DT}, save_every = "
        f"n_steps // {N_FRAMES}, loss = Σ_frames Σ_i |q_i|², gradient w.r.t. the 511 stiffnesses and the "
        "(512, 3) initial positions.",
        "'peak mem' [x] is XLA's buffer assignment of jit(grad(loss)) (arguments + outputs + temporaries): "
        "known from compiling, so it is given for rows that were not run too (in their note). "
        "'RSS increase (run)' is the resident-set growth of a fresh process during the first call, after "
        "compilation, sampled every 2 ms (approximate; small values are allocator noise).",
        "'grad rel. diff': max |g − g_ref| / max |g_ref| for dL/dk and dL/dq0, against DirectAdjoint at the "
        "same length (against CheckpointAdjoint, marked, where Direct was not run). The bar (1e-6) is the "
        "float64 tolerance at 1e3 steps. Float32 differences are round-off, amplified by the chain's "
        "sensitivities as the horizon grows: the loss Σ|q|² is dominated by the chain's extent (|q| up to "
        "256) while dL/dk comes from 1% vibrations. At 1e5 steps the float32 gradients are not meaningful "
        "(even DirectAdjoint's is ~2x off the float64 one); the row is there for its memory and time.",
        "CheckpointAdjoint rematerialises each saved block, and a block of more than 64 steps "
        f"(n_steps / {N_FRAMES} here) once more in ~√save_every sub-blocks, so it stores ~2√save_every "
        "carries of the block being differentiated: its memory grows like √n_steps at a fixed number of "
        "frames. ReversibleAdjoint stores only the saved frames.",
        f"The published JAX-MD figure: 2.6 GB for 100 steps x 4,000 LJ atoms in float32 = "
        f"{JAXMD_BYTES_PER_ATOM_STEP:.0f} B per atom-step (neighbour-list LJ stores far more per atom than a "
        "spring chain: compare the growth with steps, not the constant).",
        f"A program needing more than {MEMORY_LIMIT / 1e9:g} GB of XLA buffers is compiled but not run "
        "(shared machine).",
    ]
    return result


def _row(ctx, impl, prec, n) -> Measurement:
    return Measurement(suite=NAME, case=CASE, impl=impl, precision=prec, size=n, size_name="steps",
                       unit="steps/s", work=float(n), reference=(impl == REFERENCE), device=ctx.device,
                       threads=str(ctx.threads) if ctx.threads else "default (multi-thread)")


AGREEMENT_TOL = 1e-6  # target: gradient modes agree to 1e-6 relative in float64


def _agreement(prec, grads, rows) -> None:
    """Each mode's gradient against Direct's at the same length (Checkpoint's if Direct did not run)."""
    for (impl, n), g in grads.items():
        m = rows[(impl, n)]
        if impl == REFERENCE:
            m.extra["agreement"] = "ref"
            continue
        ref_impl = REFERENCE if (REFERENCE, n) in grads else "sciax CheckpointAdjoint"
        if ref_impl == impl or (ref_impl, n) not in grads:
            continue
        ref = grads[(ref_impl, n)]
        dk, dq = _rel_diff(g[0], ref[0]), _rel_diff(g[1], ref[1])
        vs = "" if ref_impl == REFERENCE else " (vs Checkpoint)"
        m.extra.update(agreement=f"k {dk:.0e}, q0 {dq:.0e}{vs}", grad_rel_diff_k=dk, grad_rel_diff_q0=dq,
                       grad_rel_diff_vs=ref_impl)
        if n == STEPS[0] and prec == "float64" and ref_impl == REFERENCE:
            m.bar, m.bar_met = f"grad ≤ {AGREEMENT_TOL:g} vs Direct", max(dk, dq) <= AGREEMENT_TOL


def _targets(result, prec, xla, rows) -> None:
    rev = xla.get("sciax ReversibleAdjoint", {})
    lo, hi = STEPS[0], STEPS[-1]
    if lo in rev and hi in rev:
        ratio = rev[hi] / rev[lo]
        result.targets.append(Target(
            NAME, f"{prec}: ReversibleAdjoint memory (XLA) at {fmt_size(hi)} vs {fmt_size(lo)} steps",
            "≤ 2x (memory independent of steps)", ratio,
            f"{ratio:.2f}x ({fmt_bytes(rev[hi])} vs {fmt_bytes(rev[lo])})", ratio <= 2.0))
    if prec != "float64":
        return
    diffs = [max(m.extra["grad_rel_diff_k"], m.extra["grad_rel_diff_q0"]) for (impl, n), m in rows.items()
             if n == lo and m.extra.get("grad_rel_diff_vs") == REFERENCE]
    if diffs:
        worst = max(diffs)
        result.targets.append(Target(
            NAME, f"{prec}: Checkpoint and Reversible gradients vs Direct at {fmt_size(lo)} steps",
            f"max rel. diff ≤ {AGREEMENT_TOL:g}", worst, f"{worst:.1e}", worst <= AGREEMENT_TOL))
    else:
        result.targets.append(Target(NAME, f"{prec}: gradient modes agree at {fmt_size(lo)} steps",
                                     f"max rel. diff ≤ {AGREEMENT_TOL:g}", None, "not measured", None))


SUITE = Suite(
    name=NAME,
    description="peak memory (XLA buffers and measured RSS) and time of each gradient mode at "
                "1e3/1e4/1e5 velocity-Verlet steps of a 512-particle spring chain",
    run=run,
    order=25,
)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--child", required=True, help="JSON spec (see run)")
    a = parser.parse_args()
    print(json.dumps(_child(json.loads(a.child))))
