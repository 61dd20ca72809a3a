"""`enable_compilation_cache`: a program compiled in one process is loaded, not compiled, in the next."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import sciax

ROOT = Path(__file__).resolve().parents[1]

# Counts JAX's own cache-hit events while jitting a small simulate; prints them as JSON.
CHILD = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp
    import sciax
    hits = []
    jax.monitoring.register_event_listener(
        lambda event, **kw: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None)
    path = sciax.enable_compilation_cache(sys.argv[1], min_compile_time_s=0)
    traj = sciax.simulate(sciax.systems.Lorenz(), jnp.array([1.0, 0.0, 0.0]),
                          integrator=sciax.integrators.RK4(), dt=0.01, n_steps=100, save_every=10)
    print(json.dumps({"hits": len(hits), "path": str(path), "final": traj.states[-1].tolist()}))
""")


def _child(cache_dir, **environment):
    env = dict(os.environ, **environment)
    env.pop("XLA_FLAGS", None)
    out = subprocess.run([sys.executable, "-c", CHILD, str(cache_dir)], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_loads_compiled_programs_from_disk(tmp_path):
    cache = tmp_path / "nested" / "cache"
    first = _child(cache)
    assert first["hits"] == 0 and first["path"] == str(cache)
    assert any(cache.iterdir()), "nothing was written to the cache"
    second = _child(cache)
    assert second["hits"] >= 1
    assert second["final"] == first["final"]  # the cached program computes the same numbers


def test_it_switches_jax_s_cache_on_when_the_environment_had_it_off(tmp_path):
    """It set the directory but left `jax_enable_compilation_cache` False: nothing was kept,
    and the returned path suggested otherwise."""
    first = _child(tmp_path, JAX_ENABLE_COMPILATION_CACHE="false")
    assert any(tmp_path.iterdir()), "nothing was written to the cache"
    assert _child(tmp_path, JAX_ENABLE_COMPILATION_CACHE="false")["hits"] >= 1 and first["hits"] == 0


def test_default_directory_follows_environment(monkeypatch, tmp_path):
    from sciax._compile.compilation_cache import default_cache_directory

    monkeypatch.setenv("SCIAX_CACHE_DIR", str(tmp_path / "a"))
    assert default_cache_directory() == tmp_path / "a"
    monkeypatch.delenv("SCIAX_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_directory() == tmp_path / "xdg" / "sciax" / "jax"


@pytest.mark.parametrize("bad", [-1.0, float("nan"), "1", True])
def test_bad_min_compile_time_names_the_argument(bad, tmp_path):
    with pytest.raises(ValueError, match="min_compile_time_s.*non-negative"):
        sciax.enable_compilation_cache(tmp_path, min_compile_time_s=bad)


def test_bad_directory_is_refused(tmp_path):
    with pytest.raises(TypeError, match="`directory` must be a path"):
        sciax.enable_compilation_cache(3)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="cannot create the cache directory"):
        sciax.enable_compilation_cache(blocker / "sub")
