"""OpenMM baseline for the in.lj workload: `NonbondedForce` with `CutoffPeriodic`, the CPU
platform on one thread.

Reduced LJ units map onto OpenMM's units one to one: σ = 1 nm, ε = 1 kJ/mol, m = 1 amu give a
time unit sqrt(m σ²/ε) = 1 ps, so dt = 0.005 ps and the reduced positions and velocities are
used as they are. The force is a `NonbondedForce` with zero charges, σ = 1, ε = 1, cutoff 2.5
nm, no switching function and no dispersion correction: the hard-truncated LJ of in.lj (with
zero charges the reaction-field part of `CutoffPeriodic` contributes nothing). The integrator is
`NoseHooverIntegrator(dt)` with no thermostat attached, which is OpenMM's velocity Verlet
(`VerletIntegrator` is leapfrog: its velocities live at half steps). Its context reports
v(t) − ½ dt F(t)/m as the velocities (measured: equal to the NumPy run's to 2e-13 after that
correction); `run_checked` adds the half kick back. OpenMM manages its own
neighbour list (its skin and rebuild rule are internal). The CPU platform computes forces in
single precision (the row is labelled float32); `Threads` is set to the benchmark's thread count.
"""

from __future__ import annotations

import os

import numpy as np

from . import md_workload as wl


def available() -> str | None:
    """None if OpenMM and its CPU platform load here, else why not."""
    try:
        import openmm

        openmm.Platform.getPlatformByName("CPU")
    except Exception as e:  # noqa: BLE001
        return f"OpenMM not available ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
    return None


class OpenMMLJ:
    """The in.lj NVE run in OpenMM (CPU platform).

    **Arguments:**

    - `positions`, `velocities`: (N, 3) arrays in reduced LJ units (converted to float64 for
      OpenMM's API; the platform itself computes in single precision).
    - `box_length`: the cubic box edge L (σ).
    - `platform`: "CPU" (default) or "Reference" (double precision, slow: for tests).
    """

    def __init__(self, positions, velocities, box_length: float, *, platform: str = "CPU"):
        import openmm
        from openmm import unit

        self.n = len(positions)
        self.box = float(box_length)
        self.x0 = wl.wrap(np.asarray(positions, np.float64), self.box)
        self.v0 = np.asarray(velocities, np.float64)
        system = openmm.System()
        L = self.box
        system.setDefaultPeriodicBoxVectors(openmm.Vec3(L, 0, 0), openmm.Vec3(0, L, 0), openmm.Vec3(0, 0, L))
        force = openmm.NonbondedForce()
        force.setNonbondedMethod(openmm.NonbondedForce.CutoffPeriodic)
        force.setCutoffDistance(wl.CUTOFF)
        force.setUseSwitchingFunction(False)
        force.setUseDispersionCorrection(False)
        for _ in range(self.n):
            system.addParticle(wl.MASS)
            force.addParticle(0.0, wl.SIGMA, wl.EPSILON)
        system.addForce(force)
        self.integrator = openmm.NoseHooverIntegrator(wl.DT)
        properties = {}
        if platform == "CPU":
            properties["Threads"] = os.environ.get("BENCH_THREADS", "1")
        self.context = openmm.Context(system, self.integrator, openmm.Platform.getPlatformByName(platform),
                                      properties)
        self._unit = unit

    def _reset(self, positions=None):
        self.context.setPositions(self.x0 if positions is None else
                                  wl.wrap(np.asarray(positions, np.float64), self.box))
        self.context.setVelocities(self.v0)

    def _state(self, **kw):
        return self.context.getState(**kw)

    def step0(self, positions=None):
        """(potential energy, forces, None) at the start state, or at `positions` ((N, 3))."""
        self._reset(positions)
        s = self._state(getEnergy=True, getForces=True)
        e = s.getPotentialEnergy().value_in_unit(self._unit.kilojoule_per_mole)
        f = s.getForces(asNumpy=True).value_in_unit(self._unit.kilojoule_per_mole / self._unit.nanometer)
        return float(e), np.asarray(f), None

    def run(self, n_steps: int) -> None:
        """`n_steps` steps from the start state."""
        self._reset()
        self.integrator.step(int(n_steps))

    def run_checked(self, n_steps: int):
        """`run`, then NumPy (positions, velocities, potential energy)."""
        self.run(n_steps)
        s = self._state(getEnergy=True, getPositions=True, getVelocities=True, getForces=True)
        u = self._unit
        x = np.asarray(s.getPositions(asNumpy=True).value_in_unit(u.nanometer))
        v = np.asarray(s.getVelocities(asNumpy=True).value_in_unit(u.nanometer / u.picosecond))
        f = np.asarray(s.getForces(asNumpy=True).value_in_unit(u.kilojoule_per_mole / u.nanometer))
        # The integrator's state holds v(t) − ½ dt F(t)/m (the last half kick is applied at the
        # start of the next step): complete it to the on-step velocity.
        v = v + 0.5 * wl.DT * f / wl.MASS
        return x, v, float(s.getPotentialEnergy().value_in_unit(u.kilojoule_per_mole))
