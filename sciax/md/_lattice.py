"""Initial configurations: cubic crystal lattices and random non-overlapping packings (host side)."""

import math
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from .._validation import describe

_BASES = {
    "sc": np.array([[0.0, 0.0, 0.0]]),
    "bcc": np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.5]]),
    "fcc": np.array([[0.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]]),
}
_NEAREST = {"sc": 1.0, "bcc": math.sqrt(3.0) / 2.0, "fcc": 1.0 / math.sqrt(2.0)}  # in units of a
# Packing fractions of spheres of diameter `min_distance`: the densest packing (Kepler/Thue) and
# the saturation of random sequential addition (RSA), the most a random insertion reaches.
_CLOSE_PACKING = {2: math.pi / (2.0 * math.sqrt(3.0)), 3: math.pi / (3.0 * math.sqrt(2.0))}
_RSA_SATURATION = {2: 0.547, 3: 0.3841}


def _float_dtype(dtype):
    dtype = jnp.zeros(()).dtype if dtype is None else jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"`dtype` must be a floating dtype (float32 or float64), got {dtype}.")
    return dtype


def _positive_number(where, name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) and not (
            hasattr(value, "shape") and np.shape(value) == ()):
        raise TypeError(f"{where}: `{name}` must be a positive number, got {describe(value)}.")
    if isinstance(value, jax.core.Tracer):
        raise TypeError(f"{where}: `{name}` must be a concrete number (a configuration is built on the "
                        f"host, outside jit), got a traced value.")
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{where}: `{name}` must be a positive finite number, got {value}.")
    return value


def _make_box(lengths, dtype):
    from ._box import Box

    return Box(jnp.asarray(lengths, dtype=dtype))


def lattice_nearest_distance(kind: Literal["sc", "bcc", "fcc"], lattice_constant: float) -> float:
    """Nearest-neighbour distance of a cubic lattice: a (sc), a√3/2 (bcc), a/√2 (fcc).

    **Arguments:** `kind`, `"sc"`, `"bcc"` or `"fcc"`; `lattice_constant` a (length units).

    **Returns:** the distance, length units. **Raises:** `ValueError` for an unknown kind.
    """
    _check_kind(kind)
    return _NEAREST[kind] * _positive_number("lattice_nearest_distance", "lattice_constant", lattice_constant)


def _check_kind(kind):
    if kind not in _BASES:
        raise ValueError(f"`kind` must be one of 'sc', 'bcc', 'fcc'; got {kind!r}.")


def lattice(
    kind: Literal["sc", "bcc", "fcc"],
    n_cells=None,
    *,
    density=None,
    lattice_constant=None,
    n_atoms: int | None = None,
    dtype=None,
):
    """Atoms on a simple-cubic, body-centred or face-centred cubic lattice in a periodic box.

    The conventional cubic cell of side a holds b atoms (sc 1, bcc 2, fcc 4) at fractional
    positions of its basis; `n_cells = (n_x, n_y, n_z)` cells fill the box
    [0, n_x a) x [0, n_y a) x [0, n_z a), so N = b n_x n_y n_z and the number density is
    ρ = b / a³, i.e. a = (b / ρ)^(1/3). Atoms are ordered cell by cell with x varying
    fastest, then y, then z, and the basis innermost (LAMMPS's `create_atoms box` order: the
    `in.lj` start is `lattice("fcc", 10, density=0.8442)`). Nearest-neighbour distances: a (sc),
    a√3/2 (bcc), a/√2 (fcc).

    **Arguments:**

    - `kind`: `"sc"`, `"bcc"` or `"fcc"`.
    - `n_cells`: cells per side, an int (cubic box) or a tuple of three ints. May be left out
      when `n_atoms` is given and `n_atoms / b` is a perfect cube.
    - `density`: number density ρ = N / V (length⁻³), or
    - `lattice_constant`: the cubic cell side a (length units); exactly one of the two.
    - `n_atoms`: the number of atoms expected; checked against b n_x n_y n_z.
    - `dtype`: floating dtype of the positions and box (default: JAX's default float).

    **Returns:** `(positions, box)`: positions `(N, 3)` in [0, L) (length units) and a
    `sciax.md.Box` with lengths `(n_x a, n_y a, n_z a)`.

    **Raises:** `ValueError` for an unknown kind, non-positive or missing `n_cells`, both or
    neither of `density`/`lattice_constant`, a non-positive density or lattice constant, and an
    `n_atoms` that the lattice cannot hold; `TypeError` for non-numeric arguments.

    ```python
    positions, box = sciax.md.lattice("fcc", 10, density=0.8442)   # 4,000 atoms, L = 16.796 σ
    ```
    """
    _check_kind(kind)
    dtype = _float_dtype(dtype)
    basis = _BASES[kind]
    b = len(basis)
    if n_atoms is not None:
        if isinstance(n_atoms, bool) or not isinstance(n_atoms, (int, np.integer)) or n_atoms <= 0:
            raise ValueError(f"lattice: `n_atoms` must be a positive int, got {describe(n_atoms)}.")
        n_atoms = int(n_atoms)
    if n_cells is None:
        if n_atoms is None:
            raise ValueError("lattice: give `n_cells` (cells per side) or `n_atoms`.")
        side = round((n_atoms / b) ** (1.0 / 3.0))
        if b * side**3 != n_atoms:
            raise ValueError(
                f"lattice: `n_atoms`={n_atoms} does not fill a cubic {kind} lattice: it holds {b} n³ atoms "
                f"for n cells per side (e.g. {b * max(side, 1)**3} or {b * (max(side, 1) + 1)**3}); "
                f"pass `n_cells` as a tuple for a non-cubic box.")
        n_cells = side
    cells = (n_cells,) * 3 if isinstance(n_cells, (int, np.integer)) and not isinstance(n_cells, bool) else n_cells
    if (not isinstance(cells, (tuple, list)) or len(cells) != 3
            or any(isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c <= 0 for c in cells)):
        raise ValueError(f"lattice: `n_cells` must be a positive int or a tuple of three positive ints, "
                         f"got {describe(n_cells) if not isinstance(n_cells, (tuple, list)) else n_cells!r}.")
    cells = tuple(int(c) for c in cells)
    total = b * cells[0] * cells[1] * cells[2]
    if n_atoms is not None and n_atoms != total:
        raise ValueError(f"lattice: `n_atoms`={n_atoms} does not match the lattice: {kind} with "
                         f"n_cells={cells} holds {b} x {cells[0]} x {cells[1]} x {cells[2]} = {total} atoms.")
    if (density is None) == (lattice_constant is None):
        raise ValueError("lattice: give exactly one of `density` (number density, length⁻³) and "
                         "`lattice_constant` (cell side, length units).")
    if density is not None:
        a = (b / _positive_number("lattice", "density", density)) ** (1.0 / 3.0)
    else:
        a = _positive_number("lattice", "lattice_constant", lattice_constant)
    k, j, i = np.meshgrid(*(np.arange(c) for c in cells[::-1]), indexing="ij")  # x fastest
    origins = np.stack([i.ravel(), j.ravel(), k.ravel()], axis=-1).astype(np.float64)
    positions = ((origins[:, None, :] + basis[None, :, :]) * a).reshape(-1, 3)
    lengths = np.array(cells, dtype=np.float64) * a
    return jnp.asarray(positions, dtype=dtype), _make_box(lengths, dtype)


def _rng(key):
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        if key < 0:
            raise ValueError(f"random_positions: an integer `key` (seed) must be non-negative, got {key}.")
        return np.random.default_rng(int(key))
    if isinstance(key, jax.Array) and not isinstance(key, jax.core.Tracer):
        data = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
        if data.dtype == jnp.uint32:
            return np.random.default_rng(np.asarray(data, dtype=np.uint64).ravel().tolist())
    raise TypeError(f"random_positions: `key` must be a jax.random key or a non-negative int seed, "
                    f"got {describe(key)}.")


def random_positions(
    n_atoms: int,
    *,
    key,
    box=None,
    density=None,
    min_distance=0.0,
    max_tries: int = 1000,
    dtype=None,
):
    """Uniformly random positions in a periodic box, no two closer than `min_distance`.

    Random sequential addition on the host: each atom is drawn uniformly in the box and kept if
    its minimum-image distance to every atom placed so far is at least `min_distance` (checked
    against the atoms of the neighbouring cells of a grid of cells ≥ `min_distance`, O(N)); an
    atom that fails `max_tries` draws in a row stops the packing with an error. With
    `min_distance = 0` the atoms are an ideal gas (independent and uniform).

    The packing fraction φ = N v(min_distance / 2) / V, with v(r) the volume of a sphere of
    radius r, must stay below the saturation of random sequential addition (≈ 0.384 in 3-D,
    0.547 in 2-D); denser packings (up to close packing 0.7405) are refused with a pointer to
    `lattice`, since no random insertion reaches them.

    **Arguments:**

    - `n_atoms`: number of atoms N.
    - `key`: a `jax.random` key or a non-negative int seed (same key, same positions).
    - `box`: a `sciax.md.Box` (any dimension d), or
    - `density`: number density N / V (length⁻³) for a cubic 3-D box; exactly one of the two.
    - `min_distance`: smallest allowed distance between two atoms (length units), ≥ 0.
    - `max_tries`: draws per atom before giving up.
    - `dtype`: floating dtype of the result (default: the box's, else JAX's default float).

    **Returns:** `(positions, box)`: positions `(N, d)` in [0, L) (length units) and the box.

    **Raises:** `ValueError` for a non-positive `n_atoms`, `density` or `max_tries`, a negative
    `min_distance`, both or neither of `box`/`density`, a packing denser than random insertion
    can reach, or an atom that found no place in `max_tries` draws; `TypeError` for a `key` that
    is neither a key nor an int, or a `box` that is not a periodic `Box`.

    ```python
    positions, box = sciax.md.random_positions(500, density=0.3, min_distance=0.9, key=0)
    ```
    """
    where = "random_positions"
    if isinstance(n_atoms, bool) or not isinstance(n_atoms, (int, np.integer)) or n_atoms <= 0:
        raise ValueError(f"{where}: `n_atoms` must be a positive int, got {describe(n_atoms)}.")
    if isinstance(max_tries, bool) or not isinstance(max_tries, (int, np.integer)) or max_tries <= 0:
        raise ValueError(f"{where}: `max_tries` must be a positive int, got {describe(max_tries)}.")
    n_atoms = int(n_atoms)
    if (box is None) == (density is None):
        raise ValueError(f"{where}: give exactly one of `box` (a sciax.md.Box) and `density` (number density).")
    if box is None:
        dtype = _float_dtype(dtype)
        side = (n_atoms / _positive_number(where, "density", density)) ** (1.0 / 3.0)
        lengths = np.full(3, side)
        box = _make_box(lengths, dtype)
    else:
        lengths_attr = getattr(box, "lengths", None)
        if not getattr(box, "periodic", False) or lengths_attr is None:
            raise TypeError(f"{where}: `box` must be a periodic sciax.md.Box (free space has no volume to "
                            f"fill), got {type(box).__name__}.")
        lengths = np.asarray(lengths_attr, dtype=np.float64)
        dtype = _float_dtype(lengths_attr.dtype if dtype is None else dtype)
    dim = lengths.shape[0]
    if isinstance(min_distance, bool) or not isinstance(min_distance, (int, float, np.integer, np.floating)):
        raise TypeError(f"{where}: `min_distance` must be a number, got {describe(min_distance)}.")
    min_distance = float(min_distance)
    if not (math.isfinite(min_distance) and min_distance >= 0):
        raise ValueError(f"{where}: `min_distance` must be a finite number >= 0, got {min_distance}.")
    volume = float(np.prod(lengths))
    rng = _rng(key)
    if min_distance == 0.0:
        positions = rng.uniform(size=(n_atoms, dim)) * lengths
        return jnp.asarray(np.minimum(positions, np.nextafter(lengths, 0)), dtype=dtype), box
    ball = math.pi ** (dim / 2) / math.gamma(dim / 2 + 1) * (min_distance / 2) ** dim
    fraction = n_atoms * ball / volume
    close, rsa = _CLOSE_PACKING.get(dim, 1.0), _RSA_SATURATION.get(dim, 1.0)
    if fraction > rsa:
        what = "impossible: denser than close packing" if fraction > close else (
            f"beyond random sequential addition, which saturates at φ ≈ {rsa}")
        raise ValueError(
            f"{where}: {n_atoms} atoms at `min_distance`={min_distance} in a box of volume {volume:.6g} "
            f"have packing fraction φ = {fraction:.4f}, {what}. Lower `min_distance` or the density, "
            f"or start from `sciax.md.lattice` and melt it.")
    return jnp.asarray(_sequential_addition(rng, n_atoms, lengths, min_distance, max_tries, fraction),
                       dtype=dtype), box


def _sequential_addition(rng, n_atoms, lengths, min_distance, max_tries, fraction):
    """Random sequential addition with a cell grid (cells ≥ min_distance, so a conflicting atom
    is in the same or an adjacent cell)."""
    dim = lengths.shape[0]
    n_grid = np.maximum(np.floor(lengths / min_distance).astype(int), 1)
    cell_size = lengths / n_grid
    offsets = np.stack(np.meshgrid(*([np.arange(-1, 2)] * dim), indexing="ij"), -1).reshape(-1, dim)
    cells: dict[tuple, list[int]] = {}
    positions = np.empty((n_atoms, dim))
    limit = min_distance**2
    for n in range(n_atoms):
        for _ in range(max_tries):
            candidate = rng.uniform(size=dim) * lengths
            cell = np.minimum((candidate / cell_size).astype(int), n_grid - 1)
            around = {tuple(c) for c in (cell + offsets) % n_grid}  # a set: grids of < 3 cells repeat
            others = [i for c in around for i in cells.get(c, ())]
            if others:
                d = positions[others] - candidate
                d -= lengths * np.round(d / lengths)
                if np.min(np.einsum("ij,ij->i", d, d)) < limit:
                    continue
            positions[n] = candidate
            cells.setdefault(tuple(cell), []).append(n)
            break
        else:
            raise ValueError(
                f"random_positions: atom {n} of {n_atoms} found no place at least `min_distance`="
                f"{min_distance} from the others in `max_tries`={max_tries} draws (packing fraction "
                f"φ = {fraction:.4f}); the packing is too dense for random insertion. Lower "
                f"`min_distance` or the density, raise `max_tries`, or start from `sciax.md.lattice`.")
    return np.minimum(positions, np.nextafter(lengths, 0))
