"""Opt-in persistent compilation cache: compiled XLA programs kept on disk between processes.

Most of the time of a *first* call in a fresh process is XLA compiling the program, not
running it; with the cache warm only tracing and lowering remain (the benchmark fit's figures:
`benchmarks/README.md`, `fit`).

This wraps JAX's own cache (`jax_compilation_cache_dir`); nothing about the programs changes.
`fit` also keeps its solve traced and lowered in the same directory (`_compile/program_cache.py`), so
a fresh process skips tracing and lowering as well.
The key JAX computes covers the program, the compile options, the device and the jax/jaxlib
versions, so a stale entry is never used. `sciax run` turns it on (see `sciax run --help`);
library users call `enable_compilation_cache()` once, at the top of a script.
"""

import os
from pathlib import Path

import jax

from .._validation import describe

_ENV_DIR = "SCIAX_CACHE_DIR"


def default_cache_directory() -> Path:
    """`$SCIAX_CACHE_DIR`, else `$XDG_CACHE_HOME/sciax/jax`, else `~/.cache/sciax/jax`."""
    if os.environ.get(_ENV_DIR):
        return Path(os.environ[_ENV_DIR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "sciax" / "jax"


def enable_compilation_cache(directory: str | os.PathLike | None = None, *,
                             min_compile_time_s: float = 0.2) -> Path | str:
    """Keep compiled programs on disk so that a new process reuses them instead of compiling.

    **Arguments:**

    - `directory`: where the cache lives (created if missing); default `$SCIAX_CACHE_DIR`,
      else `$XDG_CACHE_HOME/sciax/jax`, else `~/.cache/sciax/jax`. JAX also accepts `gs://`
      and other URLs it knows.
    - `min_compile_time_s`: only programs that took at least this long (seconds) to compile
      are written, so the cache does not fill with trivial ones.

    **Returns:** the cache directory (a `Path`; the URL string for a remote cache).

    Takes effect for every compile after the call, including programs already compiled in
    this process when they are compiled again. Safe to call more than once. It switches JAX's
    cache on (`jax_enable_compilation_cache`) if it was off.

    JAX does not keep a program that holds a host callback (`jax.debug.print`,
    `jax.pure_callback`, an `eqx.error_if` whose condition is only known at run time): it is
    compiled again in every process. `fit` leaves out of its programs the checks of times it
    made on the host (see `sciax/_compile/host_checked.py`).
    """
    if isinstance(min_compile_time_s, bool) or not isinstance(min_compile_time_s, (int, float)) \
            or not min_compile_time_s >= 0:
        raise ValueError(
            f"enable_compilation_cache: `min_compile_time_s` must be a non-negative number of seconds, "
            f"got {describe(min_compile_time_s)}.")
    if directory is None:
        directory = default_cache_directory()
    elif not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"enable_compilation_cache: `directory` must be a path, got {describe(directory)}.")
    path = str(directory)
    if "://" not in path:
        local = Path(path).expanduser()
        try:
            local.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"enable_compilation_cache: cannot create the cache directory {local}: {e}") from e
        path = str(local)
    from jax.experimental.compilation_cache import compilation_cache

    jax.config.update("jax_enable_compilation_cache", True)  # off by JAX_ENABLE_COMPILATION_CACHE=false, say
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_s))
    compilation_cache.reset_cache()  # so that a cache checked (and found off) earlier is re-read
    return Path(path) if "://" not in path else path
