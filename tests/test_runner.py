"""The host driver: chunked runs equal one `simulate` call, checkpoints and `--resume`,
refusing a changed scenario, and NaN/Inf reports that keep what was written before."""

import dataclasses
import io
import json

import jax.tree_util as jtu
import numpy as np
import pytest

import sciax
from sciax.app.runner import ResumeError, run
from sciax.app.scenario import parse_scenario
from sciax.io import load_npz, load_trajectory

LORENZ = """
name = "lorenz_test"

[system]
name = "Lorenz"
params = { rho = 28.0 }

[initial_state]
values = [1.0, 1.0, 1.0]

[integrator]
name = "RK4"

[run]
dt = 0.01
n_steps = 400
save_every = 10
chunk_steps = 100
precision = "float64"

[output]
plot = false
"""

LANGEVIN = """
[system]
name = "HarmonicOscillator"

[initial_state]
positions = [1.0]
velocities = [0.0]

[integrator]
name = "LangevinBAOAB"
params = { kT = 0.5, friction = 1.0 }

[run]
dt = 0.05
n_steps = 300
save_every = 5
chunk_steps = 60
seed = 3
observables = ["energy"]

[output]
plot = false
"""

KEPLER = """
[system]
name = "Kepler"

[initial_state]
preset = "orbit"
eccentricity = 0.5

[integrator]
name = "VelocityVerlet"

[run]
dt = 0.01
n_steps = 600
save_every = 20
chunk_steps = 200

[output]
plot = false
"""

# Euler on a harmonic well with dt = 1 multiplies the energy by 2 every step: float64
# overflows (amplitude 2**1024) after about 2,048 steps, in the fifth chunk.
BLOWUP = """
[system]
name = "HarmonicOscillator"

[initial_state]
default = true

[integrator]
name = "Euler"

[run]
dt = 1.0
n_steps = 3000
save_every = 10
chunk_steps = 500

[output]
plot = false
"""


def scenario(text, **run_changes):
    s = parse_scenario(text, "test.toml")
    return dataclasses.replace(s, run=dataclasses.replace(s.run, **run_changes)) if run_changes else s


def direct(s):
    """One `simulate` call over the whole run: the reference."""
    b = s.build()
    return sciax.simulate(b.system, b.state0, integrator=b.integrator, dt=s.run.dt, n_steps=s.run.n_steps,
                          save_every=s.run.save_every, t0=s.run.t0, key=b.key, observables=b.observables)


def assert_same(traj, ref):
    np.testing.assert_array_equal(np.asarray(traj.times), np.asarray(ref.times))
    for a, b in zip(jtu.tree_leaves(traj.states), jtu.tree_leaves(ref.states), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert set(traj.observables) == set(ref.observables)
    for k in ref.observables:
        np.testing.assert_allclose(traj.observables[k], ref.observables[k], rtol=1e-12, atol=0)


@pytest.mark.parametrize("text, t0", [(LORENZ, 0.0), (LORENZ, 0.3), (LANGEVIN, 0.0), (KEPLER, 0.0)],
                         ids=["lorenz-rk4", "lorenz-rk4-t0", "langevin-baoab", "kepler-verlet"])
def test_chunked_run_equals_one_simulate_call(tmp_path, text, t0):
    """Bitwise, frame times included (with t0 != 0 they are t0 + n dt rounded as in simulate)."""
    s = scenario(text, t0=t0)
    result = run(s, tmp_path, progress=False)
    assert result.status == "completed" and result.steps_done == s.run.n_steps
    assert_same(load_trajectory(tmp_path / "trajectory.npz"), direct(s))
    assert len(list((tmp_path / "chunks").iterdir())) == s.run.n_steps // s.run.chunk_steps


def test_result_does_not_depend_on_chunk_size(tmp_path):
    # Stochastic: step n draws fold_in(key, n) whatever chunk it falls in.
    a = run(scenario(LANGEVIN, chunk_steps=60), tmp_path / "a", progress=False)
    b = run(scenario(LANGEVIN, chunk_steps=150), tmp_path / "b", progress=False)
    ta, tb = load_npz(a.out_dir / "trajectory.npz"), load_npz(b.out_dir / "trajectory.npz")
    assert ta.keys() == tb.keys()
    for k in ta:
        np.testing.assert_array_equal(ta[k], tb[k])


def test_outputs_csv_and_summary(tmp_path):
    s = scenario(KEPLER)
    run(s, tmp_path, progress=False)
    header, *rows = (tmp_path / "observables.csv").read_text().splitlines()
    assert header == "time,angular_momentum,energy"
    assert len(rows) == s.run.n_steps // s.run.save_every + 1
    arr = np.loadtxt(tmp_path / "observables.csv", delimiter=",", skiprows=1)
    ref = direct(s)
    np.testing.assert_array_equal(arr[:, 2], np.asarray(ref.observables["energy"]))  # 17 digits round-trip
    states_header = (tmp_path / "states.csv").read_text().splitlines()[0]
    assert states_header == "time,positions[0],positions[1],velocities[0],velocities[1]"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps_done"] == 600
    assert summary["precision"] == "float64" and summary["n_frames"] == 31
    assert summary["conserved"]["energy"]["max_relative_error"] < 1e-3
    assert summary["conserved"]["angular_momentum"]["max_relative_error"] < 1e-12
    assert (tmp_path / "scenario.toml").read_text().endswith(s.text)


def test_csv_rows_are_numpy_savetxt_text(tmp_path):
    """The block formatter writes exactly what `np.savetxt(fmt="%.{digits}g")` writes, signs
    of zero, NaN, infinities and subnormals included, and the rows read back exactly."""
    from sciax.io import append_csv_rows

    rng = np.random.default_rng(0)

    def rows(dtype, exponents):
        values = (rng.standard_normal((50, 4)) * 10.0 ** rng.integers(-exponents, exponents, (50, 4))).astype(dtype)
        values[0] = [-0.0, np.nan, np.inf, -np.inf]
        values[1] = [np.finfo(dtype).smallest_subnormal, -np.finfo(dtype).tiny, 1.0, 0.1]
        return values.astype(np.float64)

    for digits, dtype, exponents in ((17, np.float64, 300), (9, np.float32, 30)):
        values = rows(dtype, exponents)
        path = tmp_path / f"rows{digits}.csv"
        append_csv_rows(path, values[:20], digits=digits)
        size = append_csv_rows(path, values[20:], digits=digits)
        text = path.read_text()
        reference = io.StringIO()
        np.savetxt(reference, values, fmt=f"%.{digits}g", delimiter=",")
        assert text == reference.getvalue() and size == len(text.encode())
        back = np.loadtxt(path, delimiter=",").astype(dtype)  # 17 digits round-trip float64, 9 float32
        np.testing.assert_array_equal(back, values.astype(dtype))
        assert np.signbit(back[0, 0])
    assert append_csv_rows(tmp_path / "empty.csv", np.zeros((0, 3))) == 0


def test_the_next_chunk_is_queued_before_the_previous_chunk_is_written(tmp_path, monkeypatch):
    """The device computes chunk k + 1 while the host writes chunk k: chunk k + 1 is dispatched
    (from chunk k's final state, without waiting for it) before chunk k's frames are written,
    and no chunk beyond `max_chunks` is dispatched."""
    from sciax import _rollout
    from sciax.app import runner

    events = []
    simulate, write = _rollout.simulate, runner._Driver._write_frames  # the scenario's Simulate calls simulate

    def dispatch(*args, step_offset, **kwargs):
        events.append(("dispatch", int(step_offset)))
        return simulate(*args, step_offset=step_offset, **kwargs)

    def written(self, first_frame, *args):
        events.append(("write", int(first_frame) * self.sc.run.save_every))
        return write(self, first_frame, *args)

    monkeypatch.setattr(_rollout, "simulate", dispatch)
    monkeypatch.setattr(runner._Driver, "_write_frames", written)
    s = scenario(LORENZ)
    run(s, tmp_path / "full", progress=False)
    # Steps: chunk k starts at 100 k; a later chunk's first written frame is one save after its start.
    assert events == [("dispatch", 0), ("dispatch", 100), ("write", 0), ("dispatch", 200), ("write", 110),
                      ("dispatch", 300), ("write", 210), ("write", 310)]
    assert_same(load_trajectory(tmp_path / "full" / "trajectory.npz"), direct(s))
    events.clear()
    run(s, tmp_path / "part", progress=False, max_chunks=2)
    assert events == [("dispatch", 0), ("dispatch", 100), ("write", 0), ("write", 110)]


def test_writing_a_chunk_does_not_wait_for_the_next(tmp_path, monkeypatch):
    """Chunk k is written and checkpointed while chunk k + 1 is still running: nothing in the
    store (the final state included) is new device work queued behind the next chunk. Two
    chunks of 10^7 Lorenz steps (~0.25 s each here) with 500 frames each (XLA:CPU runs a program
    inline when its cost analysis finds it cheap; frames make it count)."""
    from sciax.app import runner

    dispatched, at_checkpoint = [], []
    dispatch, checkpoint = runner._Driver._dispatch, runner._Driver._checkpoint

    def recording_dispatch(self, *args):
        dispatched.append(dispatch(self, *args))
        return dispatched[-1]

    def recording_checkpoint(self):
        checkpoint(self)
        if 0 < self.steps_done < self.sc.run.n_steps:  # is the next chunk still running?
            at_checkpoint.append(jtu.tree_leaves(dispatched[-1].traj.states)[0].is_ready())

    monkeypatch.setattr(runner._Driver, "_dispatch", recording_dispatch)
    monkeypatch.setattr(runner._Driver, "_checkpoint", recording_checkpoint)
    text = LORENZ.replace("dt = 0.01", "dt = 1e-7").replace("n_steps = 400", "n_steps = 20000000") \
        .replace("save_every = 10", "save_every = 20000").replace("chunk_steps = 100", "chunk_steps = 10000000")
    run(scenario(text), tmp_path, progress=False)
    assert at_checkpoint == [False]


def test_an_error_when_dispatching_the_next_chunk_keeps_the_previous_chunk(tmp_path, monkeypatch):
    """Dispatch can fail (an `error_if` in a system runs at dispatch on CPU; memory): chunk k,
    already computed, is still written and checkpointed before the error propagates."""
    from sciax.app import runner

    dispatch, calls = runner._Driver._dispatch, []

    def failing_third(self, *args):
        calls.append(1)
        if len(calls) == 3:
            raise MemoryError("out of device memory")
        return dispatch(self, *args)

    monkeypatch.setattr(runner._Driver, "_dispatch", failing_third)
    with pytest.raises(MemoryError):
        run(scenario(LORENZ), tmp_path, progress=False)
    meta = sciax.io.checkpoint_meta(tmp_path / "checkpoint.npz")
    assert meta["steps_done"] == 200  # chunks 0 and 1, computed before the third dispatch failed
    assert len(list((tmp_path / "chunks").iterdir())) == 2


def test_resume_after_interruption_equals_uninterrupted_run(tmp_path):
    s = scenario(LANGEVIN)
    full = run(s, tmp_path / "full", progress=False)
    part = run(s, tmp_path / "part", progress=False, max_chunks=2)
    assert part.status == "interrupted" and part.steps_done == 2 * s.run.chunk_steps
    # A crash during the next chunk: a torn CSV row and a chunk file the checkpoint never saw.
    with open(tmp_path / "part" / "observables.csv", "a") as f:
        f.write("6.05,0.12")
    (tmp_path / "part" / "chunks" / "frames_0000000025.npz").write_bytes(b"torn")
    resumed = run(s, tmp_path / "part", resume=True, progress=False)
    assert resumed.status == "completed" and resumed.summary["resumed_from_step"] == 120
    a, b = load_npz(full.out_dir / "trajectory.npz"), load_npz(resumed.out_dir / "trajectory.npz")
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    for name in ("observables.csv", "states.csv"):
        assert (full.out_dir / name).read_bytes() == (resumed.out_dir / name).read_bytes()


def test_resume_refuses_a_changed_scenario(tmp_path):
    run(scenario(LORENZ), tmp_path, progress=False, max_chunks=1)
    changed = scenario(LORENZ.replace("rho = 28.0", "rho = 30.0"))
    expected = r"refusing to resume: the scenario test.toml differs .*\(system.params.rho: 28.0 -> 30.0\)"
    with pytest.raises(ResumeError, match=expected):
        run(changed, tmp_path, resume=True, progress=False)
    # The refused resume touched nothing: the original scenario still resumes.
    assert run(scenario(LORENZ), tmp_path, resume=True, progress=False).status == "completed"


def test_resume_can_extend_a_finished_run(tmp_path):
    long = scenario(LORENZ)
    run(dataclasses.replace(long, run=dataclasses.replace(long.run, n_steps=200)), tmp_path, progress=False)
    extended = run(long, tmp_path, resume=True, progress=False)
    assert extended.summary["resumed_from_step"] == 200
    assert_same(load_trajectory(tmp_path / "trajectory.npz"), direct(long))


def test_resume_without_checkpoint_starts_fresh(tmp_path):
    assert run(scenario(LORENZ), tmp_path, resume=True, progress=False).status == "completed"


def test_non_finite_state_names_the_step_and_keeps_earlier_output(tmp_path):
    s = scenario(BLOWUP)
    expected = r"non-finite \(NaN/Inf\) by step \d+ \(frame \d+, t = "
    with pytest.raises(sciax.NonFiniteStateError, match=expected) as info:
        run(s, tmp_path, progress=False)
    err = info.value
    assert 2000 < err.step < 2100 and err.step % s.run.save_every == 0 and err.time == pytest.approx(err.step * 1.0)
    traj = load_npz(tmp_path / "trajectory.npz")
    n_good = err.frame  # frames 0 .. frame-1 are finite and all are kept
    assert traj["times"].shape == (n_good,) and np.all(traj["finite"])
    assert np.all(np.isfinite(traj["states.positions"]))
    rows = (tmp_path / "states.csv").read_text().splitlines()
    assert len(rows) == 1 + n_good
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "non-finite" and summary["non_finite"]["step"] == err.step
    # Steps, frames and final time all describe the saved output (steps_done was the last
    # checkpointed chunk's end, which could be 0 with 2,000 finite steps saved).
    last_step = (n_good - 1) * s.run.save_every
    assert summary["n_frames"] == n_good and summary["steps_done"] == last_step
    assert summary["t_final"] == pytest.approx(last_step * 1.0)
    # The frames up to the blow-up equal a direct (finite) simulate call.
    ref = direct(dataclasses.replace(s, run=dataclasses.replace(s.run, n_steps=(n_good - 1) * s.run.save_every)))
    np.testing.assert_array_equal(traj["states.positions"], np.asarray(ref.states.positions))


def test_float32_run_keeps_float32(tmp_path):
    s = scenario(LORENZ, precision="float32")
    run(s, tmp_path, progress=False)
    traj = load_npz(tmp_path / "trajectory.npz")
    assert traj["states"].dtype == np.float32 and traj["times"].dtype == np.float32
    np.testing.assert_array_equal(traj["states"], np.asarray(direct(s).states))


def test_a_run_whose_step_times_round_together_warns_once_and_says_so_in_the_summary(tmp_path):
    """Float32 times near t = 3e7 are 2 apart, so steps of dt = 0.01 round onto each other.
    Each chunk's simulate warned again (four chunks, four warnings, each at its own t, which
    Python does not deduplicate); now the run is checked once, and summary.json records it."""
    s = scenario(LORENZ, precision="float32", t0=3.0e7)
    with pytest.warns(RuntimeWarning) as caught:
        run(s, tmp_path, progress=False)
    messages = [str(w.message) for w in caught if "spacing" in str(w.message)]
    assert len(messages) == 1 and messages[0].startswith("scenario 'lorenz_test': `dt` = 0.01 is not above the "
                                                         "spacing 2 of float32 times near t = 3e+07")
    assert "the saved times are wrong too" in messages[0]  # frames 0.1 apart: they collapse as well
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["warnings"] == [messages[0].split(": ", 1)[1]]
    run(scenario(LORENZ), tmp_path / "plain", progress=False)  # no warning (filterwarnings = error)
    assert json.loads((tmp_path / "plain" / "summary.json").read_text())["warnings"] == []


def test_progress_line(tmp_path, capsys):
    import sys

    run(scenario(LORENZ), tmp_path, progress=True, stream=sys.stderr)
    err = capsys.readouterr().err
    assert "lorenz_test: 400/400 steps (100.0%)" in err and "steps/s" in err and "ETA" in err
    run(scenario(LORENZ), tmp_path, progress=False)
    assert capsys.readouterr().err == ""


# ------------------------------------------------------------- interruptions and changed outputs
def _interrupt_on_call(monkeypatch, name, call):
    """Make `_Driver.<name>` raise KeyboardInterrupt (Ctrl-C) on its `call`-th call."""
    from sciax.app import runner

    original, calls = getattr(runner._Driver, name), []

    def patched(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(runner._Driver, name, patched)


def test_ctrl_c_between_a_chunk_and_its_checkpoint_packages_only_what_the_checkpoint_covers(
        tmp_path, monkeypatch):
    s = scenario(LANGEVIN)
    full = run(s, tmp_path / "full", progress=False)
    # Checkpoint 1 is the fresh run's; checkpoint 3 would cover chunk 2: Ctrl-C after chunk 2's
    # frames (chunk file, CSV rows) were written but before its checkpoint.
    _interrupt_on_call(monkeypatch, "_checkpoint", 3)
    with pytest.raises(KeyboardInterrupt):
        run(s, tmp_path / "part", progress=False)
    part = tmp_path / "part"
    summary = json.loads((part / "summary.json").read_text())
    per_chunk = s.run.chunk_steps // s.run.save_every
    assert summary["status"] == "interrupted" and summary["steps_done"] == s.run.chunk_steps
    assert summary["n_frames"] == per_chunk + 1  # frames of chunk 1 only, as the checkpoint says
    traj = load_npz(part / "trajectory.npz")
    assert traj["times"].shape == (per_chunk + 1,)
    assert len((part / "observables.csv").read_text().splitlines()) == 1 + per_chunk + 1
    monkeypatch.undo()
    resumed = run(s, part, resume=True, progress=False)
    a, b = load_npz(full.out_dir / "trajectory.npz"), load_npz(resumed.out_dir / "trajectory.npz")
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert (full.out_dir / "observables.csv").read_bytes() == (part / "observables.csv").read_bytes()


def test_ctrl_c_while_packaging_a_finished_run_still_writes_the_summary(tmp_path, monkeypatch):
    s = scenario(LORENZ)
    _interrupt_on_call(monkeypatch, "_summary", 1)
    with pytest.raises(KeyboardInterrupt):
        run(s, tmp_path, progress=False)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps_done"] == s.run.n_steps
    assert_same(load_trajectory(tmp_path / "trajectory.npz"), direct(s))


def test_a_resume_that_fails_leaves_no_summary_or_trajectory_of_the_earlier_run(tmp_path, monkeypatch):
    """The finished run's summary said "completed" after a resume that extended it had died,
    and trajectory.npz / plot.png still showed the shorter run. A fresh run removes them; so now
    does a resume, and the next resume rewrites them from the chunks."""
    from sciax.app import runner

    long = scenario(LORENZ)
    short = dataclasses.replace(long, run=dataclasses.replace(long.run, n_steps=200))
    assert run(short, tmp_path, progress=False).status == "completed"
    assert (tmp_path / "summary.json").exists() and (tmp_path / "trajectory.npz").exists()

    def disk_full(self, *args):
        raise OSError("No space left on device")

    monkeypatch.setattr(runner._Driver, "_write_frames", disk_full)
    with pytest.raises(OSError, match="No space left"):
        run(long, tmp_path, resume=True, progress=False)
    assert not (tmp_path / "summary.json").exists() and not (tmp_path / "trajectory.npz").exists()
    monkeypatch.undo()
    resumed = run(long, tmp_path, resume=True, progress=False)
    assert resumed.status == "completed" and resumed.summary["resumed_from_step"] == 200
    assert_same(load_trajectory(tmp_path / "trajectory.npz"), direct(long))


def test_a_plot_that_fails_on_resume_removes_the_earlier_plot(tmp_path, monkeypatch):
    from sciax.app import runner

    with_plot = scenario(LORENZ.replace("plot = false", "plot = true"))
    short = dataclasses.replace(with_plot, run=dataclasses.replace(with_plot.run, n_steps=200))
    run(short, tmp_path, progress=False)
    assert (tmp_path / "plot.png").exists()

    def cannot_draw(self, *args):
        (self.layout.plot).write_bytes(b"half a picture")
        raise RuntimeError("cannot draw")

    monkeypatch.setattr(runner._Driver, "_plot", cannot_draw)
    result = run(with_plot, tmp_path, resume=True, progress=False)
    assert result.status == "completed" and result.summary["plot_error"] == "RuntimeError: cannot draw"
    assert not (tmp_path / "plot.png").exists() and "plot.png" not in result.summary["files"]


def test_a_scenario_with_non_ascii_text_runs_and_its_copy_reloads_under_an_ascii_locale(tmp_path):
    """The scenario copy was written in the locale's encoding and read back as UTF-8: under
    LC_ALL=C a Greek letter aborted the run, and under Latin-1 the copy could not be loaded."""
    import os
    import subprocess
    import sys

    path = tmp_path / "greek.toml"
    path.write_text(LORENZ.replace('name = "lorenz_test"', 'name = "lorenz_test"\ndescription = "σ, ρ, β: é"'),
                    encoding="utf-8")
    script = ("import sys; from sciax.app.runner import run; from sciax.app.scenario import load_scenario\n"
              "run(load_scenario(sys.argv[1]), sys.argv[2], progress=False)\n"
              "print(load_scenario(sys.argv[2] + '/scenario.toml').name)")
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    out = subprocess.run([sys.executable, "-c", script, str(path), str(tmp_path / "out")], env=env,
                         capture_output=True, text=True, encoding="utf-8", timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["lorenz_test"]
    assert "σ, ρ, β: é" in (tmp_path / "out" / "scenario.toml").read_text(encoding="utf-8")


def test_progress_line_on_a_terminal_overwrites_a_longer_previous_line():
    from sciax.app.runner import Progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    progress = Progress("lorenz", 2_000_000, stream, True)
    progress.update(20_000, 20_000, 14.7)  # 1.36e+03 steps/s, ETA 0:24:16
    progress.update(1_000_000, 1_000_000, 20.0)  # 5e+04 steps/s: a shorter line
    screen = ""
    for part in stream.getvalue().split("\r"):  # what a terminal shows after each carriage return
        screen = part + screen[len(part):]
    assert screen.rstrip() == "lorenz: 1000000/2000000 steps ( 50.0%)  5e+04 steps/s  ETA 0:00:20"


def test_resume_refuses_changed_output_settings(tmp_path):
    run(scenario(LORENZ), tmp_path, progress=False, max_chunks=1)
    rows = (tmp_path / "states.csv").read_text()
    changed = scenario(LORENZ.replace("plot = false", "plot = false\nstates_csv = false"))
    with pytest.raises(ResumeError, match=r"output settings differ .*\[output\] states_csv: true -> false"):
        run(changed, tmp_path, resume=True, progress=False)
    assert (tmp_path / "states.csv").read_text() == rows  # untouched
    assert run(scenario(LORENZ), tmp_path, resume=True, progress=False).status == "completed"


def test_resume_names_an_int_that_became_a_float(tmp_path):
    run(scenario(LORENZ.replace("rho = 28.0", "rho = 28")), tmp_path, progress=False, max_chunks=1)
    with pytest.raises(ResumeError, match=r"system.params.rho: 28 -> 28.0"):
        run(scenario(LORENZ), tmp_path, resume=True, progress=False)


def test_truncated_checkpoint_is_a_resume_error(tmp_path):
    run(scenario(LORENZ), tmp_path, progress=False, max_chunks=1)
    ck = tmp_path / "checkpoint.npz"
    ck.write_bytes(ck.read_bytes()[:300])
    with pytest.raises(ResumeError, match="not a readable sciax checkpoint"):
        run(scenario(LORENZ), tmp_path, resume=True, progress=False)


def test_stale_temporary_files_of_a_killed_run_are_removed(tmp_path):
    run(scenario(LORENZ), tmp_path, progress=False, max_chunks=1)
    stale = [tmp_path / ".plot.png.x1y2.tmp", tmp_path / "chunks" / ".frames_0000000010.npz.ab.tmp"]
    for p in stale:
        p.write_bytes(b"half")
    run(scenario(LORENZ), tmp_path, resume=True, progress=False)
    assert not any(p.exists() for p in stale)
    stale[0].write_bytes(b"half")
    mine = tmp_path / ".notes.txt.tmp"  # not the runner's: left alone
    mine.write_text("user file")
    run(scenario(LORENZ), tmp_path, progress=False)  # a fresh run as well
    assert not stale[0].exists() and mine.read_text() == "user file"


def test_thermostatted_run_reports_no_energy_drift(tmp_path):
    summary = run(scenario(LANGEVIN), tmp_path, progress=False).summary
    assert summary["conserved"] == {}  # energy fluctuates under a thermostat: no "drift"


def test_parameter_of_the_wrong_shape_is_a_scenario_error_before_anything_is_written(tmp_path):
    from sciax.app.scenario import ScenarioError

    bad = scenario(LORENZ.replace("rho = 28.0", "rho = [28.0, 1.0]"))
    with pytest.raises(ScenarioError, match=r"\[system\] params: Lorenz\(rho=\[28.0, 1.0\]\) with this "
                                            r"\[initial_state\] and RK4 do not fit together: one step fails"):
        run(bad, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_a_fresh_run_refuses_to_overwrite_files_no_sciax_run_wrote(tmp_path):
    """`[output] dir` pointing at a folder with someone's plot.png/summary.json: refuse, touch
    nothing. A folder a sciax run wrote (checkpoint, or its copied scenario) is replaced."""
    from sciax.app.scenario import ScenarioError

    (tmp_path / "plot.png").write_text("my precious plot")
    (tmp_path / "summary.json").write_text('{"mine": 1}')
    with pytest.raises(ScenarioError, match=r"holds summary.json, plot.png, which a run would overwrite"):
        run(scenario(LORENZ), tmp_path, progress=False)
    assert (tmp_path / "plot.png").read_text() == "my precious plot"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot.png", "summary.json"]
    out = tmp_path / "run"
    run(scenario(LORENZ), out, progress=False)
    (out / "checkpoint.npz").unlink()  # still recognised by its copied scenario
    assert run(scenario(LORENZ), out, progress=False).status == "completed"
    with pytest.raises(ScenarioError, match="is an existing file, not a folder"):
        run(scenario(LORENZ), tmp_path / "plot.png", progress=False)


def test_values_that_break_in_the_run_precision_are_scenario_errors_before_anything_is_written(tmp_path):
    import jax

    from sciax.app.scenario import ScenarioError

    cases = [
        (scenario(LORENZ, dt=1e-50, precision="float32"), r"\[run\] dt: 1e-50 is 0.0 in float32"),
        (scenario(LORENZ, t0=1e39, precision="float32"), r"\[run\] t0: 1e\+39 is inf in float32"),
        (scenario(LANGEVIN, n_steps=2**32 + 5), r"\[run\] n_steps: a stochastic run can take at most 2\*\*32"),
        (scenario(LANGEVIN, seed=2**32), r"\[run\] seed: must be below 2\*\*32"),
        (scenario(KEPLER.replace("eccentricity = 0.5", "eccentricity = 1.5")), r"eccentricity. must be in \[0, 1\)"),
    ]
    for bad, message in cases:
        with pytest.raises(ScenarioError, match=message):
            run(bad, tmp_path / "out", progress=False)
        assert not (tmp_path / "out").exists()
    x64 = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)  # a float32 run in a fresh process: int32 step counters
    try:
        with pytest.raises(ScenarioError, match=r"\[run\] n_steps: 2147483650 steps do not fit the int32"):
            scenario(LORENZ, n_steps=2**31 + 2, precision="float32").build()
    finally:
        jax.config.update("jax_enable_x64", x64)


def test_resume_accepts_what_cannot_change_the_results(tmp_path):
    """Switching the plot on (drawn from the whole trajectory at the end), or a new seed for a
    deterministic integrator (no noise), does not invalidate a checkpoint."""
    run(scenario(LORENZ), tmp_path, progress=False, max_chunks=1)
    changed = scenario(LORENZ.replace("plot = false", "plot = true"), seed=7)
    result = run(changed, tmp_path, resume=True, progress=False)
    assert result.status == "completed" and (tmp_path / "plot.png").exists()
    assert scenario(LANGEVIN).hash() != scenario(LANGEVIN, seed=4).hash()  # noise: the seed matters


def test_resume_accepts_a_checkpoint_that_recorded_the_seed_of_a_deterministic_run(tmp_path, monkeypatch):
    """Checkpoints written before the seed was left out of a deterministic run's physics record
    it (and hash it): resuming them with the unchanged scenario must still work."""
    from sciax.app.scenario import Scenario

    current = Scenario.physics

    def with_seed(self):
        physics = current(self)
        physics["run"]["seed"] = self.run.seed
        return physics

    monkeypatch.setattr(Scenario, "physics", with_seed)
    run(scenario(LORENZ), tmp_path, progress=False, max_chunks=1)
    monkeypatch.setattr(Scenario, "physics", current)
    assert run(scenario(LORENZ), tmp_path, resume=True, progress=False).status == "completed"
    run(scenario(LORENZ), tmp_path / "b", progress=False, max_chunks=1)
    with pytest.raises(ResumeError, match=r"run.dt: 0.01 -> 0.02"):  # a real change is still refused
        run(scenario(LORENZ, dt=0.02), tmp_path / "b", resume=True, progress=False)


def test_running_a_copied_scenario_keeps_one_header(tmp_path):
    run(scenario(LORENZ), tmp_path / "a", progress=False)
    copied = sciax.app.scenario.load_scenario(tmp_path / "a" / "scenario.toml")
    run(copied, tmp_path / "a", progress=False)
    assert (tmp_path / "a" / "scenario.toml").read_text().count("# copied by sciax") == 1


def test_a_second_run_into_the_same_folder_is_refused_while_the_first_runs(tmp_path, monkeypatch):
    """Two runs writing one folder interleaved their CSV rows (time going backwards) and both
    reported success. The second now refuses, naming the folder; the first is unharmed."""
    from sciax.app import runner
    from sciax.app.scenario import ScenarioError

    s = scenario(LORENZ)
    refusals = []
    original = runner._Driver._store

    def store_then_start_another(self, chunk):
        original(self, chunk)
        if not refusals:
            with pytest.raises(ScenarioError, match=rf"the output folder {tmp_path} is in use by another "
                                                            r"sciax run \(process \d+\)") as e:
                run(s, tmp_path, progress=False)
            refusals.append(e.value)
            assert type(e.value).__name__ == "OutputFolderBusyError"

    monkeypatch.setattr(runner._Driver, "_store", store_then_start_another)
    result = run(s, tmp_path, progress=False)
    assert len(refusals) == 1 and result.status == "completed"
    assert_same(load_trajectory(tmp_path / "trajectory.npz"), direct(s))
    times = np.loadtxt(tmp_path / "states.csv", delimiter=",", skiprows=1)[:, 0]
    assert np.all(np.diff(times) > 0) and len(times) == s.run.n_steps // s.run.save_every + 1
    assert not (tmp_path / ".sciax.lock").exists()  # released and removed
    monkeypatch.undo()
    assert run(s, tmp_path, progress=False).status == "completed"  # the folder is free again


def test_a_folder_refused_for_foreign_files_is_left_as_it_was_also_when_created_for_the_lock(tmp_path):
    (tmp_path / "summary.json").write_text('{"mine": 1}')
    from sciax.app.scenario import ScenarioError

    with pytest.raises(ScenarioError, match="no sciax run wrote them"):
        run(scenario(LORENZ), tmp_path, progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


@pytest.mark.parametrize("arrays", [{"weights": np.arange(3.0)},
                                    {"meta": np.array('{"format": "my-format"}'), "state": np.zeros(4, np.uint8)}],
                         ids=["other-arrays", "other-format"])
def test_a_checkpoint_npz_that_sciax_did_not_write_does_not_make_the_folder_sciax_s(tmp_path, arrays):
    """A user's checkpoint.npz, states.csv and summary.json were replaced by a fresh run (exit 0):
    a file named checkpoint.npz was taken as proof that a sciax run owned the folder."""
    from sciax.app.scenario import ScenarioError

    np.savez(tmp_path / "checkpoint.npz", **arrays)
    (tmp_path / "states.csv").write_text("my,data\n1,2\n")
    (tmp_path / "summary.json").write_text('{"mine": 1}')
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ScenarioError, match=r"holds summary.json, states.csv, checkpoint.npz, which a run would "
                                            r"overwrite, and no sciax run wrote them \(its checkpoint.npz"):
        run(scenario(LORENZ), tmp_path, progress=False)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    with pytest.raises(ResumeError):  # nor does --resume take it
        run(scenario(LORENZ), tmp_path, resume=True, progress=False)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.parametrize("text", [KEPLER, LANGEVIN], ids=["verlet", "langevin"])
def test_the_checkpoint_holds_the_integrators_whole_loop_carry(tmp_path, text):
    """After a chunk the checkpoint holds the loop carry (for velocity Verlet and BAOAB the state
    and the reused acceleration), equal bitwise to `simulate`'s final carry at that step; the
    first checkpoint, before any chunk, holds the initial state."""
    s = scenario(text)
    b = s.build()
    fresh = run(s, tmp_path, progress=False, max_chunks=0)
    assert fresh.steps_done == 0
    assert sciax.io.checkpoint_meta(tmp_path / "checkpoint.npz")["format"] == "sciax-checkpoint-1"
    part = run(s, tmp_path, progress=False, max_chunks=2, resume=True)
    meta = sciax.io.checkpoint_meta(tmp_path / "checkpoint.npz")
    assert meta["format"] == "sciax-checkpoint-2" and part.steps_done == meta["steps_done"] == 2 * s.run.chunk_steps
    ref = sciax.simulate(b.system, b.state0, integrator=b.integrator, dt=s.run.dt, n_steps=meta["steps_done"],
                         save_every=s.run.save_every, t0=s.run.t0, key=b.key).final_carry
    carry, _ = sciax.io.load_checkpoint(tmp_path / "checkpoint.npz", like=ref)
    assert isinstance(carry, tuple) and len(carry) == 2  # (state, acceleration)
    for a, c in zip(jtu.tree_leaves(carry), jtu.tree_leaves(ref), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(c))


@pytest.mark.parametrize("damage", ["truncated", "flipped-byte", "replaced"])
def test_a_damaged_chunk_file_is_a_resume_error_before_anything_is_computed(tmp_path, monkeypatch, damage):
    """A truncated chunk was found only at the final merge (a raw BadZipFile after computing every
    remaining chunk, no trajectory or summary, and every later resume failing the same way)."""
    from sciax.app import runner

    s = scenario(LORENZ)
    run(s, tmp_path, progress=False, max_chunks=3)
    chunk = sorted((tmp_path / "chunks").iterdir())[1]  # frames of steps 100..200
    data = chunk.read_bytes()
    if damage == "truncated":
        chunk.write_bytes(data[: len(data) // 2])
    elif damage == "flipped-byte":  # inside the stored `times` array: only the CRC-32 tells
        at = data.index(np.asarray(load_npz(tmp_path / "trajectory.npz")["times"][11]).tobytes())
        chunk.write_bytes(data[:at] + bytes([data[at] ^ 1]) + data[at + 1:])
    else:  # a whole, readable .npz of the same arrays and times, but another run's frames
        other = run(scenario(LORENZ.replace("rho = 28.0", "rho = 27.0")), tmp_path / "other", progress=False,
                    max_chunks=3)
        chunk.write_bytes((other.out_dir / "chunks" / chunk.name).read_bytes())
    dispatched = []
    monkeypatch.setattr(runner._Driver, "_dispatch", lambda self, *a: dispatched.append(a))
    with pytest.raises(ResumeError, match=rf"the chunk file {chunk} is damaged \(.*\); it holds the frames from "
                                          r"step 110 on, so the run must be recomputed from step 100"):
        run(s, tmp_path, resume=True, progress=False)
    assert dispatched == []


def test_resume_after_the_chunk_checks_still_equals_an_uninterrupted_run(tmp_path):
    s = scenario(LANGEVIN)
    run(s, tmp_path, progress=False, max_chunks=2)
    resumed = run(s, tmp_path, resume=True, progress=False)
    assert resumed.status == "completed"
    assert_same(load_trajectory(tmp_path / "trajectory.npz"), direct(s))


def test_after_a_resume_the_summary_reports_the_whole_run_s_compute_time_and_this_invocation_s(tmp_path):
    """After --resume the summary's times covered only the resumed part."""
    s = scenario(LORENZ)
    first = run(s, tmp_path, progress=False, max_chunks=2).summary
    second = run(s, tmp_path, resume=True, progress=False).summary
    assert first["total_compute_time_s"] == first["compute_time_s"]
    assert second["compute_time_s"] > 0 and second["resumed_from_step"] == 200
    # The checkpoint records the compute time up to its own writing, a moment before the first
    # invocation's summary adds the rest of that chunk's bookkeeping.
    assert 0 <= first["compute_time_s"] + second["compute_time_s"] - second["total_compute_time_s"] < 0.25
    assert second["total_compute_time_s"] > second["compute_time_s"]


def test_the_plot_title_names_the_system_s_parameters(tmp_path, monkeypatch):
    """A Van der Pol plot did not say mu."""
    import sciax.plot

    titles = []
    original = sciax.plot.plot_trajectory

    def recording(*args, **kwargs):
        titles.append(kwargs["title"])
        return original(*args, **kwargs)

    monkeypatch.setattr(sciax.plot, "plot_trajectory", recording)
    text = LORENZ.replace("plot = false", "plot = true").replace("rho = 28.0", "rho = 24.5")
    run(scenario(text), tmp_path, progress=False)
    assert titles == ["lorenz_test: Lorenz(sigma=10, rho=24.5, beta=2.667), RK4, dt = 0.01, float64"]


def test_missing_chunk_files_and_a_shortened_csv_are_resume_errors_that_change_nothing(tmp_path):
    s = scenario(LORENZ)
    run(s, tmp_path, progress=False, max_chunks=2)
    chunk = sorted((tmp_path / "chunks").iterdir())[1]
    saved = chunk.read_bytes()
    chunk.unlink()
    with pytest.raises(ResumeError, match=rf"chunk files \['{chunk.name}'\] listed in .*checkpoint.npz are missing"):
        run(s, tmp_path, resume=True, progress=False)
    chunk.write_bytes(saved)
    states_csv = tmp_path / "states.csv"
    states_csv.write_bytes(states_csv.read_bytes()[:-10])
    with pytest.raises(ResumeError, match=r"states.csv is shorter \(\d+ bytes\) than its checkpoint records"):
        run(s, tmp_path, resume=True, progress=False)
    assert (tmp_path / "chunks" / chunk.name).read_bytes() == saved
