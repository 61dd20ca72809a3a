"""`sweep`: run an ensemble over parameter / initial-state / seed axes, in memory-bounded
chunks, sharded over devices and split across processes, with reductions on the fly.

Layout: one member is the unbatched rollout (`simulate`, `solve` or a user function); the
ensemble is `jax.vmap` of it, which for sciax's component-wise ODEs is already the
struct-of-arrays loop (one `(B,)` array per state component). Each device runs its own slice
of a chunk inside `shard_map`: no cross-device communication while stepping, one small
reduction of partial statistics per chunk.
"""

import dataclasses
import functools
import math
import os
import re
import warnings
from collections.abc import Callable
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from .. import parallel
from .._callable_key import by_code
from .._collector import with_fewer_collections
from .._jit import async_filter_jit, equinox_errors
from .._rollout import AbstractRollout, Solve
from .._trajectory import Trajectory
from .._validation import describe, refuse_tracers
from ._axes import apply_axes, resolve_axes, warn_merged_coordinates
from ._reductions import Streaming, resolve_reductions, tree_finalize, tree_merge, tree_partial
from ._result import MEMBER, SweepResult

# Members per cache block inside a chunk on CPU devices with one thread each (a multiple of
# LANES, see below): a block's state stays in cache for all its steps (~15% faster than one vmap
# on the Lorenz ensemble; benchmarks/results/2026-11-22-sweep-and-runner.md). Accelerators get no
# blocking: a GPU needs far more members in flight than 8,192 to fill its cores, and blocks run
# one after another would leave it mostly idle (8,388,608 members would be 1,024 blocks in sequence).
_CACHE_BLOCK = 8192

# Blocks pay for a small output per member (a final state, a few frames), not for a long saved
# trajectory: `simulate` saves a componentwise state as one array per component and stacks them
# into the user's layout after its time loop, and inside a block that is a strided transpose of
# the block's whole output, slower than no blocks above ~600 bytes per member
# (benchmarks/results/2026-11-22-sweep-and-runner.md). The threshold is compared with the whole kept output
# of a member (with `output=None` the Trajectory, times and finite flags included), so it is
# crossed at fewer frames than these state sizes suggest (float32 Lorenz: ~30 frames).
_CACHE_BLOCK_MAX_OUTPUT_BYTES = 512


def _platform(mesh) -> str:
    """"cpu", "gpu", "tpu", ...: what the sweep's devices are (a mesh holds one kind)."""
    return mesh.devices.flat[0].platform


# With more than one core, XLA:CPU splits each kernel of a block over its threads, and a block
# of 8,192 members is too small to pay for that (block sizes measured on two cores:
# benchmarks/results/2026-11-22-sweep-and-runner.md). So a block holds this many members per
# thread when a device has several (measured on two cores only; more is an extrapolation).
_CACHE_BLOCK_PER_THREAD = 32768


def _cpu_threads_per_device(n_devices: int) -> int:
    """CPU cores this process may run on (its affinity, capped by a cgroup CPU quota), shared by
    the mesh's devices; 1 when XLA:CPU is told to run single-threaded."""
    if "--xla_cpu_multi_thread_eigen=false" in os.environ.get("XLA_FLAGS", "").lower():
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    if quota is not None:
        cores = min(cores, quota)
    return max(1, cores // max(1, n_devices))


_CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"


def _cgroup_cpu_quota() -> int | None:
    """Cores allowed by a cgroup v2 CPU quota (`cpu.max`: "<quota> <period>", e.g. from
    `docker --cpus`), rounded up; None without one."""
    try:
        with open(_CGROUP_CPU_MAX) as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        return None


def _cache_block(platform: str, output_bytes: int = 0, threads: int = 1) -> int | None:
    """Members vmapped at once inside a chunk on CPU when a member's output (`output_bytes`) is
    small: `_CACHE_BLOCK` with one thread per device, `_CACHE_BLOCK_PER_THREAD` per thread with
    several. The whole chunk otherwise and on accelerators."""
    if platform != "cpu" or output_bytes >= _CACHE_BLOCK_MAX_OUTPUT_BYTES:
        return None
    return _CACHE_BLOCK if threads <= 1 else _CACHE_BLOCK_PER_THREAD * threads


# Members per device per chunk are rounded up to a multiple of LANES. On XLA:CPU a member's
# last bits can depend on how many members are vmapped together: the HLO is the same, but LLVM
# vectorises and unrolls the loop over members differently, and batches narrower than a 512-bit
# vector take another path. Measured on this project's AVX-512 machine (2026-11-23, jax 0.10.2)
# against one 512-member chunk, with rounding off: float32 Lorenz under Tsit5 differed in chunks
# of 1 to 12 members, Dopri5 and Dopri8 at 8 and 9, float64 Lorenz Tsit5 at 1 to 4, a float64
# double pendulum under Tsit5 at 1 and 9; with multiples of 32 nothing differed. With this
# rounding, `_chunk_runner`'s compile option and `simulate`'s barrier on `dt` and `t0`, 38
# combinations (Lorenz with six Runge–Kutta methods, three-body with RK4 and three symplectic
# methods, pendulum, double pendulum and van der Pol with RK4 and Tsit5, a spring chain with RK4,
# velocity Verlet and Yoshida4; float32 and float64) gave the same bits on 1, 2, 3 and 4
# devices and in chunks of 32 (docs/multihost.md). A memory budget that allows fewer than 32
# members per device gives narrower chunks, whose bits can differ. The padding (< 32 members
# per device) is computed and dropped.
LANES = 32


@with_fewer_collections
def sweep(
    system,
    state0,
    *,
    axes: dict,
    mode: Literal["grid", "zip"] = "grid",
    rollout: AbstractRollout | None = None,
    run: Callable | None = None,
    output: Callable | None = None,
    reduce=None,
    reduce_over=None,
    keep: bool | None = None,
    key=None,
    batch_size: int | None = None,
    memory_budget: int | None = None,
    devices=None,
    check_finite: bool = True,
    order=None,
    gather: bool = True,
) -> SweepResult:
    """Run `system` from `state0` for every point of `axes` and return results by coordinate.

    **Arguments:**

    - `system`, `state0`: the base system (Equinox module) and initial state; each member is
      this pair with the swept leaves replaced (same shapes and dtypes).
    - `axes`: dict name -> values `(n, ...)`. A name is a system field (`"rho"`), a nested or
      indexed field (`"spring.k"`, `"masses[0]"`), a part of the initial state (`"state0"`,
      `"state0[1]"`, `"state0.positions[0, 2]"`), or `"seed"` (integers; member key
      `fold_in(key, seed)`, or `jax.random.key(seed)` without `key`). For any other leaf use
      `Axis(values, where=lambda system, state0: ...)`. Values are cast to the dtype of the
      leaf they replace.
    - `mode`: `"grid"` (every combination; results shaped `(len(a), len(b), ...)`, last axis
      fastest) or `"zip"` (axes of equal length `n` varied together; results shaped `(n,)`).
    - exactly one of
      - `rollout`: how to integrate each member, `sciax.Simulate(integrator, dt, n_steps=...,
        save_every=..., observables=...)` (fixed step) or `sciax.Solve(solver, t0=..., t1=...,
        save_at=...)` (Diffrax; run with `throw=False`, so a failed member is reported in
        `failures` and the others complete). Its settings (`dt`, `t0`, `t1`, step counts) are
        compile-time constants: a new value compiles the chunk anew; `save_at` is an array;
      - `run`: `run(system, state0, key) -> pytree`, any unbatched, jittable rollout (e.g. one
        that varies `dt` as an array, or reads a swept integrator from a pytree `system`).
    - `output`: `output(result) -> pytree`, what to keep of each member (e.g.
      `lambda traj: traj.final_state`); default the whole result. Small outputs make large
      sweeps cheap. The compiled chunk is reused across calls for equal `output`, `run`,
      observables, `Streaming` reductions and `Axis(where=...)`: plain functions are compared
      by their code and captured values (`sciax._callable_key`), so a `lambda` re-created at
      every call (in a loop) reuses it; one that closes over another value, over something
      mutable (a dict, a NumPy array, `self`), or a callable object that is not equal,
      compiles anew.
    - `reduce`: reductions over members computed chunk by chunk: a name (`"mean"`, `"var"`,
      `"std"`, `"min"`, `"max"`, `"sum"`, `"count"`, `"median"`), a list of names, or a dict
      result name -> reduction (`Mean()`, `Variance(ddof=1)`, `Quantile([0.05, 0.95])`,
      `Streaming(...)`, `Apply(fn)`; see `sciax.ensemble`). A boolean output counts as 0 and 1:
      its mean is the fraction of members that set it, its sum their number (min and max come
      back as booleans, quantiles as floats).
    - `reduce_over`: the axis names (grid mode) reduced over; default all. The other axes are
      kept: `reduce="mean", reduce_over=("seed",)` gives the mean over seeds for every rho.
    - `keep`: keep every member's output on the host (default: True unless `reduce` is given).
      `keep=False` without `reduce` still reports `ok` and `failures` (refused with
      `check_finite=False`, which would return nothing).
    - `key`: base `jax.random` key; without a `"seed"` axis member `i` gets `fold_in(key, i)`.
    - `batch_size`: members per chunk, rounded up to a multiple of 32 x the device count (see
      `LANES`: on CPU a member's bits then do not depend on the chunking or the number of
      devices in every case tested; docs/multihost.md), and lowered where a chunk that size
      would not fit the memory budget.
    - `memory_budget`: bytes of device memory per device a chunk may use; the chunk size is
      chosen from an estimate of one member's footprint (its rollout output, kept output and
      carries, via `jax.eval_shape`) and checked against XLA's memory analysis of the
      compiled chunk. Default: half the free device memory on accelerators, a quarter of the
      host RAM (shared by the CPU devices) on CPU; it applies with a `batch_size` too.
    - `devices`: None (every local device), an int (the first k local devices), a list of
      devices, or a 1-D `jax.sharding.Mesh`. The member axis is padded to a multiple of the
      device count and sharded over them (`shard_map`); each device steps its own members with
      no cross-device communication. In a multi-process run these are this process's devices.
    - `check_finite`: flag members whose trajectory (every saved state; for other `run`
      results, every floating leaf) holds NaN/Inf, or whose solver failed; they are listed in
      `result.failures` with their coordinates and left out of the reductions, and the other
      members complete. The kept `output` itself is not checked (NaN padding is allowed).
    - `order`: the order in which members are run (chunks take consecutive members of it):
      None (sweep order), a permutation of the flat member indices, or `"cost"` for adaptive
      solves: a cheap pilot solve estimates each member's step count and members run most
      expensive first in buckets of similar cost (default `batch_size`: 32 per CPU device; on
      an accelerator an eighth of its members, at least 16,384), so a
      vmapped adaptive loop does not make every member wait for the slowest of the whole
      sweep. Results are returned in sweep order regardless.
    - `gather`: in a multi-process run, give every process all results (True) or only its own
      members (False: `outputs` is flat over `result.member_indices`; reductions and failure
      flags are always global).

    **Returns:** a `SweepResult` (`outputs`, `ok`, `failures`, `reductions`, `sel`, `isel`,
    `info`), holding NumPy arrays on the host.

    **Raises:** `ValueError`/`TypeError` for bad input, naming what was expected: unknown axis
    names (listing the valid ones), zipped axes of different lengths, non-positive
    `batch_size`, a `memory_budget` smaller than one member.

    ```python
    res = sciax.sweep(Lorenz(), jnp.array([1.0, 0.0, 0.0]),
                      axes={"rho": jnp.linspace(0.0, 30.0, 100), "state0[0]": jnp.array([1.0, 2.0])},
                      rollout=sciax.Simulate(RK4(), dt=0.01, n_steps=1000, save_every=1000),
                      output=lambda traj: traj.final_state)
    res.sel(rho=24.545454, method="nearest").outputs   # (2, 3): both initial x
    ```
    """
    refuse_tracers("sweep", "it plans chunks and devices from concrete values, runs each chunk as its own "
                   "compiled program and returns NumPy results by coordinate. To transform a "
                   "rollout, use jax.vmap over sciax.simulate or sciax.solve.", system=system,
                   state0=state0, axes=axes, key=key, rollout=rollout, run=run, output=output)
    if isinstance(order, str):
        _check_chunking(batch_size, memory_budget)  # before the pilot solve, not after it
        order, batch_size = _cost_order(order, system, state0, axes, mode, rollout, key, batch_size,
                                        memory_budget, devices)
    plan = _plan(system, state0, axes, mode, rollout, run, output, reduce,
                 reduce_over, keep, key, batch_size, memory_budget, devices, check_finite, order, gather)
    raw = _execute(plan)
    return _package(plan, raw)


# --------------------------------------------------------------------------------- validate
@dataclasses.dataclass
class _Plan:
    """Everything `_execute` needs, decided on the host before anything runs."""

    config: "_ChunkConfig"  # static: how a chunk is computed (hashable; the compile cache key)
    payload: tuple  # (system, state0, key, run, output): arrays are traced, the rest static
    axes: list
    mode: str
    shape: tuple
    n_members: int
    reductions: dict
    reduce_axes: tuple  # positions of the reduced dims
    keep: bool
    check_finite: bool
    order: np.ndarray | None
    gather: bool
    mesh: object
    batch: int
    budget: int | None
    budget_given: bool  # by the user (checked against XLA's analysis always), not the default
    out_struct: object
    member_bytes: int
    start: int  # this process's members: start .. stop - 1
    stop: int
    chunk_bytes: int | None = None  # XLA's memory analysis of the chunk, when it was checked

    @property
    def dims(self):
        return tuple(a.name for a in self.axes) if self.mode == "grid" else (MEMBER,)

    @property
    def kept_shape(self):
        return tuple(n for i, n in enumerate(self.shape) if i not in self.reduce_axes)

    @property
    def needs_values(self):
        return self.keep or any(r.needs_values for r in self.reductions.values())


MAX_MEMBERS = 2**30  # flat member positions are int32; padding the last chunk must not wrap them


def _plan(system, state0, axes, mode, rollout, run, output, reduce, reduce_over,
          keep, key, batch_size, memory_budget, devices, check_finite, order, gather) -> _Plan:
    if mode not in ("grid", "zip"):
        raise ValueError(f"sweep: `mode` must be 'grid' or 'zip', got {mode!r}.")
    resolved = resolve_axes(axes, system, state0)
    lengths = {a.name: len(a) for a in resolved}
    if mode == "zip":
        if len(set(lengths.values())) > 1:
            raise ValueError(f"sweep: in zip mode every axis must have the same length; got lengths {lengths}. "
                             "Use mode='grid' for every combination.")
        shape = (next(iter(lengths.values())),)
    else:
        shape = tuple(lengths.values())
        for axis in resolved:
            warn_merged_coordinates(axis)
    n_members = math.prod(shape)
    if n_members > MAX_MEMBERS:
        raise ValueError(f"sweep: {n_members} members (axis lengths {lengths}) "
                         f"exceed the {MAX_MEMBERS} one sweep can index (member positions are int32, and the "
                         "last chunk is padded); split the sweep along an axis.")
    run_fn = _run_function(run, rollout, key, resolved)
    if output is not None and not callable(output):
        raise TypeError(f"sweep: `output` must be a function output(result) -> pytree, got {output!r}.")
    if key is not None and not (isinstance(key, jax.Array) and (jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
                                                              or key.shape == (2,))):
        raise TypeError(f"sweep: `key` must be a jax.random key, got {describe(key)}.")
    reductions = resolve_reductions(reduce)
    reduce_axes = _reduce_axes(reduce_over, resolved, mode, reductions)
    keep = (not reductions) if keep is None else bool(keep)
    if not keep and not reductions and not check_finite:
        raise ValueError("sweep: keep=False without `reduce` and with check_finite=False would run every member "
                         "and return nothing; pass reductions (e.g. reduce='mean') or keep the outputs.")
    _check_chunking(batch_size, memory_budget)
    order = _check_order(order, n_members)
    mesh = parallel.member_mesh(devices)
    specs = tuple(a.spec for a in resolved)
    payload = (system, state0, key, run_fn, by_code(output))  # a new lambda each call: no recompile

    one_values = [jax.ShapeDtypeStruct(a.values.shape[1:], a.values.dtype) for a in resolved]
    flat0 = jax.ShapeDtypeStruct((), jnp.int32)
    result_struct, (out_struct, _) = _member_structures(specs, check_finite, payload, one_values, flat0)
    kept = tuple(i for i in range(len(shape)) if i not in reduce_axes) if mode == "grid" else ()
    n_groups = math.prod(shape[i] for i in kept)
    # A `Streaming` reduction runs its partial once per kept group over the whole chunk.
    streaming_copies = n_groups if any(isinstance(r, Streaming) for r in reductions.values()) else 0
    member_bytes = _member_bytes(result_struct, out_struct, state0, one_values, streaming_copies)
    n_dev = mesh.devices.size
    start, stop = parallel.process_share(n_members)
    batch, budget = _batch(batch_size, memory_budget, member_bytes, n_dev, stop - start, mesh)
    exact = any(r.needs_values for r in reductions.values())
    needs_values = keep or exact
    # This process keeps every member's output when gathering or when a reduction needs all
    # values, else only its own share (gather=False in a multi-process run).
    _check_host_memory(needs_values, n_members if gather or exact else stop - start, out_struct)
    config = _ChunkConfig(
        axes=specs, mode=mode, shape=shape, mesh=mesh, local=batch // n_dev, check_finite=check_finite,
        needs_values=needs_values, kept=kept, n_groups=n_groups,
        streaming=tuple((k, _keyed_by_code(r)) for k, r in reductions.items() if not r.needs_values),
        partitioning="single" if n_dev == 1 else "shard_map",
        cache_block=_cache_block(_platform(mesh), _nbytes(out_struct), _cpu_threads_per_device(mesh.devices.size)),
    )
    if n_dev > 1 and not _traces_in_shard_map(config, payload, resolved):
        config = dataclasses.replace(config, partitioning="auto")
    return _Plan(config=config, payload=payload, axes=resolved, mode=mode, shape=shape, n_members=n_members,
                 reductions=reductions, reduce_axes=reduce_axes, keep=keep, check_finite=check_finite,
                 order=order, gather=gather, mesh=mesh, batch=batch, budget=budget,
                 budget_given=memory_budget is not None, out_struct=out_struct,
                 member_bytes=member_bytes, start=start, stop=stop)


# Output structures of one member, keyed on the abstract signature of what was traced. Tracing a
# member to learn its structure is most of a small sweep's host time per call: a sweep repeated
# with the same system structure, functions and dtypes skips it.
_STRUCTURES: dict = {}
_STRUCTURES_MAX = 64


def _abstract_key(tree):
    """A hashable key for `tree` up to array values (shapes, dtypes, weak types; every other leaf
    and the tree structure by equality), or None when some part cannot be hashed."""
    dynamic, static = eqx.partition(tree, eqx.is_array)
    d_leaves, d_def = jtu.tree_flatten(dynamic)
    s_leaves, s_def = jtu.tree_flatten(static)
    avals = tuple((tuple(x.shape), str(x.dtype), bool(getattr(x, "weak_type", False))) for x in d_leaves)
    key = (d_def, avals, s_def, tuple((type(x), x) for x in s_leaves), bool(jax.config.jax_enable_x64))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _memoised(kind: str, inputs, compute):
    """`compute()`, remembered under (`kind`, the abstract signature of `inputs`)."""
    key = _abstract_key(inputs)
    key = None if key is None else (kind, key)
    if key is not None and key in _STRUCTURES:
        return _STRUCTURES[key]
    value = compute()
    if key is not None:
        if len(_STRUCTURES) >= _STRUCTURES_MAX:
            _STRUCTURES.pop(next(iter(_STRUCTURES)))
        _STRUCTURES[key] = value
    return value


def _member_structures(specs, check_finite, payload, one_values, flat0):
    """(rollout result, (kept output, ok)) structures of one member, by one `eval_shape`."""
    def both(p, v, i):
        result = _member_result(specs, p, v, i)
        return result, _member_output(result, check_finite, p[4])

    return _memoised("member", (specs, check_finite, payload, one_values, flat0),
                     lambda: eqx.filter_eval_shape(both, payload, one_values, flat0))


def _check_chunking(batch_size, memory_budget):
    if batch_size is not None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer):
            raise TypeError(f"sweep: `batch_size` must be a positive int, got {describe(batch_size)}.")
        if batch_size <= 0:
            raise ValueError(f"sweep: `batch_size` must be a positive number of members per chunk, got {batch_size}.")
    if memory_budget is not None:
        if isinstance(memory_budget, bool) or not isinstance(memory_budget, int | float | np.number) \
                or not 0 < memory_budget < math.inf:
            raise ValueError(
                f"sweep: `memory_budget` must be a positive, finite number of bytes, got {memory_budget!r}.")


# What lineax and Equinox raise when they compare a traced value's structure (which, inside
# shard_map, carries the manual mesh) with that of a constant made inside the solver (no mesh):
# Diffrax's implicit solvers hit one or the other (docs/multihost.md; lineax#185).
_SHARD_MAP_TRACE_FAILURES = (
    "does not match out_structure",
    "Closure-converted function called with different dynamic arguments",
)


def _traces_in_shard_map(config, payload, axes) -> bool:
    """Whether one chunk traces inside `shard_map` (see `_chunk`); tracing only, no compile."""
    tables = [jax.ShapeDtypeStruct(a.values.shape, a.values.dtype) for a in axes]
    index = jax.ShapeDtypeStruct((), jnp.int32)

    def traces():
        try:
            eqx.filter_eval_shape(_chunk, config, payload, tables, None, index, index)
        except ValueError as e:
            if any(m in str(e) for m in _SHARD_MAP_TRACE_FAILURES):
                return False
            raise
        return True

    return _memoised("shard_map", (config, payload, tables), traces)


def _run_function(run, rollout, key, axes):
    if (run is None) == (rollout is None):
        raise ValueError(
            "sweep: pass exactly one of `rollout=sciax.Simulate(integrator, dt, n_steps=...)` (or sciax.Solve(...)) "
            f"and `run=fn(system, state0, key)`; got {'both' if run is not None else 'neither'}.")
    if run is not None:
        if not callable(run):
            raise TypeError(f"sweep: `run` must be a function run(system, state0, key) -> pytree, got {run!r}.")
        return by_code(run)
    if not isinstance(rollout, AbstractRollout):
        raise TypeError(f"sweep: `rollout` must be sciax.Simulate(...) or sciax.Solve(...), got {describe(rollout)}.")
    rollout.check_complete("sweep")
    if rollout.stochastic and key is None and not any(a.kind == "seed" for a in axes):
        raise ValueError(f"sweep: {type(rollout.integrator).__name__} is stochastic: pass `key=jax.random.key(...)` "
                         "or a 'seed' axis.")
    return _Member(rollout)


class _Member(eqx.Module):
    """One member's run of a rollout (a pytree: its arrays are traced, its settings static)."""

    rollout: AbstractRollout

    def __call__(self, system, state0, key):
        if isinstance(self.rollout, Solve):
            return self.rollout(system, state0, throw=False)
        return self.rollout(system, state0, key=key if self.rollout.stochastic else None)


def _reduce_axes(reduce_over, axes, mode, reductions) -> tuple:
    names = [a.name for a in axes]
    if reduce_over is None:
        return tuple(range(len(names))) if mode == "grid" else (0,)
    if not reductions:
        raise ValueError("sweep: `reduce_over` was given without `reduce`; pass reductions, e.g. reduce='mean'.")
    if isinstance(reduce_over, str):
        reduce_over = (reduce_over,)
    reduce_over = tuple(reduce_over)
    for n in reduce_over:
        if n not in names:
            raise ValueError(f"sweep: `reduce_over` names {n!r}, which is not an axis; axes: {names}.")
    if mode == "zip":
        if set(reduce_over) != set(names):
            raise ValueError("sweep: in zip mode the axes form one member dimension; reductions run over all "
                             f"of it (reduce_over=None), got reduce_over={list(reduce_over)}.")
        return (0,)
    if not reduce_over:
        raise ValueError("sweep: `reduce_over` is empty; name at least one axis to reduce over.")
    return tuple(names.index(n) for n in sorted(set(reduce_over), key=names.index))


# Cost ordering for adaptive solves. Under `vmap` Diffrax's while-loop runs until the slowest
# member of the batch finishes, and every lane computes every iteration, so a batch costs
# (batch size) x (its largest step count). Sorting members by estimated cost and running
# buckets of similar cost removes most of that waste; buckets of 32 members per device were the
# best compromise with the per-iteration overhead in our measurements on CPU (docs/multihost.md).
# Buckets run one after another, so on an accelerator 32 members would leave it nearly idle:
# there every device gets ACCELERATOR_COST_BUCKETS buckets of at least ACCELERATOR_MIN_BUCKET
# members (a GPU needs tens of thousands of members in flight; not yet measured on one).
COST_BUCKET = 32
ACCELERATOR_COST_BUCKETS = 8
ACCELERATOR_MIN_BUCKET = 16384
PILOT_STEPS = 256
PILOT_FRAMES = 257


def _cost_order(order, system, state0, axes, mode, rollout, key, batch_size, memory_budget, devices):
    """Order members by a pilot estimate of their step count (most expensive first).

    The pilot solves every member with the same solver and tolerances but at most
    `PILOT_STEPS` steps, saving `PILOT_FRAMES` times over [t0, t1]; a member that finishes
    gives its exact step count, one that does not gives steps x span / time reached. The
    pilot costs at most `PILOT_STEPS` steps per member.
    """
    if order != "cost":
        raise ValueError(f"sweep: `order` must be None, 'cost' or a permutation of member indices, got {order!r}.")
    if not isinstance(rollout, Solve) or rollout.t0 is None or rollout.t1 is None:
        raise ValueError("sweep: order='cost' estimates the cost of adaptive solves; it needs "
                         "rollout=sciax.Solve(..., t0=..., t1=...). For other runs pass `order=` a permutation.")
    t0, t1 = rollout.t0, rollout.t1
    pilot = Solve(rollout.solver, t0=t0, t1=t1, save_at=np.linspace(t0, t1, PILOT_FRAMES), rtol=rollout.rtol,
                  atol=rollout.atol, dt0=rollout.dt0, max_steps=PILOT_STEPS, adjoint=rollout.adjoint)
    with warnings.catch_warnings():  # the sweep itself warns about its axes once
        warnings.filterwarnings("ignore", r"sweep: axis .* rounds? onto another", RuntimeWarning)
        costs = sweep(system, state0, axes=axes, mode=mode, rollout=pilot, output=_pilot_cost, key=key,
                      memory_budget=memory_budget, devices=devices, check_finite=False).outputs
    costs = np.asarray(costs).reshape(-1)
    ranked = np.argsort(-costs, kind="stable")
    n_proc = jax.process_count()
    if n_proc > 1:  # deal members round-robin so every process gets a similar mix of costs
        ranked = np.concatenate([ranked[p::n_proc] for p in range(n_proc)])
    if batch_size is None:
        mesh = parallel.member_mesh(devices)
        n_dev = mesh.devices.size
        per_device = math.ceil(costs.size / (n_proc * n_dev))
        batch_size = _cost_bucket(per_device, _platform(mesh)) * n_dev
    return ranked, batch_size


def _cost_bucket(members_per_device: int, platform: str) -> int:
    """Members per device per cost bucket: `COST_BUCKET` on CPU; on accelerators the members
    split into `ACCELERATOR_COST_BUCKETS` buckets, each at least `ACCELERATOR_MIN_BUCKET`."""
    if platform == "cpu":
        return COST_BUCKET
    return max(ACCELERATOR_MIN_BUCKET, math.ceil(members_per_device / ACCELERATOR_COST_BUCKETS))


def _pilot_cost(traj):
    n = traj.stats["num_steps"].astype(jnp.float32)
    frames = traj.finite.shape[-1]
    reached = jnp.max(jnp.where(traj.finite, jnp.arange(frames), 0)).astype(jnp.float32)
    return jnp.where(traj.stats["success"], n, n * (frames - 1) / jnp.maximum(reached, 0.5))


def _check_order(order, n):
    if order is None:
        return None
    order = np.asarray(order)
    if order.shape != (n,) or not np.issubdtype(order.dtype, np.integer) or \
            not np.array_equal(np.sort(order), np.arange(n)):
        raise ValueError(f"sweep: `order` must be a permutation of the {n} flat member indices, got "
                         f"{describe(order)}.")
    return order.astype(np.int32)


def _member_ok(result):
    """True if the member finished: for a `Trajectory`, every saved state finite and (for
    solves) the solver succeeded; for any other run result, all its floating leaves finite.
    The kept `output` is not checked: it may use NaN as padding on purpose."""
    if isinstance(result, Trajectory):
        flags = [jnp.all(result.finite)]
        stats = result.stats or {}
        if "success" in stats:
            flags.append(jnp.all(jnp.asarray(stats["success"])))
    else:
        flags = [jnp.all(jnp.isfinite(x)) for x in jtu.tree_leaves(result)
                 if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(flags)) if flags else jnp.asarray(True)


def _member_result(specs, payload, values, flat):
    system, state0, key, run, _ = payload
    system, state0, key = apply_axes(specs, system, state0, key, values, flat)
    return run(system, state0, key)


def _member_output(result, check_finite, output):
    out = _as_arrays(output(result) if output is not None else result, "`output`" if output else "`run`")
    ok = _member_ok(result) if check_finite else jnp.asarray(True)
    return out, ok


def _as_arrays(tree, producer):
    """A member's kept output with every leaf an array: Python and NumPy numbers become arrays
    (as `jax.vmap` makes them); any other leaf is refused by its path."""
    def leaf(path, x):
        where = jtu.keystr(path) or "the top level"
        if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            raise TypeError(f"sweep: {producer} returned a PRNG key array at {where}; return "
                            "jax.random.key_data(key) to keep its bits.")
        if isinstance(x, jax.Array | bool | int | float | complex) or (
                isinstance(x, np.ndarray | np.number | np.bool_) and x.dtype.kind in "biufc"):
            return jnp.asarray(x)
        raise TypeError(f"sweep: {producer} returned {describe(x)} at {where}; a member's output must hold "
                        "arrays or numbers only.")

    return jtu.tree_map_with_path(leaf, tree)


def _member(specs, check_finite, payload, values, flat):
    """One member: (kept output, ok flag). Pure and unbatched; the ensemble is its vmap."""
    return _member_output(_member_result(specs, payload, values, flat), check_finite, payload[4])


def _nbytes(tree) -> int:
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in jtu.tree_leaves(tree)  # a key dtype has one too
               if hasattr(x, "shape"))


def _member_bytes(result_struct, out_struct, state0, one_values, streaming_copies=0) -> int:
    """Estimated live bytes of one member: its rollout result, its kept output (twice: the
    chunk being computed and the one being copied out, plus `streaming_copies` masked copies
    for a `Streaming` reduction, one per kept group), carries and stage vectors of the
    integrator (a generous 16 states) and its axis values."""
    state = _nbytes(jtu.tree_map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)),
                                 jtu.tree_leaves(state0)))
    return int(_nbytes(result_struct) + (2 + streaming_copies) * _nbytes(out_struct) + 16 * state
               + _nbytes(one_values) + 16)


def _default_budget(mesh) -> int:
    device = mesh.devices.flat[0]
    stats = None
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - not every backend reports memory
        stats = None
    if stats and "bytes_limit" in stats:
        return int(0.5 * (stats["bytes_limit"] - stats.get("bytes_in_use", 0)))
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    n_cpu_devices = max(1, sum(d.platform == "cpu" for d in jax.local_devices()))
    return int(0.25 * ram / n_cpu_devices)


def _batch(batch_size, memory_budget, member_bytes, n_dev, n_local, mesh):
    """Members per chunk: a multiple of the device count, and per device a multiple of `LANES`
    (see there) unless the memory limit allows fewer than `LANES` members per device."""
    budget = int(memory_budget) if memory_budget is not None else None
    if budget is not None and member_bytes > budget:
        raise ValueError(
            f"sweep: memory_budget={budget} bytes is smaller than one member, which needs about "
            f"{member_bytes} bytes (its rollout output, kept output and carries); raise the budget, keep "
            "less per member (`output=`, `save_every`, simulate's save_states=False) or use reductions."
        )
    # The default budget caps an explicit batch_size too (and order='cost''s buckets): a chunk
    # that does not fit is fatal on an accelerator.
    limit = budget if budget is not None else _default_budget(mesh)
    per_device = max(1, math.ceil(n_local / n_dev))
    if batch_size is not None:
        per_device = min(per_device, math.ceil(batch_size / n_dev))
    per_device = _round_up(per_device, LANES)
    if limit is not None:
        fits = limit // member_bytes
        if fits < per_device:
            per_device = (fits // LANES) * LANES if fits >= LANES else max(1, fits)
    return _balance(n_local, per_device, n_dev) * n_dev, limit


def _balance(n_local, per_device, n_dev):
    """Members per device per chunk: at most `per_device`, with the chunks as equal as lanes allow."""
    n_chunks = max(1, math.ceil(n_local / (per_device * n_dev)))
    even = math.ceil(n_local / (n_chunks * n_dev))
    # At least one member per device: a process with no members of its own (more processes
    # than members) still runs one all-padding chunk and joins the gathers.
    return max(1, min(per_device, _round_up(even, LANES if per_device >= LANES else 1)))


def _round_up(n, k):
    return -(-n // k) * k


def _check_host_memory(needs_values, n_members, out_struct):
    """Refuse a sweep whose kept outputs (`n_members` of them on this host) would take more
    than half the host's RAM."""
    if not needs_values:
        return
    need = n_members * _nbytes(out_struct)
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if need > 0.5 * ram:
        raise ValueError(
            f"sweep: keeping the members' outputs on this host needs {need / 2**30:.1f} GiB of memory "
            f"({n_members} members x {_nbytes(out_struct)} bytes), more than half of the {ram / 2**30:.1f} GiB "
            "here. Keep less per member (`output=`), pass streaming `reduce=` reductions with keep=False, "
            "or run in several sweeps."
        )


# --------------------------------------------------------------------------------- execute
@dataclasses.dataclass(frozen=True)
class _ChunkConfig:
    """Static description of the compiled chunk (hashable, so equal sweeps reuse the compile)."""

    axes: tuple
    mode: str
    shape: tuple
    mesh: object
    local: int  # members per device per chunk
    check_finite: bool
    needs_values: bool
    kept: tuple  # positions of the dims kept by the reductions
    n_groups: int
    streaming: tuple  # ((name, reduction), ...) computed on device
    partitioning: str = "shard_map"  # "single" (one device), "shard_map" or "auto" (see _chunk)
    cache_block: int | None = _CACHE_BLOCK  # members vmapped at once; None: the whole chunk (accelerators)


# On XLA:CPU the chunk is compiled without common-subexpression elimination, so that a member
# gets the same bits on one device and on many. XLA's algebraic simplifier makes rewrites that
# change the last bits (`A / broadcast(b)` -> `A * broadcast(1 / b)`, `(A * c1) * c2` ->
# `A * (c1 * c2)`), and whether one applies depends on the shape of the program when the
# simplifier reaches it. A multi-device program reaches it in another shape: the SPMD
# partitioner runs CSE first, so the four RK4 stages of an N-body step share one broadcast of
# the masses where a single-device program has one per stage, and only the single-device
# program had its divisions rewritten (float64, ~1e-16 relative, 7 of 100 members differed
# between 1 and 4 devices; measured 2026-11-23, jax 0.10.2). Without CSE both reach the
# simplifier alike. (The other difference, constants moved into the loop before the simplifier
# runs, is why `simulate` hides `dt` and `t0` behind an optimisation barrier.) Cost on one core:
# within noise to ~5% (benchmarks/results/2026-11-23-sweep.md). Other platforms keep XLA's
# defaults (not measured there).
_SAME_BITS_PASSES_OFF = ("cse",)


def _keyed_by_code(reduction):
    """A `Streaming` reduction whose functions compare by code and captured values, so that one
    re-created at every call (lambdas in a loop) reuses the compiled chunk; others as they are."""
    if not isinstance(reduction, Streaming):
        return reduction
    # `finalize` runs on the host, from the plan's own reductions: it has no place in the chunk's key
    return dataclasses.replace(reduction, partial=by_code(reduction.partial), merge=by_code(reduction.merge),
                               finalize=None)


def _chunk_runner(mesh):
    """`_chunk`, jitted for the mesh's platform (on CPU without CSE: see `_SAME_BITS_PASSES_OFF`;
    passes the user turned off in `XLA_FLAGS` stay off)."""
    if _platform(mesh) != "cpu":
        return _jitted_chunk(None)
    user = re.findall(r"--xla_disable_hlo_passes=(\S*)", os.environ.get("XLA_FLAGS", ""))
    names = (name.strip() for value in user for name in value.strip("\"'").split(","))  # XLA strips quotes
    return _jitted_chunk(",".join(sorted({name for name in names if name} | set(_SAME_BITS_PASSES_OFF))))


@functools.cache
def _jitted_chunk(passes_off: str | None):
    # returns when the chunk is queued: the host copies the previous one meanwhile
    return async_filter_jit(_chunk, compiler_options={"xla_disable_hlo_passes": passes_off} if passes_off else None)


def _chunk(config: _ChunkConfig, payload, tables, order, start, stop):
    """Members at positions `start .. start + batch - 1` (of `order`, or flat) below `stop`.

    Partitioning over the mesh:

    - `"shard_map"`: each device takes a contiguous slice of the chunk and runs
      `vmap(_member)` over it inside `shard_map`: no communication while stepping, and each
      device's adaptive solves stop when its own members are done.
    - `"auto"`: the same vmap with the member axis sharded by `NamedSharding`, partitioned by
      XLA. Fixed-step scans need no communication either, but a vmapped while-loop (adaptive
      solves) tests "any member still running" across the whole mesh at every step. Used only
      when the rollout cannot be traced inside `shard_map` (Diffrax's implicit solvers: lineax
      0.1.1 and Equinox compare shapes with and without the manual-mesh sharding and fail).
    - `"single"`: one device, plain `vmap`.

    The partial reductions of the chunk are combined across devices once.

    Returns (outputs or None, ok, {name: partial reduction state}). Which members of the chunk
    are valid (a prefix: positions below `stop`) and their flat indices are known on the host,
    so they are not returned (see `_execute`).
    """
    mesh = config.mesh
    axis = mesh.axis_names[0]
    dynamic, static = eqx.partition(payload, eqx.is_array)

    def members(dynamic, tables, order, start, stop, first, size):
        pos = start + first + jnp.arange(size, dtype=jnp.int32)
        if config.partitioning == "auto":
            pos = lax.with_sharding_constraint(pos, parallel.member_sharding(mesh))
        valid = pos < stop
        pos = jnp.clip(pos, 0, jnp.maximum(stop - 1, 0))
        flat = order[pos] if order is not None else pos
        coords = jnp.unravel_index(flat, config.shape) if config.mode == "grid" else (flat,) * len(tables)
        values = [t[c] for t, c in zip(tables, coords)]
        member = lambda p, v, i: _member(config.axes, config.check_finite, eqx.combine(p, static), v, i)  # noqa: E731
        # Cache blocking on CPU: a sequential loop over blocks of config.cache_block members, vmapped
        # within each block, keeps a block's states in cache for all its steps instead of
        # streaming the whole chunk through memory at every step.
        run = lambda vf: member(dynamic, *vf)  # noqa: E731
        if config.cache_block is None:
            outs, ok = jax.vmap(run)((values, flat))
        else:
            outs, ok = lax.map(run, (values, flat), batch_size=config.cache_block)
        return outs, ok, valid, flat

    size = config.local * mesh.devices.size
    if config.partitioning == "shard_map":
        def on_device(dynamic, tables, order, start, stop):
            return members(dynamic, tables, order, start, stop, lax.axis_index(axis) * config.local, config.local)

        sharded = jax.shard_map(on_device, mesh=mesh, in_specs=P(), out_specs=P(axis), check_vma=False)
        outs, ok, valid, flat = sharded(dynamic, tables, order, start, stop)
    else:
        outs, ok, valid, flat = members(dynamic, tables, order, start, stop, 0, size)
    mask = valid & ok if config.check_finite else valid
    groups = jnp.zeros_like(flat)
    if config.kept:
        coords = jnp.unravel_index(flat, config.shape)
        for i in config.kept:
            groups = groups * config.shape[i] + coords[i]
    partials = {k: tree_partial(r, outs, mask, groups, config.n_groups) for k, r in config.streaming}
    return (outs if config.needs_values else None), ok, partials


@async_filter_jit
def _merge(config: _ChunkConfig, out_struct, a, b):
    return {k: tree_merge(r, out_struct, a[k], b[k]) for k, r in config.streaming}


def _execute(plan: _Plan) -> dict:
    # Everything every chunk reads (axis values, member order, the system and state0) is placed
    # on every device of the mesh once, not copied from the default device at every chunk.
    on_mesh = parallel.replicated(plan.mesh)
    tables = jax.device_put([a.values for a in plan.axes], on_mesh)
    order = None if plan.order is None else jax.device_put(plan.order, on_mesh)
    stop = jax.device_put(np.int32(plan.stop), on_mesh)
    dynamic, static = eqx.partition(plan.payload, eqx.is_array)
    plan.payload = eqx.combine(jax.device_put(dynamic, on_mesh), static)
    run_chunk = _compile(plan, tables, order, stop)
    batch = plan.batch
    n_local = plan.stop - plan.start
    n_chunks = max(1, math.ceil(n_local / batch))
    values = (jtu.tree_map(lambda s: np.empty((n_local, *s.shape), s.dtype), plan.out_struct)
              if plan.needs_values else None)
    ok = np.ones(n_local, bool)
    # This process's positions plan.start .. plan.stop - 1 hold these flat member indices; a
    # chunk's valid members are the prefix of its positions below plan.stop. Both are known
    # here, so only `ok` and the outputs come back from the devices.
    positions = np.arange(plan.start, plan.stop)
    flat_local = (positions if plan.order is None else plan.order[positions]).astype(np.int64)
    state = None
    pending = []

    def collect(item):
        first, outs, ok_c = item
        n = min(batch, plan.stop - first)
        sl = slice(first - plan.start, first - plan.start + n)
        outs, ok_c = jax.device_get((outs, ok_c))  # one transfer of everything, started at dispatch
        ok[sl] = ok_c[:n]
        if values is not None:
            jtu.tree_map(lambda dst, src: dst.__setitem__(sl, src[:n]), values, outs)

    with equinox_errors():  # an eqx.error_if in user code surfaces where the outputs are read
        for c in range(n_chunks):
            first = plan.start + c * batch
            outs, ok_c, partials = run_chunk(jax.device_put(np.int32(first), on_mesh))
            for x in jtu.tree_leaves((outs, ok_c)):  # the copy to host starts when the chunk is done
                x.copy_to_host_async()
            state = partials if state is None else _merge(plan.config, plan.out_struct, state, partials)
            pending.append((first, outs, ok_c))
            if len(pending) > 1:  # copy chunk c-1 out while chunk c computes (async dispatch)
                collect(pending.pop(0))
        for item in pending:
            collect(item)
        state = jtu.tree_map(np.asarray, state)
    return dict(values=values, ok=ok, flat=flat_local, state=state, n_chunks=n_chunks, batch=batch)


def _compile(plan: _Plan, tables, order, stop):
    """The chunk runner. When the memory limit may bind, compile ahead of time and check XLA's
    memory analysis of the chunk against it, shrinking the chunk if needed; otherwise use the
    jit cache, so repeating an identical sweep does not recompile. The check always runs on
    accelerators (their memory is smaller than the host's and running out of it is fatal) and
    for a budget the user gave: the member estimate cannot see temporaries inside a rollout (a
    1 MB budget ran a 102 MB chunk unchecked). Only the default budget on CPU (a quarter of the
    RAM) trusts the estimate when it is far below the limit."""
    n_dev = plan.mesh.devices.size
    config = plan.config
    on_cpu = _platform(plan.mesh) == "cpu"
    if plan.budget is None or (on_cpu and not plan.budget_given and plan.member_bytes * config.local * 4 < plan.budget):
        chunk = _chunk_runner(plan.mesh)
        return lambda first: chunk(config, plan.payload, tables, order, first, stop)
    resident = _nbytes(tables) + (0 if order is None else order.nbytes)
    for _ in range(8):  # each pass shrinks the chunk; it stops when XLA's analysis fits the budget
        config = dataclasses.replace(config, local=plan.batch // n_dev)
        first = jax.device_put(np.int32(plan.start), stop.sharding)
        compiled = _chunk_runner(plan.mesh).lower(config, plan.payload, tables, order, first, stop).compile()
        mem = _compiled_bytes(compiled.compiled, resident)
        if mem is None or mem <= plan.budget or config.local == 1:
            break
        local = int(config.local * 0.9 * plan.budget / mem)
        local = _balance(plan.stop - plan.start, (local // LANES) * LANES or max(1, local), n_dev)
        plan.batch = min(local, config.local - 1) * n_dev
    if mem is not None and mem > plan.budget:
        raise ValueError(
            f"sweep: memory_budget={plan.budget} bytes is too small: XLA's memory analysis of a chunk of "
            f"{config.local} member(s) per device needs {mem} bytes. Raise the budget or keep less per member "
            "(`output=`, `save_every`, simulate's save_states=False).")
    plan.config = config
    plan.chunk_bytes = mem
    return lambda first: compiled(config, plan.payload, tables, order, first, stop)


def _compiled_bytes(compiled, resident=0) -> int | None:
    """Peak bytes of one chunk per device per XLA (arguments + outputs + temporaries), plus the
    previous chunk's outputs still being copied out, less the `resident` arguments that live for
    the whole sweep whatever the chunk size (the axis values and the member order)."""
    try:
        m = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend implements it
        return None
    if m is None:
        return None
    return int(m.argument_size_in_bytes - resident + 2 * m.output_size_in_bytes + m.temp_size_in_bytes
               - m.alias_size_in_bytes)


# --------------------------------------------------------------------------------- package
def _package(plan: _Plan, raw: dict) -> SweepResult:
    n = plan.n_members
    values, ok_local, flat_local = raw["values"], raw["ok"], raw["flat"]
    state = raw["state"]
    n_proc = jax.process_count()
    if n_proc > 1:
        share = max(parallel.process_share(n, p, n_proc)[1] - parallel.process_share(n, p, n_proc)[0]
                    for p in range(n_proc))
        pad = share - len(ok_local)
        gathered = parallel.allgather({
            "ok": np.pad(ok_local, (0, pad)), "flat": np.pad(flat_local, (0, pad), constant_values=-1),
            "state": state,
            "values": jtu.tree_map(lambda x: np.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)), values)
            if values is not None and (plan.gather or _exact(plan)) else None,
        })
        flat_all = gathered["flat"].reshape(-1)
        real = flat_all >= 0
        ok = np.ones(n, bool)
        ok[flat_all[real]] = gathered["ok"].reshape(-1)[real]
        state = _merge_processes(plan, gathered["state"], n_proc)
        all_values = None
        if gathered["values"] is not None:
            all_values = jtu.tree_map(lambda x: _scatter(x.reshape((-1,) + x.shape[2:])[real], flat_all[real], n),
                                      gathered["values"])
    elif plan.order is None:  # one process, members in sweep order: no copy
        ok, all_values = ok_local, values
    else:
        ok = np.ones(n, bool)
        ok[flat_local] = ok_local
        all_values = None if values is None else jtu.tree_map(lambda x: _scatter(x, flat_local, n), values)

    grid = lambda x: x.reshape(plan.shape + x.shape[1:])  # noqa: E731
    ok_grid = grid(ok)
    dims = plan.dims
    kept_dims = tuple(d for i, d in enumerate(dims) if i not in plan.reduce_axes)
    reduced_dims = tuple(d for i, d in enumerate(dims) if i in plan.reduce_axes)
    reductions = {}
    for name, red in plan.reductions.items():
        if red.needs_values:
            reductions[name] = red.from_values(jtu.tree_map(grid, all_values), ok_grid, plan.reduce_axes,
                                               plan.check_finite)
        else:
            reductions[name] = tree_finalize(red, plan.out_struct, state[name], plan.kept_shape)
    axes = {a.name: a.coords for a in plan.axes}
    result = SweepResult(axes=axes, mode=plan.mode, dims=dims, shape=plan.shape, outputs=None,
                         ok=ok_grid if plan.check_finite else None, failures=[], reductions=reductions,
                         reduced_dims=reduced_dims, kept_dims=kept_dims, info={})
    if plan.check_finite:
        result.failures = [{"index": int(i), **result.coords(int(i))} for i in np.flatnonzero(~ok)]
    if plan.keep:
        if plan.gather:
            result.outputs = jtu.tree_map(grid, all_values)
        else:
            order = np.argsort(flat_local)
            result.outputs = jtu.tree_map(lambda x: x[order], values)
            result.member_indices = flat_local[order]
    result.info = dict(members=n, chunks=raw["n_chunks"], batch_size=raw["batch"],
                       devices=plan.mesh.devices.size, partitioning=plan.config.partitioning,
                       processes=n_proc, member_bytes=plan.member_bytes,
                       memory_budget=plan.budget, chunk_bytes=plan.chunk_bytes,
                       process_members=(plan.start, plan.stop),
                       padding=raw["n_chunks"] * raw["batch"] - (plan.stop - plan.start))
    return result


def _exact(plan):
    return any(r.needs_values for r in plan.reductions.values())


def _scatter(x, flat, n):
    out = np.empty((n,) + x.shape[1:], x.dtype)
    out[flat] = x
    return out


def _merge_processes(plan, stacked, n_proc):
    streaming = {k: r for k, r in plan.reductions.items() if not r.needs_values}
    state = jtu.tree_map(lambda x: x[0], stacked)
    for p in range(1, n_proc):
        other = jtu.tree_map(lambda x, p=p: x[p], stacked)
        state = {k: tree_merge(r, plan.out_struct, state[k], other[k]) for k, r in streaming.items()}
    return jtu.tree_map(np.asarray, state)
