"""Molecular-dynamics integrators and thermostats: NVE velocity Verlet, Langevin BAOAB,
Nosé–Hoover chains and Bussi's stochastic velocity rescaling.

All four step an `MDSystem` whose state is an `MDState` (positions wrapped into the box,
velocities, integer image counts, and the thermostat's own variables in `state.thermostat`).
The loop carry is an `MDCarry`: the state plus the forces, potential energy and virial at its
positions and the neighbour list they were computed with, so each step evaluates the forces
once. Every step

1. moves the particles, re-wraps them into the box and adds the crossed box lengths to
   `state.images` (so `box.unwrap(positions, images)` is the continuous trajectory);
2. updates the neighbour list with `system.update_neighbours` (a rebuild when some particle
   moved more than half the skin since the last build; an overflow sets the list's status,
   which the host checks with `overflowed` and `simulate_md` handles);
3. computes energy, forces and virial with `system.compute`.

Units: whatever the system uses (reduced LJ units, or `sciax.md.units`' Å, eV, amu, ps):
`kT` in its energy units, `tau` in its time units, `friction` in inverse time units.

Each integrator has `extended_energy(system, state)`, the quantity its exact dynamics
conserves (for the thermostats: K + U plus the energy the thermostat has taken out), whose
drift measures the integration error.
"""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr

from .._validation import describe, describe_structure, is_concrete
from ..integrators._base import AbstractIntegrator


class MDCarry(eqx.Module):
    """The loop carry of the MD integrators.

    **Fields:**

    - `state`: the `MDState` (positions `(N, d)` wrapped into the box, velocities `(N, d)`,
      images `(N, d)` int32, thermostat variables).
    - `forces`: `(N, d)` forces at `state.positions` (energy / length units).
    - `energy`: scalar potential energy at `state.positions` (energy units).
    - `virial`: `(d, d)` virial W_ab = Σ_pairs r_a f_b at `state.positions` (energy units).
    - `neighbours`: the `Neighbours` the forces were computed with (with its overflow status).
    """

    state: eqx.Module
    forces: jax.Array
    energy: jax.Array
    virial: jax.Array
    neighbours: eqx.Module


class NoseHooverChainState(eqx.Module):
    """The variables of a Nosé–Hoover chain of length M (in `MDState.thermostat`).

    **Fields:**

    - `xi`: `(M,)` thermostat positions ξ_j (dimensionless).
    - `p_xi`: `(M,)` thermostat momenta p_ξj (energy × time units).
    """

    xi: jax.Array
    p_xi: jax.Array


# --------------------------------------------------------------------------------------------
# shared pieces


def _check_scalar(owner: str, name: str, value, *, positive: bool, unit: str) -> None:
    if jnp.ndim(value) != 0:
        raise ValueError(f"{owner}: `{name}` must be a scalar ({unit}), got {describe(value)}.")
    if not jnp.issubdtype(jnp.result_type(value), jnp.floating) and not jnp.issubdtype(
            jnp.result_type(value), jnp.integer):
        raise TypeError(f"{owner}: `{name}` must be a real number ({unit}), got {describe(value)}.")
    if is_concrete(value):
        v = float(value)
        ok = (v > 0 if positive else v >= 0) and v < float("inf")
        if not ok:
            expected = "> 0" if positive else ">= 0"
            raise ValueError(f"{owner}: `{name}` must be finite and {expected} ({unit}), got {v}.")


def _check_count(owner: str, name: str, value, *, minimum: int = 1, allow_none: bool = False) -> None:
    if allow_none and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}: `{name}` must be a Python int >= {minimum}, got {describe(value)}.")
    if value < minimum:
        raise ValueError(f"{owner}: `{name}` must be an int >= {minimum}, got {value}.")


def _masses(system, dtype):
    return jnp.asarray(system.masses).astype(dtype)[:, None]


def _kinetic(velocities, m):
    """K = Σ ½ m |v|² (energy units)."""
    return 0.5 * jnp.sum(m * velocities**2)


def _move(system, state, displacement):
    """Positions + displacement, wrapped into the box; images updated."""
    positions, shift = system.box.wrap(state.positions + displacement)
    return positions, (state.images + shift).astype(state.images.dtype)


def _forces(system, positions, neighbours):
    """(ForceResult, neighbours) at `positions`, the list rebuilt if some particle moved too far."""
    neighbours = system.update_neighbours(positions, neighbours)
    return system.compute(positions, neighbours), neighbours


def _verlet(system, carry: MDCarry, state, dt, m) -> MDCarry:
    """Kick–drift–kick from `state` (whose positions are `carry`'s, so `carry.forces` apply)."""
    v = state.velocities + (0.5 * dt) * carry.forces / m
    positions, images = _move(system, state, dt * v)
    result, neighbours = _forces(system, positions, carry.neighbours)
    v = v + (0.5 * dt) * result.forces / m
    state = eqx.tree_at(lambda s: (s.positions, s.velocities, s.images), state, (positions, v, images))
    return MDCarry(state, result.forces, result.energy, result.virial, neighbours)


def _replace_thermostat(state, thermostat):
    return eqx.tree_at(lambda s: s.thermostat, state, thermostat, is_leaf=lambda x: x is None)


class _AbstractMDIntegrator(AbstractIntegrator):
    """Shared init/state/check_system of the MD integrators (the step is each one's own)."""

    order: ClassVar[int] = 2

    def _thermostat0(self, state):
        """The thermostat variables of a new run (`state.thermostat` is `()`), or the given ones
        (a state saved from a run of the same integrator), checked."""
        return ()

    def thermostat_energy(self, system, state):
        """The energy the thermostat has taken out of the system (energy units); 0 for NVE."""
        return jnp.zeros((), state.velocities.dtype)

    def extended_energy(self, system, state):
        """K + U (+ the thermostat's energy), conserved by the exact dynamics (energy units).

        **Arguments:** `system`, the `MDSystem`; `state`, an `MDState` of this integrator (its
        `thermostat` filled in, as in the states `simulate` saves).

        **Returns:** a scalar in the state's dtype.
        """
        m = _masses(system, state.velocities.dtype)
        return _kinetic(state.velocities, m) + system.potential_energy(state.positions) \
            + self.thermostat_energy(system, state)

    def init(self, system, t0, state, args):
        state = _replace_thermostat(state, self._thermostat0(state))
        neighbours = system.build_neighbours(state.positions)
        result = system.compute(state.positions, neighbours)
        return MDCarry(state, result.forces, result.energy, result.virial, neighbours)

    def state(self, carry):
        return carry.state

    def check_system(self, system) -> None:
        missing = [name for name in ("box", "masses", "build_neighbours", "update_neighbours", "compute")
                   if not hasattr(system, name)]
        if missing:
            raise TypeError(
                f"{type(self).__name__} steps a sciax.md.MDSystem (box, masses, neighbour list, compute), "
                f"got {type(system).__name__}, which has no {', '.join(missing)}; use "
                "sciax.integrators.VelocityVerlet / LangevinBAOAB for other particle systems.")


def _default_dof(system, state, degrees_of_freedom):
    if degrees_of_freedom is not None:
        return degrees_of_freedom
    n, d = state.positions.shape
    return max(n * d - d, 1)


def _check_scalar_thermostat(owner: str, thermostat, dtype):
    if isinstance(thermostat, tuple) and thermostat == ():
        return jnp.zeros((), dtype)
    if not (isinstance(thermostat, jax.Array) and jnp.shape(thermostat) == ()):
        raise TypeError(
            f"{owner}: `state.thermostat` must be () (a new run) or the scalar accumulated heat of an earlier "
            f"{owner} run, got {describe_structure(thermostat)}.")
    if jnp.result_type(thermostat) != dtype:
        raise TypeError(f"{owner}: `state.thermostat` has dtype {jnp.result_type(thermostat)}, but the state is "
                        f"{jnp.dtype(dtype).name}; use one precision.")
    return thermostat


# --------------------------------------------------------------------------------------------
# NVE


class VelocityVerlet(_AbstractMDIntegrator):
    """Velocity Verlet for constant N, V, E (kick–drift–kick, order 2, one force evaluation):

        v_{n+½} = v_n + (h/2) F(q_n)/m
        q_{n+1} = wrap(q_n + h v_{n+½})
        v_{n+1} = v_{n+½} + (h/2) F(q_{n+1})/m

    Symplectic and time-reversible: a step with −h from the new carry returns to the old state
    (up to rounding; the neighbour list is rebuilt as needed, which does not change the forces
    while it is valid), so `simulate(..., adjoint=ReversibleAdjoint())` applies.
    `state.thermostat` stays `()`; the extended energy is K + U.

    ```python
    traj = sciax.simulate(system, state0, integrator=sciax.md.VelocityVerlet(), dt=0.005, n_steps=1000)
    ```
    """

    reversible: ClassVar[bool] = True

    def _thermostat0(self, state):
        if not (isinstance(state.thermostat, tuple) and state.thermostat == ()):
            raise TypeError("VelocityVerlet: `state.thermostat` must be () (NVE has no thermostat variables), got "
                            f"{describe_structure(state.thermostat)}.")
        return ()

    def step(self, system, t, carry, dt, key, args):
        m = _masses(system, carry.state.velocities.dtype)
        return _verlet(system, carry, carry.state, dt, m)


# --------------------------------------------------------------------------------------------
# Langevin


class Langevin(_AbstractMDIntegrator):
    """Underdamped Langevin dynamics by the BAOAB splitting (Leimkuhler & Matthews 2013):

        dq = v dt,   m dv = F(q) dt − γ m v dt + √(2 γ m kT) dW.

    Each step: B (half kick), A (half drift), O (exact Ornstein–Uhlenbeck update
    v ← c v + √((1 − c²) kT/m) ξ, c = e^{−γh}, ξ ~ N(0, 1) per component), A, B; the scheme of
    `sciax.integrators.LangevinBAOAB`, with the key `simulate` gives each step. Every particle
    has its own noise, so total momentum is not conserved and the kinetic energy samples
    d_f = N·d degrees of freedom: ⟨K⟩ = N d kT / 2.

    `state.thermostat` holds the heat Q (energy units) the O steps have taken out of the
    system, Q ← Q + K_before − K_after, so the extended energy K + U + Q changes only by the
    splitting error (its drift measures the step size's quality, as in Bussi & Parrinello 2007).

    **Arguments:**

    - `kT`: thermal energy k_B T (the system's energy units), >= 0.
    - `friction`: collision rate γ (inverse time units), >= 0; γ = 0 is velocity Verlet.

    **Raises:** `ValueError` for a negative, infinite or non-scalar `kT` or `friction`.
    """

    kT: jax.Array = eqx.field(converter=jnp.asarray)
    friction: jax.Array = eqx.field(converter=jnp.asarray)
    stochastic: ClassVar[bool] = True

    def __check_init__(self):
        _check_scalar("Langevin", "kT", self.kT, positive=False, unit="energy units")
        _check_scalar("Langevin", "friction", self.friction, positive=False, unit="inverse time units")

    def _thermostat0(self, state):
        return _check_scalar_thermostat("Langevin", state.thermostat, state.velocities.dtype)

    def thermostat_energy(self, system, state):
        return state.thermostat

    def step(self, system, t, carry, dt, key, args):
        state = carry.state
        dtype = state.velocities.dtype
        m = _masses(system, dtype)
        v = state.velocities + (0.5 * dt) * carry.forces / m
        q = state.positions + (0.5 * dt) * v
        gamma_h = self.friction.astype(dtype) * dt
        c = jnp.exp(-gamma_h)
        sigma = jnp.sqrt(-jnp.expm1(-2.0 * gamma_h) * self.kT.astype(dtype) / m)
        k_before = _kinetic(v, m)
        v = c * v + sigma * jr.normal(key, v.shape, dtype)
        heat = state.thermostat + (k_before - _kinetic(v, m))
        q = q + (0.5 * dt) * v
        positions, shift = system.box.wrap(q)
        images = (state.images + shift).astype(state.images.dtype)
        result, neighbours = _forces(system, positions, carry.neighbours)
        v = v + (0.5 * dt) * result.forces / m
        state = eqx.tree_at(lambda s: (s.positions, s.velocities, s.images, s.thermostat), state,
                            (positions, v, images, heat))
        return MDCarry(state, result.forces, result.energy, result.virial, neighbours)


# --------------------------------------------------------------------------------------------
# Nosé–Hoover chain

# Suzuki–Yoshida weights of the chain's sub-steps (orders 2, 4, 6).
_W3 = 1.0 / (2.0 - 2.0 ** (1 / 3))
_W5 = 1.0 / (4.0 - 4.0 ** (1 / 3))
_SY_WEIGHTS = {1: (1.0,), 3: (_W3, 1.0 - 2 * _W3, _W3), 5: (_W5, _W5, 1.0 - 4 * _W5, _W5, _W5)}


class NoseHooverChain(_AbstractMDIntegrator):
    """Constant N, V, T by a Nosé–Hoover chain (Martyna, Klein & Tuckerman 1992) on the particle
    velocities, integrated by the Trotter splitting of Martyna, Tuckerman, Tobias & Klein (1996):
    half a chain step, a velocity-Verlet step, half a chain step.

    Equations of motion (M = `chain_length`, K the kinetic energy, d_f degrees of freedom):

        dq/dt = v,   dv/dt = F/m − (p_ξ1/Q_1) v,   dξ_j/dt = p_ξj/Q_j,
        dp_ξ1/dt = (2K − d_f kT) − p_ξ1 p_ξ2/Q_2,
        dp_ξj/dt = (p_ξ(j−1)²/Q_(j−1) − kT) − p_ξj p_ξ(j+1)/Q_(j+1),   dp_ξM/dt = p_ξ(M−1)²/Q_(M−1) − kT,

    with thermostat masses Q_1 = d_f kT τ², Q_j = kT τ² (j ≥ 2). The conserved extended energy is

        H' = K + U + Σ_j p_ξj²/(2 Q_j) + d_f kT ξ_1 + kT Σ_(j≥2) ξ_j.

    A chain half step is `chain_steps` sub-steps, each a Suzuki–Yoshida composition of
    `suzuki_yoshida` (1, 3 or 5) palindromic updates; the whole step is time-reversible.

    Degrees of freedom: by default d_f = N·d − d, right when the total momentum is zero and
    conserved (pair forces in a periodic box, initial velocities with zero total momentum: the
    thermostat scales all velocities alike, so it stays zero). With external forces, or a
    non-zero total momentum, pass `degrees_of_freedom=N*d`. ⟨K⟩ = d_f kT / 2.

    `state.thermostat` is a `NoseHooverChainState(xi, p_xi)`, zeros at the start of a run.

    **Arguments:**

    - `kT`: target thermal energy k_B T (the system's energy units), > 0.
    - `tau`: thermostat time constant τ (time units), > 0; ~100 steps is a common choice.
    - `chain_length`: M, the number of chained thermostats (int >= 1).
    - `chain_steps`: sub-steps per chain half step (int >= 1).
    - `suzuki_yoshida`: Suzuki–Yoshida weights per sub-step: 1, 3 or 5.
    - `degrees_of_freedom`: d_f, or None for N·d − d.

    **Raises:** `ValueError` for `kT` <= 0, `tau` <= 0, `chain_length` < 1, `chain_steps` < 1,
    `suzuki_yoshida` not in (1, 3, 5), `degrees_of_freedom` < 1.
    """

    kT: jax.Array = eqx.field(converter=jnp.asarray)
    tau: jax.Array = eqx.field(converter=jnp.asarray)
    chain_length: int = eqx.field(static=True, default=3)
    chain_steps: int = eqx.field(static=True, default=2)
    suzuki_yoshida: int = eqx.field(static=True, default=3)
    degrees_of_freedom: int | None = eqx.field(static=True, default=None)
    reversible: ClassVar[bool] = True

    def __check_init__(self):
        _check_scalar("NoseHooverChain", "kT", self.kT, positive=True, unit="energy units")
        _check_scalar("NoseHooverChain", "tau", self.tau, positive=True, unit="time units")
        _check_count("NoseHooverChain", "chain_length", self.chain_length)
        _check_count("NoseHooverChain", "chain_steps", self.chain_steps)
        _check_count("NoseHooverChain", "degrees_of_freedom", self.degrees_of_freedom, allow_none=True)
        if self.suzuki_yoshida not in _SY_WEIGHTS or isinstance(self.suzuki_yoshida, bool):
            raise ValueError(f"NoseHooverChain: `suzuki_yoshida` must be 1, 3 or 5, got {self.suzuki_yoshida!r}.")

    def n_degrees_of_freedom(self, system, state) -> int:
        """d_f: `degrees_of_freedom`, or N·d − d (see the class docstring)."""
        return _default_dof(system, state, self.degrees_of_freedom)

    def _thermostat0(self, state):
        dtype = state.velocities.dtype
        th = state.thermostat
        if isinstance(th, tuple) and th == ():
            zeros = jnp.zeros((self.chain_length,), dtype)
            return NoseHooverChainState(zeros, zeros)
        if not isinstance(th, NoseHooverChainState) or jnp.shape(th.xi) != (self.chain_length,) \
                or jnp.shape(th.p_xi) != (self.chain_length,):
            raise TypeError(
                f"NoseHooverChain: `state.thermostat` must be () (a new run) or a NoseHooverChainState with "
                f"(chain_length,) = ({self.chain_length},) arrays, got {describe_structure(th)}.")
        if jnp.result_type(th.xi) != dtype or jnp.result_type(th.p_xi) != dtype:
            raise TypeError(f"NoseHooverChain: `state.thermostat` must be {jnp.dtype(dtype).name} like the state, "
                            f"got {describe_structure(th)}.")
        return th

    def _masses_q(self, d_f, dtype):
        kT, tau = self.kT.astype(dtype), self.tau.astype(dtype)
        q = kT * tau**2
        return jnp.concatenate([(d_f * q)[None], jnp.broadcast_to(q, (self.chain_length - 1,))])

    def thermostat_energy(self, system, state):
        dtype = state.velocities.dtype
        d_f = self.n_degrees_of_freedom(system, state)
        kT = self.kT.astype(dtype)
        q = self._masses_q(d_f, dtype)
        th = state.thermostat
        return jnp.sum(th.p_xi**2 / (2 * q)) + d_f * kT * th.xi[0] + kT * jnp.sum(th.xi[1:])

    def _chain_half(self, th: NoseHooverChainState, kinetic, d_f, h, dtype):
        """Advance the chain by h (= dt/2) at fixed positions; returns (chain, velocity scale)."""
        M = self.chain_length
        kT = self.kT.astype(dtype)
        q = self._masses_q(d_f, dtype)
        xi = [th.xi[j] for j in range(M)]
        p = [th.p_xi[j] for j in range(M)]
        scale = jnp.ones((), dtype)
        k = kinetic

        def force(j):
            return (2 * k - d_f * kT) if j == 0 else (p[j - 1] ** 2 / q[j - 1] - kT)

        for w in _SY_WEIGHTS[self.suzuki_yoshida]:
            delta = (w / self.chain_steps) * h
            for _ in range(self.chain_steps):
                # momenta from the chain's end down to the first
                p[M - 1] = p[M - 1] + (delta / 2) * force(M - 1)
                for j in range(M - 2, -1, -1):
                    e = jnp.exp(-(delta / 4) * p[j + 1] / q[j + 1])
                    p[j] = (p[j] * e + (delta / 2) * force(j)) * e
                for j in range(M):
                    xi[j] = xi[j] + delta * p[j] / q[j]
                s = jnp.exp(-delta * p[0] / q[0])
                scale = scale * s
                k = k * s**2
                # and back up
                for j in range(M - 1):
                    e = jnp.exp(-(delta / 4) * p[j + 1] / q[j + 1])
                    p[j] = (p[j] * e + (delta / 2) * force(j)) * e
                p[M - 1] = p[M - 1] + (delta / 2) * force(M - 1)
        return NoseHooverChainState(jnp.stack(xi), jnp.stack(p)), scale

    def step(self, system, t, carry, dt, key, args):
        state = carry.state
        dtype = state.velocities.dtype
        m = _masses(system, dtype)
        d_f = self.n_degrees_of_freedom(system, state)
        th, s = self._chain_half(state.thermostat, _kinetic(state.velocities, m), d_f, 0.5 * dt, dtype)
        state = eqx.tree_at(lambda x: (x.velocities, x.thermostat), state, (state.velocities * s, th))
        carry = _verlet(system, carry, state, dt, m)
        state = carry.state
        th, s = self._chain_half(state.thermostat, _kinetic(state.velocities, m), d_f, 0.5 * dt, dtype)
        state = eqx.tree_at(lambda x: (x.velocities, x.thermostat), state, (state.velocities * s, th))
        return eqx.tree_at(lambda c: c.state, carry, state)


# --------------------------------------------------------------------------------------------
# Bussi


class Bussi(_AbstractMDIntegrator):
    """Canonical sampling by stochastic velocity rescaling (Bussi, Donadio & Parrinello 2007).

    The kinetic energy K follows dK = (K̄ − K) dt/τ + 2 √(K K̄ / d_f) dW/√τ with K̄ = d_f kT/2,
    whose stationary law is the canonical one (a Gamma(d_f/2, kT) distribution). Over a time
    h it is resampled exactly: with c = e^{−h/τ}, R₁ ~ N(0, 1) and S ~ χ²(d_f − 1),

        K' = (√(c K) + √((1 − c) kT/2) R₁)² + (1 − c) (kT/2) S,

    and all velocities are multiplied by α = sign(√(c K) + √((1 − c) kT/2) R₁) √(K'/K). Each
    step is: rescaling over h/2, a velocity-Verlet step, rescaling over h/2 (two independent
    draws from the step's key). `state.thermostat` holds the heat Q (energy units) taken out
    by the rescalings, Q ← Q + K − K', so the extended energy K + U + Q is conserved up to the
    Verlet error.

    Degrees of freedom: by default d_f = N·d − d, right when the total momentum is zero and
    conserved (pair forces in a periodic box, initial velocities with zero total momentum: the
    rescaling keeps it zero). With external forces or a non-zero total momentum pass
    `degrees_of_freedom=N*d`. ⟨K⟩ = d_f kT/2 and Var(K) = d_f (kT)²/2.

    **Arguments:**

    - `kT`: target thermal energy k_B T (the system's energy units), >= 0.
    - `tau`: relaxation time τ of the kinetic energy (time units), > 0.
    - `degrees_of_freedom`: d_f (int >= 1), or None for N·d − d.

    **Raises:** `ValueError` for `kT` < 0, `tau` <= 0, or `degrees_of_freedom` < 1.
    """

    kT: jax.Array = eqx.field(converter=jnp.asarray)
    tau: jax.Array = eqx.field(converter=jnp.asarray)
    degrees_of_freedom: int | None = eqx.field(static=True, default=None)
    stochastic: ClassVar[bool] = True

    def __check_init__(self):
        _check_scalar("Bussi", "kT", self.kT, positive=False, unit="energy units")
        _check_scalar("Bussi", "tau", self.tau, positive=True, unit="time units")
        _check_count("Bussi", "degrees_of_freedom", self.degrees_of_freedom, allow_none=True)

    def n_degrees_of_freedom(self, system, state) -> int:
        """d_f: `degrees_of_freedom`, or N·d − d (see the class docstring)."""
        return _default_dof(system, state, self.degrees_of_freedom)

    def _thermostat0(self, state):
        return _check_scalar_thermostat("Bussi", state.thermostat, state.velocities.dtype)

    def thermostat_energy(self, system, state):
        return state.thermostat

    def _rescale(self, state, m, d_f, h, key):
        dtype = state.velocities.dtype
        kinetic = _kinetic(state.velocities, m)
        c = jnp.exp(-h / self.tau.astype(dtype))
        one_minus_c = -jnp.expm1(-h / self.tau.astype(dtype))
        half_kT = 0.5 * self.kT.astype(dtype)
        key_normal, key_gamma = jr.split(key)
        r1 = jr.normal(key_normal, (), dtype)
        rest = 2.0 * jr.gamma(key_gamma, (d_f - 1) / 2, (), dtype) if d_f > 1 else jnp.zeros((), dtype)
        a = jnp.sqrt(c * kinetic) + jnp.sqrt(one_minus_c * half_kT) * r1
        new_kinetic = a**2 + one_minus_c * half_kT * rest
        positive = kinetic > 0
        safe = jnp.where(positive, kinetic, 1.0)
        alpha = jnp.where(positive, jnp.sign(a) * jnp.sqrt(new_kinetic / safe), 1.0)
        new_kinetic = jnp.where(positive, new_kinetic, kinetic)
        heat = state.thermostat + (kinetic - new_kinetic)
        return eqx.tree_at(lambda s: (s.velocities, s.thermostat), state, (state.velocities * alpha, heat))

    def step(self, system, t, carry, dt, key, args):
        state = carry.state
        m = _masses(system, state.velocities.dtype)
        d_f = self.n_degrees_of_freedom(system, state)
        key_first, key_last = jr.split(key)
        state = self._rescale(state, m, d_f, 0.5 * dt, key_first)
        carry = _verlet(system, carry, state, dt, m)
        state = self._rescale(carry.state, m, d_f, 0.5 * dt, key_last)
        return eqx.tree_at(lambda c: c.state, carry, state)
