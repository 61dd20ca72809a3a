"""The host driver for long runs: jitted chunks of the scenario's `Simulate` rollout, progress,
streaming frames to disk, atomic checkpoints, `--resume`, and NaN/Inf reports that name the step.

Files in the output folder (default `runs/<scenario name>/`):

- `scenario.toml`: a copy of the scenario file (with a comment naming any overrides).
- `trajectory.npz`: `times`, the states (`states` or `states.positions`, ...), `observables.<name>`,
  `finite`; read it with `numpy.load` or `sciax.io.load_trajectory`.
- `observables.csv`: time + one column per observable component (when there are observables).
- `states.csv`: time + one column per state component (`[output] states_csv`; by default when
  the state has at most 64 components).
- `plot.png`: a picture of the run (`[output] plot`).
- `summary.json`: status, wall time, steps, steps/s, precision, drift of conserved quantities.
- `checkpoint.npz`, `chunks/`: the integrator's whole loop carry after the last completed chunk
  (the state plus what the integrator keeps between steps; the initial state before the first
  chunk) and the frames of each chunk; `sciax run --resume` continues from them. `chunks/` is
  merged into `trajectory.npz` after every run and may be deleted once a run is complete (the
  run then cannot be extended).

Each chunk is one `simulate` call of `chunk_steps` steps (compiled once; a shorter last chunk
compiles once more). Every chunk continues the global step count: step `n` of the run uses time
`t0 + n dt` and key `jax.random.fold_in(key, n)` whatever the chunking, so a chunked run equals
one `simulate` call of the whole length (states bitwise, in our tests) and a resumed run equals
an uninterrupted one. Write order per chunk: chunk frames (atomic) -> CSV rows (one write, the
sizes recorded) -> checkpoint (atomic). A crash loses at most the chunk in flight; a resume
truncates the CSVs back to the sizes in the checkpoint and deletes chunk files it does not list.

Each chunk continues from the previous chunk's final loop carry (the checkpoint holds it), so
integrators whose carry holds more than the state continue exactly too.

A run holds an exclusive lock on its folder (`fcntl.flock` on `.sciax.lock`; released by the
operating system however the process ends), so a second run into it refuses. The checkpoint
records the size and CRC-32 of every chunk file, and `--resume` verifies them before computing
anything. What the runner guarantees on crashes, signals, concurrent use and damaged or foreign
files, with the tests that show it: `docs/guarantees.md`.
"""

import dataclasses
import io
import json
import sys
import time
import typing
import warnings
import zipfile
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .. import io as sio
from .._compile.async_dispatch import equinox_errors
from .._errors import NonFiniteStateError
from .._simulate import time_resolution_problem
from .._version import __version__
from .folder import (
    FolderLock,
    OutputFolderBusyError,  # noqa: F401  (raised by run: its lock)
    Progress,
    ResumeError,
    RunResult,
    copied_by_sciax,
    diff,
    json_safe,
    write_scenario_copy,
)
from .run_layout import (
    CHECKPOINT_FORMAT,
    STATE_ONLY_FORMAT,
    Layout,
    digest,
    first_frame,
    not_a_sciax_checkpoint,
)
from .scenario import Built, Scenario, ScenarioError
from .scenario_settings import MAX_AUTO_STATE_COLUMNS


class _Chunk(typing.NamedTuple):
    """A dispatched chunk: its first global step, its length and its (possibly not yet computed)
    trajectory, whose `final_carry` the next chunk starts from."""

    offset: int
    n_steps: int
    traj: typing.Any


# --------------------------------------------------------------------------- the run


def run(scenario: Scenario, out_dir=None, *, resume: bool = False, progress: bool = True,
        max_chunks: int | None = None, stream=None) -> RunResult:
    """Run `scenario` in jitted chunks, streaming frames and checkpoints to `out_dir`.

    **Arguments:**

    - `scenario`: a validated `sciax.scenario.Scenario` (`load_scenario(path)`).
    - `out_dir`: output folder (default `[output] dir`, i.e. `runs/<name>`).
    - `resume`: continue from `out_dir/checkpoint.npz` (refused if the scenario's physics
      changed; `n_steps` may grow to extend a run). Without a checkpoint the run starts fresh.
    - `progress`: print a progress line to `stream` (default `sys.stderr`).
    - `max_chunks`: stop (status `"interrupted"`) after this many chunks in this call.

    **Returns:** a `RunResult`.

    **Raises:** `ScenarioError` (bad scenario), `ResumeError` (checkpoint from another scenario),
    `NonFiniteStateError` (the state blew up; `.step`, `.time`, `.frame` and `.out_dir` are set,
    and every finite frame before it is saved).
    """
    stream = sys.stderr if stream is None else stream
    built = scenario.build()
    layout = Layout(Path(out_dir) if out_dir is not None else scenario.output_dir)
    report = Progress(scenario.name, scenario.run.n_steps, stream, progress)
    driver = _Driver(scenario, built, layout, report)
    with FolderLock(layout.root):
        driver.prepare(resume)
        return driver.loop(max_chunks)


class _Driver:
    """State of one `run` call: validate -> prepare (fresh or resume) -> loop -> finalize."""

    def __init__(self, scenario: Scenario, built: Built, layout: Layout, report: Progress):
        self.sc, self.b, self.layout, self.report = scenario, built, layout, report
        rs = scenario.run
        self.dtype = built.dtype
        self.t0 = jnp.asarray(rs.t0, dtype=self.dtype)
        self.int_dtype = jnp.arange(1).dtype
        self.digits = 17 if self.dtype == jnp.float64 else 9
        self.state_names = getattr(built.system, "component_names", None)
        state_cols, _ = sio.frame_columns(_add_frame_axis(built.state0), prefix=self._state_prefix(),
                                          names=self.state_names)
        self.state_columns = state_cols
        want = scenario.output.states_csv
        self.write_states_csv = want is True or (want == "auto" and len(state_cols) <= MAX_AUTO_STATE_COLUMNS)
        self.obs_names = sorted(built.observables)
        self.obs_columns = self._observable_columns()
        self.start_wall = time.monotonic()
        self.session_steps = 0
        self.first_chunk_s = None  # includes compilation
        self.compute_s = 0.0  # time spent in chunks (simulate + writing frames), for steps/s
        self.prior_elapsed = 0.0
        self.prior_compute_s = 0.0  # compute time of the earlier invocations (None: an older checkpoint)
        self.resumed_from = None
        self.warnings = []  # for summary.json

    # -- setup

    def _state_prefix(self) -> str:
        return "y" if isinstance(self.b.state0, jax.Array) else ""

    def _observable_columns(self) -> list[str]:
        shapes = jax.eval_shape(
            lambda s: {k: f(self.t0, s, self.b.system) for k, f in self.b.observables.items()}, self.b.state0)
        cols = []
        for name in self.obs_names:
            cols += sio.frame_columns(np.zeros((1,) + shapes[name].shape), prefix=name)[0]
        return cols

    def prepare(self, resume: bool):
        lay = self.layout
        if lay.root.exists() and not lay.root.is_dir():
            raise ScenarioError(f"the output folder {lay.root} is an existing file, not a folder; choose another "
                                "with --out or [output] dir.")
        if resume and lay.checkpoint.exists():
            self._resume()
            return
        self._refuse_foreign_files()
        if resume:
            self.report.message(f"{self.sc.name}: no checkpoint in {lay.root}; starting from step 0.")
        elif lay.checkpoint.exists():
            self.report.message(f"{self.sc.name}: replacing the previous run in {lay.root} "
                                "(use --resume to continue it instead).")
        self._fresh()

    def _refuse_foreign_files(self):
        """A fresh run replaces the files of a previous run in its folder; files of the same names
        that no sciax run wrote (no sciax checkpoint, no copied scenario) are someone else's: refuse.
        A `checkpoint.npz` counts only if it is a sciax checkpoint (its format string and metadata):
        a file of that name is no proof on its own."""
        lay = self.layout
        if copied_by_sciax(lay.scenario):
            return
        why = "no checkpoint.npz there"
        if lay.checkpoint.exists():
            why = not_a_sciax_checkpoint(lay.checkpoint)
            if why is None:
                return
        clashes = [n for n in lay.FILES.values() if (lay.root / n).exists()]
        if lay.chunk_files():
            clashes.append(f"{lay.chunks.name}/")
        if clashes:
            raise ScenarioError(
                f"the output folder {lay.root} holds {', '.join(clashes)}, which a run would overwrite, and "
                f"no sciax run wrote them ({why}). Choose another folder with --out or "
                "[output] dir, or move those files away.")

    def _fresh(self):
        lay = self.layout
        lay.root.mkdir(parents=True, exist_ok=True)
        for p in [lay.checkpoint, lay.trajectory, lay.summary, lay.plot, lay.observables_csv,
                  lay.states_csv, *lay.chunk_files(), *lay.stale_temporaries()]:
            p.unlink(missing_ok=True)
        self._copy_scenario()
        self.csv_sizes = {}
        if self.obs_columns:
            self.csv_sizes[lay.observables_csv.name] = sio.write_csv_header(lay.observables_csv,
                                                                            ["time", *self.obs_columns])
        if self.write_states_csv:
            self.csv_sizes[lay.states_csv.name] = sio.write_csv_header(lay.states_csv,
                                                                       ["time", *self.state_columns])
        self.state, self.carry = self.b.state0, None
        self.steps_done = 0
        self.chunk_names = []
        self.chunk_digests = {}  # chunk file name -> "size:crc32" of its bytes, checked by --resume
        self._checkpoint()

    def _copy_scenario(self):
        write_scenario_copy(self.layout.scenario, self.sc)

    def _resume(self):
        lay = self.layout
        try:
            (state, carry), meta = self._load_checkpoint()
        except ValueError as e:
            raise ResumeError(f"cannot resume from {lay.checkpoint}: {e} Run without --resume to start over.") \
                from None
        if meta["scenario_hash"] != self.sc.hash() and not self.sc.same_physics(meta["physics"]):
            changes = diff(meta["physics"], self.sc.physics())
            raise ResumeError(
                f"refusing to resume: the scenario {self.sc.source} differs from the one the checkpoint in "
                f"{lay.root} was written for ({'; '.join(changes) or 'contents differ'}). Restore the scenario, "
                "or run without --resume to start over (this replaces the outputs).")
        recorded = meta.get("outputs")
        if recorded is not None:  # compared on what matters now (older checkpoints also recorded `plot`)
            recorded = {k: v for k, v in recorded.items() if k in self._output_settings()}
        if recorded is not None and recorded != self._output_settings():
            changes = diff(recorded, self._output_settings(), "[output] ")
            raise ResumeError(
                f"refusing to resume: the output settings differ from the ones the run in {lay.root} was "
                f"started with ({'; '.join(changes)}), so its files would be incomplete. Restore them, or "
                "run without --resume to start over (this replaces the outputs).")
        if meta["steps_done"] > self.sc.run.n_steps:
            raise ResumeError(
                f"cannot resume: the checkpoint in {lay.root} is at step {meta['steps_done']}, beyond "
                f"n_steps = {self.sc.run.n_steps}; pass --n-steps {meta['steps_done']} or more.")
        for name, size in meta["csv_sizes"].items():
            try:
                sio.truncate_file(lay.root / name, size)
            except (OSError, ValueError) as e:
                raise ResumeError(f"cannot resume: {e} Run without --resume to start over.") from None
        listed = set(meta["chunk_files"])
        for p in lay.chunk_files():
            if p.name not in listed:
                p.unlink()
        missing = [n for n in listed if not (lay.chunks / n).exists()]
        if missing:
            raise ResumeError(f"cannot resume: chunk files {missing[:3]} listed in {lay.checkpoint} are missing "
                              "(were chunks/ deleted?). Run without --resume to start over.")
        self._verify_chunks(meta["chunk_files"], meta["steps_done"], meta.get("chunk_digests", {}))
        # What the finished run wrote from its frames is rewritten when this invocation ends; until then
        # it would describe the earlier, shorter run (a "completed" summary if this invocation dies).
        for p in [*lay.stale_temporaries(), lay.summary, lay.trajectory, lay.plot]:
            p.unlink(missing_ok=True)
        self.state, self.carry = state, carry
        self.steps_done = meta["steps_done"]
        self.chunk_names = list(meta["chunk_files"])
        self.chunk_digests = dict(meta.get("chunk_digests", {}))  # none in older checkpoints
        self.csv_sizes = dict(meta["csv_sizes"])
        self.prior_elapsed = meta.get("elapsed_s", 0.0)
        self.prior_compute_s = meta.get("compute_s")
        self.resumed_from = self.steps_done
        self._copy_scenario()
        self.report.message(f"{self.sc.name}: resuming from step {self.steps_done} of {self.sc.run.n_steps}.")

    def _verify_chunks(self, names, steps_done: int, digests: dict):
        """Refuse (`ResumeError`) unless every chunk file the checkpoint lists is whole: the size
        and CRC-32 of its bytes recorded when it was written (`digests`; older checkpoints have
        none), a readable `.npz` whose members pass their own CRC-32 checks, with the arrays of the
        others, and times that continue the previous chunk's; and the chunks tile the frames
        0 .. steps_done / save_every without gap or overlap. A truncated or damaged chunk was found
        only at the final merge, after computing every remaining chunk."""
        lay, se = self.layout, self.sc.run.save_every
        expected_frame, keys, last_time = 0, None, -np.inf
        for name in names:
            path = lay.chunks / name
            first = first_frame(name)
            try:
                if name in digests and digest(path.read_bytes()) != digests[name]:
                    raise ValueError(f"its size and CRC-32 are {digest(path.read_bytes())}, but "
                                     f"{digests[name]} when it was written")
                with zipfile.ZipFile(path) as z:
                    bad = z.testzip()  # reads every member and checks its CRC-32
                    if bad is not None:
                        raise zipfile.BadZipFile(f"member {bad} fails its CRC-32 check")
                with np.load(path, allow_pickle=False) as data:
                    these = sorted(data.files)
                    times = data["times"]
                if keys is not None and these != keys:
                    raise ValueError(f"it holds {these}, the other chunks {keys}")
                if first != expected_frame:
                    raise ValueError(f"it starts at frame {first}, where frame {expected_frame} was expected")
                if times.ndim != 1 or not np.all(np.diff(times, prepend=last_time) >= 0):
                    raise ValueError("its frame times do not continue the previous chunk's")
            except Exception as e:  # torn, not a zip, a bad CRC, missing arrays, another chunk's frames, ...
                start = max(expected_frame - 1, 0) * se  # the chunk that wrote these frames started there
                raise ResumeError(
                    f"cannot resume: the chunk file {path} is damaged ({type(e).__name__}: {e}); it holds the "
                    f"frames from step {expected_frame * se} on, so the run must be recomputed from step {start}, "
                    f"where the checkpoint (at step {steps_done}) cannot restart it. Run without --resume to "
                    "start over (this replaces the outputs).") from None
            keys, last_time = these, times[-1] if len(times) else last_time
            expected_frame = first + len(times)
        if names and expected_frame != steps_done // se + 1:
            raise ResumeError(
                f"cannot resume: the chunk files in {lay.chunks} hold frames 0 to {expected_frame - 1}, but the "
                f"checkpoint is at step {steps_done} (frame {steps_done // se}); they are not this checkpoint's. "
                "Run without --resume to start over (this replaces the outputs).")

    def _output_settings(self) -> dict:
        """What decides which streamed files a run writes: a resume must keep them (JSON-comparable).
        The plot is drawn from the whole trajectory at the end, so it may be switched on or off."""
        return {"states_csv": self.write_states_csv}

    def _rewind_to_checkpoint(self):
        """After an interruption: forget frames written after the last checkpoint (chunk files,
        CSV rows), so the packaged outputs are exactly what the checkpoint covers."""
        lay = self.layout
        try:
            (state, carry), meta = self._load_checkpoint()
        except (OSError, ValueError):
            return
        self.state, self.carry, self.steps_done = state, carry, meta["steps_done"]
        self.chunk_names = list(meta["chunk_files"])
        self.chunk_digests = dict(meta.get("chunk_digests", {}))
        self.csv_sizes = dict(meta["csv_sizes"])
        for name, size in self.csv_sizes.items():
            try:
                sio.truncate_file(lay.root / name, size)
            except (OSError, ValueError):
                pass  # --resume reports it

    def _load_checkpoint(self):
        """((state, None) or (None, carry), meta) of the checkpoint: a run's first checkpoint (and
        those of older versions) hold the state, later ones the integrator's whole loop carry."""
        path = self.layout.checkpoint
        fmt = sio.checkpoint_meta(path).get("format")
        if fmt == STATE_ONLY_FORMAT:
            state, meta = sio.load_checkpoint(path, like=self.b.state0)
            return (state, None), meta
        if fmt != CHECKPOINT_FORMAT:
            raise ValueError(f"{path} is not a {CHECKPOINT_FORMAT} checkpoint.")
        carry, meta = sio.load_checkpoint(path, like=self._carry_like())
        return (None, carry), meta

    def _carry_like(self):
        """The structure, shapes and dtypes of the loop carry (traced, not run)."""
        return jax.eval_shape(lambda: self._simulate(self.b.state0, None, 0, self.sc.run.save_every).final_carry)

    def _checkpoint(self):
        meta = {"format": CHECKPOINT_FORMAT if self.carry is not None else STATE_ONLY_FORMAT,
                "scenario_hash": self.sc.hash(), "physics": self.sc.physics(),
                "outputs": self._output_settings(),
                "steps_done": self.steps_done, "chunk_files": self.chunk_names, "csv_sizes": self.csv_sizes,
                "chunk_digests": self.chunk_digests, "compute_s": self._total_compute_s(),
                "elapsed_s": self.prior_elapsed + (time.monotonic() - self.start_wall),
                "sciax_version": __version__}
        sio.save_checkpoint(self.layout.checkpoint, self.state if self.carry is None else self.carry, meta)

    def _total_compute_s(self) -> float | None:
        """Compute time of the whole run so far (every invocation, up to now), or None when an
        older checkpoint did not record the earlier invocations'."""
        if self.prior_compute_s is None:
            return None
        clock = getattr(self, "_clock", None)  # the chunk being stored has not been counted yet
        return self.prior_compute_s + self.compute_s + (0.0 if clock is None else time.monotonic() - clock)

    # -- the loop

    def loop(self, max_chunks: int | None) -> RunResult:
        """Chunk k + 1 is queued (its start state is chunk k's final state, still on the device)
        before chunk k's frames are written, so the device computes while the host writes."""
        total, chunk = self.sc.run.n_steps, self.sc.run.chunk_steps
        rs = self.sc.run
        # Checked once for the whole run (each chunk's simulate would warn again, at its own t).
        problem = time_resolution_problem(rs.t0, rs.dt, self.steps_done, total - self.steps_done, rs.save_every,
                                          self.dtype)
        if problem:
            self.warnings.append(problem)
            warnings.warn(f"scenario {self.sc.name!r}: {problem}", RuntimeWarning, stacklevel=3)
        dispatched = 0
        pending = None
        self._clock = time.monotonic()
        try:
            while True:
                offset = self.steps_done if pending is None else pending.offset + pending.n_steps
                queued = None
                if offset < total and (max_chunks is None or dispatched < max_chunks):
                    state, carry = (self.state, self.carry) if pending is None else (None, pending.traj.final_carry)
                    try:
                        queued = self._dispatch(state, carry, offset, min(chunk, total - offset))
                    except Exception:  # e.g. an error_if run at dispatch (CPU), out of memory: keep chunk k
                        if pending is not None:
                            with equinox_errors():
                                self._store(pending)
                        raise
                    dispatched += 1
                if pending is not None:
                    with equinox_errors():  # an eqx.error_if in a system or observable, read here
                        self._store(pending)
                    self.report.update(self.steps_done, self.session_steps, self.compute_s,
                                       final=self.steps_done == total)
                if queued is None:
                    break
                pending = queued
            return self._finalize("completed" if self.steps_done == total else "interrupted")
        except KeyboardInterrupt:  # Ctrl-C: package what the last checkpoint covers, then re-raise
            self.report.message("")
            self._rewind_to_checkpoint()
            self._finalize("completed" if self.steps_done == total else "interrupted")
            raise

    def _dispatch(self, state, carry, offset: int, n_steps: int) -> "_Chunk":
        """Queue one `simulate` call of `n_steps` steps from `state` or, after the first chunk, from
        the previous chunk's loop carry (returns before it has run)."""
        return _Chunk(offset, n_steps, self._simulate(state, carry, offset, n_steps))

    def _simulate(self, state, carry, offset: int, n_steps: int):
        """step_offset: the chunk continues the global step count (time t0 + n dt, key
        fold_in(key, n)), and from the whole carry, so the chunked run is bitwise equal to one
        simulate call over the whole run."""
        rollout = dataclasses.replace(self.b.rollout, n_steps=n_steps)  # the scenario's Simulate, one chunk long
        with warnings.catch_warnings():  # the run's time resolution was checked once in `loop`
            warnings.filterwarnings("ignore", r"simulate: `dt` = .* is not above the spacing", RuntimeWarning)
            return rollout(self.b.system, state, carry0=carry, key=self.b.key,
                           step_offset=jnp.asarray(offset, dtype=self.int_dtype))

    def _store(self, chunk: "_Chunk"):
        """Wait for a dispatched chunk, write its frames and CSV rows, then the checkpoint."""
        se = self.sc.run.save_every
        offset, n_steps, traj = chunk.offset, chunk.n_steps, chunk.traj
        first_frame = offset // se
        # Everything here is read from the chunk's outputs, with no new device computation: on
        # an accelerator that would queue behind the next chunk and wait for it.
        times = np.asarray(traj.times)
        finite = np.asarray(traj.finite)
        keep_from = 0 if offset == 0 else 1  # frame 0 of a later chunk repeats the previous chunk's last
        bad = int(np.flatnonzero(~finite)[0]) if self.sc.run.check_finite and not finite.all() else None
        keep_to = len(times) if bad is None else bad
        sl = slice(keep_from, keep_to)
        states = jtu.tree_map(lambda x: np.asarray(x)[sl], traj.states)
        obs = {k: np.asarray(v)[sl] for k, v in traj.observables.items()}
        if keep_to > keep_from:
            self._write_frames(first_frame + keep_from, times[sl], states, obs, finite[sl])
        if bad is not None:
            self._non_finite(first_frame + bad, float(times[bad]))
        self.state, self.carry = None, traj.final_carry
        self.steps_done = offset + n_steps
        self.session_steps += n_steps
        self._checkpoint()
        # Wall time since the previous chunk was stored: with chunks overlapping, this is each
        # chunk's share of the run (the first includes compilation).
        now = time.monotonic()
        elapsed, self._clock = now - self._clock, now
        self.compute_s += elapsed
        if self.first_chunk_s is None:
            self.first_chunk_s = elapsed

    def _write_frames(self, first_frame, times, states, obs, finite):
        lay = self.layout
        path = lay.chunk_file(first_frame)
        buffer = io.BytesIO()
        np.savez(buffer, **sio.trajectory_arrays(times, states, obs, finite))
        data = buffer.getvalue()
        sio.atomic_write_bytes(path, data)
        self.chunk_names.append(path.name)
        self.chunk_digests[path.name] = digest(data)
        if self.obs_columns:
            _, block = sio.frame_columns([obs[k] for k in self.obs_names])
            rows = np.concatenate([times[:, None].astype(np.float64), block], axis=1)
            self.csv_sizes[lay.observables_csv.name] = sio.append_csv_rows(lay.observables_csv, rows,
                                                                           digits=self.digits)
        if self.write_states_csv:
            _, block = sio.frame_columns(states)
            rows = np.concatenate([times[:, None].astype(np.float64), block], axis=1)
            self.csv_sizes[lay.states_csv.name] = sio.append_csv_rows(lay.states_csv, rows, digits=self.digits)

    def _non_finite(self, frame: int, t: float):
        step = frame * self.sc.run.save_every
        # The summary counts the steps its frames cover (up to the last finite frame), like
        # t_final and n_frames; the checkpoint stays at the last chunk that ended finite.
        self.steps_done = max(step - self.sc.run.save_every, 0)
        self.report.message("")
        summary = self._finalize("non-finite", non_finite={"frame": frame, "step": step, "time": t}).summary
        last = summary["n_frames"] - 1
        err = NonFiniteStateError(
            f"{self.sc.name}: the state became non-finite (NaN/Inf) by step {step} (frame {frame}, t = {t:g}); "
            f"the last finite frame is {last} (step {max(step - self.sc.run.save_every, 0)}). Everything "
            f"before it is saved in {self.layout.root}/ (trajectory.npz, CSV files, summary.json). "
            "Reduce [run] dt or check the initial state and parameters.", frame=frame, time=t)
        err.step = step
        err.out_dir = self.layout.root
        raise err

    # -- outputs

    def _merge(self):
        parts = [sio.load_npz(self.layout.chunks / n) for n in self.chunk_names]
        if not parts:
            return None
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def _finalize(self, status: str, non_finite: dict | None = None) -> RunResult:
        lay = self.layout
        arrays = self._merge()
        files = [lay.scenario.name]
        if arrays is not None:
            sio.save_npz(lay.trajectory, arrays)
            files.append(lay.trajectory.name)
        for p in (lay.observables_csv, lay.states_csv):
            if p.exists():
                files.append(p.name)
        plot_error = None
        if not self.sc.output.plot:
            lay.plot.unlink(missing_ok=True)  # from before a resume with the plot switched off
        if self.sc.output.plot and arrays is not None:
            try:
                self._plot(status, non_finite)
                files.append(lay.plot.name)
            except Exception as e:  # a picture must not cost the run's other outputs
                lay.plot.unlink(missing_ok=True)  # nor may an earlier invocation's picture stand in for it
                plot_error = f"{type(e).__name__}: {e}"
                self.report.message(f"{self.sc.name}: warning: the plot failed ({plot_error}).")
        files += [lay.summary.name, lay.checkpoint.name, lay.chunks.name + "/"]
        summary = self._summary(status, arrays, non_finite, plot_error, files)
        with sio.atomic_write(lay.summary, "w") as f:
            json.dump(json_safe(summary), f, indent=2, allow_nan=False)
            f.write("\n")
        return RunResult(out_dir=lay.root, status=status, steps_done=self.steps_done, summary=summary)

    def _plot(self, status, non_finite):
        from ..plot import plot_trajectory, save_figure

        traj = sio.load_trajectory(self.layout.trajectory)
        title = f"{self.sc.name}: {system_text(self.b.system)}, {self.sc.integrator_name}, " \
                f"dt = {self.sc.run.dt:g}, {self.sc.run.precision}"
        if status != "completed":
            title += f" ({status} at step {non_finite['step'] if non_finite else self.steps_done})"
        # Under a thermostat (stochastic integrator) "conserved" quantities fluctuate: show values.
        conserved = () if self.b.integrator.stochastic else self.b.conserved
        fig = plot_trajectory(traj, system=self.b.system, conserved=conserved, title=title,
                              component_names=self.state_names)
        save_figure(fig, self.layout.plot)

    def _summary(self, status, arrays, non_finite, plot_error, files) -> dict:
        rs = self.sc.run
        wall = time.monotonic() - self.start_wall
        n_frames = 0 if arrays is None else int(arrays["times"].shape[0])
        conserved = {}
        if arrays is not None and not self.b.integrator.stochastic:  # a thermostat does not conserve
            for name in self.b.conserved:
                conserved[name] = sio.drift_summary(arrays[f"observables.{name}"])
        devices = jax.devices()
        return {
            "scenario": self.sc.name, "source": self.sc.source, "description": self.sc.description,
            "status": status, "system": self.sc.system_name, "integrator": self.sc.integrator_name,
            "precision": rs.precision, "dt": rs.dt, "t0": rs.t0,
            "t_final": float(arrays["times"][-1]) if n_frames else None,
            "n_steps": rs.n_steps, "steps_done": self.steps_done, "save_every": rs.save_every,
            "chunk_steps": rs.chunk_steps, "n_frames": n_frames, "overrides": self.sc.overrides,
            "resumed_from_step": self.resumed_from,
            "wall_time_s": wall, "total_wall_time_s": self.prior_elapsed + wall,
            "compute_time_s": self.compute_s, "first_chunk_time_s": self.first_chunk_s,
            "total_compute_time_s": None if self.prior_compute_s is None else self.prior_compute_s + self.compute_s,
            "steps_per_second": self.session_steps / self.compute_s if self.compute_s > 0 else None,
            "conserved": conserved, "non_finite": non_finite, "plot_error": plot_error, "warnings": self.warnings,
            "backend": jax.default_backend(), "devices": [str(d) for d in devices],
            "x64_enabled": bool(jax.config.jax_enable_x64),
            "versions": {"sciax": __version__, "jax": jax.__version__, "equinox": eqx.__version__},
            "scenario_hash": self.sc.hash(), "files": files,
        }


def system_text(system) -> str:
    """`VanDerPol(mu=1000)`: the system's class and its scalar parameters (arrays by shape), for
    plot titles."""
    parts = []
    for field in dataclasses.fields(system):
        value = getattr(system, field.name, None)
        if field.metadata.get("static", False) or value is None or callable(value):
            continue
        shape = np.shape(value)
        if shape == ():
            try:
                parts.append(f"{field.name}={float(value):.4g}")
            except (TypeError, ValueError):
                continue
        elif hasattr(value, "dtype"):
            parts.append(f"{field.name}: {'x'.join(map(str, shape))} values")
    return f"{type(system).__name__}({', '.join(parts)})"


def _add_frame_axis(tree):
    return jtu.tree_map(lambda x: jnp.asarray(x)[None], tree)


def report(scenario: Scenario, result: RunResult) -> list[str]:
    """The lines `sciax run` prints after a run: steps, frames, rate, drift of conserved quantities."""
    s = result.summary
    rate = f", {s['steps_per_second']:.3g} steps/s" if s["steps_per_second"] else ""
    lines = [f"{scenario.name}: {result.status}, {s['steps_done']} steps, {s['n_frames']} frames, "
             f"{s['wall_time_s']:.2f} s{rate} ({s['precision']}, {s['backend']})"]
    if s.get("resumed_from_step") is not None:
        total = s.get("total_compute_time_s")
        whole = f", {total:.2f} s over the whole run" if total is not None else ""
        lines.append(f"  resumed from step {s['resumed_from_step']}: {s['compute_time_s']:.2f} s of compute in this "
                     f"invocation{whole}")
    for name, d in s["conserved"].items():
        if d["max_relative_error"] is not None:
            lines.append(f"  {name}: relative drift {d['final_relative_drift']:.3e} at the end, "
                         f"{d['max_relative_error']:.3e} at most")
        else:
            lines.append(f"  {name}: absolute drift {d['final_abs_drift']:.3e} at the end, "
                         f"{d['max_abs_error']:.3e} at most (initial value ~0)")
    return lines
