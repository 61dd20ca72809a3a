"""The `[sweep]` job: an ensemble sweep (`sciax.sweep`) described in a scenario file, run in
chunks of members with progress, whole-chunk outputs on disk and `--resume`. The table's
schema is `sweep_settings`' (`parse_settings`), the picture `sweep_plot`'s.

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
from pathlib import Path

import numpy as np

from .. import io as sio
from .._version import __version__
from . import sweep_plot
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
from .run_layout import digest
from .schema import ScenarioError
from .sweep_settings import KIND, SweepSettings, coords_of, member_coords, parse_settings, reduced_dims

__all__ = ["KIND", "MemberOutput", "SweepSettings", "parse_settings", "report", "run"]

CHECKPOINT_FORMAT = "sciax-sweep-checkpoint-1"
MAX_CSV_VALUES = 64
MAX_LISTED_FAILURES = 100


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
                ok = digest(path.read_bytes()) == meta["chunk_digests"][name]
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
                self.digests = {**self.digests, path.name: digest(data.getvalue())}
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
        axes = member_coords(self.job, padded)
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
            failures = [{"index": int(i), **coords_of(job, int(i))} for i in np.flatnonzero(~merged["ok"])]
            reductions = _reductions(job, outputs, ok, self.check_finite)
            if reductions:
                kept = [a for a in job.dims if a not in reduced_dims(job)]
                sio.save_npz(f["reductions_npz"], {"kept_dims": np.array(kept, dtype=str),
                                                   **{f"axis.{a}": job.axes[a] for a in kept},
                                                   **reductions, **({} if times is None else {"times": times})})
                self._reductions_csv(f["reductions_csv"], reductions, kept, times)
                files += [f["reductions_npz"].name, f["reductions_csv"].name]
            if self.sc.output.plot:
                try:
                    plot_note = sweep_plot.plot(self.sc, self.b, outputs, ok, reductions, times, f["plot"])
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
    reduce_axes = tuple(job.dims.index(d) for d in reduced_dims(job))
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
