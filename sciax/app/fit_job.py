"""The fit job: a scenario with a `[fit]` table fits physical parameters of its system to data,
in one call of `sciax.fit`. The table's schema, and the reading of its data file, are
`fit_settings`' (`parse_settings`); this module builds `sciax.fit`'s arguments, runs the fit
and writes its files.

Outputs in the output folder: `fit.json` (fitted values, standard errors, covariance and
correlation, χ² (the sum of squared errors without sigma), degrees of freedom, convergence,
iterations, unidentifiable parameters), `fit.txt` (`FitResult.summary()` with the data file and
settings), `fit.png` (`sciax.plot_fit`, with its uncertainty band; `[output] plot = false`
leaves it out), `residuals.csv` (per time: each data column, the model and the residual),
`summary.json` (status, wall time, files) and `scenario.toml` (the marked copy).
"""

import dataclasses
import io
import json
import math
import sys
import time
import warnings
from pathlib import Path

from .fit_settings import Column, DataTable, FitSettings, parse_settings
from .folder import FolderLock, Progress, RunResult, copied_by_sciax, json_safe, write_scenario_copy
from .schema import ScenarioError

__all__ = ["KIND", "Column", "ColumnObserve", "DataTable", "FitSettings", "parse_settings", "report", "run"]

KIND = FitSettings.KIND
FILES = ("scenario.toml", "fit.json", "fit.txt", "fit.png", "residuals.csv", "summary.json")
_CHI2_TEXT = {"chi2": "χ²", "SSE": "SSE (no sigma)"}


# --------------------------------------------------------------------------- the model


@dataclasses.dataclass(frozen=True)
class ColumnObserve:
    """`observe(state)` of a fit: the flattened state's entries `indices`, each through its
    transform (`"identity"`, `"log"`, `"log10"`). A hashable value, so equal fits share their
    compiled solve."""

    indices: tuple[int, ...]
    transforms: tuple[str, ...]

    def __call__(self, state):
        import jax
        import jax.numpy as jnp

        flat = jnp.concatenate([jnp.ravel(x) for x in jax.tree_util.tree_leaves(state)])
        apply = {"identity": lambda x: x, "log": jnp.log, "log10": jnp.log10}
        return jnp.stack([apply[t](flat[i]) for i, t in zip(self.indices, self.transforms)])


def _forward(transform, x):
    import numpy as np

    return {"identity": lambda v: v, "log": np.log, "log10": np.log10}[transform](x)


def _inverse(transform, x):
    import numpy as np

    return {"identity": lambda v: v, "log": np.exp, "log10": lambda v: 10.0 ** v}[transform](x)


def _arguments(scenario, built, fit: FitSettings):
    """`sciax.fit`'s arguments for this scenario (after `build()`), and the data it fits."""
    import jax
    import numpy as np

    import sciax

    data = fit.table
    times = data.values[fit.time]
    raw = np.stack([data.values[c.name] for c in fit.columns], axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        observed = np.stack([_forward(c.transform, raw[:, j]) for j, c in enumerate(fit.columns)], axis=1)
    present = np.isfinite(observed)
    size = sum(int(np.size(x)) for x in jax.tree_util.tree_leaves(built.state0))
    indices = [c.index for c in fit.columns] + list(fit.fit_initial_state if isinstance(fit.fit_initial_state,
                                                                                          tuple) else ())
    if max(indices) >= size:
        raise ScenarioError(f"{scenario.source}: [fit]: component index {max(indices)} is beyond the initial state, "
                            f"which has {size} entries.")
    sigma = None
    if fit.sigma_given:
        sigma = np.stack([np.full(len(times), c.sigma) if not isinstance(c.sigma, str) else data.values[c.sigma]
                          for c in fit.columns], axis=1)
        sigma = np.where(present, sigma, 1.0)  # missing entries are masked; their sigma is not used
    fis = fit.fit_initial_state
    if isinstance(fis, tuple):
        if not isinstance(built.state0, jax.Array):
            raise ScenarioError(f"{scenario.source}: [fit] fit_initial_state: components need an array state; "
                                f"{scenario.system_name}'s is a {type(built.state0).__name__}: give true or false.")
        mask = np.zeros(np.shape(built.state0), bool).ravel()
        mask[list(fis)] = True
        fis = mask.reshape(np.shape(built.state0))
    make = {"positive": sciax.Positive, "identity": sciax.Identity, "fixed": sciax.Fixed}
    transforms = {k: sciax.Bounded(*v) if isinstance(v, tuple) else make[v]() for k, v in fit.transforms.items()}
    if scenario.run is not None:
        rollout = sciax.Simulate(built.integrator, scenario.run.dt)
    else:
        s = scenario.solve
        rollout = sciax.Solve(s.solver, rtol=s.rtol, atol=s.atol, dt0=s.dt0, max_steps=s.max_steps)
    kwargs = dict(params=fit.params, rollout=rollout, transforms=transforms or None, fit_initial_state=fis,
                  observe=ColumnObserve(tuple(c.index for c in fit.columns), tuple(c.transform for c in fit.columns)),
                  sigma=sigma, mask=None if present.all() else present, t0=fit.t0,
                  shooting=None if fit.segments == 1 else sciax.MultipleShooting(fit.segments, fit.continuity_weight),
                  solver=fit.solver, jacobian=fit.jacobian, rtol=fit.rtol, atol=fit.atol, max_steps=fit.max_steps,
                  scale_covariance=fit.scale_covariance, throw=False, compilation=fit.compilation)
    return times, observed, raw, sigma, present, kwargs


# --------------------------------------------------------------------------- the run


def run(scenario, out_dir=None, *, resume: bool = False, progress: bool = True, stream=None) -> RunResult:
    """Fit `scenario`'s system to its `[fit]` data and write the outputs to `out_dir` (default
    `[output] dir`).

    A fit is one job with nothing to continue: `resume=True` runs it again from the start, like
    `resume=False`. The outputs of a previous fit in the folder are replaced; files of those names
    that no sciax run wrote are refused. Every file is written atomically after the fit, so a fit
    that fails or is interrupted leaves the folder as it was. Progress (`progress=True`, on
    `stream`, default `sys.stderr`): a line when the fit starts (it compiles, then solves in one
    program) and one with the iterations, loss and χ² when it ends.

    **Returns:** a `RunResult` with status `"completed"`, `steps_done` = optimiser iterations,
    and the `summary.json` dict as `summary`.

    **Raises:** `ScenarioError` (the scenario or its data cannot be fitted as given: `sciax.fit`
    refused its input; an output folder that holds files no sciax run wrote; nothing is
    written), `sciax.FitError` (a `RuntimeError`: the fit did not converge; its outputs are
    written first, with status `"not-converged"`, and the error's `run_result` is their
    `RunResult`), `OSError` (the outputs cannot be written).
    """

    import sciax

    del resume  # a fit always runs from the start (see the docstring)
    stream = sys.stderr if stream is None else stream
    fit: FitSettings = scenario.job
    start_wall = time.monotonic()
    built = dataclasses.replace(scenario, system_params={**scenario.system_params, **fit.start}).build()
    times, observed, raw, sigma, present, kwargs = _arguments(scenario, built, fit)
    root = Path(out_dir) if out_dir is not None else scenario.output_dir
    report = Progress(scenario.name, 0, stream, progress)
    with FolderLock(root):
        _refuse_foreign_files(root)
        n_obs = int(present.sum())
        report.message(f"{scenario.name}: fitting {', '.join(fit.params)}"
                       f"{' and the initial state' if fit.fit_initial_state else ''} to {n_obs} values of "
                       f"{fit.path} (compiling, then solving) ...")
        try:
            result = sciax.fit(built.system, built.state0, times, observed, **kwargs)
        except (ValueError, TypeError) as e:  # sciax.fit's contract: bad input
            raise ScenarioError(f"{scenario.source}: [fit]: sciax.fit refused the problem: {e}") from None
        fit_s = time.monotonic() - start_wall
        status = "completed" if result.converged else "not-converged"
        stats = _statistics(result, fit)
        report.message(f"{scenario.name}: {'converged' if result.converged else 'NOT converged'} after "
                       f"{result.n_steps} iterations, loss ½Σr² = {stats['loss']:.6g}, "
                       f"{_CHI2_TEXT[stats['chi_square_name']]} = {stats['chi_square']:.6g} ({fit_s:.1f} s)")
        png, plot_error, plot_warnings = None, None, []
        if scenario.output.plot:
            if fit.band_samples:
                report.message(f"{scenario.name}: drawing the fit with its band ({fit.band_samples} draws) ...")
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    png = _plot_png(scenario, result, times, observed, present, fit)
                plot_warnings = [str(w.message) for w in caught]
            except Exception as e:  # a picture must not cost the fit's other outputs
                plot_error = f"{type(e).__name__}: {e}"
                report.message(f"{scenario.name}: warning: the plot failed ({plot_error}).")
        texts = {"residuals.csv": _residuals_csv(result, fit, times, observed, raw, sigma, present),
                 "fit.txt": _fit_text(scenario, result, fit, stats, built.dtype)}
        record = {**stats, "scenario": scenario.name, "system": scenario.system_name,
                  "data": _data_record(fit), "settings": fit.physics()}
        texts["fit.json"] = json.dumps(json_safe(record), indent=2, allow_nan=False) + "\n"
        files = ["scenario.toml", "fit.json", "fit.txt", "residuals.csv"] + (["fit.png"] if png else [])
        files.append("summary.json")
        summary = _summary(scenario, result, fit, status, stats, start_wall, fit_s, plot_error, plot_warnings, files)
        _write(root, scenario, texts, png, summary)
    outcome = RunResult(out_dir=root, status=status, steps_done=int(result.n_steps), summary=summary)
    if not result.converged:
        error = sciax.FitError(
            f"{scenario.name}: the fit did not converge after {result.n_steps} iterations"
            f"{': ' + result.message if result.message else ''} (loss ½Σr² = {stats['loss']:.6g}); its outputs are in "
            f"{root}/ (fit.txt). Try closer starting values ([fit] params), transforms that keep the parameters in "
            "range, a larger [fit] max_steps, or [fit] shooting for long or chaotic series.", result=result)
        error.run_result = outcome
        raise error
    return outcome


def _refuse_foreign_files(root: Path):
    if copied_by_sciax(root / "scenario.toml"):
        return
    clashes = [n for n in FILES if (root / n).exists()]
    if clashes:
        raise ScenarioError(f"the output folder {root} holds {', '.join(clashes)}, which a fit would overwrite, and "
                            "no sciax run wrote them (no scenario.toml copied by sciax there). Choose another folder "
                            "with --out or [output] dir, or move those files away.")


def _write(root: Path, scenario, texts: dict, png: bytes | None, summary: dict):
    """Every output atomically; summary.json last (its presence says the others are whole)."""
    from .. import io as sio

    for stale in [p for n in FILES for p in root.glob(f".{n}.*.tmp")]:
        stale.unlink(missing_ok=True)  # temporaries of a killed run's atomic writes
    (root / "summary.json").unlink(missing_ok=True)
    write_scenario_copy(root / "scenario.toml", scenario)
    for name, text in texts.items():
        with sio.atomic_write(root / name, "w") as f:
            f.write(text)
    if png is None:
        (root / "fit.png").unlink(missing_ok=True)  # an earlier fit's picture must not stand in for this one's
    else:
        sio.atomic_write_bytes(root / "fit.png", png)
    with sio.atomic_write(root / "summary.json", "w") as f:
        json.dump(json_safe(summary), f, indent=2, allow_nan=False)
        f.write("\n")


def _number(x):
    import numpy as np

    a = np.asarray(x, dtype=np.float64)
    return float(a) if a.ndim == 0 else a.tolist()


def _statistics(result, fit: FitSettings) -> dict:
    import numpy as np

    dof = result.n_observations - result.n_parameters
    chi2 = result.chi_square
    errors = np.sqrt(np.diag(np.asarray(result.covariance, dtype=np.float64)))
    state0_se = result.state0_standard_errors
    return {
        "converged": bool(result.converged), "message": result.message, "iterations": int(result.n_steps),
        "params": {k: _number(v) for k, v in result.params.items()},
        "standard_errors": {k: _number(v) for k, v in result.standard_errors.items()},
        "state0": _number(np.concatenate([np.ravel(x) for x in _leaves(result.state0)])),
        "state0_standard_errors": None if state0_se is None else _number(
            np.concatenate([np.ravel(x) for x in _leaves(state0_se)])),
        "labels": list(result.labels), "values": _number(np.asarray(result.optimum)[:len(result.labels)]),
        "errors": errors.tolist(),
        "correlation": _number(result.correlation), "covariance": _number(result.covariance),
        "chi_square_name": "chi2" if fit.sigma_given else "SSE", "chi_square": chi2,
        "loss": float(result.loss), "degrees_of_freedom": dof,
        "reduced_chi_square": chi2 / dof if dof > 0 else None,
        "residual_variance": float(result.residual_variance),
        "noise_sd": None if fit.sigma_given else float(np.sqrt(result.residual_variance)),
        "n_observations": int(result.n_observations), "n_parameters": int(result.n_parameters),
        "unidentifiable": list(result.unidentifiable), "at_bounds": list(result.at_bounds),
        "compilation": result.compilation,
    }


def _leaves(tree):
    import jax

    return jax.tree_util.tree_leaves(tree)


def _data_record(fit: FitSettings) -> dict:
    return {"file": str(fit.path), "sha256": fit.sha256, "rows": len(fit.table.lines), "time": fit.time,
            "columns": {c.name: {"component": c.component, "index": c.index, "transform": c.transform,
                                 "sigma": c.sigma} for c in fit.columns}}


def _model(result, observed, sigma, present):
    """The model the fit compared with each observed entry (NaN where the data are missing), in
    the fitted (transformed) space, from the residuals r = (model − observed)/sigma."""
    import numpy as np

    keep = np.flatnonzero(present.ravel())
    s = np.ones(observed.shape) if sigma is None else sigma
    flat = np.full(observed.size, np.nan)
    residual = np.full(observed.size, np.nan)
    r = np.asarray(result.residuals, dtype=np.float64)
    residual[keep] = r
    flat[keep] = observed.ravel()[keep] + r * s.ravel()[keep]
    return flat.reshape(observed.shape), residual.reshape(observed.shape)


def _residuals_csv(result, fit, times, observed, raw, sigma, present) -> str:
    model, residual = _model(result, observed, sigma, present)
    header = [fit.time]
    for c in fit.columns:
        header += [c.name, f"{c.name}_model", f"{c.name}_residual"]
    lines = [",".join(header)]
    fmt = lambda v: repr(float(v)) if math.isfinite(v) else ""  # noqa: E731  (shortest exact form)
    for i, t in enumerate(times):
        row = [fmt(t)]
        for j, c in enumerate(fit.columns):
            row += [fmt(raw[i, j]), fmt(_inverse(c.transform, model[i, j])), fmt(residual[i, j])]
        lines.append(",".join(row))
    return "\n".join(lines) + "\n"


def _labels(fit: FitSettings) -> list[str]:
    prefix = {"identity": "", "log": "ln ", "log10": "log10 "}
    return [f"{prefix[c.transform]}{c.name}" for c in fit.columns]


def _plot_png(scenario, result, times, observed, present, fit) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import sciax

    title = f"{scenario.name}: {scenario.system_name} fitted to {fit.path.name}"
    if fit.band_samples:
        title += "\nwith the 95% band of the parameter uncertainty"
    fig = sciax.plot_fit(result, times, observed, mask=present, labels=_labels(fit), title=title,
                         n_samples=fit.band_samples)
    fig.axes[-1].set_xlabel(fit.time)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    return buffer.getvalue()


def _fit_text(scenario, result, fit: FitSettings, stats: dict, dtype) -> str:
    import numpy as np

    mapping = ", ".join(f"{c.name} -> {c.component}" + (f" ({c.transform})" if c.transform != "identity" else "")
                        for c in fit.columns)
    rollout = (f"fixed steps: {scenario.integrator_name}, dt = {scenario.run.dt:g}" if scenario.run is not None else
               f"adaptive: {scenario.solve.solver}, rtol = {scenario.solve.rtol:g}, atol = {scenario.solve.atol:g}")
    sigma = ("not given (covariance rescaled by the residual variance)" if not fit.sigma_given else
             ", ".join(f"{c.name}: {c.sigma if not isinstance(c.sigma, str) else 'column ' + c.sigma}"
                       for c in fit.columns))
    lines = [f"{scenario.name}: fit of {scenario.system_name} ({scenario.description})" if scenario.description
             else f"{scenario.name}: fit of {scenario.system_name}",
             f"data: {fit.path} ({len(fit.table.lines)} rows, sha256 {fit.sha256[:16]}...), time column {fit.time!r}",
             f"columns: {mapping}",
             f"sigma: {sigma}",
             f"t0: {fit.t0 if fit.t0 is not None else fit.table.values[fit.time][0]:g}; integration: {rollout}; "
             f"precision: {np.dtype(dtype).name}",
             f"optimiser: {fit.solver}, max_steps = {fit.max_steps}, jacobian = {fit.jacobian}, "
             f"compilation = {result.compilation}"
             + (f"; multiple shooting: {fit.segments} segments (continuity weight {fit.continuity_weight:g})"
                if fit.segments > 1 else ""),
             "", result.summary()]
    if stats["noise_sd"] is not None:
        lines.append(f"noise estimate (sd of the residuals, fitted space): s = {stats['noise_sd']:.4g}")
    return "\n".join(lines) + "\n"


def _summary(scenario, result, fit, status, stats, start_wall, fit_s, plot_error, plot_warnings, files) -> dict:
    import equinox as eqx
    import jax

    from .._version import __version__

    return {
        "scenario": scenario.name, "source": scenario.source, "description": scenario.description, "kind": "fit",
        "status": status, "system": scenario.system_name, "precision": scenario.precision,
        "overrides": scenario.overrides, "data": str(fit.path),
        "fit": {k: stats[k] for k in ("converged", "message", "iterations", "loss", "chi_square_name", "chi_square",
                                      "degrees_of_freedom", "labels", "values", "errors", "unidentifiable")},
        "fit_time_s": fit_s, "wall_time_s": time.monotonic() - start_wall,
        "plot_error": plot_error, "warnings": plot_warnings,
        "backend": jax.default_backend(), "x64_enabled": bool(jax.config.jax_enable_x64),
        "versions": {"sciax": __version__, "jax": jax.__version__, "equinox": eqx.__version__},
        "scenario_hash": scenario.hash(), "files": files,
    }


def report(scenario, result: RunResult) -> list[str]:
    """A short human summary of a fit of `scenario` (`run`'s `result`): its status, iterations,
    χ² (or SSE) and the fitted values ± standard errors."""
    s = result.summary
    f = s["fit"]
    name = _CHI2_TEXT[f["chi_square_name"]]
    dof = f["degrees_of_freedom"]
    lines = [f"{s['scenario']}: {'fitted' if f['converged'] else 'NOT converged'} in {s['wall_time_s']:.2f} s "
             f"({s['precision']}, {s['backend']}): {f['iterations']} iterations, {name} = {f['chi_square']:.6g} "
             f"with {dof} degrees of freedom"]
    if f["message"]:
        lines.append(f"  {f['message']}")
    width = max((len(n) for n in f["labels"]), default=4)
    for label, value, error in zip(f["labels"], f["values"], f["errors"]):
        lines.append(f"  {label:<{width}}  {value: .6g} ± {error:.3g}")
    if f["unidentifiable"]:
        lines.append(f"  not identifiable from these data: {', '.join(f['unidentifiable'])}")
    return lines
