"""Probe: the host-side cost of one eager `sciax.simulate` call (validation, argument
splitting, dispatch), measured on a run so short (Lorenz, RK4, 10 steps) that the call is
almost all overhead. Median of 400 calls after 20 warm-up calls. From the repository root:
`taskset -c 1 python benchmarks/probes/simulate_call_overhead.py`. Run it in fresh processes,
alternating the versions compared (figures in benchmarks/results/2026-11-23-harness.md)."""
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, ".")
import sciax  # noqa: E402
from sciax.integrators import RK4  # noqa: E402
from sciax.systems import Lorenz  # noqa: E402

Y0 = jnp.array([1.0, 1.0, 1.0])
SYSTEM = Lorenz()


def call():
    traj = sciax.simulate(SYSTEM, Y0, integrator=RK4(), dt=0.01, n_steps=10, save_every=10,
                          step_offset=jnp.asarray(0))
    return traj.final_state.block_until_ready()


for _ in range(20):
    call()
seconds = []
for _ in range(400):
    start = time.perf_counter()
    call()
    seconds.append(time.perf_counter() - start)
print(f"eager simulate call: median {np.median(seconds) * 1e6:.0f} us "
      f"(min {min(seconds) * 1e6:.0f}, max {max(seconds) * 1e6:.0f})")
