"""Fewer cyclic garbage collections while sciax traces and compiles a program.

CPython frees most objects by reference counting. Its cyclic collector runs as well. Up to
3.13 it works by generation:
- a young collection after every 700 net allocations of container objects (2,000 since 3.13);
- a middle one after every 10 young ones;
- a full one, which walks every tracked object in the process, once enough objects have
  survived the middle generation.
(CPython 3.14.0–3.14.4 collect the old objects in increments instead; the young threshold
still sets how often the collector runs.)

Tracing, lowering and compiling a program allocates ~10⁵ Python objects (tracers, jaxpr
equations, MLIR operations), most of them alive until the program is built. So a first call
runs about a hundred young collections and usually one full collection of everything that
importing JAX and its dependencies left behind. None of them finds much to free.

On the benchmark fit the first call ran 91 young, 8 middle and 1 full collection, which freed
67 objects (counts and timings: `benchmarks/results/2026-11-23-fit.md`).

`fewer_collections` raises the young threshold to `TRACING_THRESHOLD` for the whole of a call
to one of sciax's entry points (`simulate`, `solve`, `sweep`, `fit`, `equilibrium`), running
included, and puts the old value back afterwards.
- Collection stays enabled: a call that allocates more than that still collects.
- The threshold is process-wide: other threads run with it too while the call lasts.
- A threshold of 0 (collection off) or above `TRACING_THRESHOLD` is left alone. So is one
  changed while the block runs. Other code that saves the threshold inside the block and
  restores it after the block has ended therefore leaves `TRACING_THRESHOLD` in place.
- The collections skipped are deferred, not lost. The first young collection after the block
  walks what survived it. The full collection comes when enough
  objects have survived, as it would have: later in the process, or never in a short one.
- Blocks nest and may run on several threads: the last one out restores the threshold. A
  process forked inside a block keeps only the forking thread's blocks.
- A user who wraps sciax in their own `jax.jit` traces sciax inside the block, but lowers and
  compiles after it has ended.
"""

import functools
import gc
import os
import threading

#: The young generation's threshold inside `fewer_collections` (CPython's default is 700, and
#: 2,000 since 3.13). The fit above allocates ~6·10⁴ objects net while it traces and compiles.
TRACING_THRESHOLD = 100_000


class _FewerCollections:
    """Context manager (reentrant, thread-safe): the young generation's collection threshold
    is at least `TRACING_THRESHOLD` inside it. See the module docstring."""

    def __init__(self):
        self._lock = threading.Lock()
        self._depths = {}  # thread ident -> how many blocks that thread is inside
        self._saved = None  # the thresholds to restore, or None if they were left alone
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork)

    def __enter__(self):
        me = threading.get_ident()
        with self._lock:
            if not self._depths:
                current = gc.get_threshold()
                self._saved = None
                if 0 < current[0] < TRACING_THRESHOLD:
                    self._saved = current
                    gc.set_threshold(TRACING_THRESHOLD, *current[1:])
            self._depths[me] = self._depths.get(me, 0) + 1
        return self

    def __exit__(self, *exc):
        me = threading.get_ident()
        with self._lock:
            depth = self._depths.pop(me) - 1
            if depth:
                self._depths[me] = depth
            self._restore_if_last()
        return False

    def _restore_if_last(self):
        if not self._depths and self._saved is not None:
            if gc.get_threshold()[0] == TRACING_THRESHOLD:  # not changed by the user meanwhile
                gc.set_threshold(*self._saved)
            self._saved = None

    def _after_fork(self):
        """In a forked child only the forking thread exists, and the lock may have been held
        by another thread of the parent: keep the forking thread's blocks, drop the others."""
        self._lock = threading.Lock()
        me = threading.get_ident()
        self._depths = {me: self._depths[me]} if me in self._depths else {}
        self._restore_if_last()


fewer_collections = _FewerCollections()


def with_fewer_collections(fn):
    """`fn`, called inside `fewer_collections`."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with fewer_collections:
            return fn(*args, **kwargs)

    return call
