"""Test configuration: float64 available, four fake CPU devices, fresh keys.

XLA_FLAGS must be set before jax is imported so that sharding tests see 4 CPU devices.
"""

import os
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("MPLBACKEND", "Agg")
# `sciax run` keeps compiled programs on disk by default: keep the tests' out of the home folder.
os.environ.setdefault("SCIAX_CACHE_DIR", tempfile.mkdtemp(prefix="sciax-test-cache-"))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import itertools  # noqa: E402

import pytest  # noqa: E402

_seeds = itertools.count()


@pytest.fixture(autouse=True)
def _no_persistent_cache_leak():
    """A test that turns on the persistent compilation cache (e.g. through `sciax run`) turns it
    off again, so that later tests compile exactly as they would alone."""
    before = jax.config.jax_compilation_cache_dir
    yield
    if jax.config.jax_compilation_cache_dir != before:
        from jax.experimental.compilation_cache import compilation_cache

        jax.config.update("jax_compilation_cache_dir", before)
        compilation_cache.reset_cache()


@pytest.fixture
def key():
    """A fresh jax.random key per test."""
    return jax.random.key(next(_seeds))


@pytest.fixture(params=["float32", "float64"])
def dtype(request):
    import jax.numpy as jnp

    return jnp.dtype(request.param)
