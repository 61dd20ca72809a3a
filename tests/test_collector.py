"""sciax's jitted entry points run with fewer cyclic garbage collections (sciax/_collector.py):
the young generation's threshold is raised while they trace and compile, and put back after."""

import gc
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciax
from sciax._collector import TRACING_THRESHOLD, fewer_collections
from sciax.integrators import RK4
from sciax.systems import AbstractHamiltonian, AbstractODE


@pytest.fixture
def thresholds():
    """CPython's default thresholds for the test, the caller's restored after it."""
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*saved)


def test_raised_inside_and_restored_after_nested_blocks_and_errors(thresholds):
    with fewer_collections:
        assert gc.get_threshold() == (TRACING_THRESHOLD, 10, 10)
        with fewer_collections:
            assert gc.get_threshold()[0] == TRACING_THRESHOLD
        assert gc.get_threshold()[0] == TRACING_THRESHOLD  # the outer block is still open
    assert gc.get_threshold() == (700, 10, 10)
    with pytest.raises(KeyError):
        with fewer_collections:
            raise KeyError("inside the block")
    assert gc.get_threshold() == (700, 10, 10)


@pytest.mark.parametrize("users", [(0, 10, 10), (2 * TRACING_THRESHOLD, 5, 5)])
def test_user_thresholds_that_are_off_or_higher_are_left_alone(thresholds, users):
    gc.set_threshold(*users)
    with fewer_collections:
        assert gc.get_threshold() == users
    assert gc.get_threshold() == users


def test_a_threshold_changed_inside_the_block_is_kept(thresholds):
    with fewer_collections:
        gc.set_threshold(5000, 20, 20)
    assert gc.get_threshold() == (5000, 20, 20)


def test_threads_the_last_one_out_restores(thresholds):
    inside, release_first = threading.Event(), threading.Event()
    seen = {}

    def first():
        with fewer_collections:
            inside.set()
            release_first.wait(10)

    t = threading.Thread(target=first)
    t.start()
    assert inside.wait(10)
    with fewer_collections:
        release_first.set()
        t.join(10)
        seen["after first left"] = gc.get_threshold()[0]
    assert seen["after first left"] == TRACING_THRESHOLD
    assert gc.get_threshold() == (700, 10, 10)


SEEN = []  # the collection threshold at each trace of `_RecordingDecay.vector_field`


class _RecordingDecay(AbstractODE):
    """y' = −k y; records the collection threshold each time it is traced."""

    k: float

    def vector_field(self, t, y, args=None):
        SEEN.append(gc.get_threshold()[0])
        return -self.k * y


def test_simulate_traces_without_young_collections(thresholds):
    """A first `simulate` allocates thousands of container objects while it traces and compiles
    (several young collections at CPython's threshold of 700); inside the raised threshold, none."""
    SEEN.clear()
    system = _RecordingDecay(k=0.37)
    y0 = jnp.asarray([1.0, 2.0])  # outside the count: JAX's first array starts its backend
    collections = []

    def count(phase, info):
        if phase == "start":
            collections.append(info["generation"])

    gc.collect()
    gc.callbacks.append(count)
    try:
        traj = sciax.simulate(system, y0, integrator=RK4(), dt=0.01, n_steps=100, save_every=10)
    finally:
        gc.callbacks.remove(count)
    assert SEEN and set(SEEN) == {TRACING_THRESHOLD}
    assert collections == []
    assert gc.get_threshold() == (700, 10, 10)
    t = np.asarray(traj.times)
    np.testing.assert_allclose(np.asarray(traj.states)[:, 0], np.exp(-0.37 * t), rtol=1e-9)


class _RecordingWell(AbstractHamiltonian):
    """One particle in U(q) = ½ k |q|²; records the collection threshold each time it is traced."""

    k: float
    masses: jax.Array

    def potential_energy(self, positions):
        SEEN.append(gc.get_threshold()[0])
        return 0.5 * self.k * jnp.sum(positions**2)


def _recording_observe(state):
    SEEN.append(gc.get_threshold()[0])
    return state


def _recording_output(traj):
    SEEN.append(gc.get_threshold()[0])
    return traj.final_state


ENTRY_POINTS = ["fit", "solve", "sweep", "equilibrium"]


def _call(entry_point):
    """Run `entry_point` on y' = −k y (a harmonic well for `equilibrium`), with a function that
    only that entry point traces (not `simulate` inside it); returns (value, expected)."""
    y0 = jnp.asarray([1.0, 2.0])
    if entry_point == "fit":
        times = np.linspace(0.1, 2.0, 20)
        observed = np.exp(-0.5 * times)[:, None] * np.array([1.0, 2.0])
        result = sciax.fit(_RecordingDecay(k=0.3), y0, times, observed, t0=0.0, params="k",
                           observe=_recording_observe, rollout=sciax.Simulate(RK4(), dt=0.01))
        assert result.converged
        return result.params["k"], 0.5
    if entry_point == "solve":
        traj = sciax.solve(_RecordingDecay(k=0.5), y0, t0=0.0, t1=1.0, save_at=jnp.asarray([1.0]), rtol=1e-10,
                           atol=1e-12)
        return np.asarray(traj.states)[0], np.exp(-0.5) * np.array([1.0, 2.0])
    if entry_point == "sweep":
        res = sciax.sweep(_RecordingDecay(k=0.5), y0, axes={"k": np.array([0.5, 2.0])},
                          simulate_kwargs={"integrator": RK4(), "dt": 0.01, "n_steps": 100},
                          output=_recording_output)
        return res.outputs[:, 0], np.exp(-np.array([0.5, 2.0]))
    well = _RecordingWell(k=4.0, masses=jnp.ones(1))
    eq = sciax.equilibrium(well, jnp.asarray([[0.2, 0.1]]), external_force=jnp.asarray([[0.3, -0.6]]))
    return eq.positions, np.array([[0.075, -0.15]])


@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
def test_entry_points_trace_inside_the_block(thresholds, entry_point):
    SEEN.clear()
    value, expected = _call(entry_point)
    np.testing.assert_allclose(value, expected, rtol=1e-6)
    assert SEEN and set(SEEN) == {TRACING_THRESHOLD}
    assert gc.get_threshold() == (700, 10, 10)


def test_restored_after_an_error_while_tracing(thresholds):
    def broken(state):
        raise RuntimeError("observe failed while tracing")

    times = np.linspace(0.1, 2.0, 20)
    with pytest.raises(Exception, match="observe failed while tracing"):
        sciax.fit(_RecordingDecay(k=0.5), jnp.asarray([1.0, 2.0]), times, np.exp(-0.5 * times), t0=0.0, params="k",
                  observe=broken, rollout=sciax.Simulate(RK4(), dt=0.01))
    assert gc.get_threshold() == (700, 10, 10)
