"""Neighbour-list overflow handled on the host: `overflowed`, `reallocate_carry`, `simulate_md`
(grow and replay a chunk) equal, bit for bit, a run allocated large enough from the start."""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_md_integrators import gradient_gas

import sciax
from sciax.md import (
    MDCarry,
    MDState,
    NoseHooverChain,
    VelocityVerlet,
    overflowed,
    reallocate_carry,
    simulate_md,
)
from sciax.md._regrow import CAPACITY_QUANTUM


@eqx.filter_jit  # one program instead of the build's operations compiled one by one
def _required(system, positions):
    return system.build_neighbours(positions).required


def undersized(dtype=jnp.float64):
    """The 64-particle gas of the gradient tests with capacities that hold its first build only
    (neighbours per particle and particles per cell as counted at the start)."""
    system, state = gradient_gas()
    system, state = sciax.astype(system, dtype), sciax.astype(state, dtype)
    need = _required(system, state.positions)
    strategy = dataclasses.replace(system.neighbours, capacity=int(need[0]), cell_capacity=int(need[1]))
    return eqx.tree_at(lambda s: s.neighbours, system, strategy), state


def with_capacity(system, capacity):
    return eqx.tree_at(lambda s: s.neighbours, system, dataclasses.replace(system.neighbours, capacity=capacity))


def assert_trees_equal(a, b):
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b), strict=True):
        assert x.dtype == y.dtype, jax.tree_util.keystr(path)
        np.testing.assert_array_equal(x, y, err_msg=jax.tree_util.keystr(path))


def replayed(integrator, dtype):
    """(simulate_md run of the undersized gas, one `simulate` call with its final capacities,
    one with a neighbour capacity of 3 x 32): 240 steps in chunks of 20, saved every 10."""
    system, state = undersized(dtype)
    assert system.neighbours.capacity % CAPACITY_QUANTUM != 0  # simulate_md rounds it up
    run = simulate_md(system, state, integrator=integrator, dt=0.004, n_steps=240, chunk_steps=20, save_every=10)
    reference = sciax.simulate(run.system, state, integrator=integrator, dt=0.004, n_steps=240, save_every=10)
    larger = sciax.simulate(with_capacity(run.system, 3 * CAPACITY_QUANTUM), state, integrator=integrator, dt=0.004,
                            n_steps=240, save_every=10)
    return run, reference, larger


@pytest.fixture(scope="module")
def verlet_replay():
    """The velocity-Verlet float64 case of test_replay_equals_run_allocated_large_enough, computed
    once: test_reallocate_carry_is_the_large_runs_carry reallocates its runs' carries."""
    return replayed(VelocityVerlet(), jnp.float64)


@pytest.mark.parametrize("integrator, dtype", [
    (VelocityVerlet(), jnp.float64),
    pytest.param(VelocityVerlet(), jnp.float32, marks=pytest.mark.slow),  # float64 covers the replay
    pytest.param(NoseHooverChain(1.0, 0.2), jnp.float64, marks=pytest.mark.slow),
], ids=["verlet-float64", "verlet-float32", "nose-hoover-float64"])
def test_replay_equals_run_allocated_large_enough(integrator, dtype, request):
    """The undersized list overflows in a later chunk; `simulate_md` grows it and replays that
    chunk. Its trajectory, final carry (neighbour list included) and times equal one `simulate`
    call with the final capacities from the start, bit for bit; the states also equal a run with
    a capacity of 3 x 32 (different neighbour-array shapes, same bits)."""
    if isinstance(integrator, VelocityVerlet) and dtype == jnp.float64:
        run, reference, larger = request.getfixturevalue("verlet_replay")
    else:
        run, reference, larger = replayed(integrator, dtype)
    assert len(run.regrowths) >= 1
    first = run.regrowths[0]
    assert first.step > 0 and first.step % 20 == 0  # a later chunk overflowed: its start carry was reallocated
    assert first.status != 0 and first.after.capacity >= first.before.capacity
    assert run.system.neighbours.capacity % CAPACITY_QUANTUM == 0
    assert not overflowed(run.trajectory.final_carry)
    assert run.trajectory.times.shape == (25,)

    assert not overflowed(reference.final_carry)
    assert_trees_equal(run.trajectory, reference)

    assert larger.final_carry.neighbours.indices.shape[-1] == 3 * CAPACITY_QUANTUM > run.system.neighbours.capacity
    assert_trees_equal(run.trajectory.states, larger.states)
    assert_trees_equal(run.trajectory.final_carry.state, larger.final_carry.state)


def test_an_overflowed_run_is_wrong_without_replay():
    """The same undersized run, not replayed, flags the overflow and its forces are wrong: the
    check is needed. (Chunks of 20 steps saved every 10 from step 40, where the replay test's run
    overflows: the programs of that run, compiled once.)"""
    system, state = undersized()
    head = simulate_md(system, state, integrator=VelocityVerlet(), dt=0.004, n_steps=40, chunk_steps=20,
                       save_every=10)
    assert not head.regrowths
    small, carry = head.system, head.trajectory.final_carry
    traj = sciax.simulate(small, integrator=VelocityVerlet(), dt=0.004, n_steps=20, save_every=10, carry0=carry,
                          step_offset=40)
    assert overflowed(traj.final_carry)
    assert "neighbours per particle" in sciax.md.describe_overflow(int(traj.final_carry.neighbours.overflow))
    good = simulate_md(small, integrator=VelocityVerlet(), dt=0.004, n_steps=20, save_every=10, carry0=carry,
                       step_offset=40)
    assert len(good.regrowths) == 1 and not overflowed(good.trajectory.final_carry)
    assert not np.array_equal(traj.final_carry.forces, good.trajectory.final_carry.forces)


def test_reallocate_carry_is_the_large_runs_carry(verlet_replay):
    """Reallocating a carry (capacity 64 -> 96) gives the carry of a run with 96 from the start:
    the same state, forces and neighbours (padded), build counter and status, bit for bit. The
    energy and virial are sums over all slots at once, whose order XLA chooses by shape: they
    agree to rounding (1e-14 relative), not bitwise; the dynamics use only the forces. (The two
    240-step runs of the replay test, `reference` and `larger`.)"""
    run, a, b = verlet_replay
    small, large = run.system, with_capacity(run.system, 96)
    assert small.neighbours.capacity == 64 and a.final_carry.neighbours.indices.shape[-1] == 64
    assert b.final_carry.neighbours.indices.shape[-1] == 96
    assert int(a.final_carry.neighbours.n_builds) > 1
    rebuilt = reallocate_carry(large, a.final_carry)
    assert_trees_equal((rebuilt.state, rebuilt.forces, rebuilt.neighbours), (b.final_carry.state, b.final_carry.forces,
                                                                              b.final_carry.neighbours))
    np.testing.assert_allclose(rebuilt.energy, b.final_carry.energy, rtol=1e-14)
    np.testing.assert_allclose(rebuilt.virial, b.final_carry.virial, rtol=1e-14, atol=1e-14 * float(jnp.max(jnp.abs(
        b.final_carry.virial))))


# covered by test_md_sweep.py::test_replayed_sweep_equals_sweep_allocated_large_enough: sweep_md reads
# the vmapped carries' overflow (some members), grows to the largest need and reallocates every
# member's carry, and the replayed sweep equals the one allocated large enough, bit for bit
@pytest.mark.slow
def test_batched_carry_of_an_ensemble():
    """`overflowed` of a vmapped carry is True when any member overflowed; `grow` takes the
    largest need; `reallocate_carry` rebuilds every member."""
    system, state = undersized()
    scales = jnp.array([0.5, 1.0, 1.6])

    @jax.jit
    def final_carries(s):
        def member(scale):
            st = eqx.tree_at(lambda x: x.velocities, state, state.velocities * scale)
            return sciax.simulate(s, st, integrator=VelocityVerlet(), dt=0.004, n_steps=60, save_every=60).final_carry
        return jax.vmap(member)(scales)

    carries = final_carries(system)
    per_member = np.asarray(carries.neighbours.overflow) != 0
    assert overflowed(carries) and not per_member.all()  # some members overflowed, not all
    grown = system.grow(carries.neighbours)
    again = final_carries(grown)
    assert not overflowed(again)
    rebuilt = reallocate_carry(grown, carries)
    assert rebuilt.neighbours.indices.shape == (3, 64, grown.neighbours.capacity)


def test_continuing_simulate_md_from_a_carry(key):
    """(Chunks of 20 steps saved every 10: the replay test's compiled chunks.)"""
    system, state = undersized()
    whole = simulate_md(system, state, integrator=VelocityVerlet(), dt=0.004, n_steps=80, chunk_steps=20,
                        save_every=10)
    half = simulate_md(system, state, integrator=VelocityVerlet(), dt=0.004, n_steps=40, chunk_steps=20, save_every=10)
    rest = simulate_md(half.system, carry0=half.trajectory.final_carry, integrator=VelocityVerlet(), dt=0.004,
                       n_steps=40, chunk_steps=20, save_every=10, step_offset=40)
    assert_trees_equal(whole.trajectory.final_carry.state, rest.trajectory.final_carry.state)


def test_errors():
    system, state = undersized()
    with pytest.raises(TypeError, match=r"overflowed: `carry` must be a sciax.md.MDCarry"):
        overflowed(state)
    with pytest.raises(ValueError, match=r"`chunk_steps` \(15\) must be a multiple of `save_every` \(10\)"):
        simulate_md(system, state, integrator=VelocityVerlet(), dt=0.004, n_steps=40, chunk_steps=15, save_every=10)
    with pytest.raises(TypeError, match=r"pass exactly one of `state0`"):
        simulate_md(system, integrator=VelocityVerlet(), dt=0.004, n_steps=40)
    # the replay test's run, which overflows in the chunk from step 40 (its compiled chunks)
    with pytest.raises(RuntimeError, match=r"from step 40 after 0 growths \(`max_regrows`\)"):
        simulate_md(system, state, integrator=VelocityVerlet(), dt=0.004, n_steps=60, chunk_steps=20, save_every=10,
                    max_regrows=0)
    with pytest.raises(TypeError, match=r"simulate_md: `dt` is being traced"):
        jax.jit(lambda dt: simulate_md(system, state, integrator=VelocityVerlet(), dt=dt, n_steps=4))(0.004)
    # a carry of the replay test's first 40 steps (its compiled chunks)
    head = simulate_md(system, state, integrator=VelocityVerlet(), dt=0.004, n_steps=40, chunk_steps=20, save_every=10)
    assert isinstance(reallocate_carry(head.system, head.trajectory.final_carry), MDCarry)
    assert isinstance(state, MDState)
