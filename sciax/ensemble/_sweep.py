"""`sweep`: run an ensemble over parameter / initial-state / seed axes, in memory-bounded
chunks, sharded over devices and split across processes, with reductions on the fly.

Layout: one member is the unbatched rollout (`simulate`, `solve` or a user function); the
ensemble is `jax.vmap` of it, which for sciax's component-wise ODEs is already the
struct-of-arrays loop (one `(B,)` array per state component). Each device runs its own slice
of a chunk inside `shard_map`: no cross-device communication while stepping, one small
reduction of partial statistics per chunk.

This module holds the entry point, its checks and the plan; chunk sizes are `_chunking`'s,
cost ordering `_ordering`'s, running and packaging `_execute`'s, meshes and processes `_devices`'.
"""

import dataclasses
import math
from collections.abc import Callable
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .._compile.callable_key import by_code
from .._rollout import AbstractRollout, Solve
from .._validation import describe, refuse_tracers
from . import _chunking, _devices, _ordering
from ._axes import resolve_axes, warn_merged_coordinates
from ._execute import _chunk, _ChunkConfig, _execute, _keyed_by_code, _member_output, _member_result, _package
from ._reductions import Streaming, resolve_reductions
from ._result import MEMBER, SweepResult


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
      by their code and captured values (`sciax._compile.callable_key`), so a `lambda` re-created at
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
        _chunking._check_chunking(batch_size, memory_budget)  # before the pilot solve, not after it
        order, batch_size = _ordering._cost_order(order, system, state0, axes, mode, rollout, key, batch_size,
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
    _chunking._check_chunking(batch_size, memory_budget)
    order = _ordering._check_order(order, n_members)
    mesh = _devices.member_mesh(devices)
    specs = tuple(a.spec for a in resolved)
    payload = (system, state0, key, run_fn, by_code(output))  # a new lambda each call: no recompile

    one_values = [jax.ShapeDtypeStruct(a.values.shape[1:], a.values.dtype) for a in resolved]
    flat0 = jax.ShapeDtypeStruct((), jnp.int32)
    result_struct, (out_struct, _) = _member_structures(specs, check_finite, payload, one_values, flat0)
    kept = tuple(i for i in range(len(shape)) if i not in reduce_axes) if mode == "grid" else ()
    n_groups = math.prod(shape[i] for i in kept)
    # A `Streaming` reduction runs its partial once per kept group over the whole chunk.
    streaming_copies = n_groups if any(isinstance(r, Streaming) for r in reductions.values()) else 0
    member_bytes = _chunking._member_bytes(result_struct, out_struct, state0, one_values, streaming_copies)
    n_dev = mesh.devices.size
    start, stop = _devices.process_share(n_members)
    batch, budget = _chunking._batch(batch_size, memory_budget, member_bytes, n_dev, stop - start, mesh)
    exact = any(r.needs_values for r in reductions.values())
    needs_values = keep or exact
    # This process keeps every member's output when gathering or when a reduction needs all
    # values, else only its own share (gather=False in a multi-process run).
    _chunking._check_host_memory(needs_values, n_members if gather or exact else stop - start, out_struct)
    config = _ChunkConfig(
        axes=specs, mode=mode, shape=shape, mesh=mesh, local=batch // n_dev, check_finite=check_finite,
        needs_values=needs_values, kept=kept, n_groups=n_groups,
        streaming=tuple((k, _keyed_by_code(r)) for k, r in reductions.items() if not r.needs_values),
        partitioning="single" if n_dev == 1 else "shard_map",
        cache_block=_chunking._cache_block(_chunking._platform(mesh), _chunking._nbytes(out_struct),
                                           _chunking._cpu_threads_per_device(mesh.devices.size)),
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

