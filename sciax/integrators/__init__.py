"""Fixed-step integrators with one interface: `init`, `step`, `state` (see `AbstractIntegrator`)."""

from ._base import AbstractIntegrator as AbstractIntegrator
from ._runge_kutta import (
    RK4 as RK4,
)
from ._runge_kutta import (
    AbstractExplicitRK as AbstractExplicitRK,
)
from ._runge_kutta import (
    ButcherTableau as ButcherTableau,
)
from ._runge_kutta import (
    Dopri5 as Dopri5,
)
from ._runge_kutta import (
    Dopri8 as Dopri8,
)
from ._runge_kutta import (
    Euler as Euler,
)
from ._runge_kutta import (
    ExplicitRK as ExplicitRK,
)
from ._runge_kutta import (
    Heun as Heun,
)
from ._runge_kutta import (
    Midpoint as Midpoint,
)
from ._runge_kutta import (
    Tsit5 as Tsit5,
)
from ._stochastic import EulerMaruyama as EulerMaruyama
from ._stochastic import LangevinBAOAB as LangevinBAOAB
from ._symplectic import Leapfrog as Leapfrog
from ._symplectic import VelocityVerlet as VelocityVerlet
from ._symplectic import Yoshida4 as Yoshida4
