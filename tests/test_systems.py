"""Tests of the systems library: each numerical claim against an independent reference.

References used: hand-written NumPy formulas (vector fields, forces), a Lagrangian written
from Cartesian coordinates and differentiated by JAX (double pendulum), closed-form solutions
(damped–driven oscillator, pendulum period via SciPy's elliptic K, SIR final-size relation,
OU/GBM moments, chain normal modes), SciPy's Radau solver with published reference values
(Robertson), and the published figure-eight three-body orbit.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest
import scipy.optimize
import scipy.special
from scipy.integrate import solve_ivp

import sciax
from sciax.app.scenario import system_classes
from sciax.integrators import RK4, EulerMaruyama, VelocityVerlet, Yoshida4
from sciax.systems import (
    FIGURE_EIGHT_PERIOD,
    SEIR,
    SIR,
    DampedDrivenOscillator,
    DoublePendulum,
    FitzHughNagumo,
    GeometricBrownianMotion,
    HarmonicOscillator,
    LotkaVolterra,
    MassSpringChain,
    MassSpringLattice,
    NBody,
    OrnsteinUhlenbeck,
    Pendulum,
    Robertson,
)


def _conserved(t, y, system):
    return system.conserved_quantities(t, y)


# ---------------------------------------------------------------------------------------------
# ODE vector fields against NumPy formulas, and the tuple (struct-of-arrays) layout
# ---------------------------------------------------------------------------------------------


def _ddo_numpy(p, t, y):
    x, v = y
    return np.array([v, p["drive_amplitude"] * np.cos(p["drive_frequency"] * t)
                     - 2 * p["zeta"] * p["omega"] * v - p["omega"] ** 2 * x])


def _pendulum_numpy(p, t, y):
    th, w = y
    return np.array([w, -p["gravity"] / p["length"] * np.sin(th) - p["damping"] * w])


def _double_pendulum_numpy(p, t, y):
    # Written from the textbook form (e.g. myphysicslab), not copied from the module.
    th1, th2, w1, w2 = y
    m1, m2, l1, l2, g = p["mass1"], p["mass2"], p["length1"], p["length2"], p["gravity"]
    num1 = (-g * (2 * m1 + m2) * np.sin(th1) - m2 * g * np.sin(th1 - 2 * th2)
            - 2 * np.sin(th1 - th2) * m2 * (w2**2 * l2 + w1**2 * l1 * np.cos(th1 - th2)))
    num2 = 2 * np.sin(th1 - th2) * (w1**2 * l1 * (m1 + m2) + g * (m1 + m2) * np.cos(th1)
                                    + w2**2 * l2 * m2 * np.cos(th1 - th2))
    den = 2 * m1 + m2 - m2 * np.cos(2 * th1 - 2 * th2)
    return np.array([w1, w2, num1 / (l1 * den), num2 / (l2 * den)])


def _fhn_numpy(p, t, y):
    v, w = y
    return np.array([v - v**3 / 3 - w + p["current"], (v + p["a"] - p["b"] * w) / p["tau"]])


def _lv_numpy(p, t, y):
    x, z = y
    return np.array([p["alpha"] * x - p["beta"] * x * z, p["delta"] * x * z - p["gamma"] * z])


def _sir_numpy(p, t, y):
    s, i, r = y
    n = p["population"]
    return np.array([-p["beta"] * s * i / n, p["beta"] * s * i / n - p["gamma"] * i, p["gamma"] * i])


def _seir_numpy(p, t, y):
    s, e, i, r = y
    n = p["population"]
    return np.array([-p["beta"] * s * i / n, p["beta"] * s * i / n - p["sigma"] * e,
                     p["sigma"] * e - p["gamma"] * i, p["gamma"] * i])


def _robertson_numpy(p, t, y):
    y1, y2, y3 = y
    return np.array([-p["k1"] * y1 + p["k3"] * y2 * y3,
                     p["k1"] * y1 - p["k2"] * y2**2 - p["k3"] * y2 * y3,
                     p["k2"] * y2**2])


# name: (class, parameter names, NumPy reference formula)
ODE_CASES = {
    "DampedDrivenOscillator": (DampedDrivenOscillator,
                               ("omega", "zeta", "drive_amplitude", "drive_frequency"), _ddo_numpy),
    "Pendulum": (Pendulum, ("gravity", "length", "damping"), _pendulum_numpy),
    "DoublePendulum": (DoublePendulum, ("mass1", "mass2", "length1", "length2", "gravity"),
                       _double_pendulum_numpy),
    "FitzHughNagumo": (FitzHughNagumo, ("a", "b", "tau", "current"), _fhn_numpy),
    "LotkaVolterra": (LotkaVolterra, ("alpha", "beta", "gamma", "delta"), _lv_numpy),
    "SIR": (SIR, ("beta", "gamma", "population"), _sir_numpy),
    "SEIR": (SEIR, ("beta", "sigma", "gamma", "population"), _seir_numpy),
    "Robertson": (Robertson, ("k1", "k2", "k3"), _robertson_numpy),
}


def _random_system(name, rng):
    cls, names, reference = ODE_CASES[name]
    params = {n: float(rng.uniform(0.2, 2.0)) for n in names}
    return cls(**params), params, reference


@pytest.mark.parametrize("name", sorted(ODE_CASES))
def test_vector_field_matches_numpy(name):
    rng = np.random.default_rng(sorted(ODE_CASES).index(name))
    for _ in range(5):
        system, params, reference = _random_system(name, rng)
        n = system.n_components
        y = rng.uniform(0.1, 2.0, size=n)
        t = float(rng.uniform(0, 10))
        got = system.vector_field(t, jnp.asarray(y))
        assert got.shape == (n,) and got.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(got), reference(params, t, y), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(ODE_CASES))
def test_tuple_state_equals_array_state(name):
    rng = np.random.default_rng(1)
    system, _, _ = _random_system(name, rng)
    n = system.n_components
    y = jnp.asarray(rng.uniform(0.1, 2.0, size=n))
    t = 0.7
    from_array = system.vector_field(t, y)
    from_tuple = system.vector_field(t, tuple(y[i] for i in range(n)))
    assert isinstance(from_tuple, tuple) and len(from_tuple) == n
    np.testing.assert_allclose(np.stack(from_tuple), from_array, rtol=1e-14)
    # Struct-of-arrays under batching: a tuple of (B,) arrays gives the vmap of the array form.
    batch = jnp.asarray(rng.uniform(0.1, 2.0, size=(7, n)))
    soa = system.vector_field(t, tuple(batch[:, i] for i in range(n)))
    aos = jax.vmap(lambda yy: system.vector_field(t, yy))(batch)
    np.testing.assert_allclose(np.stack(soa, axis=-1), aos, rtol=1e-14)


def test_wrong_state_shape_names_the_system():
    with pytest.raises(sciax.StateMismatchError, match=r"DoublePendulum expects a state of shape \(4,\)"):
        DoublePendulum().vector_field(0.0, jnp.zeros(3))
    with pytest.raises(sciax.StateMismatchError, match="SEIR expects a state of 4 components"):
        SEIR().vector_field(0.0, (1.0, 0.0, 0.0))


def test_lotka_volterra_fixed_point_is_stationary():
    lv = LotkaVolterra()
    np.testing.assert_allclose(lv.fixed_point(), [0.80 / 0.024, 0.55 / 0.028], rtol=1e-14)
    np.testing.assert_allclose(lv.vector_field(0.0, lv.fixed_point()), 0.0, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Conservation along trajectories
# ---------------------------------------------------------------------------------------------


def _chain_case():
    chain = MassSpringChain(masses=jnp.array([1.0, 2.0, 0.5, 1.5]), stiffness=jnp.array([1.0, 3.0, 2.0]),
                            rest_length=0.8)
    state = chain.equilibrium_state(dimension=2)
    rng = np.random.default_rng(2)
    state = sciax.PhaseSpace(state.positions + 0.1 * rng.normal(size=(4, 2)), 0.3 * rng.normal(size=(4, 2)))
    return chain, state


def _lattice_case():
    lattice = MassSpringLattice.square(3, 3, spacing=1.0, stiffness=5.0, diagonals=True)
    rng = np.random.default_rng(3)
    rest = lattice.rest_state()
    state = sciax.PhaseSpace(rest.positions + 0.05 * rng.normal(size=(9, 2)), 0.2 * rng.normal(size=(9, 2)))
    return lattice, state


# name: (factory -> (system, state, observables), integrator, dt, n_steps, relative tolerance
# on energy-like quantities). Momenta and linear invariants (totals) must hold to 1e-12.
CONSERVATION_CASES = {
    # RK4 is not symplectic: energy drifts as O(dt^4 t); these dt keep it far below the tolerance.
    "DoublePendulum": (lambda: (DoublePendulum(mass1=1.3, mass2=0.7, length1=0.9, length2=1.2),
                                jnp.array([2.0, -1.0, 0.5, 1.5]), None), RK4(), 1e-3, 3000, 1e-8),
    "Pendulum": (lambda: (Pendulum(), jnp.array([2.5, 0.0]),
                          {"energy": lambda t, y, s: s.energy(y)}), RK4(), 1e-3, 2000, 1e-10),
    "DampedDrivenOscillator": (lambda: (DampedDrivenOscillator(omega=2.0, zeta=0.0), jnp.array([1.0, 0.5]),
                                        {"energy": lambda t, y, s: s.energy(y)}), RK4(), 1e-3, 2000, 1e-11),
    "LotkaVolterra": (lambda: (LotkaVolterra(), jnp.array([30.0, 4.0]), None), RK4(), 1e-3, 10000, 1e-9),
    # Linear invariants are kept exactly by any Runge–Kutta method (up to rounding).
    "SIR": (lambda: (SIR(population=1000.0), jnp.array([990.0, 10.0, 0.0]), None), RK4(), 0.5, 200, 1e-13),
    "SEIR": (lambda: (SEIR(population=1000.0), jnp.array([990.0, 5.0, 5.0, 0.0]), None), RK4(), 0.5, 200, 1e-13),
    "Robertson": (lambda: (Robertson(), jnp.array([1.0, 0.0, 0.0]), None), RK4(), 2e-4, 500, 1e-13),
    # Symplectic integrators: bounded energy error of order dt^2 (Verlet) / dt^4 (Yoshida);
    # momentum and angular momentum are conserved to rounding for pair forces.
    "MassSpringChain": (lambda: _chain_case() + (None,), VelocityVerlet(), 1e-3, 2000, 1e-6),
    "MassSpringLattice": (lambda: _lattice_case() + (None,), Yoshida4(), 1e-2, 300, 1e-6),
}


@pytest.mark.parametrize("name", sorted(CONSERVATION_CASES))
def test_conserved_quantities_are_conserved(name):
    factory, integrator, dt, n_steps, rtol = CONSERVATION_CASES[name]
    system, state0, observables = factory()
    traj = sciax.simulate(system, state0, integrator=integrator, dt=dt, n_steps=n_steps,
                          save_every=n_steps // 10, observables=observables or {"q": _conserved})
    values = traj.observables if observables else traj.observables["q"]
    assert values, f"{name} declares no conserved quantity"
    for quantity, series in values.items():
        series = np.asarray(series)
        scale = max(np.max(np.abs(series)), 1.0)
        drift = np.max(np.abs(series - series[0]))
        tolerance = rtol if quantity in ("energy", "invariant") else min(rtol, 1e-12)
        assert drift <= tolerance * scale, f"{name}.{quantity}: drift {drift:.3g} > {tolerance:g} x {scale:.3g}"
    # The state actually moved: conservation is not trivially true.
    first, last = jax.tree.leaves(traj.states)[0][0], jax.tree.leaves(traj.states)[0][-1]
    assert np.max(np.abs(np.asarray(last) - np.asarray(first))) > 1e-3


# ---------------------------------------------------------------------------------------------
# Oscillators against independent derivations
# ---------------------------------------------------------------------------------------------


def _bobs(params, q):
    _, _, l1, l2, _ = params
    x1, y1 = l1 * jnp.sin(q[0]), -l1 * jnp.cos(q[0])
    return jnp.array([x1, y1, x1 + l2 * jnp.sin(q[1]), y1 - l2 * jnp.cos(q[1])])


def _cartesian_lagrangian(params, q, qdot):
    """(L, E) of the double pendulum from Cartesian bob positions: T = Σ ½ m |ṙ|², V = Σ m g y."""
    m1, m2, _, _, g = params
    r, rdot = jax.jvp(lambda q_: _bobs(params, q_), (q,), (qdot,))
    kinetic = 0.5 * m1 * (rdot[0] ** 2 + rdot[1] ** 2) + 0.5 * m2 * (rdot[2] ** 2 + rdot[3] ** 2)
    potential = m1 * g * r[1] + m2 * g * r[3]
    return kinetic - potential, kinetic + potential


@jax.jit
def _euler_lagrange(params, y):
    """Accelerations from d/dt ∂L/∂q̇ = ∂L/∂q, i.e. M q̈ = ∂L/∂q − (∂²L/∂q̇∂q) q̇, and
    the vector field, energy and bob positions of the sciax system, for comparison."""
    q, qdot = y[:2], y[2:]
    lag = lambda q_, qd_: _cartesian_lagrangian(params, q_, qd_)[0]  # noqa: E731
    mass_matrix = jax.hessian(lag, argnums=1)(q, qdot)
    mixed = jax.jacfwd(jax.grad(lag, argnums=1), argnums=0)(q, qdot)
    rhs = jax.grad(lag, argnums=0)(q, qdot) - mixed @ qdot
    expected = (jnp.linalg.solve(mass_matrix, rhs), _cartesian_lagrangian(params, q, qdot)[1], _bobs(params, q))
    m1, m2, l1, l2, g = params
    system = DoublePendulum(mass1=m1, mass2=m2, length1=l1, length2=l2, gravity=g)
    return expected, (system.vector_field(0.0, y), system.energy(y), system.cartesian(y))


def test_double_pendulum_matches_euler_lagrange():
    """The equations of motion against the Euler–Lagrange equations of a Lagrangian written
    independently in Cartesian coordinates and differentiated by JAX, at random states."""
    rng = np.random.default_rng(5)
    for _ in range(8):
        params = jnp.asarray(np.concatenate([rng.uniform(0.3, 2.0, size=4), rng.uniform(1.0, 12.0, size=1)]))
        y = jnp.asarray(rng.uniform(-3.0, 3.0, size=4))
        (accel, energy, bobs), (field, got_energy, got_bobs) = _euler_lagrange(params, y)
        np.testing.assert_allclose(field[:2], y[2:], rtol=1e-14)
        np.testing.assert_allclose(field[2:], accel, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(got_energy, energy, rtol=1e-12)
        np.testing.assert_allclose(got_bobs, bobs, rtol=1e-14, atol=1e-15)


def test_damped_driven_oscillator_exact_solution():
    osc = DampedDrivenOscillator(omega=2.0, zeta=0.15, drive_amplitude=0.8, drive_frequency=1.3)
    y0 = jnp.array([0.7, -0.4])
    # The closed form satisfies the initial condition and the ODE (checked by autodiff) ...
    np.testing.assert_allclose(osc.exact(y0, 0.0), y0, atol=1e-14)
    times = jnp.array([0.3, 2.0, 7.5])
    dydt = jax.jit(jax.vmap(jax.jacfwd(lambda tt: osc.exact(y0, tt))))(times)
    field = jax.jit(jax.vmap(lambda tt: osc.vector_field(tt, osc.exact(y0, tt))))(times)
    np.testing.assert_allclose(dydt, field, rtol=1e-12, atol=1e-12)
    # ... and an RK4 rollout of the vector field reproduces it (RK4 error ~ dt^4).
    traj = sciax.simulate(osc, y0, integrator=RK4(), dt=2e-3, n_steps=4000, save_every=200)
    np.testing.assert_allclose(traj.states, osc.exact(y0, traj.times), atol=1e-10)
    # Tuple in, tuple out; vector t gives (T, 2).
    x, v = osc.exact((y0[0], y0[1]), 1.0)
    np.testing.assert_allclose(jnp.stack([x, v]), osc.exact(y0, 1.0), rtol=1e-14)
    assert osc.exact(y0, jnp.linspace(0, 1, 5)).shape == (5, 2)


def test_undriven_oscillator_exact_solution_at_drive_frequency_equal_to_omega():
    # ζ = 0 with the default Ω = 1 = ω: D = 0, but F = 0 means no particular part (was NaN).
    osc = DampedDrivenOscillator(omega=1.0, zeta=0.0)
    t = jnp.array([0.0, 1.0, 2.5])
    np.testing.assert_allclose(osc.exact(jnp.array([1.0, 0.0]), t),
                               np.stack([np.cos(t), -np.sin(t)], axis=-1), rtol=1e-14, atol=1e-15)
    grad = jax.grad(lambda w: osc.__class__(omega=w, zeta=0.0).exact(jnp.array([1.0, 0.0]), 2.5)[0])(1.0)
    np.testing.assert_allclose(grad, -2.5 * np.sin(2.5), rtol=1e-12)  # d/dω cos(ωt) = -t sin ωt
    # Away from resonance the derivative in F at F = 0 is the particular part's, not 0.
    def x_at(f):
        return DampedDrivenOscillator(omega=2.0, zeta=0.1, drive_amplitude=f, drive_frequency=1.3).exact(
            jnp.array([1.0, 0.3]), 2.7)[0]

    h = 1e-5
    np.testing.assert_allclose(jax.grad(x_at)(0.0), (x_at(h) - x_at(-h)) / (2 * h), rtol=1e-8)


def test_pendulum_period():
    pendulum = Pendulum(gravity=9.81, length=0.75)
    amplitudes = np.array([0.01, 0.5, 1.5, 2.5, 3.0])
    # T = 4 √(L/g) K(m), m = sin²(θ₀/2) (SciPy's ellipk uses the parameter m = k²).
    reference = 4 * np.sqrt(0.75 / 9.81) * scipy.special.ellipk(np.sin(amplitudes / 2) ** 2)
    np.testing.assert_allclose(pendulum.period(jnp.asarray(amplitudes)), reference, rtol=1e-13)
    # A released pendulum is back at rest at its starting angle after one period.
    theta0 = 2.5
    period = float(pendulum.period(theta0))
    n_steps = 2000
    traj = sciax.simulate(pendulum, jnp.array([theta0, 0.0]), integrator=RK4(), dt=period / n_steps,
                          n_steps=n_steps, save_every=n_steps // 4)
    np.testing.assert_allclose(traj.states[-1], [theta0, 0.0], atol=1e-8)
    # Half a period later it is at −θ₀ (and not at θ₀: the check can fail).
    np.testing.assert_allclose(traj.states[2], [-theta0, 0.0], atol=1e-8)


# ---------------------------------------------------------------------------------------------
# Population models and chemistry
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [SIR, SEIR])
def test_epidemic_final_size(cls):
    """Final-size relation (fractions, R(0) = 0): dS/dR = −R₀ S and E∞ = I∞ = 0 give
    S∞ = S₀ exp(−R₀ (1 − S∞)), solved here by SciPy's brentq."""
    model = cls(beta=0.4, gamma=0.1)
    y0 = model.default_state()
    s0 = float(y0[0])
    r0 = float(model.basic_reproduction_number)
    assert r0 == pytest.approx(4.0)
    s_inf = scipy.optimize.brentq(lambda s: s - s0 * np.exp(-r0 * (1 - s)), 1e-12, 0.5)
    traj = sciax.simulate(model, y0, integrator=RK4(), dt=0.25, n_steps=2400, save_every=2400)
    final = traj.states[-1]
    assert float(jnp.sum(final[1:-1])) < 1e-6  # epidemic over
    np.testing.assert_allclose(final[0], s_inf, rtol=1e-6)


def test_sir_fractions_and_counts_agree():
    population = 5e4
    fractions = SIR(beta=0.35, gamma=0.12)
    counts = SIR(beta=0.35, gamma=0.12, population=population)
    y0 = jnp.array([0.99, 0.01, 0.0])
    run = lambda system, y: sciax.simulate(system, y, integrator=RK4(), dt=0.5, n_steps=100,  # noqa: E731
                                           save_every=50).states
    np.testing.assert_allclose(run(counts, population * y0), population * run(fractions, y0), rtol=1e-12)


def test_robertson_reference_solution():
    """SciPy's Radau (an implicit solver) driven by sciax's vector field reproduces the
    published t = 40 values (Hairer & Wanner, Solving ODEs II)."""
    system = Robertson()
    f = jax.jit(lambda y: system.vector_field(0.0, y))
    jacobian = jax.jit(jax.jacfwd(lambda y: system.vector_field(0.0, y)))
    solution = solve_ivp(lambda t, y: np.asarray(f(jnp.asarray(y))), (0.0, 40.0), [1.0, 0.0, 0.0],
                         method="Radau", rtol=1e-10, atol=1e-14,
                         jac=lambda t, y: np.asarray(jacobian(jnp.asarray(y))))
    np.testing.assert_allclose(solution.y[:, -1], [0.7158270687, 9.185534764e-6, 0.2841637457], rtol=1e-8)


# ---------------------------------------------------------------------------------------------
# SDEs: moments of seeded Euler–Maruyama ensembles
# ---------------------------------------------------------------------------------------------


def test_ornstein_uhlenbeck_moments():
    ou = OrnsteinUhlenbeck(theta=1.5, mu=0.5, sigma=0.8)
    y0 = jnp.array([2.0, -1.0])
    n_paths, dt, n_steps = 4000, 0.01, 200
    keys = jr.split(jr.key(123), n_paths)
    run = jax.vmap(lambda k: sciax.simulate(ou, y0, integrator=EulerMaruyama(), dt=dt, n_steps=n_steps,
                                            save_every=50, key=k).states)
    samples = np.asarray(run(keys))  # (paths, frames, 2)
    times = np.arange(samples.shape[1]) * 50 * dt
    n = n_paths
    for k, t in enumerate(times[1:], start=1):
        mean_exact = np.asarray(ou.mean(y0, t))
        var_exact = float(ou.variance(t))
        # The sample mean has standard error √(Var/n); the sample variance of Gaussian data has
        # standard error Var √(2/(n−1)). 5 standard errors: a false failure has probability
        # ~6e-7 per check. Euler–Maruyama's weak bias here is O(θ dt) ≈ 1.5% of Var at most,
        # well below 5 SE of the variance (≈ 11%), and ~1e-4 on the mean.
        se_mean = np.sqrt(var_exact / n)
        se_var = var_exact * np.sqrt(2 / (n - 1))
        np.testing.assert_array_less(np.abs(samples[:, k].mean(axis=0) - mean_exact), 5 * se_mean)
        np.testing.assert_array_less(np.abs(samples[:, k].var(axis=0, ddof=1) - var_exact),
                                     5 * se_var + 0.015 * var_exact)
    # The paths are random (not the mean): the variance is not zero.
    assert samples[:, -1].var() > 0.5 * float(ou.variance(times[-1]))
    np.testing.assert_allclose(ou.variance(100.0), ou.stationary_variance(), rtol=1e-12)


def test_ornstein_uhlenbeck_any_state_shape():
    ou = OrnsteinUhlenbeck()
    y0 = jnp.ones((2, 3), jnp.float32)
    traj = sciax.simulate(ou, y0, integrator=EulerMaruyama(), dt=0.01, n_steps=10, key=jr.key(0))
    assert traj.states.shape == (11, 2, 3) and traj.states.dtype == jnp.float32
    np.testing.assert_allclose(ou.diffusion(0.0, y0), 1.0)


def test_geometric_brownian_motion_mean():
    gbm = GeometricBrownianMotion(mu=0.3, sigma=0.4)
    y0 = jnp.array([1.5])
    n_paths, dt, n_steps = 4000, 0.01, 100
    keys = jr.split(jr.key(7), n_paths)
    final = jax.vmap(lambda k: sciax.simulate(gbm, y0, integrator=EulerMaruyama(), dt=dt, n_steps=n_steps,
                                              save_every=n_steps, key=k).states[-1, 0])(keys)
    final = np.asarray(final)
    t = n_steps * dt
    mean_exact = float(gbm.mean(y0, t)[0])
    var_exact = float(gbm.variance(y0, t)[0])
    # Standard error of the sample mean √(Var/n); EM's weak bias in the mean is
    # S₀(e^{μt} − (1 + μ dt)^{t/dt}) ≈ 3e-3 relative, added to 5 standard errors.
    bias = 1.5 * (np.exp(0.3 * t) - (1 + 0.3 * dt) ** n_steps)
    assert abs(final.mean() - mean_exact) < 5 * np.sqrt(var_exact / n_paths) + abs(bias)
    # Var of lognormal data is not Gaussian-SE'd; check it loosely (30%): it is far from 0.
    assert abs(final.var() - var_exact) < 0.3 * var_exact
    # Exact solution: W = 0 gives S₀ exp((μ − σ²/2) t).
    np.testing.assert_allclose(gbm.exact(y0, t, jnp.zeros(1)), 1.5 * np.exp((0.3 - 0.08) * t), rtol=1e-14)


# ---------------------------------------------------------------------------------------------
# Particle systems
# ---------------------------------------------------------------------------------------------


def _nbody_forces_numpy(q, m, g, eps):
    forces = np.zeros_like(q)
    for i in range(len(m)):
        for j in range(len(m)):
            if i != j:
                d = q[i] - q[j]
                forces[i] -= g * m[i] * m[j] * d / (d @ d + eps**2) ** 1.5
    return forces


@pytest.mark.parametrize("softening", [0.0, 0.3])
def test_nbody_forces_match_pairwise_sum(softening):
    rng = np.random.default_rng(8)
    q = rng.normal(size=(6, 3))
    m = rng.uniform(0.5, 2.0, size=6)
    system = NBody(masses=m, gravitational_constant=1.7, softening=softening)
    force = eqx.filter_jit(lambda s, x: s.force(x))
    np.testing.assert_allclose(force(system, jnp.asarray(q)), _nbody_forces_numpy(q, m, 1.7, softening),
                               rtol=1e-12, atol=1e-12)
    u = -1.7 * sum(m[i] * m[j] / np.sqrt(np.sum((q[i] - q[j]) ** 2) + softening**2)
                   for i in range(6) for j in range(i + 1, 6))
    np.testing.assert_allclose(system.potential_energy(jnp.asarray(q)), u, rtol=1e-13)


def test_nbody_gradient_finite_for_coincident_softened_bodies():
    system = NBody(masses=jnp.ones(3), softening=0.1)
    q = jnp.array([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0]])
    f = eqx.filter_jit(lambda s, x: s.force(x))(system, q)
    assert bool(jnp.all(jnp.isfinite(f)))
    np.testing.assert_allclose(f, _nbody_forces_numpy(np.asarray(q), np.ones(3), 1.0, 0.1), atol=1e-14)


def test_nbody_figure_eight_is_periodic():
    system, state0 = NBody.figure_eight()
    n_steps = 2000
    traj = sciax.simulate(system, state0, integrator=RK4(), dt=FIGURE_EIGHT_PERIOD / n_steps, n_steps=n_steps,
                          save_every=n_steps // 4, observables={"q": _conserved})
    # The published initial conditions have 8 digits; RK4 at this step returns within ~3e-8.
    final = traj.final_state
    np.testing.assert_allclose(final.positions, state0.positions, atol=1e-6)
    np.testing.assert_allclose(final.velocities, state0.velocities, atol=1e-6)
    # Half a period in, the bodies are far from where they started (the check can fail).
    assert float(jnp.max(jnp.abs(traj.states.positions[2] - state0.positions))) > 0.5
    for name, series in traj.observables["q"].items():
        np.testing.assert_allclose(series - series[0], 0.0, atol=1e-9, err_msg=name)


def test_nbody_random_cluster_is_virialised_and_conserves():
    @eqx.filter_jit
    def make(key):
        system, state = NBody.random_cluster(key, 12, dimension=3, radius=2.0, total_mass=3.0, softening=0.1)
        summary = (system.kinetic_energy(state.velocities), system.potential_energy(state.positions),
                   system.momentum(state), system.center_of_mass(state.positions))
        return system, state, summary

    system, state, (kinetic, potential, momentum, center) = make(jr.key(9))
    assert state.positions.shape == (12, 3)
    np.testing.assert_allclose(jnp.sum(system.masses), 3.0, rtol=1e-14)
    np.testing.assert_allclose(2 * kinetic, -potential, rtol=1e-12)
    np.testing.assert_allclose(momentum, 0.0, atol=1e-14)
    np.testing.assert_allclose(center, 0.0, atol=1e-14)
    assert float(jnp.max(jnp.linalg.norm(state.positions, axis=-1))) < 4.0  # inside 2 radius after COM shift
    # 3-D conservation with velocity Verlet: momentum and angular momentum (a 3-vector) to
    # rounding; energy error bounded and O(dt^2): ~4e-6 relative at dt = 1e-3 during a close
    # encounter, ~1e-7 at dt = 5e-4.
    traj = sciax.simulate(system, state, integrator=VelocityVerlet(), dt=5e-4, n_steps=1000, save_every=100,
                          observables={"q": _conserved})
    assert float(jnp.max(jnp.abs(traj.states.positions[-1] - state.positions))) > 0.05
    conserved = traj.observables["q"]
    assert conserved["angular_momentum"].shape == (11, 3)
    np.testing.assert_allclose(conserved["angular_momentum"] - conserved["angular_momentum"][0], 0.0, atol=1e-13)
    np.testing.assert_allclose(conserved["momentum"], 0.0, atol=1e-13)
    np.testing.assert_allclose(conserved["energy"], conserved["energy"][0], rtol=1e-6)


def _spring_forces_numpy(q, pairs, k, rest):
    forces = np.zeros_like(q)
    k = np.broadcast_to(k, (len(pairs),))
    rest = np.broadcast_to(rest, (len(pairs),))
    for s, (i, j) in enumerate(pairs):
        d = q[j] - q[i]
        r = np.sqrt(d @ d)
        f = k[s] * (r - rest[s]) * d / r  # pulls i towards j when stretched
        forces[i] += f
        forces[j] -= f
    return forces


def test_mass_spring_chain_forces():
    rng = np.random.default_rng(10)
    k = rng.uniform(0.5, 3.0, size=4)
    rest = rng.uniform(0.5, 1.5, size=4)
    chain = MassSpringChain(masses=rng.uniform(0.5, 2.0, size=5), stiffness=k, rest_length=rest)
    q = np.asarray(chain.equilibrium_state(dimension=3).positions) + 0.2 * rng.normal(size=(5, 3))
    pairs = [(i, i + 1) for i in range(4)]
    force = eqx.filter_jit(lambda s, x: s.force(x))
    np.testing.assert_allclose(force(chain, jnp.asarray(q)), _spring_forces_numpy(q, pairs, k, rest), rtol=1e-12)
    # Zero-length spring: finite gradient (double-where), not NaN.
    q[1] = q[0]
    assert bool(jnp.all(jnp.isfinite(force(chain, jnp.asarray(q)))))


def test_mass_spring_lattice_forces_and_structure():
    lattice = MassSpringLattice.square(4, 3, spacing=0.5, stiffness=2.0, diagonals=True)
    # 4x3 sites: 3*3 horizontal + 4*2 vertical + 2*(3*2) diagonal springs.
    assert len(lattice.springs) == 9 + 8 + 12
    assert hash(lattice.springs) == hash(MassSpringLattice.square(4, 3, diagonals=True).springs)
    rest = lattice.rest_state()
    force = eqx.filter_jit(lambda s, x: s.force(x))
    np.testing.assert_allclose(force(lattice, rest.positions), 0.0, atol=1e-12)
    rng = np.random.default_rng(11)
    q = np.asarray(rest.positions) + 0.05 * rng.normal(size=(12, 2))
    expected = _spring_forces_numpy(q, lattice.springs, 2.0, np.asarray(lattice.rest_lengths))
    np.testing.assert_allclose(force(lattice, jnp.asarray(q)), expected, rtol=1e-12, atol=1e-14)
    # Per-spring stiffness.
    k = rng.uniform(1.0, 2.0, size=len(lattice.springs))
    custom = MassSpringLattice(masses=lattice.masses, springs=lattice.springs, stiffness=k,
                               rest_lengths=lattice.rest_lengths)
    expected = _spring_forces_numpy(q, lattice.springs, k, np.asarray(lattice.rest_lengths))
    np.testing.assert_allclose(force(custom, jnp.asarray(q)), expected, rtol=1e-12, atol=1e-14)


def test_chain_normal_modes():
    n, k, m = 6, 2.5, 0.8
    chain = MassSpringChain.uniform(n, mass=m, stiffness=k, rest_length=1.0)
    frequencies = chain.normal_mode_frequencies()
    # Independent check: eigenvalues of the mass-weighted Hessian of U at rest are ω².
    rest = chain.equilibrium_state(dimension=1)
    hessian = jax.jit(jax.hessian(lambda x: chain.potential_energy(x[:, None])))(rest.positions[:, 0])
    omega2 = np.linalg.eigvalsh(np.asarray(hessian) / m)
    np.testing.assert_allclose(np.sqrt(np.clip(omega2, 0, None)), frequencies, atol=1e-7)
    # Dynamics: in 1-D the chain is linear, so a mode shape oscillates as cos(ω_n t).
    mode = 2
    shape = np.cos(mode * np.pi * (np.arange(n) + 0.5) / n)
    amplitude = 0.05
    q0 = rest.positions + amplitude * shape[:, None]
    dt, n_steps = 1e-3, 3000
    traj = sciax.simulate(chain, sciax.PhaseSpace(q0, jnp.zeros_like(q0)), integrator=Yoshida4(), dt=dt,
                          n_steps=n_steps, save_every=300)
    displacement = np.asarray(traj.states.positions[:, :, 0] - rest.positions[None, :, 0])
    expected = amplitude * np.cos(float(frequencies[mode]) * np.asarray(traj.times))[:, None] * shape[None, :]
    np.testing.assert_allclose(displacement, expected, atol=1e-9)


# ---------------------------------------------------------------------------------------------
# Precision, differentiability, batching
# ---------------------------------------------------------------------------------------------


def test_ode_dtype_preserved(dtype):
    osc = DampedDrivenOscillator(omega=2.0, zeta=0.1, drive_amplitude=0.5, drive_frequency=1.5)
    y0 = jnp.array([1.0, 0.0], dtype=dtype)
    traj = sciax.simulate(osc, y0, integrator=RK4(), dt=0.01, n_steps=200, save_every=100)
    assert traj.states.dtype == dtype and traj.times.dtype == dtype
    tolerance = 1e-5 if dtype == jnp.float32 else 1e-9
    np.testing.assert_allclose(traj.states, osc.exact(jnp.array([1.0, 0.0]), traj.times), atol=tolerance)
    assert osc.vector_field(0.0, tuple(y0))[1].dtype == dtype


def test_particle_dtype_preserved(dtype):
    system, state0 = NBody.figure_eight(dtype=dtype)
    assert state0.positions.dtype == dtype
    traj = sciax.simulate(system, state0, integrator=VelocityVerlet(), dt=0.01, n_steps=100, save_every=50)
    assert traj.states.positions.dtype == dtype and traj.states.velocities.dtype == dtype
    system64, state64 = NBody.figure_eight(dtype=jnp.float64)
    ref = sciax.simulate(system64, state64, integrator=VelocityVerlet(), dt=0.01, n_steps=100, save_every=50)
    tolerance = 1e-4 if dtype == jnp.float32 else 1e-12
    np.testing.assert_allclose(traj.states.positions, ref.states.positions, atol=tolerance)


def test_parameters_are_differentiable_and_vmappable():
    y0 = jnp.array([30.0, 4.0])

    def final_prey(alpha):
        traj = sciax.simulate(LotkaVolterra(alpha=alpha), y0, integrator=RK4(), dt=0.01, n_steps=200,
                              save_every=200)
        return traj.states[-1, 0]

    alpha, h = 0.55, 1e-5
    finite_difference = (final_prey(alpha + h) - final_prey(alpha - h)) / (2 * h)
    np.testing.assert_allclose(jax.jit(jax.grad(final_prey))(alpha), finite_difference, rtol=1e-6)
    alphas = jnp.array([0.5, 0.55, 0.6])
    batched = jax.vmap(final_prey)(alphas)
    np.testing.assert_allclose(batched, [final_prey(float(a)) for a in alphas], rtol=1e-12)

    # Particle-system parameters too: d(energy)/d(softening) vs finite differences.
    q = jnp.asarray(np.random.default_rng(12).normal(size=(4, 3)))
    energy = jax.jit(lambda eps: NBody(masses=jnp.ones(4), softening=eps).potential_energy(q))
    np.testing.assert_allclose(jax.jit(jax.grad(energy))(0.2), (energy(0.2 + h) - energy(0.2 - h)) / (2 * h),
                               rtol=1e-7)


def test_default_states_fit_their_systems():
    systems = [DampedDrivenOscillator(), Pendulum(), DoublePendulum(), FitzHughNagumo(), LotkaVolterra(),
               SIR(), SEIR(), Robertson(), OrnsteinUhlenbeck(), GeometricBrownianMotion(),
               NBody(masses=jnp.ones(4)), MassSpringChain.uniform(3), MassSpringLattice.square(2, 2)]
    # One compile per system instead of many eager primitives (gradients, for the Hamiltonians).
    evaluate = eqx.filter_jit(lambda s: (s.default_state(), s.vector_field(0.0, s.default_state())))

    for system in systems:
        state, derivative = evaluate(system)
        system.check_state(state)
        assert jax.tree.structure(derivative) == jax.tree.structure(state), type(system).__name__
        assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(derivative))
    # Not at equilibrium: the spring systems' default states carry a displacement.
    for system in systems[-2:]:
        assert float(jnp.max(jnp.abs(evaluate(system)[1].velocities))) > 1e-3


# ---------------------------------------------------------------------------------------------
# Validation messages
# ---------------------------------------------------------------------------------------------

INVALID = [
    (lambda: DampedDrivenOscillator(omega=0.0), r"DampedDrivenOscillator: `omega` must be > 0, got 0.0"),
    (lambda: DampedDrivenOscillator(zeta=-0.1), r"DampedDrivenOscillator: `zeta` must be >= 0, got -0.1"),
    (lambda: Pendulum(length=-1.0), r"Pendulum: `length` must be > 0, got -1.0"),
    (lambda: sciax.systems.VanDerPol(mu=-1.0), r"VanDerPol: `mu` must be >= 0, got -1.0"),
    (lambda: sciax.systems.Kepler(gm=-1.0), r"Kepler: `gm` must be > 0, got -1.0"),
    (lambda: sciax.systems.Kepler(masses=jnp.ones(2)), r"Kepler: `masses` must be a scalar, got .*\(2,\)"),
    (lambda: HarmonicOscillator(masses=0.0), r"HarmonicOscillator: `masses` must be > 0, got 0.0"),
    (lambda: Pendulum(damping=float("nan")), r"Pendulum: `damping` must be >= 0, got nan"),
    (lambda: DoublePendulum(mass2=0.0), r"DoublePendulum: `mass2` must be > 0"),
    (lambda: FitzHughNagumo(tau=0.0), r"FitzHughNagumo: `tau` must be > 0"),
    (lambda: LotkaVolterra(gamma=-1.0), r"LotkaVolterra: `gamma` must be >= 0"),
    (lambda: SIR(population=0.0), r"SIR: `population` must be > 0"),
    (lambda: SEIR(sigma=-0.2), r"SEIR: `sigma` must be >= 0"),
    (lambda: Robertson(k2=-3e7), r"Robertson: `k2` must be >= 0"),
    (lambda: OrnsteinUhlenbeck(theta=0.0), r"OrnsteinUhlenbeck: `theta` must be > 0"),
    (lambda: GeometricBrownianMotion(sigma=-0.2), r"GeometricBrownianMotion: `sigma` must be >= 0"),
    (lambda: NBody(masses=jnp.ones((2, 2))),
     r"NBody: `masses` must be a 1-D array of shape \(N,\).*got shape \(2, 2\)"),
    (lambda: NBody(masses=jnp.array([1.0, -2.0])), r"NBody: `masses` must be positive, got minimum -2.0"),
    (lambda: NBody(masses=jnp.ones(2), softening=-0.1), r"NBody: `softening` must be >= 0"),
    (lambda: NBody(masses=jnp.ones(2), softening=jnp.ones(2)), r"NBody: `softening` must be a scalar, got .*\(2,\)"),
    (lambda: MassSpringChain(masses=jnp.ones(1)), r"MassSpringChain: `masses` .* N >= 2, got shape \(1,\)"),
    (lambda: MassSpringChain(masses=jnp.ones(4), stiffness=jnp.ones(4)),
     r"MassSpringChain: `stiffness` must be a scalar or have shape \(3,\) \(one per spring\), got shape \(4,\)"),
    (lambda: MassSpringChain(masses=jnp.ones(3), rest_length=-1.0),
     r"MassSpringChain: `rest_length` must be non-negative"),
    (lambda: MassSpringChain(masses=jnp.array([1.0, 2.0])).normal_mode_frequencies(),
     r"normal_mode_frequencies: the closed form needs equal `masses`"),
    (lambda: MassSpringLattice(masses=jnp.ones(3), springs=((0, 1), (1, 3))),
     r"MassSpringLattice: `springs` indices must lie in \[0, 3\) for 3 masses, got the range \[0, 3\]"),
    (lambda: MassSpringLattice(masses=jnp.ones(3), springs=((0, 1), (2, 2))),
     r"MassSpringLattice: `springs` must join two different masses, got \(2, 2\) at index 1"),
    (lambda: MassSpringLattice(masses=jnp.ones(3), springs=(0, 1)),
     r"MassSpringLattice: `springs` must be integer index pairs of shape \(S, 2\), got shape \(2,\)"),
    (lambda: MassSpringLattice(masses=jnp.ones(3), springs=np.zeros((0, 2), int)),
     r"MassSpringLattice: `springs` must hold at least one index pair"),
    (lambda: MassSpringLattice(masses=jnp.ones(3), springs=((0, 1),), stiffness=jnp.ones(2)),
     r"MassSpringLattice: `stiffness` must be a scalar or have shape \(1,\)"),
    (lambda: MassSpringLattice(masses=jnp.ones(3), springs=((0, 1),), reference_positions=jnp.zeros((2, 2))),
     r"MassSpringLattice: `reference_positions` must have shape \(3, d\), got \(2, 2\)"),
    (lambda: MassSpringLattice(masses=jnp.ones(3), springs=((0, 1),)).rest_state(),
     r"MassSpringLattice.rest_state: this lattice has no `reference_positions`"),
    (lambda: MassSpringLattice.square(1, 1), r"MassSpringLattice.square: need at least two masses"),
]


@pytest.mark.parametrize("make, match", INVALID, ids=[m[:40] for _, m in INVALID])
def test_invalid_arguments_raise(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_phase_space_works_as_a_pytree_prefix():
    # Spec leaves (an int axis, None, ShapeDtypeStruct) stay as given; numbers and lists become arrays.
    osc = HarmonicOscillator(stiffness=2.0)
    states = sciax.PhaseSpace(jnp.array([[1.0], [2.0]]), jnp.array([0.5]))
    energies = jax.vmap(osc.energy, in_axes=(sciax.PhaseSpace(0, None),))(states)
    np.testing.assert_allclose(energies, [0.5 * 0.25 + 1.0, 0.5 * 0.25 + 4.0], rtol=1e-14)
    spec = jax.ShapeDtypeStruct((1,), jnp.float32)
    assert jax.eval_shape(osc.energy, sciax.PhaseSpace(spec, spec)).shape == ()
    from_lists = sciax.PhaseSpace([1.0, 2.0], (0.0, 0.0))
    assert isinstance(from_lists.positions, jax.Array) and isinstance(from_lists.velocities, jax.Array)


def test_validation_skipped_for_traced_parameters():
    # Systems built inside jit/vmap carry tracers: no host-side value check, no error.
    out = jax.vmap(lambda w: DampedDrivenOscillator(omega=w).vector_field(0.0, jnp.array([1.0, 0.0])))(
        jnp.array([1.0, 2.0]))
    np.testing.assert_allclose(out[:, 1], [-1.0, -4.0])
    masses = eqx.filter_jit(lambda m: NBody(masses=m).masses)(jnp.ones(3))
    np.testing.assert_allclose(masses, 1.0)


def test_component_names_match_component_counts():
    import sciax.systems as systems

    for name in systems.__all__ if hasattr(systems, "__all__") else dir(systems):
        cls = getattr(systems, name)
        if isinstance(cls, type) and getattr(cls, "n_components", None) is not None:
            assert cls.component_names is not None and len(cls.component_names) == cls.n_components, name


# ------------------------------------------------------------------- presets and precision
def _with_default_state() -> list[str]:
    """Library systems that can be built without arguments and have a default state."""
    names = []
    for name, cls in system_classes().items():
        try:
            cls().default_state()
        except (TypeError, ValueError, NotImplementedError):
            continue
        names.append(name)
    return sorted(names)


@pytest.mark.parametrize("name", _with_default_state())
def test_presets_of_a_float32_system_are_float32(name):
    """A float32 system's presets must not hand back float64 states (the whole run would then
    be float64) or a mix (simulate refuses it)."""
    system32 = sciax.astype(system_classes()[name](), jnp.float32)
    leaves = jax.tree_util.tree_leaves(system32.default_state())
    assert {x.dtype for x in leaves} == {jnp.dtype(jnp.float32)}
    if name == "Kepler":
        assert {x.dtype for x in jax.tree_util.tree_leaves(system32.orbit_state(1.0, 0.3))} == {jnp.dtype(jnp.float32)}


def test_harmonic_oscillator_exact_at_an_array_of_times():
    ho = HarmonicOscillator(stiffness=2.0)
    s0 = sciax.PhaseSpace(jnp.array([1.0, 0.0]), jnp.array([0.0, 1.0]))
    times = jnp.array([0.0, 0.7, 1.3])
    both = ho.exact(s0, times)
    assert both.positions.shape == (3, 2)
    for i, t in enumerate(times):
        np.testing.assert_allclose(both.positions[i], ho.exact(s0, t).positions, rtol=1e-15)
        np.testing.assert_allclose(both.velocities[i], ho.exact(s0, t).velocities, rtol=1e-15)


def test_harmonic_oscillator_exact_for_particles_of_different_masses():
    """N independent particles (masses (N,), positions (N, d)): each at its own ω = √(k/m),
    checked against q0 cos ωt + v0/ω sin ωt written out and against a Yoshida-4 rollout."""
    masses = jnp.array([1.0, 2.0, 4.0, 8.0])
    ho = HarmonicOscillator(stiffness=2.0, masses=masses)
    q0 = jnp.arange(12.0).reshape(4, 3) / 10
    s0 = sciax.PhaseSpace(q0, jnp.ones((4, 3)))
    times = jnp.array([0.5, 1.0])
    exact = ho.exact(s0, times)
    w = np.sqrt(2.0 / np.asarray(masses))[None, :, None]
    t = np.asarray(times)[:, None, None]
    np.testing.assert_allclose(exact.positions, q0 * np.cos(w * t) + np.sin(w * t) / w, rtol=1e-14)
    traj = sciax.simulate(ho, s0, integrator=Yoshida4(), dt=1e-3, n_steps=1000, save_every=500)
    np.testing.assert_allclose(traj.states.positions[1:], exact.positions, rtol=1e-10, atol=1e-12)


def test_step_keys_never_repeat_silently_after_2_to_the_32_steps():
    ou, key = OrnsteinUhlenbeck(), jr.key(0)

    def one_step(offset):
        return sciax.simulate(ou, jnp.zeros(3), integrator=EulerMaruyama(), dt=0.01, n_steps=1, key=key,
                              step_offset=jnp.asarray(offset, jnp.int64)).final_state

    # fold_in keeps 32 bits of the step index: step 7 + 2**32 would reuse step 7's noise.
    with pytest.raises(ValueError, match=r"a stochastic run can take at most 2\*\*32 steps"):
        one_step(7 + 2**32)
    one_step(2**32 - 1)  # the last step with its own key
    # the key of step n is fold_in(key, n), as documented
    noise = jr.normal(jr.fold_in(key, 7), (3,), jnp.float64)
    manual = EulerMaruyama().step(ou, 0.07, jnp.zeros(3), 0.01, jr.fold_in(key, 7), None)
    np.testing.assert_allclose(one_step(7), manual, rtol=1e-15)
    del noise


def test_plot_labels_come_from_the_system():
    from sciax.plot import plot_trajectory

    tr = sciax.simulate(SIR(), SIR().default_state(), integrator=RK4(), dt=0.1, n_steps=10)
    fig = plot_trajectory(tr, system=SIR())
    labels = {line.get_label() for ax in fig.axes for line in ax.get_lines()}
    labels |= {text for ax in fig.axes for text in (ax.get_xlabel(), ax.get_ylabel())}
    labels |= {ax.get_zlabel() for ax in fig.axes if hasattr(ax, "get_zlabel")}
    assert {"S", "I", "R"} <= labels, labels
