"""Lotka–Volterra fitted to the Hudson's Bay Company lynx and hare pelts, 1900–1920.

Fits the four rates (α prey growth, β predation, γ predator death, δ predator growth) and the
two initial populations, all kept positive with `Positive()`. As in the Stan case study, the
noise is multiplicative (lognormal): the fit compares log populations, and the noise level is
estimated from the residuals (no `sigma` given, so the covariance is rescaled by s²).
The model is integrated by Diffrax (`sciax.Solve`, adaptive Tsit5) at the yearly data.

Run: python examples/fit_lynx_hare.py   (writes examples/output/fit_lynx_hare.png)
Data: examples/data/hudson_bay_lynx_hare.csv (see examples/data/README.md for the source).
"""

import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import sciax
from sciax.systems import LotkaVolterra

jax.config.update("jax_enable_x64", True)

table = np.loadtxt(Path(__file__).parent / "data" / "hudson_bay_lynx_hare.csv", delimiter=",", skiprows=2)
years, lynx, hare = table.T
populations = np.stack([hare, lynx], axis=1)  # state order of LotkaVolterra: (prey, predator), thousands

guess = LotkaVolterra(alpha=0.5, beta=0.025, gamma=0.9, delta=0.02)
state0 = jnp.array([30.0, 4.0])  # starting guess: the 1900 counts


def log_populations(y):
    return jnp.log(y)


start = time.perf_counter()
result = sciax.fit(
    guess, state0, years, np.log(populations),  # t0 = 1900, the first observation
    params=("alpha", "beta", "gamma", "delta"),
    transforms={"alpha": sciax.Positive(), "beta": sciax.Positive(), "gamma": sciax.Positive(),
                "delta": sciax.Positive(), "state0": sciax.Positive()},
    fit_initial_state=True,
    observe=log_populations,
    rollout=sciax.Solve(solver="tsit5", rtol=1e-8, atol=1e-8),
    compilation="fast",  # one small fit: compile quickly (see sciax.fit's docstring)
)
elapsed = time.perf_counter() - start

print(f"Lotka–Volterra fit to the Hudson's Bay lynx–hare pelts ({elapsed:.1f} s including compilation)")
print(result.summary())
print(f"noise (sd of log counts) s = {float(jnp.sqrt(result.residual_variance)):.3f}")
stan = {"alpha": 0.55, "beta": 0.028, "gamma": 0.80, "delta": 0.024}
print("Stan case study posterior means, for comparison: "
      + ", ".join(f"{k} ≈ {v}" for k, v in stan.items()))
for name, reference in stan.items():
    value, error = float(result.params[name]), float(result.standard_errors[name])
    print(f"  {name:5s} {value:.4f} ± {error:.4f}   (Stan ≈ {reference}: {abs(value - reference) / error:.1f} SE away)")

fig = sciax.plot_fit(result, years, np.log(populations), labels=["ln hare (thousands)", "ln lynx (thousands)"],
                     title="Lotka–Volterra fit, Hudson's Bay pelts 1900–1920 (95% parameter band)")
fig.axes[-1].set_xlabel("year")
out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "output" / "fit_lynx_hare.png"
out.parent.mkdir(parents=True, exist_ok=True)
fig.savefig(out, dpi=120)
print(f"wrote {out}")

# What this example shows, checked (a non-zero exit if it stops being true).
errors = np.array([float(result.standard_errors[n]) for n in stan])
if not (result.converged and np.all(np.isfinite(errors)) and np.all(errors > 0)):
    sys.exit(f"expected a converged fit with finite standard errors; got converged={result.converged}, SE {errors}")
