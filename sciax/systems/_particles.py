"""Hamiltonian particle systems: harmonic wells, Kepler, softened N-body gravity, spring networks."""

import equinox as eqx
import jax
import jax.numpy as jnp

from .._state import PhaseSpace
from ._base import AbstractHamiltonian


def _positive_mass_check(name, masses):
    if not isinstance(masses, jax.core.Tracer) and not bool(jnp.all(masses > 0)):
        raise ValueError(f"{name}: `masses` must be positive, got {masses}.")


class HarmonicOscillator(AbstractHamiltonian):
    """Isotropic harmonic well U(q) = ½ k |q|² for one particle of mass m in d dimensions.

    Exact solution: q(t) = q₀ cos ωt + (v₀/ω) sin ωt with ω = √(k/m).

    **Arguments:** `stiffness` k (energy/length²), `masses` m (mass, scalar).
    State: `PhaseSpace` with positions of shape `(d,)`.
    """

    stiffness: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    masses: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)

    def __check_init__(self):
        _positive_mass_check("HarmonicOscillator", self.masses)

    def potential_energy(self, positions):
        return 0.5 * self.stiffness * jnp.sum(positions**2)

    def exact(self, state0: PhaseSpace, t) -> PhaseSpace:
        """The exact state at time `t` from `state0` at time 0."""
        w = jnp.sqrt(self.stiffness / self.masses)
        c, s = jnp.cos(w * t), jnp.sin(w * t)
        q0, v0 = state0.positions, state0.velocities
        return PhaseSpace(q0 * c + v0 / w * s, -q0 * w * s + v0 * c)

    def default_state(self):
        return PhaseSpace(jnp.array([1.0]), jnp.array([0.0]))


class Kepler(AbstractHamiltonian):
    """Kepler two-body problem in the relative coordinate r = r₂ − r₁ (reduced mass μ):

        U(r) = −G M μ / |r|,   M = m₁ + m₂,   μ = m₁ m₂ / M,   so  r̈ = −G M r / |r|³.

    Conserved: energy, angular momentum L = μ r × v, and the Laplace–Runge–Lenz vector.
    Units: any consistent set; the defaults (G M = 1, μ = 1) give period 2π a^{3/2}.

    **Arguments:** `gm` (G M, length³/time²), `masses` (μ, scalar).
    State: `PhaseSpace` with positions `(2,)` or `(3,)`.
    """

    gm: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    masses: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)

    def __check_init__(self):
        _positive_mass_check("Kepler", self.masses)

    def potential_energy(self, positions):
        return -self.gm * self.masses / jnp.sqrt(jnp.sum(positions**2))

    def angular_momentum(self, state: PhaseSpace):
        """μ r × v (a scalar in 2-D, a 3-vector in 3-D)."""
        r, v = state.positions, state.velocities
        if r.shape[-1] == 2:
            return self.masses * (r[0] * v[1] - r[1] * v[0])
        return self.masses * jnp.cross(r, v)

    def orbit_state(self, semi_major_axis=1.0, eccentricity=0.0) -> PhaseSpace:
        """State at periapsis of a 2-D orbit with given a and e (0 ≤ e < 1)."""
        a, e = jnp.asarray(semi_major_axis), jnp.asarray(eccentricity)
        r_p = a * (1 - e)
        v_p = jnp.sqrt(self.gm * (1 + e) / r_p)
        return PhaseSpace(jnp.stack([r_p, 0.0 * r_p]), jnp.stack([0.0 * v_p, v_p]))

    def period(self, semi_major_axis=1.0):
        """Orbital period 2π √(a³ / GM)."""
        return 2 * jnp.pi * jnp.sqrt(jnp.asarray(semi_major_axis) ** 3 / self.gm)

    def default_state(self):
        return self.orbit_state(1.0, 0.5)

    def conserved_quantities(self, t, y):
        return {"energy": self.energy(y), "angular_momentum": self.angular_momentum(y)}
