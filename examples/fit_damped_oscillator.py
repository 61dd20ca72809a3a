"""Damping and frequency of an oscillator from noisy position measurements.

Synthetic data: the exact solution of ẍ + 2ζωẋ + ω²x = 0 with the true (ω, ζ) = (2.0, 0.1),
x(0) = 1, v(0) = 0, sampled at 200 times over [0, 20) and corrupted by Gaussian noise of
standard deviation 0.05. The fit starts from (ω, ζ) = (1.5, 0.3), integrates with RK4 at
dt = 0.01 (its error, ~1e-8, is far below the noise) and fits the initial position too.
Because `sigma` is given, the standard errors are the absolute ones, σ²(JᵀJ)⁻¹; the truth
should lie within about 2 of them (and almost always within 3).

Run: python examples/fit_damped_oscillator.py   (writes examples/output/fit_damped_oscillator.png)
"""

import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import sciax
from sciax.integrators import RK4
from sciax.systems import DampedDrivenOscillator

jax.config.update("jax_enable_x64", True)

truth = DampedDrivenOscillator(omega=2.0, zeta=0.1)
y0 = jnp.array([1.0, 0.0])
noise = 0.05
times = 0.1 * np.arange(200)  # on the RK4 step grid (dt = 0.01)
rng = np.random.default_rng(2024)
measured = np.asarray(truth.exact(y0, times))[:, 0] + noise * rng.standard_normal(times.shape)


def position(y):
    return y[0]


start = time.perf_counter()
result = sciax.fit(
    DampedDrivenOscillator(omega=1.5, zeta=0.3), jnp.array([0.9, 0.0]), times, measured,
    params=("omega", "zeta"),
    transforms={"omega": sciax.Positive(), "zeta": sciax.Bounded(0.0, 1.0)},
    fit_initial_state=jnp.array([True, False]),  # the initial position; the start is at rest
    observe=position,
    sigma=noise,
    rollout=sciax.Simulate(RK4(), dt=0.01),
    compilation="fast",  # one small fit: compile quickly (see sciax.fit's docstring)
)
elapsed = time.perf_counter() - start

print(f"damped oscillator fit ({elapsed:.1f} s including compilation)")
print(result.summary())
for name in ("omega", "zeta"):
    value, error = float(result.params[name]), float(result.standard_errors[name])
    true = float(getattr(truth, name))
    print(f"  {name:5s} = {value:.5f} ± {error:.5f}   truth {true}: {abs(value - true) / error:.2f} SE away")
print(f"correlation(omega, zeta) = {float(result.correlation[0, 1]):+.3f}; "
      f"reduced chi² = {float(result.residual_variance):.3f} (≈ 1 when sigma is right)")

fig = sciax.plot_fit(result, times, measured, labels=["x (position)"],
                     title="Damped oscillator: noisy data, fit and 95% parameter band")
out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "output" / "fit_damped_oscillator.png"
out.parent.mkdir(parents=True, exist_ok=True)
fig.savefig(out, dpi=120)
print(f"wrote {out}")

# What this example shows, checked (a non-zero exit if it stops being true).
off = {n: abs(float(result.params[n]) - float(getattr(truth, n))) / float(result.standard_errors[n])
       for n in ("omega", "zeta")}
if not (result.converged and max(off.values()) < 3):
    sys.exit(f"expected a converged fit within 3 SE of the truth; got converged={result.converged}, SE away {off}")
