"""`sweep_md`: an ensemble of MD runs (temperatures, densities, seeds, ...) whose neighbour
buffers never silently overflow.

The members are the points of `axes`, named as for `sciax.sweep` (and resolved and applied by
its `resolve_axes` / `apply_axes`, so names, grid and zip modes, seeds and keys mean the same),
plus `"integrator.<field>"` for a field of the integrator (a thermostat's `kT`). All members
run side by side, `jax.vmap`ped in one compiled program per chunk of steps, with one set of
neighbour capacities (static shapes). The host loop is `simulate_md`'s (`regrow_loop`): after
each chunk it reads every member's overflow status; if any member overflowed, the shared
capacities grow once to the largest need of any member, every member's start carry is rebuilt
for them (`reallocate_carry`) and the chunk is replayed for all members. Capacities are
multiples of `CAPACITY_QUANTUM`, so, as for `simulate_md`, the result does not depend on the
capacities the sweep started with (`sciax.md._regrow`).

`sciax.sweep` itself runs each member as one uninterrupted rollout and returns to the host only
at the end; a replay needs every member's carry at each chunk boundary, which is why the chunks
of time are driven here.
"""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._adjoint import CheckpointAdjoint
from .._compile.callable_key import by_code
from .._errors import NonFiniteStateError
from .._simulate import simulate
from .._trajectory import Trajectory
from .._validation import check_time_scalar, describe, refuse_tracers, state_dtype
from ..ensemble._axes import apply_axes, resolve_axes, warn_merged_coordinates
from ..ensemble._result import MEMBER, SweepResult
from ..integrators._base import AbstractIntegrator
from ._regrow import _concatenate, _quantised, check_schedule, regrow_loop, with_frame_check
from ._system import MDSystem

INTEGRATOR = "integrator."  # axis names with this prefix vary a field of the integrator


@dataclasses.dataclass(frozen=True)
class MDSweep:
    """What `sweep_md` returns.

    **Fields:**

    - `trajectory`: the `Trajectory` of every member, each leaf with the sweep's `shape` in
      front (`times` `(*shape, n_frames)`, states `(*shape, n_frames, N, d)`, observables,
      `finite`, and `final_carry`).
    - `system`: the `MDSystem` with the capacities the sweep ended with (they hold every member).
    - `regrowths`: a tuple of `Regrowth`, in order (`members`: the flat indices of the members
      that overflowed).
    - `axes`: dict axis name -> coordinates, in the order given; `mode`: `"grid"` or `"zip"`.
    """

    trajectory: Trajectory
    system: object
    regrowths: tuple
    axes: dict
    mode: str

    @property
    def dims(self) -> tuple:
        """Names of the leading dims of the trajectory's leaves: the axes (grid) or `("member",)`."""
        return tuple(self.axes) if self.mode == "grid" else (MEMBER,)

    @property
    def shape(self) -> tuple:
        return tuple(np.shape(self.trajectory.finite)[:-1])

    def _indexed(self) -> SweepResult:
        return SweepResult(axes=self.axes, mode=self.mode, dims=self.dims, shape=self.shape, outputs=self.trajectory,
                           ok=None, failures=[], reductions={}, reduced_dims=(), kept_dims=self.dims, info={})

    def sel(self, method: str | None = None, **coords) -> Trajectory:
        """The trajectory of the members at these coordinates, as `SweepResult.sel`."""
        return self._indexed().sel(method, **coords).outputs

    def isel(self, **indices) -> Trajectory:
        """The trajectory of the members at these positions along named dims, as `SweepResult.isel`."""
        return self._indexed().isel(**indices).outputs


def sweep_md(
    system,
    state0,
    *,
    axes: dict,
    integrator,
    dt,
    n_steps: int,
    mode: str = "grid",
    chunk_steps: int | None = None,
    save_every: int = 1,
    t0=0.0,
    key=None,
    args=None,
    observables=None,
    save_states: bool = True,
    check_finite: bool = False,
    max_regrows: int = 8,
    margin: float = 1.25,
) -> MDSweep:
    """Run an MD ensemble side by side in chunks, growing the shared neighbour capacities and
    replaying a chunk in which any member's buffers overflowed.

    Member `i` is `simulate_md(system_i, state0_i, integrator=integrator_i, key=key_i, ...)` with
    the swept values put in place; all members run `jax.vmap`ped, each with its own carry
    (state, forces, thermostat variables, neighbour list). After a chunk the host reads every
    member's overflow status; if any overflowed it grows the capacities once to the largest need
    of any member (Verlet-list capacity a multiple of `CAPACITY_QUANTUM` = 32), rebuilds every
    member's start carry for them and replays the chunk. The result equals, bit for bit, the
    same sweep allocated with the final capacities from the start (frames' potential energy and
    virial, sums whose order XLA picks by the list's shape, to rounding: see `sciax.md._regrow`).
    Members share one cell grid, the finest the smallest box allows; the grid orders the
    neighbour list, so a member equals its own `simulate_md` run bit for bit where that run ends
    on the same grid (velocity Verlet, Langevin, in the tests), and to rounding where its larger
    box keeps a finer one. Under `Bussi` a member equals its own run to rounding only: JAX's gamma
    sampler, vmapped, rounds some draws differently by 1 ulp.

    A host-side driver, like `simulate_md`: it is not differentiated, and runs every member at
    once on the default device (one chunk of steps holds every member's frames).

    **Arguments:** as `simulate_md` (`system`, an allocated `MDSystem`; `state0`, its `MDState`;
    `integrator`, `dt`, `n_steps`, `chunk_steps`, `save_every`, `t0`, `key`, `args`,
    `observables`, `save_states`, `check_finite`, `max_regrows`, `margin`), and

    - `axes`: dict name -> values `(n, ...)`, as for `sciax.sweep`: a field of the system
      (`"potential.epsilon"`, `"box.lengths"`), a part of the initial state
      (`"state0.velocities"`), `"seed"` (member key `fold_in(key, seed)`), an `Axis(values,
      where=lambda system, state0: ...)`, or `"integrator.<field>"` for a field of the
      integrator (`"integrator.kT"`; an `Axis` under such a name gets `where(integrator,
      state0)`). Without a seed axis member `i` (flat, row-major) gets the key `fold_in(key, i)`.
      Every member has the particle number and shapes of `system` and `state0`.
    - `mode`: `"grid"` (every combination; leading dims `(len(a), len(b), ...)`) or `"zip"`
      (axes of one length `n` varied together; leading dim `(n,)`).
    - `check_finite`: raise `NonFiniteStateError` naming the first member and frame whose state
      holds NaN/Inf (`trajectory.finite` has the flags either way).

    **Returns:** an `MDSweep(trajectory, system, regrowths, axes, mode)`; `sel`/`isel` pick
    members by coordinate.

    **Raises:** `TypeError`/`ValueError` for bad input, naming the argument (unknown axis names
    list the valid ones); `RuntimeError` when growing does not help or after `max_regrows`
    growths (naming the members that overflowed); `NonFiniteStateError` with `check_finite=True`;
    `TypeError` when called under a JAX transformation.

    ```python
    res = md.sweep_md(system, state0, axes={"integrator.kT": jnp.linspace(0.5, 2.0, 8), "seed": jnp.arange(4)},
                      integrator=md.Bussi(kT=1.0, tau=0.1), dt=0.005, n_steps=4000, chunk_steps=500,
                      save_every=50, key=jax.random.key(0), observables={"U": md.potential_energy})
    res.trajectory.observables["U"]     # (8, 4, 81)
    res.regrowths, res.system.neighbours.capacity
    ```
    """
    where = "sweep_md"
    refuse_tracers(where, "it reads each chunk's overflow status on the host to grow capacities and replay.",
                   system=system, state0=state0, axes=axes, dt=dt, t0=t0, args=args, key=key,
                   observables=observables, integrator=integrator)
    n_steps, save_every, chunk_steps = check_schedule(where, n_steps, save_every, chunk_steps, max_regrows, margin)
    if not isinstance(system, MDSystem):
        raise TypeError(f"{where}: `system` must be a sciax.md.MDSystem, got {describe(system)}.")
    if not isinstance(integrator, AbstractIntegrator):
        raise TypeError(f"{where}: `integrator` must be a sciax.md integrator such as VelocityVerlet() or "
                        f"Bussi(kT, tau), got {describe(integrator)}.")
    system.check_state(state0)
    dtype = state_dtype(state0)
    check_time_scalar(where, "dt", dt, dtype, positive=True)
    check_time_scalar(where, "t0", t0, dtype)
    if mode not in ("grid", "zip"):
        raise ValueError(f"{where}: `mode` must be 'grid' or 'zip', got {mode!r}.")
    if key is not None and not (isinstance(key, jax.Array) and (jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
                                                              or key.shape == (2,))):
        raise TypeError(f"{where}: `key` must be a jax.random key, got {describe(key)}.")
    resolved = _resolve(where, axes, system, integrator, state0)
    if integrator.stochastic and key is None and "seed" not in axes:
        raise ValueError(f"{where}: {type(integrator).__name__} is stochastic: pass `key=jax.random.key(...)` or "
                         "a 'seed' axis.")
    shape, values = _member_values(where, resolved, mode)
    _check_members(where, resolved, mode, shape, values, system, integrator, state0)
    if observables is not None and not (isinstance(observables, dict)
                                        and all(isinstance(k, str) and callable(f) for k, f in observables.items())):
        raise TypeError(f"{where}: `observables` must be a dict mapping names to functions fn(t, state, system), "
                        f"got {describe(observables)}.")
    observables = {name: by_code(fn) for name, fn in (observables or {}).items()}  # a new lambda: no recompile
    specs = tuple((group, axis.spec) for group, axis in resolved)
    times = (jnp.asarray(dt, dtype), jnp.asarray(t0, dtype))

    def run_chunk(system, carry, offset, steps):
        settings = _Settings(steps, save_every, save_states, with_frame_check(observables, system))
        return _members(specs, settings, system, integrator, state0, key, values, carry, times, jnp.asarray(offset),
                        args)

    def check(traj, frames_before):
        finite = np.asarray(traj.finite)
        if check_finite and not finite.all():
            member, frame = np.unravel_index(int(np.argmax(~finite.ravel())), finite.shape)
            coords = _coords(resolved, mode, shape, int(member))
            time = float(np.asarray(traj.times)[member, frame])
            raise NonFiniteStateError(
                f"{where}: the state of member {int(member)} ({coords}) became non-finite (NaN/Inf) by frame "
                f"{frames_before + int(frame)} (t = {time:g}); reduce `dt` or check its parameters.",
                frame=frames_before + int(frame), time=time)

    trajs, system, regrowths = regrow_loop(where, _quantised(system), None, run_chunk, n_steps=n_steps,
                                           chunk_steps=chunk_steps, step_offset=0, max_regrows=max_regrows,
                                           margin=margin, after_chunk=check)
    trajectory = jax.tree.map(lambda x: x.reshape(shape + x.shape[1:]), _concatenate(trajs, axis=1))
    return MDSweep(trajectory, system, regrowths, {axis.name: axis.coords for _, axis in resolved}, mode)


class _Settings(eqx.Module):
    """A chunk's static settings (hashable: part of the compiled program's key)."""

    n_steps: int = eqx.field(static=True)
    save_every: int = eqx.field(static=True)
    save_states: bool = eqx.field(static=True)
    observables: tuple = eqx.field(static=True)  # (name, function) pairs

    def __init__(self, n_steps, save_every, save_states, observables):
        self.n_steps, self.save_every, self.save_states = n_steps, save_every, bool(save_states)
        self.observables = tuple(observables.items())


@eqx.filter_jit
def _members(specs, settings, system, integrator, state0, key, values, carries, times, offset, args):
    """One chunk of every member, vmapped: member `i` from `carries[i]` (None: from its initial
    state), with its system, integrator and key from `apply_axes`."""
    dt, t0 = times

    def member(flat, member_values, carry):
        groups = _split(specs, member_values)
        s, y0, k = apply_axes(groups["system"][0], system, state0, key, groups["system"][1], flat)
        integ = apply_axes(groups["integrator"][0], integrator, None, None, groups["integrator"][1], flat)[0]
        return simulate(s, y0 if carry is None else None, carry0=carry, integrator=integ, dt=dt, t0=t0,
                        n_steps=settings.n_steps, save_every=settings.save_every, step_offset=offset,
                        key=k if integ.stochastic else None, args=args, observables=dict(settings.observables),
                        save_states=settings.save_states, adjoint=CheckpointAdjoint())

    n_members = values[0].shape[0]
    return jax.vmap(member)(jnp.arange(n_members, dtype=jnp.int32), values, carries)


def _resolve(where, axes, system, integrator, state0) -> list:
    """`[(group, ResolvedAxis)]` in the order given: group "system" (names as for `sweep`) or
    "integrator" (names `integrator.<field>`, resolved against the integrator)."""
    if not isinstance(axes, dict) or not axes:
        raise TypeError(f"{where}: `axes` must be a non-empty dict mapping names to values, e.g. "
                        f"{{'integrator.kT': jnp.linspace(0.5, 2.0, 8), 'seed': jnp.arange(4)}}; got "
                        f"{describe(axes) if not isinstance(axes, dict) else 'an empty dict'}.")
    groups = {"system": {}, "integrator": {}}
    for name, value in axes.items():
        if isinstance(name, str) and name.startswith(INTEGRATOR):
            groups["integrator"][name.removeprefix(INTEGRATOR)] = value
        else:
            groups["system"][name] = value
    targets = {"system": system, "integrator": integrator}
    found = {}
    for group, named in groups.items():
        if not named:
            continue
        try:
            for axis in resolve_axes(named, targets[group], state0):
                name = axis.name if group == "system" else INTEGRATOR + axis.name
                if group == "integrator" and axis.kind in ("state", "seed"):
                    raise ValueError(f"axis {name!r} names no field of {type(integrator).__name__}")
                found[name] = (group, dataclasses.replace(axis, spec=dataclasses.replace(axis.spec, name=name)))
        except (TypeError, ValueError) as e:
            hint = f" (axes of the integrator are named '{INTEGRATOR}<field>')" if group == "integrator" else ""
            raise type(e)(f"{where}: {str(e).removeprefix('sweep: ')}{hint}") from None
    return [found[name] for name in axes]


def _member_values(where, resolved, mode):
    """The sweep's shape and each axis's value for every member, `(n_members, ...)` (row-major
    over the grid)."""
    lengths = {axis.name: len(axis) for _, axis in resolved}
    if mode == "zip":
        if len(set(lengths.values())) > 1:
            raise ValueError(f"{where}: in zip mode every axis must have the same length; got lengths {lengths}. "
                             "Use mode='grid' for every combination.")
        shape = (next(iter(lengths.values())),)
        return shape, [jnp.asarray(axis.values) for _, axis in resolved]
    for _, axis in resolved:
        warn_merged_coordinates(axis)
    shape = tuple(lengths.values())
    index = np.unravel_index(np.arange(int(np.prod(shape))), shape)
    return shape, [jnp.asarray(axis.values[i]) for (_, axis), i in zip(resolved, index, strict=True)]


def _split(specs, member_values):
    """The axes of each group and their values: `{group: (specs, values)}`."""
    return {group: (tuple(spec for g, spec in specs if g == group),
                    [v for (g, _), v in zip(specs, member_values, strict=True) if g == group])
            for group in ("system", "integrator")}


def _check_members(where, resolved, mode, shape, values, system, integrator, state0):
    """Host checks of every member, as their constructors and `check_state` check the base
    system and state (a swept box too small for the cutoff, positions outside a member's box, a
    negative temperature), naming the member by its coordinates."""
    specs = tuple((group, axis.spec) for group, axis in resolved)
    host = [np.asarray(v) for v in values]
    for i in range(int(np.prod(shape))):
        groups = _split(specs, [v[i] for v in host])
        try:
            s, y0, _ = apply_axes(groups["system"][0], system, state0, None, groups["system"][1], i)
            integ = apply_axes(groups["integrator"][0], integrator, None, None, groups["integrator"][1], i)[0]
            _check_modules((s, integ))
            s.check_state(y0)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{where}: member {i} ({_coords(resolved, mode, shape, i)}): {e}") from None


def _check_modules(tree):
    """Run the `__check_init__` of every Equinox module in `tree`, as construction does (a value
    put in place by `eqx.tree_at` skips them)."""
    if isinstance(tree, tuple | list):
        for x in tree:
            _check_modules(x)
    elif isinstance(tree, eqx.Module):
        for field in dataclasses.fields(tree):
            _check_modules(getattr(tree, field.name))
        for cls in type(tree).__mro__:
            if "__check_init__" in vars(cls):
                cls.__check_init__(tree)


def _coords(resolved, mode, shape, member) -> dict:
    position = (member,) * len(resolved) if mode == "zip" else np.unravel_index(member, shape)
    return {axis.name: np.asarray(axis.coords[i]).tolist() for (_, axis), i in zip(resolved, position, strict=True)}
