"""Scenario files: schema validation (errors name the file, the key and what was expected),
name lookup through the public namespaces, building objects in the chosen precision."""

import pathlib
import re

import jax.numpy as jnp
import jax.tree_util as jtu
import pytest

import sciax
from sciax.app.classes import buildable_from_toml as _buildable_from_toml
from sciax.app.scenario import (
    ScenarioError,
    integrator_classes,
    load_scenario,
    parse_scenario,
    system_classes,
)

SIMS = sorted((pathlib.Path(__file__).parent.parent / "sims").glob("*.toml"))

LORENZ = """
[system]
name = "Lorenz"
params = { rho = 28.0 }

[initial_state]
values = [1.0, 1.0, 1.0]

[integrator]
name = "RK4"

[run]
dt = 0.01
n_steps = 100
save_every = 10
"""


def parse(text, source="my.toml"):
    return parse_scenario(text, source)


def edit(text, old, new):
    assert old in text
    return text.replace(old, new)


def raises(text, *fragments, build=False):
    with pytest.raises(ScenarioError) as info:
        scenario = parse(text)
        if build:
            scenario.build()
    message = str(info.value)
    assert message.startswith("my.toml: "), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


@pytest.mark.parametrize("path", SIMS, ids=lambda p: p.name)
def test_shipped_scenarios_are_valid(path):
    from sciax.app.md_scenario import is_md_scenario, load_md_scenario

    if is_md_scenario(path):  # MD scenarios have their own schema (tests/test_md_run.py runs them)
        assert load_md_scenario(path).name == path.stem
        return
    scenario = load_scenario(path)
    built = scenario.build()
    assert scenario.name == path.stem
    assert built.state0 is not None


def test_at_least_the_main_scenarios_ship():
    assert {"lorenz.toml", "kepler.toml", "van_der_pol.toml"} <= {p.name for p in SIMS}


def test_defaults():
    s = parse(LORENZ)
    assert s.name == "scenario"
    assert s.run.precision == "float64" and s.run.t0 == 0.0 and s.run.seed == 0
    assert s.run.observables == ("conserved",) and s.run.check_finite
    assert s.run.chunk_steps % s.run.save_every == 0
    assert s.output.dir == "runs/scenario" and s.output.plot


def test_unknown_top_level_key():
    raises("colour = 1\n" + LORENZ, "top level", "unknown key 'colour'", "valid keys are: name, description, system")


def test_unknown_key_in_run_lists_valid_keys():
    msg = raises(edit(LORENZ, "n_steps = 100", "n_steps = 100\nnsteps = 5"), "[run]", "unknown key 'nsteps'")
    assert re.search(r"valid keys are: .*n_steps", msg)


@pytest.mark.parametrize(
    "old,new,fragments",
    [
        ("dt = 0.01", 'dt = "fast"', ["[run] dt", "expected a positive finite number", "'fast' (string)"]),
        ("dt = 0.01", "dt = -0.01", ["[run] dt", "expected a positive finite number"]),
        ("n_steps = 100", "n_steps = 100.0", ["[run] n_steps", "expected a positive integer", "(float)"]),
        ("n_steps = 100", "n_steps = 105", ["[run] n_steps", "multiple of save_every (10)", "105"]),
        ("n_steps = 100", 'n_steps = 100\nprecision = "float16"',
         ["[run] precision", "one of 'float64', 'float32'"]),
        ("n_steps = 100", "n_steps = 100\nobservables = \"conserved\"", ["[run] observables", "array of strings"]),
        ("n_steps = 100", "n_steps = 100\nchunk_steps = 15", ["[run] chunk_steps", "multiple of save_every"]),
        ("rho = 28.0", 'rho = "high"', ["[system] params.rho", "number", "'high' (string)"]),
        ("values = [1.0, 1.0, 1.0]", 'values = [1.0, "a", 1.0]', ["[initial_state] values", "numbers"]),
        ("n_steps = 100", 'n_steps = 100\n[output]\ndir = ""', ["[output] dir", "a non-empty folder path"]),
    ],
)
def test_wrong_types_name_file_key_and_expectation(old, new, fragments):
    raises(edit(LORENZ, old, new), *fragments)


def test_missing_required_key_and_section():
    raises(edit(LORENZ, "dt = 0.01\n", ""), "[run]", "missing required key 'dt'")
    raises(edit(LORENZ, '[integrator]\nname = "RK4"\n', ""), "missing required key 'integrator'")


def test_unknown_system_name_lists_valid_names():
    msg = raises(edit(LORENZ, 'name = "Lorenz"', 'name = "Lorentz"'), "[system] name", "unknown system 'Lorentz'")
    for name in ("Lorenz", "Kepler", "VanDerPol", "HarmonicOscillator"):
        assert name in msg
    raises(edit(LORENZ, 'name = "Lorenz"', 'name = "lorenz"'), "Did you mean 'Lorenz'?")


def test_unknown_integrator_name_lists_valid_names():
    msg = raises(edit(LORENZ, 'name = "RK4"', 'name = "RK5"'), "[integrator] name", "unknown integrator 'RK5'")
    for name in ("RK4", "VelocityVerlet", "LangevinBAOAB", "Euler"):
        assert name in msg


def test_unknown_parameter_lists_valid_parameters():
    raises(edit(LORENZ, "rho = 28.0", "rh = 28.0"), "[system] params.rh", "unknown parameter of Lorenz",
           "valid parameters: sigma, rho, beta")


def test_registries_hold_every_concrete_exported_class():
    systems = system_classes()
    for name in ("Lorenz", "Kepler", "VanDerPol", "HarmonicOscillator"):
        assert systems[name] is getattr(sciax.systems, name)
    assert not any(n.startswith("Abstract") for n in systems)
    exported = [n for n in dir(sciax.systems) if isinstance(getattr(sciax.systems, n), type)
                and issubclass(getattr(sciax.systems, n), sciax.systems.AbstractODE) and not n.startswith("Abstract")]
    # Every concrete exported system is found, unless a required argument cannot be written in TOML.
    assert {n for n in exported if _buildable_from_toml(getattr(sciax.systems, n))} == set(systems)
    integrators = integrator_classes()
    assert {"RK4", "Euler", "VelocityVerlet", "LangevinBAOAB"} <= set(integrators)
    assert "ExplicitRK" not in integrators  # needs a ButcherTableau: not expressible in TOML


@pytest.mark.parametrize(
    "state,fragments",
    [
        ("values = [1.0, 1.0, 1.0]\ndefault = true", ["[initial_state]", "exactly one of"]),
        ("positions = [1.0]", ["[initial_state] positions", "without velocities"]),
        ('preset = "orbit"', ["[initial_state] preset", "unknown preset 'orbit' for Lorenz", "valid presets: default"]),
        ("colour = 1", ["[initial_state]", "unknown key 'colour'", "values"]),
    ],
)
def test_initial_state_forms(state, fragments):
    raises(edit(LORENZ, "values = [1.0, 1.0, 1.0]", state), *fragments)


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
n_steps = 100
"""


def test_preset_keys_are_checked_against_the_method():
    raises(edit(KEPLER, "eccentricity", "eccentricty"), "[initial_state] eccentricty",
           "valid keys: preset, semi_major_axis, eccentricity")
    state = parse(KEPLER).build().state0
    assert isinstance(state, sciax.PhaseSpace)
    assert float(state.positions[0]) == pytest.approx(0.5)  # a (1 - e)


def test_build_errors_name_the_section():
    raises(edit(LORENZ, 'name = "RK4"', 'name = "VelocityVerlet"'), "[integrator] name",
           "VelocityVerlet cannot step Lorenz", build=True)
    raises(edit(LORENZ, "values = [1.0, 1.0, 1.0]", "values = [1.0, 1.0]"), "[initial_state]",
           "does not fit Lorenz", build=True)
    raises(edit(KEPLER, 'name = "Kepler"', 'name = "Kepler"\nparams = { masses = -1.0 }'),
           "[system] params", "Kepler(masses=-1.0) failed", build=True)
    raises(edit(LORENZ, "save_every = 10", 'save_every = 10\nobservables = ["energy"]'),
           "[run] observables", "unknown observable 'energy' for Lorenz", "valid names: conserved", build=True)


def test_invalid_toml_and_missing_file(tmp_path):
    raises("[run\n", "not valid TOML")
    with pytest.raises(ScenarioError, match="nope.toml: no such scenario file"):
        load_scenario(tmp_path / "nope.toml")


def test_observables_conserved_and_named():
    built = parse(KEPLER).build()
    assert set(built.observables) == {"energy", "angular_momentum"} == set(built.conserved)
    built = parse(edit(KEPLER, "n_steps = 100", 'n_steps = 100\nobservables = ["kinetic_energy"]')).build()
    assert set(built.observables) == {"kinetic_energy"} and built.conserved == ()


def test_float32_scenario_casts_everything(dtype):
    text = edit(KEPLER, "n_steps = 100", f'n_steps = 100\nprecision = "{dtype.name}"')
    built = parse(text).build()
    leaves = jtu.tree_leaves((built.system, built.state0))
    assert leaves and all(x.dtype == dtype for x in leaves if jnp.issubdtype(x.dtype, jnp.floating))


def test_hash_tracks_physics_not_length_or_output():
    base = parse(LORENZ)
    assert parse(edit(LORENZ, "rho = 28.0", "rho = 28.5")).hash() != base.hash()
    assert parse(edit(LORENZ, "dt = 0.01", "dt = 0.02")).hash() != base.hash()
    assert base.with_overrides(n_steps=1000).hash() == base.hash()
    assert parse(LORENZ + "\n[output]\nplot = false\n").hash() == base.hash()


def test_n_steps_override():
    s = parse(LORENZ).with_overrides(n_steps=30)
    assert s.run.n_steps == 30 and s.overrides == {"n_steps": 30}
    with pytest.raises(ScenarioError, match=r"--n-steps: expected a multiple of \[run\] save_every"):
        parse(LORENZ).with_overrides(n_steps=15)


@pytest.mark.parametrize("section, old, new, hint", [
    ("[system] name", 'name = "Lorenz"', 'name = "Lorentz"', "Did you mean 'Lorenz'?"),
    ("[system] name", 'name = "Lorenz"', 'name = "VanDerPool"', "Did you mean 'VanDerPol'?"),
    ("[integrator] name", 'name = "RK4"', 'name = "Eular"', "Did you mean 'Euler'?"),
    ("[system] params.rh", "rho = 28.0", "rh = 28.0", "Did you mean 'rho'?"),
])
def test_a_misspelt_name_gets_a_did_you_mean(section, old, new, hint):
    """Only a difference of case was suggested ('lorenz' -> 'Lorenz'); 'Lorentz' got nothing."""
    raises(edit(LORENZ, old, new), section, hint)


def test_a_name_close_to_nothing_gets_no_suggestion():
    msg = raises(edit(LORENZ, 'name = "Lorenz"', 'name = "Xyzzy"'), "unknown system 'Xyzzy'")
    assert "Did you mean" not in msg
