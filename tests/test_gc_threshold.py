"""sciax's jitted entry points run with fewer cyclic garbage collections (sciax/_compile/gc_threshold.py):
the young generation's threshold is raised while they trace and compile, and put back after."""

import contextlib
import gc
import os
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciax
from sciax._compile.gc_threshold import TRACING_THRESHOLD, fewer_collections
from sciax.integrators import RK4
from sciax.systems import AbstractHamiltonian, AbstractODE


@pytest.fixture
def baseline():
    """CPython's default thresholds of 3.11 for the test, as this CPython reports them (3.14.0–
    3.14.4 report the third as 0); the caller's are restored after it."""
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield gc.get_threshold()
    gc.set_threshold(*saved)


def _raised(baseline):
    return (TRACING_THRESHOLD, *baseline[1:])


def test_raised_inside_and_restored_after_nested_blocks_and_errors(baseline):
    with fewer_collections:
        assert gc.get_threshold() == _raised(baseline)
        with fewer_collections:
            assert gc.get_threshold() == _raised(baseline)
        assert gc.get_threshold() == _raised(baseline)  # the outer block is still open
    assert gc.get_threshold() == baseline
    with pytest.raises(KeyError):
        with fewer_collections:
            raise KeyError("inside the block")
    assert gc.get_threshold() == baseline


@pytest.mark.parametrize("users", [(0, 10, 10), (2 * TRACING_THRESHOLD, 5, 5)])
def test_user_thresholds_that_are_off_or_higher_are_left_alone(baseline, users):
    gc.set_threshold(*users)
    users = gc.get_threshold()
    with fewer_collections:
        assert gc.get_threshold() == users
    assert gc.get_threshold() == users


def test_a_threshold_changed_inside_the_block_is_kept(baseline):
    with fewer_collections:
        gc.set_threshold(5000, 20, 20)
        changed = gc.get_threshold()
    assert gc.get_threshold() == changed


@contextlib.contextmanager
def _another_thread_inside():
    """A second thread that stays inside a `fewer_collections` block until this one ends."""
    inside, release = threading.Event(), threading.Event()

    def hold():
        with fewer_collections:
            inside.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    assert inside.wait(10)
    try:
        yield
    finally:
        release.set()
        t.join(10)


def test_threads_the_last_one_out_restores(baseline):
    other = contextlib.ExitStack()
    other.enter_context(_another_thread_inside())  # that thread raises the threshold
    with fewer_collections:
        other.close()  # and leaves first, while this one is still inside
        after_other_left = gc.get_threshold()[0]
    assert after_other_left == TRACING_THRESHOLD
    assert gc.get_threshold() == baseline


def _fork(child):
    """Run `child()` in a forked process; its exit status is 0 when it returned True. (The
    warnings that JAX and CPython give about forking a multithreaded process are expected.)"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if child() else 2
        finally:
            os._exit(code)
    return os.waitpid(pid, 0)[1]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_keeps_only_the_forking_threads_blocks(baseline):
    with _another_thread_inside():
        # Forked while another thread is inside a block: the child has no such thread, so its
        # threshold is restored at once and its own blocks work (the lock is not left held).
        def child_of_other():
            restored = gc.get_threshold() == baseline
            with fewer_collections:
                raised = gc.get_threshold() == _raised(baseline)
            return restored and raised and gc.get_threshold() == baseline

        assert _fork(child_of_other) == 0
        assert gc.get_threshold() == _raised(baseline)  # the other thread is still inside
    assert gc.get_threshold() == baseline

    # Forked from inside a block: the forking thread is still inside it in the child.
    with fewer_collections:
        def child_of_inside():
            still_raised = gc.get_threshold() == _raised(baseline)
            fewer_collections.__exit__(None, None, None)  # the child leaves the block it inherited
            return still_raised and gc.get_threshold() == baseline

        assert _fork(child_of_inside) == 0
    assert gc.get_threshold() == baseline


SEEN = []  # the collection threshold each time a recording function below is traced


class _RecordingDecay(AbstractODE):
    """y' = −k y; records the collection threshold each time it is traced."""

    k: float

    def vector_field(self, t, y, args=None):
        SEEN.append(gc.get_threshold()[0])
        return -self.k * y


def test_simulate_traces_without_young_collections(baseline):
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
    assert gc.get_threshold() == baseline
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
                          rollout=sciax.Simulate(RK4(), dt=0.01, n_steps=100),
                          output=_recording_output)
        return res.outputs[:, 0], np.exp(-np.array([0.5, 2.0]))
    well = _RecordingWell(k=4.0, masses=jnp.ones(1))
    eq = sciax.equilibrium(well, jnp.asarray([[0.2, 0.1]]), external_force=jnp.asarray([[0.3, -0.6]]))
    return eq.positions, np.array([[0.075, -0.15]])


@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
def test_entry_points_trace_inside_the_block(baseline, entry_point):
    SEEN.clear()
    value, expected = _call(entry_point)
    np.testing.assert_allclose(value, expected, rtol=1e-6)
    assert SEEN and set(SEEN) == {TRACING_THRESHOLD}
    assert gc.get_threshold() == baseline


def test_restored_after_an_error_while_tracing(baseline):
    SEEN.clear()

    def broken(state):
        SEEN.append(gc.get_threshold()[0])
        raise RuntimeError("observe failed while tracing")

    times = np.linspace(0.1, 2.0, 20)
    with pytest.raises(Exception, match="observe failed while tracing"):
        sciax.fit(_RecordingDecay(k=0.5), jnp.asarray([1.0, 2.0]), times, np.exp(-0.5 * times), t0=0.0, params="k",
                  observe=broken, rollout=sciax.Simulate(RK4(), dt=0.01))
    assert SEEN == [TRACING_THRESHOLD]
    assert gc.get_threshold() == baseline
