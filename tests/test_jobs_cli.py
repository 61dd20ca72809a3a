"""Every job from a scenario file: `--set` overrides, `sciax list`, `sciax validate`, the flags
that set keys (`--seed`, `--precision`, `--devices`), the user's own systems (`module:Class`,
`file.py:Class`), and `[solve]` scenarios against SciPy."""

import json
import pathlib
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest

import sciax
from sciax.app.cli import main
from sciax.app.scenario import load_scenario, parse_scenario
from sciax.app.schema import ScenarioError

ROOT = pathlib.Path(__file__).parent.parent
SIMS = ROOT / "sims"
LORENZ = SIMS / "lorenz.toml"
ROBERTSON = SIMS / "robertson_stiff.toml"

DUFFING = textwrap.dedent('''
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
            return jnp.stack([v, -self.delta * v - self.alpha * x - self.beta * x**3
                              + self.gamma * jnp.cos(self.omega * t)])

        def default_state(self):
            return jnp.array([1.0, 0.0])


    class NotASystem(eqx.Module):
        rate: float = 1.0
''')


def _duffing_scenario(system_name: str, how: str) -> str:
    integrate = ('[integrator]\nname = "RK4"\n[run]\ndt = 0.01\nn_steps = 200\nsave_every = 10\n' if how == "run"
                 else '[solve]\nsolver = "dopri8"\nt1 = 2.0\nn_save = 21\nrtol = 1e-10\natol = 1e-12\n')
    return (f'name = "duffing"\n[system]\nname = "{system_name}"\nparams = {{ delta = 0.1 }}\n'
            f"[initial_state]\nvalues = [1.0, 0.0]\n{integrate}[output]\nplot = false\n")


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "mysystems.py").write_text(DUFFING)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("mysystems", None)


# --------------------------------------------------------------------------- --set


def test_set_overrides_are_toml_values_validated_like_the_file():
    text = LORENZ.read_text()
    s = parse_scenario(text, "lorenz.toml", overrides=["run.dt=0.01", "system.params.rho=24.5", "run.n_steps=100",
                                                       'run.precision="float32"', "output.plot=false"])
    assert (s.run.dt, s.system_params["rho"], s.run.n_steps, s.run.precision, s.output.plot) == \
        (0.01, 24.5, 100, "float32", False)
    assert s.overrides == {"run.dt": 0.01, "system.params.rho": 24.5, "run.n_steps": 100,
                           "run.precision": "float32", "output.plot": False}
    assert s.hash() != parse_scenario(text, "lorenz.toml").hash()
    bare = parse_scenario(text, "lorenz.toml", overrides=["integrator.name=Heun"])  # a bare word is a string
    assert bare.integrator_name == "Heun"


def test_set_key_paths_follow_toml_quoting():
    from sciax.app.schema import parse_toml

    data = parse_toml("[sweep]\n", "x.toml", ['sweep.axes."state0[0]"=[1.0, 2.0]', "sweep.axes.state0[1]=[3.0]",
                                               'system.params."spring.k"=2.0', 'output.dir="a=b"'])
    assert data["sweep"]["axes"] == {"state0[0]": [1.0, 2.0], "state0[1]": [3.0]}
    assert data["system"]["params"] == {"spring.k": 2.0} and data["output"]["dir"] == "a=b"


@pytest.mark.parametrize("override, fragments", [
    ("run.dtt=0.01", ["[run]: unknown key 'dtt'", "valid keys are: dt, n_steps"]),
    ("run.dt=-1", ["[run] dt", "expected a positive finite number, got -1 (integer)"]),
    ('run.n_steps="many"', ["[run] n_steps", "expected a positive integer, got 'many' (string)"]),
    ("system.params.rhoo=1.0", ["[system] params.rhoo", "valid parameters: sigma, rho, beta", "Did you mean 'rho'"]),
    ("run.dt", ["--set: expected key.path=value"]),
    ("run..dt=1", ["expected a dotted key path"]),
    ("run.dt=[1, 2", ["is not a TOML value"]),
    ("run.dt.x=1", ["run.dt is a float", "not a table"]),
])
def test_bad_set_overrides_are_one_line_errors_that_write_nothing(tmp_path, capsys, override, fragments):
    out = tmp_path / "out"
    assert main(["run", str(LORENZ), "--out", str(out), "--set", override]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sciax run: error: "), err
    for fragment in fragments:
        assert fragment in err, err
    assert not out.exists()


def test_set_reaches_array_of_tables_in_md_scenarios():
    from sciax.app.md_scenario import load_md_scenario

    s = load_md_scenario(SIMS / "lj_fluid.toml", overrides=["stage.1.n_steps=1000", "md.seed=7"])
    assert s.stages[1].n_steps == 1000 and s.md["seed"] == 7
    with pytest.raises(ScenarioError, match=r"stage is an array of 2 entries .* expected an index 0..1, got '5'"):
        load_md_scenario(SIMS / "lj_fluid.toml", overrides=["stage.5.n_steps=200"])


def test_seed_precision_and_devices_flags_set_their_keys(tmp_path, capsys):
    out = tmp_path / "lorenz"
    assert main(["run", str(LORENZ), "--out", str(out), "--n-steps", "20", "--precision", "float32", "--seed", "3",
                 "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["precision"] == "float32" and summary["overrides"] == {"run.precision": "float32", "run.seed": 3,
                                                                          "n_steps": 20}
    assert np.load(out / "trajectory.npz")["states"].dtype == np.float32
    assert main(["run", str(LORENZ), "--out", str(tmp_path / "x"), "--devices", "2"]) == 2
    assert "--devices: " in capsys.readouterr().err and not (tmp_path / "x").exists()
    assert main(["run", str(ROBERTSON), "--out", str(tmp_path / "y"), "--seed", "1"]) == 2
    assert "--seed: " in capsys.readouterr().err and not (tmp_path / "y").exists()


# --------------------------------------------------------------------------- list, validate, help


def test_list_shows_every_ready_scenario_with_its_description_and_the_names(capsys):
    assert main(["list", "--folder", str(SIMS)]) == 0
    out = capsys.readouterr().out
    import tomllib

    for path in sorted(SIMS.glob("*.toml")):
        description = tomllib.loads(path.read_text())["description"]
        assert path.name in out and description.splitlines()[0] in out, path.name
    for fragment in ("Lorenz", "Robertson", "RK4", "kvaerno5", "nose_hoover", "package.module:Class"):
        assert fragment in out


def test_validate_checks_without_running(tmp_path, capsys):
    assert main(["validate", str(LORENZ)]) == 0
    assert "valid (run scenario 'lorenz'" in capsys.readouterr().out
    assert main(["validate", str(ROBERTSON), "--set", "solve.solver=kvaerno9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sciax validate: error: ") and "unknown solver 'kvaerno9'" in err and "kvaerno5" in err
    assert main(["validate", str(SIMS / "lj_melt.toml")]) == 0


@pytest.mark.parametrize("command", ["run", "validate", "list", "info"])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    if command in ("run", "validate"):
        for option in ("--set", "--seed", "--precision", "--devices"):
            assert option in out


# --------------------------------------------------------------------------- the user's own systems


@pytest.mark.parametrize("reference", ["mysystems:Duffing", "mysystems.py:Duffing"])
@pytest.mark.parametrize("how", ["run", "solve"])
def test_a_user_system_runs_and_solves_from_a_scenario(user_module, reference, how, tmp_path):
    path = user_module / "duffing.toml"
    path.write_text(_duffing_scenario(reference, how))
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    data = np.load(out / "trajectory.npz")
    duffing = sys.modules["mysystems"].Duffing if ":" in reference and ".py" not in reference else None
    system = (duffing or load_scenario(path).system_class())(delta=0.1)
    state0 = jnp.array([1.0, 0.0])
    if how == "run":
        ref = sciax.simulate(system, state0, integrator=sciax.integrators.RK4(), dt=0.01, n_steps=200, save_every=10)
    else:
        ref = sciax.solve(system, state0, t0=0.0, t1=2.0, save_at=jnp.linspace(0.0, 2.0, 21), solver="dopri8",
                          rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(data["states"], np.asarray(ref.states))


def test_a_user_file_is_found_next_to_the_scenario_and_its_edits_change_the_hash(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "duffing_model.py").write_text(DUFFING)
    path = folder / "duffing.toml"
    path.write_text(_duffing_scenario("duffing_model.py:Duffing", "run"))
    before = load_scenario(path).hash()
    (folder / "duffing_model.py").write_text(DUFFING.replace("default=0.2", "default=0.25"))
    assert load_scenario(path).hash() != before  # --resume refuses a run whose system's code changed


@pytest.mark.parametrize("reference, fragments", [
    ("mysystems.py:NotASystem", ["[system] name", "is a class that is not a system", "AbstractODE"]),
    ("mysystems.py:Dufing", ["has no class 'Dufing'", "its system classes: Duffing", "Did you mean 'Duffing'"]),
    ("nosuchfile.py:Duffing", ["no file nosuchfile.py"]),
    ("no_such_module_xyz:Duffing", ["cannot import the module 'no_such_module_xyz'"]),
    ("mysystems.py:", ["expected \"package.module:ClassName\""]),
    ("sciax.systems:AbstractODE", ["is abstract", "vector_field"]),
    ("Lorentz", ["unknown system 'Lorentz'", "Did you mean 'Lorenz'", "your own class"]),
])
def test_a_user_class_that_is_not_a_usable_system_is_a_one_line_error(user_module, tmp_path, capsys, reference,
                                                                     fragments):
    path = user_module / "bad.toml"
    path.write_text(_duffing_scenario(reference, "run"))
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, err
    assert not out.exists()


def test_a_user_integrator_is_checked_to_be_an_integrator(user_module):
    text = _duffing_scenario("mysystems.py:Duffing", "run").replace('name = "RK4"', 'name = "mysystems.py:Duffing"')
    with pytest.raises(ScenarioError, match=r"\[integrator\] name: mysystems.py:Duffing is a class that is not an? "
                                            r"integrator"):
        parse_scenario(text, "x.toml", folder=user_module)


# --------------------------------------------------------------------------- [solve]


def test_robertson_solve_matches_scipy_radau_at_tight_tolerance(tmp_path):
    scipy_integrate = pytest.importorskip("scipy.integrate")
    out = tmp_path / "rob"
    assert main(["run", str(ROBERTSON), "--out", str(out), "--quiet", "--set", "solve.t1=1e5",
                 "--set", "solve.n_save=21"]) == 0
    data = np.load(out / "trajectory.npz")
    times = np.geomspace(1e-6, 1e5, 21)
    np.testing.assert_array_equal(data["times"], times)
    k1, k2, k3 = 0.04, 3.0e7, 1.0e4

    def rhs(t, y):
        return [-k1 * y[0] + k3 * y[1] * y[2], k1 * y[0] - k3 * y[1] * y[2] - k2 * y[1] ** 2, k2 * y[1] ** 2]

    def jac(t, y):
        return [[-k1, k3 * y[2], k3 * y[1]], [k1, -k3 * y[2] - 2 * k2 * y[1], -k3 * y[1]], [0.0, 2 * k2 * y[1], 0.0]]

    ref = scipy_integrate.solve_ivp(rhs, (0.0, 1e5), [1.0, 0.0, 0.0], method="Radau", t_eval=times, rtol=1e-12,
                                    atol=1e-16, jac=jac)
    # rtol 1e-8 in the scenario: every component within 1e-6 relative (y2 ~ 1e-5 absolute scale)
    np.testing.assert_allclose(data["states"], ref.y.T, rtol=1e-6, atol=1e-13)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["kind"] == "solve" and summary["num_steps"] > 0
    assert summary["conserved"]["total"]["max_abs_error"] < 1e-13
    assert (out / "plot.png").read_bytes().startswith(b"\x89PNG")
    header = (out / "states.csv").read_text().splitlines()[0]
    assert header == "time,y1,y2,y3"
    copy = (out / "scenario.toml").read_text().splitlines()
    assert copy[0].startswith(f"# copied by sciax {sciax.__version__} from {ROBERTSON}; command-line overrides: "
                              "solve.t1=100000.0, solve.n_save=21") and copy[1:] == ROBERTSON.read_text().splitlines()


def test_an_explicit_solver_on_robertson_fails_with_a_one_line_stiffness_hint(tmp_path, capsys):
    out = tmp_path / "rob"
    assert main(["run", str(ROBERTSON), "--out", str(out), "--set", "solve.solver=tsit5",
                 "--set", "solve.max_steps=2000", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "may be stiff" in err and "kvaerno5" in err, err
    assert not (out / "summary.json").exists()


@pytest.mark.parametrize("override, fragment", [
    ("solve.t1=-1.0", "[solve] t1: expected a time after t0 (0), got -1.0"),
    ("solve.save_from=0.0", "[solve] spacing: log-spaced save times need a positive first time"),
    ("solve.save_at=[0.0, 2.0, 1.0]", "[solve] save_at: expected an increasing array of times"),
    ("solve.rtol=0", "[solve] rtol: expected a positive finite number, got 0 (integer)"),
    ("integrator.name=RK4", "either [integrator] with [run] (fixed steps) or [solve]"),
])
def test_bad_solve_settings_are_scenario_errors(override, fragment):
    with pytest.raises(ScenarioError) as info:
        load_scenario(ROBERTSON, overrides=[override])
    assert fragment in str(info.value)


# --------------------------------------------------------------------------- every ready scenario


def test_every_ready_scenario_is_run_by_some_test():
    """Each file in sims/ is run end to end (at a reduced size) by a test: the fixed-step ones
    below, the others by the test file of their job."""
    tests = "".join(p.read_text() for p in pathlib.Path(__file__).parent.glob("test_*.py"))
    for path in SIMS.glob("*.toml"):
        assert f'"{path.name}"' in tests or f'"{path.stem}"' in tests, f"no test names {path.name}"


@pytest.mark.parametrize("name", ["kepler.toml", "langevin_oscillator.toml", "lorenz.toml", "van_der_pol.toml"])
def test_fixed_step_ready_scenarios_run_at_a_reduced_size(name, tmp_path):
    scenario = load_scenario(SIMS / name)
    n = 4 * scenario.run.save_every
    out = tmp_path / name
    assert main(["run", str(SIMS / name), "--out", str(out), "--quiet", "--set", f"run.n_steps={n}"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps_done"] == n and summary["n_frames"] == 5
    assert np.isfinite(np.load(out / "trajectory.npz")["times"]).all()
