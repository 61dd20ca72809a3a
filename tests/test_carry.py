"""`simulate` carries the integrator's whole loop state: `carry0=traj.final_carry` continues a
run bitwise, for every integrator, including one whose carry holds more than the state."""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
import pytest

import sciax
from sciax import integrators as si, systems as ss


class AuxiliaryVariableEuler(si.AbstractIntegrator):
    """A test integrator whose carry holds more than the state, as a thermostat's does: an
    auxiliary friction variable z (dz/dt = |y|² − 1, fed back as dy/dt = f(y) − z y) and an
    integer step counter that switches z's update on every other step. Restarting from the
    state alone resets both, so only a carried run continues the same trajectory."""

    order: ClassVar[int] = 1

    def init(self, system, t0, state, args):
        return state, jnp.zeros((), jnp.result_type(*jtu.tree_leaves(state))), jnp.zeros((), jnp.int32)

    def step(self, system, t, carry, dt, key, args):
        y, z, count = carry  # y: an array, or a tuple of components (how simulate steps small ODEs)
        f = system.vector_field(t, y, args)
        y_new = jtu.tree_map(lambda yi, fi: yi + dt * (fi - z * yi), y, f)
        norm2 = sum(jnp.sum(yi**2) for yi in jtu.tree_leaves(y))
        z_new = z + jnp.where(count % 2 == 0, 2 * dt, 0.0).astype(z.dtype) * (norm2 - 1.0)
        return y_new, z_new, count + 1

    def state(self, carry):
        return carry[0]


def _bitwise_equal(a, b):
    la, lb = jtu.tree_leaves(a), jtu.tree_leaves(b)
    return len(la) == len(lb) and all(
        np.asarray(x).dtype == np.asarray(y).dtype and np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
        for x, y in zip(la, lb))


CASES = [
    (ss.Lorenz(), "lorenz", si.RK4()),
    (ss.Lorenz(), "lorenz", si.Tsit5()),
    (ss.Lorenz(), "lorenz", si.Euler()),
    (ss.VanDerPol(), "vdp", si.Dopri5()),
    (ss.HarmonicOscillator(), "particle", si.VelocityVerlet()),
    (ss.HarmonicOscillator(), "particle", si.Leapfrog()),
    (ss.HarmonicOscillator(), "particle", si.Yoshida4()),
    (ss.HarmonicOscillator(), "particle", si.LangevinBAOAB(kT=0.5, friction=1.0)),
    (ss.OrnsteinUhlenbeck(), "ou", si.EulerMaruyama()),
    (ss.VanDerPol(), "vdp", AuxiliaryVariableEuler()),
]


def _state(kind):
    if kind == "lorenz":
        return jnp.array([1.0, 2.0, 20.0])
    if kind == "vdp":
        return jnp.array([2.0, 0.0])
    if kind == "particle":
        return sciax.PhaseSpace(jnp.array([1.0, 0.5]), jnp.array([0.0, -0.3]))
    return jnp.array([0.7])


@pytest.mark.parametrize("system, kind, integrator", CASES, ids=lambda x: type(x).__name__ if not isinstance(x, str)
                         else x)
def test_a_run_continued_from_its_final_carry_is_bitwise_the_uninterrupted_run(system, kind, integrator, key):
    state0 = _state(kind)
    common = dict(integrator=integrator, dt=0.01, save_every=5, key=key if integrator.stochastic else None)
    whole = sciax.simulate(system, state0, n_steps=60, **common)
    first = sciax.simulate(system, state0, n_steps=25, **common)
    second = sciax.simulate(system, carry0=first.final_carry, n_steps=35, step_offset=25, **common)
    assert _bitwise_equal(second.final_carry, whole.final_carry)
    assert _bitwise_equal(second.states, jtu.tree_map(lambda x: x[5:], whole.states))
    assert np.array_equal(np.asarray(second.times), np.asarray(whole.times[5:]))


def test_a_carry_holding_more_than_the_state_is_needed_to_continue(key):
    """Restarting from the state alone loses the auxiliary variable and the counter: the carried
    continuation matches the whole run, the restarted one does not (the test above can fail)."""
    system, integrator = ss.VanDerPol(), AuxiliaryVariableEuler()
    common = dict(integrator=integrator, dt=0.01, save_every=5)
    whole = sciax.simulate(system, jnp.array([2.0, 0.0]), n_steps=60, **common)
    first = sciax.simulate(system, jnp.array([2.0, 0.0]), n_steps=25, **common)
    restarted = sciax.simulate(system, first.final_state, n_steps=35, step_offset=25, **common)
    carried = sciax.simulate(system, carry0=first.final_carry, n_steps=35, step_offset=25, **common)
    assert not np.allclose(np.asarray(restarted.final_state), np.asarray(whole.final_state), rtol=1e-6)
    assert _bitwise_equal(carried.final_state, whole.final_state)
    assert int(carried.final_carry[2]) == 60


def test_final_carry_under_jit_and_vmap():
    system, integrator = ss.Lorenz(), si.RK4()
    states = jnp.array([[1.0, 2.0, 20.0], [0.5, 1.0, 10.0]])
    run = jax.jit(jax.vmap(lambda y: sciax.simulate(system, y, integrator=integrator, dt=0.01, n_steps=20)))
    traj = run(states)
    again = jax.jit(jax.vmap(lambda c: sciax.simulate(system, carry0=c, integrator=integrator, dt=0.01, n_steps=20,
                                                        step_offset=20)))(traj.final_carry)
    whole = jax.vmap(lambda y: sciax.simulate(system, y, integrator=integrator, dt=0.01, n_steps=40))(states)
    assert _bitwise_equal(again.final_state, whole.final_state)


def test_reversible_adjoint_differentiates_through_the_final_carry():
    """A loss on the final carry (not a saved frame) gets its gradient through the reversible
    backward pass, equal to the checkpointed one."""
    system = ss.HarmonicOscillator(stiffness=2.0)
    state0 = sciax.PhaseSpace(jnp.array([1.0, 0.5]), jnp.array([0.0, -0.3]))

    def loss(k, adjoint):
        traj = sciax.simulate(eqx.tree_at(lambda s: s.stiffness, system, k), state0, integrator=si.VelocityVerlet(),
                              dt=0.05, n_steps=40, save_every=10, adjoint=adjoint, save_states=False)
        return jnp.sum(traj.final_carry[0].positions ** 2)

    g_rev = jax.grad(loss)(jnp.asarray(2.0), sciax.ReversibleAdjoint())
    g_chk = jax.grad(loss)(jnp.asarray(2.0), sciax.CheckpointAdjoint())
    assert np.isfinite(float(g_chk)) and abs(float(g_chk)) > 1e-3
    np.testing.assert_allclose(float(g_rev), float(g_chk), rtol=1e-9)


def test_state0_and_carry0_are_exclusive():
    system, integrator = ss.Lorenz(), si.RK4()
    y = jnp.array([1.0, 2.0, 20.0])
    traj = sciax.simulate(system, y, integrator=integrator, dt=0.01, n_steps=2)
    with pytest.raises(TypeError, match="either `state0` or `carry0`"):
        sciax.simulate(system, y, carry0=traj.final_carry, integrator=integrator, dt=0.01, n_steps=2)
    with pytest.raises(TypeError, match="`state0` .* is required"):
        sciax.simulate(system, integrator=integrator, dt=0.01, n_steps=2)


def test_integer_leaves_beside_floating_ones_are_counters_not_a_precision():
    """A structured state may hold integer counters (an MD state's image counts) beside its
    floating leaves; a state with no floating leaf is still refused."""
    from sciax._validation import state_dtype

    class Counted(eqx.Module):
        x: jax.Array
        images: jax.Array

    assert state_dtype(Counted(jnp.zeros(3, jnp.float32), jnp.zeros(3, jnp.int32))) == jnp.float32
    with pytest.raises(sciax.StateMismatchError, match="floating point"):
        state_dtype(Counted(jnp.zeros(3, jnp.int32), jnp.zeros(3, jnp.int32)))
    with pytest.raises(sciax.StateMismatchError, match="floating point"):
        state_dtype(jnp.zeros(3, jnp.int32))
