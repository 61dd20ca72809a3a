"""The host driver of MD scenarios: chunks of `simulate`, streamed extended XYZ and thermo rows,
neighbour-list regrowth with replay, atomic whole-carry checkpoints, `--resume`, summary and plots.

Files in the output folder (default `runs/<name>/`):

- `scenario.toml`: a copy of the scenario file.
- `trajectory.xyz`: extended XYZ frames every `[output] trajectory_every` steps (ASE, OVITO).
- `thermo.csv`: one row every `thermo_every` steps: step, time, stage, temperature, kinetic,
  potential, total and extended (conserved) energy, pressure, volume, the mean-squared
  displacement since the stage began (and the mean squared end-to-end distance of chains).
- `rdf.csv`: g(r) averaged over the thermo frames of the last stage.
- `summary.json`; `thermo.png`, `rdf.png`, `msd.png` (`[output] plot`).
- `checkpoint.npz`: the integrator's whole loop carry (state, thermostat variables, forces,
  neighbour list and its reference positions) and the unwrapped positions at the start of the
  stage, with a JSON record: the global step, the stage and its step, the neighbour
  capacities, the byte sizes of `trajectory.xyz` and `thermo.csv`, the RDF counts so far.
  Random numbers need no state: stage k's key is `fold_in(key(seed), k)` and step n of the
  stage uses `fold_in(stage key, n)`, whatever the chunking.

Per chunk: `simulate` (frames every `thermo_every` steps; the thermo observable rebuilds the
neighbour list at the frame, so its energies are those of a fresh list); if a buffer overflowed
in the carry or in a frame's rebuild, the capacities grow (`MDSystem.grow`) and the chunk is
replayed from its start carry (`sciax.md.reallocate_carry`); then the XYZ frames and the CSV rows
are appended (one write each, fsynced) and the checkpoint is replaced atomically. A `kill -9`
leaves whole frames and rows up to the last append and a checkpoint at most one chunk older;
`--resume` truncates both files back to the sizes the checkpoint records and continues, bitwise
as the uninterrupted run (CPU).

Units: the scenario's (`[md] units`): reduced LJ (temperature T* = kT/ε, pressure ε/σ³), or real
(Å, eV, amu, ps; temperature in K, pressure in bar).
"""

import dataclasses
import io
import json
import sys
import time
import types
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .. import io as sio
from .._errors import NonFiniteStateError
from .._simulate import simulate
from .._version import __version__
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
from .md_analysis import COLUMNS, FILES, diffusion_of, mean_error, plots, rdf_counts, read_thermo
from .md_scenario import MDScenario
from .scenario import ScenarioError

CHECKPOINT_FORMAT = "sciax-md-checkpoint-1"


def _grouped_row_sums(values):
    """Row sums of `(N, K)` values (K a multiple of `CAPACITY_QUANTUM`) in an order that does not
    depend on K: fixed-width groups of slots, added group after group. Slots past a row's last
    neighbour hold exact zeros, so a larger capacity adds zeros at the end and the sums keep their
    bits."""
    from ..md._regrow import CAPACITY_QUANTUM as Q

    n, k = values.shape
    groups = jnp.sum(values.reshape(n, k // Q, Q), axis=-1)
    total = groups[:, 0]
    for g in range(1, k // Q):
        total = total + groups[:, g]
    return total


def thermo_observable(t, state, system):
    """Per-frame thermodynamics of an `MDState`, for `simulate(observables=...)`.

    The potential energy U = ½ Σ_i Σ_j φ(r_ij) and the virial trace tr W = −2 Σ_i Σ_j φ'(r_ij²) r_ij²
    (φ' the derivative in r², each pair seen from both ends; plus the bonded terms) are summed
    over a neighbour list built afresh at the frame, row by row in groups of slots, so that they
    have the same bits whatever the list's capacity (a multiple of `CAPACITY_QUANTUM`); the list's
    overflow status and requirements come along, so an overflow there is seen too. Single-species
    systems.

    **Returns:** a dict: `kinetic`, `potential`, `virial` (energy units), `overflow` (int32
    bitmask), `required` (int32 `(2 + d,)`).
    """
    from ..md._bonds import bonded_terms

    x = state.positions
    n = x.shape[0]
    neighbours = system.build_neighbours(x)
    lists = neighbours.neighbour_lists()
    valid = lists < n
    dr = system.box.displacement(x[:, None, :], x[jnp.where(valid, lists, 0)])
    r2 = jnp.where(valid, jnp.sum(dr * dr, axis=-1), jnp.inf)

    def phi(r2_):
        return sum(term.pair_energy_r2(r2_) for term in system.pair_terms)

    e, de = jax.jvp(phi, (r2,), (jnp.ones_like(r2),))
    potential = 0.5 * jnp.sum(_grouped_row_sums(e))
    virial = -jnp.sum(_grouped_row_sums(jnp.where(valid, de * jnp.where(valid, r2, 0.0), 0.0)))
    if system.bonded_terms:
        e_b, _, w_b = bonded_terms(system.bonded_terms, system.box, x)
        potential, virial = potential + e_b, virial + jnp.trace(w_b)
    return {"kinetic": system.kinetic_energy(state.velocities), "potential": potential, "virial": virial,
            "overflow": neighbours.overflow, "required": neighbours.required}


@eqx.filter_jit
def _thermostat_energies(integrator, system, states):
    return jax.vmap(lambda s: integrator.thermostat_energy(system, s))(states)


@eqx.filter_jit
def _init(integrator, system, t, state):
    return integrator.init(system, t, state, None)


def _quantised(system):
    """`system` with its neighbour capacity rounded up to a multiple of `CAPACITY_QUANTUM`: the
    forces, and `thermo_observable`'s sums, then have the same bits at any such capacity."""
    from ..md._regrow import CAPACITY_QUANTUM as Q

    caps = _capacities(system)
    caps["capacity"] = -(-caps["capacity"] // Q) * Q
    return _with_capacities(system, caps)


def _capacities(system) -> dict:
    s = system.neighbours
    return {"capacity": s.capacity, "cell_capacity": s.cell_capacity, "grid": list(s.grid)}


def _with_capacities(system, caps: dict):
    from ..md import VerletList

    s = system.neighbours
    return eqx.tree_at(lambda x: x.neighbours, system, VerletList(
        skin=s.skin, capacity=int(caps["capacity"]), cell_capacity=int(caps["cell_capacity"]),
        grid=tuple(int(g) for g in caps["grid"])))


def run_md(scenario: MDScenario, out_dir=None, *, resume: bool = False, progress: bool = True,
           max_chunks: int | None = None, stream=None) -> RunResult:
    """Run an MD scenario in chunks, streaming `trajectory.xyz` and `thermo.csv` to `out_dir`.

    **Arguments:**

    - `scenario`: an `MDScenario` (`sciax.md_scenario.load_md_scenario(path)`).
    - `out_dir`: output folder (default `[output] dir`, i.e. `runs/<name>`).
    - `resume`: continue from `out_dir/checkpoint.npz` (refused if the scenario's physics or
      output intervals changed; the last stage may be made longer). Without a checkpoint the
      run starts fresh.
    - `progress`: print a progress line to `stream` (default `sys.stderr`).
    - `max_chunks`: stop (status `"interrupted"`) after this many chunks in this call.

    **Returns:** a `sciax.runner.RunResult`.

    **Raises:** `ScenarioError` (bad scenario, an output folder holding files no sciax run
    wrote), `ResumeError`, `OutputFolderBusyError`, `NonFiniteStateError` (the run blew up:
    everything up to the last checkpoint is kept), `RuntimeError` (a neighbour buffer that
    growing cannot fix).
    """
    stream = sys.stderr if stream is None else stream
    built = scenario.build()
    root = Path(out_dir) if out_dir is not None else scenario.output_dir
    report = Progress(scenario.name, scenario.n_steps, stream, progress)
    driver = _MDDriver(scenario, built, root, report)
    with FolderLock(root):
        driver.prepare(resume)
        return driver.loop(max_chunks)


class _MDDriver:
    def __init__(self, sc: MDScenario, b, root: Path, report: Progress):
        self.sc, self.b, self.root, self.report = sc, b, root, report
        self.path = {k: root / v for k, v in FILES.items()}
        self.system = _quantised(b.system)
        self.n = b.system.n_particles
        self.dof = 3 * self.n - 3
        self.lengths = np.asarray(b.system.box.lengths, np.float64)
        self.volume = float(np.prod(self.lengths))
        self.digits = 17 if b.dtype == jnp.float64 else 9
        self.columns = COLUMNS + (("end_to_end2",) if b.bond_chains is not None else ())
        self.starts, self.times = sc.stage_starts(), sc.stage_times()
        out = sc.output
        sigma = sc.potential["sigma"]
        self.rdf_max = out.rdf_max if out.rdf_max is not None else min(0.4999 * float(self.lengths.min()),
                                                                        5.0 * sigma)
        self.start_wall = time.monotonic()
        self.compute_s = 0.0
        self.first_chunk_s = None
        self.session_steps = 0
        self.resumed_from = None
        self.prior_compute_s = 0.0
        self.prior_elapsed = 0.0

    # ------------------------------------------------------------------ set-up

    def prepare(self, resume: bool):
        if resume and self.path["checkpoint"].exists():
            self._resume()
            return
        self._refuse_foreign_files()
        if resume:
            self.report.message(f"{self.sc.name}: no checkpoint in {self.root}; starting from step 0.")
        elif self.path["checkpoint"].exists():
            self.report.message(f"{self.sc.name}: replacing the previous run in {self.root} "
                                "(use --resume to continue it instead).")
        self._fresh()

    def _refuse_foreign_files(self):
        if copied_by_sciax(self.path["scenario"]) or self._our_checkpoint():
            return
        clashes = [v for v in FILES.values() if (self.root / v).exists()]
        if clashes:
            raise ScenarioError(
                f"the output folder {self.root} holds {', '.join(clashes)}, which a run would overwrite, and no "
                "sciax run wrote them. Choose another folder with --out or [output] dir, or move those files away.")

    def _our_checkpoint(self) -> bool:
        try:
            return sio.checkpoint_meta(self.path["checkpoint"]).get("format") == CHECKPOINT_FORMAT
        except (OSError, ValueError):
            return False

    def _copy_scenario(self):
        write_scenario_copy(self.path["scenario"], self.sc)

    def _fresh(self):
        self.root.mkdir(parents=True, exist_ok=True)
        for p in self.path.values():
            p.unlink(missing_ok=True)
        for p in self.root.glob(".*.tmp"):
            p.unlink(missing_ok=True)
        self._copy_scenario()
        self.sizes = {FILES["thermo"]: sio.write_csv_header(self.path["thermo"], list(self.columns)),
                      FILES["trajectory"]: 0}
        self.path["trajectory"].write_bytes(b"")
        self.stage, self.local, self.steps_done = 0, 0, 0
        self.regrowths = []
        self.carry = self._init_carry(0, self.b.state0)
        self.reference = self._unwrapped(self.b.state0)
        self.rdf_counts = np.zeros(self.sc.output.rdf_bins, np.int64)
        self.rdf_frames = 0
        self.builds_before = 0
        self.stage_start_extended = {}
        self._checkpoint()

    def _init_carry(self, stage: int, state):
        from ..md import MDState

        state = MDState(state.positions, state.velocities, state.images)  # the new stage's thermostat starts anew
        integrator = self.b.integrators[stage]
        t = jnp.asarray(self.times[stage], self.b.dtype)
        while True:
            carry = _init(integrator, self.system, t, state)
            status = int(np.asarray(carry.neighbours.overflow))
            if status == 0:
                return carry
            self._grow(status, np.asarray(carry.neighbours.required)[None], "stage start")

    def _unwrapped(self, state):
        return np.asarray(state.positions, np.float64) + np.asarray(state.images, np.float64) * self.lengths

    def _carry_like(self, stage: int):
        integrator = self.b.integrators[stage]
        return jax.eval_shape(lambda: integrator.init(self.system, jnp.asarray(0.0, self.b.dtype), self.b.state0,
                                                      None))

    def _resume(self):
        path = self.path["checkpoint"]
        try:
            meta = sio.checkpoint_meta(path)
            if meta.get("format") != CHECKPOINT_FORMAT:
                raise ValueError(f"it is not a {CHECKPOINT_FORMAT} checkpoint (an MD run's).")
        except ValueError as e:
            raise ResumeError(f"cannot resume from {path}: {e} Run without --resume to start over.") from None
        if meta["scenario_hash"] != self.sc.hash():
            changes = diff(meta["physics"], self.sc.physics())
            raise ResumeError(
                f"refusing to resume: the scenario {self.sc.source} differs from the one the checkpoint in "
                f"{self.root} was written for ({'; '.join(changes) or 'contents differ'}). Restore the scenario, or "
                "run without --resume to start over (this replaces the outputs).")
        stage, local = meta["stage"], meta["stage_step"]
        if stage >= len(self.sc.stages) or local > self.sc.stages[stage].n_steps:
            raise ResumeError(f"cannot resume: the checkpoint in {self.root} is at step {meta['steps_done']}, beyond "
                              f"this scenario's {self.sc.n_steps} steps; make the last stage longer (--n-steps).")
        self.system = _with_capacities(self.system, meta["capacities"])
        try:
            (carry, reference), _ = sio.load_checkpoint(path, like=(self._carry_like(stage),
                                                                    jax.ShapeDtypeStruct((self.n, 3), jnp.float64)))
        except ValueError as e:
            raise ResumeError(f"cannot resume from {path}: {e} Run without --resume to start over.") from None
        for name, size in meta["sizes"].items():
            try:
                sio.truncate_file(self.root / name, size)
            except (OSError, ValueError) as e:
                raise ResumeError(f"cannot resume: {e} Run without --resume to start over.") from None
        for key in ("summary", "thermo_plot", "rdf_plot", "msd_plot", "rdf"):
            self.path[key].unlink(missing_ok=True)
        for p in self.root.glob(".*.tmp"):
            p.unlink(missing_ok=True)
        self._restore(meta, carry, reference)
        self.resumed_from = self.steps_done
        self.prior_compute_s = meta.get("compute_s", 0.0)
        self.prior_elapsed = meta.get("elapsed_s", 0.0)
        self._copy_scenario()
        self.report.message(f"{self.sc.name}: resuming from step {self.steps_done} of {self.sc.n_steps}.")

    def _restore(self, meta, carry, reference):
        self.carry, self.reference = carry, np.asarray(reference)
        self.stage, self.local, self.steps_done = meta["stage"], meta["stage_step"], meta["steps_done"]
        self.sizes = dict(meta["sizes"])
        self.rdf_counts = np.asarray(meta["rdf_counts"], np.int64)
        self.rdf_frames = meta["rdf_frames"]
        self.regrowths = list(meta["regrowths"])
        self.builds_before = meta["builds_before"]
        self.stage_start_extended = {int(k): v for k, v in meta["stage_start_extended"].items()}

    def _checkpoint(self):
        meta = {"format": CHECKPOINT_FORMAT, "scenario_hash": self.sc.hash(), "physics": self.sc.physics(),
                "steps_done": self.steps_done, "stage": self.stage, "stage_step": self.local,
                "capacities": _capacities(self.system), "sizes": self.sizes,
                "rdf_counts": self.rdf_counts.tolist(), "rdf_frames": self.rdf_frames,
                "regrowths": self.regrowths, "builds_before": self.builds_before,
                "stage_start_extended": {str(k): v for k, v in self.stage_start_extended.items()},
                "compute_s": self.prior_compute_s + self.compute_s,
                "elapsed_s": self.prior_elapsed + (time.monotonic() - self.start_wall),
                "sciax_version": __version__}
        sio.save_checkpoint(self.path["checkpoint"], (self.carry, jnp.asarray(self.reference, jnp.float64)), meta)

    # ------------------------------------------------------------------ the loop

    def loop(self, max_chunks):
        total = self.sc.n_steps
        chunks = 0
        clock = time.monotonic()
        try:
            while self.steps_done < total and (max_chunks is None or chunks < max_chunks):
                if self.local == self.sc.stages[self.stage].n_steps:  # the next stage begins
                    self.builds_before += int(self.carry.neighbours.n_builds)
                    self.stage, self.local = self.stage + 1, 0
                    self.carry = self._init_carry(self.stage, self.carry.state)
                    self.reference = self._unwrapped(self.carry.state)
                n = min(self.sc.output.chunk_steps, self.sc.stages[self.stage].n_steps - self.local)
                traj = self._chunk(n)
                self._store(traj, n)
                chunks += 1
                now = time.monotonic()
                self.compute_s += now - clock
                if self.first_chunk_s is None:
                    self.first_chunk_s = now - clock
                clock = now
                self.session_steps += n
                self._checkpoint()
                self.report.update(self.steps_done, self.session_steps, self.compute_s,
                                   final=self.steps_done == total)
            return self._finalize("completed" if self.steps_done == total else "interrupted")
        except KeyboardInterrupt:
            self.report.message("")
            self._rewind()
            self._finalize("interrupted")
            raise

    def _rewind(self):
        """After an interruption: back to what the checkpoint covers (files truncated to its sizes)."""
        try:
            meta = sio.checkpoint_meta(self.path["checkpoint"])
        except (OSError, ValueError):
            return
        self.steps_done, self.stage, self.local = meta["steps_done"], meta["stage"], meta["stage_step"]
        self.sizes = dict(meta["sizes"])
        self.rdf_counts = np.asarray(meta["rdf_counts"], np.int64)
        self.rdf_frames = meta["rdf_frames"]
        self.regrowths = list(meta["regrowths"])
        for name, size in self.sizes.items():
            try:
                sio.truncate_file(self.root / name, size)
            except (OSError, ValueError):
                pass

    def _simulate(self, carry, n):
        stage = self.sc.stages[self.stage]
        return simulate(self.system, None, carry0=carry, integrator=self.b.integrators[self.stage],
                        dt=jnp.asarray(stage.dt, self.b.dtype), n_steps=n, save_every=self.sc.output.thermo_every,
                        t0=jnp.asarray(self.times[self.stage], self.b.dtype), key=self.b.keys[self.stage],
                        observables={"thermo": thermo_observable},
                        step_offset=jnp.asarray(self.local, jnp.arange(1).dtype))

    def _chunk(self, n):
        """One chunk; on overflow (the carry's list or a frame's rebuild) grow and replay it."""
        from ..md import reallocate_carry

        carry = self.carry
        while True:
            traj = self._simulate(carry, n)
            thermo = traj.observables["thermo"]
            status = int(np.bitwise_or.reduce(np.concatenate([
                np.ravel(np.asarray(traj.final_carry.neighbours.overflow)), np.ravel(np.asarray(thermo["overflow"]))])))
            if status == 0:
                self.carry = traj.final_carry
                return traj
            required = np.concatenate([np.asarray(traj.final_carry.neighbours.required)[None],
                                       np.asarray(thermo["required"])])
            self._grow(status, required, "chunk")
            carry = reallocate_carry(self.system, carry)

    def _grow(self, status: int, required, where: str):
        """Grow the capacities to what `required` (rows of `Neighbours.required`) asks; log it."""
        from ..md import describe_overflow

        grown = _quantised(self.system.grow(types.SimpleNamespace(required=required)))
        before, after = _capacities(self.system), _capacities(grown)
        if before == after:
            raise RuntimeError(
                f"{self.sc.name}: the neighbour buffers overflowed ({describe_overflow(status)}) in the chunk "
                f"from step {self.steps_done} and growing them does not help (capacities {before}); the box is "
                "too small for the cutoff plus skin, or the run blew up (check dt).")
        self.regrowths.append({"step": self.steps_done, "stage": self.sc.stages[self.stage].name, "in": where,
                               "overflow": describe_overflow(status), "before": before, "after": after})
        self.report.message(f"{self.sc.name}: neighbour buffers overflowed ({describe_overflow(status)}) at step "
                            f"{self.steps_done} ({where}); capacities {before} -> {after}; replaying from step "
                            f"{self.steps_done}.")
        self.system = grown

    def _store(self, traj, n):
        """Append the chunk's thermo rows and XYZ frames (one write each), then advance."""
        from ..md import MDState, write_xyz

        out = self.sc.output
        stage = self.sc.stages[self.stage]
        integrator = self.b.integrators[self.stage]
        thermo = {k: np.asarray(v) for k, v in traj.observables["thermo"].items()}
        states = traj.states
        heat = np.asarray(_thermostat_energies(integrator, self.system, states), np.float64)
        local_steps = self.local + out.thermo_every * np.arange(len(heat))
        kinetic = thermo["kinetic"].astype(np.float64)
        potential = thermo["potential"].astype(np.float64)
        positions = np.asarray(states.positions)
        images = np.asarray(states.images)
        # a run that blew up: NaN/Inf, or positions so large that wrapping them lost the box
        inside = np.all((positions >= 0) & (positions < self.lengths.astype(positions.dtype)), axis=(1, 2))
        finite = np.isfinite(kinetic) & np.isfinite(potential) & inside
        bad = None if finite.all() else int(np.argmax(~finite))
        end = len(heat) if bad is None else bad  # the frames written: up to the first bad one
        extended = kinetic + potential + heat
        if self.local == 0:
            self.stage_start_extended[self.stage] = float(extended[0])
        keep = slice(0 if self.steps_done == 0 else 1, None)  # frame 0 repeats the previous chunk's last
        unwrapped = positions.astype(np.float64) + images.astype(np.float64) * self.lengths
        msd = np.mean(np.sum((unwrapped - self.reference) ** 2, axis=-1), axis=-1)
        cols = [self.starts[self.stage] + local_steps, self.times[self.stage] + local_steps * stage.dt,
                np.full(len(heat), self.stage), 2.0 * kinetic / self.dof / self.b.kT_unit, kinetic, potential,
                kinetic + potential, extended,
                (2.0 * kinetic + thermo["virial"].astype(np.float64)) / (3.0 * self.volume) * self.b.pressure_unit,
                np.full(len(heat), self.volume), msd]
        if self.b.bond_chains is not None:
            ch = self.b.bond_chains
            ends = unwrapped[:, ch[:, -1]] - unwrapped[:, ch[:, 0]]
            cols.append(np.mean(np.sum(ends**2, axis=-1), axis=-1))
        rows = np.stack(cols, axis=1)[keep.start:end]
        if self.stage == len(self.sc.stages) - 1 and bad is None:
            for k in range(keep.start, len(heat)):
                if int(local_steps[k] + self.starts[self.stage]) % out.rdf_every:
                    continue
                self.rdf_counts += rdf_counts(positions[k], self.lengths, self.rdf_max, out.rdf_bins)
                self.rdf_frames += 1
        text = ""
        if out.trajectory_every:
            buffer = io.StringIO()
            for k in range(keep.start, end):
                if int(local_steps[k] + self.starts[self.stage]) % out.trajectory_every:
                    continue
                state = MDState(positions[k], np.asarray(states.velocities[k]), images[k])
                write_xyz(buffer, state.positions, velocities=state.velocities, box=self.system.box,
                          symbols=self.b.symbols, images=images[k] if out.unwrapped else None,
                          time=float(rows[k - keep.start, 1]), step=int(rows[k - keep.start, 0]))
            text = buffer.getvalue()
        if text:
            self.sizes[FILES["trajectory"]] = _append(self.path["trajectory"], text.encode())
        self.sizes[FILES["thermo"]] = sio.append_csv_rows(self.path["thermo"], rows, digits=self.digits)
        if bad is not None:  # the finite frames are written (beyond the checkpoint: --resume drops them)
            self._blew_up(bad, local_steps)
        self.local += n
        self.steps_done += n

    def _blew_up(self, bad, local_steps):
        stage = self.sc.stages[self.stage]
        step = self.starts[self.stage] + int(local_steps[bad])
        self._finalize("non-finite")
        err = NonFiniteStateError(
            f"{self.sc.name}: the run blew up (NaN/Inf, or atoms flung out of the box) by step {step} (stage "
            f"{stage.name!r}); the frames before it are in {self.root}/ (the checkpoint is at step "
            f"{self.steps_done}). Reduce the stage's dt or check the start configuration.",
            frame=bad, time=float(self.times[self.stage] + local_steps[bad] * stage.dt))
        err.step = step
        err.out_dir = self.root
        raise err

    # ------------------------------------------------------------------ outputs

    def _finalize(self, status: str) -> RunResult:
        rows = read_thermo(self.path["thermo"])
        files = [FILES["scenario"], FILES["trajectory"], FILES["thermo"]]
        last = len(self.sc.stages) - 1
        rdf = None
        if self.rdf_frames:
            from ..md import radial_distribution

            counts = self.rdf_counts / self.rdf_frames
            r, g = radial_distribution(counts, r_max=self.rdf_max, n_atoms=self.n, volume=self.volume)
            rdf = (r, g)
            with sio.atomic_write(self.path["rdf"], "w") as f:
                f.write("r,g\n" + "".join(f"{a!r},{b!r}\n" for a, b in zip(r.tolist(), g.tolist())))
            files.append(FILES["rdf"])
        diffusion = diffusion_of(rows, last, self.times[last]) if rows is not None else None
        plot_error = None
        if self.sc.output.plot and rows is not None and len(rows):
            try:
                files += plots(self, rows, rdf, diffusion)
            except Exception as e:  # a picture must not cost the run's other outputs
                plot_error = f"{type(e).__name__}: {e}"
                self.report.message(f"{self.sc.name}: warning: the plots failed ({plot_error}).")
        files += [FILES["summary"], FILES["checkpoint"]]
        summary = self._summary(status, rows, diffusion, plot_error, files)
        with sio.atomic_write(self.path["summary"], "w") as f:
            json.dump(json_safe(summary), f, indent=2, allow_nan=False)
            f.write("\n")
        return RunResult(out_dir=self.root, status=status, steps_done=self.steps_done, summary=summary)

    def _summary(self, status, rows, diffusion, plot_error, files) -> dict:
        sc = self.sc
        wall = time.monotonic() - self.start_wall
        last = len(sc.stages) - 1
        stats, drift = {}, {}
        if rows is not None and len(rows):
            production = rows[rows[:, 2] == last]
            if len(production):
                for name in ("temperature", "pressure", "kinetic", "potential", "total", "extended"):
                    stats[name] = mean_error(production[:, COLUMNS.index(name)])
            for k, stage in enumerate(sc.stages):
                these = rows[rows[:, 2] == k]
                if not len(these):
                    continue
                values = these[:, COLUMNS.index("extended")]
                start = self.stage_start_extended.get(k)
                if start is not None:
                    values = np.concatenate([[start], values])
                d = sio.drift_summary(values)
                d["per_atom_final_abs_drift"] = d["final_abs_drift"] / self.n
                drift[stage.name] = d
        builds = self.builds_before + int(self.carry.neighbours.n_builds)
        compute = self.compute_s
        devices = jax.devices()
        return {
            "scenario": sc.name, "source": sc.source, "description": sc.description, "kind": "md",
            "status": status, "units": sc.units, "precision": sc.precision, "n_atoms": self.n,
            "box": self.lengths.tolist(), "volume": self.volume,
            "stages": [dataclasses.asdict(s) for s in sc.stages],
            "n_steps": sc.n_steps, "steps_done": self.steps_done, "n_frames": 0 if rows is None else len(rows),
            "overrides": sc.overrides, "resumed_from_step": self.resumed_from,
            "wall_time_s": wall, "total_wall_time_s": self.prior_elapsed + wall,
            "compute_time_s": compute, "first_chunk_time_s": self.first_chunk_s,
            "total_compute_time_s": self.prior_compute_s + compute,
            "steps_per_second": self.session_steps / compute if compute > 0 else None,
            "atom_steps_per_second": self.session_steps * self.n / compute if compute > 0 else None,
            "neighbour_list_builds": builds, "neighbour_capacities": _capacities(self.system),
            "regrowths": self.regrowths,
            "production": {"stage": sc.stages[last].name, "mean_and_standard_error": stats,
                           "diffusion_coefficient": diffusion and diffusion["D"],
                           "rdf_frames": self.rdf_frames},
            "conserved": {f"extended energy ({k})": v for k, v in drift.items()},
            "plot_error": plot_error,
            "backend": jax.default_backend(), "devices": [str(d) for d in devices],
            "x64_enabled": bool(jax.config.jax_enable_x64),
            "versions": {"sciax": __version__, "jax": jax.__version__, "equinox": eqx.__version__,
                         "numpy": np.__version__},
            "scenario_hash": sc.hash(), "files": files,
        }


def _append(path, data: bytes) -> int:
    import os

    with open(path, "ab") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
        return f.tell()


run = run_md  # the name every job module of `sciax run` has


def report(scenario: MDScenario, result: RunResult) -> list[str]:
    """The lines `sciax run` prints after an MD run: rate, production means, drift."""
    s = result.summary
    rate = s["atom_steps_per_second"]
    lines = [f"{scenario.name}: {result.status}, {s['steps_done']} steps of {s['n_atoms']} atoms, "
             f"{s['wall_time_s']:.2f} s" + (f", {rate:.3g} atom-steps/s" if rate else "") +
             f" ({s['precision']}, {s['backend']}), {s['neighbour_list_builds']} neighbour-list builds, "
             f"{len(s['regrowths'])} regrowths"]
    for name, v in s["production"]["mean_and_standard_error"].items():
        if name in ("temperature", "pressure", "total"):
            se = v["standard_error"]
            lines.append(f"  {name}: {v['mean']:.6g}" + (f" ± {se:.2g}" if se is not None else ""))
    for name, d in s["conserved"].items():
        if d["final_relative_drift"] is not None:
            lines.append(f"  {name}: relative drift {d['final_relative_drift']:.3e}")
    return lines
