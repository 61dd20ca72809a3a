"""The fit job (`[fit]` in a scenario): the ready fit scenarios end to end, their known answers,
the validation of `[fit]`, and fits of the user's own systems.

Compilation dominates: each test fits one small problem (and draws one band at most).
"""

import inspect
import io
import json
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import sciax
from sciax.app import fit_job
from sciax.app.folder import COPY_HEADER
from sciax.app.scenario import ScenarioError, load_scenario

SIMS = Path(__file__).resolve().parent.parent / "sims"
LYNX_HARE = SIMS / "lotka_volterra_fit.toml"
OSCILLATOR = SIMS / "oscillator_fit.toml"
OSCILLATOR_TRUTH = {"omega": 2.0, "zeta": 0.1, "state0[0]": 1.0}  # sims/data/README.md
OUTPUTS = ["scenario.toml", "fit.json", "fit.txt", "residuals.csv", "summary.json"]


def fit(path, out, *overrides):
    return fit_job.run(load_scenario(path, overrides=list(overrides)), out, progress=False)


def check_outputs(out: Path, *, png: bool, converged: bool = True):
    """Every output is there and parseable; returns (fit.json, residuals.csv as a structured array)."""
    summary = json.loads((out / "summary.json").read_text())
    assert summary["files"] == OUTPUTS[:-1] + (["fit.png"] if png else []) + ["summary.json"]
    assert sorted(p.name for p in out.iterdir()) == sorted(summary["files"])
    assert (out / "scenario.toml").read_text().startswith(COPY_HEADER)
    if png:
        assert (out / "fit.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    record = json.loads((out / "fit.json").read_text())
    table = np.genfromtxt(out / "residuals.csv", delimiter=",", names=True)
    assert f"converged: {converged}" in (out / "fit.txt").read_text()
    return summary, record, table


def test_lotka_volterra_fit_matches_the_python_api(tmp_path):
    """The scenario gives the values of the same fit through `sciax.fit` (examples/fit_lynx_hare.py)."""
    result = fit(LYNX_HARE, tmp_path / "lh", "output.plot=false")
    assert result.status == "completed"
    summary, record, table = check_outputs(tmp_path / "lh", png=False)

    years, lynx, hare = np.loadtxt(SIMS / "data" / "hudson_bay_lynx_hare.csv", delimiter=",", skiprows=2).T
    from sciax.systems import LotkaVolterra

    ref = sciax.fit(LotkaVolterra(alpha=0.5, beta=0.025, gamma=0.9, delta=0.02), jnp.array([30.0, 4.0]), years,
                    np.log(np.stack([hare, lynx], axis=1)), params=("alpha", "beta", "gamma", "delta"),
                    transforms={k: sciax.Positive() for k in ("alpha", "beta", "gamma", "delta", "state0")},
                    fit_initial_state=True, observe=jnp.log, rollout=sciax.Solve(solver="tsit5", rtol=1e-8, atol=1e-8),
                    compilation="fast")
    for name in ("alpha", "beta", "gamma", "delta"):
        np.testing.assert_allclose(record["params"][name], float(ref.params[name]), rtol=1e-6)
        np.testing.assert_allclose(record["standard_errors"][name], float(ref.standard_errors[name]), rtol=1e-5)
    np.testing.assert_allclose(record["state0"], np.asarray(ref.state0), rtol=1e-6)
    np.testing.assert_allclose(record["chi_square"], ref.chi_square, rtol=1e-8)
    np.testing.assert_allclose(record["correlation"], np.asarray(ref.correlation), atol=1e-5)
    assert record["chi_square_name"] == "SSE" and record["degrees_of_freedom"] == 42 - 6
    assert record["iterations"] == result.steps_done and not record["unidentifiable"]
    # residuals.csv: the data in their units, the model, and the fitted (log) residuals
    np.testing.assert_array_equal(table["hare"], hare)
    np.testing.assert_allclose(np.log(table["hare_model"]) - np.log(table["hare"]), table["hare_residual"],
                               rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(np.sum(table["hare_residual"] ** 2 + table["lynx_residual"] ** 2),
                               record["chi_square"], rtol=1e-12)
    lines = fit_job.report(load_scenario(LYNX_HARE), result)
    assert lines[0].startswith("lotka_volterra_fit: fitted in") and any(line.split()[0] == "alpha" for line in lines)


def test_oscillator_fit_recovers_the_truth(tmp_path):
    result = fit(OSCILLATOR, tmp_path / "osc")
    summary, record, table = check_outputs(tmp_path / "osc", png=True)
    assert result.status == summary["status"] == "completed"
    assert record["chi_square_name"] == "chi2" and record["noise_sd"] is None
    for label, truth in OSCILLATOR_TRUTH.items():
        i = record["labels"].index(label)
        assert abs(record["values"][i] - truth) < 2 * record["errors"][i], (label, record["values"][i])
    # with sigma = 0.05 given as a number instead of the x_err column: the same fit
    stream = io.StringIO()
    scalar = fit_job.run(load_scenario(OSCILLATOR, overrides=["fit.sigma=0.05", "output.plot=false"]),
                         tmp_path / "scalar", progress=True, stream=stream)
    np.testing.assert_allclose(scalar.summary["fit"]["values"], record["values"], rtol=1e-10)
    started, ended = stream.getvalue().splitlines()
    assert "compiling" in started and f"converged after {scalar.steps_done} iterations" in ended and "χ²" in ended
    check_outputs(tmp_path / "scalar", png=False)
    # a second fit into the same folder replaces the outputs of the first
    again = fit(OSCILLATOR, tmp_path / "scalar", "fit.sigma=0.05", "output.plot=false")
    assert again.summary["fit"]["values"] == scalar.summary["fit"]["values"]


def test_oscillator_fit_in_float32(tmp_path):
    result = fit(OSCILLATOR, tmp_path / "f32", 'run.precision="float32"', "output.plot=false")
    f = result.summary["fit"]
    assert result.status == "completed" and result.summary["precision"] == "float32"
    for label, truth in OSCILLATOR_TRUTH.items():
        i = f["labels"].index(label)
        assert abs(f["values"][i] - truth) < 3 * f["errors"][i], (label, f["values"][i])


def _cli_runs_fits() -> bool:
    from sciax.app import cli

    return "fit_job" in inspect.getsource(cli)


@pytest.mark.skipif(not _cli_runs_fits(), reason="the CLI does not dispatch [fit] scenarios yet")
def test_cli_runs_the_oscillator_fit(tmp_path, capsys):
    from sciax.app.cli import main

    out = tmp_path / "cli"
    code = main(["run", str(OSCILLATOR), "--out", str(out), "--set", "fit.band_samples=0",
                 "--no-compilation-cache"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert printed.out.startswith("oscillator_fit: fitted in") and "omega" in printed.out
    check_outputs(out, png=True)


# --------------------------------------------------------------------------- invalid [fit] input


@pytest.fixture
def scenario_copy(tmp_path):
    """The oscillator scenario and its data in a folder of their own."""
    (tmp_path / "data").mkdir()
    shutil.copy(SIMS / "data" / "damped_oscillator.csv", tmp_path / "data")
    path = tmp_path / "osc.toml"
    shutil.copy(OSCILLATOR, path)
    return path


@pytest.mark.parametrize("override, fragments", [
    ("fit.sigmaa=0.05", ["[fit]", "unknown key 'sigmaa'", "valid keys are: data, time, columns"]),
    ('fit.max_steps="many"', ["[fit] max_steps", "expected a positive integer", "'many' (string)"]),
    ("fit.max_steps=0", ["[fit] max_steps", "expected a positive integer", "0 (integer)"]),
    ("fit.shooting=500", ["[fit] shooting", "at most one segment per data time (200), got 500"]),
    ('fit.data="data/nope.csv"', ["[fit] data", "no data file 'data/nope.csv'", "looked for", "nope.csv"]),
    ('fit.columns={ xx = "x" }', ["[fit] columns.xx", "no column 'xx'", "its columns: t, x, x_err"]),
    ('fit.time="time"', ["[fit] time", "no column 'time'", "its columns: t, x, x_err"]),
    ('fit.sigma="x_sd"', ["[fit] sigma", "no column 'x_sd'", "its columns: t, x, x_err"]),
    ('fit.params=["omegaa"]', ["[fit] params", "'omegaa' is not a parameter of DampedDrivenOscillator",
                                "its parameters: omega, zeta", "Did you mean 'omega'?"]),
    ('fit.columns={ x = "q" }', ["[fit] columns.x", "DampedDrivenOscillator has no component 'q'",
                                 "its components: x, v"]),
    ('fit.columns={ x = { component = "x", transform = "sqrt" } }',
     ["[fit] columns.x transform", "expected one of 'identity', 'log', 'log10'"]),
    ('fit.columns={ x = { component = "x", transform = "log" } }',
     ["[fit] columns.x transform", "'log' needs positive data", "line"]),
    ('fit.transforms={ drive_amplitude = "positive" }', ["[fit] transforms.drive_amplitude", "not a fitted parameter"]),
    ('fit.transforms={ zeta = { bounded = [1.0, 0.0] } }', ["[fit] transforms.zeta", "finite lower < upper"]),
    ('fit.fit_initial_state=["w"]', ["[fit] fit_initial_state", "no component 'w'"]),
    ("fit.t0=1.0", ["[fit] t0", "at or before the first data time (0)"]),
    ("run.dt=0.03", ["[run] dt", "not on it for dt = 0.03"]),
    ("run.n_steps=100", ["[run] n_steps", "not used by a fit"]),
])
def test_invalid_fit_input_names_the_key(scenario_copy, tmp_path, override, fragments):
    out = tmp_path / "out"
    with pytest.raises(ScenarioError) as info:
        fit_job.run(load_scenario(scenario_copy, overrides=[override]), out, progress=False)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(scenario_copy)), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert not out.exists()


def test_a_problem_sciax_fit_refuses_writes_nothing(scenario_copy, tmp_path):
    """Checked by sciax.fit itself (a start outside its transform's range): still one line, nothing written."""
    out = tmp_path / "out"
    with pytest.raises(ScenarioError) as info:
        fit_job.run(load_scenario(scenario_copy, overrides=["fit.params={ omega = 1.5, zeta = 1.5 }"]), out,
                    progress=False)
    assert "[fit]" in str(info.value) and "zeta" in str(info.value) and "\n" not in str(info.value)
    assert not out.exists()


def test_foreign_files_in_the_output_folder_are_refused(scenario_copy, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "fit.json").write_text("mine")
    with pytest.raises(ScenarioError, match="no sciax run wrote them"):
        fit_job.run(load_scenario(scenario_copy), out, progress=False)
    assert (out / "fit.json").read_text() == "mine"


# --------------------------------------------------------------------------- the user's own systems


DECAY = '''
import equinox as eqx
import jax
import jax.numpy as jnp
from typing import ClassVar
from sciax.systems import AbstractODE


class Decay(AbstractODE):
    """dy/dt = -k y."""

    k: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    component_names: ClassVar[tuple[str, ...]] = ("y",)

    def vector_field(self, t, y, args=None):
        return -self.k * y
'''

DECAY_SCENARIO = '''
name = "decay_fit"
[system]
name = "{name}"
params = {{ k = 0.5 }}
[initial_state]
values = [2.0]
[integrator]
name = "RK4"
[run]
dt = 0.05
[fit]
data = "decay.csv"
time = "t"
columns = {{ amount = "y" }}
params = ["k"]
transforms = {{ k = "positive" }}
[output]
plot = false
'''


def write_decay(tmp_path, form):
    """The Decay system (as module:Class or file.py:Class), its data and scenario, in `tmp_path`."""
    module = f"decay_system_{form}"
    (tmp_path / f"{module}.py").write_text(DECAY)
    t = 0.1 * np.arange(21)
    wiggle = 0.01 * np.sin(7.0 * t)  # deterministic "noise"
    rows = [f"{float(a)!r},{float(b)!r}" for a, b in zip(t, 2.0 * np.exp(-0.7 * t) + wiggle)]
    rows[5] = f"{float(t[5])!r},"  # a missing value: left out of the fit
    (tmp_path / "decay.csv").write_text("# a decaying amount\nt,amount\n" + "\n".join(rows) + "\n")
    name = f"{module}:Decay" if form == "module" else f"{module}.py:Decay"
    path = tmp_path / "decay.toml"
    path.write_text(DECAY_SCENARIO.format(name=name))
    return path


@pytest.mark.parametrize("form", ["module", "file"])
def test_a_user_system_fits(tmp_path, form):
    result = fit_job.run(load_scenario(write_decay(tmp_path, form)), tmp_path / "out", progress=False)
    assert result.status == "completed"
    k, error = result.summary["fit"]["values"][0], result.summary["fit"]["errors"][0]
    assert abs(k - 0.7) < 0.01 and 0 < error < 0.01
    _, record, table = check_outputs(tmp_path / "out", png=False)
    assert record["n_observations"] == 20 and np.isnan(table["amount"][5]) and np.isnan(table["amount_model"][5])


def test_a_fit_that_does_not_converge_writes_its_outputs_and_raises(tmp_path):
    path = write_decay(tmp_path, "file")
    with pytest.raises(sciax.FitError, match="did not converge after 1 iterations") as info:
        fit_job.run(load_scenario(path, overrides=["fit.max_steps=1"]), tmp_path / "out", progress=False)
    summary, record, _ = check_outputs(tmp_path / "out", png=False, converged=False)
    assert info.value.run_result.status == summary["status"] == "not-converged" and not record["converged"]
