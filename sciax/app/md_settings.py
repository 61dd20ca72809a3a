"""The parts of an MD scenario file's schema: the names it accepts, the checker that names the
file and the key in every error (`Check`), the stages and output settings, the starting
configuration (`[lattice]`, `[chains]`, `[start] file`) and the `[[stage]]` list. `md_scenario`
puts them together (`parse_md_scenario`) and builds the objects."""

import dataclasses
import math
from pathlib import Path

import numpy as np

from .schema import ScenarioError, did_you_mean, got

INTEGRATORS = ("nve", "langevin", "nose_hoover", "bussi")
POTENTIALS = ("lj", "wca")
UNITS = ("lj", "real")
LATTICES = ("sc", "bcc", "fcc")
_STAGE = ("name", "integrator", "dt", "n_steps", "temperature", "tau", "friction", "chain_length")
_NEEDS = {"nve": (), "langevin": ("temperature", "friction"), "bussi": ("temperature", "tau"),
          "nose_hoover": ("temperature", "tau")}
_BASIS = {"sc": 1, "bcc": 2, "fcc": 4}
DEFAULT_CHUNK_STEPS = 1000
WCA_CUTOFF = 2.0 ** (1.0 / 6.0)




# --------------------------------------------------------------------------- checking


class Check:
    """Value checks that raise `ScenarioError("<file>: <key>: expected ..., got ...")`."""

    def __init__(self, source: str):
        self.source = source

    def error(self, where: str, message: str) -> ScenarioError:
        return ScenarioError(f"{self.source}: {where}: {message}")

    def expected(self, where, what, value) -> ScenarioError:
        return self.error(where, f"expected {what}, got {got(value)}.")

    def table(self, data, where, keys, required=()):
        if not isinstance(data, dict):
            raise self.expected(where, "a table", data)
        for key in data:
            if key not in keys:
                raise self.error(f"{where} {key}", f"unknown key; valid keys: {', '.join(keys)}."
                                 f"{did_you_mean(key, keys)}")
        for key in required:
            if key not in data:
                raise self.error(where, f"missing required key {key!r}.")
        return data

    def number(self, where, value, *, positive=False, nonnegative=False):
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if ok and positive and not value > 0:
            ok = False
        if ok and nonnegative and not value >= 0:
            ok = False
        if not ok:
            what = "a positive" if positive else "a non-negative" if nonnegative else "a"
            raise self.expected(where, f"{what} finite number", value)
        return float(value)

    def integer(self, where, value, *, minimum=1):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.expected(where, f"an integer >= {minimum}", value)
        return value

    def choice(self, where, value, options):
        if value not in options:
            hint = did_you_mean(value, options) if isinstance(value, str) else ""
            raise self.error(where, f"expected one of {', '.join(repr(o) for o in options)}, got {got(value)}."
                             f"{hint}")
        return value

    def string(self, where, value):
        if not isinstance(value, str) or not value:
            raise self.expected(where, "a non-empty string", value)
        return value


# --------------------------------------------------------------------------- the scenario


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage of an MD run: an integrator, its step size and length (validated values,
    in the scenario's units)."""

    name: str
    integrator: str
    dt: float
    n_steps: int
    temperature: float | None = None
    tau: float | None = None
    friction: float | None = None
    chain_length: int = 3


@dataclasses.dataclass(frozen=True)
class MDOutput:
    """The `[output]` table, validated."""

    dir: str
    thermo_every: int
    trajectory_every: int
    chunk_steps: int
    unwrapped: bool = False
    plot: bool = True
    rdf_bins: int = 100
    rdf_max: float | None = None
    rdf_every: int = 250


def chain_configuration(n_chains: int, length: int, density: float):
    """Bead-spring chains on a simple-cubic grid, without overlaps (host side).

    The grid has c = ceil((n_chains · length)^(1/3)) sites per side in a cubic box of side
    L = (n_chains · length / density)^(1/3); a boustrophedon path visits the sites so that each
    next site is a nearest neighbour (distance L / c), and chain k is beads k·length .. (k+1)·length − 1
    of the path.

    **Returns:** positions `(n_chains · length, 3)`, box lengths `(3,)` (length units) and the
    chains' atom indices `(n_chains, length)`.
    """
    n = n_chains * length
    c = math.ceil(round(n ** (1.0 / 3.0), 9))
    side = (n / density) ** (1.0 / 3.0)
    a = side / c
    sites = []
    for z in range(c):
        ys = range(c) if z % 2 == 0 else range(c - 1, -1, -1)
        for j, y in enumerate(ys):
            xs = range(c) if (j + z * c) % 2 == 0 else range(c - 1, -1, -1)
            sites += [(x, y, z) for x in xs]
    positions = (np.asarray(sites[:n], np.float64) + 0.5) * a
    return positions, np.full(3, side), np.arange(n).reshape(n_chains, length)


def chain_spacing(n_chains: int, length: int, density: float) -> float:
    """The bond length of `chain_configuration` (length units)."""
    n = n_chains * length
    return (n / density) ** (1.0 / 3.0) / math.ceil(round(n ** (1.0 / 3.0), 9))


# --------------------------------------------------------------------------- parsing

def lengths_text(lengths) -> str:
    return " x ".join(f"{x:g}" for x in lengths)


def parse_start(c: Check, form: str, table, folder):
    """(the start spec, number of atoms, box lengths) of [lattice], [start] or [chains]."""
    where = f"[{form}]"
    if form == "lattice":
        t = dict(c.table(table, where, ("kind", "density", "lattice_constant", "cells"), required=("kind", "cells")))
        c.choice(f"{where} kind", t["kind"], LATTICES)
        cells = t["cells"]
        cells = [cells] * 3 if isinstance(cells, int) and not isinstance(cells, bool) else cells
        if not (isinstance(cells, list) and len(cells) == 3 and all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in cells)):
            raise c.expected(f"{where} cells", "a positive integer or an array of three", t["cells"])
        t["cells"] = cells
        if ("density" in t) == ("lattice_constant" in t):
            raise c.error(where, "expected exactly one of density (number density) and lattice_constant.")
        if "density" in t:
            rho = c.number(f"{where} density", t["density"], positive=True)
            a = (_BASIS[t["kind"]] / rho) ** (1.0 / 3.0)
        else:
            a = c.number(f"{where} lattice_constant", t["lattice_constant"], positive=True)
        n = _BASIS[t["kind"]] * math.prod(cells)
        if n < 2:
            raise c.error(f"{where} cells", f"expected at least 2 atoms, the lattice holds {n}.")
        return {"lattice": t}, n, [a * x for x in cells]
    if form == "chains":
        t = dict(c.table(table, where, ("n_chains", "length", "density"), required=("n_chains", "length", "density")))
        c.integer(f"{where} n_chains", t["n_chains"])
        c.integer(f"{where} length", t["length"], minimum=2)
        c.number(f"{where} density", t["density"], positive=True)
        n = t["n_chains"] * t["length"]
        side = (n / t["density"]) ** (1.0 / 3.0)
        return {"chains": t}, n, [side] * 3
    t = dict(c.table(table, where, ("file", "n_atoms"), required=("file",)))
    c.string(f"{where} file", t["file"])
    path = Path(t["file"]).expanduser()
    if not path.is_absolute() and folder is not None:
        path = Path(folder) / path
    from ..md import read_xyz

    try:
        frames = read_xyz(path)
    except FileNotFoundError:
        raise c.error(f"{where} file", f"no such file {str(path)!r}.") from None
    except (OSError, ValueError, KeyError, IndexError) as e:
        raise c.error(f"{where} file", f"{str(path)!r} is not a readable extended XYZ file ({e}).") from None
    if not frames:
        raise c.error(f"{where} file", f"{str(path)!r} holds no frame.")
    frame = frames[0]
    n = frame.positions.shape[0]
    if "n_atoms" in t:
        c.integer(f"{where} n_atoms", t["n_atoms"])
        if t["n_atoms"] != n:
            raise c.error(f"{where} n_atoms", f"expected {t['n_atoms']} atoms, but the first frame of "
                          f"{str(path)!r} holds {n}.")
    if frame.cell is None or not np.all(frame.pbc):
        raise c.error(f"{where} file", f"expected a periodic frame with a Lattice (pbc=\"T T T\"), {str(path)!r} "
                      f"has {'no Lattice' if frame.cell is None else f'pbc={frame.pbc.tolist()}'}.")
    try:
        lengths = frame.lengths
    except ValueError as e:
        raise c.error(f"{where} file", f"{e}") from None
    if len(set(frame.symbols)) != 1:
        raise c.error(f"{where} file", f"expected one species, the file holds {list(frame.species_symbols)}.")
    if n < 2:
        raise c.error(f"{where} file", f"expected at least 2 atoms, the file holds {n}.")
    spec = {"file": t["file"], "path": str(path.resolve()), "has_velocities": frame.velocities is not None,
            "symbol": frame.symbols[0]}
    return {"start": spec}, n, [float(x) for x in lengths]


def parse_stages(c: Check, stages):
    if isinstance(stages, dict):
        stages = [stages]
    if not isinstance(stages, list) or not stages:
        raise c.expected("[[stage]]", "one or more [[stage]] tables", stages)
    out = []
    for k, t in enumerate(stages):
        label = f"[[stage]] {k + 1}"
        if not isinstance(t, dict):
            raise c.expected(label, "a table", t)
        c.table(t, label, _STAGE, required=("integrator", "dt", "n_steps"))
        name = t.get("name", f"stage{k + 1}")
        if not isinstance(name, str) or not name:
            raise c.expected(f"{label} name", "a non-empty string", name)
        label = f"{label} ({name})"
        integrator = c.choice(f"{label} integrator", t["integrator"], INTEGRATORS)
        dt = c.number(f"{label} dt", t["dt"], positive=True)
        n_steps = c.integer(f"{label} n_steps", t["n_steps"])
        values = {}
        for key in ("temperature", "tau", "friction"):
            if key in t:
                if key not in _NEEDS[integrator]:
                    raise c.error(f"{label} {key}", f"not a parameter of integrator = {integrator!r} (it takes "
                                  f"{', '.join(_NEEDS[integrator]) or 'none'}).")
                values[key] = c.number(f"{label} {key}", t[key], positive=key != "friction",
                                       nonnegative=key == "friction")
        for key in _NEEDS[integrator]:
            if key not in values:
                raise c.error(label, f"missing {key!r}, which integrator = {integrator!r} needs.")
        chain = 3
        if "chain_length" in t:
            if integrator != "nose_hoover":
                raise c.error(f"{label} chain_length", "only integrator = \"nose_hoover\" takes it.")
            chain = c.integer(f"{label} chain_length", t["chain_length"])
        out.append(Stage(name=name, integrator=integrator, dt=dt, n_steps=n_steps, chain_length=chain, **values))
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise c.error("[[stage]] name", f"expected distinct stage names, got {names}.")
    return out
