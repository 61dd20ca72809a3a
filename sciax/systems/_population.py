"""Population dynamics: predator–prey and compartmental epidemic models."""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp

from .._validation import check_parameter
from ._base import AbstractODE, components, in_system_precision, like


class LotkaVolterra(AbstractODE):
    """Lotka–Volterra predator–prey model, y = (x, y) = (prey, predator):

        dx/dt = α x − β x y,   dy/dt = δ x y − γ y

    Units: populations in any unit (the defaults are the posterior means of the Stan case
    study's fit to the Hudson's Bay hare/lynx pelt counts in thousands, time in years); α, γ in
    1/time, β, δ in 1/(population · time).
    For x, y > 0 the quantity V = δ x − γ ln x + β y − α ln y is conserved; the orbits are
    closed around the fixed point (γ/δ, α/β).

    **Arguments:** `alpha` α (prey growth), `beta` β (predation), `gamma` γ (predator death),
    `delta` δ (predator growth per prey eaten); all ≥ 0. Defaults 0.55, 0.028, 0.80, 0.024.
    """

    alpha: jax.Array = eqx.field(converter=jnp.asarray, default=0.55)
    beta: jax.Array = eqx.field(converter=jnp.asarray, default=0.028)
    gamma: jax.Array = eqx.field(converter=jnp.asarray, default=0.80)
    delta: jax.Array = eqx.field(converter=jnp.asarray, default=0.024)
    n_components: ClassVar[int] = 2
    component_names: ClassVar[tuple[str, ...]] = ('prey', 'predator')

    def __check_init__(self):
        for name in ("alpha", "beta", "gamma", "delta"):
            check_parameter("LotkaVolterra", name, getattr(self, name))

    def vector_field(self, t, y, args=None):
        prey, predator = components(y, 2, "LotkaVolterra")
        return like(
            y,
            self.alpha * prey - self.beta * prey * predator,
            self.delta * prey * predator - self.gamma * predator,
        )

    def invariant(self, y):
        """V = δ x − γ ln x + β y − α ln y (conserved for x, y > 0)."""
        prey, predator = components(y, 2, "LotkaVolterra")
        return (self.delta * prey - self.gamma * jnp.log(prey)
                + self.beta * predator - self.alpha * jnp.log(predator))

    def fixed_point(self):
        """The coexistence equilibrium (γ/δ, α/β) as a `(2,)` array."""
        return jnp.stack([self.gamma / self.delta, self.alpha / self.beta])

    @in_system_precision
    def default_state(self):
        return jnp.array([30.0, 4.0])

    def conserved_quantities(self, t, y):
        return {"invariant": self.invariant(y)}


class SIR(AbstractODE):
    """Kermack–McKendrick SIR epidemic model, y = (S, I, R):

        dS/dt = −β S I / N,   dI/dt = β S I / N − γ I,   dR/dt = γ I

    Time in days; β (transmission rate) and γ (recovery rate) in 1/day. With N = 1 the state
    holds fractions of the population, with N = the head count it holds counts; the equations
    are the same. The total S + I + R is conserved. The basic reproduction number is
    R₀ = β/γ; an outbreak grows iff R₀ S(0)/N > 1.

    **Arguments:** `beta` β ≥ 0 (1/day, default 0.3), `gamma` γ ≥ 0 (1/day, default 0.1),
    `population` N > 0 (default 1).
    """

    beta: jax.Array = eqx.field(converter=jnp.asarray, default=0.3)
    gamma: jax.Array = eqx.field(converter=jnp.asarray, default=0.1)
    population: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    n_components: ClassVar[int] = 3
    component_names: ClassVar[tuple[str, ...]] = ('S', 'I', 'R')

    def __check_init__(self):
        check_parameter("SIR", "beta", self.beta)
        check_parameter("SIR", "gamma", self.gamma)
        check_parameter("SIR", "population", self.population, strict=True)

    def vector_field(self, t, y, args=None):
        s, i, r = components(y, 3, "SIR")
        infection = self.beta * s * i / self.population
        recovery = self.gamma * i
        return like(y, -infection, infection - recovery, recovery)

    @property
    def basic_reproduction_number(self):
        """R₀ = β/γ."""
        return self.beta / self.gamma

    @in_system_precision
    def default_state(self):
        return self.population * jnp.array([0.999, 0.001, 0.0])

    def conserved_quantities(self, t, y):
        s, i, r = components(y, 3, "SIR")
        return {"total_population": s + i + r}


class SEIR(AbstractODE):
    """SEIR epidemic model with an incubation (exposed) compartment, y = (S, E, I, R):

        dS/dt = −β S I / N,   dE/dt = β S I / N − σ E,   dI/dt = σ E − γ I,   dR/dt = γ I

    Time in days; β (transmission), σ (1/incubation period) and γ (recovery) in 1/day.
    N = 1 for fractions, N = head count for counts. S + E + I + R is conserved; R₀ = β/γ.

    **Arguments:** `beta` (default 0.3), `sigma` (default 0.2), `gamma` (default 0.1), all
    ≥ 0 (1/day); `population` N > 0 (default 1).
    """

    beta: jax.Array = eqx.field(converter=jnp.asarray, default=0.3)
    sigma: jax.Array = eqx.field(converter=jnp.asarray, default=0.2)
    gamma: jax.Array = eqx.field(converter=jnp.asarray, default=0.1)
    population: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    n_components: ClassVar[int] = 4
    component_names: ClassVar[tuple[str, ...]] = ('S', 'E', 'I', 'R')

    def __check_init__(self):
        for name in ("beta", "sigma", "gamma"):
            check_parameter("SEIR", name, getattr(self, name))
        check_parameter("SEIR", "population", self.population, strict=True)

    def vector_field(self, t, y, args=None):
        s, e, i, r = components(y, 4, "SEIR")
        infection = self.beta * s * i / self.population
        onset = self.sigma * e
        recovery = self.gamma * i
        return like(y, -infection, infection - onset, onset - recovery, recovery)

    @property
    def basic_reproduction_number(self):
        """R₀ = β/γ."""
        return self.beta / self.gamma

    @in_system_precision
    def default_state(self):
        return self.population * jnp.array([0.999, 0.0, 0.001, 0.0])

    def conserved_quantities(self, t, y):
        s, e, i, r = components(y, 4, "SEIR")
        return {"total_population": s + e + i + r}
