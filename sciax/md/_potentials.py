r"""Pair potentials: Lennard-Jones, WCA, Morse, soft sphere, mixtures and sums.

Each potential writes its pair function $\varphi(r)$ once, as a function of $r^2$ (`_bare`),
for one pair of species. The cutoff, the energy or force shift and the masking of pairs beyond
the cutoff (the double-`where` pattern, so gradients stay finite there) are applied in one
place, `AbstractPairPotential.pair_energy_r2`. Forces and the virial are derivatives of that
same expression, taken by automatic differentiation wherever the pairs come from.
"""

import math
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._validation import describe, is_concrete

Shift = Literal["none", "energy", "force"]
_SHIFTS = ("none", "energy", "force")


def _check_shift(name: str, shift) -> None:
    if shift not in _SHIFTS:
        raise ValueError(f"{name}: `shift` must be one of {list(_SHIFTS)}, got {shift!r}.")


def _check_positive(name: str, argument: str, value, *, allow_zero: bool = False) -> None:
    if not jnp.issubdtype(jnp.result_type(value), jnp.floating):
        raise TypeError(f"{name}: `{argument}` must be floating point, got {describe(value)}.")
    if is_concrete(value):
        v = np.asarray(value)
        ok = np.all(v >= 0) if allow_zero else np.all(v > 0)
        if not (ok and np.all(np.isfinite(v))):
            relation = "non-negative" if allow_zero else "positive"
            shown = v.item() if v.ndim == 0 else f"an array with minimum {np.nanmin(v)!r}"
            raise ValueError(f"{name}: `{argument}` must be {relation} and finite, got {shown}.")


def _species_parameter(name: str, argument: str, value) -> int | None:
    """The number of species a parameter describes: None for a scalar, n for (n,) or (n, n)."""
    shape = jnp.shape(value)
    if len(shape) == 0:
        return None
    if len(shape) == 1 or (len(shape) == 2 and shape[0] == shape[1]):
        if len(shape) == 2 and is_concrete(value) and not np.allclose(np.asarray(value), np.asarray(value).T):
            raise ValueError(f"{name}: the pair table `{argument}` must be symmetric, got {np.asarray(value)!r}.")
        return shape[0]
    raise ValueError(f"{name}: `{argument}` must be a scalar, a per-species array (n_species,) or a symmetric "
                     f"pair table (n_species, n_species), got {describe(value)}.")


def _pair_value(value, species_i, species_j, rule: Literal["arithmetic", "geometric"]):
    """The parameter of the pair (i, j): a scalar as is, a per-species array mixed by `rule`
    (Lorentz–Berthelot: arithmetic mean for lengths, geometric mean for energies), a table
    indexed directly."""
    if value.ndim == 0:
        return value
    if value.ndim == 2:
        return value[species_i, species_j]
    a, b = value[species_i], value[species_j]
    return 0.5 * (a + b) if rule == "arithmetic" else jnp.sqrt(a * b)


class AbstractPairPotential(eqx.Module):
    r"""A pair potential $U = \sum_{i<j} \varphi_{s_i s_j}(r_{ij})$ truncated at `cutoff`.

    Subclasses define `_bare(r2, species_i, species_j)`, the untruncated $\varphi$ as a function of
    $r^2$. With `shift="energy"` the energy is $\varphi(r) - \varphi(r_c)$; with `shift="force"`
    it is $\varphi(r) - \varphi(r_c) - (r - r_c)\varphi'(r_c)$ (energy and force both continuous).
    """

    cutoff: eqx.AbstractVar[jax.Array]
    shift: eqx.AbstractVar[str]

    def _bare(self, r2, species_i, species_j):
        raise NotImplementedError

    @property
    def n_species(self) -> int | None:
        """Species the parameters describe (None: one set of parameters for every pair)."""
        return None

    def pair_energy_r2(self, r2, species_i=None, species_j=None) -> jax.Array:
        """$\\varphi(r)$ as a function of $r^2$ (length² units), elementwise; exactly 0 where
        $r \\geq r_c$ (including padded slots, given $r^2 = \\infty$) with zero, finite gradients."""
        rc = self.cutoff.astype(jnp.result_type(r2, self.cutoff))
        rc2 = rc * rc
        inside = r2 < rc2
        safe = jnp.where(inside, r2, rc2)  # the double-where: the masked branch is evaluated at rc
        phi = self._bare(safe, species_i, species_j)
        if self.shift != "none":
            phi = phi - self._bare(rc2, species_i, species_j)
        if self.shift == "force":
            at_cutoff = jnp.broadcast_to(rc2, phi.shape)
            dphi_dr2 = jax.grad(lambda x: jnp.sum(self._bare(x, species_i, species_j)))(at_cutoff)
            phi = phi - (jnp.sqrt(safe) - rc) * 2 * rc * dphi_dr2
        return jnp.where(inside, phi, jnp.zeros((), phi.dtype))

    def pair_energy(self, r, species_i=None, species_j=None) -> jax.Array:
        """$\\varphi(r)$ with the chosen shift, elementwise over any shape; exactly 0 for
        $r \\geq r_c$, with finite gradients there and at padded slots.

        **Arguments:** `r` distances (length units); `species_i`, `species_j` int arrays
        broadcastable with `r` (omit them for a single species).

        **Returns:** energies, shape of `r`, energy units.
        """
        inside = r < self.cutoff
        safe = jnp.where(inside, r, jnp.zeros((), r.dtype))  # r = inf beyond: keep 2r out of the gradient
        phi = self.pair_energy_r2(jnp.where(inside, safe * safe, jnp.inf), species_i, species_j)
        return jnp.where(inside, phi, jnp.zeros((), phi.dtype))

    @property
    def pair_terms(self) -> tuple:
        return (self,)

    @property
    def bonded_terms(self) -> tuple:
        return ()

    def __add__(self, other):
        return PotentialSum((self, other))


class LennardJones(AbstractPairPotential):
    r"""Lennard-Jones $\varphi(r) = 4\varepsilon[(\sigma/r)^{12} - (\sigma/r)^6]$ cut at $r_c$.

    **Arguments:**

    - `epsilon` ε (energy units), `sigma` σ (length units): scalars; or per-species arrays
      `(n_species,)`, mixed by the Lorentz–Berthelot rules $\sigma_{ab} = (\sigma_a + \sigma_b)/2$,
      $\varepsilon_{ab} = \sqrt{\varepsilon_a \varepsilon_b}$; or symmetric pair tables
      `(n_species, n_species)`.
    - `cutoff` $r_c$ (length units, scalar), default 2.5.
    - `shift`: `"none"` (plain truncation, as LAMMPS `pair_style lj/cut`), `"energy"` or
      `"force"`.

    Tail corrections for the truncated part (`tail_energy`, `tail_pressure`) assume a uniform
    fluid beyond $r_c$ ($g(r) = 1$).

    **Raises:** `ValueError` for a non-positive `epsilon`, `sigma` or `cutoff` (host values), an
    unknown `shift`, or parameter shapes that are neither scalars, per-species arrays nor tables.
    """

    epsilon: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    sigma: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    cutoff: jax.Array = eqx.field(converter=jnp.asarray, default=2.5)
    shift: str = eqx.field(static=True, default="none")

    def __check_init__(self):
        name = type(self).__name__
        _check_shift(name, self.shift)
        _check_positive(name, "epsilon", self.epsilon, allow_zero=True)
        _check_positive(name, "sigma", self.sigma)
        _check_positive(name, "cutoff", self.cutoff)
        if jnp.ndim(self.cutoff) != 0:
            raise ValueError(f"{name}: `cutoff` must be a scalar, got {describe(self.cutoff)}.")
        ne = _species_parameter(name, "epsilon", self.epsilon)
        ns = _species_parameter(name, "sigma", self.sigma)
        if ne is not None and ns is not None and ne != ns:
            raise ValueError(f"{name}: `epsilon` and `sigma` describe different numbers of species: "
                             f"shapes {jnp.shape(self.epsilon)} and {jnp.shape(self.sigma)}.")

    @property
    def n_species(self):
        return _species_parameter(type(self).__name__, "epsilon", self.epsilon) or \
            _species_parameter(type(self).__name__, "sigma", self.sigma)

    def _bare(self, r2, species_i, species_j):
        eps = _pair_value(self.epsilon, species_i, species_j, "geometric")
        sig = _pair_value(self.sigma, species_i, species_j, "arithmetic")
        s2 = sig * sig / r2
        s6 = s2 * s2 * s2
        return 4 * eps * (s6 * s6 - s6)

    def _tail_integrals(self, mole_fractions):
        """Σ_ab x_a x_b ε_ab σ_ab³ [ (σ_ab/rc)^9 / 3 - (σ_ab/rc)^3 ] and the pressure analogue."""
        n = self.n_species
        if n is None:
            eps, sig, x = self.epsilon, self.sigma, jnp.ones(())
            weights = x
        else:
            if mole_fractions is None:
                raise ValueError(f"{type(self).__name__}.tail_energy: a mixture of {n} species needs "
                                 f"`mole_fractions` of shape ({n},).")
            x = jnp.asarray(mole_fractions)
            if x.shape != (n,):
                raise ValueError(f"{type(self).__name__}: `mole_fractions` must have shape ({n},), got {describe(x)}.")
            a, b = jnp.meshgrid(jnp.arange(n), jnp.arange(n), indexing="ij")
            eps = _pair_value(self.epsilon, a, b, "geometric")
            sig = _pair_value(self.sigma, a, b, "arithmetic")
            weights = x[:, None] * x[None, :]
        u = sig / self.cutoff
        u3 = u**3
        u9 = u3**3
        energy = jnp.sum(weights * eps * sig**3 * (u9 / 3 - u3))
        pressure = jnp.sum(weights * eps * sig**3 * (2 * u9 / 3 - u3))
        return energy, pressure

    def _check_tail(self, method):
        if self.shift != "none":
            raise ValueError(f"{type(self).__name__}.{method}: tail corrections are for the plainly truncated "
                             f"potential (shift='none'); this one has shift={self.shift!r}, whose in-range shift "
                             f"they would not account for.")

    def tail_energy(self, density, mole_fractions=None) -> jax.Array:
        r"""Energy per particle missing beyond the cutoff, for a uniform fluid:
        $u_\mathrm{tail} = \frac{8}{3}\pi\rho\,\varepsilon\sigma^3[\frac{1}{3}(\sigma/r_c)^9 - (\sigma/r_c)^3]$
        (mixtures: summed over pairs weighted by $x_a x_b$).

        **Arguments:** `density` ρ = N/V (length⁻³); `mole_fractions` `(n_species,)` for a mixture.

        **Returns:** energy units per particle.

        **Raises:** `ValueError` for a shifted potential or a mixture without `mole_fractions`.
        """
        self._check_tail("tail_energy")
        e, _ = self._tail_integrals(mole_fractions)
        return 8.0 / 3.0 * math.pi * density * e

    def tail_pressure(self, density, mole_fractions=None) -> jax.Array:
        r"""Pressure missing beyond the cutoff, for a uniform fluid:
        $P_\mathrm{tail} = \frac{16}{3}\pi\rho^2\varepsilon\sigma^3[\frac{2}{3}(\sigma/r_c)^9 - (\sigma/r_c)^3]$.

        **Arguments:** as `tail_energy`. **Returns:** pressure units (energy / length³).
        """
        self._check_tail("tail_pressure")
        _, p = self._tail_integrals(mole_fractions)
        return 16.0 / 3.0 * math.pi * density**2 * p


def WCA(epsilon=1.0, sigma=1.0) -> LennardJones:
    r"""Weeks–Chandler–Andersen repulsion: Lennard-Jones cut at $2^{1/6}\sigma$ and shifted up by ε,
    $\varphi(r) = 4\varepsilon[(\sigma/r)^{12} - (\sigma/r)^6] + \varepsilon$ for $r < 2^{1/6}\sigma$.

    **Arguments:** `epsilon` (energy units), `sigma` (length units), scalars (for mixtures use
    `LennardJones(..., cutoff=2**(1/6) * sigma_max, shift="energy")` with a single cutoff).

    **Returns:** a `LennardJones` with `cutoff = 2^{1/6} σ` and `shift="energy"`.
    """
    sigma = jnp.asarray(sigma)
    if jnp.ndim(sigma) != 0:
        raise ValueError(f"WCA: `sigma` must be a scalar (the cutoff is 2^(1/6) sigma), got {describe(sigma)}.")
    return LennardJones(epsilon=epsilon, sigma=sigma, cutoff=2.0 ** (1.0 / 6.0) * sigma, shift="energy")


class Morse(AbstractPairPotential):
    r"""Morse $\varphi(r) = D[1 - e^{-\alpha(r - r_0)}]^2 - D$ cut at $r_c$ (ASE's `MorsePotential`
    convention, ε = D, ρ₀ = α r₀).

    **Arguments:** `depth` D (energy units), `alpha` α (1/length), `r0` r₀ (length units):
    scalars, per-species arrays (mixed: D and α geometric, r₀ arithmetic) or tables; `cutoff`
    (length units); `shift` as for `LennardJones`.
    """

    depth: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    alpha: jax.Array = eqx.field(converter=jnp.asarray, default=6.0)
    r0: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    cutoff: jax.Array = eqx.field(converter=jnp.asarray, default=2.5)
    shift: str = eqx.field(static=True, default="none")

    def __check_init__(self):
        name = type(self).__name__
        _check_shift(name, self.shift)
        _check_positive(name, "depth", self.depth, allow_zero=True)
        _check_positive(name, "alpha", self.alpha)
        _check_positive(name, "r0", self.r0)
        _check_positive(name, "cutoff", self.cutoff)
        if jnp.ndim(self.cutoff) != 0:
            raise ValueError(f"{name}: `cutoff` must be a scalar, got {describe(self.cutoff)}.")
        counts = {_species_parameter(name, a, getattr(self, a)) for a in ("depth", "alpha", "r0")} - {None}
        if len(counts) > 1:
            raise ValueError(f"{name}: `depth`, `alpha` and `r0` describe different numbers of species: "
                             f"{sorted(counts)}.")

    @property
    def n_species(self):
        counts = {_species_parameter("Morse", a, getattr(self, a)) for a in ("depth", "alpha", "r0")} - {None}
        return counts.pop() if counts else None

    def _bare(self, r2, species_i, species_j):
        depth = _pair_value(self.depth, species_i, species_j, "geometric")
        alpha = _pair_value(self.alpha, species_i, species_j, "geometric")
        r0 = _pair_value(self.r0, species_i, species_j, "arithmetic")
        e = jnp.exp(-alpha * (jnp.sqrt(r2) - r0))
        return depth * (e * e - 2 * e)


class SoftSphere(AbstractPairPotential):
    r"""Soft-sphere repulsion $\varphi(r) = \varepsilon(\sigma/r)^n$ cut at $r_c$.

    **Arguments:** `epsilon` (energy units), `sigma` (length units), scalars, per-species
    arrays or tables; `exponent` n (dimensionless, scalar array, default 12); `cutoff`
    (length units); `shift` as for `LennardJones` (default `"energy"`).
    """

    epsilon: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    sigma: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    exponent: jax.Array = eqx.field(converter=jnp.asarray, default=12.0)
    cutoff: jax.Array = eqx.field(converter=jnp.asarray, default=2.5)
    shift: str = eqx.field(static=True, default="energy")

    def __check_init__(self):
        name = type(self).__name__
        _check_shift(name, self.shift)
        _check_positive(name, "epsilon", self.epsilon, allow_zero=True)
        _check_positive(name, "sigma", self.sigma)
        _check_positive(name, "exponent", self.exponent)
        _check_positive(name, "cutoff", self.cutoff)
        if jnp.ndim(self.exponent) != 0 or jnp.ndim(self.cutoff) != 0:
            raise ValueError(f"{name}: `exponent` and `cutoff` must be scalars, got {describe(self.exponent)} and "
                             f"{describe(self.cutoff)}.")

    @property
    def n_species(self):
        return _species_parameter("SoftSphere", "epsilon", self.epsilon) or \
            _species_parameter("SoftSphere", "sigma", self.sigma)

    def _bare(self, r2, species_i, species_j):
        eps = _pair_value(self.epsilon, species_i, species_j, "geometric")
        sig = _pair_value(self.sigma, species_i, species_j, "arithmetic")
        return eps * (sig * sig / r2) ** (0.5 * self.exponent)


class PotentialSum(eqx.Module):
    """A sum of potentials (pair and bonded terms), e.g. `FENEBond(...) + WCA()` for Kremer–Grest
    chains. `a + b` builds one; nested sums are flattened.

    **Arguments:** `terms`: a tuple of pair potentials and bonded terms.
    """

    terms: tuple

    def __init__(self, terms):
        flat = []
        for t in terms:
            if isinstance(t, PotentialSum):
                flat.extend(t.terms)
            else:
                flat.append(t)
        for t in flat:
            if not hasattr(t, "pair_terms"):
                raise TypeError(f"PotentialSum: every term must be a pair potential or a bonded term, got "
                                f"{type(t).__name__}.")
        self.terms = tuple(flat)

    @property
    def pair_terms(self) -> tuple:
        return tuple(t for t in self.terms if isinstance(t, AbstractPairPotential))

    @property
    def bonded_terms(self) -> tuple:
        return tuple(t for t in self.terms if not isinstance(t, AbstractPairPotential))

    def __add__(self, other):
        return PotentialSum((self, other))
