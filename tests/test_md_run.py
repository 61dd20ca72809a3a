"""MD scenarios: validation, streamed extended XYZ and thermo CSV, regrowth with replay, resume."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciax.md as md
from sciax import io as sio
from sciax.app.md_analysis import rdf_counts as _rdf_counts
from sciax.app.md_run import run_md
from sciax.app.md_scenario import is_md_scenario, load_md_scenario, parse_md_scenario
from sciax.app.scenario import ScenarioError

SIMS = Path(__file__).resolve().parent.parent / "sims"

# 108 WCA atoms (fcc, 3 cells): a Langevin stage, then NVE; chunks of 40 steps, so 4 chunks with
# the stage change inside the run.
SMALL = """
name = "small"
[md]
seed = 3
[lattice]
kind = "fcc"
density = 0.8
cells = 3
[potential]
kind = "wca"
[neighbours]
skin = 0.95
{capacity}
[velocities]
temperature = 1.5
[[stage]]
name = "nvt"
integrator = "langevin"
temperature = 1.0
friction = 1.0
dt = 0.005
n_steps = 80
[[stage]]
name = "nve"
integrator = "nve"
dt = 0.005
n_steps = 80
[output]
thermo_every = 10
trajectory_every = 20
rdf_every = 20
chunk_steps = 40
unwrapped = true
plot = false
"""


# Capacities that hold the small scenario's whole run (and its 1,000-step and blown-up variants
# below): no regrowth, and one compiled chunk program per stage, shared by every test that runs the
# scenario with them (the first builds it). They are what test_regrowth_replays_bitwise's run grows
# to from a neighbour capacity of 32, so its replayed chunks run these programs too.
LARGE = "capacity = 64\ncell_capacity = 17"


def _scenario(tmp_path, text, name="s.toml"):
    path = tmp_path / name
    path.write_text(text)
    return load_md_scenario(path)


def _files(folder):
    return {n: (folder / n).read_bytes() for n in ("trajectory.xyz", "thermo.csv", "rdf.csv")}


def _final_carry(folder, scenario):
    """The checkpoint's carry of a finished run, loaded as the driver does."""
    meta = sio.checkpoint_meta(folder / "checkpoint.npz")
    return meta, np.load(folder / "checkpoint.npz")["state"].tobytes()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The small scenario with large capacities, uninterrupted."""
    tmp = tmp_path_factory.mktemp("md_reference")
    sc = _scenario(tmp, SMALL.format(capacity=LARGE))
    result = run_md(sc, tmp / "out", progress=False)
    return sc, tmp / "out", result


def test_small_run_outputs(reference):
    sc, out, result = reference
    s = result.summary
    assert result.status == "completed" and s["steps_done"] == 160 and s["regrowths"] == []
    rows = np.loadtxt(out / "thermo.csv", delimiter=",", skiprows=1)
    header = (out / "thermo.csv").read_text().splitlines()[0].split(",")
    assert header[:11] == ["step", "time", "stage", "temperature", "kinetic", "potential", "total", "extended",
                           "pressure", "volume", "msd"]
    np.testing.assert_array_equal(rows[:, 0], np.arange(0, 161, 10))
    np.testing.assert_array_equal(rows[:, 2], [0] * 9 + [1] * 8)
    assert rows[0, 3] == pytest.approx(1.5, rel=1e-12)  # Maxwell–Boltzmann at exactly T = 1.5
    # total = kinetic + potential; temperature = 2K / (3N - 3); pressure = (2K + tr W) / (3V)
    np.testing.assert_allclose(rows[:, 6], rows[:, 4] + rows[:, 5], rtol=1e-14)
    np.testing.assert_allclose(rows[:, 3], 2 * rows[:, 4] / (3 * 108 - 3), rtol=1e-14)
    # the step-0 row against the system's own energy and pressure, computed independently
    b = sc.build()
    state0 = b.state0
    assert rows[0, 5] == pytest.approx(float(b.system.potential_energy(state0.positions)), rel=1e-12)
    assert rows[0, 8] == pytest.approx(float(md.pressure(0.0, state0, b.system)), rel=1e-12)
    # the trajectory: frames every 20 steps, read back by ASE
    import ase.io

    frames = ase.io.read(out / "trajectory.xyz", index=":")
    assert len(frames) == 9
    assert [f.info["step"] for f in frames] == list(range(0, 161, 20))
    last = frames[-1]
    ours = md.read_xyz(out / "trajectory.xyz")[-1]
    assert last.get_chemical_symbols() == ["X"] * 108 and all(last.pbc)
    np.testing.assert_array_equal(last.cell.lengths(), np.asarray(b.system.box.lengths))
    np.testing.assert_array_equal(last.positions, ours.positions)
    assert ours.unwrapped_positions is not None
    # the final frame is the run's final state (the checkpoint's carry)
    meta = sio.checkpoint_meta(out / "checkpoint.npz")
    assert meta["steps_done"] == 160 and meta["stage"] == 1
    # the msd column restarts at the NVE stage and equals the unwrapped displacement of the frames
    assert s["production"]["rdf_frames"] == 4
    assert s["neighbour_list_builds"] >= 2
    assert set(s["production"]["mean_and_standard_error"]) >= {"temperature", "pressure", "total", "potential"}
    assert "extended energy (nve)" in s["conserved"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["n_atoms"] == 108
    g = np.loadtxt(out / "rdf.csv", delimiter=",", skiprows=1)
    assert g.shape == (100, 2) and np.all(g[g[:, 0] < 0.8, 1] == 0)


def test_final_frame_is_final_state(reference, tmp_path):
    """The last XYZ frame holds the positions and velocities of the checkpoint's final carry."""
    sc, out, _ = reference
    from sciax.app.md_run import Progress, _MDDriver

    driver = _MDDriver(sc, sc.build(), out, Progress("x", 1, None, False))
    meta = sio.checkpoint_meta(out / "checkpoint.npz")
    from sciax.app.md_run import _with_capacities

    driver.system = _with_capacities(driver.system, meta["capacities"])
    (carry, _), _ = sio.load_checkpoint(out / "checkpoint.npz",
                                        like=(driver._carry_like(1), jax.ShapeDtypeStruct((108, 3), jnp.float64)))
    frame = md.read_xyz(out / "trajectory.xyz")[-1]
    np.testing.assert_array_equal(frame.positions, np.asarray(carry.state.positions))
    np.testing.assert_array_equal(frame.velocities, np.asarray(carry.state.velocities))
    np.testing.assert_array_equal(frame.images, np.asarray(carry.state.images))


def test_regrowth_replays_bitwise(reference, tmp_path):
    """Deliberately small capacities overflow, grow and replay: the files and the final carry equal,
    bit for bit, those of the run allocated at the grown capacities from the start (the reference),
    also when the run is stopped after the growth and resumed."""
    sc_ref, out_ref, _ = reference
    sc = _scenario(tmp_path, SMALL.format(capacity="capacity = 32\ncell_capacity = 17"))
    assert sc.hash() == sc_ref.hash()  # capacities are not physics
    result = run_md(sc, tmp_path / "out", progress=False)
    grown = result.summary["regrowths"]
    assert grown and grown[0]["before"]["capacity"] == 32 and grown[0]["after"]["capacity"] == 64
    # grown to the reference's capacities (LARGE): the replayed chunks run the reference's programs
    assert grown[0]["after"] == sio.checkpoint_meta(out_ref / "checkpoint.npz")["capacities"]
    assert grown[0]["in"] == "chunk"  # not the start: the chunk's start carry was reallocated and replayed
    assert _files(tmp_path / "out") == _files(out_ref)
    # stopped after the chunk that grew and resumed: the resume takes the grown capacities from the
    # checkpoint (no second regrowth) and gives the same files (the chunk programs compiled above)
    part = tmp_path / "part"
    stopped = run_md(sc, part, progress=False, max_chunks=grown[0]["step"] // 40 + 1)
    assert stopped.status == "interrupted" and stopped.summary["regrowths"] == grown
    assert sio.checkpoint_meta(part / "checkpoint.npz")["capacities"] == grown[0]["after"]
    resumed = run_md(sc, part, resume=True, progress=False)
    assert resumed.status == "completed" and resumed.summary["resumed_from_step"] == stopped.steps_done
    assert resumed.summary["regrowths"] == grown
    assert _files(part) == _files(out_ref)
    a, b = np.load(tmp_path / "out" / "checkpoint.npz"), np.load(out_ref / "checkpoint.npz")
    meta_a, meta_b = json.loads(str(a["meta"])), json.loads(str(b["meta"]))
    assert meta_a["steps_done"] == meta_b["steps_done"] == 160
    assert meta_a["capacities"] == meta_b["capacities"]
    np.testing.assert_array_equal(a["state"], b["state"])  # the whole carry, bitwise
    np.testing.assert_array_equal(np.load(part / "checkpoint.npz")["state"], b["state"])


def test_resume_bitwise(reference, tmp_path):
    """Stopped after 1 and after 3 chunks (inside the first stage and inside the second) and
    resumed: the same files and checkpoint as the uninterrupted run."""
    sc_ref, out_ref, _ = reference
    sc = _scenario(tmp_path, SMALL.format(capacity=LARGE))
    out = tmp_path / "out"
    first = run_md(sc, out, progress=False, max_chunks=1)
    assert first.status == "interrupted" and first.steps_done == 40
    # a crash after more rows and frames were appended: resume truncates them back
    with open(out / "thermo.csv", "a") as f:
        f.write("999,1,1,1,1,1,1,1,1,1,1\n1000,2,")
    with open(out / "trajectory.xyz", "a") as f:
        f.write("108\nLattice=\"1 0 0 0 1 0 0 0 1\"\nX 0 0")
    second = run_md(sc, out, resume=True, progress=False, max_chunks=2)
    assert second.steps_done == 120 and second.summary["resumed_from_step"] == 40
    third = run_md(sc, out, resume=True, progress=False)
    assert third.status == "completed" and third.steps_done == 160
    assert _files(out) == _files(out_ref)
    a, b = np.load(out / "checkpoint.npz"), np.load(out_ref / "checkpoint.npz")
    np.testing.assert_array_equal(a["state"], b["state"])  # the whole carry, bitwise


def test_resume_refuses_changed_physics(reference, tmp_path):
    sc, out_ref, _ = reference
    sc2 = _scenario(tmp_path, SMALL.format(capacity="").replace("temperature = 1.0", "temperature = 1.1"))
    from sciax.app.runner import ResumeError

    out = tmp_path / "out"
    run_md(sc, out, progress=False, max_chunks=1)
    with pytest.raises(ResumeError, match=r"\(stages\.1 nvt\.temperature: 1\.0 -> 1\.1\)"):
        run_md(sc2, out, resume=True, progress=False)


def test_rdf_counts_match_rdf_histogram(key):
    x, box = md.lattice("fcc", 3, density=0.8)
    x = np.asarray(box.wrap(x + 0.05 * jax.random.normal(key, x.shape))[0])
    lengths = np.asarray(box.lengths)
    system = md.MDSystem(box, md.WCA(), jnp.ones(108))
    state = md.MDState(jnp.asarray(x), jnp.zeros_like(x))
    expected = np.asarray(md.rdf_histogram(2.4, 50)(0.0, state, system))
    np.testing.assert_array_equal(_rdf_counts(x, lengths, 2.4, 50), expected)


def _edit(text, old, new):
    assert old in text, old
    return text.replace(old, new)


def test_lj_melt_first_row_and_ase(tmp_path):
    """sims/lj_melt.toml at 256 atoms: the first thermo row has LAMMPS's -6.7733681 per atom."""
    text = (SIMS / "lj_melt.toml").read_text()
    text = _edit(text, "cells = 10", "cells = 4")
    # the melting lattice overflows the cells allocated for it at once; room for 32 per cell saves a
    # regrowth (test_regrowth_replays_bitwise checks those) and its compilation
    text = _edit(text, "skin = 0.3", "skin = 0.3\ncell_capacity = 32")
    text = _edit(text, "n_steps = 1000", "n_steps = 100")
    text = _edit(text, "trajectory_every = 500", "trajectory_every = 50")
    text = _edit(text, "chunk_steps = 500", "chunk_steps = 100")
    sc = _scenario(tmp_path, text)
    result = run_md(sc, tmp_path / "out", progress=False)
    assert result.summary["regrowths"] == []
    rows = np.loadtxt(tmp_path / "out" / "thermo.csv", delimiter=",", skiprows=1)
    assert rows[0, 5] / 256 == pytest.approx(-6.7733681, abs=5e-8)
    assert rows[0, 3] == pytest.approx(3.0, rel=1e-12)
    # LAMMPS prints Press -3.7033504 at step 0 of in.lj (4,000 atoms): the virial part per volume is a
    # property of the crystal, the kinetic part rho T (3N - 3)/(3N) depends on N
    rho = 0.8442
    virial_part = -3.7033504 - rho * 3.0 * (3 * 4000 - 3) / (3 * 4000)
    assert rows[0, 8] == pytest.approx(virial_part + rho * 3.0 * (3 * 256 - 3) / (3 * 256), abs=2e-7)
    assert result.summary["steps_done"] == 100
    import ase.io

    frames = ase.io.read(tmp_path / "out" / "trajectory.xyz", index=":")
    assert [f.info["step"] for f in frames] == [0, 50, 100]
    assert frames[0].get_chemical_symbols() == ["Ar"] * 256
    x0, _ = md.lattice("fcc", 4, density=0.8442, dtype=jnp.float64)
    np.testing.assert_array_equal(frames[0].positions, np.asarray(x0))


def test_lj_fluid_reduced(tmp_path):
    """sims/lj_fluid.toml at 256 atoms and a few hundred steps: runs end to end with plots."""
    text = (SIMS / "lj_fluid.toml").read_text()
    text = _edit(text, "cells = 8", "cells = 4")
    text = _edit(text, "n_steps = 1500", "n_steps = 100")
    text = _edit(text, "n_steps = 3000", "n_steps = 200")
    text = _edit(text, "trajectory_every = 500", "trajectory_every = 100")
    text = _edit(text, "chunk_steps = 1000", "chunk_steps = 100")
    sc = _scenario(tmp_path, text)
    result = run_md(sc, tmp_path / "out", progress=False)
    out = tmp_path / "out"
    for name in ("thermo.png", "rdf.png", "msd.png", "rdf.csv", "summary.json"):
        assert (out / name).exists(), name
    rows = np.loadtxt(out / "thermo.csv", delimiter=",", skiprows=1)
    assert rows.shape == (16, 11)
    import ase.io

    assert len(ase.io.read(out / "trajectory.xyz", index=":")) == 4
    # D: the Einstein fit of the production rows' MSD over the second half of the stage (t from its start)
    production = rows[rows[:, 2] == 1]
    t = np.concatenate([[0.0], production[:, 1] - 0.5])
    msd = np.concatenate([[0.0], production[:, 10]])
    slope = np.polyfit(t[t >= 0.5 * t[-1]], msd[t >= 0.5 * t[-1]], 1)[0]
    assert result.summary["production"]["diffusion_coefficient"] == pytest.approx(slope / 6, rel=1e-10)
    assert slope > 0


# --------------------------------------------------------------------------- validation

_BAD = [
    (lambda t: _edit(t, 'kind = "wca"', 'kind = "lj"\ncutoff = 3.0'), r"\[potential\] cutoff: the cutoff \(3\) plus "
     r"\[neighbours\] skin \(0\.95\) = 3\.95 must be below half the smallest box side"),
    (lambda t: _edit(t, 'kind = "wca"', 'kind = "morse"'), r"\[potential\] kind: expected one of 'lj', 'wca', got "
     r"'morse'"),
    (lambda t: _edit(t, "temperature = 1.5", "temperature = -1.5"),
     r"\[velocities\] temperature: expected a non-negative finite number, got -1\.5"),
    (lambda t: _edit(t, "temperature = 1.0", "temperature = -1.0"),
     r"\[\[stage\]\] 1 \(nvt\) temperature: expected a positive finite number, got -1\.0"),
    (lambda t: _edit(t, 'integrator = "langevin"', 'integrator = "berendsen"'),
     r"\[\[stage\]\] 1 \(nvt\) integrator: expected one of 'nve', 'langevin'"),
    (lambda t: _edit(t, "friction = 1.0\n", ""), r"\[\[stage\]\] 1 \(nvt\): missing 'friction'"),
    (lambda t: _edit(t, "n_steps = 80\n[[stage]]", "n_steps = 85\n[[stage]]"),
     r"\[\[stage\]\] 1 \(nvt\) n_steps: expected a multiple of \[output\] thermo_every and trajectory_every \(20\), "
     r"got 85"),
    (lambda t: _edit(t, "skin = 0.95", "skn = 0.95"), r"\[neighbours\] skn: unknown key; valid keys: skin"),
]


@pytest.mark.parametrize("edit, message", _BAD)
def test_invalid_scenarios(tmp_path, edit, message):
    text = edit(SMALL.format(capacity=""))
    with pytest.raises(ScenarioError, match=message) as info:
        _scenario(tmp_path, text)
    assert str(info.value).startswith(str(tmp_path / "s.toml") + ": ")
    assert "\n" not in str(info.value)


def test_start_file(tmp_path):
    """An extended XYZ start: its atoms counted, velocities taken, positions outside the box wrapped
    with their images kept; a wrong count is refused naming [start] n_atoms."""
    x, box = md.lattice("fcc", 3, density=0.8, dtype=jnp.float64)
    v = md.maxwell_boltzmann(jnp.ones(108), 1.0, key=jax.random.key(1))
    shifted = np.asarray(x).copy()
    shifted[0, 0] += float(box.lengths[0])  # one atom an image away
    md.write_xyz(tmp_path / "start.xyz", shifted, velocities=v, box=box, symbols=("Kr",))
    base = SMALL.format(capacity="")
    base = _edit(base, '[lattice]\nkind = "fcc"\ndensity = 0.8\ncells = 3', '[start]\nfile = "start.xyz"')
    base = _edit(base, "[velocities]\ntemperature = 1.5\n", "")
    with pytest.raises(ScenarioError, match=r"\[start\] n_atoms: expected 100 atoms, but the first frame of .*"
                                            r"start.xyz' holds 108"):
        _scenario(tmp_path, _edit(base, 'file = "start.xyz"', 'file = "start.xyz"\nn_atoms = 100'))
    sc = _scenario(tmp_path, _edit(base, 'file = "start.xyz"', 'file = "start.xyz"\nn_atoms = 108'))
    b = sc.build()
    assert b.symbols == ("Kr",)
    np.testing.assert_array_equal(np.asarray(b.state0.positions), np.asarray(x))
    np.testing.assert_array_equal(np.asarray(b.state0.velocities), np.asarray(v))
    assert int(b.state0.images[0, 0]) == 1 and int(jnp.abs(b.state0.images).sum()) == 1
    with pytest.raises(ScenarioError, match=r"\[start\] file: no such file"):
        _scenario(tmp_path, _edit(base, 'file = "start.xyz"', 'file = "missing.xyz"'))


def test_is_md_scenario(tmp_path):
    (tmp_path / "a.toml").write_text(SMALL.format(capacity=""))
    assert is_md_scenario(tmp_path / "a.toml")
    assert not is_md_scenario(SIMS / "lorenz.toml")
    assert is_md_scenario(SIMS / "lj_melt.toml") and is_md_scenario(SIMS / "lj_fluid.toml")


def test_n_steps_override(tmp_path):
    sc = _scenario(tmp_path, SMALL.format(capacity=""))
    assert sc.with_overrides(n_steps=40).n_steps == 120
    with pytest.raises(ScenarioError, match=r"--n-steps: expected a positive multiple of 20"):
        sc.with_overrides(n_steps=30)


def test_parse_needs_one_start():
    with pytest.raises(ScenarioError, match=r"top level: expected exactly one of the tables \[lattice\], \[start\] "
                                            r"and \[chains\]"):
        parse_md_scenario(SMALL.format(capacity="").replace("[lattice]", "[chains]\nn_chains=2\nlength=3\n"
                                                             "density=0.8\n[lattice]"), "x.toml")


def test_kremer_grest_reduced(tmp_path):
    """sims/kremer_grest.toml with 4 chains of 10 beads: chains on the grid (bonds one spacing
    long), FENE + WCA energies at step 0 against the system's, and <R_ee^2> against the unwrapped
    positions of the last frame."""
    from sciax.app.md_scenario import chain_configuration

    x, lengths, chains = chain_configuration(4, 10, 0.85)
    bonds = np.linalg.norm(np.diff(x[chains], axis=1), axis=-1)
    np.testing.assert_allclose(bonds, lengths[0] / 4, rtol=1e-12)  # 40 beads: 4 sites per side
    d = x[:, None] - x[None]
    assert np.min(np.linalg.norm(d, axis=-1)[~np.eye(40, dtype=bool)]) == pytest.approx(lengths[0] / 4)
    text = (SIMS / "kremer_grest.toml").read_text()
    text = _edit(text, "n_chains = 20\nlength = 25", "n_chains = 12\nlength = 10")
    text = _edit(text, "n_steps = 4000", "n_steps = 100")
    text = _edit(text, "n_steps = 10000", "n_steps = 100")
    text = _edit(text, "trajectory_every = 1000", "trajectory_every = 100")
    text = _edit(text, "chunk_steps = 2000", "chunk_steps = 100")
    sc = _scenario(tmp_path, text)
    run_md(sc, tmp_path / "out", progress=False)
    header = (tmp_path / "out" / "thermo.csv").read_text().splitlines()[0].split(",")
    rows = np.loadtxt(tmp_path / "out" / "thermo.csv", delimiter=",", skiprows=1)
    assert header[-1] == "end_to_end2" and rows.shape == (5, 12)
    b = sc.build()
    assert rows[0, 5] == pytest.approx(float(b.system.potential_energy(b.state0.positions)), rel=1e-12)
    assert rows[0, 8] == pytest.approx(float(md.pressure(0.0, b.state0, b.system)), rel=1e-12)
    frame = md.read_xyz(tmp_path / "out" / "trajectory.xyz")[-1]
    ends = frame.unwrapped_positions[b.bond_chains[:, -1]] - frame.unwrapped_positions[b.bond_chains[:, 0]]
    assert rows[-1, -1] == pytest.approx(np.mean(np.sum(ends**2, axis=-1)), rel=1e-12)
    x0 = np.asarray(b.state0.positions)
    ends0 = x0[b.bond_chains[:, -1]] - x0[b.bond_chains[:, 0]]
    assert rows[0, -1] == pytest.approx(np.mean(np.sum(ends0**2, axis=-1)), rel=1e-12)


def test_real_units_float32(tmp_path):
    """Argon in real units (Å, eV, amu, ps, K) in float32: the first row's temperature in K and
    pressure in bar, against sciax.md.units conversions of the system's own values."""
    text = """
[md]
units = "real"
precision = "float32"
mass = 39.948
symbol = "Ar"
[lattice]
kind = "fcc"
lattice_constant = 5.4
cells = 3
[potential]
kind = "lj"
epsilon = 0.0103
sigma = 3.4
cutoff = 6.0
shift = "energy"
[neighbours]
skin = 1.0
[velocities]
temperature = 90.0
[[stage]]
integrator = "nose_hoover"
temperature = 90.0
tau = 0.1
dt = 0.002
n_steps = 20
[output]
thermo_every = 10
trajectory_every = 10
chunk_steps = 20
plot = false
"""
    sc = _scenario(tmp_path, text)
    b = sc.build()
    assert b.state0.positions.dtype == jnp.float32
    run_md(sc, tmp_path / "out", progress=False)
    rows = np.loadtxt(tmp_path / "out" / "thermo.csv", delimiter=",", skiprows=1)
    assert rows[0, 3] == pytest.approx(90.0, rel=1e-5)  # K
    p = float(md.pressure(0.0, b.state0, b.system)) * md.units.EV_PER_A3_IN_BAR
    assert rows[0, 8] == pytest.approx(p, rel=1e-5)  # bar
    k = float(md.kinetic_energy(0.0, b.state0, b.system))
    assert rows[0, 4] == pytest.approx(k, rel=1e-6)  # eV
    assert k == pytest.approx(1.5 * 107 * md.units.kT_from_kelvin(90.0), rel=1e-5)
    import ase.io

    frames = ase.io.read(tmp_path / "out" / "trajectory.xyz", index=":")
    assert len(frames) == 3 and frames[-1].info["step"] == 20


def test_sigkill_then_resume_via_cli(tmp_path):
    """A real `sciax run` of an MD scenario killed with SIGKILL mid-run leaves parseable files of
    whole frames and rows; `--resume` completes it, equal byte for byte to an uninterrupted run.
    It is killed once a checkpoint past the first chunk exists (inside the Langevin stage unless it
    got further), so the resumed part holds the rest of that stage, the change of stage and the NVE
    stage: 1,000 steps in all."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from sciax.app.cli import main

    path = tmp_path / "long.toml"
    # the reference's capacities: the killed process compiles one chunk program (no regrowth), and the
    # resumed and the uninterrupted runs here share the reference's programs when it ran in this process
    path.write_text(_edit(SMALL.format(capacity=LARGE), "n_steps = 80\n[output]", "n_steps = 1000000\n[output]"))
    out = tmp_path / "out"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    process = subprocess.Popen([sys.executable, "-m", "sciax", "run", str(path), "--out", str(out),
                                "--no-compilation-cache", "--quiet"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 300
    try:
        while True:
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no checkpoint past step 40 in time"
            try:
                if sio.checkpoint_meta(out / "checkpoint.npz")["steps_done"] >= 40:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL
    assert not (out / "summary.json").exists()
    rows = np.loadtxt(out / "thermo.csv", delimiter=",", skiprows=1)  # whole rows only
    assert rows.shape[1] == 11 and np.all(np.diff(rows[:, 0]) == 10)
    frames = md.read_xyz(out / "trajectory.xyz")  # whole frames only
    assert [f.step for f in frames] == list(range(0, 20 * len(frames), 20))
    done = sio.checkpoint_meta(out / "checkpoint.npz")["steps_done"]
    assert 40 <= done < 1000
    assert main(["run", str(path), "--out", str(out), "--resume", "--n-steps", "920", "--quiet",
                 "--no-compilation-cache"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from_step"] == done
    sc = _scenario(tmp_path, SMALL.format(capacity=LARGE), "whole.toml").with_overrides(n_steps=920)
    run_md(sc, tmp_path / "whole", progress=False)
    assert _files(out) == _files(tmp_path / "whole")


def test_blow_up_is_reported(tmp_path):
    """dt = 0.08 flings atoms apart: NonFiniteStateError naming the step, a 'non-finite' summary,
    and the files up to the last checkpoint."""
    from sciax._errors import NonFiniteStateError

    # the reference's capacities hold the run until it blows up: no regrowth, and the reference's
    # compiled Langevin chunk when it ran in this process
    sc = _scenario(tmp_path, SMALL.format(capacity=LARGE).replace("dt = 0.005", "dt = 0.08"))
    with pytest.raises(NonFiniteStateError, match=r"small: the run blew up \(NaN/Inf, or atoms flung out of the "
                                                  r"box\) by step \d+ \(stage 'nvt'\)") as info:
        run_md(sc, tmp_path / "out", progress=False)
    assert 0 < info.value.step <= 40
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["status"] == "non-finite"
    rows = np.loadtxt(tmp_path / "out" / "thermo.csv", delimiter=",", skiprows=1, ndmin=2)
    assert rows[:, 0].tolist() == list(range(0, info.value.step, 10))  # every finite frame before it
    assert np.all(np.isfinite(rows))


@pytest.mark.parametrize("dtype", [
    # covered by [float32] (the same thermo_observable code: the same bits at capacities 64 and 96, U and
    # tr W against MDSystem.compute) and test_small_run_outputs (float64: the first row's U, P and T against
    # the system's own, to 1e-12)
    pytest.param(jnp.float64, marks=pytest.mark.slow),
    jnp.float32,
], ids=["float64", "float32"])
def test_thermo_observable_is_capacity_independent(key, dtype):
    """The thermo observable's U and tr W equal MDSystem.compute's (to rounding) and have the same
    bits at capacities 64 and 96; K is ½ Σ m v²."""
    import dataclasses

    import equinox as eqx

    from sciax.app.md_run import thermo_observable

    x, box = md.lattice("fcc", 3, density=0.8, dtype=dtype)
    x = box.wrap(x + 0.15 * jax.random.normal(key, x.shape, dtype))[0]
    v = jax.random.normal(jax.random.fold_in(key, 1), x.shape, dtype)
    system = md.MDSystem(box, md.LennardJones(1.0, 1.0, dtype(1.5), shift="energy"), jnp.ones(108, dtype),
                         neighbours=md.VerletList(dtype(0.95))).allocate(x)
    state = md.MDState(x, v)
    exact = eqx.filter_jit(lambda s, q: s.compute(q, s.build_neighbours(q)))(system, x)
    values = []
    for capacity in (64, 96):
        s = eqx.tree_at(lambda t: t.neighbours, system, dataclasses.replace(system.neighbours, capacity=capacity))
        out = jax.jit(thermo_observable)(0.0, state, s)
        assert int(out["overflow"]) == 0
        values.append((np.asarray(out["potential"]), np.asarray(out["virial"])))
    for u, w in values[1:]:
        assert u.tobytes() == values[0][0].tobytes() and w.tobytes() == values[0][1].tobytes()
    rtol = 1e-12 if dtype == jnp.float64 else 1e-5
    np.testing.assert_allclose(values[0][0], exact.energy, rtol=rtol)
    np.testing.assert_allclose(values[0][1], np.trace(exact.virial), rtol=rtol)
    np.testing.assert_allclose(out["kinetic"], 0.5 * np.sum(np.asarray(v, np.float64) ** 2), rtol=rtol)


def test_ctrl_c_packages_the_checkpoint_and_resumes(reference, tmp_path, monkeypatch):
    """Ctrl-C (or SIGTERM, which the command line turns into the same) while a chunk is being
    stored: the files go back to the checkpoint, the summary says 'interrupted', and --resume
    gives the uninterrupted run's files."""
    from sciax.app.md_run import _MDDriver

    _, out_ref, _ = reference
    sc = _scenario(tmp_path, SMALL.format(capacity=LARGE))
    original = _MDDriver._store
    calls = []

    def store(self, traj, n):
        calls.append(n)
        if len(calls) == 3:
            sio.append_csv_rows(self.path["thermo"], np.ones((2, 11)))  # half-stored when interrupted
            raise KeyboardInterrupt
        return original(self, traj, n)

    monkeypatch.setattr(_MDDriver, "_store", store)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_md(sc, out, progress=False)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["steps_done"] == 80
    rows = np.loadtxt(out / "thermo.csv", delimiter=",", skiprows=1)
    assert rows[-1, 0] == 80
    monkeypatch.setattr(_MDDriver, "_store", original)
    assert run_md(sc, out, resume=True, progress=False).status == "completed"
    assert _files(out) == _files(out_ref)


def test_cli_invalid_md_scenario_exits_2_and_writes_nothing(tmp_path, capsys):
    from sciax.app.cli import main

    path = tmp_path / "bad.toml"
    path.write_text(_edit(SMALL.format(capacity=""), "temperature = 1.5", "temperature = -1.5"))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--quiet", "--no-compilation-cache"]) == 2
    err = capsys.readouterr().err
    assert err == (f"sciax run: error: {path}: [velocities] temperature: expected a non-negative finite number, "
                   "got -1.5 (float).\n")
    assert not (tmp_path / "out").exists()
