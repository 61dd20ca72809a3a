"""`simulate`: a fixed-step rollout as nested `lax.scan`s, pure, jittable and differentiable."""

import functools
import math
import warnings
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import jax.tree_util as jtu
import numpy as np
from jax import lax

from ._adjoint import AbstractAdjoint, CheckpointAdjoint, ReversibleAdjoint
from ._compile.async_dispatch import async_filter_jit
from ._compile.callable_key import by_code
from ._compile.cpu_fusion import fuse_cotangents, fuse_values
from ._errors import NonFiniteStateError
from ._trajectory import Trajectory
from ._validation import (
    check_derivative,
    check_finite_state,
    check_precision,
    check_time_scalar,
    describe,
    is_concrete,
    positive_int,
    state_dtype,
)
from .integrators._base import AbstractIntegrator
from .systems._base import AbstractHamiltonian, AbstractODE, AbstractSDE


def simulate(
    system,
    state0=None,
    *,
    integrator: AbstractIntegrator,
    dt,
    n_steps: int,
    save_every: int = 1,
    t0=0.0,
    key=None,
    args=None,
    observables: dict[str, Callable] | None = None,
    save_states: bool = True,
    adjoint: AbstractAdjoint = CheckpointAdjoint(),
    check_finite: bool = False,
    step_offset=0,
    carry0=None,
) -> Trajectory:
    """Step `system` from `state0` with a fixed step and save every `save_every` steps.

    The rollout is an outer `lax.scan` over saved frames and an inner `lax.scan` over the
    steps between frames, compiled once per shape/dtype/static configuration. Frame `k` holds
    the state at `t0 + k * save_every * dt`; frame 0 is `state0`, so there are
    `n_steps // save_every + 1` frames.

    A run whose state becomes NaN or Inf (too large a step, e.g. a stiff problem such as
    `VanDerPol(mu=1000)` with an explicit method) is not an error by default: it returns, and
    `traj.finite` marks the frames from the first bad one (checking costs a wait for the result,
    which jitted and vmapped callers do not want). Pass `check_finite=True` to raise
    `NonFiniteStateError` naming the frame, or use `solve` with an implicit solver for stiff
    problems. (`solve` checks the initial state for NaN/Inf on the host; `simulate` does so with
    `check_finite=True`.)

    **Arguments:**

    - `system`: an `AbstractODE`/`AbstractSDE`/`AbstractHamiltonian` (Equinox module).
    - `state0`: initial state (array for ODEs, `PhaseSpace` for particle systems), float64,
      float32 or half precision (float16, bfloat16); the rollout keeps its dtype.
    - `integrator`: a `sciax.integrators` method, e.g. `RK4()` or `VelocityVerlet()`.
    - `dt`: step size (time units), positive and finite. Checked on the host when its value is
      known there; a traced `dt` (inside `jax.jit`, `jax.vmap`, `jax.grad`) that is zero or
      negative makes every frame after the first NaN (`finite` False, so `check_finite=True`
      raises) rather than integrating backwards or freezing the state.
    - `n_steps`: number of steps, a positive multiple of `save_every`.
    - `save_every`: steps between saved frames.
    - `t0`: initial time.
    - `key`: `jax.random` key, required by stochastic integrators; step `n` uses
      `jax.random.fold_in(key, n)`, so results do not depend on `save_every`.
    - `args`: passed to `vector_field(t, y, args)`.
    - `observables`: dict name -> `fn(t, state, system)` evaluated at every saved frame.
    - `save_states`: keep the states (set False to keep only observables and bound memory).
    - `adjoint`: how reverse mode differentiates the rollout: `CheckpointAdjoint()` (the
      default: memory grows with saved frames, not steps, and it is also the fastest, since
      storing every intermediate makes plain reverse mode memory-bound), `DirectAdjoint()`
      (stores every step) or `ReversibleAdjoint()` (memory independent of steps; symplectic
      integrators only). None of them costs anything when nothing is differentiated.
    - `check_finite`: raise `NonFiniteStateError` naming the first frame with NaN/Inf.
    - `step_offset`: global index of the first step, for continuing a run in chunks: step `n`
      of this call runs from time `t0 + (step_offset + n) dt` with key
      `fold_in(key, step_offset + n)`, so a run split into chunks (same `t0`, each chunk
      starting from the previous final state) is bitwise equal to one call. Step indices are
      JAX integers: `step_offset + n_steps` must stay below 2**31 unless x64 is on.

    **Returns:** a `Trajectory` (its `final_carry` is the loop carry after the last step), as
    soon as the rollout is queued (asynchronous dispatch, as with
    `jax.jit`; `check_finite=True` waits for it), so the host can prepare the next call or write
    the previous result while it runs.

    **Raises:** `StateMismatchError` (state does not fit the system), `TypeError`/`ValueError`
    for bad arguments, `NonFiniteStateError` when `check_finite=True` and the run blew up,
    `eqx.EquinoxRuntimeError` for an `eqx.error_if` in the system or an observable (at the call
    on CPU; on an accelerator it arrives as a `JaxRuntimeError` where the outputs are read).

    ```python
    traj = sciax.simulate(sciax.systems.Lorenz(), jnp.array([1.0, 0.0, 0.0]),
                          integrator=sciax.integrators.RK4(), dt=0.01, n_steps=1000, save_every=10)
    ```
    """
    if carry0 is not None:
        if state0 is not None:
            raise TypeError("simulate: pass either `state0` or `carry0` (a `final_carry` to continue from), not both.")
        if not isinstance(integrator, AbstractIntegrator):  # (refused with its own message by _validate)
            raise TypeError(f"simulate: `integrator` must be a sciax.integrators method such as RK4(), "
                            f"got {type(integrator).__name__}.")
        state0 = integrator.state(carry0)  # validated as the state it carries
    elif state0 is None:
        raise TypeError("simulate: `state0` (the initial state) is required, or `carry0` to continue a run.")
    n_steps, save_every, dtype = _validate(
        system, state0, integrator, dt, n_steps, save_every, key, observables, adjoint
    )
    if type(state0) is float:  # a bare Python float: an array (jnp.asarray's precision), not a static value
        state0 = jnp.asarray(state0, dtype=dtype)
    check_precision(args, dtype, "simulate", what="`args`")
    if check_finite:  # it waits for the run anyway
        try:
            check_finite_state("simulate", "state0", state0)
        except ValueError as e:  # the error check_finite documents, at frame 0
            raise NonFiniteStateError(str(e), frame=0, time=float(t0) if is_concrete(t0) else None) from None
    check_time_scalar("simulate", "t0", t0, dtype)
    problem = time_resolution_problem(t0, dt, step_offset, n_steps, save_every, dtype)  # host values, unconverted
    if problem:
        warnings.warn(f"simulate: {problem}", RuntimeWarning, stacklevel=2)
    dt = jnp.asarray(dt, dtype=dtype)
    t0 = jnp.asarray(t0, dtype=dtype)
    observables = {name: by_code(fn) for name, fn in (observables or {}).items()}  # a new lambda: no recompile
    _check_step_counter(step_offset, n_steps)  # before jnp.asarray: 2**31 does not fit int32
    step_offset = jnp.asarray(step_offset)
    if jnp.ndim(step_offset) != 0 or not jnp.issubdtype(step_offset.dtype, jnp.integer):
        raise TypeError(f"`step_offset` must be an integer scalar, got {describe(step_offset)}.")
    _check_step_counter(step_offset, n_steps)
    if key is not None and is_concrete(step_offset) and int(step_offset) + n_steps > _MAX_KEYED_STEPS:
        raise ValueError(
            f"simulate: a stochastic run can take at most 2**32 steps: the key of step n is "
            f"fold_in(key, n), which keeps 32 bits of n, so later steps would repeat earlier noise "
            f"(step_offset={int(step_offset)}, n_steps={n_steps}). Continue with a new key instead.")
    if carry0 is None:
        componentwise = _use_componentwise_layout(system, state0)
    else:  # a carry of a componentwise run holds its state as a tuple of scalar components
        componentwise = isinstance(state0, tuple) and getattr(system, "n_components", None) == len(state0)
    try:
        traj = _rollout(
            system, state0 if carry0 is None else None, integrator, dt, t0, key, args, observables, n_steps,
            save_every, save_states, adjoint, componentwise, step_offset, carry0,
        )
    except TypeError as err:
        # JAX's own words name neither the adjoint nor the fix.
        if not (isinstance(adjoint, ReversibleAdjoint) and _JVP_OF_CUSTOM_VJP in str(err)):
            raise
        raise TypeError(
            "simulate(adjoint=ReversibleAdjoint()) supports reverse mode only (jax.grad, jax.vjp, jax.jacrev): "
            "it rebuilds the trajectory backwards during the backward pass, which forward mode (jax.jvp, "
            "jax.jacfwd) does not have. Use DirectAdjoint() or "
            "CheckpointAdjoint() for forward mode."
        ) from None
    if check_finite:
        traj = _check_finite(traj)
    return traj


_MAX_KEYED_STEPS = 2**32  # jax.random.fold_in takes 32 bits of the step index


def _check_step_counter(step_offset, n_steps):
    """The global step index step_offset + n must fit JAX's integers (int32 unless x64 is on):
    past 2**31 − 1 it would wrap to negative steps, times and keys."""
    if isinstance(step_offset, bool) or not isinstance(step_offset, int | np.integer | jax.Array | np.ndarray) \
            or not is_concrete(step_offset) or np.ndim(step_offset) != 0 \
            or not np.issubdtype(np.asarray(step_offset).dtype, np.integer):
        return  # traced, or not an integer scalar (refused with a TypeError after conversion)
    counter = np.iinfo(np.int64 if jax.config.jax_enable_x64 else np.int32)
    first, last = int(step_offset), int(step_offset) + n_steps
    if last > counter.max or first < counter.min:
        raise ValueError(
            f"simulate: the step indices `step_offset` … `step_offset` + `n_steps` = {first} … {last} leave "
            f"the range of JAX's {counter.dtype} step counter [{counter.min}, {counter.max}]; the steps would "
            "wrap around, with wrong times. Turn on 64-bit mode (jax.config.update('jax_enable_x64', True)) "
            "for longer runs.")


def time_resolution_problem(t0, dt, step_offset, n_steps, save_every, dtype) -> str | None:
    """Why the times t0 + n dt cannot be told apart in the state's precision, or None: in
    float32 near t = 3e7 representable times are 2 apart, so with a step of 1e-3 the step times
    round onto each other and a time-dependent vector field is evaluated at the wrong times (an
    autonomous system's states are unaffected). Saved frames are computed as t0 + n dt, each
    rounded once, so their times are right unless the frames themselves are closer than the
    spacing. `simulate` warns with it, not raises: long float32 runs of autonomous systems are
    common and their states are right; the runner checks a whole run once."""
    if not (is_concrete(t0) and is_concrete(dt) and is_concrete(step_offset)) or np.ndim(step_offset) != 0:
        return None  # (a non-scalar step_offset is refused later)
    t0, dt = (float(np.asarray(x).astype(dtype)) for x in (t0, dt))
    t_far = abs(t0) + (abs(int(step_offset)) + n_steps) * dt
    spacing = float(np.spacing(np.asarray(t_far, dtype=dtype)))
    if dt > spacing:
        return None
    frames = ("the saved times are wrong too" if save_every * dt <= spacing else
              f"the saved frames, {save_every * dt:g} apart, keep their times")
    return (f"`dt` = {dt:g} is not above the spacing {spacing:g} of {np.dtype(dtype).name} times near t = {t_far:g}, "
            f"so the step times t0 + n dt round onto each other: a time-dependent system is evaluated at wrong "
            f"times ({frames}; an autonomous system's states are unaffected). Use float64, or measure time from "
            "a nearer origin.")


def _validate(system, state0, integrator, dt, n_steps, save_every, key, observables, adjoint):
    if not isinstance(system, AbstractODE):
        raise TypeError(f"simulate: `system` must be a sciax system (AbstractODE), got {type(system).__name__}.")
    if not isinstance(integrator, AbstractIntegrator):
        raise TypeError(
            f"simulate: `integrator` must be a sciax.integrators method such as RK4(), "
            f"got {type(integrator).__name__}."
        )
    if not isinstance(adjoint, AbstractAdjoint):
        raise TypeError(
            "simulate: `adjoint` must be DirectAdjoint(), CheckpointAdjoint() or ReversibleAdjoint(), "
            f"got {adjoint!r}."
        )
    if isinstance(adjoint, ReversibleAdjoint) and (not integrator.reversible or integrator.stochastic):
        raise ValueError(
            f"ReversibleAdjoint needs a deterministic time-reversible integrator (VelocityVerlet, "
            f"Leapfrog, Yoshida4), got {type(integrator).__name__}; use CheckpointAdjoint() instead."
        )
    # Called through the class: Equinox wraps a method looked up on an instance in a new
    # bound-method module, ~17 µs each (jax 0.10.2, equinox 0.13.8): 55 µs of a 300 µs call.
    type(integrator).check_system(integrator, system)
    type(system).check_state(system, state0)
    dtype = state_dtype(state0)
    check_precision(system, dtype, "simulate")
    check_precision(integrator, dtype, "simulate", what="the integrator")
    check_time_scalar("simulate", "dt", dt, dtype, positive=True)  # as given, and in the state's precision
    n_steps = positive_int("n_steps", n_steps, "simulate")
    save_every = positive_int("save_every", save_every, "simulate")
    if n_steps % save_every:
        raise ValueError(
            f"`n_steps` ({n_steps}) must be a multiple of `save_every` ({save_every}); "
            f"for example n_steps={n_steps - n_steps % save_every or save_every}."
        )
    if integrator.stochastic:
        if key is None:
            raise ValueError(
                f"{type(integrator).__name__} is stochastic: pass `key=jax.random.key(seed)`."
            )
        if not (isinstance(key, jax.Array) and (jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
                                                or (key.dtype == jnp.uint32 and key.shape == (2,)))):
            raise TypeError(f"`key` must be a jax.random key, got {describe(key)}.")
    if observables is not None:
        if not isinstance(observables, dict) or not all(
            isinstance(k, str) and callable(f) for k, f in observables.items()
        ):
            raise TypeError("`observables` must be a dict mapping names to functions fn(t, state, system).")
    return n_steps, save_every, dtype


def _use_componentwise_layout(system, state0) -> bool:
    """Step a small 1-D ODE state as a tuple of scalars (struct of arrays under vmap)."""
    return getattr(system, "n_components", None) is not None and isinstance(state0, jax.Array | np.ndarray) \
        and jnp.ndim(state0) == 1


def _assemble(components):
    """The 1-D array of a tuple of scalar components (what observables receive), built by
    selects: exact for any value (inf, NaN, -0.0), like `jnp.stack`, but with a transpose
    that XLA:CPU fuses well. Reverse mode through an observable acting on the whole vector
    (`jnp.sum(y**2)`) of a stacked frame inside the time loop ran 5x slower (1,000 Lorenz
    members, 100 frames, float64, one core: 7.9 ms; with selects 1.6 ms)."""
    index = jnp.arange(len(components))
    out = jnp.broadcast_to(components[0], (len(components),))
    for i in range(1, len(components)):
        out = jnp.where(index == i, components[i], out)
    return out


def _frame_is_finite(state):
    return functools.reduce(jnp.logical_and, [jnp.all(jnp.isfinite(x)) for x in jtu.tree_leaves(state)])


@async_filter_jit  # returns before the rollout has run, so a host loop can overlap it
def _rollout(system, state0, integrator, dt, t0, key, args, observables, n_steps, save_every,
             save_states, adjoint, componentwise, step_offset, carry0=None):
    frames = _Frames(integrator, observables, save_every, n_steps // save_every, save_states,
                     componentwise, adjoint)
    # While tracing (once per compilation): the vector field must return the state's structure,
    # shapes and dtype (a (1,) result for a (2,) state would be broadcast into a wrong trajectory).
    # A Hamiltonian's inherited field (v, -grad U / m) has the shape of its positions by
    # construction, and integrators of particle systems (sciax.md) step from forces without it.
    if not (isinstance(system, AbstractHamiltonian) and type(system).vector_field is AbstractHamiltonian.vector_field):
        y_user = state0 if carry0 is None else frames.to_user(integrator.state(carry0))
        check_derivative("simulate", system, "vector_field", t0, y_user, args)
        if isinstance(system, AbstractSDE) and key is not None:
            check_derivative("simulate", system, "diffusion", t0, y_user, args)
    # A traced `dt` (jit, vmap, grad) is not checked on the host: one that is not positive makes
    # every computed frame NaN (and `finite` False) instead of integrating backwards or freezing.
    # Before the barrier, so that XLA cannot fold a constant dt through it.
    dt = jnp.where(dt > 0, dt, jnp.nan)
    # Inside an enclosing jit (`sweep`, jit(vmap(simulate))) `dt` and `t0` arrive as constants.
    # XLA's simplifier merged dt into a product with a Butcher coefficient, which changes the
    # last bits (dt * (0.161 * k) -> (dt * 0.161) * k), in a single-device program, where dt was
    # still carried through the loop when it ran, but not in a multi-device one, where the
    # partitioner had already made it a constant inside the loop. As runtime values (as in an
    # eager call) they are treated alike in both: float32 Tsit5 ensembles differed in 9 of 90
    # members between 1 and 4 devices before. This depends on XLA's pass order (jax 0.10.2);
    # tests/test_sharding.py checks it.
    dt, t0 = lax.optimization_barrier((dt, t0))
    if carry0 is None:
        y0 = tuple(state0[i] for i in range(state0.shape[0])) if componentwise else state0
        carry0 = integrator.init(system, frames.time(t0, dt, step_offset), y0, args)
    if isinstance(adjoint, ReversibleAdjoint):
        # The observables' closed-over values become inputs of the custom VJP (a value traced
        # by an enclosing jit/vmap/grad cannot be closed over by its backward pass), which also
        # gives them cotangents.
        example = (frames.time(t0, dt, step_offset), frames.to_user(integrator.state(carry0)), system)
        observables = {name: eqx.filter_closure_convert(fn, *example) for name, fn in observables.items()}
        final_carry, saved = _reversible_frames((system, carry0, dt, args, t0, observables), frames, step_offset)
    else:
        final_carry, saved = frames.scan(system, carry0, dt, t0, key, args, step_offset)
    first = frames.record(system, carry0, frames.time(t0, dt, step_offset))
    if componentwise and first[0] is not None:  # one array per component: stack them now
        first, saved = (frames.to_user(first[0]), *first[1:]), (jnp.stack(saved[0], axis=-1), *saved[1:])
    states, obs, finite = jtu.tree_map(lambda a, b: jnp.concatenate([a[None], b]), first, saved)
    times = frames.time(t0, dt, step_offset + jnp.arange(frames.n_frames + 1) * save_every)
    return Trajectory(times=times, states=states, observables=obs, finite=finite, final_carry=final_carry)


class _Frames(eqx.Module):
    """The static plan of a rollout: how to take a step, a block of steps, and record a frame."""

    integrator: AbstractIntegrator
    observables: dict = eqx.field(static=True)
    save_every: int = eqx.field(static=True)
    n_frames: int = eqx.field(static=True)
    save_states: bool = eqx.field(static=True)
    componentwise: bool = eqx.field(static=True)
    adjoint: AbstractAdjoint

    def to_user(self, y):
        return _assemble(y) if self.componentwise else y

    def record(self, system, carry, t, observables=None):
        """(state or None, observables, all-finite flag) of one frame; `observables` replaces
        the plan's own (same names). A componentwise state is recorded as its tuple of
        components and stacked once after the scan (`_rollout`): stacking it in every frame
        made reverse mode through the scan 2-3x slower on XLA:CPU (the transposed stack in each
        backward iteration)."""
        observables = self.observables if observables is None else observables
        state = self.integrator.state(carry)
        user = self.to_user(state) if observables else None  # assembled once for all of them
        # A Python number returned by an observable becomes an array, so it stacks over frames; a
        # Python float takes the state's precision (not float64 in a float32 run with x64 on).
        floats = [x.dtype for x in jtu.tree_leaves(state) if jnp.issubdtype(x.dtype, jnp.floating)]

        def as_array(x):
            return jnp.asarray(x, floats[0]) if type(x) is float and floats else jnp.asarray(x)  # not np.float64

        obs = {name: jtu.tree_map(as_array, fn(t, user, system)) for name, fn in observables.items()}
        return (state if self.save_states else None), obs, _frame_is_finite(state)

    def time(self, t0, dt, n):
        return t0 + n.astype(dt.dtype) * dt

    def scan(self, system, carry0, dt, t0, key, args, step_offset, observables=None):
        """Outer scan over frames, inner scan over steps. Returns (final carry, frames 1..n)."""

        rematerialised = isinstance(self.adjoint, CheckpointAdjoint) and self.adjoint.checkpoint_steps

        def one_step(carry, n):
            n = step_offset + n
            step_key = None if key is None else jr.fold_in(key, n)
            if not self.componentwise:
                return self.integrator.step(system, self.time(t0, dt, n), carry, dt, step_key, args), None
            # One XLA:CPU loop per step for all components, going forward and backward (`_compile/cpu_fusion.py`).
            # The system joins the state's hint only when the step is rematerialised: a hint
            # mixing loop-invariant parameters with the state makes everything computed from the
            # parameters per-step work (and a per-step residual) when the scan is partially
            # evaluated, as in `DirectAdjoint`; a rematerialised step saves only its inputs.
            if rematerialised:
                system_, carry = fuse_cotangents((system, carry))
            else:
                system_, carry = system, fuse_cotangents(carry)
            carry = self.integrator.step(system_, self.time(t0, dt, n), carry, dt, step_key, args)
            return fuse_values(carry), None

        if rematerialised:
            one_step = jax.checkpoint(one_step)

        def steps(carry, first, count):
            return lax.scan(one_step, carry, first + jnp.arange(count))[0]

        nested = isinstance(self.adjoint, CheckpointAdjoint) and self.adjoint.nest_above is not None \
            and self.save_every > self.adjoint.nest_above

        def block_steps(carry, first):
            if not nested:
                return steps(carry, first, self.save_every)
            # Two levels: ~√save_every sub-blocks, each rematerialised, so the backward pass of a
            # block stores ~2√save_every carries instead of save_every (one frame over 10^5 steps:
            # ~630 carries, not 10^5), for one more forward replay of the block.
            m = math.isqrt(self.save_every - 1) + 1
            q, r = divmod(self.save_every, m)
            sub = jax.checkpoint(lambda c, j: (steps(c, first + j * m, m), None))
            carry, _ = lax.scan(sub, carry, jnp.arange(q))
            return steps(carry, first + q * m, r) if r else carry

        def block(carry, frame):
            first = frame * self.save_every
            carry = block_steps(carry, first)
            return carry, self.record(system, carry, self.time(t0, dt, step_offset + first + self.save_every),
                                      observables)

        if isinstance(self.adjoint, CheckpointAdjoint):
            block = jax.checkpoint(block)
        return lax.scan(block, carry0, jnp.arange(self.n_frames))


_JVP_OF_CUSTOM_VJP = "can't apply forward-mode autodiff (jvp) to a custom_vjp function"


@eqx.filter_custom_vjp
def _reversible_frames(diff, frames: _Frames, step_offset):
    system, carry0, dt, args, t0, observables = diff
    return frames.scan(system, carry0, dt, t0, None, args, step_offset, observables)


@_reversible_frames.def_fwd
def _reversible_frames_fwd(perturbed, diff, frames: _Frames, step_offset):
    system, carry0, dt, args, t0, observables = diff
    final_carry, saved = frames.scan(system, carry0, dt, t0, None, args, step_offset, observables)
    return (final_carry, saved), final_carry


@_reversible_frames.def_bwd
def _reversible_frames_bwd(final_carry, ct_out, perturbed, diff, frames: _Frames, step_offset):
    """Walk back from the final carry: rebuild each earlier carry by a step of -dt, then pull
    the cotangent through the forward step with jax.vjp. Memory: O(1) in the number of steps.

    Step n runs at t = t0 + (step_offset + n) dt and a frame is recorded at its time, so the
    cotangents of dt and t0 include what reaches them through the time (a time-dependent
    force or observable), not only through the step size; the observables' closed-over values
    (closure-converted in `_rollout`) get theirs through the frames."""
    system, carry0, dt, args, t0, observables = diff
    integrator = frames.integrator
    sys_diff, sys_static = eqx.partition(system, eqx.is_inexact_array)
    args_diff, args_static = eqx.partition(args, eqx.is_inexact_array)
    obs_diff, obs_static = eqx.partition(observables, eqx.is_inexact_array)
    ct_final, (ct_states, ct_obs, _) = ct_out
    # Only the carry's floating leaves are differentiated; integer leaves (a neighbour list, a
    # status) are rebuilt by the backward steps and passed through.

    def split(carry):
        return eqx.partition(carry, eqx.is_inexact_array)

    def step_from(sys_d, carry_d, carry_static, dt_, args_d, t0_, n):
        carry = integrator.step(eqx.combine(sys_d, sys_static), frames.time(t0_, dt_, step_offset + n),
                                eqx.combine(carry_d, carry_static), dt_, None, eqx.combine(args_d, args_static))
        return split(carry)[0]

    def record_diff(sys_d, carry_d, carry_static, dt_, t0_, obs_d, n):
        state, obs, _ = frames.record(eqx.combine(sys_d, sys_static), eqx.combine(carry_d, carry_static),
                                      frames.time(t0_, dt_, step_offset + n), eqx.combine(obs_d, obs_static))
        return state, obs

    def back_step(acc, n):
        carry_next, ct_carry, g_sys, g_dt, g_args, g_t0, g_obs = acc
        carry = integrator.step(system, frames.time(t0, dt, step_offset + n + 1), carry_next, -dt, None, args)
        carry_d, carry_static = split(carry)
        _, vjp = jax.vjp(lambda s, c, h, a, t: step_from(s, c, carry_static, h, a, t, n), sys_diff, carry_d, dt,
                         args_diff, t0)
        d_sys, d_carry, d_dt, d_args, d_t0 = vjp(ct_carry)
        return (carry, d_carry, _tree_add(g_sys, d_sys), g_dt + d_dt, _tree_add(g_args, d_args), g_t0 + d_t0,
                g_obs), None

    def back_block(acc, frame):
        carry_end, ct_carry, g_sys, g_dt, g_args, g_t0, g_obs = acc
        last = (frame + 1) * frames.save_every
        ct_frame = (None if ct_states is None else _index(ct_states, frame), _index(ct_obs, frame))
        carry_d, carry_static = split(carry_end)
        out, vjp = jax.vjp(lambda s, c, h, t, o: record_diff(s, c, carry_static, h, t, o, last), sys_diff, carry_d,
                           dt, t0, obs_diff)
        d_sys, d_carry, d_dt, d_t0, d_obs = vjp(_zeros_where_none(ct_frame, out))
        acc = (carry_end, _tree_add(ct_carry, d_carry), _tree_add(g_sys, d_sys), g_dt + d_dt, g_args, g_t0 + d_t0,
               _tree_add(g_obs, d_obs))
        acc, _ = lax.scan(back_step, acc, last - 1 - jnp.arange(frames.save_every))
        return acc, None

    zeros = lambda tree: jtu.tree_map(jnp.zeros_like, tree)  # noqa: E731
    final_d = split(final_carry)[0]
    ct_carry = zeros(final_d) if ct_final is None else _zeros_where_none(ct_final, final_d)
    acc0 = (final_carry, ct_carry, zeros(sys_diff), jnp.zeros_like(dt), zeros(args_diff),
            jnp.zeros_like(t0), zeros(obs_diff))
    acc, _ = lax.scan(back_block, acc0, frames.n_frames - 1 - jnp.arange(frames.n_frames))
    _, ct_carry0, g_sys, g_dt, g_args, g_t0, g_obs = acc
    return g_sys, ct_carry0, g_dt, g_args, g_t0, g_obs


def _tree_add(a, b):
    return jtu.tree_map(lambda x, y: x + y, a, b)


def _index(tree, i):
    return jtu.tree_map(lambda x: None if x is None else x[i], tree, is_leaf=lambda x: x is None)


def _zeros_where_none(ct, like):
    """Cotangents of outputs that were not differentiated arrive as None: use zeros instead
    (outputs that are None themselves, such as states with save_states=False, stay None)."""
    return jtu.tree_map(lambda c, x: None if x is None else jnp.zeros_like(x) if c is None else c, ct, like,
                        is_leaf=lambda x: x is None)


def _check_finite(traj: Trajectory) -> Trajectory:
    all_finite = jnp.all(traj.finite)
    if is_concrete(all_finite):
        if not bool(all_finite):
            if jnp.ndim(traj.finite) == 1:
                frame = traj.first_nonfinite_frame()
                t = float(traj.times[frame])
                raise NonFiniteStateError(
                    f"simulate: the state became non-finite (NaN/Inf) by frame {frame} (t = {t:g}); "
                    f"the last finite frame is {frame - 1}. Reduce `dt` or check the initial state "
                    "and parameters.", frame=frame, time=t)
            members = jnp.argwhere(~jnp.all(traj.finite, axis=-1))
            raise NonFiniteStateError(f"simulate: non-finite state in ensemble members {members.tolist()}.")
        return traj
    times = eqx.error_if(traj.times, ~all_finite,
                         "simulate: the state became non-finite (NaN/Inf); run with check_finite=True "
                         "outside jit to see the first bad frame.")
    return eqx.tree_at(lambda tr: tr.times, traj, times)
