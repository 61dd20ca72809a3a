"""Kepler orbit (e = 0.5): symplectic velocity Verlet keeps the energy error bounded, RK4 at
the same step drifts. Also: a gradient through a 50-period run (10,000 steps) in O(1) memory (ReversibleAdjoint).

Run: python examples/kepler_energy.py   (writes examples/output/kepler_energy.png)
"""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import sciax  # noqa: E402
from sciax.integrators import RK4, VelocityVerlet  # noqa: E402
from sciax.systems import Kepler  # noqa: E402

jax.config.update("jax_enable_x64", True)
system = Kepler()
s0 = system.orbit_state(semi_major_axis=1.0, eccentricity=0.5)
steps_per_period, periods = 200, 10_000
dt = float(system.period()) / steps_per_period
energy = {"energy": lambda t, s, sys: sys.energy(s)}
runs = {}
for integrator in (VelocityVerlet(), RK4()):
    traj = sciax.simulate(system, s0, integrator=integrator, dt=dt, n_steps=997 * 2006,  # 10,000 periods
                          save_every=997, save_states=False, observables=energy)  # 997: every phase
    e = traj.observables["energy"]
    runs[type(integrator).__name__] = (traj.times / system.period(), jnp.abs(e / e[0] - 1))
    print(f"{type(integrator).__name__:15s} max relative energy error over {periods} periods: "
          f"{float(jnp.max(runs[type(integrator).__name__][1])):.2e}")


def final_radius(gm):
    traj = sciax.simulate(Kepler(gm=gm), s0, integrator=VelocityVerlet(), dt=dt, n_steps=steps_per_period * 50,
                          save_every=steps_per_period * 50, adjoint=sciax.ReversibleAdjoint())
    return jnp.linalg.norm(traj.final_state.positions)


print(f"d|r(50 periods)|/d(GM) with the reversible adjoint: {float(jax.grad(final_radius)(1.0)):.6f}")

fig, ax = plt.subplots(figsize=(7, 4))
for name, (periods_axis, err) in runs.items():
    ax.semilogy(periods_axis, err, label=name, lw=0.8)
ax.set(xlabel="time (orbital periods)", ylabel="|E/E0 - 1|",
       title=f"Kepler e = 0.5, {steps_per_period} steps per period")
ax.legend()
fig.tight_layout()
out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "output" / "kepler_energy.png"
out.parent.mkdir(parents=True, exist_ok=True)
fig.savefig(out, dpi=120)
print(f"wrote {out}")
