"""The `sciax` command: `sciax info`, `sciax run SCENARIO.toml`.

Also runnable as `python -m sciax ...`. Exit status: 0 success, 1 the run failed (NaN/Inf,
or an unexpected error), 2 bad input (scenario file, arguments, a refused `--resume`, an output
folder that another run is using), 130 interrupted (Ctrl-C), 143 terminated (SIGTERM, as sent by
batch schedulers and `docker stop`). Interrupted or terminated, a run writes its outputs up to
the last checkpoint and an "interrupted" summary first; continue it with `--resume`.
"""

import argparse
import importlib.metadata
import os
import platform
import signal
import sys
import threading
from pathlib import Path


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def info(stream=None) -> None:
    """Print versions, the JAX backend and devices, the default float precision and CPU count."""
    stream = sys.stdout if stream is None else stream
    import jax
    import jax.numpy as jnp

    from .._version import __version__

    out = [f"sciax {__version__}",
           f"python {platform.python_version()} ({sys.executable})",
           f"platform {platform.platform()}"]
    for dist in ("jax", "jaxlib", "equinox", "diffrax", "optimistix", "numpy", "matplotlib"):
        out.append(f"{dist} {_version(dist)}")
    devices = jax.devices()
    out.append(f"jax backend: {jax.default_backend()}")
    out.append(f"devices ({len(devices)}): " + ", ".join(f"{d} [{d.device_kind}]" for d in devices))
    x64 = bool(jax.config.jax_enable_x64)
    out.append(f"x64 enabled: {x64} (default float precision: {jnp.zeros(()).dtype}; scenarios with "
               'precision = "float64" enable x64)')
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    out.append(f"cpu count: {os.cpu_count()} (available to this process: {available})")
    stream.write("\n".join(out) + "\n")


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be, so the runner packages what its
    last checkpoint covers in the same way."""


def _on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second SIGTERM must not cut the packaging short
    raise _Terminated


def _run(args) -> int:
    if threading.current_thread() is not threading.main_thread():  # signal handlers need the main thread
        return _run_scenario(args)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _run_scenario(args)
    except _Terminated:  # outside the run (e.g. while importing): nothing was written
        print("sciax run: terminated (SIGTERM) before anything was written.", file=sys.stderr)
        return 143
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_scenario(args) -> int:
    import jax

    from .._errors import NonFiniteStateError
    from .runner import run
    from .scenario import ScenarioError, load_scenario

    # JAX_ENABLE_COMPILATION_CACHE=false (JAX's own switch) counts as --no-compilation-cache.
    if not args.no_compilation_cache and jax.config.jax_enable_compilation_cache:
        from .._compile.compilation_cache import enable_compilation_cache

        try:
            enable_compilation_cache()
        except ValueError as e:  # e.g. a read-only home: run without the cache
            print(f"sciax run: warning: {e}; running without the compilation cache.", file=sys.stderr)
    if args.out is not None and not args.out.strip():
        print("sciax run: error: --out: expected a non-empty folder path, got ''.", file=sys.stderr)
        return 2
    out = None if args.out is None else Path(args.out).expanduser()
    from .md_scenario import is_md_scenario

    if is_md_scenario(args.scenario):  # a top-level [md] table: molecular dynamics (sciax.md_run)
        from .md_run import cli_run

        return cli_run(args)
    scenario = None
    try:
        scenario = load_scenario(args.scenario, n_steps=args.n_steps)
        result = run(scenario, out, resume=args.resume, progress=not args.quiet)
    except ScenarioError as e:  # includes ResumeError
        print(f"sciax run: error: {e}", file=sys.stderr)
        return 2
    except NonFiniteStateError as e:
        print(f"sciax run: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # the output folder cannot be written (read-only, full disk, ...)
        where = f" ({e.filename})" if e.filename else ""
        print(f"sciax run: error: cannot write the outputs{where}: {e.strerror or e}.", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        how, code = ("terminated (SIGTERM)", 143) if isinstance(e, _Terminated) else ("interrupted", 130)
        folder = out if out is not None else scenario.output_dir if scenario is not None else None
        if folder is None or not (folder / "checkpoint.npz").exists():
            print(f"sciax run: {how} before anything was written.", file=sys.stderr)
            return code
        print(f"sciax run: {how}; the outputs so far and a checkpoint are in {folder}/; "
              "continue with --resume.", file=sys.stderr)
        return code
    s = result.summary
    if not args.quiet:
        rate = f", {s['steps_per_second']:.3g} steps/s" if s["steps_per_second"] else ""
        print(f"{scenario.name}: {result.status}, {s['steps_done']} steps, {s['n_frames']} frames, "
              f"{s['wall_time_s']:.2f} s{rate} ({s['precision']}, {s['backend']})")
        if s.get("resumed_from_step") is not None:
            total = s.get("total_compute_time_s")
            whole = f", {total:.2f} s over the whole run" if total is not None else ""
            print(f"  resumed from step {s['resumed_from_step']}: {s['compute_time_s']:.2f} s of compute in this "
                  f"invocation{whole}")
        for name, d in s["conserved"].items():
            if d["max_relative_error"] is not None:
                print(f"  {name}: relative drift {d['final_relative_drift']:.3e} at the end, "
                      f"{d['max_relative_error']:.3e} at most")
            else:
                print(f"  {name}: absolute drift {d['final_abs_drift']:.3e} at the end, "
                      f"{d['max_abs_error']:.3e} at most (initial value ~0)")
        print(f"outputs in {result.out_dir}/: " + ", ".join(s["files"]))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sciax", description="sciax: differentiable physics on JAX.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("info", help="versions, JAX backend and devices, precision, CPU count")
    sub.add_parser("bench", help="run the benchmarks from a source checkout (sciax bench --help)")
    p = sub.add_parser("run", help="run a scenario file (e.g. sims/lorenz.toml)",
                       description="Run a scenario file; outputs go to runs/<name>/ unless --out is given.")
    p.add_argument("scenario", help="scenario TOML file")
    p.add_argument("--out", metavar="DIR", default=None, help="output folder (default: [output] dir or runs/<name>)")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in the output folder")
    p.add_argument("--quiet", action="store_true", help="no progress line or summary")
    p.add_argument("--n-steps", type=int, metavar="N", default=None,
                   help="override [run] n_steps (e.g. a short smoke test); a multiple of save_every")
    p.add_argument("--no-compilation-cache", action="store_true",
                   help="do not keep compiled programs on disk (default: kept in $SCIAX_CACHE_DIR, else "
                        "$XDG_CACHE_HOME/sciax/jax or ~/.cache/sciax/jax, so a second run of a scenario skips "
                        "most compilation; also off with JAX_ENABLE_COMPILATION_CACHE=false)")
    return parser


def main(argv=None) -> int:
    """Entry point of the `sciax` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:
        return _bench(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "info":
        info()
        return 0
    return _run(args)


def _bench(argv) -> int:
    """`sciax bench ARGS` runs `python -m benchmarks ARGS` from a source checkout (the benchmarks
    and their NumPy/PyTorch/C baselines are not part of the installed package)."""
    root = Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / "__main__.py").exists():
        print("sciax bench: the benchmarks live in the source checkout (benchmarks/); run it from a clone "
              "installed with `pip install -e .`.", file=sys.stderr)
        return 2
    sys.path.insert(0, str(root))
    from benchmarks.__main__ import main as bench_main

    return bench_main(argv)


if __name__ == "__main__":
    sys.exit(main())
