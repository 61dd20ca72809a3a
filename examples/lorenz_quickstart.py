"""Lorenz: simulate one trajectory, an ensemble over rho with vmap, and d(loss)/d(rho) with grad.

Run: python examples/lorenz_quickstart.py   (writes examples/output/lorenz_quickstart.png)
"""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import sciax  # noqa: E402
from sciax.integrators import RK4  # noqa: E402
from sciax.systems import Lorenz  # noqa: E402

jax.config.update("jax_enable_x64", True)
y0 = jnp.array([1.0, 1.0, 1.0])


def run(rho, n_steps=4000):
    return sciax.simulate(Lorenz(rho=rho), y0, integrator=RK4(), dt=0.005, n_steps=n_steps, save_every=4)


# One trajectory on the attractor.
traj = run(28.0)
# An ensemble: vmap over rho (one compiled program, every member in lock-step).
rhos = jnp.linspace(0.5, 30.0, 64)
finals = jax.vmap(lambda r: run(r).final_state)(rhos)
# A gradient through 1,000 RK4 steps: d/d rho of the time-averaged z.
mean_z = lambda rho: jnp.mean(run(rho, n_steps=1000).states[:, 2])  # noqa: E731
dz = jax.grad(mean_z)(28.0)
print(f"final state (rho=28): {traj.final_state}")
print(f"d<z>/d rho over t in [0, 5] at rho=28: {float(dz):.4f}")

fig, axes = plt.subplots(1, 2, figsize=(10, 4))
axes[0].plot(traj.states[:, 0], traj.states[:, 2], lw=0.5)
axes[0].set(xlabel="x", ylabel="z", title="Lorenz attractor (rho = 28, RK4, dt = 0.005)")
axes[1].plot(rhos, finals[:, 2], "o", ms=3)
axes[1].set(xlabel="rho", ylabel="z(t = 20)", title="ensemble over rho (jax.vmap)")
fig.tight_layout()
out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "output" / "lorenz_quickstart.png"
out.parent.mkdir(parents=True, exist_ok=True)
fig.savefig(out, dpi=120)
print(f"wrote {out}")
