"""Integrators against exact solutions: observed order, energy behaviour, dtype, sampling."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import sciax
from sciax import PhaseSpace, integrators as si
from sciax.systems import AbstractODE, HarmonicOscillator, Kepler


class ForcedDecay(AbstractODE):
    """dy/dt = -y + sin t, exact y(t) = (y0 + 1/2) e^{-t} + (sin t - cos t)/2 (non-autonomous)."""

    def vector_field(self, t, y, args=None):
        return -y + jnp.sin(t)

    @staticmethod
    def exact(y0, t):
        return (y0 + 0.5) * np.exp(-t) + 0.5 * (np.sin(t) - np.cos(t))


def observed_order(errors, dts):
    slope, _ = np.polyfit(np.log(dts), np.log(errors), 1)
    return slope


RK_CASES = [
    (si.Euler(), 1, [64, 128, 256, 512]),
    (si.Heun(), 2, [32, 64, 128, 256]),
    (si.Midpoint(), 2, [32, 64, 128, 256]),
    (si.RK4(), 4, [8, 16, 32, 64]),
    (si.Dopri5(), 5, [8, 12, 16, 24]),
    (si.Tsit5(), 5, [24, 32, 48, 64]),
    (si.Dopri8(), 8, [3, 4, 6, 8]),
]


@pytest.mark.parametrize("integrator,order,ns", RK_CASES,
                         ids=lambda x: type(x).__name__ if isinstance(x, si.AbstractIntegrator) else "")
def test_runge_kutta_order_nonautonomous(integrator, order, ns):
    T, y0 = 2.0, 0.3
    errors, dts = [], []
    for n in ns:
        dt = T / n
        tr = sciax.simulate(ForcedDecay(), jnp.array([y0]), integrator=integrator, dt=dt, n_steps=n)
        exact = ForcedDecay.exact(y0, np.asarray(tr.times))
        errors.append(np.max(np.abs(np.asarray(tr.states[:, 0]) - exact)))  # max over all frames
        dts.append(dt)
    assert min(errors) > 1e-14, "errors reached round-off; the fit would be meaningless"
    assert abs(observed_order(errors, dts) - order) < 0.3, (errors, observed_order(errors, dts))


@pytest.mark.parametrize(
    "integrator,order,ns",
    [(si.VelocityVerlet(), 2, [20, 40, 80, 160]), (si.Leapfrog(), 2, [20, 40, 80, 160]),
     (si.Yoshida4(), 4, [10, 20, 40, 80]), (si.RK4(), 4, [10, 20, 40, 80])],
    ids=["VelocityVerlet", "Leapfrog", "Yoshida4", "RK4-on-Hamiltonian"],
)
def test_particle_integrator_order_harmonic(integrator, order, ns):
    system = HarmonicOscillator(stiffness=4.0, masses=1.0)  # omega = 2
    s0 = PhaseSpace(jnp.array([1.0, -0.5]), jnp.array([0.3, 1.0]))
    T = 3.0
    exact = system.exact(s0, T)
    errors, dts = [], []
    for n in ns:
        tr = sciax.simulate(system, s0, integrator=integrator, dt=T / n, n_steps=n, save_every=n)
        fs = tr.final_state
        errors.append(float(jnp.max(jnp.abs(jnp.concatenate([fs.positions - exact.positions,
                                                                fs.velocities - exact.velocities])))))
        dts.append(T / n)
    assert abs(observed_order(errors, dts) - order) < 0.3, (errors, observed_order(errors, dts))


def _energy_errors(integrator, steps_per_period, stride, n_frames):
    """Relative energy errors of an e = 0.5 Kepler orbit, sampled every `stride` steps.

    `stride` is chosen incommensurate with the period so that the samples visit every orbital
    phase (sampling once per period would hide Verlet's within-orbit oscillation)."""
    system = Kepler()
    s0 = system.orbit_state(1.0, 0.5)
    dt = float(system.period()) / steps_per_period
    tr = sciax.simulate(system, s0, integrator=integrator, dt=dt, n_steps=stride * n_frames,
                        save_every=stride, save_states=False,
                        observables={"energy": lambda t, s, sys: sys.energy(s)})
    e = np.asarray(tr.observables["energy"])
    return np.abs(e / e[0] - 1.0)


def test_kepler_velocity_verlet_energy_bounded_10000_periods():
    """e = 0.5 orbit for 10,007 periods: the symplectic energy error oscillates, it does not grow."""
    rel = _energy_errors(si.VelocityVerlet(), steps_per_period=400, stride=4007, n_frames=999)
    assert rel.max() < 1e-3  # bounded: O(h^2) shadow-Hamiltonian error, about 7e-4 here
    half = len(rel) // 2
    # No secular drift: the second half of the run is no worse than the first half.
    assert rel[half:].max() < 1.2 * rel[1:half].max()


def test_kepler_rk4_energy_drifts_secularly():
    """Same orbit with RK4: the energy error grows linearly in time (dissipative drift), while
    velocity Verlet's at the same step stays bounded. Shown, not claimed as a feature of RK4."""
    rk4 = _energy_errors(si.RK4(), steps_per_period=200, stride=200 * 100, n_frames=20)
    assert np.all(np.diff(rk4) > 0)
    assert rk4[-1] / rk4[1] > 15  # ~20x after 20x the time: linear growth
    vv = _energy_errors(si.VelocityVerlet(), steps_per_period=200, stride=20_011, n_frames=20)
    assert vv[10:].max() < 1.2 * vv[1:10].max()


@pytest.mark.parametrize("integrator", [si.RK4(), si.VelocityVerlet(), si.Yoshida4(), si.Leapfrog()],
                         ids=lambda i: type(i).__name__)
def test_dtype_preserved(integrator, dtype):
    system = HarmonicOscillator()
    s0 = PhaseSpace(jnp.array([1.0], dtype), jnp.array([0.0], dtype))
    tr = sciax.simulate(system, s0, integrator=integrator, dt=0.01, n_steps=10)
    assert tr.states.positions.dtype == dtype and tr.states.velocities.dtype == dtype
    assert tr.times.dtype == dtype


def test_symplectic_reversibility():
    """Stepping forward then with -dt returns to the start (to rounding): time-reversibility."""
    system = Kepler()
    s0 = system.orbit_state(1.0, 0.5)
    for integrator in (si.VelocityVerlet(), si.Leapfrog(), si.Yoshida4()):
        fwd = sciax.simulate(system, s0, integrator=integrator, dt=0.01, n_steps=500).final_state
        back = PhaseSpace(fwd.positions, -fwd.velocities)
        ret = sciax.simulate(system, back, integrator=integrator, dt=0.01, n_steps=500).final_state
        np.testing.assert_allclose(ret.positions, s0.positions, atol=1e-10)
        np.testing.assert_allclose(-ret.velocities, s0.velocities, atol=1e-10)


def test_custom_tableau_equals_named_method():
    tab = si.ButcherTableau(a=((), (0.5,)), b=(0.0, 1.0), c=(0.0, 0.5), order=2)
    y0 = jnp.array([0.3])
    a = sciax.simulate(ForcedDecay(), y0, integrator=si.ExplicitRK(tab), dt=0.1, n_steps=20)
    b = sciax.simulate(ForcedDecay(), y0, integrator=si.Midpoint(), dt=0.1, n_steps=20)
    np.testing.assert_array_equal(a.states, b.states)
    assert si.ExplicitRK(tab).order == 2


def test_bad_tableau_rejected():
    with pytest.raises(ValueError, match="must sum to 1"):
        si.ButcherTableau(a=((), (1.0,)), b=(0.5, 0.6), c=(0.0, 1.0), order=2)
    with pytest.raises(ValueError, match=r"row a\[1\] must sum to c\[1\]"):
        si.ButcherTableau(a=((), (0.3,)), b=(0.5, 0.5), c=(0.0, 1.0), order=2)


    with pytest.raises(ValueError, match="every coefficient must be finite"):
        si.ButcherTableau(a=((), (0.5,)), b=(np.nan, 1.0), c=(0.0, 0.5), order=2)
    with pytest.raises(ValueError, match="`order` must be an integer >= 1, got 'two'"):
        si.ButcherTableau(a=((), (0.5,)), b=(0.0, 1.0), c=(0.0, 0.5), order="two")
    with pytest.raises(ValueError, match="`a` must be a sequence of rows"):
        si.ButcherTableau(a=(0.0, 0.5), b=(0.0, 1.0), c=(0.0, 0.5), order=2)
    with pytest.raises(ValueError, match="`kT` must be finite and >= 0, got inf"):
        si.LangevinBAOAB(kT=np.inf, friction=1.0)


def test_tableau_from_numpy_arrays_keeps_float32_and_is_hashable():
    """Coefficients given as NumPy float64 (not weakly typed in JAX) promoted a float32 state,
    and arrays made the tableau unhashable, breaking the jit cache for the next ExplicitRK."""
    midpoint = si.ButcherTableau(a=[np.array([]), np.array([0.5])], b=np.array([0.0, 1.0]),
                                 c=np.array([0.0, 0.5]), order=np.int64(2))
    assert hash(midpoint) == hash(si.ButcherTableau(a=((), (0.5,)), b=(0.0, 1.0), c=(0.0, 0.5), order=2))
    y0 = jnp.array([0.3], jnp.float32)
    kw = dict(dt=0.1, n_steps=20)
    a = sciax.simulate(ForcedDecay(), y0, integrator=si.ExplicitRK(midpoint), **kw)
    assert a.states.dtype == jnp.float32
    np.testing.assert_array_equal(a.states, sciax.simulate(ForcedDecay(), y0, integrator=si.Midpoint(), **kw).states)
    heun = si.ButcherTableau(a=((), (1.0,)), b=(0.5, 0.5), c=(0.0, 1.0), order=2)
    b = sciax.simulate(ForcedDecay(), y0, integrator=si.ExplicitRK(heun), **kw)  # a second tableau
    np.testing.assert_array_equal(b.states, sciax.simulate(ForcedDecay(), y0, integrator=si.Heun(), **kw).states)


def test_deterministic_integrators_refuse_sdes():
    """RK4 on an SDE integrated the drift alone: Var[X_1] = 0 instead of (1 - e^-2)/2."""
    with pytest.raises(TypeError, match="RK4 is deterministic: on the SDE OrnsteinUhlenbeck .* drop the noise"):
        sciax.simulate(sciax.systems.OrnsteinUhlenbeck(), jnp.zeros(3), integrator=si.RK4(), dt=0.1,
                       n_steps=2, key=jr.key(0))


def test_sde_noise_does_not_depend_on_the_component_layout(key):
    """A system with `n_components` is stepped as a tuple of scalars; its noise must equal the
    array layout's, so step n is `EulerMaruyama().step(..., fold_in(key, n), ...)` either way."""
    from typing import ClassVar

    from sciax.systems import AbstractSDE
    from sciax.systems._base import components, like

    class Pair(AbstractSDE):
        def vector_field(self, t, y, args=None):
            x, v = components(y, 2, "Pair")
            return like(y, -x, -v)

        def diffusion(self, t, y, args=None):
            x, v = components(y, 2, "Pair")
            return like(y, 1.0 + 0 * x, 2.0 + 0 * v)

    class PairComponentwise(Pair):
        n_components: ClassVar[int] = 2

    kw = dict(integrator=si.EulerMaruyama(), dt=0.01, n_steps=3, key=key)
    y0 = jnp.zeros(2)
    a = sciax.simulate(Pair(), y0, **kw).final_state
    b = sciax.simulate(PairComponentwise(), y0, **kw).final_state
    np.testing.assert_array_equal(a, b)
    manual = y0
    for n in range(3):
        manual = si.EulerMaruyama().step(Pair(), n * 0.01, manual, 0.01, jr.fold_in(key, n), None)
    np.testing.assert_allclose(b, manual, rtol=1e-15, atol=1e-15)


def test_langevin_baoab_samples_boltzmann_harmonic(key):
    """BAOAB samples q exactly from exp(-U/kT) for a harmonic well (<q^2> = kT/k at any dt), and
    v from its own discrete stationary distribution (<v^2> slightly below kT/m at finite dt)."""
    kT, k, m = 0.7, 2.0, 1.5
    system = HarmonicOscillator(stiffness=k, masses=m)
    n_members, n_frames = 256, 200
    s0 = PhaseSpace(jnp.zeros(1), jnp.zeros(1))

    def run(member_key):
        return sciax.simulate(system, s0, integrator=si.LangevinBAOAB(kT=kT, friction=1.0), dt=0.3,
                              n_steps=n_frames * 10, save_every=10, key=member_key).states

    states = jax.vmap(run)(jr.split(key, n_members))
    q = np.asarray(states.positions[:, 20:, 0])  # drop 60 time units of equilibration
    v = np.asarray(states.velocities[:, 20:, 0])
    # BAOAB's exact stationary covariance for this linear map (discrete Lyapunov equation
    # Σ = F Σ Fᵀ + g gᵀ): <q²> = kT/k exactly, <v²> = kT/m (1 − (hω)²/4), 3% low at h = 0.3.
    h, c1 = 0.3, np.exp(-1.0 * 0.3)
    kick, drift = np.array([[1, 0], [-h / 2 * k / m, 1]]), np.array([[1, h / 2], [0, 1]])
    transition = kick @ drift @ np.diag([1, c1]) @ drift @ kick
    noise = kick @ drift @ np.array([0, np.sqrt((1 - c1**2) * kT / m)])
    cov = np.linalg.solve(np.eye(4) - np.kron(transition, transition), np.outer(noise, noise).ravel()).reshape(2, 2)
    np.testing.assert_allclose(cov[0, 0], kT / k, rtol=1e-12)
    np.testing.assert_allclose(cov[1, 1], kT / m * (1 - (h**2 * k / m) / 4), rtol=1e-12)
    # Samples are correlated within a member; use the spread of the per-member means as the
    # standard error (members are independent): SE = std(member means) / sqrt(n_members).
    for samples, expected in ((q**2, cov[0, 0]), (v**2, cov[1, 1])):
        member_means = samples.mean(axis=1)
        se = member_means.std(ddof=1) / np.sqrt(n_members)
        assert abs(member_means.mean() - expected) < 4 * se, (member_means.mean(), expected, se)
    # q is exact at any dt for BAOAB; v is biased at O(dt^2): check q is far closer than 1%.
    assert abs(q.var() / (kT / k) - 1) < 0.03
