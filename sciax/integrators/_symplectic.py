"""Symplectic, time-reversible integrators for Hamiltonian particle systems.

All three conserve phase-space volume and a shadow Hamiltonian, so energy errors stay bounded
over long runs instead of drifting. Each is its own inverse under dt -> -dt (up to rounding),
which the reversible adjoint uses to rebuild states backwards in time.
"""

from typing import ClassVar

from .._phase_space import PhaseSpace
from ..systems._base import check_stepped_by_acceleration
from ._base import AbstractIntegrator


class _AbstractSymplectic(AbstractIntegrator):
    reversible: ClassVar[bool] = True

    def check_system(self, system) -> None:
        check_stepped_by_acceleration(type(self).__name__, system,
                                      instead="use a Runge–Kutta integrator for a general ODE")

def _verlet(system, state: PhaseSpace, accel, dt):
    """One kick–drift–kick step; returns the new state and the acceleration at the new positions."""
    v_half = state.velocities + 0.5 * dt * accel
    q1 = state.positions + dt * v_half
    a1 = system.acceleration(q1)
    v1 = v_half + 0.5 * dt * a1
    return PhaseSpace(q1, v1), a1

class VelocityVerlet(_AbstractSymplectic):
    """Velocity Verlet (kick–drift–kick), order 2, one force evaluation per step.

        v_{n+½} = v_n + (h/2) a(q_n)
        q_{n+1} = q_n + h v_{n+½}
        v_{n+1} = v_{n+½} + (h/2) a(q_{n+1})

    The carry is `(state, a(q_n))`, so the force at the new positions is reused next step.
    """

    order: ClassVar[int] = 2

    def init(self, system, t0, state, args):
        return state, system.acceleration(state.positions)

    def step(self, system, t, carry, dt, key, args):
        return _verlet(system, carry[0], carry[1], dt)

    def state(self, carry):
        return carry[0]

class Leapfrog(_AbstractSymplectic):
    """Position-Verlet leapfrog (drift–kick–drift), order 2.

        q_{n+½} = q_n + (h/2) v_n,   v_{n+1} = v_n + h a(q_{n+½}),   q_{n+1} = q_{n+½} + (h/2) v_{n+1}
    """

    order: ClassVar[int] = 2

    def step(self, system, t, state, dt, key, args):
        q_half = state.positions + 0.5 * dt * state.velocities
        v1 = state.velocities + dt * system.acceleration(q_half)
        return PhaseSpace(q_half + 0.5 * dt * v1, v1)

# Yoshida (1990) triple-jump weights: w1 h, w0 h, w1 h with 2 w1 + w0 = 1.
_CBRT2 = 2.0 ** (1.0 / 3.0)
_W1 = 1.0 / (2.0 - _CBRT2)
_W0 = -_CBRT2 / (2.0 - _CBRT2)

class Yoshida4(_AbstractSymplectic):
    """Yoshida's fourth-order symplectic composition of velocity Verlet.

    Three Verlet substeps of w₁h, w₀h, w₁h with w₁ = 1/(2 − 2^{1/3}), w₀ = −2^{1/3}/(2 − 2^{1/3}).
    Three force evaluations per step (the last acceleration is carried).
    """

    order: ClassVar[int] = 4

    def init(self, system, t0, state, args):
        return state, system.acceleration(state.positions)

    def step(self, system, t, carry, dt, key, args):
        state, accel = carry
        for w in (_W1, _W0, _W1):
            state, accel = _verlet(system, state, accel, w * dt)
        return state, accel

    def state(self, carry):
        return carry[0]
