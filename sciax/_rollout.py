"""How to integrate, as one object: `Simulate` (fixed step, `lax.scan`) or `Solve` (Diffrax,
adaptive or stiff), used the same way by `sweep` (`rollout=`), `fit` (`rollout=`) and the runner.

A rollout holds the method, the step or tolerances, the run length and the save schedule, so
`rollout(system, state0, key=key)` is one trajectory. `fit` asks a rollout a different
question for each shooting segment (the states at the observation times from a start state at
a start time), so there the run length and save schedule come from the data and are left unset.

The defaults are the same wherever an option appears: `adjoint=CheckpointAdjoint()` for fixed
steps; `rtol=1e-8`, `atol=1e-10` for adaptive steps (`sciax.solve` too).
"""

import math
import numbers

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._adjoint import AbstractAdjoint, CheckpointAdjoint, ReversibleAdjoint
from ._compile.callable_key import by_code
from ._compile.host_checked import checked_on_host
from ._simulate import simulate
from ._solve import DEFAULT_ATOL, DEFAULT_RTOL, _vector_field, solve
from ._validation import describe, positive_int, real_scalar, to_device
from .integrators._base import AbstractIntegrator


class AbstractRollout(eqx.Module):
    """Base class of `Simulate` and `Solve`: how to integrate (see the module docstring).

    `__call__(system, state0, *, key=None, args=None) -> Trajectory` runs one trajectory;
    the other methods serve `fit`."""

    def __call__(self, system, state0, *, key=None, args=None):
        raise NotImplementedError

    def check_complete(self, where: str) -> None:
        """Raise unless the run length and save schedule are set (for `sweep` and plain runs)."""

    def check_for_fit(self) -> None:
        """Raise if the run length or save schedule is set: `fit` takes them from the data."""

    def check_times(self, t0: float, times: np.ndarray, eps: float) -> None:
        """Host-side check that `times` (float64, increasing, ≥ t0) can be saved; `eps` is the
        machine epsilon of the dtype the user gave them in (their resolution)."""

    def plan(self, starts: np.ndarray, save_times: list[np.ndarray], dtype):
        """A batched plan: segment `j` starts at `starts[j]` and saves at `save_times[j]`."""
        raise NotImplementedError

    def run_plan(self, system, state0, plan, args):
        """States at the plan's save times (pytree with a leading save axis); one segment."""
        raise NotImplementedError

    def dense(self, t0: float, t1: float, n_points: int, dtype):
        """A one-segment plan and its save times for drawing a smooth curve over [t0, t1]."""
        raise NotImplementedError

    def check_jacobian(self, mode: str) -> None:
        """Raise if this rollout cannot be differentiated in `mode` ("fwd" or "bwd")."""

    def for_jacobian(self, mode: str) -> "AbstractRollout":
        """This rollout, with any automatic choice made for Jacobians in `mode`."""
        return self


class _SimulatePlan(eqx.Module):
    t0: jax.Array  # (n_segments,) or scalar inside vmap
    positions: jax.Array  # (n_segments, n_save) frame indices
    n_steps: int = eqx.field(static=True)
    save_every: int = eqx.field(static=True)
    t_stop: jax.Array | None = None  # (n_segments,): time of each segment's last save, if they differ


class _UntilTime(AbstractIntegrator):
    """`inner`, stepping only while a step starts before `t_stop` (with half a step of slack);
    later steps keep the carry. Multiple-shooting segments share one scan as long as the
    longest segment: a shorter one must not integrate past its last save, which is wasted work
    and, for a model that diverges there, turns unused frames into inf and reverse-mode
    cotangents into NaN (0 · inf). Stepping back with -dt holds the same steps, so the
    reversible adjoint reconstructs the carries exactly as before."""

    inner: AbstractIntegrator
    t_stop: jax.Array

    @property
    def order(self):
        return self.inner.order

    @property
    def stochastic(self):
        return self.inner.stochastic

    @property
    def reversible(self):
        return self.inner.reversible

    def init(self, system, t0, state, args):
        return self.inner.init(system, t0, state, args)

    def step(self, system, t, carry, dt, key, args):
        new = self.inner.step(system, t, carry, dt, key, args)
        go = t < self.t_stop - 0.5 * dt
        return jax.tree_util.tree_map(lambda a, b: jnp.where(go, a, b), new, carry)

    def state(self, carry):
        return self.inner.state(carry)

    def check_system(self, system) -> None:
        self.inner.check_system(system)


def _observables(observables, owner):
    if observables is None:
        return None
    if not isinstance(observables, dict) or not all(isinstance(k, str) and callable(f)
                                                    for k, f in observables.items()):
        raise TypeError(f"{owner}: `observables` must be a dict mapping names to functions fn(t, state, system), "
                        f"got {observables!r}.")
    return {name: by_code(fn) for name, fn in observables.items()}  # equal code: the same compiled program


class Simulate(AbstractRollout):
    """Integrate with `sciax.simulate` (fixed step, `lax.scan`).

    **Arguments:**

    - `integrator`: a `sciax.integrators` method, e.g. `RK4()`, `VelocityVerlet()`.
    - `dt`: the step (time units), a positive float (a compile-time constant).
    - `n_steps`, `save_every`, `t0`: the run length, the steps between saved frames and the
      initial time, as in `sciax.simulate` (`n_steps` is required for `sweep` and plain runs
      and must be left unset for `fit`, which takes the times from the data).
    - `observables`, `save_states`, `check_finite`: what each frame keeps, as in `simulate`.
    - `adjoint`: how reverse mode differentiates the rollout: `CheckpointAdjoint()` (default),
      `DirectAdjoint()`, or `ReversibleAdjoint()` for symplectic integrators (reverse mode
      only).

    `Simulate(...)(system, state0, key=key)` is `simulate(system, state0, ...)` with these
    settings.

    **In `fit`:** observation times must lie on the step grid `t0 + k·dt` (to within 1e-6·dt plus the
    rounding of the times' own dtype, so float32 times from a float32 run pass); a time off
    the grid is an error that names it and the nearest grid time. Nothing is interpolated:
    the model is compared with data exactly where the integrator put a step. Steps between
    observations are saved with the largest common `save_every`, so memory grows with the
    number of observations (times their spacing pattern), not with the number of steps.

    Noise-free synthetic data generated with the same integrator and `dt` are reproduced
    exactly; data from the real world carry the integrator's discretisation error, so pick
    `dt` small enough that it is below the noise.

    **Arguments:**

    The integrator must be deterministic in `fit`.
    """

    integrator: AbstractIntegrator
    dt: float = eqx.field(static=True)
    n_steps: int | None = eqx.field(static=True)
    save_every: int = eqx.field(static=True)
    t0: float | None = eqx.field(static=True)
    observables: dict | None = eqx.field(static=True)
    save_states: bool = eqx.field(static=True)
    check_finite: bool = eqx.field(static=True)
    adjoint: AbstractAdjoint

    def __init__(self, integrator, dt, *, n_steps=None, save_every=1, t0=None, observables=None, save_states=True,
                 check_finite=False, adjoint=None):
        adjoint = CheckpointAdjoint() if adjoint is None else adjoint
        if not isinstance(integrator, AbstractIntegrator):
            raise TypeError(
                f"Simulate: `integrator` must be a sciax.integrators method such as RK4(), got "
                f"{describe(integrator)}."
            )
        if not isinstance(adjoint, AbstractAdjoint):
            raise TypeError(f"Simulate: `adjoint` must be a sciax adjoint such as CheckpointAdjoint(), got "
                            f"{adjoint!r}.")
        dt = real_scalar("dt", dt, owner="Simulate")
        if not (math.isfinite(dt) and dt > 0):
            raise ValueError(f"Simulate: `dt` must be positive and finite, got {dt!r}.")
        self.integrator = integrator
        self.dt = dt
        self.n_steps = None if n_steps is None else positive_int("n_steps", n_steps, "Simulate")
        self.save_every = positive_int("save_every", save_every, "Simulate")
        self.t0 = None if t0 is None else real_scalar("t0", t0, owner="Simulate")
        self.observables = _observables(observables, "Simulate")
        self.save_states = bool(save_states)
        self.check_finite = bool(check_finite)
        self.adjoint = adjoint

    def __call__(self, system, state0=None, *, key=None, args=None, carry0=None, step_offset=0):
        """`sciax.simulate` with these settings (`carry0`, `step_offset`: continue a run)."""
        self.check_complete("Simulate")
        return simulate(system, state0, integrator=self.integrator, dt=self.dt, n_steps=self.n_steps,
                        save_every=self.save_every, t0=0.0 if self.t0 is None else self.t0, key=key, args=args,
                        observables=self.observables, save_states=self.save_states, adjoint=self.adjoint,
                        check_finite=self.check_finite, step_offset=step_offset, carry0=carry0)

    @property
    def stochastic(self) -> bool:
        return self.integrator.stochastic

    def check_complete(self, where):
        if self.n_steps is None:
            raise ValueError(f"{where}: Simulate needs the run length: pass n_steps=... (and save_every=...).")

    def check_for_fit(self):
        if self.integrator.stochastic:
            raise ValueError(
                f"Simulate: `fit` needs a deterministic integrator, got the stochastic "
                f"{type(self.integrator).__name__}; fit the drift with e.g. RK4()."
            )
        given = [n for n in ("n_steps", "t0", "observables") if getattr(self, n) is not None] + \
            (["save_every"] if self.save_every != 1 else []) + (["save_states"] if not self.save_states else []) + \
            (["check_finite"] if self.check_finite else [])
        if given:
            raise ValueError(f"fit: the rollout's {', '.join(given)} must be left unset: fit takes the start time "
                             "(`t0=`) and the save times from the data.")

    def check_times(self, t0, times, eps):
        k = np.rint((times - t0) / self.dt)
        resolution = 8 * max(eps, float(np.finfo(np.float64).eps)) * (np.abs(times) + abs(t0))
        off = np.abs(times - (t0 + k * self.dt)) > 1e-6 * self.dt + resolution
        if np.any(off):
            i = int(np.flatnonzero(off)[0])
            raise ValueError(
                f"fit: with rollout=Simulate(dt={self.dt:g}) every observation time must lie on the "
                f"step grid t0 + k·dt (t0 = {t0:g}); times[{i}] = {float(times[i]):.10g} does not (nearest grid "
                f"time {float(t0 + k[i] * self.dt):.10g}). Choose times on the grid, change dt, or use "
                "rollout=Solve(...), which saves at arbitrary times."
            )

    def check_jacobian(self, mode):
        if mode == "fwd" and isinstance(self.adjoint, ReversibleAdjoint):
            raise ValueError(
                "fit: ReversibleAdjoint supports reverse mode only; pass jacobian=\"reverse\" or "
                "use CheckpointAdjoint()."
            )

    def _steps(self, t0, t):
        return np.rint((np.asarray(t, np.float64) - t0) / self.dt).astype(np.int64)

    def plan(self, starts, save_times, dtype):
        global_t0 = float(starts[0])
        start_steps = self._steps(global_t0, starts)
        offsets = [self._steps(global_t0, ts) - s for ts, s in zip(save_times, start_steps)]
        positive = np.concatenate([o[o > 0] for o in offsets] + [np.zeros(0, np.int64)])
        save_every = int(np.gcd.reduce(positive)) if positive.size else 1
        n_steps = max(int(max(int(o.max()) for o in offsets)), save_every)
        n_save = max(len(o) for o in offsets)
        positions = np.stack([np.pad(o // save_every, (0, n_save - len(o)), mode="edge") for o in offsets])
        seg_t0 = global_t0 + start_steps * self.dt
        last = np.array([int(o.max()) for o in offsets])
        return _SimulatePlan(
            t0=to_device(seg_t0, dtype),
            positions=to_device(positions, np.int32),
            n_steps=n_steps,
            save_every=save_every,
            t_stop=None if np.all(last == last[0]) else to_device(seg_t0 + last * self.dt, dtype),
        )

    def run_plan(self, system, state0, plan, args):
        integrator = self.integrator if plan.t_stop is None else _UntilTime(self.integrator, plan.t_stop)
        traj = simulate(
            system, state0, integrator=integrator, dt=self.dt, n_steps=plan.n_steps,
            save_every=plan.save_every, t0=plan.t0, args=args, adjoint=self.adjoint,
        )
        return jax.tree_util.tree_map(lambda x: x[plan.positions], traj.states)

    def dense(self, t0, t1, n_points, dtype):
        k1 = max(int(np.ceil((t1 - t0) / self.dt - 1e-9)), 1)
        save_every = max(1, int(np.ceil(k1 / max(n_points - 1, 1))))
        n_frames = -(-k1 // save_every)
        times = t0 + np.arange(n_frames + 1) * save_every * self.dt
        plan = _SimulatePlan(
            t0=jnp.asarray(t0, dtype=dtype),
            positions=jnp.arange(n_frames + 1, dtype=jnp.int32),
            n_steps=n_frames * save_every,
            save_every=save_every,
        )
        return plan, times


class _SolvePlan(eqx.Module):
    t0: jax.Array  # (n_segments,)
    t1: jax.Array  # (n_segments,)
    ts: jax.Array  # (n_segments, n_save); short segments repeat their last time


def _real_as_float(value):
    """A real number (e.g. np.float32(1e-6)) as a Python float, for a static field; anything
    else as given, for `__check_init__` to refuse."""
    return float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else value


class Solve(AbstractRollout):
    """Integrate with `sciax.solve` (Diffrax; adaptive steps, stiff solvers, any save times).

    **Arguments:**

    - `solver`: a name known to `sciax.solve` (`"tsit5"` default, `"dopri8"`, `"kvaerno5"` for
      stiff problems, …) or a Diffrax solver.
    - `t0`, `t1`, `save_at`: the time span and save times, as in `sciax.solve` (required for
      `sweep` and plain runs; left unset for `fit`, which takes them from the data).
    - `rtol`, `atol`: step-size controller tolerances (default 1e-8, 1e-10, as `sciax.solve`).
      In a fit keep them well below the noise so that the fit sees a smooth model;
      `rtol=None` with `dt0` gives constant steps.
    - `dt0`: initial (or constant) step; `None` lets Diffrax choose.
    - `max_steps`: Diffrax's step limit (default 100,000). In a fit, a solve that fails
      returns non-finite states, so the optimiser rejects that step.
    - `adjoint`: `None` (default) is `"recursive_checkpoint"`, except in a fit with
      forward-mode Jacobians, where it is Diffrax's `ForwardMode`; or a name/instance that
      `sciax.solve` accepts.
    - `observables`: as in `sciax.solve`.

    `Solve(...)(system, state0)` is `solve(system, state0, ...)` with these settings.

    **In `fit`:** the model is saved exactly at the observation times (`SaveAt(ts=times)`); no
    grid. Noise-free synthetic data generated by `sciax.solve` with the same solver and
    tolerances are reproduced exactly (save times do not change Diffrax's steps). The fit's
    program is kept by the persistent compilation cache (`sciax.enable_compilation_cache`),
    except with an implicit solver, whose linear solves are checked by host callbacks.
    """

    solver: object = "tsit5"
    t0: float | None = eqx.field(static=True, default=None, converter=_real_as_float)
    t1: float | None = eqx.field(static=True, default=None, converter=_real_as_float)
    save_at: object = None
    rtol: float | None = eqx.field(static=True, default=DEFAULT_RTOL, converter=_real_as_float)
    atol: float | None = eqx.field(static=True, default=DEFAULT_ATOL, converter=_real_as_float)
    dt0: float | None = eqx.field(static=True, default=None, converter=_real_as_float)
    max_steps: int = eqx.field(static=True, default=100_000)
    adjoint: object = None
    observables: dict | None = eqx.field(static=True, default=None, converter=lambda o: _observables(o, "Solve"))

    def __call__(self, system, state0, *, key=None, args=None, throw=True):
        """`sciax.solve` with these settings (`key` is unused: solves are deterministic)."""
        self.check_complete("Solve")
        adjoint = "recursive_checkpoint" if self.adjoint is None else self.adjoint
        return solve(system, state0, t0=self.t0, t1=self.t1, save_at=self.save_at, solver=self.solver,
                     rtol=self.rtol, atol=self.atol, dt0=self.dt0, max_steps=self.max_steps, adjoint=adjoint,
                     args=args, observables=self.observables, throw=throw)

    @property
    def stochastic(self) -> bool:
        return False

    def check_complete(self, where):
        if self.t0 is None or self.t1 is None:
            raise ValueError(f"{where}: Solve needs the time span: pass t0=... and t1=... (and save_at=...).")

    def check_for_fit(self):
        given = [n for n in ("t0", "t1", "save_at", "observables") if getattr(self, n) is not None]
        if given:
            raise ValueError(f"fit: the rollout's {', '.join(given)} must be left unset: fit takes the start time "
                             "(`t0=`) and the save times from the data.")

    def __check_init__(self):
        positive_int("max_steps", self.max_steps, "Solve")
        if self.rtol is None and self.dt0 is None:
            raise ValueError("Solve: constant steps (rtol=None) need a step `dt0`.")
        for name in ("rtol", "atol", "dt0"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, numbers.Real) and not isinstance(value, bool)
                                          and math.isfinite(value) and value > 0):
                raise ValueError(f"Solve: `{name}` must be a positive, finite number or None, got {value!r}.")

    def check_jacobian(self, mode):
        name = self.adjoint if isinstance(self.adjoint, str) else type(self.adjoint).__name__
        if mode == "fwd" and name in ("recursive_checkpoint", "backsolve", "RecursiveCheckpointAdjoint",
                                      "BacksolveAdjoint"):
            raise ValueError(
                f"fit: Solve(adjoint={self.adjoint!r}) supports reverse mode only, but the Jacobian is "
                "forward mode; pass jacobian=\"reverse\", or adjoint=None/\"forward\"/\"direct\"."
            )
        if mode == "bwd" and name in ("forward", "ForwardMode"):
            raise ValueError(
                "fit: Solve(adjoint='forward') supports forward mode only, but the Jacobian is reverse "
                "mode; pass jacobian=\"forward\" or adjoint=None."
            )

    def for_jacobian(self, mode):
        if self.adjoint is not None:
            return self
        return eqx.tree_at(lambda s: s.adjoint, self, "forward" if mode == "fwd" else "recursive_checkpoint",
                           is_leaf=lambda x: x is None)

    def plan(self, starts, save_times, dtype):
        ends = np.array([ts[-1] for ts in save_times])
        n_save = max(len(ts) for ts in save_times)
        ts = np.stack([np.pad(t, (0, n_save - len(t)), mode="edge") for t in save_times])
        return _SolvePlan(t0=to_device(starts, dtype), t1=to_device(ends, dtype), ts=to_device(ts, dtype))

    def run_plan(self, system, state0, plan, args):
        adjoint = "recursive_checkpoint" if self.adjoint is None else self.adjoint
        # `plan` and `dense` made the times on the host: increasing, within [t0, t1], t1 >= t0; and
        # `dt0` is positive. So the run-time checks of these (host callbacks) may be left out of
        # the compiled program (`_compile/host_checked.py`), which JAX's disk cache then keeps.
        with checked_on_host():
            traj = solve(system, state0, t0=plan.t0, t1=plan.t1, save_at=plan.ts, solver=self.solver,
                         rtol=self.rtol, atol=self.atol, dt0=self.dt0, max_steps=self.max_steps,
                         adjoint=adjoint, args=args, throw=False)
        return traj.states

    def without_diffrax(self) -> "AbstractRollout":
        """`_SolveModelOnly`: for the key of a fit program kept on disk (see there)."""
        return _SolveModelOnly()

    def dense(self, t0, t1, n_points, dtype):
        times = np.linspace(t0, t1, max(n_points, 2))
        plan = _SolvePlan(t0=jnp.asarray(t0, dtype=dtype), t1=jnp.asarray(t1, dtype=dtype),
                          ts=jnp.asarray(times, dtype=dtype))
        return plan, times


class _SolveModelOnly(AbstractRollout):
    """What `Solve.run_plan` runs outside Diffrax, for the key of a fit program kept on disk
    (`fit`'s probe; `_compile/program_cache.py`): the model's vector field, called as Diffrax
    calls it, at each segment's start, returned in the shape and dtype of the saved states. The
    rest is library code (Diffrax, and sciax's own, in the key by version and source) chosen by
    the `Solve`'s settings, which the key holds by value; with Diffrax's custom derivative rules
    in it, the probe could not be written down at all. Keep it in step with `Solve.run_plan`."""

    def run_plan(self, system, state0, plan, args):
        rate = _vector_field(plan.t0, state0, (system, args))
        return jax.tree_util.tree_map(
            lambda r, y: jnp.broadcast_to(jnp.asarray(r).astype(y.dtype), plan.ts.shape + jnp.shape(y)), rate, state0)
