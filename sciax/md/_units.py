"""Units for molecular dynamics: reduced Lennard-Jones units and one real system (Å, eV, ps, K).

sciax's equations of motion carry no unit factors (a = F / m, K = ½ m v², kT in energy units),
so any consistent set of units works. Two are named here:

* **Reduced Lennard-Jones units**: lengths in σ, energies in ε, masses in m, times in
  τ = σ √(m/ε), temperatures as kT in ε, pressures in ε/σ³, number densities in σ⁻³.
  `LJUnits(sigma, epsilon, mass)` converts them to and from the real system.
* **The real system**: lengths in Å, energies in eV, times in ps, temperatures in K (enter as
  kT = k_B T in eV), velocities in Å/ps, forces in eV/Å, pressures in eV/Å³. Masses are
  *given* in amu (g/mol), but with eV, Å and ps the mass unit of the equations of motion is
  eV·ps²/Å² (≈ 9648.53 amu): convert with `masses_from_amu` before building a system.

Constants are CODATA 2018 (the SI since 2019 fixes e, k_B and N_A exactly; the atomic mass
constant is the 2018 recommended value). They equal `ase.units.create_units("2018")`.

```python
import sciax.md as md
masses = md.units.masses_from_amu(jnp.full(n_atoms, 39.948))   # argon, eV ps²/Å²
kT = md.units.kT_from_kelvin(120.0)                           # eV
p_bar = md.units.bar_from_pressure(pressure)                  # eV/Å³ -> bar
```
"""

from dataclasses import dataclass
from typing import Literal

import numpy as np

# --- CODATA 2018 ----------------------------------------------------------------------------
ELEMENTARY_CHARGE = 1.602176634e-19
"""Elementary charge e, in C (exact)."""
BOLTZMANN_SI = 1.380649e-23
"""Boltzmann constant k_B, in J/K (exact)."""
AVOGADRO = 6.02214076e23
"""Avogadro constant N_A, in 1/mol (exact)."""
ATOMIC_MASS_CONSTANT = 1.66053906660e-27
"""Atomic mass constant m_u (1 amu = 1 g/mol / N_A), in kg (CODATA 2018)."""

# --- the real system (Å, eV, ps, K) -----------------------------------------------------------
BOLTZMANN = BOLTZMANN_SI / ELEMENTARY_CHARGE
"""Boltzmann constant k_B, in eV/K (8.617333262e-5)."""
kB = BOLTZMANN
"""Alias of `BOLTZMANN`: k_B in eV/K."""
AMU_A2_PER_PS2 = ATOMIC_MASS_CONSTANT * 1e-20 / 1e-24 / ELEMENTARY_CHARGE
"""1 amu·Å²/ps² expressed in eV (1.0364269656e-4): the kinetic energy ½ m v² of a mass in amu
and a velocity in Å/ps is `0.5 * m * v**2 * AMU_A2_PER_PS2` eV. Also the mass unit conversion:
1 amu = `AMU_A2_PER_PS2` eV·ps²/Å²."""
EV_PER_A3_IN_BAR = ELEMENTARY_CHARGE * 1e30 / 1e5
"""1 eV/Å³ expressed in bar (1.602176634e6)."""
EV_PER_A3_IN_PA = ELEMENTARY_CHARGE * 1e30
"""1 eV/Å³ expressed in Pa (1.602176634e11)."""
FEMTOSECOND = 1e-3
"""1 fs in ps."""
ASE_TIME = 1e-10 * np.sqrt(ATOMIC_MASS_CONSTANT / ELEMENTARY_CHARGE) * 1e12
"""ASE's unit of time Å·√(amu/eV), in ps (≈ 0.010181, i.e. 10.18 fs); ASE velocities are in Å per this unit."""


def kT_from_kelvin(temperature):
    """kT = k_B T: a temperature in K as an energy in eV.

    **Arguments:** `temperature`, K (a number or an array).

    **Returns:** kT in eV, of the input's type and (floating) dtype.
    """
    return temperature * BOLTZMANN


def kelvin_from_kT(kT):
    """T = kT / k_B: an energy in eV as a temperature in K.

    **Arguments:** `kT`, eV. **Returns:** the temperature in K.
    """
    return kT / BOLTZMANN


def masses_from_amu(masses):
    """Masses in amu (g/mol) in the real system's mass unit eV·ps²/Å²: m · `AMU_A2_PER_PS2`.

    **Arguments:** `masses`, amu. **Returns:** masses in eV·ps²/Å² (what `MDSystem` takes).
    """
    return masses * AMU_A2_PER_PS2


def amu_from_masses(masses):
    """Masses in the real system's unit eV·ps²/Å² back in amu (inverse of `masses_from_amu`).

    **Arguments:** `masses`, eV·ps²/Å². **Returns:** masses in amu.
    """
    return masses / AMU_A2_PER_PS2


def bar_from_pressure(pressure):
    """A pressure (or stress) in eV/Å³ in bar.

    **Arguments:** `pressure`, eV/Å³. **Returns:** the pressure in bar.
    """
    return pressure * EV_PER_A3_IN_BAR


def pressure_from_bar(pressure):
    """A pressure in bar in eV/Å³ (inverse of `bar_from_pressure`).

    **Arguments:** `pressure`, bar. **Returns:** the pressure in eV/Å³.
    """
    return pressure / EV_PER_A3_IN_BAR


Quantity = Literal["length", "energy", "mass", "time", "temperature", "velocity", "force", "pressure",
                   "density", "kT"]
_QUANTITIES = ("length", "energy", "mass", "time", "temperature", "velocity", "force", "pressure",
               "density", "kT")


@dataclass(frozen=True)
class LJUnits:
    """Reduced Lennard-Jones units of one substance, and conversion to the real system.

    The reduced unit of each quantity, in real units:

    | quantity | reduced unit | real unit |
    |---|---|---|
    | length | σ | Å |
    | energy, kT | ε | eV |
    | mass | m | amu |
    | time | τ = σ √(m/ε) | ps |
    | temperature | ε / k_B | K |
    | velocity | σ / τ | Å/ps |
    | force | ε / σ | eV/Å |
    | pressure | ε / σ³ | eV/Å³ |
    | density (number) | σ⁻³ | Å⁻³ |

    **Arguments:**

    - `sigma`: σ, Å (positive).
    - `epsilon`: ε, eV (positive); `LJUnits.from_kelvin` takes ε/k_B in K.
    - `mass`: m, amu (positive).

    **Raises:** `ValueError` if an argument is not a positive finite number.

    ```python
    argon = LJUnits.from_kelvin(sigma=3.405, epsilon_kelvin=119.8, mass=39.948)
    argon.unit("time")                    # τ ≈ 2.156 ps
    argon.to_real(0.722, "temperature")  # 86.5 K
    ```
    """

    sigma: float
    epsilon: float
    mass: float

    def __post_init__(self):
        for name in ("sigma", "epsilon", "mass"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
                    or not np.isfinite(value) or value <= 0:
                raise ValueError(f"LJUnits: `{name}` must be a positive finite number, got {value!r}.")

    @classmethod
    def from_kelvin(cls, sigma: float, epsilon_kelvin: float, mass: float) -> "LJUnits":
        """LJ units with ε given as ε/k_B in K (how tables list it). σ in Å, mass in amu."""
        if isinstance(epsilon_kelvin, bool) or not isinstance(epsilon_kelvin, (int, float, np.integer,
                                                                             np.floating)):
            raise ValueError(f"LJUnits.from_kelvin: `epsilon_kelvin` must be a positive number, "
                             f"got {epsilon_kelvin!r}.")
        return cls(sigma=sigma, epsilon=float(epsilon_kelvin) * BOLTZMANN, mass=mass)

    def unit(self, quantity: Quantity) -> float:
        """The reduced unit of `quantity` in real units (see the class table).

        **Raises:** `ValueError` for an unknown quantity (the message lists the valid names).
        """
        s, e, m = float(self.sigma), float(self.epsilon), float(self.mass)
        tau = s * np.sqrt(m * AMU_A2_PER_PS2 / e)  # ps
        table = {
            "length": s, "energy": e, "kT": e, "mass": m, "time": tau, "temperature": e / BOLTZMANN,
            "velocity": s / tau, "force": e / s, "pressure": e / s**3, "density": 1.0 / s**3,
        }
        if quantity not in table:
            raise ValueError(f"LJUnits: `quantity` must be one of {', '.join(_QUANTITIES)}; got {quantity!r}.")
        return table[quantity]

    def to_real(self, value, quantity: Quantity):
        """`value` in reduced units → real units (Å, eV, amu, ps, K, Å/ps, eV/Å, eV/Å³, Å⁻³)."""
        return value * self.unit(quantity)

    def from_real(self, value, quantity: Quantity):
        """`value` in real units (see `to_real`) → reduced units."""
        return value / self.unit(quantity)
