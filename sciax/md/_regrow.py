"""Neighbour-list overflow on the host: detect it, grow the capacities, replay the chunk.

Capacities are static shapes chosen on the host; inside a run an undersized buffer only sets
the sticky `Neighbours.overflow` status (the forces of that step are then wrong). `simulate_md`
runs `simulate` chunk by chunk, checks each chunk's final carry, and when a buffer overflowed
grows the system (`MDSystem.grow`), rebuilds the chunk's start carry with the new capacities
(`reallocate_carry`) and replays the chunk.

Why the result equals a run allocated large enough from the start: (1) a chunked run is
bitwise the uninterrupted one (`simulate(..., carry0=traj.final_carry, step_offset=...)`);
(2) `reallocate_carry` rebuilds the neighbour list from the positions it was last built at,
which is the list the larger run holds at that step (a Verlet list keeps its valid entries in
the same order whatever its capacity; only the empty slots at the end of each row differ);
(3) empty slots contribute exact zeros to the pair sums, so chunks run at the smaller capacity
before the overflow give the same forces as at the larger one, provided the summation order
of the occupied slots does not depend on the capacity. XLA:CPU sums a row of K slots in
vector lanes (slot j in lane j mod W) and the last K mod W slots in a scalar remainder loop:
an occupied slot in the remainder at one capacity and in a vector at another is added in a
different order, and the forces differ in the last bits (measured: capacities 28 and 30 differ
from 39 in a 64-particle run whose fullest row held 28 neighbours; 35 to 128 agree). So
`simulate_md` rounds the neighbour capacity up to a multiple of `CAPACITY_QUANTUM` (32, a
multiple of every CPU vector width in float32 and float64): no occupied slot is ever in a
remainder loop. (3) is a property of the compiled pair sums, not a guarantee of XLA:
`tests/test_md_regrow.py` checks it (float64 and float32, CPU). It holds for the forces, hence
for the trajectory; the potential energy and virial in the carry are sums over all slots at
once, whose order XLA picks by shape, so those of the chunks before a growth can differ from
the larger run's in the last bits (the carry of the final chunk is computed at the final
capacity and is equal). An integrator whose dynamics used the virial (a barostat) would need
that sum made capacity-independent too.
"""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._adjoint import CheckpointAdjoint
from .._errors import NonFiniteStateError
from .._simulate import simulate
from .._trajectory import Trajectory
from .._validation import positive_int, refuse_tracers
from ._integrators import MDCarry
from ._neighbours import describe_overflow

CAPACITY_QUANTUM = 32  # neighbour capacities used by simulate_md are multiples of this (module docstring)


def _quantised(system):
    """`system` with its Verlet-list capacity rounded up to a multiple of `CAPACITY_QUANTUM`."""
    strategy = system.neighbours
    capacity = getattr(strategy, "capacity", None)
    if capacity is None or capacity % CAPACITY_QUANTUM == 0:
        return system
    rounded = -(-capacity // CAPACITY_QUANTUM) * CAPACITY_QUANTUM
    return eqx.tree_at(lambda s: s.neighbours, system, dataclasses.replace(strategy, capacity=rounded))


def overflowed(carry) -> bool:
    """Whether some neighbour buffer overflowed in the run that produced `carry` (host).

    **Arguments:** `carry`, an `MDCarry` (e.g. `traj.final_carry`), or a batched one (an
    ensemble: True if any member overflowed). The status is sticky: set by any step of the run.

    **Returns:** a Python bool (waits for the run).

    **Raises:** `TypeError` if `carry` is not an `MDCarry` or is being traced.
    """
    if not isinstance(carry, MDCarry):
        raise TypeError(f"overflowed: `carry` must be a sciax.md.MDCarry (a trajectory's final_carry), "
                        f"got {type(carry).__name__}.")
    refuse_tracers("overflowed", "it reads the overflow status into a Python bool.", carry=carry)
    return bool(np.any(np.asarray(carry.neighbours.overflow) != 0))


@eqx.filter_jit
def _rebuilt_neighbours(system, neighbours):
    build = system.build_neighbours
    positions = neighbours.reference_positions
    for _ in range(positions.ndim - 2):  # an ensemble's carry: one build per member
        build = jax.vmap(build)
    new = build(positions)
    return eqx.tree_at(lambda n: (n.overflow, n.n_builds, n.required), new,
                       (neighbours.overflow, neighbours.n_builds, neighbours.required))


def reallocate_carry(system, carry: MDCarry) -> MDCarry:
    """`carry` with its neighbour buffers rebuilt for `system`'s capacities (after `grow`).

    The list is built from the positions of its last build (`reference_positions`), so it is
    the list a run allocated with these capacities from the start would hold at this step;
    the build counter, status and `required` are kept. The forces, energy and virial are kept:
    they were computed with a list that had not overflowed. Only a carry whose list had not
    overflowed (a chunk's start) should be reallocated.

    **Arguments:** `system`, the grown `MDSystem`; `carry`, an `MDCarry` (or a batched one,
    every member rebuilt).

    **Returns:** the new `MDCarry`.

    **Raises:** `TypeError` for a `carry` that is not an `MDCarry`.
    """
    if not isinstance(carry, MDCarry):
        raise TypeError(f"reallocate_carry: `carry` must be a sciax.md.MDCarry, got {type(carry).__name__}.")
    return eqx.tree_at(lambda c: c.neighbours, carry, _rebuilt_neighbours(system, carry.neighbours))


@dataclasses.dataclass(frozen=True)
class Regrowth:
    """One capacity growth of `simulate_md`: the chunk starting at global step `step` overflowed
    (`status`, the overflow bitmask, see `describe_overflow`) with neighbour strategy `before`
    and was replayed with `after`."""

    step: int
    status: int
    before: object
    after: object


@dataclasses.dataclass(frozen=True)
class MDRun:
    """What `simulate_md` returns.

    **Fields:** `trajectory`, the `Trajectory` of the whole run (frames of every chunk, its
    `final_carry` the last chunk's); `system`, the `MDSystem` with the capacities the run ended
    with (pass it to later runs); `regrowths`, a tuple of `Regrowth`, in order.
    """

    trajectory: Trajectory
    system: object
    regrowths: tuple


def _capacities(system) -> tuple:
    strategy = system.neighbours
    return tuple(getattr(strategy, name, None) for name in ("capacity", "cell_capacity", "grid"))


def _concatenate(trajs):
    first = trajs[0]

    def cat(*xs):
        return jnp.concatenate([xs[0]] + [x[1:] for x in xs[1:]])

    return Trajectory(
        times=cat(*[t.times for t in trajs]),
        states=None if first.states is None else jax.tree.map(cat, *[t.states for t in trajs]),
        observables=jax.tree.map(cat, *[t.observables for t in trajs]),
        finite=cat(*[t.finite for t in trajs]),
        final_carry=trajs[-1].final_carry,
    )


def simulate_md(
    system,
    state0=None,
    *,
    integrator,
    dt,
    n_steps: int,
    chunk_steps: int | None = None,
    save_every: int = 1,
    t0=0.0,
    key=None,
    args=None,
    observables=None,
    save_states: bool = True,
    check_finite: bool = False,
    step_offset: int = 0,
    carry0=None,
    max_regrows: int = 8,
    margin: float = 1.25,
) -> MDRun:
    """`simulate` an MD system in chunks, growing neighbour capacities and replaying a chunk
    whose buffers overflowed.

    Each chunk of `chunk_steps` steps is one `simulate` call continuing from the previous
    chunk's final carry (`carry0=`, `step_offset=`): the run is bitwise the uninterrupted one.
    After a chunk the host reads the carry's overflow status; on overflow it grows the system
    (`system.grow(neighbours, margin=margin)`), rebuilds the chunk's start carry with the new
    capacities (`reallocate_carry`; the first chunk starts again from `state0`), and replays
    the chunk. The result equals, bit for bit, a run allocated with the final capacities from
    the start. Verlet-list capacities are rounded up to a multiple of `CAPACITY_QUANTUM` = 32
    (also the given system's), which keeps the pair sums' bits independent of the capacity
    (see the module docstring).

    A host-side driver: it is not differentiated (`jax.grad` through it is refused). To
    differentiate, run `simulate` with the system this returns (its capacities fit the run).

    **Arguments:** as `simulate` (`system`, `state0` or `carry0`, `integrator`, `dt`,
    `n_steps`, `save_every`, `t0`, `key`, `args`, `observables`, `save_states`,
    `check_finite`, `step_offset`), and

    - `chunk_steps`: steps per chunk, a multiple of `save_every` (default: `n_steps`, one
      chunk). A chunk that overflows is computed twice, so shorter chunks waste less on a
      replay and check more often (one host synchronisation per chunk).
    - `max_regrows`: how many times capacities may grow in one run.
    - `margin`: the factor `grow` applies to the largest counts seen (>= 1).

    **Returns:** an `MDRun(trajectory, system, regrowths)`.

    **Raises:** `RuntimeError` when growing does not help (the box is too small for the cell
    grid: `describe_overflow` says which buffer) or after `max_regrows` growths;
    `NonFiniteStateError` with `check_finite=True` (frame numbers of the whole run); what
    `simulate` raises; `TypeError` when called under a JAX transformation.
    """
    where = "simulate_md"
    refuse_tracers(where, "it reads each chunk's overflow status on the host to grow capacities and replay.",
                   system=system, state0=state0, carry0=carry0, dt=dt, t0=t0, args=args, key=key,
                   observables=observables, integrator=integrator)
    n_steps = positive_int("n_steps", n_steps, where)
    save_every = positive_int("save_every", save_every, where)
    chunk_steps = n_steps if chunk_steps is None else positive_int("chunk_steps", chunk_steps, where)
    if chunk_steps % save_every:
        raise ValueError(f"{where}: `chunk_steps` ({chunk_steps}) must be a multiple of `save_every` "
                         f"({save_every}), so that every chunk ends on a saved frame.")
    if n_steps % save_every:
        raise ValueError(f"{where}: `n_steps` ({n_steps}) must be a multiple of `save_every` ({save_every}).")
    if isinstance(max_regrows, bool) or not isinstance(max_regrows, int) or max_regrows < 0:
        raise ValueError(f"{where}: `max_regrows` must be an int >= 0, got {max_regrows!r}.")
    if not margin >= 1:
        raise ValueError(f"{where}: `margin` must be >= 1, got {margin!r}.")
    if (state0 is None) == (carry0 is None):
        raise TypeError(f"{where}: pass exactly one of `state0` (a new run) and `carry0` (a final_carry to "
                        "continue from).")
    if carry0 is not None and not isinstance(carry0, MDCarry):
        raise TypeError(f"{where}: `carry0` must be an MDCarry (a trajectory's final_carry), got "
                        f"{type(carry0).__name__}.")

    common = dict(integrator=integrator, dt=dt, save_every=save_every, t0=t0, key=key, args=args,
                  observables=observables, save_states=save_states, adjoint=CheckpointAdjoint())
    if carry0 is not None and overflowed(carry0):
        raise RuntimeError(f"{where}: `carry0` comes from a run whose neighbour list overflowed "
                           f"({describe_overflow(int(np.max(np.asarray(carry0.neighbours.overflow))))}); "
                           "its forces are wrong. Replay that run instead.")
    system = _quantised(system)
    if carry0 is not None and carry0.neighbours.indices.shape[-1] != getattr(system.neighbours, "capacity", None) \
            and getattr(system.neighbours, "capacity", None) is not None:
        carry0 = reallocate_carry(system, carry0)
    carry, offset, done = carry0, int(step_offset), 0
    trajs, regrowths = [], []
    while done < n_steps:
        steps = min(chunk_steps, n_steps - done)
        while True:
            traj = simulate(system, state0 if carry is None else None, carry0=carry, n_steps=steps,
                            step_offset=offset, **common)
            if not overflowed(traj.final_carry):
                break
            status = int(np.bitwise_or.reduce(np.ravel(np.asarray(traj.final_carry.neighbours.overflow))))
            grown = _quantised(system.grow(traj.final_carry.neighbours, margin=margin))
            if _capacities(grown) == _capacities(system):
                raise RuntimeError(
                    f"{where}: the neighbour buffers overflowed ({describe_overflow(status)}) in the chunk from step "
                    f"{offset} and growing them does not help (capacities {system.neighbours}); the box is too small "
                    "for the list radius, or the run blew up.")
            if len(regrowths) >= max_regrows:
                raise RuntimeError(
                    f"{where}: the neighbour buffers overflowed again ({describe_overflow(status)}) in the chunk from "
                    f"step {offset} after {max_regrows} growths (`max_regrows`); the run may have blown up (check "
                    "the step size), or raise `max_regrows`.")
            regrowths.append(Regrowth(offset, status, system.neighbours, grown.neighbours))
            system = grown
            if carry is not None:
                carry = reallocate_carry(system, carry)
        if check_finite and not bool(np.all(np.asarray(traj.finite))):
            bad = int(np.argmax(~np.asarray(traj.finite)))
            frame = sum(len(t.times) - 1 for t in trajs) + bad
            time = float(np.asarray(traj.times)[bad])
            raise NonFiniteStateError(
                f"{where}: the state became non-finite (NaN/Inf) by frame {frame} (t = {time:g}); reduce `dt` or "
                "check the initial state and parameters.", frame=frame, time=time)
        trajs.append(traj)
        carry, offset, done = traj.final_carry, offset + steps, done + steps
    return MDRun(_concatenate(trajs), system, tuple(regrowths))
