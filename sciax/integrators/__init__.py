"""Fixed-step integrators with one interface: `init`, `step`, `state` (see `AbstractIntegrator`)."""

from ._base import AbstractIntegrator as AbstractIntegrator
from ._runge_kutta import (
    RK4 as RK4,
    AbstractExplicitRK as AbstractExplicitRK,
    ButcherTableau as ButcherTableau,
    Dopri5 as Dopri5,
    Dopri8 as Dopri8,
    Euler as Euler,
    ExplicitRK as ExplicitRK,
    Heun as Heun,
    Midpoint as Midpoint,
    Tsit5 as Tsit5,
)
from ._stochastic import EulerMaruyama as EulerMaruyama, LangevinBAOAB as LangevinBAOAB
from ._symplectic import Leapfrog as Leapfrog, VelocityVerlet as VelocityVerlet, Yoshida4 as Yoshida4
