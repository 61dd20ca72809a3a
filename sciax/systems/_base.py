"""Abstract system classes: ODEs, SDEs and Hamiltonian particle systems.

Parameters are array fields (so `jax.grad`, `jax.vmap` and `eqx.tree_at` reach them); static
configuration is `eqx.field(static=True)`. Library code is unbatched: one system, one state.
"""

import functools
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._errors import StateMismatchError
from .._phase_space import PhaseSpace
from .._validation import astype, describe


def float_dtype(system):
    """The precision of a system: the dtype of its (non-weakly-typed) float parameters, or the
    default float when it has none (parameters given as Python numbers)."""
    leaves = [x for x in jax.tree_util.tree_leaves(system)
              if isinstance(x, jax.Array | np.ndarray) and jnp.issubdtype(x.dtype, jnp.floating)
              and not getattr(x, "weak_type", False)]
    return jnp.result_type(*leaves) if leaves else jnp.zeros(()).dtype


def in_system_precision(preset):
    """For state presets (`default_state`, `orbit_state`, ...): cast the state they build from
    Python numbers to the system's precision, so a float32 system gets a float32 state rather
    than a float64 one (which would run the whole simulation in float64)."""

    @functools.wraps(preset)
    def wrapper(self, *args, **kwargs):
        return astype(preset(self, *args, **kwargs), float_dtype(self))

    return wrapper


def check_components(y, n: int, system_name: str) -> None:
    """Raise `StateMismatchError` unless `y` is a 1-D array of length `n` or a tuple of `n`."""
    if isinstance(y, tuple):
        if len(y) != n:
            raise StateMismatchError(
                f"{system_name} expects a state of {n} components, got a tuple of {len(y)}."
            )
    elif np.shape(y) != (n,):  # np: a list is refused later (state_dtype) without JAX's deprecation warning
        raise StateMismatchError(
            f"{system_name} expects a state of shape ({n},), got {describe(y)}."
        )


def components(y, n: int, system_name: str) -> tuple:
    """Split an ODE state into its `n` scalar components.

    Accepts a 1-D array of length `n` or a tuple of `n` scalars (the struct-of-arrays layout
    that `simulate` uses internally for speed: under `vmap` each component is a contiguous
    `(B,)` array, and no per-step stack/unstack is emitted).
    """
    check_components(y, n, system_name)
    if isinstance(y, tuple):
        return y
    return tuple(y[i] for i in range(n))


def like(y, *values):
    """Pack component values in the container type of `y` (tuple stays tuple, array stays array)."""
    if isinstance(y, tuple):
        return tuple(values)
    return jnp.stack(jnp.broadcast_arrays(*values))


class AbstractODE(eqx.Module):
    """An ordinary differential equation dy/dt = f(t, y, args).

    Subclasses implement `vector_field(t, y, args)`, which returns dy/dt with exactly the
    structure, shape and dtype of `y` (`simulate` and `solve` check this when they compile: a
    smaller array would otherwise be broadcast into a wrong trajectory). Parameters are fields;
    give them as arrays (`eqx.field(converter=jnp.asarray)`) so that `jax.grad`, `jax.vmap` and
    `sciax.sweep` reach them, and mark configuration that selects code `eqx.field(static=True)`.
    Optional: `default_state()`, `conserved_quantities(t, y)` (a dict of scalars; the runner
    reports their drift) and `check_state(y)` (raise `StateMismatchError` for a wrong state).

    ```python
    class Decay(sciax.systems.AbstractODE):
        rate: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)  # 1 / time

        def vector_field(self, t, y, args=None):
            return -self.rate * y  # dy/dt = -k y: same shape and dtype as y

    traj = sciax.simulate(Decay(rate=0.5), jnp.array([1.0, 2.0]), integrator=sciax.integrators.RK4(),
                          dt=0.01, n_steps=100)  # traj.final_state ≈ [1, 2] · exp(-0.5)
    ```

    `examples/custom_system.py` is a complete worked example (a driven Duffing oscillator:
    simulate, solve, a gradient, an ensemble). Library systems whose state is a fixed number of
    scalar components set `n_components` and write `vector_field` component-wise with
    `components`/`like`; `simulate` then steps them in struct-of-arrays layout.
    """

    n_components: ClassVar[int | None] = None
    component_names: ClassVar[tuple[str, ...] | None] = None  # labels for files and plots

    def vector_field(self, t, y, args=None):
        """dy/dt at time `t` for state `y`. Must be implemented by subclasses."""
        raise NotImplementedError(f"{type(self).__name__} must implement vector_field(t, y, args).")

    def check_state(self, y) -> None:
        """Raise `StateMismatchError` if `y` is not a valid state of this system."""
        if self.n_components is not None:
            check_components(y, self.n_components, type(self).__name__)

    def default_state(self):
        """A sensible initial state (float array) for demos and scenarios."""
        raise NotImplementedError(f"{type(self).__name__} has no default initial state.")

    def conserved_quantities(self, t, y) -> dict:
        """Quantities that the exact dynamics conserve, by name (empty if none)."""
        return {}


class AbstractSDE(AbstractODE):
    """An Itô SDE with diagonal noise: dy = f(t, y) dt + g(t, y) ⊙ dW.

    `vector_field` is the drift f; `diffusion` returns g with the same structure as `y`.
    """

    def diffusion(self, t, y, args=None):
        raise NotImplementedError(f"{type(self).__name__} must implement diffusion(t, y, args).")


class AbstractHamiltonian(AbstractODE):
    """A particle system H(q, v) = Σ ½ m v² + U(q) with state `PhaseSpace(positions, velocities)`.

    Subclasses implement `potential_energy(positions)` and provide a `masses` field of shape
    `positions.shape[:-1]` (a scalar for a single particle or a relative coordinate). Forces
    are `-∇U` by automatic differentiation: one source of truth for each formula.
    As an ODE its vector field is (dq/dt, dv/dt) = (v, F/m), so Runge–Kutta methods apply too.
    """

    masses: eqx.AbstractVar[jax.Array]

    def potential_energy(self, positions) -> jax.Array:
        raise NotImplementedError(f"{type(self).__name__} must implement potential_energy(positions).")

    def force(self, positions) -> jax.Array:
        """F = -∂U/∂q, same shape as `positions`."""
        return -jax.grad(self.potential_energy)(positions)

    def acceleration(self, positions) -> jax.Array:
        """a = F / m, same shape as `positions`."""
        return self.force(positions) / jnp.asarray(self.masses)[..., None]

    def kinetic_energy(self, velocities) -> jax.Array:
        """K = Σ ½ m |v|²."""
        m = jnp.asarray(self.masses)[..., None]
        return 0.5 * jnp.sum(m * velocities**2)

    def energy(self, state: PhaseSpace) -> jax.Array:
        """Total energy H = K + U."""
        return self.kinetic_energy(state.velocities) + self.potential_energy(state.positions)

    def momentum(self, state: PhaseSpace) -> jax.Array:
        """Total linear momentum Σ m v, shape `(d,)`."""
        m = jnp.asarray(self.masses)[..., None]
        p = m * state.velocities
        return p if p.ndim == 1 else jnp.sum(p, axis=0)

    def vector_field(self, t, y, args=None):
        return PhaseSpace(y.velocities, self.acceleration(y.positions))

    def check_state(self, y) -> None:
        name = type(self).__name__
        if not isinstance(y, PhaseSpace):
            raise StateMismatchError(
                f"{name} expects a sciax.PhaseSpace(positions, velocities) state, got {type(y).__name__}."
            )
        q, v = jnp.shape(y.positions), jnp.shape(y.velocities)
        if q != v:
            raise StateMismatchError(
                f"{name}: positions and velocities must have the same shape, got {q} and {v}."
            )
        m = jnp.shape(self.masses)
        if len(q) == 0 or q[:-1] != m:
            raise StateMismatchError(
                f"{name}: positions must have shape masses.shape + (d,) = {m} + (d,), got {q}."
            )

    def conserved_quantities(self, t, y) -> dict:
        return {"energy": self.energy(y)}


def check_stepped_by_acceleration(integrator: str, system, *, instead: str) -> None:
    """For integrators that step (q, v) from `system.acceleration(positions)` alone (the
    symplectic splittings, Langevin BAOAB): the system must be an `AbstractHamiltonian` whose
    dynamics are exactly (v, F(q)/m). A subclass that overrides `vector_field` (damping, a
    drive) would have that part silently ignored, so it is refused. `instead`: what the
    message advises for other systems (e.g. "use a Runge–Kutta integrator")."""
    if not isinstance(system, AbstractHamiltonian):
        raise TypeError(
            f"{integrator} steps an AbstractHamiltonian particle system (state PhaseSpace(positions, "
            f"velocities)), got {type(system).__name__}; {instead}.")
    if type(system).vector_field is not AbstractHamiltonian.vector_field:
        raise TypeError(
            f"{integrator} steps positions and velocities from `acceleration(positions)` alone, but "
            f"{type(system).__name__} overrides `vector_field` (velocity- or time-dependent terms such as "
            f"damping or a drive), which it would ignore; express the forces through `potential_energy` "
            f"(or `force`), or {instead}.")
