"""Parameter transforms: the optimiser works in an unconstrained space, results are physical.

A transform maps an unconstrained value `z` (any real number) to a physical value
`x = to_physical(z)`, elementwise. The optimiser moves `z`; everything reported by `fit`
(`params`, `covariance`, `standard_errors`) is in physical units.

Uncertainties are propagated with the delta method: with `D = diag(dx/dz)` at the optimum,
`Cov(x) = D Cov(z) D`. `fit` obtains exactly this from the Jacobian with respect to the
physical values, `J_x = J_z D⁻¹` (chain rule), taking `J_z` from the solver's last
linearisation; where `D` is nearly zero (a `Bounded` value pinned at a bound, |dx/dz| below
√(smallest normal number)) it differentiates with respect to the physical values directly.
"""

import math
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._validation import real_scalar


class AbstractTransform(eqx.Module):
    """Elementwise bijection between an unconstrained value `z` and a physical value `x`."""

    fixed: ClassVar[bool] = False

    def to_physical(self, z):
        raise NotImplementedError

    def to_unconstrained(self, x):
        raise NotImplementedError

    def check(self, name: str, x) -> None:
        """Raise `ValueError` if the (host) value `x` lies outside this transform's domain."""

    def at_bound(self, x, standard_error) -> np.ndarray:
        """Where the fitted value `x` lies within one standard error of a bound of the domain
        (host arrays), so that the Gaussian approximation does not hold there."""
        return np.zeros(np.shape(x), bool)

    def describe(self) -> str:
        return f"{type(self).__name__}()"


class Identity(AbstractTransform):
    """No constraint: `x = z` (the default for every fitted value)."""

    def to_physical(self, z):
        return z

    def to_unconstrained(self, x):
        return x

    def check(self, name, x):
        if not np.all(np.isfinite(x)):
            raise ValueError(f"fit: the initial value of `{name}` must be finite, got {_show(x)}.")


class Positive(AbstractTransform):
    """Strictly positive values through a log: `x = exp(z)`, `z = log(x)`.

    The initial value must be > 0. Rates, masses, stiffnesses and frequencies are typical uses.
    """

    def to_physical(self, z):
        return jnp.exp(z)

    def to_unconstrained(self, x):
        return jnp.log(x)

    def check(self, name, x):
        if not np.all(np.isfinite(x) & (x > 0)):
            raise ValueError(
                f"fit: Positive() on `{name}` needs a positive, finite initial value, got "
                f"{_show(x)}. Start from a positive guess, or use Identity()/Bounded(...) if the "
                "parameter may be negative."
            )


class Bounded(AbstractTransform):
    """Values in the open interval (lower, upper) through a logistic sigmoid:

        x = lower + (upper − lower) · σ(z),   z = log(p) − log(1 − p),   p = (x − lower)/(upper − lower)

    **Arguments:** `lower` < `upper`, finite floats in the parameter's units. The initial value
    must lie strictly inside.
    """

    lower: float
    upper: float

    def __init__(self, lower, upper):
        lower, upper = real_scalar("lower", lower, owner="Bounded"), real_scalar("upper", upper, owner="Bounded")
        if not (math.isfinite(lower) and math.isfinite(upper) and lower < upper):
            raise ValueError(
                f"Bounded(lower, upper) needs finite bounds with lower < upper, got lower={lower!r}, "
                f"upper={upper!r}; use Positive() for a bound on one side only."
            )
        self.lower = lower
        self.upper = upper

    def to_physical(self, z):
        return self.lower + (self.upper - self.lower) * jax.nn.sigmoid(z)

    def to_unconstrained(self, x):
        p = (x - self.lower) / (self.upper - self.lower)
        return jnp.log(p) - jnp.log1p(-p)

    def check(self, name, x):
        if not np.all(np.isfinite(x) & (x > self.lower) & (x < self.upper)):
            raise ValueError(
                f"fit: {self.describe()} on `{name}` needs an initial value strictly inside "
                f"({self.lower:g}, {self.upper:g}), got {_show(x)}."
            )

    def at_bound(self, x, standard_error):
        # An optimum on or beyond a bound drives z towards ±∞ and x onto the bound; an interior
        # optimum closer to a bound than its standard error is flagged too (the band would cross it).
        return np.minimum(np.asarray(x) - self.lower, self.upper - np.asarray(x)) <= np.asarray(standard_error)

    def describe(self) -> str:
        return f"Bounded({self.lower:g}, {self.upper:g})"


class Fixed(AbstractTransform):
    """Hold a selected value at its initial value: it is reported but not fitted (standard
    error 0). Useful to freeze part of a filter-selected set of parameters."""

    fixed: ClassVar[bool] = True

    def to_physical(self, z):
        return z

    def to_unconstrained(self, x):
        return x


def _show(x) -> str:
    x = np.asarray(x)
    if x.ndim == 0:
        return repr(x.item())
    return f"an array of shape {x.shape} with values {np.array2string(x, threshold=6, precision=6)}"
