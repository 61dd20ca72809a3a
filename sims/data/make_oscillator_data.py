"""Write sims/data/damped_oscillator.csv: noisy positions of a damped oscillator with a known truth.

The truth: x'' + 2ζω x' + ω² x = 0 with ω = 2.0, ζ = 0.1, x(0) = 1, v(0) = 0 (sciax's
DampedDrivenOscillator without drive), sampled at t = 0, 0.1, ..., 19.9 (200 times), plus
Gaussian noise of standard deviation 0.05 from NumPy's default_rng(2024). The exact solution
(underdamped) is x(t) = exp(−ζωt) (cos(ω_d t) + ζω/ω_d sin(ω_d t)), ω_d = ω √(1 − ζ²).
Columns: t, x, x_err (the noise level, 0.05 for every row).

Run: python sims/data/make_oscillator_data.py   (rewrites the CSV; the committed one came from it)
"""

from pathlib import Path

import numpy as np

OMEGA, ZETA, X0, NOISE, SEED = 2.0, 0.1, 1.0, 0.05, 2024

times = 0.1 * np.arange(200)
omega_d = OMEGA * np.sqrt(1.0 - ZETA**2)
exact = X0 * np.exp(-ZETA * OMEGA * times) * (np.cos(omega_d * times)
                                              + ZETA * OMEGA / omega_d * np.sin(omega_d * times))
measured = exact + NOISE * np.random.default_rng(SEED).standard_normal(times.shape)

out = Path(__file__).with_name("damped_oscillator.csv")
with open(out, "w", encoding="utf-8") as f:
    f.write(f"# Synthetic data: damped oscillator, truth omega = {OMEGA}, zeta = {ZETA}, x(0) = {X0}, v(0) = 0; "
            f"Gaussian noise sd {NOISE}, numpy default_rng({SEED}); written by make_oscillator_data.py\n")
    f.write("t,x,x_err\n")
    for t, x in zip(times, measured):
        f.write(f"{t:.1f},{x:.17g},{NOISE}\n")
print(f"wrote {out}")
