"""The `sciax` command line: `info`, and `run` on a reduced Lorenz scenario whose outputs equal
a direct `simulate` call."""

import importlib.metadata
import json
import os
import pathlib
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import sciax
from sciax.app.cli import main

ROOT = pathlib.Path(__file__).parent.parent
LORENZ = ROOT / "sims" / "lorenz.toml"


def test_info_prints_versions_backend_and_precision():
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    out = subprocess.run([sys.executable, "-m", "sciax", "info"], capture_output=True, text=True,
                         check=True, timeout=120, env=env).stdout
    for fragment in (f"sciax {sciax.__version__}", "jax 0.", "jaxlib ", "equinox ", "diffrax ", "optimistix ",
                     "jax backend: cpu", "devices (", "x64 enabled: False", "default float precision: float32",
                     "cpu count: "):
        assert fragment in out, f"{fragment!r} not in\n{out}"


def test_console_script_is_declared():
    scripts = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="console_scripts")}
    assert scripts.get("sciax") == "sciax.app.cli:main"


def test_help_lists_run_options(capsys):
    with pytest.raises(SystemExit) as info:
        main(["run", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for option in ("--out", "--resume", "--quiet", "--n-steps"):
        assert option in out


def test_run_reduced_lorenz_writes_outputs_equal_to_simulate(tmp_path, capsys):
    assert main(["run", str(LORENZ), "--out", str(tmp_path), "--n-steps", "400"]) == 0
    captured = capsys.readouterr()
    assert "lorenz: completed, 400 steps" in captured.out and "outputs in" in captured.out
    assert "lorenz: 400/400 steps (100.0%)" in captured.err
    for name in ("trajectory.npz", "states.csv", "plot.png", "summary.json", "scenario.toml", "checkpoint.npz"):
        assert (tmp_path / name).is_file(), name
    png = (tmp_path / "plot.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000

    data = np.load(tmp_path / "trajectory.npz")
    ref = sciax.simulate(sciax.systems.Lorenz(rho=28.0), jnp.array([1.0, 1.0, 1.0], dtype=jnp.float64),
                         integrator=sciax.integrators.RK4(), dt=0.005, n_steps=400, save_every=2)
    assert data["states"].dtype == np.float64
    np.testing.assert_array_equal(data["states"], np.asarray(ref.states))
    np.testing.assert_array_equal(data["times"], np.asarray(ref.times))
    csv = np.loadtxt(tmp_path / "states.csv", delimiter=",", skiprows=1)
    np.testing.assert_array_equal(csv[:, 1:], np.asarray(ref.states))

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps_done"] == 400 and summary["n_frames"] == 201
    assert summary["precision"] == "float64" and summary["overrides"] == {"n_steps": 400}
    assert summary["wall_time_s"] > 0 and summary["steps_per_second"] > 0
    assert "command-line overrides: n_steps=400" in (tmp_path / "scenario.toml").read_text()


def test_quiet_run_prints_nothing(tmp_path, capsys):
    assert main(["run", str(LORENZ), "--out", str(tmp_path), "--n-steps", "400", "--quiet"]) == 0
    assert capsys.readouterr() == ("", "")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps_done"] == 400


def test_bad_scenario_exits_2_naming_file_and_key(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text(LORENZ.read_text().replace("dt = 0.005", "dt = 0"))
    assert main(["run", str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: [run] dt: expected a positive finite number, got 0 (integer)" in err
    assert not (tmp_path / "out").exists()


def test_bad_n_steps_override_exits_2(tmp_path, capsys):
    assert main(["run", str(LORENZ), "--out", str(tmp_path), "--n-steps", "401"]) == 2
    assert "--n-steps: expected a multiple of [run] save_every (2)" in capsys.readouterr().err


def test_non_finite_run_exits_1_naming_the_step(tmp_path, capsys):
    blowup = tmp_path / "blowup.toml"
    blowup.write_text('[system]\nname = "HarmonicOscillator"\n[integrator]\nname = "Euler"\n'
                      "[run]\ndt = 1.0\nn_steps = 3000\nsave_every = 10\nchunk_steps = 1000\n"
                      "[output]\nplot = false\n")
    assert main(["run", str(blowup), "--out", str(tmp_path / "out"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "non-finite (NaN/Inf) by step 20" in err and "Everything before it is saved" in err
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["status"] == "non-finite"


def test_run_keeps_compiled_programs_in_the_cache_directory_unless_told_not_to(tmp_path, monkeypatch):
    import jax

    monkeypatch.setenv("SCIAX_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["run", str(LORENZ), "--out", str(tmp_path / "a"), "--n-steps", "400", "--quiet",
                 "--no-compilation-cache"]) == 0
    assert jax.config.jax_compilation_cache_dir != str(tmp_path / "cache")
    assert main(["run", str(LORENZ), "--out", str(tmp_path / "b"), "--n-steps", "400", "--quiet"]) == 0
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "cache")
    assert (tmp_path / "cache").is_dir()
    # JAX's own switch, off, is respected too (enable_compilation_cache() itself switches it on).
    monkeypatch.setenv("SCIAX_CACHE_DIR", str(tmp_path / "cache2"))
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        assert main(["run", str(LORENZ), "--out", str(tmp_path / "c"), "--n-steps", "400", "--quiet"]) == 0
        assert not (tmp_path / "cache2").exists() and not jax.config.jax_enable_compilation_cache
    finally:
        jax.config.update("jax_enable_compilation_cache", True)


def test_ctrl_c_while_reading_the_scenario_exits_130(tmp_path, monkeypatch, capsys):
    import sciax.app.scenario

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sciax.app.scenario, "load_scenario", interrupted)
    assert main(["run", str(LORENZ), "--no-compilation-cache"]) == 130
    assert "interrupted before anything was written" in capsys.readouterr().err


def test_output_folder_errors_are_clear(tmp_path, capsys, monkeypatch):
    """An empty --out (the current folder), an unwritable folder, or `~`: clear messages, no
    tracebacks, `~` expanded."""
    assert main(["run", str(LORENZ), "--out", "", "--no-compilation-cache", "--n-steps", "10"]) == 2
    assert "--out: expected a non-empty folder path" in capsys.readouterr().err
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if not os.access(locked, os.W_OK):  # root ignores permissions
            assert main(["run", str(LORENZ), "--out", str(locked / "run"), "--no-compilation-cache",
                         "--n-steps", "10", "--quiet"]) == 1
            assert "cannot write the outputs" in capsys.readouterr().err
    finally:
        locked.chmod(0o700)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["run", str(LORENZ), "--out", "~/tilde", "--no-compilation-cache", "--n-steps", "10", "--quiet"]) == 0
    assert (tmp_path / "tilde" / "summary.json").exists()


def test_ctrl_c_before_the_first_checkpoint_does_not_claim_outputs(tmp_path, monkeypatch, capsys):
    import sciax.app.runner

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sciax.app.runner, "run", interrupted)
    assert main(["run", str(LORENZ), "--out", str(tmp_path / "never"), "--no-compilation-cache"]) == 130
    assert "interrupted before anything was written" in capsys.readouterr().err


SLOW_LORENZ = """
name = "sigterm"

[system]
name = "Lorenz"

[initial_state]
values = [1.0, 1.0, 1.0]

[integrator]
name = "RK4"

[run]
dt = 0.001
n_steps = 10000000
save_every = 10
chunk_steps = 200
precision = "float64"

[output]
plot = false
"""


def _start_run(scenario, out, *extra):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen([sys.executable, "-m", "sciax", "run", str(scenario), "--out", str(out),
                             "--no-compilation-cache", "--quiet", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait_for_chunks(out, process, n=2, timeout=120.0):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the run ended early: {process.communicate()}")
        if (out / "chunks").is_dir() and len(list((out / "chunks").glob("frames_*.npz"))) >= n:
            return
        time.sleep(0.05)
    process.kill()
    raise AssertionError("the run wrote no chunks in time")


def test_sigterm_writes_the_outputs_so_far_and_an_interrupted_summary_and_exits_143(tmp_path):
    """SIGTERM (batch schedulers, docker stop) left no trajectory.npz or summary.json and printed
    nothing. It is handled as Ctrl-C: package what the last checkpoint covers, say so, exit 143."""
    import signal

    from sciax.io import load_trajectory

    path = tmp_path / "slow.toml"
    path.write_text(SLOW_LORENZ)
    out = tmp_path / "out"
    process = _start_run(path, out)
    _wait_for_chunks(out, process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 143, err
    assert f"sciax run: terminated (SIGTERM); the outputs so far and a checkpoint are in {out}/" in err
    summary = json.loads((out / "summary.json").read_text())
    done = summary["steps_done"]
    assert summary["status"] == "interrupted" and done > 0 and done % 200 == 0
    traj = load_trajectory(out / "trajectory.npz")
    reference = sciax.simulate(sciax.systems.Lorenz(), jnp.array([1.0, 1.0, 1.0]), integrator=sciax.integrators.RK4(),
                               dt=0.001, n_steps=done, save_every=10)
    np.testing.assert_array_equal(traj.states, reference.states)  # exactly what the checkpoint covers
    assert len((out / "states.csv").read_text().splitlines()) == 1 + done // 10 + 1
    assert not (out / ".sciax.lock").exists()
    # and it continues from there
    assert main(["run", str(path), "--out", str(out), "--resume", "--n-steps", str(done + 400), "--quiet",
                 "--no-compilation-cache"]) == 0
    resumed = json.loads((out / "summary.json").read_text())
    assert resumed["status"] == "completed" and resumed["resumed_from_step"] == done


def test_a_second_run_into_a_busy_folder_exits_2_and_a_killed_run_leaves_no_stale_lock(tmp_path, capsys):
    """Two `sciax run --out D` at once both exited 0 with their rows interleaved in states.csv."""
    import signal

    path = tmp_path / "slow.toml"
    path.write_text(SLOW_LORENZ)
    out = tmp_path / "out"
    process = _start_run(path, out)
    try:
        _wait_for_chunks(out, process, n=1)
        before = (out / "states.csv").read_bytes()
        assert main(["run", str(path), "--out", str(out), "--n-steps", "400", "--quiet", "--no-compilation-cache"]) == 2
        err = capsys.readouterr().err
        assert f"error: the output folder {out} is in use by another sciax run (process {process.pid})" in err
        assert (out / "states.csv").read_bytes().startswith(before)  # untouched by the refused run
    finally:
        process.send_signal(signal.SIGKILL)  # a crash: the lock goes with the process
        process.communicate(timeout=60)
    assert main(["run", str(path), "--out", str(out), "--n-steps", "400", "--quiet", "--no-compilation-cache"]) == 0
    times = np.loadtxt(out / "states.csv", delimiter=",", skiprows=1)[:, 0]
    assert len(times) == 41 and np.all(np.diff(times) > 0)


def test_a_run_killed_with_sigkill_resumes_to_the_uninterrupted_result(tmp_path):
    """A crash (SIGKILL: no handler runs) loses at most the chunk in flight: --resume continues
    from the last checkpoint, and the frames equal one uninterrupted simulate call bitwise."""
    import signal

    from sciax.io import load_trajectory

    path = tmp_path / "slow.toml"
    path.write_text(SLOW_LORENZ)
    out = tmp_path / "out"
    process = _start_run(path, out)
    _wait_for_chunks(out, process, n=3)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL
    assert not (out / "summary.json").exists()  # no handler ran
    from sciax.io import checkpoint_meta

    done = checkpoint_meta(out / "checkpoint.npz")["steps_done"]
    total = done + 600
    assert main(["run", str(path), "--out", str(out), "--resume", "--n-steps", str(total), "--quiet",
                 "--no-compilation-cache"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from_step"] == done > 0
    reference = sciax.simulate(sciax.systems.Lorenz(), jnp.array([1.0, 1.0, 1.0]), integrator=sciax.integrators.RK4(),
                               dt=0.001, n_steps=total, save_every=10)
    traj = load_trajectory(out / "trajectory.npz")
    np.testing.assert_array_equal(traj.states, reference.states)
    np.testing.assert_array_equal(traj.times, reference.times)
    rows = np.loadtxt(out / "states.csv", delimiter=",", skiprows=1)
    np.testing.assert_array_equal(rows[:, 1:], reference.states)  # 17 significant digits: exact in float64
