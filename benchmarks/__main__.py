"""`python -m benchmarks`: run the benchmark suites and write a results folder.

Thread pinning has to happen before NumPy, JAX or PyTorch are imported (their thread pools
are sized at import), so this module parses its arguments and sets the environment first,
and imports the harness afterwards. When it is called from a process that has already
imported one of those libraries (e.g. a CLI wrapper such as ``sciax bench``), it re-executes
itself as ``python -m benchmarks ...`` with the environment set, so the pinning still holds.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path

_HEAVY = ("numpy", "jax", "torch", "scipy")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="sciax benchmarks against NumPy, PyTorch, C and peer libraries.",
    )
    p.add_argument("--suite", default="all",
                   help="comma-separated suite names (default: all; --list shows them)")
    p.add_argument("--quick", action="store_true",
                   help="small sizes and few repetitions: the whole run takes under ~2 minutes "
                        "on one core")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="where JAX and PyTorch run (NumPy, SciPy and C always run on the CPU)")
    p.add_argument("--threads", type=int, default=1,
                   help="pin NumPy/XLA/PyTorch to this many threads and the process to as many "
                        "cores (default 1: the single-core figures the targets are set for); "
                        "0 leaves the libraries' defaults (figures are then labelled multi-thread)")
    p.add_argument("--cpus", default=None,
                   help="comma-separated CPU ids to pin to (default: the last --threads CPUs "
                        "this process may use)")
    p.add_argument("--reps", type=int, default=None,
                   help="steady repetitions per measurement (default 3 quick, 7 full)")
    p.add_argument("--max-call-s", type=float, default=None,
                   help="skip an implementation at sizes where one call is predicted to take "
                        "longer than this (default 2.5 s quick, 60 s full)")
    p.add_argument("--out", default=None,
                   help="results folder (default: results/bench-<date>-<time>)")
    p.add_argument("--list", action="store_true", help="list the suites and exit")
    return p


def configure_threads(threads: int, cpus: str | None, device: str) -> list[int] | None:
    """Set the thread environment and CPU affinity. Must run before the libraries are imported.

    - NumPy's BLAS and OpenMP pools: OMP/MKL/OPENBLAS_NUM_THREADS.
    - XLA:CPU: ``--xla_cpu_multi_thread_eigen=false`` in
      XLA_FLAGS (only for one thread; XLA has no general thread-count flag).
    - PyTorch: ``torch.set_num_threads`` is called by the PyTorch baselines (they read
      ``BENCH_THREADS``); TORCHINDUCTOR_COMPILE_THREADS=1 keeps `torch.compile` in-process.
    - The process (and its children, e.g. the fresh-process fits) is bound to `threads`
      cores with ``os.sched_setaffinity``, the in-process equivalent of ``taskset``.
    """
    if device == "cpu":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if threads <= 0:  # library defaults; `--cpus` still says where the process may run
        return _pin(cpus, None)
    n = str(threads)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS"):
        os.environ[var] = n
    os.environ["BENCH_THREADS"] = n
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    if threads == 1:
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_cpu_multi_thread_eigen" not in flags:
            # (Only real `--` flags: XLA silently ignores every flag after a bare token such as
            # `intra_op_parallelism_threads=1`, measured 2026-11-22. The affinity below is what
            # holds XLA to one core.)
            os.environ["XLA_FLAGS"] = (flags + " --xla_cpu_multi_thread_eigen=false").strip()
    return _pin(cpus, threads)


def _pin(cpus: str | None, threads: int | None) -> list[int] | None:
    """Bind the process to `cpus` (comma-separated ids), else to the last `threads` CPUs it may
    use; None (no binding) without either, or where the platform cannot bind."""
    if not hasattr(os, "sched_setaffinity") or (not cpus and not threads):
        return None
    chosen = [int(c) for c in cpus.split(",")] if cpus else sorted(os.sched_getaffinity(0))[-threads:]
    os.sched_setaffinity(0, chosen)
    return chosen


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.cpus is not None:
        try:
            n_cpus = len({int(c) for c in args.cpus.split(",")})
        except ValueError:
            parser.error(f"--cpus must be comma-separated CPU ids such as 1 or 0,1, got {args.cpus!r}")
        if args.threads > 0 and n_cpus != args.threads:
            parser.error(f"--cpus names {n_cpus} CPU(s) but --threads is {args.threads}; give as many "
                         "CPUs as threads (or --threads 0 for the libraries' defaults)")

    if args.list:
        from .harness import discover_suites

        for name, suite in discover_suites().items():
            print(f"{name:20s} {suite.description}")
        return 0

    if args.threads > 0 and any(m in sys.modules for m in _HEAVY) and \
            os.environ.get("BENCH_REEXEC") != "1":
        # Called from a process that already imported NumPy/JAX/PyTorch: their thread pools
        # are fixed. Start afresh as `python -m benchmarks` so the pinning takes effect.
        env = dict(os.environ, BENCH_REEXEC="1")
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        os.execve(sys.executable, [sys.executable, "-m", "benchmarks", *argv], env)

    cores = configure_threads(args.threads, args.cpus, args.device)

    # Imported before the harness and the suites, after the thread environment is set, so that
    # every JAX-based row (sciax, the hand-written lax.scan, Diffrax) starts the same backend.
    import sciax  # noqa: F401, E402

    from . import harness  # noqa: E402 - after the thread environment is set

    if args.device == "gpu":
        import jax

        try:
            jax.devices("gpu")
        except RuntimeError:
            raise SystemExit(f"--device gpu: JAX sees no GPU (devices: {jax.devices()}); install a "
                             "CUDA build of jaxlib, or run with --device cpu.") from None

    quick = args.quick
    out = Path(args.out) if args.out else Path("results") / (
        "bench-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    ctx = harness.Context(
        quick=quick,
        device=args.device,
        threads=args.threads if args.threads > 0 else None,
        reps=args.reps or (3 if quick else 7),
        max_call_s=args.max_call_s or (2.5 if quick else 60.0),
        budget_s=3.0 if quick else 60.0,
        out_dir=out,
    )
    suites = harness.select_suites(args.suite)
    print(f"sciax benchmarks: suites {', '.join(s.name for s in suites)}; "
          f"{'--quick' if quick else 'full'} mode; device {args.device}; "
          f"threads {args.threads if args.threads > 0 else 'library defaults'}"
          + (f" on CPU(s) {cores}" if cores else "") + f"; results -> {out}")
    harness.run_suites(suites, ctx)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
