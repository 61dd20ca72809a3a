"""Neighbour-list overflow on the host: detect it, grow the capacities, replay the chunk.

Capacities are static shapes chosen on the host; inside a run an undersized buffer only sets
the sticky `Neighbours.overflow` status (the forces of that step are then wrong). `simulate_md`
runs `simulate` chunk by chunk, checks each chunk's final carry, and when a buffer overflowed
grows the system (`MDSystem.grow`), rebuilds the chunk's start carry with the new capacities
(`reallocate_carry`) and replays the chunk. `sweep_md` (`sciax.md._sweep`) runs the same loop,
`regrow_loop`, over the vmapped carries of an ensemble: the members share one set of
capacities, grown to the largest need of any member.

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
Verlet-list capacities are multiples of `CAPACITY_QUANTUM` (32, a multiple of every CPU vector
width in float32 and float64): no occupied slot is ever in a remainder loop. `MDSystem.allocate`
and `grow` choose such capacities, and `simulate_md` and `sweep_md` round one given by hand.
(3) is a property of the compiled pair sums, not a guarantee of XLA: `tests/test_md_regrow.py`
and `tests/test_md_sweep.py` check it (float64 and float32, CPU; one run and vmapped members).
It holds for the forces, hence for the trajectory; the potential energy and virial in the carry
are sums over all slots at once, whose order XLA picks by shape, so those of the chunks before
a growth can differ from the larger run's in the last bits (the carry of the final chunk is
computed at the final capacity and is equal). An integrator whose dynamics used the virial (a
barostat) would need that sum made capacity-independent too.

What is not capacity-independent: the cell grid sorts the particles, hence orders the list, so
a replay on a coarser grid (the box allows fewer cells: at the first build for a fixed box)
equals a run on that grid from the start, not one on the finer grid; and a `CellList`'s slots
are rows of cells `cell_capacity` wide, so growing that reorders its sums (measured: positions
differ by 1e-15 after 100 steps of a 64-particle gas between 32 and 64 slots per row), and
its replay agrees with the larger run to rounding only.
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
from ._neighbours import AllPairs, describe_overflow
from ._system import CAPACITY_QUANTUM as CAPACITY_QUANTUM, quantised


def _quantised(system):
    """`system` with its Verlet-list capacity rounded up to a multiple of `CAPACITY_QUANTUM`."""
    strategy = system.neighbours
    capacity = getattr(strategy, "capacity", None)
    if capacity is None or capacity % CAPACITY_QUANTUM == 0:
        return system
    return eqx.tree_at(lambda s: s.neighbours, system, dataclasses.replace(strategy, capacity=quantised(capacity)))


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
    """One capacity growth of `simulate_md` or `sweep_md`: the chunk starting at global step
    `step` overflowed (`status`, the overflow bitmask, see `describe_overflow`) with neighbour
    strategy `before` and was replayed with `after`; in an ensemble, `members` are the flat
    indices of the members that overflowed (row-major over the sweep's dims; `()` for one run)."""

    step: int
    status: int
    before: object
    after: object
    members: tuple = ()


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


FRAME_NEIGHBOURS = "sciax.md:frame_neighbours"  # the hidden observable of `with_frame_check`


def _frame_neighbours(t, state, system):
    n = system.build_neighbours(state.positions)
    return {"overflow": n.overflow, "required": n.required}


def with_frame_check(observables, system) -> dict:
    """`observables` plus, when there are any and `system` lists neighbours, the overflow status
    and needs of a list built at each saved frame.

    Observables such as `potential_energy` and `pressure` build their own neighbour list at the
    frame with the system's capacities; that build can overflow where the carry's list (built
    earlier, with a skin) did not, and the observable would be silently wrong. `regrow_loop`
    reads this status with the carry's, grows for both and drops it from the trajectory.
    """
    observables = dict(observables or {})
    if observables and not isinstance(system.neighbours, AllPairs):
        observables[FRAME_NEIGHBOURS] = _frame_neighbours
    return observables


def _chunk_needs(traj):
    """The chunk's overflow status per member and the `Neighbours` to grow from: the carry's list
    and the lists built at the saved frames (`with_frame_check`), the largest needs of both."""
    neighbours = traj.final_carry.neighbours
    overflow, required = np.asarray(neighbours.overflow), np.asarray(neighbours.required)
    frames = traj.observables.get(FRAME_NEIGHBOURS)
    if frames is not None:  # frames along the axis before the last of `required`
        overflow = overflow | np.bitwise_or.reduce(np.asarray(frames["overflow"]), axis=-1)
        seen = np.asarray(frames["required"])
        required = np.concatenate([np.maximum(required[..., :2], seen[..., :2].max(-2)),
                                   np.minimum(required[..., 2:], seen[..., 2:].min(-2))], axis=-1)
    return overflow, dataclasses.replace(neighbours, overflow=jnp.asarray(overflow), required=jnp.asarray(required))


def _capacities(system) -> tuple:
    strategy = system.neighbours
    return tuple(getattr(strategy, name, None) for name in ("capacity", "cell_capacity", "grid"))


def _concatenate(trajs, axis=0):
    """The chunks' trajectories as one: frames along `axis` (after any member axes), each chunk's
    first frame (the previous chunk's last) dropped."""
    first = trajs[0]

    def cat(*xs):
        return jnp.concatenate([xs[0]] + [jax.lax.slice_in_dim(x, 1, None, axis=axis) for x in xs[1:]], axis=axis)

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
    After a chunk the host reads the carry's overflow status, and with `observables` that of a
    list built at each saved frame (what `potential_energy` or `pressure` build for themselves);
    on overflow it grows the system (`system.grow(neighbours, margin=margin)`), rebuilds the
    chunk's start carry with the new capacities (`reallocate_carry`; the first chunk starts
    again from `state0`), and replays the chunk. The result equals, bit for bit, a run
    allocated with the final capacities from the start. Verlet-list capacities are rounded up
    to a multiple of `CAPACITY_QUANTUM` = 32 (also the given system's), which keeps the pair
    sums' bits independent of the capacity (see the module docstring).

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
    n_steps, save_every, chunk_steps = check_schedule(where, n_steps, save_every, chunk_steps, max_regrows, margin)
    if (state0 is None) == (carry0 is None):
        raise TypeError(f"{where}: pass exactly one of `state0` (a new run) and `carry0` (a final_carry to "
                        "continue from).")
    if carry0 is not None and not isinstance(carry0, MDCarry):
        raise TypeError(f"{where}: `carry0` must be an MDCarry (a trajectory's final_carry), got "
                        f"{type(carry0).__name__}.")

    common = dict(integrator=integrator, dt=dt, save_every=save_every, t0=t0, key=key, args=args,
                  save_states=save_states, adjoint=CheckpointAdjoint())
    if carry0 is not None and overflowed(carry0):
        raise RuntimeError(f"{where}: `carry0` comes from a run whose neighbour list overflowed "
                           f"({describe_overflow(int(np.max(np.asarray(carry0.neighbours.overflow))))}); "
                           "its forces are wrong. Replay that run instead.")
    system = _quantised(system)
    if carry0 is not None and carry0.neighbours.indices.shape[-1] != getattr(system.neighbours, "capacity", None) \
            and getattr(system.neighbours, "capacity", None) is not None:
        carry0 = reallocate_carry(system, carry0)

    def run_chunk(system, carry, offset, steps):
        return simulate(system, state0 if carry is None else None, carry0=carry, n_steps=steps, step_offset=offset,
                        observables=with_frame_check(observables, system), **common)

    def check(traj, frames_before):
        if check_finite and not bool(np.all(np.asarray(traj.finite))):
            bad = int(np.argmax(~np.asarray(traj.finite)))
            frame, time = frames_before + bad, float(np.asarray(traj.times)[bad])
            raise NonFiniteStateError(
                f"{where}: the state became non-finite (NaN/Inf) by frame {frame} (t = {time:g}); reduce `dt` or "
                "check the initial state and parameters.", frame=frame, time=time)

    trajs, system, regrowths = regrow_loop(where, system, carry0, run_chunk, n_steps=n_steps,
                                           chunk_steps=chunk_steps, step_offset=step_offset,
                                           max_regrows=max_regrows, margin=margin, after_chunk=check)
    return MDRun(_concatenate(trajs), system, regrowths)


def check_schedule(where, n_steps, save_every, chunk_steps, max_regrows, margin):
    """Host checks of a chunked run's step counts and growth settings, naming the argument;
    returns `(n_steps, save_every, chunk_steps)` (`chunk_steps` defaults to `n_steps`)."""
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
    if isinstance(margin, bool) or not isinstance(margin, int | float) or not margin >= 1:
        raise ValueError(f"{where}: `margin` must be a number >= 1, got {margin!r}.")
    return n_steps, save_every, chunk_steps


def regrow_loop(where, system, carry, run_chunk, *, n_steps, chunk_steps, step_offset, max_regrows, margin,
                after_chunk=None):
    """The host loop of `simulate_md` and `sweep_md`: run `n_steps` in chunks, growing the
    capacities and replaying a chunk whose neighbour buffers overflowed (the carry's, or those
    of the lists built at the frames, see `with_frame_check`).

    `run_chunk(system, carry, offset, steps) -> Trajectory` runs one chunk from `carry` (None:
    the first chunk, from the initial state or states) at global step `offset`; its final carry
    may be batched (an ensemble), and then one overflowing member grows the capacities of all,
    once, to the largest need of any member. `after_chunk(traj, frames_before)` sees each
    accepted chunk (it may raise).

    **Returns:** `(trajectories of the chunks, the grown system, tuple of Regrowth)`.
    """
    offset, done = int(step_offset), 0
    trajs, regrowths, frames = [], [], 0
    while done < n_steps:
        steps = min(chunk_steps, n_steps - done)
        traj = run_chunk(system, carry, offset, steps)
        while True:
            overflow, needs = _chunk_needs(traj)
            if not overflow.any():
                break
            status = int(np.bitwise_or.reduce(overflow.ravel()))
            members = tuple(int(i) for i in np.flatnonzero(overflow)) if overflow.ndim else ()
            what = describe_overflow(status) + (f" in members {list(members)}" if members else "")
            grown = system.grow(needs, margin=margin)
            if _capacities(grown) == _capacities(system):
                raise RuntimeError(
                    f"{where}: the neighbour buffers overflowed ({what}) in the chunk from step {offset} and "
                    f"growing them does not help (capacities {system.neighbours}); the box is too small for the "
                    "list radius, or the run blew up.")
            if len(regrowths) >= max_regrows:
                raise RuntimeError(
                    f"{where}: the neighbour buffers overflowed again ({what}) in the chunk from step {offset} after "
                    f"{max_regrows} growths (`max_regrows`); the run may have blown up (check the step size), or "
                    "raise `max_regrows`.")
            regrowths.append(Regrowth(offset, status, system.neighbours, grown.neighbours, members))
            system = grown
            if carry is not None:
                carry = reallocate_carry(system, carry)
            traj = run_chunk(system, carry, offset, steps)
        if FRAME_NEIGHBOURS in traj.observables:
            traj = dataclasses.replace(traj, observables={k: v for k, v in traj.observables.items()
                                                          if k != FRAME_NEIGHBOURS})
        if after_chunk is not None:
            after_chunk(traj, frames)
        trajs.append(traj)
        frames += np.shape(traj.times)[-1] - 1
        carry, offset, done = traj.final_carry, offset + steps, done + steps
    return trajs, system, tuple(regrowths)
