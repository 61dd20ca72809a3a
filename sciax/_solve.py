"""`solve`: the question `simulate` answers, answered by Diffrax: adaptive steps, stiff
(implicit) solvers, arbitrary save times and a choice of adjoint. Same `Trajectory` out."""

from collections.abc import Callable
from typing import Literal

import diffrax as dfx
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from ._adjoint import forward_only
from ._compile.callable_key import by_code
from ._trajectory import Trajectory
from ._validation import (
    check_derivative,
    check_finite_state,
    check_precision,
    check_time_scalar,
    describe,
    is_concrete,
    positive_finite_scalar,
    positive_int,
    state_dtype,
)
from .systems._base import AbstractODE, AbstractSDE

SOLVERS: dict[str, type[dfx.AbstractSolver]] = {
    # Explicit Runge–Kutta (non-stiff problems).
    "tsit5": dfx.Tsit5,
    "dopri5": dfx.Dopri5,
    "dopri8": dfx.Dopri8,
    "bosh3": dfx.Bosh3,
    "ralston": dfx.Ralston,
    "midpoint": dfx.Midpoint,
    "heun": dfx.Heun,
    "euler": dfx.Euler,  # no error estimate: constant steps only (rtol=None, dt0=...)
    # Implicit (stiff problems).
    "implicit_euler": dfx.ImplicitEuler,
    "kvaerno3": dfx.Kvaerno3,
    "kvaerno4": dfx.Kvaerno4,
    "kvaerno5": dfx.Kvaerno5,
}
# IMEX solvers (KenCarp3/4/5, Sil3) are not listed: they need the vector field split into a
# non-stiff and a stiff part, which an `AbstractODE` does not provide.

ADJOINTS: dict[str, type[dfx.AbstractAdjoint]] = {
    "recursive_checkpoint": dfx.RecursiveCheckpointAdjoint,
    "backsolve": dfx.BacksolveAdjoint,
    "direct": dfx.DirectAdjoint,
    "forward": dfx.ForwardMode,
}
# `dfx.ImplicitAdjoint` is not listed: it differentiates a steady state, not a trajectory.


SolverName = Literal["tsit5", "dopri5", "dopri8", "bosh3", "ralston", "midpoint", "heun", "euler", "implicit_euler",
                     "kvaerno3", "kvaerno4", "kvaerno5"]
AdjointName = Literal["recursive_checkpoint", "backsolve", "direct", "forward"]
DEFAULT_RTOL, DEFAULT_ATOL = 1e-8, 1e-10  # the adaptive defaults everywhere (`solve`, `Solve`)


def solve(
    system,
    state0,
    *,
    t0,
    t1,
    save_at=None,
    solver: SolverName | dfx.AbstractSolver = "tsit5",
    rtol=DEFAULT_RTOL,
    atol=DEFAULT_ATOL,
    dt0=None,
    max_steps: int = 100_000,
    adjoint: AdjointName | dfx.AbstractAdjoint = "recursive_checkpoint",
    args=None,
    observables: dict[str, Callable] | None = None,
    throw: bool = True,
) -> Trajectory:
    """Integrate the ODE `system` from `state0` at `t0` to `t1` with Diffrax and save at `save_at`.

    Steps are adaptive (a PID controller on `rtol`/`atol`) unless `rtol=None`, in which case
    they are constant: n = ceil((t1 - t0) / dt0) equal steps of (t1 - t0) / n (that is,
    `dt0` when it divides `t1 - t0`). Times are cast to the state's dtype, so float32 and
    float64 runs keep their precision. Pure: works under `jax.jit`, `jax.vmap` (over `state0` and
    the system's parameters) and `jax.grad`.

    **Arguments:**

    - `system`: an `AbstractODE` (including Hamiltonian particle systems; not an SDE).
    - `state0`: initial state: an array for ODEs, a `PhaseSpace` for particle systems (any pytree
      the system's `vector_field` accepts), float32 or float64. The system's float
      parameters may not be wider than the state (`sciax.astype(system, jnp.float32)`).
    - `t0`, `t1`: initial and final time (time units), `t1 > t0`.
    - `save_at`: 1-D array of strictly increasing times in `[t0, t1]` at which to save the
      state. Default: `t1` only (one frame, the final state). Include `t0` to save `state0` too.
    - `solver`: a `diffrax` solver instance or a name: explicit `"tsit5"`, `"dopri5"`,
      `"dopri8"`, `"bosh3"`, `"ralston"`, `"midpoint"`, `"heun"`, `"euler"` (constant steps
      only); implicit, for stiff problems, `"implicit_euler"`, `"kvaerno3"`, `"kvaerno4"`,
      `"kvaerno5"`.
    - `rtol`, `atol`: relative and absolute tolerances of the adaptive step (positive; default
      1e-8 and 1e-10, as `sciax.Solve`). With
      `rtol=None` steps are constant (`dt0` required) and `atol` is ignored: n =
      ceil((t1 − t0)/dt0) equal steps, so a derivative with respect to `t0`, `t1` or `dt0` is
      that of the discretisation with n held fixed, and the solution jumps where n changes
      (finite differences across such a point disagree with it).
    - `dt0`: initial step size (time units). `None` lets Diffrax choose it (adaptive only).
    - `max_steps`: the most steps the solver may take before it fails. With constant steps
      the count is known, so too small a value raises at once (unless `t0`, `t1` or `dt0`
      are traced: then the checkpointed adjoint stores every step, `max_steps` copies of
      the solver state; see `_constant_steps`).
    - `adjoint`: how reverse-mode gradients are computed: `"recursive_checkpoint"`
      (backpropagate through the solver, checkpointed; exact for the discretisation),
      `"backsolve"` (solve the continuous adjoint ODE backwards; memory O(1), gradients
      accurate to the tolerances; adaptive steps only; not with respect to `t0`, `t1`,
      `save_at` or `dt0`, which Diffrax's backsolve does not support: that raises an error
      naming them), `"direct"` (plain autodiff, also allows forward mode), `"forward"` (forward
      mode only: `jax.jvp`, `jax.jacfwd`, `jax.linearize`; a reverse-mode derivative such as
      `jax.grad` raises an error saying so), or a `diffrax` adjoint.
    - `args`: passed to `vector_field(t, y, args)`.
    - `observables`: dict name -> `fn(t, state, system)` evaluated at every saved frame.
    - `throw`: raise if the solve fails (e.g. `max_steps` reached). With `throw=False` the
      failure is reported in `stats` and the frames not reached are non-finite (`inf`),
      so `Trajectory.finite` is False for them.

    **Returns:** a `Trajectory` with `times = save_at` (in the state's dtype), `states` with a
    leading frame axis, `observables`, `finite` per frame, and `stats`: `num_steps`,
    `num_accepted_steps`, `num_rejected_steps` (Diffrax's counts), `result` (the
    `diffrax.RESULTS` code; `diffrax.RESULTS[result]` is its message) and `success` (bool).

    **Raises:** `StateMismatchError` (state does not fit the system), `TypeError` (system
    parameters wider than the state, or an argument of the wrong type), `ValueError`
    for bad arguments (naming the argument, what was expected and what was received), and
    Diffrax's runtime error when the solve fails and `throw=True`: `MaxStepsError` when it
    reaches `max_steps` outside `jax.jit`, saying that an explicit solver's problem may be
    stiff and naming the implicit solvers.

    ```python
    traj = sciax.solve(sciax.systems.VanDerPol(mu=1000.0), jnp.array([2.0, 0.0]),
                       t0=0.0, t1=3000.0, save_at=jnp.linspace(0.0, 3000.0, 31),
                       solver="kvaerno5", rtol=1e-8, atol=1e-10)
    ```
    """
    dtype = _validate(system, state0, t0, t1, save_at, rtol, atol, dt0, observables, throw)
    check_precision(args, dtype, "solve", what="`args`")
    max_steps = positive_int("max_steps", max_steps, "solve")
    solver = _make_solver(solver, rtol)
    adjoint = _make_adjoint(adjoint, rtol)
    if rtol is None:  # before `jnp.asarray`, which gives tracers under `jax.jit`
        controller, dt0, adjoint = _constant_steps(max_steps, t0, t1, dt0, dtype, adjoint)
    else:
        controller = dfx.PIDController(rtol=rtol, atol=atol)
        dt0 = None if dt0 is None else jnp.asarray(dt0, dtype=dtype)
    t0 = jnp.asarray(t0, dtype=dtype)
    t1 = jnp.asarray(t1, dtype=dtype)
    save_at = _save_times(save_at, t0, t1, dtype)
    observables = {name: by_code(fn) for name, fn in (observables or {}).items()}  # a new lambda: no recompile
    try:
        return _solve(system, state0, t0, t1, save_at, solver, controller, dt0, max_steps, adjoint,
                  args, observables, throw)
    except eqx.EquinoxRuntimeError as e:  # throw=True and an eager call: Diffrax's step limit
        if _MAX_STEPS_MESSAGE not in str(e):
            raise
        raise MaxStepsError(_max_steps_advice(solver, max_steps)) from None


class MaxStepsError(eqx.EquinoxRuntimeError):
    """`solve` reached `max_steps` before `t1` (with `throw=True`, called outside `jax.jit`). The
    message says what to try: a larger `max_steps` or looser tolerances, and, for an explicit
    solver, an implicit one, since a stiff problem makes explicit steps tiny."""


_MAX_STEPS_MESSAGE = "The maximum number of solver steps was reached"
_STIFF_SOLVERS = ("kvaerno5", "kvaerno4", "kvaerno3", "implicit_euler")


def _max_steps_advice(solver, max_steps) -> str:
    name = type(solver).__name__
    text = f"solve: {name} reached the maximum number of solver steps, max_steps = {max_steps}, before `t1`."
    if isinstance(solver, dfx.AbstractImplicitSolver):
        return text + " Raise `max_steps`, or loosen `rtol`/`atol`."
    return (text + f" The problem may be stiff (fast and slow time scales, e.g. VanDerPol with a large mu): {name} "
            "is an explicit method, whose stable steps a stiff problem makes tiny. Use an implicit solver: "
            f"solver={_STIFF_SOLVERS[0]!r} (or {', '.join(repr(n) for n in _STIFF_SOLVERS[1:])}). If it is not "
            "stiff, raise `max_steps` or loosen `rtol`/`atol`.")


def _validate(system, state0, t0, t1, save_at, rtol, atol, dt0, observables, throw):
    if not isinstance(system, AbstractODE) or isinstance(system, AbstractSDE):
        raise TypeError(
            "solve: `system` must be a sciax ODE system (AbstractODE, not an SDE: use "
            f"simulate with a stochastic integrator for those), got {type(system).__name__}."
        )
    type(system).check_state(system, state0)  # not a bound method: see simulate's _validate
    dtype = state_dtype(state0)
    if jnp.finfo(dtype).bits < 32:  # Diffrax's step-size control does not work in 3-4 digits
        raise TypeError(
            f"solve: the state is {jnp.dtype(dtype).name}; solve's adaptive steps need float32 or float64 (in "
            "half precision the error estimates are rounding noise, and the solve fails). Convert the system "
            "and state with sciax.astype(..., jnp.float32), or use `simulate`, whose fixed steps run in "
            "half precision.")
    check_finite_state("solve", "state0", state0)
    check_precision(system, dtype, "solve")
    for name, value in (("t0", t0), ("t1", t1)):
        check_time_scalar("solve", name, value, dtype)
    if is_concrete(t0) and is_concrete(t1):
        first, last = (np.asarray(t).astype(dtype) for t in (t0, t1))
        if not last > first:
            rounded = "" if (float(first), float(last)) == (float(t0), float(t1)) else \
                f" (in the state's {jnp.dtype(dtype).name}: t0={float(first)}, t1={float(last)})"
            raise ValueError(
                f"solve: `t1` must be greater than `t0`, got t0={float(t0)} and t1={float(t1)}{rounded}."
            )
    if save_at is not None and jnp.ndim(save_at) != 1:
        raise ValueError(
            f"solve: `save_at` must be a 1-D array of times, got {describe(save_at)}."
        )
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and not (name == "atol" and rtol is None):
            positive_finite_scalar(name, value)
    if rtol is not None and atol is None:
        raise ValueError("solve: adaptive steps need both `rtol` and `atol`; got atol=None.")
    if dt0 is not None:
        check_time_scalar("solve", "dt0", dt0, dtype, positive=True)
    elif rtol is None:
        raise ValueError(
            "solve: `rtol=None` asks for constant steps, which need a step size: pass `dt0`."
        )
    if observables is not None and not (
        isinstance(observables, dict)
        and all(isinstance(k, str) and callable(f) for k, f in observables.items())
    ):
        raise TypeError("solve: `observables` must be a dict mapping names to fn(t, state, system).")
    if not isinstance(throw, bool):
        raise TypeError(f"solve: `throw` must be True or False, got {describe(throw)}.")
    return dtype


def _save_times(save_at, t0, t1, dtype):
    """The save times as a 1-D array of the state's dtype, checked against [t0, t1]."""
    if save_at is None:
        return t1[None]
    ts = jnp.asarray(save_at, dtype=dtype)
    if ts.size == 0:
        raise ValueError("solve: `save_at` must hold at least one time, got an empty array.")
    if is_concrete(ts):
        host = np.asarray(ts)
        if not np.all(np.isfinite(host)):
            raise ValueError(f"solve: `save_at` must be finite, got {host}.")
        if np.any(np.diff(host) <= 0):
            k = int(np.flatnonzero(np.diff(host) <= 0)[0])
            raise ValueError(
                "solve: `save_at` must be strictly increasing, got "
                f"save_at[{k}]={host[k]} followed by save_at[{k + 1}]={host[k + 1]}."
            )
        if is_concrete(t0) and is_concrete(t1) and (host[0] < float(t0) or host[-1] > float(t1)):
            raise ValueError(
                f"solve: `save_at` must lie within [t0, t1] = [{float(t0)}, {float(t1)}], "
                f"got times from {host[0]} to {host[-1]}."
            )
    return ts


def _make_solver(solver, rtol) -> dfx.AbstractSolver:
    if isinstance(solver, str):
        if solver not in SOLVERS:
            raise ValueError(
                f"solve: unknown `solver` {solver!r}; expected a diffrax solver or one of "
                f"{', '.join(sorted(SOLVERS))}."
            )
        solver = SOLVERS[solver]()
    if not isinstance(solver, dfx.AbstractSolver):
        raise TypeError(
            f"solve: `solver` must be a name or a diffrax solver instance, got {describe(solver)}."
        )
    if rtol is not None and not isinstance(solver, dfx.AbstractAdaptiveSolver):
        raise ValueError(
            f"solve: {type(solver).__name__} has no error estimate, so it cannot take adaptive "
            "steps; pass `rtol=None` and a step `dt0`, or choose an adaptive solver."
        )
    return solver


def _make_adjoint(adjoint, rtol) -> dfx.AbstractAdjoint:
    if isinstance(adjoint, str):
        if adjoint not in ADJOINTS:
            raise ValueError(
                f"solve: unknown `adjoint` {adjoint!r}; expected a diffrax adjoint or one of "
                f"{', '.join(ADJOINTS)}."
            )
        adjoint = ADJOINTS[adjoint]()
    if not isinstance(adjoint, dfx.AbstractAdjoint):
        raise TypeError(
            f"solve: `adjoint` must be a name or a diffrax adjoint instance, got {describe(adjoint)}."
        )
    if rtol is None and isinstance(adjoint, dfx.BacksolveAdjoint):
        # Diffrax 0.7.2 then solves the adjoint ODE backwards with the same constant step and
        # no error control. Measured on Lorenz (t1=0.5, dt0=0.01, save_at = every step, the
        # spacing equal to dt0 up to rounding): gradient -996 or 1171 instead of 3685, with no
        # error raised; NaN in other such cases.
        raise ValueError(
            "solve: adjoint='backsolve' needs adaptive steps (`rtol` and `atol`); with "
            "constant steps (rtol=None) use adjoint='recursive_checkpoint', which gives the "
            "exact gradient of the fixed-step solve."
        )
    return adjoint


def _constant_steps(max_steps, t0, t1, dt0, dtype, adjoint):
    """(controller, dt0, adjoint) to hand Diffrax for a constant-step solve.

    Measured (diffrax 0.7.2, equinox 0.13.8, jax 0.10.2, CPU): `ConstantStepSize` with
    `SaveAt(ts=...)` and `RecursiveCheckpointAdjoint` gives silently wrong gradients when the
    times are constants to XLA (e.g. `jax.jit(jax.grad(loss))` with Python floats for
    `t0`/`t1`/`dt0`) and save times fall on step ends. Lorenz, 1,000 steps of 0.01 saved
    every 10 steps, float64: wrong by 32-177% with max_steps = n, n+5, n+64, 2n, 2n+2
    (checkpoints 44, 45, 62), right with 1100, 2048, 4096 (46, 63, 90) and with checkpoints
    >= n; through the previous `solve` under jit, 1.8% (100 steps, tsit5). Cause:
    `ConstantStepSize` computes step ends as `t0 + (t1 - t0) * (k / n)` and XLA rounded it
    differently in the forward loop and in the backward recomputation (step end 5.7:
    5.7000000000000002 forward, 5.6999999999999993 recomputed), so a save time on a step end
    is saved in different steps by the two; where the backward pass joins a stored checkpoint
    to a recomputed state, that frame's cotangent is dropped (x0) or counted twice (x2).
    Which states are recomputed depends on `checkpoints` (by default ~sqrt(2 max_steps)),
    hence on `max_steps`. Save times half a step off the step ends, or a grid of exact binary
    fractions, were right; adaptive (PID) steps were right for every `max_steps` tried.

    So the step ends are computed here, on the host, and handed over as `StepTo(ts=...)`:
    they are read, never recomputed, and the two passes agree (measured right, 2e-14, with
    checkpoints = 2, 14, 44, 45, 46, 62, 63, 90, 500, 1000 at max_steps = n and 4n; and
    vmapped over 4 members at max_steps = n, 2n+2, 4096, 100000). When the times are traced
    there are no host values: `ConstantStepSize` is kept and a `RecursiveCheckpointAdjoint`
    without `checkpoints` stores every step (`checkpoints=max_steps`), so nothing is
    recomputed (t1 traced inside but constant to XLA: 177% wrong with checkpoints=44, right
    this way). An explicit `checkpoints` is left as given.
    """
    if not (is_concrete(t0) and is_concrete(t1) and is_concrete(dt0)):
        if isinstance(adjoint, dfx.RecursiveCheckpointAdjoint) and adjoint.checkpoints is None:
            adjoint = dfx.RecursiveCheckpointAdjoint(checkpoints=max_steps)
        # The same n equal steps as with concrete times: steps of (t1 - t0) / n, n traced.
        t0, t1, dt0 = (jnp.asarray(t, dtype=dtype) for t in (t0, t1, dt0))
        span = eqx.error_if(t1 - t0, t1 < t0, "solve: `t1` must not be before `t0`.")
        n = _n_constant_steps(span, jax.lax.stop_gradient(dt0), dtype, jnp)
        return dfx.ConstantStepSize(), span / n, adjoint
    t0, t1, dt0 = (np.asarray(t, dtype=dtype) for t in (t0, t1, dt0))
    start, span, step = float(t0), float(t1) - float(t0), float(dt0)
    n_steps = int(_n_constant_steps(span, step, dtype, np))
    if max_steps < n_steps:
        raise ValueError(
            f"solve: `max_steps` ({max_steps}) is below the {n_steps} constant steps of "
            f"dt0={step:g} from t0={start:g} to t1={float(t1):g}; raise `max_steps` or `dt0`."
        )
    ends = (start + span * (np.arange(n_steps + 1) / n_steps)).astype(dtype)
    ends[0], ends[-1] = t0, t1  # exactly, as StepTo requires
    return dfx.StepTo(ts=ends), None, adjoint


def _n_constant_steps(span, step, dtype, xp):
    """n = ceil((t1 - t0) / dt0), at least 1, with slack for the rounding of times cast to
    `dtype` (float32: 0.6 / 0.1 is 6.0000001 and must give 6 steps, not 7)."""
    ratio = span / step
    slack = 1e-9 + 8 * float(np.finfo(dtype).eps) * ratio
    return xp.maximum(1, xp.ceil(ratio - slack))


def _vector_field(t, y, system_and_args):
    # The system travels in Diffrax's `args`, so every adjoint (backsolve included) sees its
    # parameters as differentiable inputs rather than closed-over constants.
    system, args = system_and_args
    return system.vector_field(t, y, args)


def _refuse_unsupported_derivatives(adjoint, t0, t1, save_at, dt0):
    """The solve's times, marked so that a derivative the adjoint cannot take raises an error
    naming `adjoint` and the input while JAX traces it, instead of Diffrax's "Unexpected
    tangent". Identity otherwise. (`jax.grad` with adjoint='forward' is caught on the outputs
    instead, by `forward_only`: a marker on the inputs would refuse `jax.jvp` too.)"""
    if isinstance(adjoint, dfx.BacksolveAdjoint):
        t0, t1, save_at, dt0 = (None if x is None else eqx.internal.nondifferentiable(x, msg=(
            f"solve: the backsolve adjoint cannot differentiate with respect to `{name}` (Diffrax's "
            "BacksolveAdjoint does not support it); use adjoint='recursive_checkpoint'."))
            for name, x in (("t0", t0), ("t1", t1), ("save_at", save_at), ("dt0", dt0)))
    return t0, t1, save_at, dt0


_FORWARD_ONLY = (
    "solve: adjoint='forward' computes forward-mode derivatives only (jax.jvp, jax.jacfwd, "
    "jax.linearize); for jax.grad, jax.vjp or jax.jacrev use adjoint='recursive_checkpoint' (the "
    "default), 'backsolve' or 'direct'."
)


def _frame_is_finite(states, n_frames):
    leaves = [jnp.reshape(jnp.isfinite(x), (n_frames, -1)) for x in jtu.tree_leaves(states)]
    return jnp.all(jnp.concatenate(leaves, axis=1), axis=1)


@eqx.filter_jit
def _solve(system, state0, t0, t1, save_at, solver, controller, dt0, max_steps, adjoint, args,
           observables, throw) -> Trajectory:
    check_derivative("solve", system, "vector_field", t0, state0, args)  # while tracing: once per compilation
    t0_, t1_, save_at_, dt0_ = _refuse_unsupported_derivatives(adjoint, t0, t1, save_at, dt0)
    solution = dfx.diffeqsolve(
        dfx.ODETerm(_vector_field), solver, t0_, t1_, dt0_, state0, args=(system, args),
        saveat=dfx.SaveAt(ts=save_at_), stepsize_controller=controller, adjoint=adjoint,
        max_steps=max_steps, throw=throw,
    )
    states = solution.ys
    if isinstance(adjoint, dfx.ForwardMode):
        states = forward_only(states, _FORWARD_ONLY)
    obs = {name: jax.vmap(lambda t, y, fn=fn: fn(t, y, system))(save_at, states)
           for name, fn in observables.items()}
    stats = {
        "num_steps": solution.stats["num_steps"],
        "num_accepted_steps": solution.stats["num_accepted_steps"],
        "num_rejected_steps": solution.stats["num_rejected_steps"],
        "result": solution.result,
        "success": solution.result == dfx.RESULTS.successful,
    }
    return Trajectory(times=save_at, states=states, observables=obs,
                      finite=_frame_is_finite(states, save_at.shape[0]), stats=stats)
