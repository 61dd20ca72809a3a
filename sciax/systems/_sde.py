"""Itô stochastic differential equations with diagonal noise and known moments."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu

from .._validation import check_parameter
from ._base import AbstractSDE, in_system_precision


class OrnsteinUhlenbeck(AbstractSDE):
    """Ornstein–Uhlenbeck process, elementwise on a state of any shape (or pytree of arrays):

        dX = θ (μ − X) dt + σ dW

    Units: X in any unit u, t in time T; θ in 1/T, μ in u, σ in u/√T. Gaussian with

        E[X_t] = μ + (X₀ − μ) e^{−θt},   Var[X_t] = σ² (1 − e^{−2θt}) / (2θ)

    for a deterministic X₀; stationary variance σ²/(2θ).

    **Arguments:** `theta` θ > 0 (mean-reversion rate), `mu` μ (long-run mean), `sigma`
    σ ≥ 0 (noise amplitude). Each may be a scalar or broadcast against the state.
    """

    theta: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    mu: jax.Array = eqx.field(converter=jnp.asarray, default=0.0)
    sigma: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)

    def __check_init__(self):
        check_parameter("OrnsteinUhlenbeck", "theta", self.theta, strict=True)
        check_parameter("OrnsteinUhlenbeck", "sigma", self.sigma)

    def vector_field(self, t, y, args=None):
        return jtu.tree_map(lambda x: self.theta * (self.mu - x), y)

    def diffusion(self, t, y, args=None):
        return jtu.tree_map(lambda x: self.sigma * jnp.ones_like(x), y)

    def mean(self, y0, t):
        """E[X_t] = μ + (X₀ − μ) e^{−θt} (elementwise over `y0`)."""
        decay = jnp.exp(-self.theta * jnp.asarray(t))
        return jtu.tree_map(lambda x0: self.mu + (x0 - self.mu) * decay, y0)

    def variance(self, t):
        """Var[X_t] = σ² (1 − e^{−2θt}) / (2θ) for a deterministic initial state."""
        return -self.sigma**2 * jnp.expm1(-2 * self.theta * jnp.asarray(t)) / (2 * self.theta)

    def stationary_variance(self):
        """σ² / (2θ)."""
        return self.sigma**2 / (2 * self.theta)

    @in_system_precision
    def default_state(self):
        return jnp.array([1.0])


class GeometricBrownianMotion(AbstractSDE):
    """Geometric Brownian motion (Black–Scholes asset price), elementwise:

        dS = μ S dt + σ S dW

    t in time T; μ (drift) in 1/T, σ (volatility) in 1/√T. Exact solution
    S_t = S₀ exp((μ − σ²/2) t + σ W_t), so E[S_t] = S₀ e^{μt} and
    Var[S_t] = S₀² e^{2μt} (e^{σ²t} − 1). S stays positive if S₀ > 0.

    **Arguments:** `mu` μ (default 0.05), `sigma` σ ≥ 0 (default 0.2).
    """

    mu: jax.Array = eqx.field(converter=jnp.asarray, default=0.05)
    sigma: jax.Array = eqx.field(converter=jnp.asarray, default=0.2)

    def __check_init__(self):
        check_parameter("GeometricBrownianMotion", "sigma", self.sigma)

    def vector_field(self, t, y, args=None):
        return jtu.tree_map(lambda s: self.mu * s, y)

    def diffusion(self, t, y, args=None):
        return jtu.tree_map(lambda s: self.sigma * s, y)

    def mean(self, y0, t):
        """E[S_t] = S₀ e^{μt}."""
        growth = jnp.exp(self.mu * jnp.asarray(t))
        return jtu.tree_map(lambda s0: s0 * growth, y0)

    def variance(self, y0, t):
        """Var[S_t] = S₀² e^{2μt} (e^{σ²t} − 1)."""
        t = jnp.asarray(t)
        factor = jnp.exp(2 * self.mu * t) * jnp.expm1(self.sigma**2 * t)
        return jtu.tree_map(lambda s0: s0**2 * factor, y0)

    def exact(self, y0, t, brownian):
        """S_t = S₀ exp((μ − σ²/2) t + σ W_t) given the Brownian value W_t (`brownian`)."""
        t = jnp.asarray(t)
        return jtu.tree_map(
            lambda s0, w: s0 * jnp.exp((self.mu - 0.5 * self.sigma**2) * t + self.sigma * w), y0, brownian
        )

    @in_system_precision
    def default_state(self):
        return jnp.array([1.0])
