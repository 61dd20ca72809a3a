"""One adaptive or stiff solve from a scenario with a `[solve]` table (`sciax.Solve`, Diffrax).

```toml
[solve]
solver = "kvaerno5"      # any sciax.solve solver name (default "tsit5"; stiff: kvaerno3/4/5, implicit_euler)
t1 = 4e10                # end time (required); t0 = 0.0 by default
rtol = 1e-8              # default 1e-8; atol default 1e-10
n_save = 201             # save times: n_save of them from save_from (default t0) to t1,
spacing = "log"          #   "linear" (default) or "log" (save_from > 0), or save_at = [...]
save_from = 1e-6
precision = "float64"
```

Files in the output folder (default `runs/<scenario name>/`): `scenario.toml` (the copy, with
any overrides named), `trajectory.npz` (`times`, `states...`, `observables.<name>`; read it with
`sciax.io.load_trajectory`), `states.csv` and `observables.csv`, `plot.png` (time on a
logarithmic axis for log-spaced save times), `summary.json` (status, solver, tolerances, step
counts, wall time, drift of conserved quantities). A solve is one compiled call, so there is
nothing to resume: `--resume` runs it again. Every file is written atomically, after the solve.
"""

import json
import time
from pathlib import Path

import jax
import numpy as np

from .. import io as sio
from .._version import __version__
from .folder import FolderLock, Progress, RunResult, copied_by_sciax, json_safe, write_scenario_copy
from .scenario import Scenario, ScenarioError
from .scenario_settings import MAX_AUTO_STATE_COLUMNS

FILES = ("scenario.toml", "trajectory.npz", "states.csv", "observables.csv", "plot.png", "summary.json")


def run(scenario: Scenario, out_dir=None, *, resume: bool = False, progress: bool = True, stream=None) -> RunResult:
    """Solve `scenario` (kind `"solve"`) and write its outputs to `out_dir` (default `[output] dir`).

    `resume` is accepted for the command line's sake: a solve is one call and is run again.

    **Raises:** `ScenarioError` (bad scenario, or a folder holding same-named files that no
    sciax run wrote), `MaxStepsError` (the solver ran out of steps; the message says whether
    the problem may be stiff and what to try), `NonFiniteStateError` (a NaN/Inf state).
    """
    import sys

    if scenario.kind != "solve":
        raise ScenarioError(f"{scenario.source}: solve_job runs [solve] scenarios; this one is a {scenario.kind}.")
    built = scenario.build()
    root = Path(out_dir) if out_dir is not None else scenario.output_dir
    report = Progress(scenario.name, 1, sys.stderr if stream is None else stream, progress)
    with FolderLock(root):
        copy = root / "scenario.toml"
        if copy.exists() and not copied_by_sciax(copy):
            raise ScenarioError(f"the output folder {root} holds a scenario.toml that no sciax run wrote; choose "
                                "another folder with --out or [output] dir.")
        s = scenario.solve
        report.message(f"{scenario.name}: solving {scenario.system_name} from t = {s.t0:g} to {s.t1:g} with {s.solver} "
                       f"(rtol {s.rtol:g}, atol {s.atol:g}, {scenario.precision})")
        start = time.monotonic()
        traj = built.rollout(built.system, built.state0)
        jax.block_until_ready(traj)
        wall = time.monotonic() - start
        from .._errors import NonFiniteStateError

        finite = np.asarray(traj.finite)
        if not finite.all():
            bad = int(np.argmin(finite))
            raise NonFiniteStateError(f"{scenario.name}: the state is non-finite (NaN/Inf) at t = "
                                      f"{float(traj.times[bad]):g} (save time {bad}); nothing was written. Try "
                                      "a stiff solver or tighter tolerances.", frame=bad, time=float(traj.times[bad]))
        files = _write(scenario, built, traj, root)
        summary = _summary(scenario, built, traj, wall, files)
        with sio.atomic_write(root / "summary.json", "w") as f:
            json.dump(json_safe(summary), f, indent=2, allow_nan=False)
            f.write("\n")
    return RunResult(out_dir=root, status="completed", steps_done=summary["num_steps"], summary=summary)


def _write(scenario: Scenario, built, traj, root: Path) -> list[str]:
    write_scenario_copy(root / "scenario.toml", scenario)
    files = ["scenario.toml"]
    sio.save_npz(root / "trajectory.npz", sio.trajectory_arrays(traj.times, traj.states, traj.observables))
    files.append("trajectory.npz")
    digits = 17 if np.dtype(built.dtype) == np.float64 else 9
    tables = {"states.csv": traj.states, "observables.csv": traj.observables or None}
    for name, tree in tables.items():
        path = root / name
        if tree is None:
            path.unlink(missing_ok=True)
            continue
        columns, values = sio.frame_columns(tree, names=getattr(built.system, "component_names", None))
        if name == "states.csv" and (scenario.output.states_csv is False or (
                scenario.output.states_csv == "auto" and len(columns) > MAX_AUTO_STATE_COLUMNS)):
            path.unlink(missing_ok=True)
            continue
        sio.write_csv_header(path, ["time", *columns])
        sio.append_csv_rows(path, np.column_stack([np.asarray(traj.times), values]), digits=digits)
        files.append(name)
    plot = root / "plot.png"
    plot.unlink(missing_ok=True)
    if scenario.output.plot:
        from ..plot import plot_trajectory, save_figure
        from .runner import system_text

        s = scenario.solve
        fig = plot_trajectory(traj, system=built.system, conserved=built.conserved,
                              title=f"{scenario.name}: {system_text(built.system)}, {s.solver}, rtol {s.rtol:g}, "
                                    f"{scenario.precision}")
        if s.spacing == "log":
            for ax in fig.axes:
                if ax.get_xlabel() == "t":
                    ax.set_xscale("log")
        save_figure(fig, plot)
        files.append(plot.name)
    return files + ["summary.json"]


def _summary(scenario: Scenario, built, traj, wall: float, files: list[str]) -> dict:
    s = scenario.solve
    stats = {k: int(np.asarray(v)) for k, v in (traj.stats or {}).items()
             if hasattr(v, "dtype") and np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype, np.integer)}
    conserved = {name: sio.drift_summary(np.asarray(traj.observables[name])) for name in built.conserved}
    return {
        "scenario": scenario.name, "source": scenario.source, "description": scenario.description,
        "kind": "solve", "status": "completed", "system": scenario.system_name, "solver": s.solver,
        "rtol": s.rtol, "atol": s.atol, "t0": s.t0, "t1": s.t1, "n_save": int(np.shape(traj.times)[0]),
        "spacing": "explicit" if s.save_at is not None else s.spacing, "precision": scenario.precision,
        "num_steps": stats.get("num_steps"), "stats": stats, "overrides": scenario.overrides,
        "wall_time_s": wall, "conserved": conserved, "backend": jax.default_backend(),
        "x64_enabled": bool(jax.config.jax_enable_x64),
        "versions": {"sciax": __version__, "jax": jax.__version__}, "scenario_hash": scenario.hash(), "files": files,
    }


def report(scenario: Scenario, result: RunResult) -> list[str]:
    """The lines `sciax run` prints after a solve: steps taken, time, drift."""
    s = result.summary
    steps = s["stats"]
    lines = [f"{scenario.name}: {result.status}, {s['solver']} from t = {s['t0']:g} to {s['t1']:g}: "
             f"{steps.get('num_accepted_steps', '?')} accepted and {steps.get('num_rejected_steps', '?')} rejected "
             f"steps, {s['n_save']} saved times, {s['wall_time_s']:.2f} s including compilation "
             f"({s['precision']}, {s['backend']})"]
    for name, d in s["conserved"].items():
        if d["max_relative_error"] is not None:
            lines.append(f"  {name}: relative drift {d['final_relative_drift']:.3e} at the end")
    return lines
