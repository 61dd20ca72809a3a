"""The sciax side of the in.lj benchmark: `sciax.md.MDSystem` (periodic `Box`, `LennardJones`
cut at 2.5 σ without shift, `VerletList(skin=0.3)` allocated on the host), `VelocityVerlet`,
the steps in one `sciax.simulate` call compiled with `jax.jit` (no frames saved: only the final
carry is returned).

`SciaxLJ.prepare` compiles, runs once, and when the run's neighbour buffers overflowed grows
the system's capacities (`MDSystem.grow`) and compiles again, until a run completes without
overflow; `n_grows` counts the growths. Not a baseline: the row the others are compared with.
"""

from __future__ import annotations

import time

import numpy as np

from . import md_workload as wl


def available() -> str | None:
    """None if sciax.md has what this benchmark uses, else why not."""
    try:
        import sciax.md as md

        for name in ("Box", "LennardJones", "MDSystem", "MDState", "VerletList", "VelocityVerlet"):
            getattr(md, name)
    except Exception as e:  # noqa: BLE001
        return f"sciax.md not available ({type(e).__name__}: {e})"
    return None


def _compute(system, positions):
    """(ForceResult, overflow status) with neighbours built for `positions` (compiled once per
    shape, dtype and capacities)."""
    import equinox as eqx

    global _compute_jit
    if _compute_jit is None:
        @eqx.filter_jit
        def compute(system, x):
            neighbours = system.build_neighbours(x)
            return system.compute(x, neighbours), neighbours.overflow

        _compute_jit = compute
    return _compute_jit(system, positions)


_compute_jit = None


class SciaxLJ:
    """The in.lj NVE run in sciax.

    **Arguments:**

    - `positions`, `velocities`: (N, 3) arrays in reduced LJ units (float32 or float64; with
      float64, jax_enable_x64 must be on).
    - `box_length`: the cubic box edge L (σ).
    """

    def __init__(self, positions, velocities, box_length: float, *, device=None):
        import jax
        import jax.numpy as jnp

        import sciax.md as md

        self.device = device or jax.devices("cpu")[0]
        dtype = np.asarray(positions).dtype
        x = wl.wrap(np.asarray(positions), box_length).astype(dtype)
        put = lambda a: jax.device_put(jnp.asarray(a, dtype), self.device)  # noqa: E731
        self.box = float(box_length)
        n = len(x)
        self.x0 = put(x)
        system = md.MDSystem(
            box=md.Box(put(np.full(3, box_length))),
            potential=md.LennardJones(epsilon=put(wl.EPSILON), sigma=put(wl.SIGMA), cutoff=put(wl.CUTOFF),
                                      shift="none"),
            masses=put(np.full(n, wl.MASS)),
            neighbours=md.VerletList(skin=put(wl.SKIN)),
        )
        self.system = system.allocate(self.x0)
        self.state0 = md.MDState(positions=self.x0, velocities=put(velocities),
                                 images=jax.device_put(jnp.zeros((n, 3), jnp.int32), self.device))
        self.n_grows = 0
        self.compile_s = 0.0

    def step0(self, positions=None):
        """(potential energy, forces, virial trace) at the start state, or at `positions`
        ((N, 3), the start's dtype; neighbours built with the capacities allocated for the start)."""
        import jax
        import jax.numpy as jnp

        x = self.x0 if positions is None else jax.device_put(
            jnp.asarray(wl.wrap(np.asarray(positions), self.box), self.x0.dtype), self.device)
        result, overflow = _compute(self.system, x)
        if int(overflow):
            raise RuntimeError("sciax neighbour buffers overflowed for these positions")
        return float(result.energy), np.asarray(result.forces), float(np.trace(np.asarray(result.virial)))

    def _program(self, n_steps: int):
        """`jax.jit` of the run over the arrays of (system, state0); the static parts (capacities,
        strategies) are closed over."""
        import equinox as eqx
        import jax

        import sciax
        import sciax.md as md

        arrays, static = eqx.partition((self.system, self.state0), eqx.is_array)

        def run(arrays):
            system, state0 = eqx.combine(arrays, static)
            traj = sciax.simulate(system, state0, integrator=md.VelocityVerlet(), dt=wl.DT,
                                  n_steps=n_steps, save_every=n_steps, save_states=False)
            return traj.final_carry

        return jax.jit(run), arrays

    def _compile(self, n_steps: int):
        t0 = time.perf_counter()
        program, arrays = self._program(n_steps)
        compiled = program.lower(arrays).compile()
        self.compile_s = time.perf_counter() - t0
        self._arrays = arrays
        return compiled

    def prepare(self, n_steps: int, max_grows: int = 10):
        """Compile for `n_steps`, run once, grow capacities while the run overflows; returns
        the compiled program (`self.compile_s` is its compile time)."""
        import jax

        import sciax.md as md

        compiled = self._compile(n_steps)
        for _ in range(max_grows):
            carry = jax.block_until_ready(self.call(compiled))
            if not md.overflowed(carry):
                return compiled
            self.n_grows += 1
            self.system = self.system.grow(carry.neighbours)
            compiled = self._compile(n_steps)
        raise RuntimeError(f"sciax neighbour buffers still overflow after {max_grows} growths")

    def call(self, compiled):
        return compiled(self._arrays)

    def summarize(self, carry):
        """(potential energy at the end, neighbour-list builds, whether the run overflowed)."""
        import sciax.md as md

        return float(carry.energy), int(carry.neighbours.n_builds), md.overflowed(carry)

    def run_checked(self, n_steps: int):
        """Prepare, run, and return NumPy (positions, velocities, potential energy)."""
        compiled = self.prepare(n_steps)
        carry = self.call(compiled)
        e, self.n_builds, over = self.summarize(carry)
        if over:
            raise RuntimeError("sciax neighbour buffers overflowed")
        return np.asarray(carry.state.positions), np.asarray(carry.state.velocities), e
