"""Lennard-Jones liquid (reduced units): melt an fcc crystal, equilibrate at kT = 1.0 with the Bussi
thermostat, then run at constant energy and measure the radial distribution function g(r), the
mean-squared displacement and the self-diffusion coefficient D = slope / 6.

Run: python examples/md_lj_liquid.py [out.png] [--quick]
(writes examples/output/md_lj_liquid.png and the last frame as md_lj_liquid.xyz beside it;
--quick: 256 atoms and fewer steps, for the smoke test)
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

import sciax.md as md  # noqa: E402

jax.config.update("jax_enable_x64", True)

QUICK = "--quick" in sys.argv[1:]
N_CELLS = 4 if QUICK else 6  # fcc cells per side: 256 or 864 atoms
EQUILIBRATION_STEPS = 200 if QUICK else 2000
PRODUCTION_STEPS = 600 if QUICK else 5000
SAVE_EVERY = 20
DENSITY, KT, DT = 0.8442, 1.0, 0.005  # the density of LAMMPS's in.lj; a liquid at this temperature

positions, box = md.lattice("fcc", N_CELLS, density=DENSITY)
n = positions.shape[0]
masses = jnp.ones(n)
potential = md.LennardJones(epsilon=1.0, sigma=1.0, cutoff=2.5, shift="energy")
# A Verlet list (built from a cell grid, rebuilt when an atom moved half the skin); for the
# 256 atoms of --quick, all pairs compile faster and cost little.
neighbours = md.AllPairs() if QUICK else md.VerletList(skin=0.3)
system = md.MDSystem(box, potential, masses, neighbours=neighbours).allocate(positions)
state = md.MDState(positions, md.maxwell_boltzmann(masses, 2 * KT, key=jax.random.key(0)))  # hot: it melts
print(f"{n} atoms, box {float(box.lengths[0]):.3f} σ, ρ* = {DENSITY}, kT = {KT} ε")

# 1. Equilibrate at constant temperature (the lattice melts).
start = time.perf_counter()
run = md.simulate_md(system, state, integrator=md.Bussi(kT=KT, tau=0.1), dt=DT, n_steps=EQUILIBRATION_STEPS,
                     save_every=SAVE_EVERY, key=jax.random.key(1), observables={"T": md.temperature})
system, equilibrated = run.system, run.trajectory.final_state
print(f"NVT: {EQUILIBRATION_STEPS} steps, final kT = {float(run.trajectory.observables['T'][-1]):.3f}")

# 2. Produce at constant energy, measuring as it runs.
state = md.MDState(equilibrated.positions, equilibrated.velocities, equilibrated.images)  # no thermostat
r_max = min(4.0, 0.49 * float(box.lengths.min()))
observables = {
    "T": md.temperature, "E": md.total_energy, "P": md.pressure,
    "rdf": md.rdf_histogram(r_max, 120),
    "msd": md.mean_squared_displacement(box.unwrap(state.positions, state.images)),
}
run = md.simulate_md(system, state, integrator=md.VelocityVerlet(), dt=DT, n_steps=PRODUCTION_STEPS,
                     save_every=SAVE_EVERY, save_states=False, observables=observables)
traj = run.trajectory
obs = {name: np.asarray(value) for name, value in traj.observables.items()}
elapsed = time.perf_counter() - start
times = np.asarray(traj.times) - float(traj.times[0])

r, g = md.radial_distribution(obs["rdf"], r_max=r_max, n_atoms=n, volume=float(box.volume))
fit = md.diffusion_coefficient(times, obs["msd"], t_min=1.0)  # past the ballistic regime (t < ~0.3 τ)
drift = (obs["E"][-1] - obs["E"][0]) / n
print(f"NVE: {PRODUCTION_STEPS} steps, <kT> = {obs['T'].mean():.3f}, <P> = {obs['P'].mean():.3f} ε/σ³, "
      f"energy drift {drift:+.2e} ε/atom; neighbour-list regrowths: {len(run.regrowths)}")
print(f"g(r): first peak at r = {r[np.argmax(g)]:.3f} σ (height {g.max():.2f}); "
      f"D = {fit.coefficient:.4f} σ²/τ from the MSD for t >= 1 τ")
print(f"{EQUILIBRATION_STEPS + PRODUCTION_STEPS} steps of {n} atoms in {elapsed:.1f} s (compilation included)")

fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
axes[0].plot(r, g)
axes[0].axhline(1.0, color="0.6", lw=0.8)
axes[0].set(xlabel="r (σ)", ylabel="g(r)", title=f"radial distribution, kT = {KT} ε, ρ = {DENSITY} σ⁻³")
axes[1].plot(times, obs["msd"], label="MSD")
axes[1].plot(times, fit.slope * times + fit.intercept, "--", label=f"fit: D = {fit.coefficient:.4f} σ²/τ")
axes[1].set(xlabel="t (τ)", ylabel="MSD (σ²)", title="mean-squared displacement (NVE)")
axes[1].legend()
axes[2].plot(times, obs["E"] / n, color="C0")
axes[2].set(xlabel="t (τ)", ylabel="E / N (ε)", title="total energy and temperature (NVE)")
axes[2].yaxis.label.set_color("C0")
twin = axes[2].twinx()
twin.plot(times, obs["T"], color="C1", lw=0.8)
twin.set_ylabel("kT (ε)", color="C1")
fig.tight_layout()
args = [a for a in sys.argv[1:] if not a.startswith("--")]
out = Path(args[0]) if args else Path(__file__).parent / "output" / "md_lj_liquid.png"
out.parent.mkdir(parents=True, exist_ok=True)
fig.savefig(out, dpi=120)
final = traj.final_carry.state  # the states were not saved (save_states=False)
md.write_xyz(out.with_suffix(".xyz"), final.positions, velocities=final.velocities, box=box, symbols=("Ar",),
             time=float(traj.times[-1]), step=EQUILIBRATION_STEPS + PRODUCTION_STEPS)
print(f"wrote {out} and {out.with_suffix('.xyz')}")
