"""Sweeps from a scenario file (`[sweep]`, `sciax.app.sweep_job`): the ready scenarios in sims/
at a reduced size agree with direct `sciax.sweep` calls; chunked members are bitwise those of
one call; a SIGKILLed sweep resumes to the bytes of an uninterrupted one; invalid `[sweep]`
input is a one-line error that writes nothing; the user's own systems sweep."""

import json
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciax
from sciax.app import sweep_job
from sciax.app.folder import ResumeError
from sciax.app.scenario import load_scenario
from sciax.app.schema import ScenarioError
from sciax.ensemble import Quantile
from sciax.io import checkpoint_meta, load_npz

ROOT = pathlib.Path(__file__).parent.parent
SIMS = ROOT / "sims"
OUTPUT_FILES = ("members.npz", "members.csv", "reductions.npz", "reductions.csv")


def _run(path, out, overrides, **kwargs):
    return sweep_job.run(load_scenario(path, overrides=overrides), out, progress=False, **kwargs)


def _cli_runs_sweeps() -> bool:
    import inspect

    from sciax.app import cli

    return "sweep_job" in inspect.getsource(cli)


def _csv(path):
    header = path.read_text().splitlines()[0].split(",")
    return header, np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)


def test_sweep_scenarios_are_listed():
    for name in ("lorenz_bifurcation", "double_pendulum_sweep", "seir_uncertainty"):
        sc = load_scenario(SIMS / f"{name}.toml")
        assert sc.kind == "sweep" and sc.name == name and sc.description


def test_lorenz_bifurcation_equals_one_sweep_call_bitwise(tmp_path):
    """Two chunks of 32 (the second padded) give the maxima of one `sciax.sweep` over all of rho."""
    overrides = ["sweep.n=40", "sweep.batch_size=32", "run.n_steps=2000", "sweep.transient=2.0",
                 "sweep.max_peaks=16"]
    result = _run(SIMS / "lorenz_bifurcation.toml", tmp_path / "out", overrides)
    assert result.status == "completed" and result.summary["chunks_done"] == 2
    members = load_npz(tmp_path / "out" / "members.npz")
    rho = np.linspace(1.0, 180.0, 40)
    np.testing.assert_array_equal(members["axis.rho"], rho)

    def maxima(traj):
        z = traj.states[:, 2]
        inner = z[1:-1]
        peak = (inner > z[:-2]) & (inner >= z[2:]) & (traj.times[1:-1] > 2.0)
        first = jnp.argsort(~peak, stable=True)[:16]
        return jnp.where(peak[first], inner[first], jnp.nan)

    direct = sciax.sweep(sciax.systems.Lorenz(sigma=10.0, rho=28.0, beta=2.6666666666666667),
                         jnp.array([1.0, 1.0, 1.0]), axes={"rho": rho}, batch_size=32,
                         rollout=sciax.Simulate(sciax.integrators.RK4(), 0.005, n_steps=2000, save_every=2),
                         output=maxima)
    np.testing.assert_array_equal(members["maxima"], direct.outputs)
    assert members["ok"].all() and tuple(members["dims"]) == ("rho",)
    header, rows = _csv(tmp_path / "out" / "members.csv")
    assert header == ["index", "rho", "ok", *(f"maxima[{i}]" for i in range(16))]  # at most 64 values: in the CSV
    np.testing.assert_array_equal(rows[:, 1], rho)
    np.testing.assert_array_equal(rows[:, 3:], members["maxima"])  # 17 digits: exact in float64
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["members"] == 40 and summary["failed_members"] == 0 and summary["precision"] == "float64"
    assert "plot.png" in summary["files"] and (tmp_path / "out" / "plot.png").stat().st_size > 0


def test_double_pendulum_map_matches_a_grid_sweep(tmp_path):
    overrides = ["sweep.n=6", "sweep.batch_size=32", "run.n_steps=100", "run.save_every=100"]
    _run(SIMS / "double_pendulum_sweep.toml", tmp_path / "out", overrides)
    members = load_npz(tmp_path / "out" / "members.npz")
    f32 = jnp.float32
    angles = np.linspace(-np.pi, np.pi, 6)
    pendulum = sciax.systems.DoublePendulum(mass1=f32(1), mass2=f32(1), length1=f32(1), length2=f32(1),
                                            gravity=f32(9.81))
    direct = sciax.sweep(pendulum, jnp.zeros(4, f32), axes={"state0[0]": angles, "state0[1]": angles},
                         batch_size=32, rollout=sciax.Simulate(sciax.integrators.RK4(), 0.01, n_steps=100,
                                                               save_every=100),
                         output=lambda traj: traj.final_state)
    assert members["final_state"].dtype == np.float32 and members["final_state"].shape == (6, 6, 4)
    np.testing.assert_array_equal(members["final_state"], direct.outputs)
    header, rows = _csv(tmp_path / "out" / "members.csv")
    assert header[:4] == ["index", "state0[0]", "state0[1]", "ok"] and header[5] == "final_state.theta2"
    np.testing.assert_array_equal(rows[:, 4:].astype(np.float32), members["final_state"].reshape(36, 4))
    np.testing.assert_allclose(rows[:, 1], np.repeat(angles, 6), rtol=1e-8)  # 9 digits (float32 run)


def test_seir_band_reductions_match_sciax_sweep(tmp_path):
    overrides = ["sweep.n=40", "sweep.batch_size=32", "run.n_steps=300"]
    sc = load_scenario(SIMS / "seir_uncertainty.toml", overrides=overrides)
    sweep_job.run(sc, tmp_path / "out", progress=False)
    out = tmp_path / "out"
    members, red = load_npz(out / "members.npz"), load_npz(out / "reductions.npz")
    job = sc.job
    direct = sciax.sweep(sciax.systems.SEIR(), jnp.array([0.999, 0.0, 0.001, 0.0]), axes=job.axes, mode="zip",
                         batch_size=32, keep=True,
                         rollout=sciax.Simulate(sciax.integrators.RK4(), 0.1, n_steps=300, save_every=10),
                         output=lambda traj: traj.states,
                         reduce={"mean": "mean", "std": "std", "q": Quantile(list(job.quantiles))})
    np.testing.assert_array_equal(members["states"], direct.outputs)
    np.testing.assert_array_equal(members["times"], np.arange(31.0))
    np.testing.assert_array_equal(red["quantiles.states"], direct.reductions["q"])
    # sciax.sweep merged two chunks' partial sums; the job reduces all members at once
    np.testing.assert_allclose(red["mean.states"], direct.reductions["mean"], rtol=1e-14, atol=1e-17)
    np.testing.assert_allclose(red["std.states"], direct.reductions["std"], rtol=1e-12, atol=1e-17)
    # the samples are those the scenario describes: log-normal about the medians, fixed by the seeds
    assert np.all(job.axes["beta"] > 0) and abs(np.median(job.axes["beta"]) / 0.3 - 1) < 0.1
    header, rows = _csv(out / "reductions.csv")
    assert header[:3] == ["time", "mean.states.S", "mean.states.E"] and "q0.05.states.I" in header
    np.testing.assert_array_equal(rows[:, 0], np.arange(31.0))
    np.testing.assert_array_equal(rows[:, header.index("q0.5.states.I")], red["quantiles.states"][2, :, 2])
    assert (out / "plot.png").exists()


def test_stochastic_members_do_not_depend_on_the_chunking(tmp_path):
    """Without a seed axis member i gets fold_in(key, i) in every chunk, as in one sweep call."""
    path = tmp_path / "ou.toml"
    path.write_text(textwrap.dedent("""
        [system]
        name = "OrnsteinUhlenbeck"
        [initial_state]
        values = [1.0]
        [integrator]
        name = "EulerMaruyama"
        [run]
        dt = 0.01
        n_steps = 50
        save_every = 50
        seed = 7
        observables = []
        [sweep]
        axes = { theta = { start = 0.5, stop = 2.0, n = 40 } }
        batch_size = 32
        plot = "none"
    """))
    _run(path, tmp_path / "out", [])
    members = load_npz(tmp_path / "out" / "members.npz")
    built = load_scenario(path).build()
    direct = sciax.sweep(built.system, built.state0, axes={"theta": np.linspace(0.5, 2.0, 40)}, key=jax.random.key(7),
                         rollout=built.rollout, batch_size=32, output=lambda traj: traj.final_state)
    np.testing.assert_array_equal(members["final_state"], direct.outputs)
    assert len(np.unique(members["final_state"])) == 40


def _start(path, out):
    if _cli_runs_sweeps():
        command = [sys.executable, "-m", "sciax", "run", str(path), "--out", str(out), "--quiet",
                   "--no-compilation-cache"]
    else:  # the command line does not dispatch [sweep] yet: the same call it makes
        command = [sys.executable, "-c", "import sys; from sciax.app import sweep_job; from sciax.app.scenario "
                   "import load_scenario; sweep_job.run(load_scenario(sys.argv[1]), sys.argv[2], progress=False)",
                   str(path), str(out)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


SLOW_SEIR = (SIMS / "seir_uncertainty.toml").read_text().replace("n = 4000 ", "n = 640 ").replace(
    "batch_size = 512", "batch_size = 32").replace("dt = 0.1 ", "dt = 0.03 ").replace(
    "n_steps = 1800 ", "n_steps = 6000 ").replace("save_every = 10 ", "save_every = 200 ")


def test_a_sigkilled_sweep_resumes_to_the_bytes_of_an_uninterrupted_one(tmp_path):
    path = tmp_path / "seir.toml"
    path.write_text(SLOW_SEIR)
    assert load_scenario(path).job.n_members == 640 and load_scenario(path).run.n_steps == 6000
    killed = tmp_path / "killed"
    process = _start(path, killed)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if checkpoint_meta(killed / "checkpoint.npz")["chunk_files"]:
                    break
            except (ValueError, OSError):
                pass
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
    finally:
        process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL, "the sweep ended before it could be killed mid-run"
    meta = checkpoint_meta(killed / "checkpoint.npz")
    assert 0 < meta["members_done"] < 640 and meta["members_done"] % 32 == 0
    # everything the killed run left parses: whole chunks, the checkpoint, the scenario copy
    for name in meta["chunk_files"]:
        chunk = load_npz(killed / "chunks" / name)
        assert len(chunk["index"]) == 32 and chunk["output.states"].shape == (32, 31, 4)
    for p in killed.rglob("*.npz"):
        load_npz(p)
    assert load_scenario(killed / "scenario.toml").job.n_members == 640
    assert not (killed / "summary.json").exists()

    resumed = sweep_job.run(load_scenario(path), killed, resume=True, progress=False)
    assert resumed.status == "completed" and resumed.summary["resumed_from_member"] == meta["members_done"]
    whole = sweep_job.run(load_scenario(path), tmp_path / "whole", progress=False)
    assert whole.summary["resumed_from_member"] is None
    for name in OUTPUT_FILES:
        assert (killed / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    assert sorted(p.name for p in (killed / "chunks").iterdir()) == sorted(
        p.name for p in (tmp_path / "whole" / "chunks").iterdir())


def test_resume_with_a_changed_scenario_is_refused(tmp_path):
    path = SIMS / "lorenz_bifurcation.toml"
    base = ["sweep.n=64", "sweep.batch_size=32", "run.n_steps=200", "sweep.transient=0.1"]
    first = _run(path, tmp_path / "out", base, max_chunks=1)
    assert first.status == "interrupted" and first.summary["members_done"] == 32
    with pytest.raises(ResumeError, match=r"sweep\.axes\.rho\.stop: 180\.0 -> 150\.0"):
        _run(path, tmp_path / "out", [*base, "sweep.axes.rho.stop=150.0"], resume=True)
    with pytest.raises(ResumeError, match="batch_size is 64"):
        _run(path, tmp_path / "out", [*base[:1], "sweep.batch_size=64", *base[2:]], resume=True)
    done = _run(path, tmp_path / "out", base, resume=True)
    assert done.status == "completed" and done.summary["resumed_from_member"] == 32
    assert any("members" in line for line in sweep_job.report(load_scenario(path), done))


@pytest.mark.parametrize("override, fragment", [
    ("sweep.axes.rhoo=[1.0, 2.0]", "[sweep] axes.rhoo: unknown axis 'rhoo'; valid names: sigma, rho, beta, "
                                   "state0[0], state0[1], state0[2], seed. Did you mean 'rho'?"),
    ("sweep.n=\"many\"", "[sweep] n: expected a positive integer, got 'many' (string)."),
    ("sweep.n=0", "[sweep] n: expected a positive integer, got 0 (integer)."),
    ("sweep.axes.rho=[]", "[sweep] axes.rho: expected at least one value, got an axis of zero length ([])."),
    ("sweep.quantiles=[0.5, 1.5]", "[sweep] quantiles: expected a non-empty array of numbers in [0, 1]"),
    ("sweep.reduce=[\"mode\"]", "[sweep] reduce: unknown reduction 'mode'"),
    ("sweep.output=\"everything\"", "[sweep] output: expected one of 'final_state', 'trajectory', 'maxima'"),
    ("sweep.component=\"w\"", "[sweep] component: unknown component 'w' of Lorenz; valid: x, y, z."),
    ("sweep.axes.rho.spacing=\"log\"", None),  # valid: start and stop > 0
    ("sweep.axes.rho.start=-1.0", "[sweep] axes.rho.spacing: a log-spaced axis needs start and stop > 0"),
    ("sweep.axes.seed={ n = 4 }", "[sweep] axes.seed: a seed axis needs a stochastic integrator"),
    ("sweep.batchsize=32", "[sweep]: unknown key 'batchsize'; valid keys are: axes, n, mode"),
])
def test_invalid_sweep_input_is_one_line_naming_the_key(tmp_path, override, fragment):
    path = tmp_path / "lorenz.toml"
    text = (SIMS / "lorenz_bifurcation.toml").read_text()
    if override.startswith("sweep.axes.rho.start"):
        text = text.replace("stop = 180.0 }", "stop = 180.0, spacing = \"log\" }")
    path.write_text(text)
    if fragment is None:
        assert load_scenario(path, overrides=[override]).job.axes["rho"][1] == pytest.approx(180 ** (1 / 799))
        return
    with pytest.raises(ScenarioError) as info:
        load_scenario(path, overrides=[override])
    message = str(info.value)
    assert "\n" not in message and str(path) in message and fragment in message, message


def test_zip_axes_of_different_lengths_and_run_time_checks_write_nothing(tmp_path):
    path = SIMS / "lorenz_bifurcation.toml"
    with pytest.raises(ScenarioError, match=r"\[sweep\] axes: in zip mode every axis must have the same length, got "
                                            r"lengths \{'rho': 800, 'state0\[0\]': 2\}"):
        load_scenario(path, overrides=["sweep.mode=\"zip\"", "sweep.axes.state0[0]=[1.0, 2.0]"])
    out = tmp_path / "out"
    with pytest.raises(ScenarioError, match=r"\[sweep\] devices: expected at most the \d+ local device\(s\), got 4096"):
        _run(path, out, ["sweep.devices=4096"])
    assert not out.exists()
    with pytest.raises(ScenarioError, match=r"\[sweep\] axes: axis 'state0\[7\]': index \[7\] is out of range"):
        _run(path, out, ["sweep.axes.state0[7]=[1.0]"])
    assert not out.exists()


DUFFING = '''
import equinox as eqx
import jax
import jax.numpy as jnp

import sciax


class Duffing(sciax.systems.AbstractODE):
    """x'' + delta x' + alpha x + beta x^3 = gamma cos(omega t); state [x, v]."""

    delta: jax.Array = eqx.field(converter=jnp.asarray, default=0.2)
    alpha: jax.Array = eqx.field(converter=jnp.asarray, default=-1.0)
    beta: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    gamma: jax.Array = eqx.field(converter=jnp.asarray, default=0.3)
    omega: jax.Array = eqx.field(converter=jnp.asarray, default=1.2)

    def vector_field(self, t, y, args=None):
        x, v = y[0], y[1]
        a = -self.delta * v - self.alpha * x - self.beta * x**3 + self.gamma * jnp.cos(self.omega * t)
        return jnp.stack([v, a])

    def default_state(self):
        return jnp.array([1.0, 0.0])
'''


@pytest.mark.parametrize("reference", ["sweep_duffing_mod:Duffing", "duffing.py:Duffing"])
def test_a_users_own_system_sweeps(tmp_path, reference):
    (tmp_path / ("sweep_duffing_mod.py" if ":" in reference and ".py" not in reference else "duffing.py")).write_text(
        DUFFING)
    path = tmp_path / "duffing.toml"
    path.write_text(textwrap.dedent(f"""
        name = "duffing_sweep"
        [system]
        name = "{reference}"
        [integrator]
        name = "RK4"
        [run]
        dt = 0.01
        n_steps = 200
        save_every = 200
        observables = []
        [sweep]
        axes = {{ gamma = {{ start = 0.1, stop = 0.5, n = 5 }}, "state0[0]" = [0.5, 1.0] }}
        batch_size = 32
    """))
    with pytest.raises(ScenarioError, match=r"unknown axis 'gama'; valid names: delta, alpha, beta, gamma, omega"):
        load_scenario(path, overrides=["sweep.axes.gama=[1.0]"])
    result = _run(path, tmp_path / "out", [])
    assert result.status == "completed" and "plot.png" in result.summary["files"]  # a heat map
    members = load_npz(tmp_path / "out" / "members.npz")
    built = load_scenario(path).build()
    direct = sciax.sweep(built.system, built.state0, axes={"gamma": np.linspace(0.1, 0.5, 5),
                                                           "state0[0]": np.array([0.5, 1.0])},
                         rollout=built.rollout, output=lambda traj: traj.final_state)
    np.testing.assert_array_equal(members["final_state"], direct.outputs)


@pytest.mark.skipif(not _cli_runs_sweeps(), reason="the command line does not dispatch [sweep] yet")
def test_sciax_run_runs_a_sweep_scenario(tmp_path, capsys):
    from sciax.app.cli import main

    out = tmp_path / "out"
    code = main(["run", str(SIMS / "double_pendulum_sweep.toml"), "--out", str(out), "--set", "sweep.n=4",
                 "--set", "run.n_steps=100", "--set", "run.save_every=100", "--no-compilation-cache"])
    assert code == 0, capsys.readouterr().err
    assert "16/16 members" in capsys.readouterr().out
    assert load_npz(out / "members.npz")["final_state"].shape == (4, 4, 4)
