"""Oscillators written as first-order ODEs: Van der Pol, damped–driven, pendulum, double pendulum."""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp

from .._validation import check_parameter
from ._base import AbstractODE, components, in_system_precision, like


def _stack_last(y, x, v):
    """Pack (x, v) like `y` for a tuple; for arrays put the components on the last axis."""
    if isinstance(y, tuple):
        return (x, v)
    return jnp.stack(jnp.broadcast_arrays(x, v), axis=-1)


class VanDerPol(AbstractODE):
    """Van der Pol relaxation oscillator, y = (x, v):

        dx/dt = v,   dv/dt = μ (1 − x²) v − x

    Dimensionless. Stiff for large μ (relaxation time ~ μ): use `solve(..., solver="kvaerno5")`.

    **Arguments:** `mu` (damping strength μ ≥ 0).
    """

    mu: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    n_components: ClassVar[int] = 2
    component_names: ClassVar[tuple[str, ...]] = ('x', 'v')

    def __check_init__(self):
        check_parameter("VanDerPol", "mu", self.mu)

    def vector_field(self, t, y, args=None):
        x, v = components(y, 2, "VanDerPol")
        return like(y, v, self.mu * (1 - x**2) * v - x)

    @in_system_precision
    def default_state(self):
        return jnp.array([2.0, 0.0])


class DampedDrivenOscillator(AbstractODE):
    """Linear oscillator with viscous damping and a harmonic drive, y = (x, v):

        ẍ + 2 ζ ω ẋ + ω² x = F cos(Ω t),   i.e.   dx/dt = v,   dv/dt = F cos(Ω t) − 2 ζ ω v − ω² x

    Units: x in length L, t in time T; ω and Ω in rad/T, ζ dimensionless, F in L/T²
    (a force per unit mass).

    The energy per unit mass E = ½ v² + ½ ω² x² (`energy`) is conserved only when ζ = 0 and
    F = 0. Parameters are array fields (possibly traced), so that cannot be decided when the
    system is built: `conserved_quantities` is empty and `energy` is offered as an observable.

    **Arguments:**

    - `omega`: natural angular frequency ω > 0 (rad/T).
    - `zeta`: damping ratio ζ ≥ 0 (ζ < 1 underdamped, = 1 critical, > 1 overdamped).
    - `drive_amplitude`: F (L/T²), default 0.
    - `drive_frequency`: Ω (rad/T), default 1.

    ```python
    osc = DampedDrivenOscillator(omega=2.0, zeta=0.1)
    traj = sciax.simulate(osc, osc.default_state(), integrator=RK4(), dt=0.01, n_steps=1000)
    ```
    """

    omega: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    zeta: jax.Array = eqx.field(converter=jnp.asarray, default=0.1)
    drive_amplitude: jax.Array = eqx.field(converter=jnp.asarray, default=0.0)
    drive_frequency: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    n_components: ClassVar[int] = 2
    component_names: ClassVar[tuple[str, ...]] = ('x', 'v')

    def __check_init__(self):
        name = "DampedDrivenOscillator"
        check_parameter(name, "omega", self.omega, strict=True)
        check_parameter(name, "zeta", self.zeta)

    def vector_field(self, t, y, args=None):
        x, v = components(y, 2, "DampedDrivenOscillator")
        w = self.omega
        drive = self.drive_amplitude * jnp.cos(self.drive_frequency * t)
        return like(y, v, drive - 2 * self.zeta * w * v - w**2 * x)

    def energy(self, y):
        """Energy per unit mass ½ v² + ½ ω² x² (L²/T²)."""
        x, v = components(y, 2, "DampedDrivenOscillator")
        return 0.5 * v**2 + 0.5 * self.omega**2 * x**2

    def exact(self, y0, t):
        """The exact state at time `t` from `y0` at time 0, for the underdamped case ζ < 1.

        The steady-state response x_p = A cos Ωt + B sin Ωt, with
        D = (ω² − Ω²)² + (2ζωΩ)², A = F (ω² − Ω²)/D, B = 2 F ζ ω Ω / D, plus the decaying
        homogeneous solution e^{−ζωt}[a cos ω_d t + b sin ω_d t], ω_d = ω √(1 − ζ²), that
        matches `y0`. Without a drive (F = 0) the steady-state part is 0 for every Ω. Undefined
        (division by zero) at driven undamped resonance F ≠ 0, ζ = 0, Ω = ω, and for ζ ≥ 1.

        **Arguments:** `y0` (shape `(2,)` array or a tuple of two scalars), `t` (scalar or
        array of times).

        **Returns:** a tuple `(x, v)` if `y0` is a tuple, else an array of shape
        `jnp.shape(t) + (2,)` (the layout of `Trajectory.states`).
        """
        x0, v0 = components(y0, 2, "DampedDrivenOscillator")
        t = jnp.asarray(t)
        w, z = self.omega, self.zeta
        f, big_w = self.drive_amplitude, self.drive_frequency
        denominator = (w**2 - big_w**2) ** 2 + (2 * z * w * big_w) ** 2
        # F = 0 has no particular part even at Ω = ω, ζ = 0, where D = 0: replace only that 0/0
        # (F · anything / 1 = 0), so ∂/∂F at F = 0 keeps its value (ω² − Ω²)/D elsewhere.
        denominator = jnp.where((f == 0) & (denominator == 0), 1, denominator)
        a_p = f * (w**2 - big_w**2) / denominator
        b_p = f * 2 * z * w * big_w / denominator
        xh0 = x0 - a_p
        vh0 = v0 - b_p * big_w
        wd = w * jnp.sqrt(1 - z**2)
        decay = jnp.exp(-z * w * t)
        c, s = jnp.cos(wd * t), jnp.sin(wd * t)
        xh = decay * (xh0 * c + (vh0 + z * w * xh0) / wd * s)
        vh = decay * (vh0 * c - (w**2 * xh0 + z * w * vh0) / wd * s)
        cp, sp = jnp.cos(big_w * t), jnp.sin(big_w * t)
        x = xh + a_p * cp + b_p * sp
        v = vh + big_w * (b_p * cp - a_p * sp)
        return _stack_last(y0, x, v)

    @in_system_precision
    def default_state(self):
        return jnp.array([1.0, 0.0])


class Pendulum(AbstractODE):
    """Simple (rigid, point-mass) pendulum with linear damping, y = (θ, ω_θ):

        dθ/dt = ω_θ,   dω_θ/dt = −(g/L) sin θ − γ ω_θ

    θ in radians from the downward vertical, ω_θ in rad/s, g in m/s², L in m, γ in 1/s.
    The energy per unit mass E = ½ L² ω_θ² + g L (1 − cos θ) (J/kg, `energy`) is conserved
    when γ = 0; as with `DampedDrivenOscillator`, `conserved_quantities` is empty because γ
    is an array field whose value may be traced. `period(amplitude)` is the exact period of
    the undamped pendulum.

    **Arguments:** `gravity` g > 0 (default 9.81 m/s²), `length` L > 0 (default 1 m),
    `damping` γ ≥ 0 (default 0, 1/s).
    """

    gravity: jax.Array = eqx.field(converter=jnp.asarray, default=9.81)
    length: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    damping: jax.Array = eqx.field(converter=jnp.asarray, default=0.0)
    n_components: ClassVar[int] = 2
    component_names: ClassVar[tuple[str, ...]] = ('theta', 'omega')

    def __check_init__(self):
        check_parameter("Pendulum", "gravity", self.gravity, strict=True)
        check_parameter("Pendulum", "length", self.length, strict=True)
        check_parameter("Pendulum", "damping", self.damping)

    def vector_field(self, t, y, args=None):
        theta, omega = components(y, 2, "Pendulum")
        return like(y, omega, -(self.gravity / self.length) * jnp.sin(theta) - self.damping * omega)

    def energy(self, y):
        """Energy per unit mass ½ L² ω² + g L (1 − cos θ) (J/kg)."""
        theta, omega = components(y, 2, "Pendulum")
        return 0.5 * self.length**2 * omega**2 + self.gravity * self.length * (1 - jnp.cos(theta))

    def period(self, amplitude):
        """Exact period (s) of the undamped pendulum released at rest from `amplitude` θ₀ (rad).

        T = 4 √(L/g) K(sin²(θ₀/2)) = 2π √(L/g) / AGM(1, cos(θ₀/2)), with the arithmetic–
        geometric mean iterated to convergence (|θ₀| < π).
        """
        b = jnp.cos(jnp.asarray(amplitude) / 2)
        a = jnp.ones_like(b)
        for _ in range(12):  # quadratic convergence: 12 iterations reach float64 precision
            a, b = 0.5 * (a + b), jnp.sqrt(a * b)
        return 2 * jnp.pi * jnp.sqrt(self.length / self.gravity) / a

    @in_system_precision
    def default_state(self):
        return jnp.array([1.0, 0.0])


class DoublePendulum(AbstractODE):
    """Planar double pendulum: point masses m₁, m₂ on massless rigid rods l₁, l₂,
    y = (θ₁, θ₂, ω₁, ω₂), angles in radians from the downward vertical.

    From the Lagrangian L = T − V with

        T = ½ (m₁ + m₂) l₁² ω₁² + ½ m₂ l₂² ω₂² + m₂ l₁ l₂ ω₁ ω₂ cos(θ₁ − θ₂)
        V = −(m₁ + m₂) g l₁ cos θ₁ − m₂ g l₂ cos θ₂

    the equations of motion are (Δ = θ₁ − θ₂, D = 2m₁ + m₂ − m₂ cos 2Δ)

        dω₁/dt = [−g (2m₁ + m₂) sin θ₁ − m₂ g sin(θ₁ − 2θ₂)
                  − 2 sin Δ m₂ (ω₂² l₂ + ω₁² l₁ cos Δ)] / (l₁ D)
        dω₂/dt = [2 sin Δ (ω₁² l₁ (m₁ + m₂) + g (m₁ + m₂) cos θ₁ + ω₂² l₂ m₂ cos Δ)] / (l₂ D)

    Units: kg, m, s (g in m/s²); the energy T + V is in J and is conserved.
    Chaotic for large amplitudes.

    **Arguments:** `mass1`, `mass2` (kg, > 0), `length1`, `length2` (m, > 0),
    `gravity` (m/s², ≥ 0). Defaults: 1 kg, 1 kg, 1 m, 1 m, 9.81 m/s².
    """

    mass1: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    mass2: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    length1: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    length2: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    gravity: jax.Array = eqx.field(converter=jnp.asarray, default=9.81)
    n_components: ClassVar[int] = 4
    component_names: ClassVar[tuple[str, ...]] = ('theta1', 'theta2', 'omega1', 'omega2')

    def __check_init__(self):
        for name in ("mass1", "mass2", "length1", "length2"):
            check_parameter("DoublePendulum", name, getattr(self, name), strict=True)
        check_parameter("DoublePendulum", "gravity", self.gravity)

    def vector_field(self, t, y, args=None):
        th1, th2, w1, w2 = components(y, 4, "DoublePendulum")
        m1, m2, l1, l2, g = self.mass1, self.mass2, self.length1, self.length2, self.gravity
        delta = th1 - th2
        sin_d, cos_d = jnp.sin(delta), jnp.cos(delta)
        den = 2 * m1 + m2 - m2 * jnp.cos(2 * delta)
        a1 = (
            -g * (2 * m1 + m2) * jnp.sin(th1)
            - m2 * g * jnp.sin(th1 - 2 * th2)
            - 2 * sin_d * m2 * (w2**2 * l2 + w1**2 * l1 * cos_d)
        ) / (l1 * den)
        a2 = (
            2 * sin_d * (w1**2 * l1 * (m1 + m2) + g * (m1 + m2) * jnp.cos(th1) + w2**2 * l2 * m2 * cos_d)
        ) / (l2 * den)
        return like(y, w1, w2, a1, a2)

    def energy(self, y):
        """Total energy T + V (J), zero of V at the pivot height."""
        th1, th2, w1, w2 = components(y, 4, "DoublePendulum")
        m1, m2, l1, l2, g = self.mass1, self.mass2, self.length1, self.length2, self.gravity
        kinetic = (0.5 * (m1 + m2) * l1**2 * w1**2 + 0.5 * m2 * l2**2 * w2**2
                   + m2 * l1 * l2 * w1 * w2 * jnp.cos(th1 - th2))
        potential = -(m1 + m2) * g * l1 * jnp.cos(th1) - m2 * g * l2 * jnp.cos(th2)
        return kinetic + potential

    def cartesian(self, y):
        """Bob positions (x₁, y₁, x₂, y₂) in m, pivot at the origin, y pointing up."""
        th1, th2, _, _ = components(y, 4, "DoublePendulum")
        x1, y1 = self.length1 * jnp.sin(th1), -self.length1 * jnp.cos(th1)
        x2, y2 = x1 + self.length2 * jnp.sin(th2), y1 - self.length2 * jnp.cos(th2)
        return like(y, x1, y1, x2, y2)

    @in_system_precision
    def default_state(self):
        return jnp.array([jnp.pi / 2, jnp.pi / 2, 0.0, 0.0])

    def conserved_quantities(self, t, y):
        return {"energy": self.energy(y)}
