"""Fewer cyclic garbage collections while sciax traces and compiles a program.

CPython frees most objects by reference counting. Its cyclic collector runs as well, by
generation:
- a young collection after every 700 net allocations of container objects;
- a middle one after every 10 young ones;
- a full one, which walks every tracked object in the process, once enough objects have
  survived the middle generation.

Tracing, lowering and compiling a program allocates ~10⁵ Python objects (tracers, jaxpr
equations, MLIR operations), most of them alive until the program is built. So a first call
runs about a hundred young collections and usually one full collection of everything that
importing JAX and its dependencies left behind. None of them finds much to free.

Measured on the benchmark fit (damped oscillator, `fit(compilation="fast")`, one core,
CPython 3.11, `gc.callbacks`):
- the first fit ran 91 young, 8 middle and 1 full collection;
- they took 0.12 s of its 0.80 s, 0.10 s of it the full one;
- the young and middle ones freed nothing, and the full one freed 67 objects.

`fewer_collections` raises the young threshold to `TRACING_THRESHOLD` while one of sciax's
jitted entry points runs (`simulate`, `solve`, `sweep`'s chunks, `fit`'s programs), and puts the
old value back afterwards.
- Collection stays enabled: a trace that allocates more than that still collects.
- A threshold the user set higher, or to 0 (collection off), is left alone; so is one the
  user changes while the block runs.
- The collections skipped are deferred, not lost. The first young collection after the block
  walks what survived it, ~20 ms after the fit above. The full collection comes when enough
  objects have survived, as it would have: later in the process, or never in a short one.
- Blocks nest and may run on several threads: the outermost one restores the threshold.
"""

import functools
import gc
import threading

#: The young generation's threshold inside `fewer_collections` (CPython's default is 700).
#: The fit above allocates ~6·10⁴ objects net while it traces and compiles.
TRACING_THRESHOLD = 100_000


class _FewerCollections:
    """Context manager (reentrant, thread-safe): the young generation's collection threshold
    is at least `TRACING_THRESHOLD` inside it. See the module docstring."""

    def __init__(self):
        self._lock = threading.Lock()
        self._depth = 0
        self._saved = None  # the thresholds to restore, or None if they were left alone

    def __enter__(self):
        with self._lock:
            if self._depth == 0:
                current = gc.get_threshold()
                self._saved = None
                if 0 < current[0] < TRACING_THRESHOLD:
                    self._saved = current
                    gc.set_threshold(TRACING_THRESHOLD, *current[1:])
            self._depth += 1
        return self

    def __exit__(self, *exc):
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._saved is not None:
                if gc.get_threshold()[0] == TRACING_THRESHOLD:  # not changed by the user meanwhile
                    gc.set_threshold(*self._saved)
                self._saved = None
        return False


fewer_collections = _FewerCollections()


def with_fewer_collections(fn):
    """`fn`, called inside `fewer_collections`."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with fewer_collections:
            return fn(*args, **kwargs)

    return call
