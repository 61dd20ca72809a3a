"""JAX-MD baseline for the in.lj workload: `space.periodic`, a hard-truncated Lennard-Jones pair
energy on a JAX-MD neighbour list, `simulate.nve` (velocity Verlet), the steps in one
`lax.fori_loop` under `jax.jit`.

Configuration, and why:

- JAX-MD's `energy.lennard_jones_neighbor_list` multiplies the pair energy by a C¹ switch from
  `r_onset` (default 2.0 σ) to `r_cutoff`: with the defaults the step-0 energy is −6.6458 per
  atom, not in.lj's −6.7733681. Setting `r_onset = r_cutoff = 2.5` gives the right energy but NaN
  forces (the switch divides by (r_c² − r_o²)³ = 0 in a `where` branch whose gradient is still
  taken). So the pair function here is JAX-MD's own `energy.lennard_jones` behind a hard cutoff
  (a double `where`, so the gradient stays finite), mapped with `smap.pair_neighbor_list`,
  exactly as `lennard_jones_neighbor_list` builds its energy.
- Neighbour list: `partition.neighbor_list(displacement, L, r_cutoff=2.5, dr_threshold=0.3)`:
  JAX-MD lists pairs within r_cutoff + dr_threshold and rebuilds when a particle has moved more
  than dr_threshold/2, so `dr_threshold` is the skin. Format `OrderedSparse` (a half list, the
  default of `lennard_jones_neighbor_list`) or `Dense`.
- The loop is JAX-MD's documented idiom: `state = step(state, neighbor=nbrs)`, then
  `nbrs = nbrs.update(state.position)`. A list whose buffer overflows (the crystal melts, the
  pair count grows) gives wrong forces silently and sets `did_buffer_overflow`;
  `JaxMDLJ.prepare` checks it after a trial run and re-allocates the list (from the positions
  where it overflowed) until a run completes without overflow; `n_reallocations` says how many
  times that happened.
- JAX-MD's `simulate.velocity_verlet` casts dt to float32 (`f32(dt)`) whatever the state's
  dtype, so its float64 runs step with dt = float32(0.005) = 0.004999999888: after 100 steps
  its potential energy differs from the float64 runs at dt = 0.005 by ~1e-9 relative, and equals
  (to rounding, ~1e-16) a NumPy float64 run at that dt (`tests/test_md_baselines.py`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax_md import energy, partition, quantity, simulate, smap, space

from . import md_workload as wl


def hard_truncated_lennard_jones(cutoff: float):
    """JAX-MD's `energy.lennard_jones` for r < cutoff, exactly 0 beyond (no shift, no switch)."""

    def pair(dr, sigma=1.0, epsilon=1.0, **unused):
        inside = (dr < cutoff) & (dr > 0)
        safe = jnp.where(inside, dr, cutoff)
        return jnp.where(inside, energy.lennard_jones(safe, sigma, epsilon), 0.0)

    return pair


def make_energy(box_length: float, *, cutoff: float = wl.CUTOFF, skin: float = wl.SKIN,
                format: str = "OrderedSparse"):
    """(displacement, shift, neighbor_fn, energy_fn) of the in.lj system in JAX-MD."""
    displacement, shift = space.periodic(box_length)
    fmt = getattr(partition, format)
    neighbor_fn = partition.neighbor_list(displacement, box_length, cutoff, dr_threshold=skin, format=fmt)
    energy_fn = smap.pair_neighbor_list(hard_truncated_lennard_jones(cutoff),
                                        space.canonicalize_displacement_or_metric(displacement),
                                        ignore_unused_parameters=True, sigma=wl.SIGMA, epsilon=wl.EPSILON)
    return displacement, shift, neighbor_fn, energy_fn


class JaxMDLJ:
    """The in.lj NVE run in JAX-MD. `run(n_steps)` starts from the given state every time.

    **Arguments:**

    - `positions`, `velocities`: (N, 3) arrays in reduced LJ units (float32 or float64; with
      float64, jax_enable_x64 must be on).
    - `box_length`: the cubic box edge L (σ).
    - `format`: the neighbour-list format, "OrderedSparse" (half list) or "Dense".
    """

    def __init__(self, positions, velocities, box_length: float, *, format: str = "OrderedSparse",
                 device=None):
        self.device = device or jax.devices("cpu")[0]
        dtype = np.asarray(positions).dtype
        self.x0 = jax.device_put(jnp.asarray(wl.wrap(np.asarray(positions), box_length), dtype), self.device)
        self.v0 = jax.device_put(jnp.asarray(velocities, dtype), self.device)
        self.box = float(box_length)
        _, self.shift, self.neighbor_fn, self.energy_fn = make_energy(self.box, format=format)
        self.nbrs = self.neighbor_fn.allocate(self.x0)
        self.n_reallocations = 0
        self._compiled = {}

    def step0(self, positions=None):
        """(potential energy, forces, None) at the start state, or at `positions` ((N, 3), the
        start's dtype; the list allocated for the start is updated for them, one compilation)."""
        if not hasattr(self, "_energy_forces"):
            def energy_forces(x, nbrs):
                nbrs = nbrs.update(x)
                return (self.energy_fn(x, neighbor=nbrs), quantity.force(self.energy_fn)(x, neighbor=nbrs),
                        nbrs.did_buffer_overflow)

            self._energy_forces = jax.jit(energy_forces)
        x = self.x0 if positions is None else jax.device_put(
            jnp.asarray(wl.wrap(np.asarray(positions), self.box), self.x0.dtype), self.device)
        e, f, overflow = self._energy_forces(x, self.nbrs)
        if bool(overflow):
            raise RuntimeError("JAX-MD neighbour list overflowed for these positions")
        return float(e), np.asarray(f), None

    def _program(self, n_steps: int):
        energy_fn, shift = self.energy_fn, self.shift
        init_fn, apply_fn = simulate.nve(energy_fn, shift, dt=wl.DT)

        def run(x0, v0, nbrs):
            nbrs = nbrs.update(x0)
            state = init_fn(jax.random.key(0), x0, kT=wl.TEMPERATURE, mass=wl.MASS,
                            momenta=wl.MASS * v0, neighbor=nbrs)

            def body(_, carry):
                state, nbrs, builds = carry
                state = apply_fn(state, neighbor=nbrs)
                new = nbrs.update(state.position)
                rebuilt = jnp.any(new.reference_position != nbrs.reference_position)
                return state, new, builds + rebuilt.astype(jnp.int32)

            state, nbrs, builds = jax.lax.fori_loop(0, n_steps, body, (state, nbrs, jnp.int32(1)))
            return state.position, state.velocity, energy_fn(state.position, neighbor=nbrs), nbrs, builds

        return jax.jit(run)

    def compile(self, n_steps: int):
        """Lower and compile the `n_steps` program for the current list (returns the compiled
        program; the caller times it)."""
        compiled = self._program(n_steps).lower(self.x0, self.v0, self.nbrs).compile()
        self._compiled[n_steps] = compiled
        return compiled

    def prepare(self, n_steps: int, max_reallocations: int = 10):
        """Compile, run once, and re-allocate the list while it overflows. Returns the compiled
        program (for the list capacity that suffices)."""
        compiled = self._compiled.get(n_steps) or self.compile(n_steps)
        for _ in range(max_reallocations):
            x, _, _, nbrs, _ = compiled(self.x0, self.v0, self.nbrs)
            if not bool(nbrs.did_buffer_overflow):
                return compiled
            self.n_reallocations += 1
            self.nbrs = self.neighbor_fn.allocate(x)
            compiled = self.compile(n_steps)
        raise RuntimeError(f"JAX-MD neighbour list still overflows after {max_reallocations} re-allocations")

    def run(self, n_steps: int):
        """`n_steps` steps from the start state: (positions, velocities, potential energy,
        neighbour list, builds) as JAX arrays (raises if the list overflowed)."""
        compiled = self._compiled.get(n_steps) or self.prepare(n_steps)
        out = compiled(self.x0, self.v0, self.nbrs)
        return out

    def run_checked(self, n_steps: int):
        """`run`, then NumPy (positions, velocities, potential energy); raises on overflow."""
        x, v, e, nbrs, builds = self.run(n_steps)
        if bool(nbrs.did_buffer_overflow):
            raise RuntimeError("JAX-MD neighbour list overflowed: call prepare(n_steps) first")
        self.n_builds = int(builds)
        return np.asarray(x), np.asarray(v), float(e)
