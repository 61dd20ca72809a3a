"""One rollout object: `Simulate` and `Solve` run the same trajectory as `simulate` and `solve`,
carry the same defaults, and tell `fit` apart from plain runs."""

import jax.numpy as jnp
import numpy as np
import pytest

import sciax
from sciax import integrators as si
from sciax.systems import Lorenz, VanDerPol

Y0 = jnp.array([1.0, 2.0, 20.0])


def test_simulate_rollout_is_simulate_with_its_settings():
    obs = {"z": lambda t, y, s: y[2]}
    rollout = sciax.Simulate(si.RK4(), dt=0.01, n_steps=40, save_every=10, t0=0.5, observables=obs)
    traj = rollout(Lorenz(), Y0)
    ref = sciax.simulate(Lorenz(), Y0, integrator=si.RK4(), dt=0.01, n_steps=40, save_every=10, t0=0.5,
                         observables=obs)
    np.testing.assert_array_equal(traj.states, ref.states)
    np.testing.assert_array_equal(traj.times, ref.times)
    np.testing.assert_array_equal(traj.observables["z"], ref.observables["z"])
    # continued from its final carry, as simulate is
    half = sciax.Simulate(si.RK4(), dt=0.01, n_steps=20, save_every=10, t0=0.5)
    second = half(Lorenz(), carry0=half(Lorenz(), Y0).final_carry, step_offset=20)
    np.testing.assert_array_equal(second.final_state, ref.final_state)


def test_solve_rollout_is_solve_with_its_settings():
    save_at = jnp.linspace(0.0, 1.0, 5)
    traj = sciax.Solve("tsit5", t0=0.0, t1=1.0, save_at=save_at)(VanDerPol(), jnp.array([2.0, 0.0]))
    ref = sciax.solve(VanDerPol(), jnp.array([2.0, 0.0]), t0=0.0, t1=1.0, save_at=save_at)
    np.testing.assert_array_equal(traj.states, ref.states)


def test_defaults_agree_everywhere():
    """One rule: CheckpointAdjoint for fixed steps, rtol 1e-8 / atol 1e-10 for adaptive steps."""
    import inspect

    assert isinstance(sciax.Simulate(si.RK4(), dt=0.1).adjoint, sciax.CheckpointAdjoint)
    assert isinstance(inspect.signature(sciax.simulate).parameters["adjoint"].default, sciax.CheckpointAdjoint)
    solve_params = inspect.signature(sciax.solve).parameters
    assert (sciax.Solve().rtol, sciax.Solve().atol) == (solve_params["rtol"].default, solve_params["atol"].default) \
        == (1e-8, 1e-10)
    assert list(solve_params)[:2] == ["system", "state0"]  # the initial state has one name everywhere


def test_fit_takes_the_run_length_from_the_data():
    t = np.linspace(0.0, 1.0, 11)
    observed = np.asarray(sciax.simulate(VanDerPol(), jnp.array([2.0, 0.0]), integrator=si.RK4(), dt=0.01,
                                         n_steps=100, save_every=10).states)
    for rollout, named in [(sciax.Simulate(si.RK4(), dt=0.01, n_steps=100), "n_steps"),
                           (sciax.Solve(t0=0.0, t1=1.0), "t0, t1")]:
        with pytest.raises(ValueError, match=rf"^fit: the rollout's {named} must be left unset"):
            sciax.fit(VanDerPol(), jnp.array([2.0, 0.0]), t, observed, params=("mu",), rollout=rollout)
    with pytest.raises(ValueError, match="`fit` needs a deterministic integrator"):
        sciax.fit(VanDerPol(), jnp.array([2.0, 0.0]), t, observed, params=("mu",),
                  rollout=sciax.Simulate(si.EulerMaruyama(), dt=0.01))


def test_bad_settings_name_the_rollout():
    with pytest.raises(ValueError, match=r"Simulate: `n_steps` must be a positive"):
        sciax.Simulate(si.RK4(), dt=0.1, n_steps=0)
    with pytest.raises(TypeError, match=r"Simulate: `observables` must be a dict"):
        sciax.Simulate(si.RK4(), dt=0.1, n_steps=1, observables=[lambda t, y, s: y])
    with pytest.raises(ValueError, match=r"^run: Simulate needs the run length"):
        sciax.Simulate(si.RK4(), dt=0.1).check_complete("run")
