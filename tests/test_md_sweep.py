"""`sweep_md`: MD ensembles whose neighbour buffers overflow are grown once for all members and
the chunk replayed; the result equals, bit for bit, the sweep allocated large enough from the
start, and each member equals its own `simulate_md` run."""

import dataclasses
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_md_regrow import assert_trees_equal, undersized

import sciax
import sciax.md as md
from sciax.md import Bussi, VelocityVerlet, simulate_md, sweep_md
from sciax.md._regrow import CAPACITY_QUANTUM

SCALES = np.array([0.5, 1.0, 1.6])  # members: the gas's velocities scaled; the hottest overflows first
OBSERVABLES = {"U": md.potential_energy, "K": md.kinetic_energy}
# margin 1.5: the capacities grow once (with 1.25 the cells grow a second time, a chunk program more to compile)
RUN = dict(integrator=VelocityVerlet(), dt=0.004, n_steps=160, chunk_steps=20, save_every=10, observables=OBSERVABLES,
           margin=1.5)
# The potential energy is one sum over all slots of a neighbour list, in an order XLA picks by the
# list's shape: frames computed before a growth (at the smaller capacity) agree with the larger
# run's to rounding, not bitwise (measured: at most 1 ulp; in float64 in 2 of the 51 frames of
# the two sweeps, in float32 between a member and its own run). The dynamics (forces) and every
# other output are bitwise.
U_RTOL = {dtype: 2 * float(jnp.finfo(dtype).eps) for dtype in (jnp.float64, jnp.float32)}  # 2 ulps


def velocity_axis(state):
    velocities = np.asarray(state.velocities)
    return {"state0.velocities": velocities[None] * SCALES[:, None, None].astype(velocities.dtype)}


def member(tree, i):
    return jax.tree.map(lambda x: x[i], tree)


def assert_equal_but_energy(a, b, rtol):
    """Trajectories equal bit for bit, the potential energy `U` to `rtol`."""
    assert_trees_equal(dataclasses.replace(a, observables={"K": a.observables["K"]}),
                       dataclasses.replace(b, observables={"K": b.observables["K"]}))
    np.testing.assert_allclose(a.observables["U"], b.observables["U"], rtol=rtol, atol=0)


@pytest.fixture(scope="module", params=[jnp.float64, pytest.param(jnp.float32, marks=pytest.mark.slow)],
                ids=["float64", "float32"])
def gas_sweep(request):
    system, state = undersized(request.param)
    return request.param, system, state, sweep_md(system, state, axes=velocity_axis(state), mode="zip", **RUN)


def test_replayed_sweep_equals_sweep_allocated_large_enough(gas_sweep):
    """A sweep started with capacities that hold only the first build overflows in a later
    chunk; the capacities of all members grow and the chunk is replayed. The result (states,
    times, final carries with their neighbour lists, the kinetic energy) equals bit for bit the
    same sweep started with the final capacities."""
    dtype, system, state, tiny = gas_sweep
    assert system.neighbours.capacity % CAPACITY_QUANTUM != 0  # rounded up by sweep_md
    # the report: which chunk overflowed, in which members, and the capacities before and after
    assert len(tiny.regrowths) >= 1
    first = tiny.regrowths[0]
    assert first.step > 0 and first.step % 20 == 0 and first.status != 0
    assert first.members and set(first.members) <= {0, 1, 2}
    assert first.before.capacity == CAPACITY_QUANTUM
    assert tiny.system.neighbours.capacity % CAPACITY_QUANTUM == 0
    assert tiny.system.neighbours.capacity == tiny.regrowths[-1].after.capacity
    assert tiny.trajectory.states.positions.shape == (3, 17, 64, 3)
    assert tiny.trajectory.times.shape == (3, 17) and tiny.shape == (3,) and tiny.dims == ("member",)
    assert not md.overflowed(tiny.trajectory.final_carry)

    large = sweep_md(tiny.system, state, axes=velocity_axis(state), mode="zip", **RUN)
    assert large.regrowths == ()
    assert_equal_but_energy(tiny.trajectory, large.trajectory, U_RTOL[dtype])

    # `max_regrows=0`: the same sweep stops at that overflow, naming the buffer, the members and
    # the chunk (it runs the chunk programs compiled above, so no compilation of its own)
    what = re.escape(md.describe_overflow(first.status))
    with pytest.raises(RuntimeError, match=rf"sweep_md: the neighbour buffers overflowed again \({what} in members "
                                           rf"\[{', '.join(map(str, first.members))}\]\) in the chunk from step "
                                           rf"{first.step} after 0 growths \(`max_regrows`\)"):
        sweep_md(system, state, axes=velocity_axis(state), mode="zip", max_regrows=0, **RUN)


# covered by test_members_at_different_densities_with_a_thermostat_axis (each member equals its own
# simulate, bit for bit) with test_replayed_sweep_equals_sweep_allocated_large_enough and
# test_md_regrow's test_replay_equals_run_allocated_large_enough (a replay equals the run allocated
# large enough, whichever step it grew at)
@pytest.mark.slow
def test_members_equal_their_own_simulate_md_runs(gas_sweep):
    """Each member equals `simulate_md` of that member alone (which grows only when that member
    overflows, at other steps), bit for bit: vmapped and single runs give the same bits here.
    The frames' potential energy, whose neighbour list is built at the frame, agrees to
    rounding (before that build's overflow status was read, measured: off by up to 1e-2)."""
    dtype, system, state, tiny = gas_sweep
    steps = set()
    for i, scale in enumerate(SCALES.astype(state.velocities.dtype)):  # as velocity_axis scales them
        alone = simulate_md(system, eqx.tree_at(lambda s: s.velocities, state, state.velocities * scale), **RUN)
        steps.add(tuple(g.step for g in alone.regrowths))
        assert_equal_but_energy(member(tiny.trajectory, i), alone.trajectory, U_RTOL[dtype])
    assert len(steps) > 1  # the members alone grew at different steps


def test_members_at_different_densities_with_a_thermostat_axis(key):
    """fcc crystals at three densities under Bussi thermostats at three temperatures (zipped
    axes on the box, the positions and the integrator), allocated for the most dilute: the denser
    members overflow in the first chunk (more neighbours, a box too small for the cell grid), which
    is replayed from the initial states with a larger capacity and the coarser grid the smallest
    box allows. The replayed sweep equals, bit for bit, the same sweep started with its final
    capacities. Each member equals one `simulate` of that member with the sweep's final
    capacities and the key `fold_in(key, i)` to rounding, not bit for bit: JAX's gamma sampler
    (the thermostat's χ² draw) rounds some draws differently, by 1 ulp, when vmapped (2 of 300
    at shape 160.5, float64, jax 0.10.2); measured over several keys, the members
    differed from their own runs by at most 9e-16 in positions, 1.5e-14 in velocities and 1.4e-13
    in the heat after 60 steps (0 for Langevin and velocity Verlet). The dilute member alone keeps
    its finer grid, which orders its neighbour list differently: the same pairs summed in another
    order, equal to rounding (measured 1.3e-15 after 60 steps)."""
    densities = np.array([0.5, 0.8, 1.0])
    kTs = np.array([0.8, 1.0, 1.2])
    crystals = [md.lattice("fcc", 3, density=float(rho)) for rho in densities]
    positions = np.stack([np.asarray(x) for x, _ in crystals])
    lengths = np.stack([np.asarray(box.lengths) for _, box in crystals])
    velocities = md.maxwell_boltzmann(jnp.ones(108), 1.0, key=jax.random.key(1))
    potential = md.LennardJones(cutoff=2.0, shift="energy")
    system = md.MDSystem(md.Box(lengths[0]), potential, jnp.ones(108), neighbours=md.VerletList(skin=0.3))
    system = system.allocate(positions[0])
    assert system.neighbours.capacity % CAPACITY_QUANTUM == 0  # allocate rounds up
    state = md.MDState(positions[0], velocities)
    run = dict(dt=0.005, n_steps=60, save_every=10)
    axes = {"box.lengths": lengths, "state0.positions": positions, "integrator.kT": kTs}
    res = sweep_md(system, state, axes=axes, mode="zip", integrator=Bussi(kT=1.0, tau=0.1), chunk_steps=20, key=key,
                   **run)
    first = res.regrowths[0]
    assert first.step == 0 and 2 in first.members and 0 not in first.members
    assert first.status & md.OVERFLOW_NEIGHBOURS and first.status & md.OVERFLOW_GRID
    assert res.system.neighbours.capacity % CAPACITY_QUANTUM == 0
    assert all(g < h for g, h in zip(res.system.neighbours.grid, system.neighbours.grid, strict=True))

    def alone(system, i):
        own = eqx.tree_at(lambda s: s.box, system, md.Box(lengths[i]))
        return sciax.simulate(own, md.MDState(positions[i], velocities), integrator=Bussi(kT=float(kTs[i]), tau=0.1),
                              key=jax.random.fold_in(key, i), **run)

    again = sweep_md(res.system, state, axes=axes, mode="zip", integrator=Bussi(kT=1.0, tau=0.1), chunk_steps=20,
                     key=key, **run)
    assert again.regrowths == () and again.system.neighbours.capacity == res.system.neighbours.capacity
    assert_trees_equal(again.trajectory, res.trajectory)
    for i in range(3):
        own, mine = alone(res.system, i), member(res.trajectory, i)
        assert_trees_equal(mine.times, own.times)
        for name, atol in (("positions", 1e-12), ("velocities", 1e-12), ("thermostat", 1e-11)):
            np.testing.assert_allclose(getattr(mine.states, name), getattr(own.states, name), rtol=0, atol=atol,
                                       err_msg=f"member {i}: {name}")
    dilute = alone(system, 0)
    assert not md.overflowed(dilute.final_carry)
    np.testing.assert_allclose(res.trajectory.states.positions[0], dilute.states.positions, rtol=0, atol=1e-13)
    assert_trees_equal(res.sel(**{"integrator.kT": 1.2}).states, member(res.trajectory.states, 2))


def test_errors():
    system, state = undersized()
    run = dict(integrator=VelocityVerlet(), dt=0.004, n_steps=20)
    axes = velocity_axis(state)
    with pytest.raises(ValueError, match=r"sweep_md: axis 'rho' does not name a field of MDSystem.*'masses'"):
        sweep_md(system, state, axes={"rho": np.ones(2)}, **run)
    with pytest.raises(ValueError, match=r"sweep_md: axis 'kT' does not name a field of VelocityVerlet.*"
                                         r"named 'integrator.<field>'"):
        sweep_md(system, state, axes={"integrator.kT": np.ones(2)}, **run)
    with pytest.raises(TypeError, match=r"sweep_md: `axes` must be a non-empty dict"):
        sweep_md(system, state, axes={}, **run)
    with pytest.raises(ValueError, match=r"sweep_md: in zip mode every axis must have the same length"):
        sweep_md(system, state, axes={**axes, "potential.epsilon": np.ones(2)}, mode="zip", **run)
    with pytest.raises(ValueError, match=r"sweep_md: `mode` must be 'grid' or 'zip'"):
        sweep_md(system, state, axes=axes, mode="product", **run)
    with pytest.raises(ValueError, match=r"sweep_md: Bussi is stochastic: pass `key="):
        sweep_md(system, state, axes=axes, **{**run, "integrator": Bussi(1.0, 0.1)})
    with pytest.raises(TypeError, match=r"sweep_md: `system` must be a sciax.md.MDSystem"):
        sweep_md(sciax.systems.Lorenz(), state, axes=axes, **run)
    with pytest.raises(TypeError, match=r"sweep_md: `integrator` must be a sciax.md integrator"):
        sweep_md(system, state, axes=axes, **{**run, "integrator": "verlet"})
    with pytest.raises(ValueError, match=r"sweep_md: `dt` must be positive and finite"):
        sweep_md(system, state, axes=axes, **{**run, "dt": -0.004})
    with pytest.raises(ValueError, match=r"sweep_md: `chunk_steps` \(15\) must be a multiple of `save_every` \(10\)"):
        sweep_md(system, state, axes=axes, chunk_steps=15, save_every=10, **run)
    with pytest.raises(ValueError, match=r"sweep_md: `margin` must be a number >= 1"):
        sweep_md(system, state, axes=axes, margin=0.5, **run)
    with pytest.raises(TypeError, match=r"sweep_md: `key` must be a jax.random key"):
        sweep_md(system, state, axes=axes, key=3, **run)
    with pytest.raises(TypeError, match=r"sweep_md: `dt` is being traced"):
        jax.jit(lambda dt: sweep_md(system, state, axes=axes, **{**run, "dt": dt}))(0.004)
    lengths = np.asarray(system.box.lengths)
    with pytest.raises(ValueError, match=r"sweep_md: member 1 \(\{'box.lengths': \[5.3.*\]\}\): MDSystem: the "
                                         r"cutoff \+ skin \(2.8\) must be below half the smallest box length"):
        sweep_md(system, state, axes={"box.lengths": np.stack([lengths, 0.9 * lengths])}, **run)
    with pytest.raises(ValueError, match=r"sweep_md: member 0 \(\{'state0.positions\[0, 0\]': -1.0\}\): .*outside"):
        sweep_md(system, state, axes={"state0.positions[0, 0]": np.array([-1.0])}, **run)
    with pytest.raises(ValueError, match=r"sweep_md: member 1 \(\{'integrator.tau': -0.1\}\): Bussi: `tau`"):
        sweep_md(system, state, axes={"integrator.tau": np.array([0.1, -0.1])}, key=jax.random.key(0),
                 **{**run, "integrator": Bussi(1.0, 0.1)})
    with pytest.raises(sciax.NonFiniteStateError, match=r"sweep_md: the state of member 1 \(\{'state0.velocities"
                                                      r"\[0, 0\]': nan\}\) became non-finite \(NaN/Inf\) by frame 0"):
        sweep_md(system, state, axes={"state0.velocities[0, 0]": np.array([0.0, np.nan])}, check_finite=True, **run)
    # `max_regrows=0` is checked in test_replayed_sweep_equals_sweep_allocated_large_enough, with the
    # chunk programs its sweep has compiled
