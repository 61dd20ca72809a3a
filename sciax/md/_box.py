"""Simulation boxes: a periodic orthorhombic `Box` and open `FreeSpace`.

Minimum-image displacement and wrapping are written here once; every neighbour strategy, bonded
term and observable uses them.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._validation import describe, is_concrete


def minimum_image(difference, lengths):
    """Fold coordinate differences to the nearest image: d - L round(d / L) (any broadcastable shapes)."""
    return difference - lengths * jnp.round(difference / lengths)


class Box(eqx.Module):
    r"""A periodic orthorhombic box $[0, L_x) \times [0, L_y) \times [0, L_z)$.

    The minimum-image displacement is $\Delta = r_i - r_j - L \operatorname{round}((r_i - r_j)/L)$
    per axis; it is the nearest periodic image whenever the cutoff is below half the smallest
    length (which `MDSystem` checks).

    **Arguments:**

    - `lengths`: edge lengths $(L_x, L_y, L_z)$, shape `(d,)` (d = 2 or 3), length units
      (reduced LJ units σ, or Å in `sciax.md.units`). A scalar gives a cube in 3-D.

    **Raises:** `ValueError` if `lengths` is not 1-D of size 2 or 3, or (when known on the host)
    not positive and finite.

    **Example:** `Box(16.796)` is the cube of the LAMMPS in.lj benchmark (4,000 atoms).
    """

    lengths: jax.Array = eqx.field(converter=jnp.asarray)

    def __init__(self, lengths):
        lengths = jnp.asarray(lengths)
        if lengths.ndim == 0:
            lengths = jnp.broadcast_to(lengths, (3,))
        self.lengths = lengths

    def __check_init__(self):
        if self.lengths.ndim != 1 or self.lengths.shape[0] not in (2, 3):
            raise ValueError(f"Box: `lengths` must have shape (d,) with d = 2 or 3 (or be a scalar for a "
                             f"cube), got {describe(self.lengths)}.")
        if not jnp.issubdtype(self.lengths.dtype, jnp.floating):
            raise TypeError(f"Box: `lengths` must be floating point, got {describe(self.lengths)}.")
        if is_concrete(self.lengths):
            v = np.asarray(self.lengths)
            if not (np.all(np.isfinite(v)) and np.all(v > 0)):
                raise ValueError(f"Box: `lengths` must be positive and finite, got {v.tolist()}.")

    @property
    def dimension(self) -> int:
        """The number of spatial dimensions d."""
        return self.lengths.shape[0]

    @property
    def volume(self) -> jax.Array:
        """$V = \\prod_a L_a$ (length units to the power d)."""
        return jnp.prod(self.lengths)

    @property
    def periodic(self) -> bool:
        return True

    def displacement(self, ri, rj) -> jax.Array:
        """Minimum-image $r_i - r_j$, broadcasting over leading axes; shape `(..., d)`, length units."""
        return minimum_image(ri - rj, self.lengths)

    def axis_displacement(self, xi, xj, axis: int) -> jax.Array:
        """Minimum-image $x_i - x_j$ along one `axis` (coordinates of any broadcastable shapes)."""
        return minimum_image(xi - xj, self.lengths[axis])

    def wrap(self, positions) -> tuple[jax.Array, jax.Array]:
        """Positions folded into $[0, L)$ and the integer image shifts $k$ with
        `positions = wrapped + k * lengths`.

        **Arguments:** `positions`, shape `(N, d)`, length units.

        **Returns:** `(wrapped, images)`: `wrapped` of the dtype of `positions`, `images` int32,
        both `(N, d)`.
        """
        k = jnp.floor(positions / self.lengths)
        wrapped = positions - k * self.lengths
        # Rounding can leave a tiny negative x exactly at L: fold it back to 0.
        edge = wrapped >= self.lengths
        wrapped = jnp.where(edge, wrapped - self.lengths, wrapped)
        k = jnp.where(edge, k + 1, k)
        return wrapped, k.astype(jnp.int32)

    def unwrap(self, positions, images) -> jax.Array:
        """Unwrapped positions `positions + images * lengths`, shape `(N, d)`, length units."""
        return positions + images.astype(positions.dtype) * self.lengths

    def check_inside(self, where: str, name: str, positions) -> None:
        """Raise `ValueError` (host-side values only) if some position lies outside $[0, L)$."""
        if not (is_concrete(positions) and is_concrete(self.lengths)):
            return
        x, lengths = np.asarray(positions), np.asarray(self.lengths)
        bad = np.any((x < 0) | (x >= lengths), axis=-1)
        if np.any(bad):
            i = int(np.argmax(bad))
            raise ValueError(f"{where}: `{name}` must lie inside the box [0, L) with L = {lengths.tolist()}, but "
                             f"particle {i} is at {x[i].tolist()} ({int(bad.sum())} particle(s) outside); "
                             f"fold them in with `box.wrap(positions)` (which also returns the image counts).")


class FreeSpace(eqx.Module):
    """Open (non-periodic) space: plain displacements, no wrapping, infinite volume.

    Pressure and stress are undefined here (`MDSystem.pressure` raises). Only the `AllPairs`
    neighbour strategy applies.

    **Arguments:** `dimension`: d (2 or 3), default 3.
    """

    dimension: int = eqx.field(static=True, default=3)

    def __check_init__(self):
        if self.dimension not in (2, 3):
            raise ValueError(f"FreeSpace: `dimension` must be 2 or 3, got {self.dimension!r}.")

    @property
    def volume(self) -> jax.Array:
        """Infinite."""
        return jnp.asarray(jnp.inf)

    @property
    def periodic(self) -> bool:
        return False

    def displacement(self, ri, rj) -> jax.Array:
        """$r_i - r_j$, broadcasting over leading axes."""
        return ri - rj

    def axis_displacement(self, xi, xj, axis: int) -> jax.Array:
        """$x_i - x_j$ along one axis."""
        return xi - xj

    def wrap(self, positions) -> tuple[jax.Array, jax.Array]:
        """The positions unchanged and zero image counts (int32)."""
        return positions, jnp.zeros(jnp.shape(positions), jnp.int32)

    def unwrap(self, positions, images) -> jax.Array:
        """The positions unchanged."""
        return positions

    def check_inside(self, where: str, name: str, positions) -> None:
        """Every position is inside free space."""
