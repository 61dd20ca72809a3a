"""The CPU vector-width setting: applied only when allowed, never overriding the user."""

import subprocess
import sys

import pytest

from sciax._compile import cpu_vector_width as _xla_flags


def test_flag_appended_respected_and_opt_out(monkeypatch):
    monkeypatch.setattr(_xla_flags, "_cpu_has_avx512", lambda: True)
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    monkeypatch.delenv("SCIAX_XLA_CPU_TUNING", raising=False)
    _xla_flags.apply_cpu_tuning()
    import os

    assert os.environ["XLA_FLAGS"] == "--xla_cpu_prefer_vector_width=512 --xla_force_host_platform_device_count=4"
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_prefer_vector_width=256")
    _xla_flags.apply_cpu_tuning()
    assert os.environ["XLA_FLAGS"] == "--xla_cpu_prefer_vector_width=256"  # the user's choice stands
    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.setenv("SCIAX_XLA_CPU_TUNING", "0")
    _xla_flags.apply_cpu_tuning()
    assert os.environ["XLA_FLAGS"] == ""
    monkeypatch.setattr(_xla_flags, "_cpu_has_avx512", lambda: False)
    monkeypatch.setenv("SCIAX_XLA_CPU_TUNING", "1")
    _xla_flags.apply_cpu_tuning()
    assert os.environ["XLA_FLAGS"] == ""


@pytest.mark.skipif(not _xla_flags._cpu_has_avx512(), reason="CPU without AVX-512")
def test_results_bitwise_identical_with_and_without_wide_vectors():
    code = (
        "import jax, jax.numpy as jnp, numpy as np, sys, sciax\n"
        "from sciax.integrators import RK4\nfrom sciax.systems import Lorenz\n"
        "rho = jnp.linspace(0, 21, 4096, dtype=jnp.float32)\n"
        "f = jax.vmap(lambda r: sciax.simulate(Lorenz(rho=r), jnp.array([1., 0., 0.], jnp.float32),"
        " integrator=RK4(), dt=0.001, n_steps=200, save_every=200).final_state)\n"
        "sys.stdout.write(np.asarray(f(rho)).tobytes().hex())\n"
    )
    outputs = []
    for tuning in ("1", "0"):
        env = {"SCIAX_XLA_CPU_TUNING": tuning, "XLA_FLAGS": "", "PATH": "/usr/bin:/bin"}
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                             check=True)
        outputs.append(run.stdout)
    assert outputs[0] == outputs[1] and len(outputs[0]) == 4096 * 3 * 8
