"""Declarative scenario files: a TOML schema, validation that names the file and the key, and
the objects (system, initial state, integrator, observables) a scenario describes.

```toml
name = "lorenz"                       # optional; default: the file name without .toml
description = "Lorenz attractor"      # optional

[system]
name = "Lorenz"                       # any concrete class exported by sciax.systems
params = { rho = 28.0 }               # constructor arguments (numbers or arrays)

[initial_state]                       # exactly one form (section optional: default = true)
values = [1.0, 1.0, 1.0]              # ODE state
# positions = [[1.0, 0.0]]            # particle systems: both positions and velocities
# velocities = [[0.0, 1.0]]
# preset = "orbit"                    # calls system.orbit_state(eccentricity = 0.5, ...)
# eccentricity = 0.5
# default = true                      # system.default_state()

[integrator]
name = "RK4"                          # any concrete class exported by sciax.integrators
params = {}                           # e.g. { kT = 1.0, friction = 0.5 } for LangevinBAOAB

[run]
dt = 0.005                            # step size (required)
n_steps = 20000                       # number of steps, a multiple of save_every (required)
save_every = 2                        # steps between saved frames (default 1)
t0 = 0.0                              # initial time (default 0)
precision = "float64"                 # or "float32" (default float64)
seed = 0                              # key for stochastic integrators, 0 <= seed < 2**32 (default 0)
chunk_steps = 10000                   # steps per jitted chunk / checkpoint (multiple of save_every)
observables = ["conserved"]           # "conserved" = system.conserved_quantities (default)
check_finite = true                   # stop at the first NaN/Inf frame (default true)

[output]
dir = "runs/lorenz"                   # default runs/<name>, relative to the current directory
plot = true                           # write plot.png (default true)
states_csv = "auto"                   # states.csv: true, false, or "auto" (<= 64 columns)
```

Errors are `ScenarioError`s whose message names the file, the key (`[run] dt`) and what
was expected; unknown keys list the valid keys, unknown names list the valid names.
"""

import dataclasses
import importlib
import importlib.util
import math
import typing
from pathlib import Path

from .classes import (  # noqa: F401  (system_classes, integrator_classes: the names a scenario may use)
    init_fields,
    integrator_classes,
    presets,
    resolve_class,
    source_digest,
    system_classes,
)
from .scenario_settings import (
    INTEGRATOR_KEYS,
    OUTPUT_KEYS,
    SYSTEM_KEYS,
    TOP_KEYS,
    OutputSettings,
    RunSettings,
    SolveSettings,
    check_initial_state,
    check_params,
    lookup,
    parse_run,
    parse_solve,
)
from .schema import (
    Checker,
    ScenarioError,
    got,
    override_record,
    parse_toml,
    physics_hash,
    read_scenario_text,
    set_precision,
    table,
)

JOBS = {"sweep": "sciax.app.sweep_job", "fit": "sciax.app.fit_job"}


@dataclasses.dataclass(frozen=True)
class Built:
    """What a scenario describes, as objects ready for `sciax.simulate`.

    - `system`, `integrator`: Equinox modules, floating parameters in the run's precision.
    - `state0`: the initial state in the run's precision.
    - `dtype`: `jnp.float64` or `jnp.float32`. `key`: a `jax.random` key (stochastic
      integrators) or `None`.
    - `observables`: dict name -> `fn(t, state, system)`. `conserved`: the names among them
      that the exact dynamics conserve (their drift is reported).
    - `rollout`: how to integrate, `sciax.Simulate` (`[integrator]` and `[run]`; `integrator`
      is its integrator) or `sciax.Solve` (`[solve]`; `integrator` is None). Without a run
      length (`[run] n_steps`, `[solve] t1`: a fit takes them from the data) it has none.
    """

    system: object
    state0: object
    integrator: object
    dtype: object
    key: object
    observables: dict
    conserved: tuple[str, ...]
    rollout: object = None


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A validated scenario. Build the objects with `build()`; run it with `sciax.runner.run`.

    Make one with `load_scenario(path)` or `parse_scenario(text, source)`.
    """

    source: str
    text: str
    name: str
    description: str
    system_name: str
    system_params: dict
    initial_state: dict
    integrator_name: str | None  # None with [solve]
    integrator_params: dict | None
    run: RunSettings | None  # None with [solve]
    output: OutputSettings
    overrides: dict = dataclasses.field(default_factory=dict)
    solve: SolveSettings | None = None
    job: object = None  # the validated [sweep] or [fit] table (`JOBS`), or None
    folder: str = "."  # the scenario file's folder: user .py files and data files are found from it

    @property
    def kind(self) -> str:
        """`"run"` (fixed step, `[integrator]` + `[run]`), `"solve"` (`[solve]`), or the job
        table's name (`"sweep"`, `"fit"`)."""
        if self.job is not None:
            return self.job.KIND
        return "solve" if self.solve is not None else "run"

    @property
    def precision(self) -> str:
        return (self.run or self.solve).precision

    # -- identity

    def physics(self) -> dict:
        """The settings that determine the computed trajectory (hashed for `--resume`).

        `n_steps` (a run may be extended) and `chunk_steps` (results do not depend on it) are
        left out, as are `[output]` and, for a deterministic integrator, `seed`.
        """
        system = {"name": self.system_name, "params": self.system_params}
        if ":" in self.system_name:
            system["source_sha256"] = source_digest(self.system_class())
        out = {"system": system, "initial_state": self.initial_state}
        if self.solve is not None:
            solve = dataclasses.asdict(self.solve)
            out["solve"] = {k: list(v) if isinstance(v, tuple) else v for k, v in solve.items()}
        else:
            run = dataclasses.asdict(self.run)
            for k in ("n_steps", "chunk_steps"):
                run.pop(k)
            if not getattr(self.integrator_class(), "stochastic", False):
                run.pop("seed")  # no noise: the seed cannot change the trajectory
            run["observables"] = list(run["observables"])
            integrator = {"name": self.integrator_name, "params": self.integrator_params}
            if ":" in self.integrator_name:
                integrator["source_sha256"] = source_digest(self.integrator_class())
            out.update(integrator=integrator, run=run)
        if self.job is not None:
            out[self.kind] = self.job.physics()
        return out

    def system_class(self) -> type:
        """The system class `[system] name` names (a library class or the user's)."""
        return resolve_class(self.system_name, "system", self.folder)

    def integrator_class(self) -> type:
        """The integrator class `[integrator] name` names (None with `[solve]`)."""
        return None if self.integrator_name is None else resolve_class(self.integrator_name, "integrator", self.folder)

    def hash(self) -> str:
        """SHA-256 of `physics()` (canonical JSON)."""
        return physics_hash(self.physics())

    def same_physics(self, recorded: dict) -> bool:
        """Whether `physics()` recorded in a checkpoint describes this scenario's trajectory.
        Checkpoints written before `seed` was left out for deterministic integrators still
        record it; it is ignored where it cannot matter."""
        current = self.physics()
        if "seed" not in current.get("run", {"seed": 0}) and isinstance(recorded.get("run"), dict):
            recorded = {**recorded, "run": {k: v for k, v in recorded["run"].items() if k != "seed"}}
        return physics_hash(recorded) == physics_hash(current)

    def with_overrides(self, *, n_steps: int | None = None) -> "Scenario":
        """A copy with command-line overrides applied and validated (`--n-steps`)."""
        if n_steps is None:
            return self
        if self.run is None:
            raise ScenarioError(f"--n-steps: {self.source} has no [run] (it solves with [solve]); set its span "
                                "with --set solve.t1=... instead.")
        if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps <= 0:
            raise ScenarioError(f"--n-steps: expected a positive integer, got {n_steps!r}.")
        if n_steps % self.run.save_every:
            raise ScenarioError(
                f"--n-steps: expected a multiple of [run] save_every ({self.run.save_every}) in "
                f"{self.source}, got {n_steps}; for example --n-steps "
                f"{max(self.run.save_every, n_steps - n_steps % self.run.save_every)}."
            )
        run = dataclasses.replace(self.run, n_steps=n_steps)
        return dataclasses.replace(self, run=run, overrides={**self.overrides, "n_steps": n_steps})

    # -- objects

    def _error(self, where: str, message: str) -> ScenarioError:
        return ScenarioError(f"{self.source}: {where}: {message}")

    def build(self) -> Built:
        """Set the precision, then construct the system, initial state, integrator and observables.

        **Raises:** `ScenarioError` naming the section and key a constructor or check rejected.
        """
        import jax.numpy as jnp
        import jax.random as jr

        set_precision(self.precision)
        dtype = jnp.dtype(self.precision)

        system = _cast_floats(self._construct(self.system_class(), self.system_params, "[system] params", dtype),
                              dtype)
        if self.solve is not None:
            return self._build_solve(system, dtype)
        integrator = _cast_floats(
            self._construct(self.integrator_class(), self.integrator_params, "[integrator] params", dtype), dtype)
        try:
            integrator.check_system(system)
        except TypeError as e:
            raise self._error("[integrator] name",
                              f"{self.integrator_name} cannot step {self.system_name}: {e}") from None

        state0 = self._initial_checked(system, dtype)
        self._check_run_range(dtype, integrator)
        key = jr.key(self.run.seed) if integrator.stochastic else None
        self._check_one_step(system, state0, integrator, key, dtype)
        observables, conserved = self._observables(system, state0, dtype, self.run.t0, self.run.observables, "[run]")
        from .._rollout import Simulate

        rollout = Simulate(integrator, self.run.dt, n_steps=self.run.n_steps, save_every=self.run.save_every,
                           t0=self.run.t0, observables=observables or None)
        return Built(system=system, state0=state0, integrator=integrator, dtype=dtype, key=key,
                     observables=observables, conserved=conserved, rollout=rollout)

    def _initial_checked(self, system, dtype):
        import jax
        import jax.numpy as jnp

        from .._errors import StateMismatchError

        state0 = _cast_floats(self._initial_state(system, dtype), dtype)
        try:
            system.check_state(state0)
        except StateMismatchError as e:
            raise self._error("[initial_state]", f"the state does not fit {self.system_name}: {e}") from None
        if not all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree_util.tree_leaves(state0)):
            raise self._error("[initial_state]", f"the initial state is not finite (NaN/Inf): {state0}. "
                              "Check the values or the preset's arguments.")
        return state0

    def _build_solve(self, system, dtype) -> Built:
        """`[solve]`: the system, the initial state and a `sciax.Solve` rollout, checked by
        tracing one evaluation of the vector field (no compute)."""
        import jax
        import jax.numpy as jnp
        import numpy as np

        from .._rollout import Solve

        s = self.solve
        state0 = self._initial_checked(system, dtype)
        for key_name in ("t0", "t1", "dt0", "save_from"):
            value = getattr(s, key_name)
            if value is not None and not math.isfinite(float(np.asarray(value, dtype))):
                raise self._error(f"[solve] {key_name}", f"{value!r} is not finite in {jnp.dtype(dtype).name}.")
        try:
            after = jax.eval_shape(lambda y: system.vector_field(jnp.asarray(s.t0, dtype), y, None), state0)
            problem = None if jax.tree_util.tree_structure(after) == jax.tree_util.tree_structure(state0) else \
                f"the vector field returns {_shapes(after)} for a state {_shapes(state0)}"
        except Exception as e:  # noqa: BLE001 - any failure of the user's combination is reported
            first_line = str(e).splitlines()[0] if str(e) else ""
            problem = f"evaluating the vector field fails: {type(e).__name__}: {first_line}"
        if problem is not None:
            raise self._error("[system] params", f"{self.system_name}({_kwargs_text(self.system_params)}) with this "
                              f"[initial_state] does not fit together: {problem}.")
        observables, conserved = self._observables(system, state0, dtype, s.t0, s.observables, "[solve]")
        save_at = None if s.t1 is None else jnp.asarray(s.times(), dtype)
        rollout = Solve(s.solver, t0=s.t0, t1=s.t1, save_at=save_at, rtol=s.rtol, atol=s.atol, dt0=s.dt0,
                        max_steps=s.max_steps, observables=observables or None)
        return Built(system=system, state0=state0, integrator=None, dtype=dtype, key=None,
                     observables=observables, conserved=conserved, rollout=rollout)

    def _check_run_range(self, dtype, integrator):
        """What validates as a number can still fail in the run's precision: dt or t0 that
        round to 0 or overflow in float32, a step count past the step counter (int32 without
        x64), a stochastic run past the 2**32 distinct per-step keys, a seed the key truncates."""
        import jax.numpy as jnp
        import numpy as np

        for key_name in ("dt", "t0"):
            value = getattr(self.run, key_name)
            with np.errstate(over="ignore"):  # an overflow to inf is reported below
                cast = float(np.asarray(value, dtype))
            if not math.isfinite(cast) or (key_name == "dt" and cast <= 0):
                raise self._error(f"[run] {key_name}", f"{value!r} is {cast} in {jnp.dtype(dtype).name}.")
        counter = jnp.arange(1).dtype
        n_steps = self.run.n_steps or 0
        if n_steps > jnp.iinfo(counter).max:
            raise self._error("[run] n_steps", f"{self.run.n_steps} steps do not fit the {counter.name} step counter "
                              f"(at most {jnp.iinfo(counter).max}); use precision = \"float64\" (64-bit counters).")
        if integrator.stochastic and n_steps > 2**32:
            raise self._error("[run] n_steps", f"a stochastic run can take at most 2**32 steps (each step's key "
                              f"folds in a 32-bit step index); got {self.run.n_steps}.")
        if self.run.seed > 2**32 - 1:
            raise self._error("[run] seed", f"must be below 2**32 (larger seeds would share keys with smaller "
                              f"ones), got {self.run.seed}.")

    def _check_one_step(self, system, state0, integrator, key, dtype):
        """Trace one step (no compute): parameters of the wrong shape must fail here, with the
        scenario's keys named, not as a traceback from inside the jitted run."""
        import jax
        import jax.numpy as jnp

        t0, dt = jnp.asarray(self.run.t0, dtype), jnp.asarray(self.run.dt, dtype)

        def one_step():
            carry = integrator.init(system, t0, state0, None)
            return integrator.state(integrator.step(system, t0, carry, dt, key, None))

        try:
            after = jax.eval_shape(one_step)
            same = jax.tree_util.tree_structure(after) == jax.tree_util.tree_structure(state0) and all(
                a.shape == jnp.shape(b) and a.dtype == jnp.result_type(b)
                for a, b in zip(jax.tree_util.tree_leaves(after), jax.tree_util.tree_leaves(state0)))
            problem = None if same else (
                f"one step turns the state {_shapes(state0)} into {_shapes(after)}")
        except Exception as e:  # noqa: BLE001 - any failure of the user's combination is reported
            first_line = str(e).splitlines()[0].rstrip(".") if str(e) else ""
            problem = f"one step fails: {type(e).__name__}: {first_line}"
        if problem is not None:
            raise self._error(
                "[system] params",
                f"{self.system_name}({_kwargs_text(self.system_params)}) with this [initial_state] and "
                f"{self.integrator_name} do not fit together: {problem}. Check the shapes of the "
                "parameters (scalars where the system expects scalars) and of the initial state.")

    def _construct(self, cls, params: dict, where: str, dtype):
        import jax.numpy as jnp

        fields = init_fields(cls)
        kwargs = {}
        for name, value in params.items():
            field = fields.get(name)
            static = field is not None and field.metadata.get("static", False)
            kwargs[name] = value if static or isinstance(value, str | bool) else jnp.asarray(value, dtype=dtype)
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as e:
            raise self._error(where, f"{cls.__name__}({_kwargs_text(params)}) failed: {e}") from None

    def _initial_state(self, system, dtype):
        import jax.numpy as jnp

        from .._phase_space import PhaseSpace

        spec = self.initial_state
        name = type(system).__name__
        if "values" in spec:
            return jnp.asarray(spec["values"], dtype=dtype)
        if "positions" in spec:
            return PhaseSpace(jnp.asarray(spec["positions"], dtype=dtype),
                              jnp.asarray(spec["velocities"], dtype=dtype))
        preset = "default" if spec.get("default") else spec["preset"]
        kwargs = {k: v for k, v in spec.items() if k not in ("preset", "default")}
        method = getattr(system, f"{preset}_state")
        try:
            return method(**kwargs)
        except NotImplementedError as e:
            raise self._error("[initial_state]", f"{e} Give values = [...] or positions/velocities.") from None
        except (TypeError, ValueError) as e:
            raise self._error("[initial_state]",
                              f"{name}.{preset}_state({_kwargs_text(kwargs)}) failed: {e}") from None

    def _observables(self, system, state0, dtype, t0, names, section):
        import jax
        import jax.numpy as jnp

        from ..systems import AbstractHamiltonian

        t0 = jnp.asarray(t0, dtype=dtype)
        conserved_names = tuple(jax.eval_shape(lambda s: system.conserved_quantities(t0, s), state0))
        available = {k: ConservedQuantity(k) for k in conserved_names}
        if isinstance(system, AbstractHamiltonian):
            available = {**{k: HamiltonianObservable(k) for k in HamiltonianObservable.NAMES}, **available}
        chosen = {}
        for name in names:
            if name == "conserved":
                chosen.update({k: available[k] for k in conserved_names})
            elif name in available:
                chosen[name] = available[name]
            else:
                valid = ", ".join(sorted({"conserved", *available}))
                raise self._error(f"{section} observables",
                                  f"unknown observable {name!r} for {self.system_name}; valid names: {valid}.")
        return chosen, tuple(k for k in chosen if k in conserved_names)

    @property
    def output_dir(self) -> Path:
        return Path(self.output.dir).expanduser()


@dataclasses.dataclass(frozen=True)
class ConservedQuantity:
    """Observable `fn(t, state, system)`: one entry of `system.conserved_quantities(t, state)`.

    A hashable value object rather than a closure, so that equal scenarios hit the jit cache.
    """

    name: str

    def __call__(self, t, state, system):
        return system.conserved_quantities(t, state)[self.name]


@dataclasses.dataclass(frozen=True)
class HamiltonianObservable:
    """Observable `fn(t, state, system)` of a particle system: energy, kinetic_energy,
    potential_energy or momentum."""

    name: str
    NAMES: typing.ClassVar[tuple[str, ...]] = ("energy", "kinetic_energy", "potential_energy", "momentum")

    def __call__(self, t, state, system):
        if self.name == "kinetic_energy":
            return system.kinetic_energy(state.velocities)
        if self.name == "potential_energy":
            return system.potential_energy(state.positions)
        return getattr(system, self.name)(state)


def _shapes(tree) -> str:
    import jax

    leaves = jax.tree_util.tree_leaves(tree)
    return ", ".join(f"{getattr(x, 'dtype', type(x).__name__)}{list(getattr(x, 'shape', ()))}" for x in leaves)


def _kwargs_text(kwargs: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def _cast_floats(tree, dtype):
    """Cast every floating array leaf of `tree` to `dtype` (the scenario's chosen precision)."""
    import equinox as eqx
    import jax.tree_util as jtu

    return jtu.tree_map(lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, tree)


# --------------------------------------------------------------------------- parsing


def parse_scenario(text: str, source: str = "<scenario>", *, default_name: str = "scenario", folder=None,
                   overrides=()) -> Scenario:
    """Parse and validate scenario TOML `text`; `source` names the file in error messages,
    `folder` is where the user's `.py` files and data files are looked for (default: the
    current folder), `overrides` are `sciax run --set` strings (`"run.dt=0.01"`), validated
    like the file.

    **Raises:** `ScenarioError`.
    """
    data = parse_toml(text, source, overrides)
    checker = Checker(f"{source} (with --set {' '.join(overrides)})" if overrides else source)
    folder = str(folder) if folder is not None else "."
    top = checker.section(data, "", {**TOP_KEYS, **{k: table for k in JOBS}}, required=("system",))
    name = top.get("name", default_name)
    if not name or any(c in name for c in "/\\") or name in (".", ".."):
        raise checker.error("name", f"expected a plain name usable as a folder name, got {got(name)}.")
    jobs = [k for k in JOBS if k in top]
    if len(jobs) > 1:
        raise checker.error("top level", f"expected at most one job table, got [{'] and ['.join(jobs)}]; "
                            "a scenario sweeps or fits, not both.")
    fitting = jobs == ["fit"]

    system_table = checker.section(top["system"], "[system]", SYSTEM_KEYS, required=("name",))
    system_cls = lookup(checker, "[system] name", system_table["name"], "system", folder)
    system_params = check_params(checker, "[system] params", system_cls, system_table.get("params", {}))

    initial_state = check_initial_state(checker, top.get("initial_state", {"default": True}), system_cls)

    fixed, adaptive = "integrator" in top or "run" in top, "solve" in top
    if fixed == adaptive:
        raise checker.error("top level", "expected how to integrate: either [integrator] with [run] (fixed "
                            "steps) or [solve] (adaptive or stiff, Diffrax)"
                            f"{', not both' if fixed else '; got neither'}.")
    integ_table = integ_params = run = solve = None
    if fixed:
        for section in ("integrator", "run"):
            if section not in top:
                raise checker.error("top level", f"missing required key {section!r} (fixed-step runs need "
                                    "[integrator] and [run]).")
        integ_table = checker.section(top["integrator"], "[integrator]", INTEGRATOR_KEYS, required=("name",))
        integ_cls = lookup(checker, "[integrator] name", integ_table["name"], "integrator", folder)
        integ_params = check_params(checker, "[integrator] params", integ_cls, integ_table.get("params", {}))
        run = parse_run(checker, top["run"], need_length=not fitting)
    else:
        solve = parse_solve(checker, top["solve"], need_span=not fitting)

    output_table = checker.section(top.get("output", {}), "[output]", OUTPUT_KEYS)
    output_table.setdefault("dir", str(Path("runs") / name))
    output = OutputSettings(**output_table)

    scenario = Scenario(source=source, text=text, name=name, description=top.get("description", ""),
                        system_name=system_table["name"], system_params=system_params,
                        initial_state=initial_state, integrator_name=integ_table and integ_table["name"],
                        integrator_params=integ_params, run=run, output=output, solve=solve, folder=folder,
                        overrides=override_record(overrides))
    if jobs:
        module = importlib.import_module(JOBS[jobs[0]])
        scenario = dataclasses.replace(scenario, job=module.parse_settings(checker, top[jobs[0]], scenario))
    return scenario


def load_scenario(path, *, n_steps: int | None = None, overrides=()) -> Scenario:
    """Read and validate the scenario file `path`; `overrides` are `sciax run --set` strings
    (`"run.dt=0.01"`), `n_steps` overrides `[run] n_steps`.

    **Raises:** `ScenarioError` naming the file, the key and what was expected.
    """
    path = Path(path)
    scenario = parse_scenario(read_scenario_text(path), str(path), default_name=path.stem, folder=path.parent,
                              overrides=overrides)
    return scenario.with_overrides(n_steps=n_steps)
