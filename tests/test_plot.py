"""`plot_trajectory` with pytree observables and no frames; `plot_fit` with non-finite draws,
a non-finite covariance and bad `components`."""

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest
from matplotlib.collections import PolyCollection

import sciax
from sciax import Bounded, Positive, Simulate
from sciax.integrators import RK4
from sciax.plot import plot_trajectory
from sciax.systems import DampedDrivenOscillator, Lorenz

# ---------------------------------------------------------------------------------------------
# plot_trajectory
# ---------------------------------------------------------------------------------------------

OBSERVABLES = {
    "pair": lambda t, y, s: (y[0], y[1]),
    "d": lambda t, y, s: {"a": y[0], "v": y[1:]},
}


@pytest.fixture(scope="module")
def lorenz_traj():
    return sciax.simulate(Lorenz(), jnp.array([1.0, 1.0, 1.0]), integrator=RK4(), dt=0.01, n_steps=200,
                          observables=OBSERVABLES)


def observable_lines(fig):
    """label -> (x, y) of each line of the observables panel (the last axes)."""
    return {line.get_label(): line.get_data() for line in fig.axes[-1].get_lines()}


@pytest.mark.parametrize("max_points", [50_000, 50])
def test_pytree_observables_are_drawn_leaf_by_leaf(lorenz_traj, max_points):
    t, y = np.asarray(lorenz_traj.times), np.asarray(lorenz_traj.states)
    step = 1 if max_points > len(t) else 5  # ceil(201 / 50) = 5
    fig = plot_trajectory(lorenz_traj, max_points=max_points)
    lines = observable_lines(fig)
    expected = {"pair[0]": y[:, 0], "pair[1]": y[:, 1],
                "d['a']": y[:, 0], "d['v'][0]": y[:, 1], "d['v'][1]": y[:, 2]}
    assert set(lines) == set(expected)
    for label, values in expected.items():
        x_line, y_line = lines[label]
        np.testing.assert_array_equal(x_line, t[::step], err_msg=label)
        np.testing.assert_array_equal(y_line, values[::step], err_msg=label)


def test_conserved_pytree_gets_one_drift_curve_per_leaf(lorenz_traj):
    y = np.asarray(lorenz_traj.states)
    fig = plot_trajectory(lorenz_traj, conserved=("pair", "d"), max_points=50)
    lines = observable_lines(fig)
    assert set(lines) == {"pair[0]: (q − q₀)/|q₀|", "pair[1]: (q − q₀)/|q₀|",
                          "d['a']: (q − q₀)/|q₀|", "d['v']: |q − q₀|/|q₀|"}
    x = y[::5, 0]
    np.testing.assert_allclose(lines["pair[0]: (q − q₀)/|q₀|"][1], (x - x[0]) / abs(x[0]), rtol=1e-12)
    v = y[::5, 1:]
    np.testing.assert_allclose(lines["d['v']: |q − q₀|/|q₀|"][1],
                               np.linalg.norm(v - v[0], axis=1) / np.linalg.norm(v[0]), rtol=1e-12)


def test_trajectory_without_frames_is_a_clear_error():
    empty = sciax.Trajectory(times=jnp.zeros((0,)), states=jnp.zeros((0, 3)), observables={},
                             finite=jnp.zeros((0,), bool))
    with pytest.raises(ValueError, match="no frames"):
        plot_trajectory(empty)


# ---------------------------------------------------------------------------------------------
# plot_fit
# ---------------------------------------------------------------------------------------------

DT = 0.05


@pytest.fixture(scope="module")
def oscillator_fit():
    truth, guess, y0 = (DampedDrivenOscillator(omega=2.0, zeta=0.1), DampedDrivenOscillator(omega=1.5, zeta=0.3),
                        jnp.array([1.0, 0.0]))
    traj = sciax.simulate(truth, y0, integrator=RK4(), dt=DT, n_steps=200, save_every=10)
    times = np.asarray(traj.times[1:])
    data = np.asarray(traj.states[1:, 0]) + 0.05 * np.random.default_rng(0).standard_normal(len(times))
    result = sciax.fit(guess, y0, times, data, params=("omega", "zeta"), rollout=Simulate(RK4(), dt=DT), t0=0.0,
                       transforms={"omega": Positive(), "zeta": Bounded(0.0, 1.0)}, observe=lambda y: y[0],
                       sigma=0.05)
    return result, times, data


def bands(fig):
    return [c for c in fig.axes[0].collections if isinstance(c, PolyCollection)]


def test_band_leaves_out_draws_where_the_model_blows_up(oscillator_fit):
    result, times, data = oscillator_fit
    # so wide that some draws of omega pass RK4's stability limit omega·dt ≈ 2.8 (omega ≈ 56)
    wide = eqx.tree_at(lambda r: r.covariance, result, np.asarray(result.covariance) * 1e6)
    with pytest.warns(UserWarning, match=r"[1-9]\d* of 100 parameter draws give a non-finite model"):
        fig = sciax.plot_fit(wide, times, data, n_samples=100)
    (band,) = bands(fig)
    (path,) = band.get_paths()  # one polygon over the whole time range: no NaN gaps
    vertices = path.vertices
    t_fit = fig.axes[0].lines[0].get_xdata()
    assert np.isfinite(vertices).all()
    assert len(vertices) >= 2 * len(t_fit)
    assert vertices[:, 0].min() == t_fit[0] and vertices[:, 0].max() == t_fit[-1]


def test_non_finite_covariance_warns_that_there_is_no_band(oscillator_fit):
    result, times, data = oscillator_fit
    singular = eqx.tree_at(lambda r: r.covariance, result, np.full_like(np.asarray(result.covariance), np.nan))
    with pytest.warns(UserWarning, match="covariance is not finite.*no uncertainty band"):
        fig = sciax.plot_fit(singular, times, data, n_samples=20)
    assert bands(fig) == []


def test_components_out_of_range_is_a_clear_error(oscillator_fit):
    result, times, data = oscillator_fit
    with pytest.raises(ValueError, match=r"`components`.*-1 … 0.*got 3"):
        sciax.plot_fit(result, times, data, components=[3])
    sciax.plot_fit(result, times, data, components=[-1], n_samples=0)  # negative indices count from the end
