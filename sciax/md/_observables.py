"""MD observables: per-frame functions for `simulate(observables=...)` and host-side analysis.

Per-frame observables have the signature `fn(t, state, system)` with `state` an `MDState`
(one frame, no batch axis) and `system` an `MDSystem`; they are jittable and run inside the
rollout at every saved frame:

```python
rdf = sciax.md.rdf_histogram(r_max=4.0, n_bins=200)
msd = sciax.md.mean_squared_displacement(system.box.unwrap(state0.positions, state0.images))
traj = sciax.simulate(system, state0, integrator=..., dt=0.005, n_steps=10_000, save_every=100,
                      save_states=False,
                      observables={"T": sciax.md.temperature, "P": sciax.md.pressure, "rdf": rdf, "msd": msd})
r, g = sciax.md.radial_distribution(traj.observables["rdf"], r_max=4.0, n_atoms=N, volume=system.box.volume)
fit = sciax.md.diffusion_coefficient(traj.times, traj.observables["msd"])
```

Units follow the system's: reduced LJ units, or the real system (Å, eV, ps, K; masses in
eV·ps²/Å²) of `sciax.md.units`. Temperatures are energies kT.
"""

import math
from typing import NamedTuple

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._validation import describe
from ._neighbours import VerletList
from ._velocities import degrees_of_freedom

# --- per-frame observables fn(t, state, system) ----------------------------------------------------


def kinetic_energy(t, state, system):
    """Kinetic energy K = ½ Σ_i m_i |v_i|² (energy units: ε, or eV), from `system.kinetic_energy`.

    **Arguments:** `t` (unused), `state` (`MDState`), `system` (`MDSystem`, for its masses).
    """
    return system.kinetic_energy(state.velocities)


def temperature(t, state, system):
    """Instantaneous temperature kT = 2K / n_dof with n_dof = d N − d (energy units: ε, or eV).

    The d degrees of freedom of the centre-of-mass momentum are removed, as for a run whose total
    momentum is zero and conserved (`maxwell_boltzmann` velocities stepped with velocity Verlet,
    Nosé–Hoover or Bussi; LAMMPS's `compute temp` counts the same). A Langevin thermostat does not
    conserve momentum: there the equipartition temperature is 2K / (d N), i.e. this value times
    (d N − d) / (d N); use `kinetic_temperature(..., n_removed=0)`. Divide by
    `units.BOLTZMANN` for kelvin.

    **Arguments:** `t` (unused), `state` (`MDState`), `system` (`MDSystem`).
    """
    n, dim = state.velocities.shape
    return 2.0 * kinetic_energy(t, state, system) / degrees_of_freedom(n, dim)


def potential_energy(t, state, system):
    """Potential energy U(positions) from `system.potential_energy` (energy units: ε, or eV)."""
    return system.potential_energy(state.positions)


def total_energy(t, state, system):
    """Total energy K + U (energy units); conserved by velocity Verlet up to O(dt²) fluctuations."""
    return kinetic_energy(t, state, system) + potential_energy(t, state, system)


def virial(t, state, system):
    """The virial tensor W_ab = Σ_pairs r_ij,a f_ij,b of the system's forces, `(d, d)` (energy units).

    From `system.virial(positions)`; tr W = Σ_pairs r_ij · f_ij.
    """
    return system.virial(state.positions)


def pressure_tensor(t, state, system):
    """The pressure tensor P_ab = (Σ_i m_i v_ia v_ib + W_ab) / V, `(d, d)` (pressure units: ε/σ³, or
    eV/Å³; `units.bar_from_pressure` converts), from `system.stress(state)`. Its trace / d is
    `pressure`; the stress in ASE's sign convention (tensile positive) is −P_ab.

    **Raises:** `ValueError` (at trace time) for a system in free space.
    """
    return system.stress(state)


def pressure(t, state, system):
    """Instantaneous pressure P = (2K + tr W) / (d V) (pressure units: ε/σ³, or eV/Å³), from
    `system.pressure(state)`.

    K the kinetic energy of all N atoms, W the virial tensor (`virial`), V the box volume, d the
    dimension. For an ideal gas (W = 0) it is N kT / V with kT = 2K / (d N).

    **Raises:** `ValueError` (at trace time) for a system in free space.
    """
    return system.pressure(state)


def unwrapped_positions(t, state, system):
    """Unwrapped positions `system.box.unwrap(positions, images)`, `(N, d)` (length units): save them
    for `msd_time_average` or any displacement analysis."""
    return system.box.unwrap(state.positions, state.images)


def mean_squared_displacement(reference):
    """An observable: the mean-squared displacement from `reference`,
    MSD = (1/N) Σ_i |r_i^unwrapped(t) − r_i^reference|², with the unwrapped positions
    `system.box.unwrap(positions, images)` (so atoms crossing the box are followed).

    **Arguments:** `reference`: unwrapped positions `(N, d)` at the origin of time (length units),
    e.g. `system.box.unwrap(state0.positions, state0.images)`.

    **Returns:** a function `fn(t, state, system)` returning the MSD (length² units).

    **Raises:** `ValueError` if `reference` is not `(N, d)`; when called, if it does not match the
    state's shape.
    """
    reference = jnp.asarray(reference)
    if reference.ndim != 2 or not jnp.issubdtype(reference.dtype, jnp.floating):
        raise ValueError(f"mean_squared_displacement: `reference` must be floating positions (N, d), "
                         f"got {describe(reference)}.")

    def msd(t, state, system):
        if state.positions.shape != reference.shape:
            raise ValueError(f"mean_squared_displacement: the state has positions of shape "
                             f"{state.positions.shape}, the reference {reference.shape}.")
        displacement = system.box.unwrap(state.positions, state.images) - reference.astype(state.positions.dtype)
        return jnp.mean(jnp.sum(displacement**2, axis=-1))

    return msd


def rdf_histogram(r_max, n_bins: int, *, block_size: int | None = None, like=None, margin: float = 1.5):
    """An observable: the histogram of pair distances, for the radial distribution function.

    Counts each unordered pair i ≠ j with minimum-image distance r < `r_max` once, in bin
    floor(r / r_max · n_bins) of `n_bins` equal bins on [0, r_max). Pairs are enumerated over
    all pairs (atom i with the N/2 atoms after it, cyclically) in blocks of `block_size` atoms,
    so memory is O(block_size · N) (about 10⁶ distances per block by default) while work is
    O(N²/2) per frame. With `like=(system, positions)` they come instead from a Verlet list of
    radius `r_max` built at every call (a cell grid, O(N K) work and memory for K neighbours
    per atom), whose capacities are sized on the host from that typical configuration: use it
    for large N and r_max well below the box. Normalise with `radial_distribution`.

    **Arguments:**

    - `r_max`: largest distance (length units), positive; at most half the shortest box side
      (minimum image), checked when the observable runs.
    - `n_bins`: number of bins.
    - `block_size`: atoms per block of the all-pairs enumeration (default: max(1, 2²⁰ // (N/2))).
    - `like`: `(system, positions)`, an `MDSystem` in a periodic box and a configuration
      `(N, d)` like those to come, to size the neighbour buffers (host side; capacities are the
      counts found there times `margin`). Default None: all pairs.
    - `margin`: the factor on those counts (≥ 1).

    **Returns:** a function `fn(t, state, system)` returning int32 counts `(n_bins,)`.

    **Raises:** `ValueError` for a non-positive `r_max`, `n_bins` or `block_size`, or a `like`
    that is not `(MDSystem in a Box, positions)`; at run time (`eqx.error_if`) when `r_max`
    exceeds half the shortest box side, or when a configuration needs more neighbour slots than
    `like` provided (raise `margin`).
    """
    if isinstance(r_max, bool) or not isinstance(r_max, (int, float, np.integer, np.floating)) \
            or not math.isfinite(r_max) or r_max <= 0:
        raise ValueError(f"rdf_histogram: `r_max` must be a positive finite number (length units), "
                         f"got {describe(r_max)}.")
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins <= 0:
        raise ValueError(f"rdf_histogram: `n_bins` must be a positive int, got {describe(n_bins)}.")
    if block_size is not None and (isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer))
                                   or block_size <= 0):
        raise ValueError(f"rdf_histogram: `block_size` must be a positive int, got {describe(block_size)}.")
    r_max, n_bins = float(r_max), int(n_bins)
    rows = None if block_size is None else int(block_size)
    if like is not None:
        return _listed_histogram(r_max, n_bins, like, margin)

    def histogram(t, state, system):
        positions = state.positions
        n = positions.shape[0]
        half = n // 2  # atom i is paired with the next `half` atoms (cyclically): each pair once
        block = min(n, rows if rows is not None else max(1, 2**20 // max(half, 1)))
        n_blocks = -(-n // block)
        offsets = 1 + jnp.arange(half)

        def add_block(counts, start):
            i = start + jnp.arange(block)
            j = (i[:, None] + offsets[None, :]) % n
            dr = system.box.displacement(positions[jnp.minimum(i, n - 1)][:, None, :], positions[j])
            r2 = jnp.sum(dr * dr, axis=-1)
            keep = (i[:, None] < n) & (r2 < r_max * r_max)
            if n % 2 == 0:  # the pair at offset n/2 is reached from both ends: count it from i < n/2
                keep = keep & ((offsets[None, :] < half) | (i[:, None] < half))
            return counts + _bin_counts(r2, keep, r_max, n_bins, positions.dtype), None

        counts, _ = lax.scan(add_block, jnp.zeros(n_bins, jnp.int32), jnp.arange(n_blocks) * block)
        return _check_r_max(counts, r_max, system)

    return histogram


def _check_r_max(counts, r_max, system):
    if not system.box.periodic:
        return counts
    return eqx.error_if(counts, 2 * r_max > jnp.min(system.box.lengths),
                        "rdf_histogram: `r_max` exceeds half the shortest box side; "
                        "minimum-image distances beyond it are not all counted.")


def _bin_counts(r2, keep, r_max, n_bins, dtype):
    bins = jnp.minimum((jnp.sqrt(r2) * jnp.asarray(n_bins / r_max, dtype)).astype(jnp.int32), n_bins - 1)
    return jnp.zeros(n_bins, jnp.int32).at[jnp.where(keep, bins, n_bins).ravel()].add(1, mode="drop")


def _listed_histogram(r_max, n_bins, like, margin):
    """`rdf_histogram` over a Verlet list of radius r_max (built with the system's neighbour code)."""
    from ._potentials import LennardJones
    from ._system import MDSystem

    try:
        system, positions = like
    except (TypeError, ValueError):
        raise ValueError(f"rdf_histogram: `like` must be a pair (system, positions), got {describe(like)}.") from None
    if not isinstance(system, MDSystem) or not system.box.periodic:
        raise ValueError(f"rdf_histogram: `like` must hold an MDSystem in a periodic Box, got "
                         f"{type(system).__name__}.")
    if not (isinstance(margin, (int, float)) and not isinstance(margin, bool) and margin >= 1):
        raise ValueError(f"rdf_histogram: `margin` must be a number >= 1, got {margin!r}.")
    # A zero LJ potential: only its cutoff matters, as the radius of the list.
    probe = MDSystem(system.box, LennardJones(epsilon=0.0, sigma=1.0, cutoff=r_max), system.masses,
                     neighbours=VerletList(skin=0.0))
    strategy = probe.allocate(jnp.asarray(positions), margin=margin).neighbours

    def histogram(t, state, system):
        positions = state.positions
        n = positions.shape[0]
        lister = MDSystem(system.box, LennardJones(epsilon=0.0, sigma=1.0, cutoff=jnp.asarray(r_max, positions.dtype)),
                          system.masses, neighbours=strategy)
        neighbours = lister.build_neighbours(positions)
        lists = neighbours.neighbour_lists()  # (N, K), every pair in both rows, sentinel N
        padded = jnp.concatenate([positions, jnp.zeros((1, positions.shape[1]), positions.dtype)])
        dr = system.box.displacement(positions[:, None, :], padded[lists])
        r2 = jnp.sum(dr * dr, axis=-1)
        keep = (lists > jnp.arange(n)[:, None]) & (lists < n) & (r2 < r_max * r_max)  # each pair once
        counts = _bin_counts(r2, keep, r_max, n_bins, positions.dtype)
        counts = eqx.error_if(counts, neighbours.overflow != 0,
                              "rdf_histogram: this configuration needs more neighbour slots than the `like` "
                              "configuration provided; raise `margin` or pass a denser `like`.")
        return _check_r_max(counts, r_max, system)

    return histogram


# --- host-side analysis ----------------------------------------------------------------------------


def radial_distribution(counts, *, r_max, n_atoms: int, volume, dim: int = 3):
    """Radial distribution function g(r) from `rdf_histogram` counts, averaged over frames.

    g(r_k) = ⟨ c_k / (½ N (N − 1) v_k / V) ⟩_frames, with v_k the volume of the k-th spherical
    shell (4π/3 (r_{k+1}³ − r_k³) in 3-D, π (r_{k+1}² − r_k²) in 2-D): an ideal gas has
    g = 1 exactly on average.

    **Arguments:**

    - `counts`: `(n_bins,)` or `(n_frames, n_bins)` pair counts.
    - `r_max`: the histogram's `r_max` (length units).
    - `n_atoms`: N.
    - `volume`: box volume V (length^d), a scalar or `(n_frames,)`.
    - `dim`: dimension d (2 or 3).

    **Returns:** `(r, g)`: the bin centres `(n_bins,)` (length units) and g `(n_bins,)` (NumPy
    float64).

    **Raises:** `ValueError` for N < 2, a non-positive volume or r_max, a dimension other than
    2 or 3, or volumes that do not match the frames.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim == 1:
        counts = counts[None]
    if counts.ndim != 2:
        raise ValueError(f"radial_distribution: `counts` must be (n_bins,) or (n_frames, n_bins), "
                         f"got {describe(counts)}.")
    if isinstance(n_atoms, bool) or not isinstance(n_atoms, (int, np.integer)) or n_atoms < 2:
        raise ValueError(f"radial_distribution: `n_atoms` must be an int >= 2, got {describe(n_atoms)}.")
    if dim not in (2, 3):
        raise ValueError(f"radial_distribution: `dim` must be 2 or 3, got {dim!r}.")
    if not (np.isfinite(r_max) and r_max > 0):
        raise ValueError(f"radial_distribution: `r_max` must be positive, got {r_max!r}.")
    volume = np.asarray(volume, dtype=np.float64)
    if volume.ndim == 0:
        volume = np.full(counts.shape[0], float(volume))
    if volume.shape != (counts.shape[0],) or not np.all((volume > 0) & np.isfinite(volume)):
        raise ValueError(f"radial_distribution: `volume` must be a positive finite scalar or one per frame "
                         f"({counts.shape[0]},), got {describe(volume)}.")
    n_bins = counts.shape[1]
    edges = np.linspace(0.0, float(r_max), n_bins + 1)
    shells = (4.0 / 3.0 * np.pi * np.diff(edges**3)) if dim == 3 else np.pi * np.diff(edges**2)
    ideal = 0.5 * n_atoms * (n_atoms - 1) * shells[None, :] / volume[:, None]
    return 0.5 * (edges[1:] + edges[:-1]), np.mean(counts / ideal, axis=0)


def coordination_numbers(counts, n_atoms: int):
    """Running coordination number n(r_k) = (2 / N) Σ_{k' ≤ k} c_k': the mean number of neighbours
    within the outer edge of bin k, from `rdf_histogram` counts (averaged over frames).

    **Arguments:** `counts` `(n_bins,)` or `(n_frames, n_bins)`; `n_atoms` N.

    **Returns:** `(n_bins,)` float64.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim == 2:
        counts = counts.mean(axis=0)
    return 2.0 * np.cumsum(counts) / n_atoms


class DiffusionFit(NamedTuple):
    """A least-squares line MSD(t) ≈ slope · t + intercept and D = slope / (2 d).

    `coefficient` (length²/time), `slope` (length²/time), `intercept` (length²).
    """

    coefficient: float
    slope: float
    intercept: float


def diffusion_coefficient(times, msd, *, dim: int = 3, t_min=None, t_max=None) -> DiffusionFit:
    """Self-diffusion coefficient from the Einstein relation: the slope of a least-squares line
    fitted to MSD(t) for t_min ≤ t ≤ t_max, D = slope / (2 d).

    Leave out the ballistic start (MSD ∝ t²) with `t_min`.

    **Arguments:**

    - `times`: `(n,)` (time units).
    - `msd`: `(n,)` mean-squared displacements (length² units).
    - `dim`: the dimension d.
    - `t_min`, `t_max`: the fitted window (default: all points).

    **Returns:** a `DiffusionFit` (D in length²/time: σ²/τ, or Å²/ps).

    **Raises:** `ValueError` for mismatched shapes or fewer than 2 distinct times in the window.
    """
    times = np.asarray(times, dtype=np.float64)
    msd = np.asarray(msd, dtype=np.float64)
    if times.ndim != 1 or msd.shape != times.shape:
        raise ValueError(f"diffusion_coefficient: `times` and `msd` must be 1-D arrays of one length, got "
                         f"{describe(times)} and {describe(msd)}.")
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim <= 0:
        raise ValueError(f"diffusion_coefficient: `dim` must be a positive int, got {describe(dim)}.")
    window = np.ones(times.shape, bool)
    if t_min is not None:
        window &= times >= t_min
    if t_max is not None:
        window &= times <= t_max
    if np.unique(times[window]).size < 2:
        raise ValueError(f"diffusion_coefficient: the window t_min={t_min}, t_max={t_max} holds fewer than 2 "
                         f"distinct times of the {times.size} given.")
    slope, intercept = np.polyfit(times[window], msd[window], 1)
    return DiffusionFit(coefficient=float(slope) / (2 * dim), slope=float(slope), intercept=float(intercept))


def _autocorrelation_sum(x, max_lag):
    """Σ_{t0=0}^{F-1-k} x(t0) · x(t0 + k) summed over the trailing axes, k = 0..max_lag, by FFT."""
    frames = x.shape[0]
    flat = x.reshape(frames, -1)
    size = 1 << (2 * frames - 1).bit_length()
    spectrum = np.fft.rfft(flat, n=size, axis=0)
    correlation = np.fft.irfft(np.abs(spectrum) ** 2, n=size, axis=0)[: max_lag + 1]
    return correlation.sum(axis=1)


def _lags(where, n_frames, max_lag):
    if max_lag is None:
        return n_frames - 1
    if isinstance(max_lag, bool) or not isinstance(max_lag, (int, np.integer)) or not 0 <= max_lag < n_frames:
        raise ValueError(f"{where}: `max_lag` must be an int in [0, {n_frames - 1}] (frames - 1), got {max_lag!r}.")
    return int(max_lag)


def velocity_autocorrelation(velocities, *, max_lag: int | None = None, normalize: bool = False):
    """Velocity autocorrelation C(k) = ⟨ v_i(t0) · v_i(t0 + k Δt) ⟩ averaged over atoms i and over
    all time origins t0 of the saved frames (computed by FFT, exact up to rounding).

    **Arguments:**

    - `velocities`: `(n_frames, N, d)` saved velocities (length/time units), equally spaced.
    - `max_lag`: largest lag k in frames (default n_frames − 1; late lags average few origins).
    - `normalize`: divide by C(0).

    **Returns:** `(max_lag + 1,)` float64, C in length²/time² (or dimensionless if normalised).
    Green–Kubo: D = (1/d) ∫ C dt (`green_kubo_diffusion`).

    **Raises:** `ValueError` for an array that is not `(n_frames, N, d)` or a bad `max_lag`.
    """
    v = np.asarray(velocities, dtype=np.float64)
    if v.ndim != 3:
        raise ValueError(f"velocity_autocorrelation: `velocities` must be (n_frames, N, d), got {describe(v)}.")
    max_lag = _lags("velocity_autocorrelation", v.shape[0], max_lag)
    origins = v.shape[0] - np.arange(max_lag + 1)
    c = _autocorrelation_sum(v, max_lag) / (origins * v.shape[1])
    return c / c[0] if normalize else c


def green_kubo_diffusion(dt, vacf, *, dim: int = 3) -> float:
    """D = (1/d) ∫_0^T C(t) dt by the trapezoidal rule over the VACF's lags (length²/time).

    **Arguments:** `dt` time between frames; `vacf` `(n_lags,)` unnormalised C (length²/time²);
    `dim` d.
    """
    vacf = np.asarray(vacf, dtype=np.float64)
    if vacf.ndim != 1 or vacf.size < 2:
        raise ValueError(f"green_kubo_diffusion: `vacf` must be 1-D with >= 2 lags, got {describe(vacf)}.")
    return float(np.trapezoid(vacf, dx=float(dt)) / dim)


def msd_time_average(positions, *, max_lag: int | None = None):
    """Mean-squared displacement averaged over atoms and all time origins,
    MSD(k) = ⟨ |r_i(t0 + k Δt) − r_i(t0)|² ⟩, from saved *unwrapped* positions (FFT algorithm:
    MSD(k) = S1(k) − 2 S2(k) with S2 the positions' autocorrelation).

    **Arguments:** `positions` `(n_frames, N, d)` unwrapped (the `unwrapped_positions`
    observable; length units), equally spaced in time; `max_lag` (frames).

    **Returns:** `(max_lag + 1,)` float64, length² units; MSD(0) = 0.

    **Raises:** `ValueError` for an array that is not `(n_frames, N, d)` or a bad `max_lag`.
    """
    x = np.asarray(positions, dtype=np.float64)
    if x.ndim != 3:
        raise ValueError(f"msd_time_average: `positions` must be (n_frames, N, d), got {describe(x)}.")
    frames, n = x.shape[0], x.shape[1]
    max_lag = _lags("msd_time_average", frames, max_lag)
    squares = np.sum(x * x, axis=(1, 2))  # Σ_i |r_i(t)|², (frames,)
    total = 2.0 * squares.sum()
    s1 = np.empty(max_lag + 1)
    for k in range(max_lag + 1):  # S1(k) = Σ_{t0} |r(t0)|² + |r(t0 + k)|², a running difference
        if k > 0:
            total -= squares[k - 1] + squares[frames - k]
        s1[k] = total
    origins = frames - np.arange(max_lag + 1)
    s2 = _autocorrelation_sum(x, max_lag)
    msd = (s1 - 2.0 * s2) / (origins * n)
    msd[0] = 0.0
    return msd
