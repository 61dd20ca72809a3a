"""Epidemic uncertainty band: an SEIR model run for 4,000 parameter samples, reduced on the fly
to the median and the 50% / 90% bands of the infectious fraction I(t).

The samples are zipped axes (member i takes the i-th value of every axis): transmission rate
beta, incubation rate sigma and recovery rate gamma drawn from log-normal priors. Only the
reductions are kept (exact quantiles over members, and a streaming mean/std), not the 4,000
trajectories; failed members, if any, would be listed in `result.failures`.

Run: python examples/epidemic_uncertainty.py   (writes examples/output/epidemic_uncertainty.png)
"""

import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import jax.random as jr
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import sciax  # noqa: E402
from sciax.ensemble import Quantile  # noqa: E402
from sciax.integrators import RK4  # noqa: E402
from sciax.systems import SEIR  # noqa: E402

jax.config.update("jax_enable_x64", True)

N_SAMPLES, DAYS, DT = 4000, 180, 0.1


def infectious_and_peak(traj):
    """I(t) per day (181 values) and the peak day, per member."""
    infectious = traj.states[:, 2]
    return {"I": infectious, "peak_day": traj.times[jnp.argmax(infectious)]}


def main(out):
    k_beta, k_sigma, k_gamma = jr.split(jr.key(2024), 3)
    beta = 0.30 * jnp.exp(0.15 * jr.normal(k_beta, (N_SAMPLES,)))  # R0 = beta/gamma around 3
    sigma = 1 / 5.2 * jnp.exp(0.10 * jr.normal(k_sigma, (N_SAMPLES,)))  # incubation ~5 days
    gamma = 0.10 * jnp.exp(0.10 * jr.normal(k_gamma, (N_SAMPLES,)))  # infectious ~10 days
    start = time.perf_counter()
    result = sciax.sweep(
        SEIR(), jnp.array([0.999, 0.0, 0.001, 0.0]),
        axes={"beta": beta, "sigma": sigma, "gamma": gamma}, mode="zip",
        rollout=sciax.Simulate(RK4(), dt=DT, n_steps=int(DAYS / DT), save_every=int(1 / DT)),
        output=infectious_and_peak,
        reduce={"band": Quantile([0.05, 0.25, 0.5, 0.75, 0.95]), "mean": "mean", "std": "std"},
    )
    elapsed = time.perf_counter() - start
    print(result)
    print(f"{result.n_members} members x {int(DAYS / DT)} RK4 steps in {elapsed:.1f} s (compile included)")
    band, mean, std = result.reductions["band"], result.reductions["mean"], result.reductions["std"]
    q05, q25, q50, q75, q95 = band["I"]
    peak = band["peak_day"]
    print(f"peak day: median {peak[2]:.0f}, 90% interval [{peak[0]:.0f}, {peak[4]:.0f}]; "
          f"peak infectious fraction (median curve): {q50.max():.3f}")
    print(f"mean peak day {mean['peak_day']:.1f} +- {std['peak_day']:.1f} (streaming mean/std)")

    days = np.arange(DAYS + 1)
    fig, (ax, hist) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    ax.fill_between(days, q05, q95, color="tab:red", alpha=0.2, label="90% band")
    ax.fill_between(days, q25, q75, color="tab:red", alpha=0.4, label="50% band")
    ax.plot(days, q50, color="tab:red", lw=2, label="median")
    ax.plot(days, mean["I"], color="k", lw=1, ls="--", label="mean")
    ax.set(xlabel="day", ylabel="infectious fraction I(t)",
           title=f"SEIR: uncertainty from {N_SAMPLES} parameter samples")
    ax.legend()
    r0 = np.asarray(beta / gamma)
    hist.hist(r0, bins=50, color="tab:blue", alpha=0.7)
    hist.set(xlabel=r"$R_0 = \beta/\gamma$ of the samples", ylabel="members")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=130)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "output" / "epidemic_uncertainty.png")
