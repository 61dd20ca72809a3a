"""Probe (2026-11-27): does keeping more of the forward pass make the gradient workload's
backward cheaper? `CheckpointAdjoint` (recompute each step's stages from its stored carry)
against `checkpoint_steps=False` (keep a replayed block's stages) and, in addition,
`nest_above=None` (no sub-blocks). Workload and loss as `benchmarks/suites/gradient.py` (1,000
Lorenz members x 1,000 RK4 steps, float64). From the repository root, one core:
`taskset -c 1 python benchmarks/probes/gradient_storage.py`. Median of 7 calls, compile apart."""
import os
import sys
import time

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import sciax  # noqa: E402
from benchmarks.suites import gradient  # noqa: E402

ARGS = tuple(jnp.asarray(a) for a in gradient._problem())


def median_ms(fn, reps=7):
    compiled = jax.jit(fn).lower(*ARGS).compile()
    jax.block_until_ready(compiled(*ARGS))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*ARGS))
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


forward = median_ms(gradient.sciax_loss(gradient.MAIN_STEPS, sciax.CheckpointAdjoint()))
print(f"forward {forward:.2f} ms")
for name, adjoint in [("CheckpointAdjoint()", sciax.CheckpointAdjoint()),
                      ("checkpoint_steps=False", sciax.CheckpointAdjoint(checkpoint_steps=False)),
                      ("checkpoint_steps=False, nest_above=None",
                       sciax.CheckpointAdjoint(checkpoint_steps=False, nest_above=None))]:
    ms = median_ms(jax.value_and_grad(gradient.sciax_loss(gradient.MAIN_STEPS, adjoint)))
    print(f"forward+gradient, {name}: {ms:.2f} ms ({ms / forward:.1f} forwards)")
