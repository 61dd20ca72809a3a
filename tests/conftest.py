"""Test configuration: float64 available, four fake CPU devices, fresh keys.

XLA_FLAGS must be set before jax is imported so that sharding tests see 4 CPU devices.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("MPLBACKEND", "Agg")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import itertools  # noqa: E402

import pytest  # noqa: E402

_seeds = itertools.count()


@pytest.fixture
def key():
    """A fresh jax.random key per test."""
    return jax.random.key(next(_seeds))


@pytest.fixture(params=["float32", "float64"])
def dtype(request):
    import jax.numpy as jnp

    return jnp.dtype(request.param)
