"""Running a planned `sweep`: one member (rollout, kept output, finite flag), the compiled chunk
(vmap or cache blocks, `shard_map` over devices, partial reductions), the host loop that
dispatches chunk k + 1 while copying chunk k out, the memory-checked ahead-of-time compile, and
packaging the outputs and reductions, gathered across processes, into a `SweepResult`."""

import dataclasses
import functools
import math
import os
import re
from typing import TYPE_CHECKING

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from .._compile.async_dispatch import async_filter_jit, equinox_errors
from .._compile.callable_key import by_code
from .._trajectory import Trajectory
from .._validation import describe
from . import _chunking, _devices
from ._axes import apply_axes
from ._reductions import Streaming, tree_finalize, tree_merge, tree_partial
from ._result import SweepResult

if TYPE_CHECKING:
    from ._sweep import _Plan

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
    cache_block: int | None = _chunking._CACHE_BLOCK  # members vmapped at once; None: the whole chunk (accelerators)


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
    if _chunking._platform(mesh) != "cpu":
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
            pos = lax.with_sharding_constraint(pos, _devices.member_sharding(mesh))
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


def _execute(plan: "_Plan") -> dict:
    # Everything every chunk reads (axis values, member order, the system and state0) is placed
    # on every device of the mesh once, not copied from the default device at every chunk.
    on_mesh = _devices.replicated(plan.mesh)
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


def _compile(plan: "_Plan", tables, order, stop):
    """The chunk runner. When the memory limit may bind, compile ahead of time and check XLA's
    memory analysis of the chunk against it, shrinking the chunk if needed; otherwise use the
    jit cache, so repeating an identical sweep does not recompile. The check always runs on
    accelerators (their memory is smaller than the host's and running out of it is fatal) and
    for a budget the user gave: the member estimate cannot see temporaries inside a rollout (a
    1 MB budget ran a 102 MB chunk unchecked). Only the default budget on CPU (a quarter of the
    RAM) trusts the estimate when it is far below the limit."""
    n_dev = plan.mesh.devices.size
    config = plan.config
    on_cpu = _chunking._platform(plan.mesh) == "cpu"
    if plan.budget is None or (on_cpu and not plan.budget_given and plan.member_bytes * config.local * 4 < plan.budget):
        chunk = _chunk_runner(plan.mesh)
        return lambda first: chunk(config, plan.payload, tables, order, first, stop)
    resident = _chunking._nbytes(tables) + (0 if order is None else order.nbytes)
    for _ in range(8):  # each pass shrinks the chunk; it stops when XLA's analysis fits the budget
        config = dataclasses.replace(config, local=plan.batch // n_dev)
        first = jax.device_put(np.int32(plan.start), stop.sharding)
        compiled = _chunk_runner(plan.mesh).lower(config, plan.payload, tables, order, first, stop).compile()
        mem = _compiled_bytes(compiled.compiled, resident)
        if mem is None or mem <= plan.budget or config.local == 1:
            break
        local = int(config.local * 0.9 * plan.budget / mem)
        lanes = _chunking.LANES
        local = _chunking._balance(plan.stop - plan.start, (local // lanes) * lanes or max(1, local), n_dev)
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
def _package(plan: "_Plan", raw: dict) -> SweepResult:
    n = plan.n_members
    values, ok_local, flat_local = raw["values"], raw["ok"], raw["flat"]
    state = raw["state"]
    n_proc = jax.process_count()
    if n_proc > 1:
        share = max(_devices.process_share(n, p, n_proc)[1] - _devices.process_share(n, p, n_proc)[0]
                    for p in range(n_proc))
        pad = share - len(ok_local)
        gathered = _devices.allgather({
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
