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

import zlib  # noqa: E402

import pytest  # noqa: E402


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
def key(request):
    """A jax.random key of the test's own: its seed comes from the test's id, so a test gets the
    same key alone, in any order and in any worker process (`pytest -n`)."""
    return jax.random.key(zlib.crc32(request.node.nodeid.encode()))


_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_compile_logs = []  # the lists of the `compiles` fixtures now active


def _on_duration_event(event, duration, **kwargs):
    if event == _COMPILE_EVENT:
        for log in _compile_logs:
            log.append(kwargs.get("fun_name", "?"))


jax.monitoring.register_event_duration_secs_listener(_on_duration_event)  # once per process


@pytest.fixture
def compiles():
    """A list that receives the name of every program XLA compiles during the test (clear it
    before the calls that must not compile)."""
    log = []
    _compile_logs.append(log)
    yield log
    _compile_logs.remove(log)


@pytest.fixture(params=["float32", "float64"])
def dtype(request):
    import jax.numpy as jnp

    return jnp.dtype(request.param)
