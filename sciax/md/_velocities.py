"""Initial velocities: Maxwell–Boltzmann at an exact temperature with zero total momentum."""

import functools

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np

from .._validation import describe, is_concrete


def degrees_of_freedom(n_atoms: int, dim: int = 3) -> int:
    """Kinetic degrees of freedom with the centre-of-mass momentum removed: d N − d.

    This is the convention of `maxwell_boltzmann` and of the `temperature` observable (and of
    LAMMPS's default `compute temp`): a system whose total momentum is zero and conserved
    (velocity Verlet, Nosé–Hoover, Bussi) has d fewer free velocity components.
    """
    return dim * n_atoms - dim


def kinetic_temperature(velocities, masses, *, n_removed: int | None = None):
    """Instantaneous temperature kT = Σ m |v|² / n_dof, with n_dof = d N − `n_removed`.

    **Arguments:**

    - `velocities`: `(N, d)`, length/time units.
    - `masses`: `(N,)`, mass units.
    - `n_removed`: degrees of freedom removed by constraints; default d (zero total momentum).
      Pass 0 for a Langevin thermostat, which does not conserve momentum.

    **Returns:** kT, energy units (ε in reduced LJ units; eV in the real system: divide by
    `units.BOLTZMANN` for K). Jittable.
    """
    n, dim = velocities.shape[-2], velocities.shape[-1]
    n_dof = dim * n - (dim if n_removed is None else n_removed)
    if n_dof <= 0:
        raise ValueError(f"kinetic_temperature: {n} atoms in {dim}-D leave {n_dof} degrees of freedom "
                         f"after removing {dim if n_removed is None else n_removed}; need at least one.")
    m = jnp.asarray(masses, dtype=velocities.dtype)
    return jnp.sum(m[..., None] * velocities**2, axis=(-2, -1)) / n_dof


def maxwell_boltzmann(masses, kT, *, key, dim: int = 3, dtype=None):
    """Random velocities from the Maxwell–Boltzmann distribution at temperature `kT`, with zero
    total momentum and an instantaneous temperature exactly `kT`.

    Each component is drawn v_ia ~ N(0, kT / m_i); the centre-of-mass velocity
    Σ m_i v_i / Σ m_i is subtracted, and all velocities are scaled by one factor so that
    Σ m_i |v_i|² = n_dof kT with n_dof = d N − d (`degrees_of_freedom`): the `temperature`
    observable then reads exactly `kT` at step 0. Jittable (the checks on values run when the
    arguments are concrete).

    **Arguments:**

    - `masses`: `(N,)`, mass units (reduced: m; real: eV·ps²/Å², see `units.masses_from_amu`).
    - `kT`: target temperature as an energy, ≥ 0 (reduced: ε; real: eV, `units.kT_from_kelvin`).
    - `key`: a `jax.random` key.
    - `dim`: the dimension d.
    - `dtype`: floating dtype of the velocities (default: the masses' if floating, else JAX's
      default float).

    **Returns:** velocities `(N, d)`, length/time units (reduced: σ/τ; real: Å/ps).

    **Raises:** `ValueError` for masses that are not a 1-D array of at least 2 positive finite
    values (one atom has no degrees of freedom left), a negative or non-finite `kT`, or a
    non-positive `dim`; `TypeError` for a non-floating `dtype`.

    ```python
    velocities = sciax.md.maxwell_boltzmann(jnp.ones(4000), 1.44, key=jax.random.key(0))
    ```
    """
    where = "maxwell_boltzmann"
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim <= 0:
        raise ValueError(f"{where}: `dim` must be a positive int, got {describe(dim)}.")
    masses_in = masses
    masses = jnp.asarray(masses)
    if masses.ndim != 1 or masses.shape[0] < 2:
        raise ValueError(f"{where}: `masses` must be a 1-D array (N,) with N >= 2 (one atom has no degrees "
                         f"of freedom once its momentum is zero), got {describe(masses_in)}.")
    if dtype is None:
        dtype = masses.dtype if jnp.issubdtype(masses.dtype, jnp.floating) else jnp.zeros(()).dtype
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"{where}: `dtype` must be a floating dtype, got {dtype}.")
    if is_concrete(masses) and not np.all(np.isfinite(np.asarray(masses)) & (np.asarray(masses) > 0)):
        smallest = float(np.min(np.asarray(masses)))
        raise ValueError(f"{where}: `masses` must all be positive and finite, got min {smallest}.")
    if jnp.ndim(kT) != 0:
        raise ValueError(f"{where}: `kT` must be a scalar (energy units), got {describe(kT)}.")
    if is_concrete(kT) and not (np.isfinite(float(kT)) and float(kT) >= 0):
        raise ValueError(f"{where}: `kT` must be a finite energy >= 0, got {float(kT)}.")
    return _draw(masses.astype(dtype), jnp.asarray(kT, dtype=dtype), key, dim)


@functools.partial(jax.jit, static_argnums=3)  # one program rather than a dozen eager operations
def _draw(masses, kT, key, dim):
    n = masses.shape[0]
    velocities = jr.normal(key, (n, dim), masses.dtype) * jnp.sqrt(kT / masses)[:, None]
    velocities = velocities - jnp.sum(masses[:, None] * velocities, axis=0) / jnp.sum(masses)
    twice_kinetic = jnp.sum(masses[:, None] * velocities**2)
    positive = twice_kinetic > 0  # kT = 0: zero velocities
    scale = jnp.sqrt(jnp.where(positive, degrees_of_freedom(n, dim) * kT / jnp.where(positive, twice_kinetic, 1), 0))
    return velocities * scale


def zero_momentum(velocities, masses):
    """Velocities with the centre-of-mass velocity Σ m v / Σ m subtracted (total momentum 0).

    **Arguments:** `velocities` `(N, d)` (length/time units), `masses` `(N,)` (mass units).
    **Returns:** `(N, d)`, same units and dtype. Jittable.
    """
    m = jnp.asarray(masses, dtype=velocities.dtype)[:, None]
    return velocities - jnp.sum(m * velocities, axis=0) / jnp.sum(m)

