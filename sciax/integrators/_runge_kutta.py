"""Explicit Runge–Kutta methods defined by Butcher tableaux.

For dy/dt = f(t, y) and step h, stage i is

    k_i = f(t + c_i h, y + h Σ_{j<i} a_ij k_j),      y_{n+1} = y_n + h Σ_i b_i k_i.

Works on any state pytree (arrays, tuples of scalars, `PhaseSpace`): the linear combinations
are taken leaf by leaf, and zero coefficients are skipped at trace time.
"""

import dataclasses
from typing import ClassVar

import diffrax as dfx
import equinox as eqx
import jax.tree_util as jtu
import numpy as np

from ..systems._base import AbstractODE, AbstractSDE
from ._base import AbstractIntegrator


@dataclasses.dataclass(frozen=True)
class ButcherTableau:
    """Coefficients of an explicit Runge–Kutta method (hashable: safe as static data).

    - `a`: lower-triangular rows, `a[i]` has `i` entries (row 0 is empty).
    - `b`: weights, one per stage. `c`: nodes, one per stage (`c[0] == 0`).
    - `order`: classical order of accuracy.
    """

    a: tuple[tuple[float, ...], ...]
    b: tuple[float, ...]
    c: tuple[float, ...]
    order: int

    def __post_init__(self):
        # Python floats, whatever was passed (NumPy arrays, float64 scalars): weakly typed, so a
        # float32 state stays float32, and hashable, so the tableau is usable as static data.
        try:
            a = tuple(tuple(float(x) for x in row) for row in self.a)
            b = tuple(float(x) for x in self.b)
            c = tuple(float(x) for x in self.c)
        except TypeError as err:
            raise ValueError("ButcherTableau: `a` must be a sequence of rows (sequences of numbers), `b` and "
                             f"`c` sequences of numbers; got a={self.a!r}, b={self.b!r}, c={self.c!r}.") from err
        if not all(np.isfinite(x) for x in (*b, *c, *(x for row in a for x in row))):
            raise ValueError(f"ButcherTableau: every coefficient must be finite, got a={a}, b={b}, c={c}.")
        if isinstance(self.order, bool) or not isinstance(self.order, int | np.integer) or self.order < 1:
            raise ValueError(f"ButcherTableau: `order` must be an integer >= 1, got {self.order!r}.")
        for name, value in (("a", a), ("b", b), ("c", c), ("order", int(self.order))):
            object.__setattr__(self, name, value)
        s = len(self.b)
        if len(self.c) != s or len(self.a) != s:
            raise ValueError(f"ButcherTableau: a, b and c must all have {s} stages.")
        for i, row in enumerate(self.a):
            if len(row) != i:
                raise ValueError(f"ButcherTableau: row a[{i}] must have {i} entries, got {len(row)}.")
            if abs(sum(row) - self.c[i]) > 1e-12:
                raise ValueError(f"ButcherTableau: row a[{i}] must sum to c[{i}] = {self.c[i]}.")
        if abs(sum(self.b) - 1.0) > 1e-12:
            raise ValueError(f"ButcherTableau: weights b must sum to 1, got {sum(self.b)}.")

    @classmethod
    def from_diffrax(cls, tableau: dfx.ButcherTableau, order: int) -> "ButcherTableau":
        """Take the solution weights of a Diffrax tableau (its error estimate is not needed)."""
        a = ((),) + tuple(tuple(float(x) for x in np.asarray(row)) for row in tableau.a_lower)
        b = tuple(float(x) for x in np.asarray(tableau.b_sol))
        c = (0.0,) + tuple(float(x) for x in np.asarray(tableau.c))
        return cls(a=a, b=b, c=c, order=order)


def _combine(y, h, coeffs, ks):
    """y + h Σ coeff_j k_j over a pytree, skipping zero coefficients."""
    terms = [(a, k) for a, k in zip(coeffs, ks) if a != 0.0]
    if not terms:
        return y
    return jtu.tree_map(lambda yi, *ki: yi + h * sum(a * kj for (a, _), kj in zip(terms, ki)), y,
                        *[k for _, k in terms])


class AbstractExplicitRK(AbstractIntegrator):
    """Explicit Runge–Kutta step from `self.tableau`."""

    tableau: eqx.AbstractVar[ButcherTableau]

    def step(self, system, t, y, dt, key, args):
        tab = self.tableau
        ks = []
        for i in range(len(tab.b)):
            yi = _combine(y, dt, tab.a[i], ks)
            ks.append(system.vector_field(t + tab.c[i] * dt, yi, args))
        return _combine(y, dt, tab.b, ks)

    def check_system(self, system) -> None:
        if not isinstance(system, AbstractODE):
            raise TypeError(
                f"{type(self).__name__} steps an AbstractODE (anything with vector_field), "
                f"got {type(system).__name__}."
            )
        if isinstance(system, AbstractSDE):
            raise TypeError(
                f"{type(self).__name__} is deterministic: on the SDE {type(system).__name__} it would integrate "
                "the drift alone and silently drop the noise. Use a stochastic integrator "
                "(sciax.integrators.EulerMaruyama) with a `key`."
            )


EULER = ButcherTableau(a=((),), b=(1.0,), c=(0.0,), order=1)
HEUN = ButcherTableau(a=((), (1.0,)), b=(0.5, 0.5), c=(0.0, 1.0), order=2)
MIDPOINT = ButcherTableau(a=((), (0.5,)), b=(0.0, 1.0), c=(0.0, 0.5), order=2)
RK4_TABLEAU = ButcherTableau(
    a=((), (0.5,), (0.0, 0.5), (0.0, 0.0, 1.0)),
    b=(1 / 6, 1 / 3, 1 / 3, 1 / 6),
    c=(0.0, 0.5, 0.5, 1.0),
    order=4,
)
DOPRI5 = ButcherTableau.from_diffrax(dfx.Dopri5.tableau, order=5)
TSIT5 = ButcherTableau.from_diffrax(dfx.Tsit5.tableau, order=5)
DOPRI8 = ButcherTableau.from_diffrax(dfx.Dopri8.tableau, order=8)


class Euler(AbstractExplicitRK):
    """Forward Euler, order 1: y_{n+1} = y_n + h f(t_n, y_n)."""

    tableau: ClassVar[ButcherTableau] = EULER
    order: ClassVar[int] = 1


class Heun(AbstractExplicitRK):
    """Heun's method (explicit trapezoid), order 2."""

    tableau: ClassVar[ButcherTableau] = HEUN
    order: ClassVar[int] = 2


class Midpoint(AbstractExplicitRK):
    """Explicit midpoint method, order 2."""

    tableau: ClassVar[ButcherTableau] = MIDPOINT
    order: ClassVar[int] = 2


class RK4(AbstractExplicitRK):
    """The classical fourth-order Runge–Kutta method."""

    tableau: ClassVar[ButcherTableau] = RK4_TABLEAU
    order: ClassVar[int] = 4


class Dopri5(AbstractExplicitRK):
    """Dormand–Prince 5(4) solution weights, used at a fixed step: order 5."""

    tableau: ClassVar[ButcherTableau] = DOPRI5
    order: ClassVar[int] = 5


class Tsit5(AbstractExplicitRK):
    """Tsitouras 5(4) solution weights, used at a fixed step: order 5 (the GPU-benchmark method)."""

    tableau: ClassVar[ButcherTableau] = TSIT5
    order: ClassVar[int] = 5


class Dopri8(AbstractExplicitRK):
    """Prince–Dormand 8(7) solution weights at a fixed step (Diffrax's `Dopri8` tableau: 14
    stages, of which 13 are used; XLA drops the unused one): order 8."""

    tableau: ClassVar[ButcherTableau] = DOPRI8
    order: ClassVar[int] = 8


class ExplicitRK(AbstractExplicitRK):
    """An explicit Runge–Kutta method from a user-supplied `ButcherTableau`.

    **Arguments:**

    - `tableau`: a `sciax.integrators.ButcherTableau`.
    """

    tableau: ButcherTableau = eqx.field(static=True)

    def __check_init__(self):
        if not isinstance(self.tableau, ButcherTableau):
            raise TypeError(f"ExplicitRK: `tableau` must be a ButcherTableau, got {type(self.tableau).__name__}.")

    @property
    def order(self):  # type: ignore[override]
        return self.tableau.order
