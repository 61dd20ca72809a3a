r"""Bonded terms over a static bond list: harmonic and FENE bonds.

A bond's energy is written once as a function of its length; forces and the bond virial are
its derivative with respect to the bond vector (automatic differentiation).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._validation import describe, is_concrete
from ._potentials import PotentialSum, _check_positive


def _as_bonds(name: str, bonds) -> jax.Array:
    b = jnp.asarray(bonds)
    if b.ndim != 2 or b.shape[1] != 2 or not jnp.issubdtype(b.dtype, jnp.integer):
        raise ValueError(f"{name}: `bonds` must be an integer array of shape (M, 2) (pairs of particle indices), "
                         f"got {describe(b)}.")
    if is_concrete(b) and b.size and int(np.min(np.asarray(b))) < 0:
        raise ValueError(f"{name}: `bonds` holds a negative particle index ({int(np.min(np.asarray(b)))}).")
    return b.astype(jnp.int32)


class AbstractBond(eqx.Module):
    """A bonded term $U = \\sum_{(i,j) \\in \\text{bonds}} \\phi(|r_i - r_j|)$ (minimum image)."""

    bonds: eqx.AbstractVar[jax.Array]

    def bond_energy(self, r) -> jax.Array:
        raise NotImplementedError

    @property
    def pair_terms(self) -> tuple:
        return ()

    @property
    def bonded_terms(self) -> tuple:
        return (self,)

    def check_indices(self, where: str, n_particles: int) -> None:
        """Raise `ValueError` if a bond index is outside [0, N)."""
        if is_concrete(self.bonds) and self.bonds.size:
            top = int(np.max(np.asarray(self.bonds)))
            if top >= n_particles:
                raise ValueError(f"{where}: `{type(self).__name__}.bonds` refers to particle {top}, outside the "
                                 f"{n_particles} particles (indices must be in [0, {n_particles})).")

    def __add__(self, other):
        return PotentialSum((self, other))


def _length(d):
    r2 = jnp.sum(d * d, axis=-1)
    nonzero = r2 > 0
    return jnp.where(nonzero, jnp.sqrt(jnp.where(nonzero, r2, 1.0)), 0.0)


class HarmonicBond(AbstractBond):
    r"""Harmonic bonds $\phi(r) = \tfrac12 k (r - r_0)^2$.

    **Arguments:** `bonds` `(M, 2)` int particle indices; `k` (energy / length²) and `r0`
    (length units), scalars or `(M,)` per bond.
    """

    bonds: jax.Array
    k: jax.Array = eqx.field(converter=jnp.asarray)
    r0: jax.Array = eqx.field(converter=jnp.asarray)

    def __init__(self, bonds, k, r0):
        self.bonds = _as_bonds("HarmonicBond", bonds)
        self.k = k
        self.r0 = r0

    def __check_init__(self):
        _check_bond_parameters("HarmonicBond", self, r0_may_be_zero=True)

    def bond_energy(self, r):
        """$\\tfrac12 k (r - r_0)^2$ per bond, shape `(M,)`, energy units."""
        return 0.5 * self.k * (r - self.r0) ** 2


class FENEBond(AbstractBond):
    r"""Finitely extensible nonlinear elastic bonds $\phi(r) = -\tfrac12 k R_0^2 \ln[1 - (r/R_0)^2]$.

    Kremer–Grest bead-spring chains are `FENEBond(bonds, k=30.0, r0=1.5) + WCA()` (the WCA
    repulsion acts between all pairs, bonded ones included). A bond stretched to $r \geq R_0$ has
    broken: its energy and forces are NaN, which a run's finiteness check reports.

    **Arguments:** `bonds` `(M, 2)` int; `k` (energy / length²), `r0` $R_0$ (length units),
    scalars or `(M,)`.
    """

    bonds: jax.Array
    k: jax.Array = eqx.field(converter=jnp.asarray)
    r0: jax.Array = eqx.field(converter=jnp.asarray)

    def __init__(self, bonds, k=30.0, r0=1.5):
        self.bonds = _as_bonds("FENEBond", bonds)
        self.k = k
        self.r0 = r0

    def __check_init__(self):
        _check_bond_parameters("FENEBond", self, r0_may_be_zero=False)

    def bond_energy(self, r):
        """$-\\tfrac12 k R_0^2 \\ln[1 - (r/R_0)^2]$ per bond (NaN for $r \\geq R_0$), energy units."""
        x = r / self.r0
        return -0.5 * self.k * self.r0**2 * jnp.log1p(-x * x)


def bonded_terms(terms, box, positions):
    """Energy, forces `(N, d)` and virial `(d, d)` of the bonded terms: per bond the energy is a
    function of the minimum-image bond vector b = r_i - r_j; the force on i is -∂φ/∂b, on j +∂φ/∂b,
    and the bond's virial is b ⊗ (-∂φ/∂b)."""
    dtype = positions.dtype
    d = positions.shape[-1]
    energy = jnp.zeros((), dtype)
    forces = jnp.zeros_like(positions)
    virial = jnp.zeros((d, d), dtype)
    for term in terms:
        i, j = term.bonds[:, 0], term.bonds[:, 1]
        b = box.displacement(positions[i], positions[j])
        e, grad_b = jax.value_and_grad(lambda v, t=term: jnp.sum(t.bond_energy(_length(v))))(b)
        energy = energy + e
        forces = forces.at[i].add(-grad_b).at[j].add(grad_b)
        virial = virial - b.T @ grad_b
    return energy, forces, virial


def _check_bond_parameters(owner: str, term, *, r0_may_be_zero: bool) -> None:
    """`k` and `r0` are scalars or one per bond, `k` ≥ 0 and `r0` > 0 (≥ 0 where allowed)."""
    m = term.bonds.shape[0]
    for name in ("k", "r0"):
        value = getattr(term, name)
        if jnp.shape(value) not in ((), (m,)):
            raise ValueError(f"{owner}: `{name}` must be a scalar or have shape ({m},) (one per bond), "
                             f"got {describe(value)}.")
    _check_positive(owner, "k", term.k, allow_zero=True)
    _check_positive(owner, "r0", term.r0, allow_zero=r0_may_be_zero)
