"""Extended XYZ files: write MD frames (streaming, one whole frame per write) and read them back.

The format (as read by ASE, OVITO and VMD): per frame a line with the number of atoms, a comment
line of `key=value` pairs, and one line per atom. sciax writes

    N
    Lattice="Lx 0.0 0.0 0.0 Ly 0.0 0.0 0.0 Lz" Properties=species:S:1:pos:R:3:vel:R:3 pbc="T T T" time=0.5 step=100
    Ar 0.0 0.0 0.0 0.1 -0.2 0.3
    ...

Floats are written with Python's shortest round-trip representation, so reading a file back
gives bitwise the float64 values written (float32 arrays round-trip through float64 exactly).
Free space (no box) is written without `Lattice` and with `pbc="F F F"`. Optional columns:
`vel:R:3` (velocities) and `unwrapped_pos:R:3` (positions + images · L).
"""

import os
import re
from dataclasses import dataclass, field

import jax
import numpy as np

from .._validation import describe

_PROPERTY_TYPES = {"S": str, "R": float, "I": int, "L": bool}


@dataclass(frozen=True)
class XYZFrame:
    """One frame of an extended XYZ file, as NumPy arrays (float64 / int / bool / str).

    **Fields:**

    - `positions`: `(N, 3)` (length units of the file).
    - `symbols`: tuple of N chemical symbols (str).
    - `species`: `(N,)` int32, the index of each atom's symbol in `species_symbols`.
    - `species_symbols`: the distinct symbols in order of first appearance.
    - `velocities`: `(N, 3)` or None (the `vel` column).
    - `unwrapped_positions`: `(N, 3)` or None (the `unwrapped_pos` column).
    - `cell`: `(3, 3)` lattice vectors as rows, or None without `Lattice`.
    - `pbc`: `(3,)` bool.
    - `time`, `step`: from the comment line, or None.
    - `info`: the other `key=value` pairs of the comment line (str values).
    - `arrays`: the other per-atom columns by name.
    """

    positions: np.ndarray
    symbols: tuple
    species: np.ndarray
    species_symbols: tuple
    velocities: np.ndarray | None = None
    unwrapped_positions: np.ndarray | None = None
    cell: np.ndarray | None = None
    pbc: np.ndarray = field(default_factory=lambda: np.zeros(3, bool))
    time: float | None = None
    step: int | None = None
    info: dict = field(default_factory=dict)
    arrays: dict = field(default_factory=dict)

    @property
    def lengths(self) -> np.ndarray | None:
        """Box lengths `(3,)` of an orthorhombic cell (None without a cell).

        **Raises:** `ValueError` if the cell has off-diagonal components.
        """
        if self.cell is None:
            return None
        if np.any(self.cell != np.diag(np.diag(self.cell))):
            raise ValueError(f"XYZFrame: the cell is not orthorhombic (sciax's Box needs a diagonal cell): "
                             f"{self.cell.tolist()}.")
        return np.diag(self.cell).copy()

    @property
    def images(self) -> np.ndarray | None:
        """Integer image counts `(N, 3)` = round((unwrapped − positions) / L), or None."""
        if self.unwrapped_positions is None or self.cell is None:
            return None
        return np.rint((self.unwrapped_positions - self.positions) / self.lengths).astype(np.int32)

    def box(self):
        """A `sciax.md.Box` with the frame's lengths (float64), or `FreeSpace` without a cell.

        **Raises:** `ValueError` for a non-orthorhombic cell or a partly periodic frame.
        """
        from ._box import Box, FreeSpace

        if self.cell is None or not np.any(self.pbc):
            return FreeSpace()
        if not np.all(self.pbc):
            raise ValueError(f"XYZFrame: sciax boxes are periodic in every direction or none, the frame has "
                             f"pbc={self.pbc.tolist()}.")
        return Box(np.asarray(self.lengths))


def _host(name, value, shape_tail=None, n=None, kind="float"):
    """A host NumPy copy of an array argument, checked for shape (N, *shape_tail)."""
    if value is None:
        return None
    try:
        array = np.asarray(value)
    except Exception as e:  # a tracer inside jit
        raise TypeError(f"write_xyz: `{name}` must be a concrete array (write files outside jit), "
                        f"got {describe(value)}.") from e
    ok_kind = (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)) \
        if kind == "float" else np.issubdtype(array.dtype, np.integer)
    if not ok_kind:
        raise TypeError(f"write_xyz: `{name}` must be a{'n integer' if kind == 'int' else ' real'} array, "
                        f"got {describe(value)}.")
    expected = (n,) + tuple(shape_tail or ())
    if array.shape != expected:
        raise ValueError(f"write_xyz: `{name}` must have shape {expected}, got {describe(value)}.")
    return array


def _number(x) -> str:
    return repr(float(x))


def format_xyz_frame(
    positions,
    *,
    velocities=None,
    box=None,
    species=None,
    symbols=None,
    images=None,
    time=None,
    step=None,
) -> str:
    """One extended XYZ frame as a string (what `write_xyz` appends); see `write_xyz`."""
    if isinstance(positions, jax.core.Tracer):
        raise TypeError("write_xyz: `positions` must be a concrete array (write files outside jit), got a "
                        "traced value.")
    positions = np.asarray(positions) if positions is not None else None
    if positions is None or positions.ndim != 2 or positions.shape[1] != 3:
        raise ValueError(f"write_xyz: `positions` must have shape (N, 3) (extended XYZ is 3-D), "
                         f"got {describe(positions)}.")
    n = positions.shape[0]
    positions = _host("positions", positions, (3,), n)
    velocities = _host("velocities", velocities, (3,), n)
    images = _host("images", images, (3,), n, kind="int")
    lengths = None
    if box is not None:
        periodic = getattr(box, "periodic", None)
        if periodic is None:
            raise TypeError(f"write_xyz: `box` must be a sciax.md.Box or FreeSpace (or None), "
                            f"got {type(box).__name__}.")
        if periodic:
            lengths = np.asarray(box.lengths, dtype=np.float64)
            if lengths.shape != (3,):
                raise ValueError(f"write_xyz: the box must be 3-D, got lengths of shape {lengths.shape}.")
    if images is not None and lengths is None:
        raise ValueError("write_xyz: `images` (for the unwrapped positions) needs a periodic `box`.")
    species = np.zeros(n, np.int64) if species is None else _host("species", species, (), n, kind="int")
    n_species = int(species.max()) + 1 if n else 1
    if n and int(species.min()) < 0:
        raise ValueError(f"write_xyz: `species` must be >= 0, got min {int(species.min())}.")
    if symbols is None:
        if n_species > 1:
            raise ValueError(f"write_xyz: {n_species} species need `symbols`, one chemical symbol per species "
                             f"index (e.g. symbols=('Ar', 'Kr')).")
        symbols = ("X",)  # ASE's dummy element
    if isinstance(symbols, str) or not all(isinstance(s, str) and re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", s)
                                           for s in symbols):
        raise ValueError(f"write_xyz: `symbols` must be a sequence of element names (letters, no spaces), "
                         f"one per species index, got {symbols!r}.")
    if len(symbols) < n_species:
        raise ValueError(f"write_xyz: `symbols` names {len(symbols)} species but `species` goes up to "
                         f"{n_species - 1}.")
    properties = "species:S:1:pos:R:3"
    columns = [positions]
    if velocities is not None:
        properties += ":vel:R:3"
        columns.append(velocities)
    if images is not None:
        properties += ":unwrapped_pos:R:3"
        columns.append(positions.astype(np.float64) + images * lengths)
    header = []
    if lengths is not None:
        cell = np.diag(lengths).ravel()
        header.append('Lattice="' + " ".join(_number(x) for x in cell) + '"')
    header.append(f"Properties={properties}")
    header.append('pbc="T T T"' if lengths is not None else 'pbc="F F F"')
    if time is not None:
        if not np.ndim(time) == 0 or not np.isfinite(float(time)):
            raise ValueError(f"write_xyz: `time` must be a finite scalar, got {describe(time)}.")
        header.append(f"time={_number(time)}")
    if step is not None:
        if isinstance(step, bool) or not np.issubdtype(np.asarray(step).dtype, np.integer) or np.ndim(step):
            raise ValueError(f"write_xyz: `step` must be an integer, got {describe(step)}.")
        header.append(f"step={int(step)}")
    table = np.concatenate([c.astype(np.float64) for c in columns], axis=1).tolist()
    names = [symbols[s] for s in species.tolist()]
    lines = [f"{n}", " ".join(header)]
    lines += [name + " " + " ".join(map(repr, row)) for name, row in zip(names, table)]
    return "\n".join(lines) + "\n"


def write_xyz(
    file,
    positions,
    *,
    velocities=None,
    box=None,
    species=None,
    symbols=None,
    images=None,
    time=None,
    step=None,
    append: bool = False,
) -> None:
    """Write one frame in extended XYZ format (readable by `read_xyz`, `ase.io.read`, OVITO).

    The whole frame is formatted and checked first, then written with one `write` call, so an
    error leaves the file as it was, and a trajectory can be streamed with `append=True` (each
    call adds one complete frame).

    **Arguments:**

    - `file`: a path, or an open text file (written at its current position; `append` is then
      ignored).
    - `positions`: `(N, 3)`, length units (Å in the real system).
    - `velocities`: `(N, 3)` or None, length/time units (Å/ps); written as `vel:R:3`.
    - `box`: a `sciax.md.Box` (written as `Lattice` with `pbc="T T T"`), `FreeSpace` or None
      (no `Lattice`, `pbc="F F F"`).
    - `species`: `(N,)` int species indices (default all 0).
    - `symbols`: one chemical symbol per species index, e.g. `("Ar",)` (default `("X",)`, ASE's
      dummy element, for a single species).
    - `images`: `(N, 3)` int image counts; adds the column `unwrapped_pos:R:3` = positions +
      images · L (what `box.unwrap` gives).
    - `time` (time units), `step` (int): written on the comment line.
    - `append`: add the frame at the end of the file instead of replacing it.

    **Raises:** `ValueError`/`TypeError` naming the argument for wrong shapes, non-3-D data,
    several species without `symbols`, `images` without a periodic box, or traced values.

    ```python
    for k in range(n_frames):   # streaming a trajectory
        sciax.md.write_xyz("run.xyz", traj.states.positions[k], velocities=traj.states.velocities[k],
                           box=system.box, symbols=("Ar",), time=traj.times[k], append=k > 0)
    ```
    """
    text = format_xyz_frame(positions, velocities=velocities, box=box, species=species, symbols=symbols,
                            images=images, time=time, step=step)
    if hasattr(file, "write"):
        file.write(text)
        return
    if not isinstance(file, (str, os.PathLike)):
        raise TypeError(f"write_xyz: `file` must be a path or an open text file, got {type(file).__name__}.")
    with open(file, "a" if append else "w") as f:
        f.write(text)


def write_state_xyz(file, state, system, *, symbols=None, time=None, step=None, unwrapped: bool = False,
                    append: bool = False) -> None:
    """`write_xyz` of an `MDState` in an `MDSystem`: positions, velocities, the system's box and
    species; with `unwrapped=True` also the unwrapped positions from `state.images`.

    **Arguments:** `file`; `state` (`MDState`, one frame, no batch axis); `system` (`MDSystem`);
    `symbols`, `time`, `step`, `append` as in `write_xyz`; `unwrapped` (bool).
    """
    write_xyz(file, state.positions, velocities=state.velocities, box=system.box,
              species=getattr(system, "species", None), symbols=symbols,
              images=state.images if unwrapped else None, time=time, step=step, append=append)


_PAIR = re.compile(r'([^\s="]+)(?:\s*=\s*("[^"]*"|\{[^}]*\}|[^\s"]+))?')


def _parse_comment(line: str) -> dict:
    """`key=value` pairs (values optionally in double quotes or braces); a bare word is a flag "T"."""
    out = {}
    for m in _PAIR.finditer(line):
        value = m.group(2)
        if value is None:
            value = "T"
        elif value[:1] in '"{':
            value = value[1:-1]
        out[m.group(1)] = value
    return out


def _read_frame(lines, start, path):
    try:
        n = int(lines[start].split()[0])
    except (ValueError, IndexError):
        raise ValueError(f"read_xyz: {path}: line {start + 1} should be the number of atoms, "
                         f"got {lines[start]!r}.") from None
    if start + 2 + n > len(lines):
        raise ValueError(f"read_xyz: {path}: the frame at line {start + 1} announces {n} atoms but the file "
                         f"ends after {len(lines) - start - 2}.")
    info = _parse_comment(lines[start + 1])
    spec = info.pop("Properties", "species:S:1:pos:R:3").split(":")
    if len(spec) % 3:
        raise ValueError(f"read_xyz: {path}: malformed Properties at line {start + 2}: {':'.join(spec)!r}.")
    rows = [line.split() for line in lines[start + 2:start + 2 + n]]
    columns = {}
    col = 0
    for name, kind, width in zip(spec[0::3], spec[1::3], spec[2::3]):
        width = int(width)
        convert = _PROPERTY_TYPES[kind]
        if kind == "L":
            values = np.array([[r[col + k] in ("T", "True", "true", "1") for k in range(width)] for r in rows])
        elif kind == "S":
            values = np.array([[r[col + k] for k in range(width)] for r in rows], dtype=object)
        else:
            values = np.array([[convert(r[col + k]) for k in range(width)] for r in rows],
                              dtype=np.float64 if kind == "R" else np.int64).reshape(n, width)
        columns[name] = values[:, 0] if width == 1 else values
        col += width
    symbols = tuple(str(s) for s in columns.pop("species", np.array(["X"] * n, dtype=object)).tolist())
    species_symbols = tuple(dict.fromkeys(symbols))
    index = {s: i for i, s in enumerate(species_symbols)}
    cell = None
    if "Lattice" in info:
        cell = np.array([float(x) for x in info.pop("Lattice").split()], dtype=np.float64).reshape(3, 3)
    pbc_text = info.pop("pbc", "T T T" if cell is not None else "F F F")
    pbc = np.array([w in ("T", "True", "true", "1") for w in pbc_text.split()], dtype=bool)
    time = float(info.pop("time")) if "time" in info else None
    step = int(info.pop("step")) if "step" in info else None
    frame = XYZFrame(
        positions=columns.pop("pos"), symbols=symbols,
        species=np.array([index[s] for s in symbols], dtype=np.int32), species_symbols=species_symbols,
        velocities=columns.pop("vel", None), unwrapped_positions=columns.pop("unwrapped_pos", None),
        cell=cell, pbc=pbc, time=time, step=step, info=info, arrays=columns)
    return frame, start + 2 + n


def read_xyz(file) -> list[XYZFrame]:
    """Read every frame of an extended XYZ file (written by `write_xyz`, ASE, OVITO, ...).

    Understands `Lattice`, `Properties` (types S, R, I, L), `pbc`, `time` and `step`; other
    comment keys go to `XYZFrame.info` and other columns to `XYZFrame.arrays`.

    **Arguments:** `file`, a path or an open text file.

    **Returns:** a list of `XYZFrame`, one per frame, in file order; float columns are float64
    (bitwise what `write_xyz` was given, for float64 input).

    **Raises:** `ValueError` naming the file and line for a truncated or malformed frame;
    `FileNotFoundError` for a missing file.
    """
    if hasattr(file, "read"):
        text, path = file.read(), getattr(file, "name", "<file>")
    else:
        with open(file) as f:
            text, path = f.read(), os.fspath(file)
    lines = text.splitlines()
    frames = []
    start = 0
    while start < len(lines):
        if not lines[start].strip():
            start += 1
            continue
        frame, start = _read_frame(lines, start, path)
        frames.append(frame)
    return frames
