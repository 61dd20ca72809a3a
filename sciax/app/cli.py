"""The `sciax` command: `sciax info | list | validate SCENARIO | run SCENARIO | bench`.

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


def _overrides(args) -> list[str]:
    """`--set` strings, with `--seed`, `--precision` and `--devices` written as the keys they set
    (`[run] seed`, the precision of `[run]`/`[solve]`/`[md]`, `[sweep] devices`).

    **Raises:** `ScenarioError` when the scenario has no such key (e.g. `--devices` without a
    `[sweep]` table)."""
    import tomllib

    from .schema import ScenarioError, read_scenario_text

    sets = list(args.set or [])
    if args.seed is None and args.precision is None and args.devices is None:
        return sets
    try:
        data = tomllib.loads(read_scenario_text(Path(args.scenario)))
    except tomllib.TOMLDecodeError:
        return sets  # reported, with the line, when the file is parsed
    section = "md" if "md" in data else "solve" if "solve" in data else "run"
    if args.precision is not None:
        sets.append(f'{section}.precision="{args.precision}"')
    if args.seed is not None:
        if section == "solve":
            raise ScenarioError(f"--seed: {args.scenario} solves with [solve], which has no random part; the seed "
                                "applies to [run] (stochastic integrators) and [md] runs.")
        sets.append(f"{section}.seed={args.seed}")
    if args.devices is not None:
        if "sweep" not in data:
            raise ScenarioError(f"--devices: {args.scenario} has no [sweep] table; only sweeps spread their "
                                "members over several devices.")
        sets.append(f"sweep.devices={args.devices}")
    return sets


def _load(args):
    """The validated scenario of `args.scenario`, an MD scenario or any other job."""
    from .md_scenario import is_md_scenario, load_md_scenario
    from .scenario import load_scenario

    sets = _overrides(args)
    if is_md_scenario(args.scenario):
        return load_md_scenario(args.scenario, n_steps=args.n_steps, overrides=sets)
    return load_scenario(args.scenario, n_steps=args.n_steps, overrides=sets)


def _job(scenario):
    """The module that runs `scenario`: `runner` (fixed-step run), `solve_job`, `sweep_job`,
    `fit_job` (`scenario.JOBS`) or `md_run`. Each has `run(scenario, out_dir, *, resume, progress)`
    and `report(scenario, result) -> lines`."""
    import importlib

    from .md_scenario import MDScenario
    from .scenario import JOBS

    if isinstance(scenario, MDScenario):
        return importlib.import_module("sciax.app.md_run")
    name = {"run": "sciax.app.runner", "solve": "sciax.app.solve_job"}.get(scenario.kind) or JOBS[scenario.kind]
    return importlib.import_module(name)


def _run_scenario(args) -> int:
    import jax

    from .._errors import NonFiniteStateError
    from .schema import ScenarioError

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
    scenario = None
    try:
        scenario = _load(args)
        job = _job(scenario)
        result = job.run(scenario, out, resume=args.resume, progress=not args.quiet)
    except ScenarioError as e:  # includes ResumeError
        print(f"sciax run: error: {e}", file=sys.stderr)
        return 2
    except (NonFiniteStateError, RuntimeError) as e:  # the run failed (NaN/Inf, an MD overflow it cannot grow)
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
    if not args.quiet:
        for line in job.report(scenario, result):
            print(line)
        print(f"outputs in {result.out_dir}/: " + ", ".join(result.summary["files"]))
    return 0


def _list(args) -> int:
    """`sciax list`: the ready scenarios in `sims/` and the systems, integrators and solvers a
    scenario can name."""
    import tomllib
    import typing

    from .._solve import SolverName
    from .md_settings import INTEGRATORS as MD_INTEGRATORS
    from .scenario import JOBS, integrator_classes, system_classes

    folder = Path(args.folder) if args.folder else _sims_folder()
    if folder is None:
        print("ready scenarios: none found (no sims/ folder here or in the source checkout); give one with --folder.")
    else:
        rows = []
        for path in sorted(folder.glob("*.toml")):
            try:
                data = tomllib.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
                rows.append((str(path), "?", f"(unreadable: {type(e).__name__})"))
                continue
            kind = next((k for k in ("md", *JOBS, "solve") if k in data), "run")
            lines = str(data.get("description", "")).strip().splitlines()
            rows.append((str(path), kind, lines[0] if lines else ""))
        print(f"ready scenarios in {folder}/ (sciax run PATH; --set key.path=value changes a number):")
        width = max((len(r[0]) for r in rows), default=0)
        for path, kind, description in rows:
            print(f"  {path.ljust(width)}  {kind:5s}  {description}")
    print('systems ([system] name; or your own class: "package.module:Class" or "file.py:Class"):')
    print("  " + ", ".join(system_classes()))
    print("integrators ([integrator] name): " + ", ".join(integrator_classes()))
    print("solvers ([solve] solver): " + ", ".join(typing.get_args(SolverName)))
    print("MD stage integrators ([[stage]] integrator): " + ", ".join(MD_INTEGRATORS))
    return 0


def _sims_folder() -> Path | None:
    """`./sims`, else the `sims/` folder of the source checkout sciax runs from."""
    for folder in (Path("sims"), Path(__file__).resolve().parents[2] / "sims"):
        if folder.is_dir():
            return folder
    return None


def _validate(args) -> int:
    """`sciax validate SCENARIO`: parse, build the objects and trace one step; run nothing."""
    from .schema import ScenarioError

    try:
        scenario = _load(args)
        scenario.build()
    except ScenarioError as e:
        print(f"sciax validate: error: {e}", file=sys.stderr)
        return 2
    kind = getattr(scenario, "kind", "md")
    print(f"{args.scenario}: valid ({kind} scenario {scenario.name!r}; outputs would go to {scenario.output_dir}/)")
    return 0


def _scenario_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenario", help="scenario TOML file")
    p.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", default=[],
                   help="override a value of the file, read as TOML and validated like the file (repeatable), "
                        "e.g. --set run.dt=0.01 --set system.params.rho=24.5 "
                        "--set 'sweep.axes.rho={start=0, stop=30, n=20}'")
    p.add_argument("--seed", type=int, metavar="S", default=None, help="the random seed ([run] seed, [md] seed)")
    p.add_argument("--precision", choices=("float32", "float64"), default=None,
                   help="floating-point precision ([run], [solve] or [md] precision)")
    p.add_argument("--n-steps", type=int, metavar="N", default=None,
                   help="override [run] n_steps (e.g. a short smoke test); a multiple of save_every")
    p.add_argument("--devices", type=int, metavar="N", default=None,
                   help="spread a sweep's members over the first N local devices ([sweep] devices)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sciax", description="sciax: differentiable physics on JAX.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("info", help="versions, JAX backend and devices, precision, CPU count")
    sub.add_parser("bench", help="run the benchmarks from a source checkout (sciax bench --help)")
    p = sub.add_parser("list", help="the ready scenarios in sims/, and the systems and integrators",
                       description="List the ready scenarios (sims/ here, else in the source checkout) with their "
                                   "one-line descriptions, and the systems, integrators and solvers a scenario can "
                                   "name.")
    p.add_argument("--folder", metavar="DIR", default=None, help="list the scenarios in DIR instead of sims/")
    p = sub.add_parser("validate", help="check a scenario file without running it",
                       description="Validate a scenario file (with its --set overrides): the schema, then the "
                                   "objects it describes and one traced step. Exit status 0 valid, 2 invalid.")
    _scenario_arguments(p)
    p = sub.add_parser("run", help="run a scenario file (e.g. sims/lorenz.toml)",
                       description="Run a scenario file: a fixed-step run, an adaptive solve ([solve]), a sweep "
                                   "([sweep]), a fit ([fit]) or molecular dynamics ([md]); outputs go to "
                                   "runs/<name>/ unless --out is given. Exit status: 0 success, 1 the run failed, "
                                   "2 bad input, 130 interrupted, 143 terminated.")
    _scenario_arguments(p)
    p.add_argument("--out", metavar="DIR", default=None, help="output folder (default: [output] dir or runs/<name>)")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in the output folder")
    p.add_argument("--quiet", action="store_true", help="no progress line or summary")
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
    if args.command == "list":
        return _list(args)
    if args.command == "validate":
        return _validate(args)
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
