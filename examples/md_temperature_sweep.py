"""Lennard-Jones replicas over temperature (reduced units): one `sciax.sweep` runs an fcc crystal of
108 atoms at ρ* = 0.8442 under the Bussi thermostat at 8 temperatures x 4 replicas (32 members,
vmapped into one compiled program). Each replica returns its mean potential energy, pressure and
mean-squared displacement; the superheated crystal melts on heating, which shows as a jump in
the energy and the onset of diffusion.

Run: python examples/md_temperature_sweep.py [out.png] [--quick]
(writes examples/output/md_temperature_sweep.png; --quick: fewer steps, for the smoke test)
"""

import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import sciax  # noqa: E402
import sciax.md as md  # noqa: E402

jax.config.update("jax_enable_x64", True)

QUICK = "--quick" in sys.argv[1:]
N_STEPS = 400 if QUICK else 6000
SAVE_EVERY = 50
DT, DENSITY = 0.005, 0.8442
TEMPERATURES = np.linspace(0.4, 2.0, 8)  # kT in ε
REPLICAS = 4  # per temperature: 8 x 4 = 32 members, what sweep vectorises together on a CPU core anyway

positions, box = md.lattice("fcc", 3, density=DENSITY)  # 108 atoms, L = 5.04 σ > 2 x cutoff
n = positions.shape[0]
masses = jnp.ones(n)
system = md.MDSystem(box, md.LennardJones(cutoff=2.5, shift="energy"), masses)  # all pairs below 1,000 atoms
reference = box.unwrap(positions, jnp.zeros_like(positions, dtype=jnp.int32))
observables = {"U": md.potential_energy, "P": md.pressure, "T": md.temperature,
               "msd": md.mean_squared_displacement(reference)}


def replica(members, state0, key):
    """One replica: velocities at its kT from its key, a Bussi run, its time averages."""
    system, thermostat = members
    velocities = md.maxwell_boltzmann(system.masses, thermostat.kT, key=jax.random.fold_in(key, 0))
    state = md.MDState(state0.positions, velocities, state0.images)
    traj = sciax.simulate(system, state, integrator=thermostat, dt=DT, n_steps=N_STEPS, save_every=SAVE_EVERY,
                          key=jax.random.fold_in(key, 1), observables=observables, save_states=False)
    late = traj.times >= traj.times[-1] / 2  # the second half of the run
    mean = {name: jnp.sum(jnp.where(late, traj.observables[name], 0.0)) / jnp.sum(late) for name in ("U", "P", "T")}
    return {"U": mean["U"] / n, "P": mean["P"], "T": mean["T"], "msd": traj.observables["msd"],
            "times": traj.times}


start = time.perf_counter()
result = sciax.sweep(
    (system, md.Bussi(kT=1.0, tau=0.1)), md.MDState(positions, jnp.zeros_like(positions)),
    # One axis of 32 members (each temperature 4 times): member i gets the key fold_in(key, i), so
    # every replica has its own noise (a "seed" axis would give each temperature the same 4 keys).
    axes={"kT": sciax.ensemble.Axis(np.repeat(TEMPERATURES, REPLICAS), where=lambda members, state0: members[1].kT)},
    run=replica, key=jax.random.key(0))
elapsed = time.perf_counter() - start
print(result)
out_ = {name: np.asarray(value).reshape(len(TEMPERATURES), REPLICAS, *np.shape(value)[1:])
        for name, value in result.outputs.items()}  # (temperature, replica, ...)
times = out_["times"][0, 0]
fits = np.array([[md.diffusion_coefficient(times, out_["msd"][i, j], t_min=times[-1] / 2).coefficient
                  for j in range(REPLICAS)] for i in range(len(TEMPERATURES))])
print(f"{result.n_members} replicas x {N_STEPS} steps of {n} atoms in {elapsed:.1f} s (compilation included)")
print(" kT(set)  <kT>     U/N       P        D")
for i, kT in enumerate(TEMPERATURES):
    print(f"  {kT:.2f}   {out_['T'][i].mean():.3f}  {out_['U'][i].mean():7.3f}  {out_['P'][i].mean():7.3f}  "
          f"{fits[i].mean():.4f}")

fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
for ax, values, label in ((axes[0], out_["U"], "U / N (ε)"), (axes[1], out_["P"], "P (ε/σ³)"),
                          (axes[2], fits, "D (σ²/τ)")):
    values = np.asarray(values)
    ax.errorbar(TEMPERATURES, values.mean(axis=1), yerr=values.std(axis=1, ddof=1) / np.sqrt(REPLICAS),
                marker="o", capsize=3)
    ax.set(xlabel="kT (ε)", ylabel=label)
axes[0].set_title(f"{n} LJ atoms from fcc, ρ = {DENSITY} σ⁻³")
axes[1].set_title("pressure (second half of each run)")
axes[2].set_title("diffusion coefficient from the MSD")
fig.tight_layout()
args = [a for a in sys.argv[1:] if not a.startswith("--")]
out = Path(args[0]) if args else Path(__file__).parent / "output" / "md_temperature_sweep.png"
out.parent.mkdir(parents=True, exist_ok=True)
fig.savefig(out, dpi=120)
print(f"wrote {out}")
