"""The benchmark workloads, defined once (plain NumPy) and shared by suites, baselines and tests.

Every implementation starts from these arrays, so all of them solve the same problem from the
same initial state.
"""

from __future__ import annotations

import numpy as np

# ---------------------------------------------------------------------------------------------
# Lorenz ensemble: the published GPU-ensemble set-up.
# ---------------------------------------------------------------------------------------------

LORENZ_SIGMA = 10.0
LORENZ_BETA = 8.0 / 3.0
ENSEMBLE_U0 = (1.0, 0.0, 0.0)
ENSEMBLE_DT = 0.001
ENSEMBLE_STEPS = 1000


def ensemble_rhos(n_members: int, dtype=np.float32) -> np.ndarray:
    """ρ = linspace(0, 21, B): one Lorenz system per member, all from u0 = (1, 0, 0)."""
    return np.linspace(0.0, 21.0, n_members).astype(dtype)


# ---------------------------------------------------------------------------------------------
# Gradient of a trajectory loss: Lorenz, 1,000 members, MSE against 100 observations
# over t in [0, 10], RK4 with dt = 10 / n_steps (1,000 steps: dt = 0.01), float64.
# ---------------------------------------------------------------------------------------------

GRADIENT_T_END = 10.0
GRADIENT_N_OBS = 100
GRADIENT_U0 = (1.0, 1.0, 1.0)
GRADIENT_TRUTH = (10.0, 28.0, 8.0 / 3.0)


def gradient_params(n_members: int, seed: int = 0) -> np.ndarray:
    """(B, 3) per-member (σ, ρ, β): the truth times (1 + 0.01 ξ), ξ ~ N(0, 1), fixed seed."""
    rng = np.random.default_rng(seed)
    return np.asarray(GRADIENT_TRUTH) * (1.0 + 0.01 * rng.standard_normal((n_members, 3)))


def rk4_reference(params, u0, dt: float, n_steps: int, save_every: int) -> np.ndarray:
    """One float64 Lorenz trajectory by classical RK4; frames every `save_every` steps (no t=0)."""
    s, r, b = params

    def f(u):
        x, y, z = u
        return np.array([s * (y - x), x * (r - z) - y, x * y - b * z])

    u = np.asarray(u0, dtype=np.float64)
    out = []
    for n in range(1, n_steps + 1):
        k1 = f(u)
        k2 = f(u + 0.5 * dt * k1)
        k3 = f(u + 0.5 * dt * k2)
        k4 = f(u + dt * k3)
        u = u + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        if n % save_every == 0:
            out.append(u)
    return np.array(out)


def gradient_observations(seed: int = 1, noise: float = 0.5) -> np.ndarray:
    """(100, 3) noisy observations of the true trajectory at t = 0.1, 0.2, ..., 10."""
    obs = rk4_reference(GRADIENT_TRUTH, GRADIENT_U0, dt=0.001, n_steps=10_000, save_every=100)
    rng = np.random.default_rng(seed)
    return obs + noise * rng.standard_normal(obs.shape)


# ---------------------------------------------------------------------------------------------
# Fit: damped oscillator x'' + 2 ζ ω x' + ω² x = 0, 200 noisy points over (0, 20].
# ---------------------------------------------------------------------------------------------

FIT_TRUTH = (2.0, 0.1)  # (ω, ζ)
FIT_START = (1.5, 0.3)
FIT_Y0 = (1.0, 0.0)  # (x, v) at t = 0
FIT_N_POINTS = 200
FIT_T_END = 20.0
FIT_NOISE = 0.05
FIT_DT = 0.01  # the fixed step used by sciax and by the PyTorch fixed-step variant


def fit_times() -> np.ndarray:
    """t_k = 0.1 k, k = 1..200: evenly spaced over (0, 20], on the dt = 0.01 step grid."""
    return FIT_T_END * np.arange(1, FIT_N_POINTS + 1) / FIT_N_POINTS


def oscillator_exact(omega: float, zeta: float, t: np.ndarray, y0=FIT_Y0) -> np.ndarray:
    """Exact x(t) of the underdamped oscillator from (x0, v0)."""
    x0, v0 = y0
    wd = omega * np.sqrt(1 - zeta**2)
    return np.exp(-zeta * omega * t) * (x0 * np.cos(wd * t) + (v0 + zeta * omega * x0) / wd * np.sin(wd * t))


def fit_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(t, x_observed): the exact solution at the true (ω, ζ) plus N(0, 0.05²) noise, fixed seed."""
    t = fit_times()
    rng = np.random.default_rng(seed)
    return t, oscillator_exact(*FIT_TRUTH, t) + FIT_NOISE * rng.standard_normal(t.shape)
