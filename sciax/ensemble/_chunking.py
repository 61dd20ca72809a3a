"""How big a `sweep` chunk is: members per chunk from a memory budget (the user's, or a share of
the device's or host's memory), rounded to `LANES` per device; members vmapped at once inside a
chunk on CPU (cache blocks, scaled by the cores a process may use: affinity and cgroup CPU
quota); the host-memory check for kept outputs."""

import math
import os

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .._validation import describe

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

