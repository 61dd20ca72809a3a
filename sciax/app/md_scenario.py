"""Molecular-dynamics scenario files: the TOML schema, its validation, and the objects it describes.

A scenario with a top-level `[md]` table is an MD run (`sciax run` hands it to `sciax.md_run`):

```toml
name = "lj_melt"                      # optional; default: the file name without .toml
description = "LAMMPS in.lj"          # optional

[md]
units = "lj"                          # "lj" (reduced: σ, ε, m, τ) or "real" (Å, eV, amu, ps, K)
precision = "float64"                 # or "float32"
seed = 0                              # velocities and thermostat noise, 0 <= seed < 2**32
mass = 1.0                            # per atom (m; amu in real units)
symbol = "Ar"                         # the species' symbol in the trajectory (default: the start
                                      # file's, else "X")

[lattice]                             # exactly one of [lattice], [start], [chains]
kind = "fcc"                          # "sc", "bcc" or "fcc"
density = 0.8442                      # number density (σ⁻³; Å⁻³), or lattice_constant = ...
cells = 10                            # cells per side, or [nx, ny, nz]

# [start]                             # an extended XYZ file (first frame; orthorhombic cell)
# file = "start.xyz"                  # relative to the scenario file's folder
# n_atoms = 4000                      # optional: checked against the file

# [chains]                            # bead-spring chains (Kremer–Grest), FENE bonds
# n_chains = 20                       # along a space-filling path on a simple-cubic grid
# length = 25                         # beads per chain
# density = 0.85                      # bead number density

[potential]
kind = "lj"                           # "lj" or "wca"
epsilon = 1.0                         # ε (eV in real units)
sigma = 1.0                           # σ (Å in real units)
cutoff = 2.5                          # lj only (length units); wca cuts at 2^(1/6) σ
shift = "none"                        # lj: "none", "energy" or "force"

# [bonds]                             # with [chains]: FENE bonds (k in ε/σ², r0 in σ)
# kind = "fene"
# k = 30.0
# r0 = 1.5

[neighbours]
skin = 0.3                            # Verlet-list skin (length units)
# capacity = 64                       # neighbours per atom to start with (grown on overflow)
# cell_capacity = 32                  # atoms per row of cells to start with (grown on overflow)

[velocities]                          # Maxwell–Boltzmann, zero momentum, exactly this temperature
temperature = 3.0                     # T* = kT/ε (lj) or K (real); leave the table out to take
                                      # the start file's velocities

[[stage]]                             # one or more stages, run in order
name = "production"
integrator = "nve"                    # "nve", "langevin", "nose_hoover" or "bussi"
dt = 0.005                            # time units (τ; ps)
n_steps = 1000
# temperature = 0.85                  # thermostats: target temperature (T* or K)
# tau = 0.5                           # nose_hoover, bussi: time constant (time units)
# friction = 1.0                      # langevin: collision rate (1/time units)
# chain_length = 3                    # nose_hoover

[output]
dir = "runs/lj_melt"                  # default runs/<name>
thermo_every = 50                     # steps between rows of thermo.csv
trajectory_every = 500                # steps between frames of trajectory.xyz (0: none)
chunk_steps = 1000                    # steps per checkpoint
unwrapped = false                     # also write unwrapped positions (unwrapped_pos:R:3)
plot = true                           # thermo.png, rdf.png, msd.png
rdf_bins = 100                        # g(r) over the last stage, r < rdf_max
rdf_every = 250                       # steps between the frames g(r) averages (default 5 thermo_every)
# rdf_max = 4.0                       # default: just under half the shortest box side
```

Every error is a `ScenarioError` naming the file, the key, what was expected and what was found,
raised before anything is written.
"""

import dataclasses
import math
import tomllib
from pathlib import Path

import numpy as np

from .md_settings import (
    DEFAULT_CHUNK_STEPS,
    POTENTIALS,
    UNITS,
    WCA_CUTOFF,
    Check,
    MDOutput,
    Stage,
    chain_configuration,
    chain_spacing,
    lengths_text,
    parse_stages,
    parse_start,
)
from .schema import (
    PRECISIONS,
    ScenarioError,
    override_record,
    parse_toml,
    physics_hash,
    read_scenario_text,
    set_precision,
)


def is_md_scenario(path) -> bool:
    """Whether the file at `path` is readable TOML with a top-level `[md]` table."""
    try:
        with open(path, "rb") as f:
            return isinstance(tomllib.load(f).get("md"), dict)
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return False


@dataclasses.dataclass(frozen=True)
class MDBuilt:
    """What an MD scenario describes, ready to run.

    - `system`: the `MDSystem` (allocated neighbour capacities), `state0`: the `MDState`.
    - `integrators`: one per stage. `keys`: one `jax.random` key per stage (None for NVE).
    - `dtype`; `symbols`: the species' symbols for the trajectory; `bond_chains`: `(n_chains,
      length)` atom indices of the chains (None without chains), for the end-to-end distance.
    - `kT_unit`: the energy of one unit of the scenario's temperature (1 in lj units, k_B in
      eV/K in real units); `pressure_unit`: the factor from the system's pressure to the
      reported one (1 in lj units; bar in real units).
    """

    system: object
    state0: object
    integrators: tuple
    keys: tuple
    dtype: object
    symbols: tuple
    bond_chains: object
    kT_unit: float
    pressure_unit: float


@dataclasses.dataclass(frozen=True)
class MDScenario:
    """A validated MD scenario (`load_md_scenario`). `build()` makes the objects; run it with
    `sciax.md_run.run_md`."""

    source: str
    text: str
    name: str
    description: str
    md: dict
    start: dict            # {"lattice": {...}} | {"start": {...}} | {"chains": {...}}
    potential: dict
    bonds: dict | None
    neighbours: dict
    velocities: dict | None
    stages: tuple
    output: MDOutput
    n_atoms: int
    box_lengths: tuple
    overrides: dict = dataclasses.field(default_factory=dict)

    @property
    def output_dir(self) -> Path:
        return Path(self.output.dir).expanduser()

    @property
    def n_steps(self) -> int:
        return sum(s.n_steps for s in self.stages)

    @property
    def precision(self) -> str:
        return self.md.get("precision", "float64")

    @property
    def units(self) -> str:
        return self.md.get("units", "lj")

    def stage_starts(self) -> list[int]:
        """The global step at which each stage starts."""
        out, total = [], 0
        for s in self.stages:
            out.append(total)
            total += s.n_steps
        return out

    def stage_times(self) -> list[float]:
        """The time at which each stage starts (float64 sums of dt · n_steps)."""
        out, t = [], 0.0
        for s in self.stages:
            out.append(t)
            t += s.dt * s.n_steps
        return out

    def physics(self) -> dict:
        """What determines the computed run (hashed for `--resume`): everything but `[output]`
        `dir`/`plot` and the last stage's `n_steps` (a run may be extended)."""
        stages = {f"{k + 1} {s.name}": dataclasses.asdict(s) for k, s in enumerate(self.stages)}
        stages[f"{len(self.stages)} {self.stages[-1].name}"].pop("n_steps")
        start = self.start
        if "start" in start:  # the file's contents, not its name, decide the run
            start = {"start": {**start["start"], "sha256": _file_hash(start["start"]["path"])}}
            start["start"].pop("path")
        out = dataclasses.asdict(self.output)
        for k in ("dir", "plot"):
            out.pop(k)
        return {"md": self.md, "start": start, "potential": self.potential, "bonds": self.bonds,
                "neighbours": {k: v for k, v in self.neighbours.items() if k not in ("capacity", "cell_capacity")},
                "velocities": self.velocities, "stages": stages, "output": out}

    def hash(self) -> str:
        return physics_hash(self.physics())

    def with_overrides(self, *, n_steps: int | None = None) -> "MDScenario":
        """`--n-steps N`: the last stage's length becomes N (a multiple of the output intervals)."""
        if n_steps is None:
            return self
        step = _interval(self.output)
        if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps <= 0 or n_steps % step:
            raise ScenarioError(f"--n-steps: expected a positive multiple of {step} ([output] thermo_every and "
                                f"trajectory_every) for the last [[stage]] of {self.source}, got {n_steps!r}.")
        stages = self.stages[:-1] + (dataclasses.replace(self.stages[-1], n_steps=n_steps),)
        return dataclasses.replace(self, stages=stages, overrides={**self.overrides, "n_steps": n_steps})

    # -- objects

    def build(self) -> MDBuilt:
        """Set the precision and make the system, initial state, integrators and keys.

        **Raises:** `ScenarioError` naming the table a constructor rejected.
        """
        import jax
        import jax.numpy as jnp
        import jax.random as jr

        from .. import md

        set_precision(self.precision)
        dtype = jnp.dtype(self.precision)
        real = self.units == "real"
        kT_unit = md.units.BOLTZMANN if real else 1.0
        pressure_unit = md.units.EV_PER_A3_IN_BAR if real else 1.0
        positions, lengths, velocities, images, chains = self._configuration()
        n = positions.shape[0]
        mass = self.md.get("mass", 1.0)
        masses = np.full(n, md.units.masses_from_amu(mass) if real else mass)
        box = md.Box(jnp.asarray(lengths, dtype))
        pot = self.potential
        if pot["kind"] == "lj":
            potential = md.LennardJones(jnp.asarray(pot["epsilon"], dtype), jnp.asarray(pot["sigma"], dtype),
                                        jnp.asarray(pot["cutoff"], dtype), shift=pot["shift"])
        else:
            potential = md.WCA(jnp.asarray(pot["epsilon"], dtype), jnp.asarray(pot["sigma"], dtype))
        bond_chains = None
        if chains is not None:
            bond_chains = chains
            bonds = np.stack([chains[:, :-1].ravel(), chains[:, 1:].ravel()], axis=1).astype(np.int32)
            potential = potential + md.FENEBond(jnp.asarray(bonds), jnp.asarray(self.bonds["k"], dtype),
                                                jnp.asarray(self.bonds["r0"], dtype))
        nb = self.neighbours
        strategy = md.VerletList(skin=jnp.asarray(nb["skin"], dtype))
        try:
            system = md.MDSystem(box, potential, jnp.asarray(masses, dtype), neighbours=strategy)
            x = jnp.asarray(positions, dtype)
            system = system.allocate(x)
        except (TypeError, ValueError) as e:
            raise self._error("[potential]", f"the system cannot be built: {e}") from None
        if "capacity" in nb or "cell_capacity" in nb:  # chosen starting capacities (grown on overflow)
            import equinox as eqx

            s = system.neighbours
            system = eqx.tree_at(lambda t: t.neighbours, system, md.VerletList(
                skin=s.skin, capacity=nb.get("capacity", s.capacity),
                cell_capacity=nb.get("cell_capacity", s.cell_capacity), grid=s.grid))
        base = jr.key(self.md.get("seed", 0))
        if self.velocities is not None:
            kT = self.velocities["temperature"] * kT_unit
            v = md.maxwell_boltzmann(system.masses, jnp.asarray(kT, dtype), key=jr.fold_in(base, 2**31 - 1),
                                     dtype=dtype)
        else:
            v = jnp.asarray(velocities, dtype)
        state0 = md.MDState(x, v, None if images is None else jnp.asarray(images, jnp.int32))
        integrators, keys = [], []
        for k, s in enumerate(self.stages):
            integrators.append(self._integrator(s, kT_unit, dtype))
            keys.append(jr.fold_in(base, k) if s.integrator in ("langevin", "bussi") else None)
        jax.block_until_ready(state0)
        return MDBuilt(system=system, state0=state0, integrators=tuple(integrators), keys=tuple(keys),
                       dtype=dtype, symbols=(self.md.get("symbol", "X"),), bond_chains=bond_chains,
                       kT_unit=kT_unit, pressure_unit=pressure_unit)

    def _error(self, where, message):
        return ScenarioError(f"{self.source}: {where}: {message}")

    def _integrator(self, s: Stage, kT_unit, dtype):
        import jax.numpy as jnp

        from .. import md

        def a(x):
            return jnp.asarray(x, dtype)

        if s.integrator == "nve":
            return md.VelocityVerlet()
        kT = a(s.temperature * kT_unit)
        if s.integrator == "langevin":
            return md.Langevin(kT, a(s.friction))
        if s.integrator == "bussi":
            return md.Bussi(kT, a(s.tau))
        return md.NoseHooverChain(kT, a(s.tau), chain_length=s.chain_length)

    def _configuration(self):
        """(positions (N, 3), box lengths (3,), velocities or None, images or None, chains or None)
        as float64 NumPy arrays."""
        from .. import md

        if "lattice" in self.start:
            spec = self.start["lattice"]
            kw = {"density": spec["density"]} if "density" in spec else {"lattice_constant": spec["lattice_constant"]}
            x, box = md.lattice(spec["kind"], tuple(spec["cells"]), dtype="float64", **kw)
            return np.asarray(x), np.asarray(box.lengths), None, None, None
        if "chains" in self.start:
            spec = self.start["chains"]
            x, lengths, chains = chain_configuration(spec["n_chains"], spec["length"], spec["density"])
            return x, lengths, None, None, chains
        frame = md.read_xyz(self.start["start"]["path"])[0]
        lengths = frame.lengths
        positions = frame.positions
        images = frame.images
        wrapped = positions - np.floor(positions / lengths) * lengths
        wrapped = np.where(wrapped >= lengths, wrapped - lengths, wrapped)
        shift = np.rint((positions - wrapped) / lengths).astype(np.int64)
        images = shift if images is None else images + shift
        return wrapped, lengths, frame.velocities, images, None


def _file_hash(path) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _interval(output: MDOutput) -> int:
    """The step count every stage length must be a multiple of."""
    if output.trajectory_every:
        return math.lcm(output.thermo_every, output.trajectory_every)
    return output.thermo_every


_TOP = ("name", "description", "md", "lattice", "start", "chains", "potential", "bonds", "neighbours",
        "velocities", "stage", "output")
_MD = ("units", "precision", "seed", "mass", "symbol")
_OUTPUT = ("dir", "thermo_every", "trajectory_every", "chunk_steps", "unwrapped", "plot", "rdf_bins", "rdf_max",
           "rdf_every")


def parse_md_scenario(text: str, source: str = "<scenario>", *, default_name: str = "scenario",
                      folder=None, overrides=()) -> MDScenario:
    """Parse and validate MD scenario TOML `text`; `source` names the file in messages and
    `folder` is where a `[start] file` is looked for (default: the current folder). `overrides`:
    `"key.path=value"` strings (`sciax run --set`, e.g. `"stage.1.n_steps=200"`), validated like
    the file.

    **Raises:** `ScenarioError` naming the file, the key, what was expected and what was found.
    """
    data = parse_toml(text, source, overrides)
    c = Check(f"{source} (with --set {' '.join(overrides)})" if overrides else source)
    c.table(data, "top level", _TOP, required=("md", "potential", "stage"))
    name = data.get("name", default_name)
    if not isinstance(name, str) or not name or any(ch in name for ch in "/\\") or name in (".", ".."):
        raise c.expected("name", "a plain name usable as a folder name", name)
    description = data.get("description", "")
    if not isinstance(description, str):
        raise c.expected("description", "a string", description)

    md = dict(c.table(data["md"], "[md]", _MD))
    c.choice("[md] units", md.setdefault("units", "lj"), UNITS)
    c.choice("[md] precision", md.setdefault("precision", "float64"), PRECISIONS)
    seed = c.integer("[md] seed", md.setdefault("seed", 0), minimum=0)
    if seed >= 2**32:
        raise c.error("[md] seed", f"expected an integer below 2**32, got {seed}.")
    c.number("[md] mass", md.setdefault("mass", 1.0), positive=True)
    forms = [k for k in ("lattice", "start", "chains") if k in data]
    if len(forms) != 1:
        raise c.error("top level", "expected exactly one of the tables [lattice], [start] and [chains] (the "
                      f"initial configuration), got {', '.join(f'[{f}]' for f in forms) or 'none'}.")
    start, n_atoms, lengths = parse_start(c, forms[0], data[forms[0]], folder)
    symbol = md.setdefault("symbol", start["start"]["symbol"] if "start" in start else "X")
    if not isinstance(symbol, str) or not symbol.isalpha():
        raise c.expected("[md] symbol", 'a chemical symbol of letters, e.g. "Ar"', symbol)

    pot = dict(c.table(data["potential"], "[potential]", ("kind", "epsilon", "sigma", "cutoff", "shift"),
                       required=("kind",)))
    kind = c.choice("[potential] kind", pot["kind"], POTENTIALS)
    pot["epsilon"] = c.number("[potential] epsilon", pot.get("epsilon", 1.0), positive=True)
    pot["sigma"] = c.number("[potential] sigma", pot.get("sigma", 1.0), positive=True)
    if kind == "lj":
        if "cutoff" not in pot:
            raise c.error("[potential]", "missing required key 'cutoff' (length units) for kind = \"lj\".")
        pot["cutoff"] = c.number("[potential] cutoff", pot["cutoff"], positive=True)
        pot["shift"] = c.choice("[potential] shift", pot.get("shift", "none"), ("none", "energy", "force"))
    else:
        for key in ("cutoff", "shift"):
            if key in pot:
                raise c.error(f"[potential] {key}", "not used by kind = \"wca\" (its cutoff is 2^(1/6) sigma); "
                              "remove it.")
        pot["cutoff"] = WCA_CUTOFF * pot["sigma"]
        pot["shift"] = "energy"

    bonds = None
    if "bonds" in data or "chains" in start:
        if "chains" not in start:
            raise c.error("[bonds]", "bonds need [chains] (the chains they join); remove [bonds] or use [chains].")
        b = dict(c.table(data.get("bonds", {}), "[bonds]", ("kind", "k", "r0")))
        c.choice("[bonds] kind", b.setdefault("kind", "fene"), ("fene",))
        b["k"] = c.number("[bonds] k", b.get("k", 30.0), nonnegative=True)
        b["r0"] = c.number("[bonds] r0", b.get("r0", 1.5), positive=True)
        spacing = chain_spacing(start["chains"]["n_chains"], start["chains"]["length"], start["chains"]["density"])
        if not spacing < 0.95 * b["r0"]:
            raise c.error("[chains] density", f"the chains' bond length on the grid is {spacing:.4g}, too close to "
                          f"the FENE limit [bonds] r0 = {b['r0']:g} (expected below {0.95 * b['r0']:.4g}); raise the "
                          "density.")
        bonds = b

    nb = dict(c.table(data.get("neighbours", {}), "[neighbours]", ("skin", "capacity", "cell_capacity")))
    nb["skin"] = c.number("[neighbours] skin", nb.get("skin", 0.3), nonnegative=True)
    for key in ("capacity", "cell_capacity"):
        if key in nb:
            c.integer(f"[neighbours] {key}", nb[key], minimum=1)
    radius = pot["cutoff"] + nb["skin"]
    half = min(lengths) / 2
    if not radius < half:
        where = "[potential] cutoff" if kind == "lj" else "[potential] sigma"
        raise c.error(where, f"the cutoff ({pot['cutoff']:g}) plus [neighbours] skin ({nb['skin']:g}) = {radius:g} "
                      f"must be below half the smallest box side ({half:g}, box {lengths_text(lengths)}); use more "
                      "atoms (a larger box), a smaller cutoff or a smaller skin.")

    velocities = None
    if "velocities" in data:
        vt = c.table(data["velocities"], "[velocities]", ("temperature",), required=("temperature",))
        velocities = {"temperature": c.number("[velocities] temperature", vt["temperature"], nonnegative=True)}
    elif "start" not in start or not start["start"]["has_velocities"]:
        raise c.error("[velocities]", "missing: give [velocities] temperature = ... (the start configuration has "
                      "no velocities).")

    stages = parse_stages(c, data["stage"])
    out = dict(c.table(data.get("output", {}), "[output]", _OUTPUT))
    out.setdefault("dir", str(Path("runs") / name))
    if not isinstance(out["dir"], str) or not out["dir"].strip():
        raise c.expected("[output] dir", 'a non-empty folder path, e.g. "runs/lj"', out["dir"])
    out["thermo_every"] = c.integer("[output] thermo_every", out.get("thermo_every", 50))
    out["trajectory_every"] = c.integer("[output] trajectory_every", out.get("trajectory_every", 0), minimum=0)
    for key in ("unwrapped", "plot"):
        if key in out and not isinstance(out[key], bool):
            raise c.expected(f"[output] {key}", "true or false", out[key])
    out["rdf_bins"] = c.integer("[output] rdf_bins", out.get("rdf_bins", 100))
    out["rdf_every"] = c.integer("[output] rdf_every", out.get("rdf_every", 5 * out["thermo_every"]))
    if out["rdf_every"] % out["thermo_every"]:
        raise c.error("[output] rdf_every", f"expected a multiple of thermo_every ({out['thermo_every']}), got "
                      f"{out['rdf_every']}.")
    if "rdf_max" in out:
        out["rdf_max"] = c.number("[output] rdf_max", out["rdf_max"], positive=True)
        if not out["rdf_max"] <= half:
            raise c.error("[output] rdf_max", f"expected at most half the smallest box side ({half:g}), got "
                          f"{out['rdf_max']:g}.")
    step = math.lcm(out["thermo_every"], out["trajectory_every"] or 1)
    out["chunk_steps"] = c.integer("[output] chunk_steps", out.get("chunk_steps", max(step, DEFAULT_CHUNK_STEPS
                                                                                     // step * step)))
    for key in ("chunk_steps",):
        if out[key] % step:
            raise c.error(f"[output] {key}", f"expected a multiple of thermo_every and trajectory_every ({step}), "
                          f"got {out[key]}.")
    for k, s in enumerate(stages):
        if s.n_steps % step:
            raise c.error(f"[[stage]] {k + 1} ({s.name}) n_steps", f"expected a multiple of [output] thermo_every "
                          f"and trajectory_every ({step}), got {s.n_steps}.")
    output = MDOutput(**out)
    return MDScenario(source=source, text=text, name=name, description=description, md=md, start=start,
                      potential=pot, bonds=bonds, neighbours=nb, velocities=velocities, stages=tuple(stages),
                      output=output, n_atoms=n_atoms, box_lengths=tuple(float(x) for x in lengths),
                      overrides=override_record(overrides))


def load_md_scenario(path, *, n_steps: int | None = None, overrides=()) -> MDScenario:
    """Read and validate the MD scenario file `path`; `overrides` are `sciax run --set` strings
    (`"stage.1.n_steps=200"`), `n_steps` overrides the last stage's length.

    **Raises:** `ScenarioError` naming the file, the key and what was expected.
    """
    path = Path(path)
    scenario = parse_md_scenario(read_scenario_text(path), str(path), default_name=path.stem, folder=path.parent,
                                 overrides=overrides)
    return scenario.with_overrides(n_steps=n_steps)
