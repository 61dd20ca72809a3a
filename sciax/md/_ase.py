"""Conversion to and from `ase.Atoms` (ASE is imported only when these functions are called)."""

from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .._validation import describe
from ._units import AMU_A2_PER_PS2, ASE_TIME

_UNITS = ("real", "none")


def _import_ase():
    try:
        import ase
    except ImportError as e:  # pragma: no cover - exercised only without ASE
        raise ImportError("sciax.md.to_ase / from_ase need the Atomic Simulation Environment: "
                          "`pip install ase`.") from e
    return ase


def _check_units(where, units):
    if units not in _UNITS:
        raise ValueError(f"{where}: `units` must be one of 'real', 'none'; got {units!r}.")


def to_ase(positions, *, box=None, velocities=None, masses=None, species=None, symbols=None,
           units: Literal["real", "none"] = "real"):
    """An `ase.Atoms` with the given positions, box, velocities, masses and species.

    With `units="real"` the arguments are in sciax's real system (see `sciax.md.units`) and
    are converted to ASE's: positions Å (unchanged), velocities Å/ps → Å per ASE time unit
    (`units.ASE_TIME` ps), masses eV·ps²/Å² → amu. With `units="none"` the numbers are copied
    unchanged (e.g. reduced LJ units read as Å, eV, amu and ASE time).

    **Arguments:**

    - `positions`: `(N, 3)`, Å.
    - `box`: a `sciax.md.Box` (cell diag(L), pbc on), `FreeSpace` or None (no cell, pbc off).
    - `velocities`: `(N, 3)` or None, Å/ps.
    - `masses`: `(N,)` or None (ASE's element masses then), eV·ps²/Å².
    - `species`: `(N,)` int indices into `symbols` (default all 0).
    - `symbols`: one chemical symbol per species (default `("X",)`, ASE's dummy element).
    - `units`: `"real"` or `"none"`.

    **Returns:** `ase.Atoms`.

    **Raises:** `ImportError` without ASE; `ValueError` naming the argument for wrong shapes,
    several species without `symbols`, or an unknown `units`.
    """
    ase = _import_ase()
    _check_units("to_ase", units)
    positions = np.asarray(positions, dtype=np.float64)
    if positions.ndim != 2 or positions.shape[1] != 3:
        raise ValueError(f"to_ase: `positions` must have shape (N, 3), got {describe(positions)}.")
    n = positions.shape[0]
    species = np.zeros(n, np.int64) if species is None else np.asarray(species)
    if species.shape != (n,) or not np.issubdtype(species.dtype, np.integer) or (n and species.min() < 0):
        raise ValueError(f"to_ase: `species` must be non-negative ints of shape ({n},), got {describe(species)}.")
    n_species = int(species.max()) + 1 if n else 1
    if symbols is None:
        if n_species > 1:
            raise ValueError(f"to_ase: {n_species} species need `symbols`, one chemical symbol per species.")
        symbols = ("X",)
    if isinstance(symbols, str) or len(symbols) < n_species:
        raise ValueError(f"to_ase: `symbols` must name each of the {n_species} species, got {symbols!r}.")
    atoms = ase.Atoms(symbols=[symbols[s] for s in species.tolist()], positions=positions)
    if box is not None and getattr(box, "periodic", None) is None:
        raise TypeError(f"to_ase: `box` must be a sciax.md.Box, FreeSpace or None, got {type(box).__name__}.")
    if box is not None and box.periodic:
        lengths = np.asarray(box.lengths, dtype=np.float64)
        if lengths.shape != (3,):
            raise ValueError(f"to_ase: the box must be 3-D, got lengths of shape {lengths.shape}.")
        atoms.set_cell(np.diag(lengths))
        atoms.set_pbc(True)
    if masses is not None:
        masses = np.asarray(masses, dtype=np.float64)
        if masses.shape != (n,):
            raise ValueError(f"to_ase: `masses` must have shape ({n},), got {describe(masses)}.")
        atoms.set_masses(masses / AMU_A2_PER_PS2 if units == "real" else masses)
    if velocities is not None:
        velocities = np.asarray(velocities, dtype=np.float64)
        if velocities.shape != (n, 3):
            raise ValueError(f"to_ase: `velocities` must have shape ({n}, 3), got {describe(velocities)}.")
        atoms.set_velocities(velocities * ASE_TIME if units == "real" else velocities)
    return atoms


class ASEConfiguration(NamedTuple):
    """What `from_ase` returns (JAX arrays in the requested dtype).

    - `positions`: `(N, 3)`, Å (wrapped into the box when periodic).
    - `velocities`: `(N, 3)`, Å/ps (zeros when the Atoms has none).
    - `masses`: `(N,)`, eV·ps²/Å² (`units="real"`) or amu (`units="none"`).
    - `species`: `(N,)` int32, index of each atom's symbol in `symbols`.
    - `symbols`: the distinct chemical symbols, in order of first appearance.
    - `box`: `sciax.md.Box` (periodic) or `FreeSpace`.
    - `images`: `(N, 3)` int32 image counts: the Atoms' positions = positions + images · L.
    """

    positions: jax.Array
    velocities: jax.Array
    masses: jax.Array
    species: jax.Array
    symbols: tuple
    box: object
    images: jax.Array


def from_ase(atoms, *, units: Literal["real", "none"] = "real", dtype=None) -> ASEConfiguration:
    """Positions, velocities, masses, species and box of an `ase.Atoms` (inverse of `to_ase`).

    **Arguments:**

    - `atoms`: an `ase.Atoms` with an orthorhombic cell and pbc on in all three directions
      (→ `Box`), or pbc off in all three (→ `FreeSpace`).
    - `units`: `"real"` (velocities → Å/ps, masses → eV·ps²/Å²) or `"none"` (numbers copied).
    - `dtype`: floating dtype of the arrays (default: JAX's default float).

    **Returns:** an `ASEConfiguration`.

    **Raises:** `ImportError` without ASE; `TypeError` if `atoms` is not an `ase.Atoms`;
    `ValueError` for mixed pbc, a non-orthorhombic or degenerate cell, or an unknown `units`.
    """
    ase = _import_ase()
    _check_units("from_ase", units)
    if not isinstance(atoms, ase.Atoms):
        raise TypeError(f"from_ase: `atoms` must be an ase.Atoms, got {type(atoms).__name__}.")
    from ._box import Box, FreeSpace

    dtype = jnp.zeros(()).dtype if dtype is None else jnp.dtype(dtype)
    pbc = np.asarray(atoms.pbc, dtype=bool)
    positions = np.asarray(atoms.positions, dtype=np.float64)
    images = np.zeros(positions.shape, np.int32)
    if pbc.all():
        cell = np.asarray(atoms.cell[:], dtype=np.float64)
        lengths = np.diag(cell)
        if np.any(cell != np.diag(lengths)) or np.any(lengths <= 0):
            raise ValueError(f"from_ase: sciax's Box needs an orthorhombic cell with positive lengths, the "
                             f"Atoms has cell {cell.tolist()}.")
        images = np.floor(positions / lengths).astype(np.int32)
        positions = positions - images * lengths
        positions = np.where(positions >= lengths, positions - lengths, positions)  # rounding at L
        box = Box(jnp.asarray(lengths, dtype=dtype))
    elif not pbc.any():
        box = FreeSpace()
    else:
        raise ValueError(f"from_ase: sciax boxes are periodic in every direction or none, the Atoms has "
                         f"pbc={pbc.tolist()}.")
    velocities = np.asarray(atoms.get_velocities(), dtype=np.float64)
    masses = np.asarray(atoms.get_masses(), dtype=np.float64)
    if units == "real":
        velocities = velocities / ASE_TIME
        masses = masses * AMU_A2_PER_PS2
    symbols = atoms.get_chemical_symbols()
    distinct = tuple(dict.fromkeys(symbols))
    index = {s: i for i, s in enumerate(distinct)}
    return ASEConfiguration(
        positions=jnp.asarray(positions, dtype=dtype), velocities=jnp.asarray(velocities, dtype=dtype),
        masses=jnp.asarray(masses, dtype=dtype), species=jnp.asarray([index[s] for s in symbols], jnp.int32),
        symbols=distinct, box=box, images=jnp.asarray(images))
