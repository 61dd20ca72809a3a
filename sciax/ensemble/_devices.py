"""Devices and hosts: meshes for sharding an ensemble axis, and JAX's distributed runtime.

Multi-host runs use `jax.distributed` (no home-made scheduler). Every process runs the same
script; `initialize_distributed()` connects them, after which `sciax.sweep` gives each
process a contiguous share of the members, runs it on that process's local devices, and
gathers the results (or leaves them per process, `gather=False`). See `docs/multihost.md`.
"""

import os

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MEMBER_AXIS = "members"

_ENV = ("SCIAX_COORDINATOR", "SCIAX_NUM_PROCESSES", "SCIAX_PROCESS_ID")


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    local_device_ids=None,
    initialization_timeout: int = 300,
) -> bool:
    """Start JAX's distributed runtime from arguments, environment variables or SLURM.

    Call once per process, before any other JAX computation. In order of precedence:

    1. the arguments;
    2. `SCIAX_COORDINATOR` (`host:port` of process 0), `SCIAX_NUM_PROCESSES`,
       `SCIAX_PROCESS_ID`;
    3. a SLURM job step with more than one task (inside `srun`: `SLURM_STEP_NODELIST` set and
       `SLURM_STEP_NUM_TASKS > 1`): JAX detects the coordinator, process count and id from
       SLURM's variables. A batch script or `salloc` shell outside `srun` has the job's
       variables but no job step, and runs single-process;
    4. otherwise nothing is started and the run is single-process.

    On CPU, cross-process collectives need an implementation: this selects Gloo
    (`jax_cpu_collectives_implementation="gloo"`) before initializing, which does not affect
    GPU/TPU backends.

    **Returns:** True if the distributed runtime was started (or already running), False for
    a single-process run.

    **Raises:** `ValueError` if only some of the three settings are given, or they are not
    integers / in range.
    """
    if jax.distributed.is_initialized():
        return True
    coordinator_address = coordinator_address or os.environ.get("SCIAX_COORDINATOR") or None
    num_processes = num_processes if num_processes is not None else _env_int("SCIAX_NUM_PROCESSES")
    process_id = process_id if process_id is not None else _env_int("SCIAX_PROCESS_ID")
    given = [coordinator_address is not None, num_processes is not None, process_id is not None]
    if any(given) and not all(given):
        missing = [name for name, g in zip(_ENV, given) if not g]
        raise ValueError(
            "initialize_distributed: a multi-process run needs the coordinator address, the number "
            f"of processes and this process's id; missing {missing} (as arguments "
            "coordinator_address/num_processes/process_id or the environment variables "
            f"{', '.join(_ENV)})."
        )
    if all(given):
        if num_processes < 1 or not 0 <= process_id < num_processes:
            raise ValueError(
                f"initialize_distributed: need num_processes >= 1 and 0 <= process_id < num_processes, "
                f"got num_processes={num_processes}, process_id={process_id}."
            )
        _select_cpu_collectives()
        jax.distributed.initialize(
            coordinator_address=coordinator_address, num_processes=num_processes, process_id=process_id,
            local_device_ids=local_device_ids, initialization_timeout=initialization_timeout,
        )
        return True
    if _in_slurm_step():
        _select_cpu_collectives()
        jax.distributed.initialize(local_device_ids=local_device_ids,
                                   initialization_timeout=initialization_timeout)
        return True
    return False


def _in_slurm_step() -> bool:
    """Inside `srun` with more than one task. JAX reads the coordinator from
    `SLURM_STEP_NODELIST`, which only a job step has; `SLURM_NTASKS` alone is also set in a
    batch script, where starting the runtime would fail."""
    if "SLURM_JOB_ID" not in os.environ or not os.environ.get("SLURM_STEP_NODELIST"):
        return False
    tasks = _env_int("SLURM_STEP_NUM_TASKS", default=_env_int("SLURM_NTASKS", default=1))
    return tasks > 1 and "SLURM_PROCID" in os.environ


def _select_cpu_collectives():
    if jax.config.jax_cpu_collectives_implementation in (None, "", "none"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")


def _env_int(name, default=None):
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {value!r}.") from None


def process_share(n_members: int, process_index: int | None = None, process_count: int | None = None):
    """The contiguous range `(start, stop)` of `n_members` that a process computes.

    Shares differ in size by at most one; process `p` gets members `start..stop-1`.
    """
    p = jax.process_index() if process_index is None else process_index
    n = jax.process_count() if process_count is None else process_count
    base, extra = divmod(n_members, n)
    start = p * base + min(p, extra)
    return start, start + base + (1 if p < extra else 0)


def member_mesh(devices=None) -> Mesh:
    """A 1-D mesh with axis name `"members"` over `devices`.

    `devices`: None (all of this process's local devices), an int `k` (the first `k` local
    devices), a sequence of devices, or a 1-D `jax.sharding.Mesh` (returned as is).
    """
    if isinstance(devices, Mesh):
        if devices.devices.ndim != 1:
            raise ValueError(
                f"sweep: `devices` must be a 1-D Mesh (the ensemble axis is sharded over one mesh axis), "
                f"got a mesh of shape {dict(devices.shape)}; use Mesh(devices.flatten(), ('members',))."
            )
        if not all(d.process_index == jax.process_index() for d in devices.devices.flat):
            raise ValueError(
                "sweep: the mesh must hold this process's own (local) devices; in a multi-process "
                "run each process shards its share of members over its local devices."
            )
        return devices
    local = jax.local_devices()
    if devices is None:
        chosen = local
    elif isinstance(devices, int | np.integer) and not isinstance(devices, bool):
        if not 1 <= devices <= len(local):
            raise ValueError(f"sweep: `devices={devices}` but this process has {len(local)} local device(s).")
        chosen = local[: int(devices)]
    else:
        chosen = list(devices)
        if not chosen or not all(isinstance(d, jax.Device) for d in chosen):
            raise TypeError(f"sweep: `devices` must be None, an int, a list of jax devices or a Mesh, got {devices!r}.")
        if len(set(chosen)) != len(chosen):
            raise ValueError(f"sweep: `devices` lists a device more than once ({chosen}); each device takes "
                             "one share of the members, so list each once.")
        foreign = [d for d in chosen if d.process_index != jax.process_index()]
        if foreign:
            raise ValueError(
                f"sweep: `devices` holds {len(foreign)} device(s) of other processes (e.g. {foreign[0]}); "
                "in a multi-process run each process shards its share of members over its own devices: "
                "pass jax.local_devices() (the default) or a subset of them."
            )
    return Mesh(np.array(chosen), (MEMBER_AXIS,))


def member_sharding(mesh: Mesh) -> NamedSharding:
    """Shard a leading ensemble axis over the mesh's (single) axis."""
    return NamedSharding(mesh, PartitionSpec(mesh.axis_names[0]))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


ALLGATHER_PIECE_BYTES = 64 * 2**20  # bytes per process per round of `allgather`


def _identity(x):  # one function object, so jax.jit's cache serves every `allgather` call
    return x


def allgather(tree):
    """Gather a pytree of host arrays from every process, stacked on a new leading process axis.

    Every process must call this with arrays of the same shapes and dtypes. The gather runs
    over a mesh of one device per process, so processes may have different numbers of local
    devices (nodes with different GPU counts). The leaves travel as raw bytes (exact for every
    dtype, whether or not JAX's 64-bit mode is on), joined into one buffer and sent in rounds of
    at most `ALLGATHER_PIECE_BYTES` per process: that device holds (n_processes + 1) x that much
    at a time, not the whole gathered result (kept outputs of a large ensemble may not fit on one
    accelerator, though they fit in host memory). Round sizes are powers of two, so few programs
    are compiled.
    """
    if jax.process_count() == 1:
        return jax.tree_util.tree_map(lambda x: np.asarray(x)[None], tree)
    n = jax.process_count()
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    leaves = [np.asarray(x) for x in leaves]  # (np.ascontiguousarray would make 0-d arrays 1-d)
    sizes = [x.nbytes for x in leaves]
    total = sum(sizes)
    gathered = np.empty((n, total), np.uint8)
    if total:
        buffer = np.concatenate([np.ascontiguousarray(x).reshape(-1).view(np.uint8) for x in leaves])
        piece = min(ALLGATHER_PIECE_BYTES, 1 << (total - 1).bit_length())
        firsts = [min((d for d in jax.devices() if d.process_index == p), key=lambda d: d.id) for p in range(n)]
        mesh = Mesh(np.array(firsts), ("processes",))
        mine = firsts[jax.process_index()]
        stacked = NamedSharding(mesh, PartitionSpec("processes"))
        gather = jax.jit(_identity, out_shardings=NamedSharding(mesh, PartitionSpec()))
        for first in range(0, total, piece):  # the same rounds on every process (same sizes)
            part = np.zeros((1, piece), np.uint8)
            chunk = buffer[first:first + piece]
            part[0, :chunk.size] = chunk
            global_ = jax.make_array_from_single_device_arrays((n, piece), stacked, [jax.device_put(part, mine)])
            gathered[:, first:first + chunk.size] = np.asarray(gather(global_).addressable_data(0))[:, :chunk.size]
    out, offset = [], 0
    for x, size in zip(leaves, sizes):
        raw = np.ascontiguousarray(gathered[:, offset:offset + size])
        out.append(raw.view(x.dtype).reshape((n, *x.shape)))
        offset += size
    return jax.tree_util.tree_unflatten(treedef, out)
