"""Hamiltonian particle systems: harmonic wells, Kepler, softened N-body gravity, spring networks."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from .._phase_space import PhaseSpace
from .._validation import check_parameter
from ._base import AbstractHamiltonian, in_system_precision


class HarmonicOscillator(AbstractHamiltonian):
    """Isotropic harmonic well U(q) = ½ k |q|² for one particle of mass m in d dimensions.

    Exact solution: q(t) = q₀ cos ωt + (v₀/ω) sin ωt with ω = √(k/m).

    **Arguments:** `stiffness` k (energy/length²), `masses` m (mass > 0): a scalar for one
    particle, state `PhaseSpace` with positions of shape `(d,)`; or shape `(N,)` for N
    independent particles in the same well, positions `(N, d)`.
    """

    stiffness: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    masses: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)

    def __check_init__(self):
        check_parameter("HarmonicOscillator", "masses", self.masses, strict=True)

    def potential_energy(self, positions):
        return 0.5 * self.stiffness * jnp.sum(positions**2)

    def exact(self, state0: PhaseSpace, t) -> PhaseSpace:
        """The exact state at time `t` (a scalar or an array of times: a leading axis) from
        `state0` at time 0."""
        q0, v0 = state0.positions, state0.velocities
        w = jnp.sqrt(self.stiffness / self.masses)[..., None]  # masses.shape + (1,), against (..., d)
        t = jnp.asarray(t)
        wt = w * t.reshape(t.shape + (1,) * q0.ndim)  # times (T...) in front: (T..., *positions.shape)
        c, s = jnp.cos(wt), jnp.sin(wt)
        return PhaseSpace(q0 * c + v0 / w * s, -q0 * w * s + v0 * c)

    @in_system_precision
    def default_state(self):
        return PhaseSpace(jnp.array([1.0]), jnp.array([0.0]))


class Kepler(AbstractHamiltonian):
    """Kepler two-body problem in the relative coordinate r = r₂ − r₁ (reduced mass μ):

        U(r) = −G M μ / |r|,   M = m₁ + m₂,   μ = m₁ m₂ / M,   so  r̈ = −G M r / |r|³.

    Conserved: energy, angular momentum L = μ r × v, and the Laplace–Runge–Lenz vector.
    Units: any consistent set; the defaults (G M = 1, μ = 1) give period 2π a^{3/2}.

    **Arguments:** `gm` (G M > 0, length³/time², scalar), `masses` (μ > 0, scalar).
    State: `PhaseSpace` with positions `(2,)` or `(3,)`.
    """

    gm: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    masses: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)

    def __check_init__(self):
        check_parameter("Kepler", "gm", self.gm, strict=True, scalar=True)
        check_parameter("Kepler", "masses", self.masses, strict=True, scalar=True)

    def potential_energy(self, positions):
        return -self.gm * self.masses / jnp.sqrt(jnp.sum(positions**2))

    def angular_momentum(self, state: PhaseSpace):
        """μ r × v (a scalar in 2-D, a 3-vector in 3-D)."""
        r, v = state.positions, state.velocities
        if r.shape[-1] == 2:
            return self.masses * (r[0] * v[1] - r[1] * v[0])
        return self.masses * jnp.cross(r, v)

    @in_system_precision
    def orbit_state(self, semi_major_axis=1.0, eccentricity=0.0) -> PhaseSpace:
        """State at periapsis of a 2-D orbit with given a > 0 and e (0 ≤ e < 1).

        **Raises:** `ValueError` for a concrete a ≤ 0 or e outside [0, 1) (no bound ellipse:
        the state would be NaN or unbound).
        """
        a, e = jnp.asarray(semi_major_axis), jnp.asarray(eccentricity)
        if not isinstance(a, jax.core.Tracer) and not np.all(np.asarray(a) > 0):
            raise ValueError(f"Kepler.orbit_state: `semi_major_axis` must be > 0, got {semi_major_axis!r}.")
        if not isinstance(e, jax.core.Tracer) and not np.all((np.asarray(e) >= 0) & (np.asarray(e) < 1)):
            raise ValueError(f"Kepler.orbit_state: `eccentricity` must be in [0, 1) (a bound ellipse), "
                             f"got {eccentricity!r}.")
        r_p = a * (1 - e)
        v_p = jnp.sqrt(self.gm * (1 + e) / r_p)
        return PhaseSpace(jnp.stack([r_p, 0.0 * r_p]), jnp.stack([0.0 * v_p, v_p]))

    def period(self, semi_major_axis=1.0):
        """Orbital period 2π √(a³ / GM)."""
        return 2 * jnp.pi * jnp.sqrt(jnp.asarray(semi_major_axis) ** 3 / self.gm)

    @in_system_precision
    def default_state(self):
        return self.orbit_state(1.0, 0.5)

    def conserved_quantities(self, t, y):
        return {"energy": self.energy(y), "angular_momentum": self.angular_momentum(y)}


def _check_masses(name: str, masses, *, min_particles: int = 1) -> None:
    """`masses` must be a 1-D array of at least `min_particles` positive entries."""
    if jnp.ndim(masses) != 1 or jnp.shape(masses)[0] < min_particles:
        raise ValueError(
            f"{name}: `masses` must be a 1-D array of shape (N,) with N >= {min_particles}, "
            f"got shape {jnp.shape(masses)}."
        )
    if not isinstance(masses, jax.core.Tracer) and not np.all(np.asarray(masses) > 0):
        raise ValueError(f"{name}: `masses` must be positive, got minimum {float(np.min(np.asarray(masses)))!r}.")


def _check_per_item(name: str, argument: str, value, n: int, what: str, *, strict: bool = False) -> None:
    """`value` must be a scalar or have shape (n,), with entries ≥ 0 (> 0 if `strict`)."""
    if jnp.shape(value) not in ((), (n,)):
        raise ValueError(
            f"{name}: `{argument}` must be a scalar or have shape ({n},) (one per {what}), "
            f"got shape {jnp.shape(value)}."
        )
    if not isinstance(value, jax.core.Tracer):
        value = np.asarray(value)  # a concrete value is checked on the host, also inside a jit trace
        if not (np.all(value > 0) if strict else np.all(value >= 0)):
            relation = "positive" if strict else "non-negative"
            raise ValueError(f"{name}: `{argument}` must be {relation}, got minimum {float(np.min(value))!r}.")


def _angular_momentum(masses, state: PhaseSpace):
    """Σ m r × v about the origin: a scalar in 2-D, a 3-vector in 3-D."""
    r, v = state.positions, state.velocities
    m = jnp.asarray(masses)
    if r.shape[-1] == 2:
        return jnp.sum(m * (r[:, 0] * v[:, 1] - r[:, 1] * v[:, 0]))
    if r.shape[-1] == 3:
        return jnp.sum(m[:, None] * jnp.cross(r, v), axis=0)
    raise ValueError(f"angular momentum is defined in 2-D and 3-D, got positions of shape {r.shape}.")


def _spring_energy(positions, first, second, stiffness, rest_lengths):
    """Σ_s ½ k_s (|q[second_s] − q[first_s]| − L_s)² over springs given by static index arrays.

    The length uses the double-`where` pattern so that a zero-length spring has a finite
    (zero) gradient instead of NaN.
    """
    d = positions[second] - positions[first]
    r2 = jnp.sum(d**2, axis=-1)
    nonzero = r2 > 0
    r = jnp.where(nonzero, jnp.sqrt(jnp.where(nonzero, r2, 1.0)), 0.0)
    return 0.5 * jnp.sum(stiffness * (r - rest_lengths) ** 2)


# Chenciner & Montgomery (2000) figure-eight choreography, G = m = 1 (Simó's numbers).
_FIGURE_EIGHT_POSITION = (0.97000436, -0.24308753)
_FIGURE_EIGHT_VELOCITY = (-0.93240737, -0.86473146)
FIGURE_EIGHT_PERIOD = 6.32591398


class NBody(AbstractHamiltonian):
    """Self-gravitating point masses with Plummer softening:

        U(q) = −Σ_{i<j} G m_i m_j / √(|q_i − q_j|² + ε²)

    so that, from F = −∇U, F_i = −Σ_{j≠i} G m_i m_j (q_i − q_j) / (|q_i − q_j|² + ε²)^{3/2}.
    The pair sum runs over the N(N−1)/2 pairs i < j (static indices), so there is no
    self-interaction to mask and `jax.grad` is finite for any distinct positions (for ε > 0,
    for any positions at all).

    Units: any consistent set; the defaults are N-body (Hénon) units with G = 1.
    Conserved: energy, total momentum and total angular momentum (2-D: scalar, 3-D: vector).

    **Arguments:**

    - `masses`: shape `(N,)`, positive (mass units).
    - `gravitational_constant`: G (length³ / (mass · time²)), default 1.
    - `softening`: ε ≥ 0 (length), default 0.01. It caps the force of close encounters
      (|F| ≤ ~0.385 G m_i m_j / ε²), so a fixed step stays stable; ε = 0 is exact Newtonian
      gravity (use it for e.g. the figure-eight orbit, whose bodies stay well apart).

    State: `PhaseSpace` with positions and velocities of shape `(N, d)`.

    ```python
    system, state = NBody.figure_eight()
    traj = sciax.simulate(system, state, integrator=Yoshida4(), dt=1e-3, n_steps=6000)
    ```
    """

    masses: jax.Array = eqx.field(converter=jnp.asarray)
    gravitational_constant: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    softening: jax.Array = eqx.field(converter=jnp.asarray, default=1e-2)

    def __check_init__(self):
        _check_masses("NBody", self.masses)
        check_parameter("NBody", "gravitational_constant", self.gravitational_constant, scalar=True)
        check_parameter("NBody", "softening", self.softening, scalar=True)

    def potential_energy(self, positions):
        first, second = np.triu_indices(positions.shape[0], k=1)
        d = positions[first] - positions[second]
        r2 = jnp.sum(d**2, axis=-1) + self.softening**2
        m = self.masses
        return -self.gravitational_constant * jnp.sum(m[first] * m[second] / jnp.sqrt(r2))

    def angular_momentum(self, state: PhaseSpace):
        """Σ m r × v about the origin (a scalar in 2-D, a 3-vector in 3-D)."""
        return _angular_momentum(self.masses, state)

    def center_of_mass(self, positions):
        """Σ m q / Σ m, shape `(d,)`."""
        m = self.masses[:, None]
        return jnp.sum(m * positions, axis=0) / jnp.sum(self.masses)

    def conserved_quantities(self, t, y):
        out = {"energy": self.energy(y), "momentum": self.momentum(y)}
        if y.positions.shape[-1] in (2, 3):
            out["angular_momentum"] = self.angular_momentum(y)
        return out

    @classmethod
    def figure_eight(cls, *, softening=0.0, dtype=None) -> tuple["NBody", PhaseSpace]:
        """The Chenciner–Montgomery figure-eight: three unit masses (G = 1) chasing each other
        on one figure-eight curve, period `FIGURE_EIGHT_PERIOD` ≈ 6.3259.

        **Returns:** `(system, state)`, the state of shape `(3, 2)` with zero total momentum.
        """
        x1 = jnp.asarray(_FIGURE_EIGHT_POSITION, dtype=dtype)
        v3 = jnp.asarray(_FIGURE_EIGHT_VELOCITY, dtype=dtype)
        positions = jnp.stack([x1, -x1, jnp.zeros_like(x1)])
        velocities = jnp.stack([-0.5 * v3, -0.5 * v3, v3])
        system = cls(masses=jnp.full((3,), 1.0), gravitational_constant=1.0, softening=softening)
        return system, PhaseSpace(positions, velocities)

    @classmethod
    def random_cluster(cls, key, n: int, *, dimension: int = 3, radius=1.0, total_mass=1.0,
                       gravitational_constant=1.0, softening=1e-2, dtype=None) -> tuple["NBody", PhaseSpace]:
        """`n` equal masses uniform in a ball of `radius`, with random velocities scaled to
        virial equilibrium (2K = −U) and zero centre-of-mass position and momentum.

        **Returns:** `(system, state)` with positions of shape `(n, dimension)`.
        """
        system = cls(masses=jnp.full((n,), total_mass / n), gravitational_constant=gravitational_constant,
                     softening=softening)
        return system, system._virialised_cluster(key, dimension, radius, dtype)

    def _virialised_cluster(self, key, dimension, radius, dtype) -> PhaseSpace:
        n = self.masses.shape[0]
        dtype = jnp.zeros((), dtype).dtype if dtype is None else jnp.dtype(dtype)
        k_direction, k_radius, k_velocity = jax.random.split(key, 3)
        direction = jax.random.normal(k_direction, (n, dimension), dtype)
        direction = direction / jnp.linalg.norm(direction, axis=-1, keepdims=True)
        r = radius * jax.random.uniform(k_radius, (n, 1), dtype) ** (1.0 / dimension)
        m = self.masses[:, None].astype(dtype)
        positions = direction * r
        positions = positions - jnp.sum(m * positions, axis=0) / jnp.sum(m)
        velocities = jax.random.normal(k_velocity, (n, dimension), dtype)
        velocities = velocities - jnp.sum(m * velocities, axis=0) / jnp.sum(m)
        kinetic = 0.5 * jnp.sum(m * velocities**2)
        potential = self.potential_energy(positions)
        scale = jnp.where(kinetic > 0, jnp.sqrt(-potential / (2 * jnp.where(kinetic > 0, kinetic, 1.0))), 0.0)
        return PhaseSpace(positions, (velocities * scale).astype(dtype))

    @in_system_precision
    def default_state(self):
        return self._virialised_cluster(jax.random.key(0), 3, 1.0, None)


class MassSpringChain(AbstractHamiltonian):
    """A free chain of N point masses joined by springs between neighbours i and i+1:

        U(q) = Σ_{i=0}^{N−2} ½ k_i (|q_{i+1} − q_i| − L_i)²

    Positions `(N, d)` (d = 1 for a chain on a line). No walls: total momentum is conserved
    with the energy. In 1-D with neighbours in order (q_{i+1} > q_i) the dynamics are exactly
    linear; for equal masses m and springs k the angular frequencies of the normal modes are
    ω_n = 2 √(k/m) sin(nπ / (2N)), n = 0 … N−1 (`normal_mode_frequencies`; n = 0 is the
    free translation).

    **Arguments:** `masses` `(N,)` positive (N ≥ 2); `stiffness` k (energy/length², ≥ 0) and
    `rest_length` L (length, ≥ 0), each a scalar or shape `(N−1,)`. Defaults k = L = 1.
    """

    masses: jax.Array = eqx.field(converter=jnp.asarray)
    stiffness: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    rest_length: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)

    def __check_init__(self):
        _check_masses("MassSpringChain", self.masses, min_particles=2)
        n_springs = self.masses.shape[0] - 1
        _check_per_item("MassSpringChain", "stiffness", self.stiffness, n_springs, "spring")
        _check_per_item("MassSpringChain", "rest_length", self.rest_length, n_springs, "spring")

    @classmethod
    def uniform(cls, n: int, *, mass=1.0, stiffness=1.0, rest_length=1.0) -> "MassSpringChain":
        """A chain of `n` equal masses and equal springs."""
        return cls(masses=jnp.full((n,), mass), stiffness=stiffness, rest_length=rest_length)

    def potential_energy(self, positions):
        first = np.arange(positions.shape[0] - 1)
        return _spring_energy(positions, first, first + 1, self.stiffness, self.rest_length)

    def normal_mode_frequencies(self):
        """ω_n = 2 √(k/m) sin(nπ/(2N)), n = 0 … N−1, for equal masses and springs (1/time).

        **Raises:** `ValueError` if the (concrete) masses or stiffnesses are not all equal.
        """
        n = self.masses.shape[0]
        k = jnp.broadcast_to(self.stiffness, (n - 1,))
        if not isinstance(self.masses, jax.core.Tracer) and not isinstance(k, jax.core.Tracer):
            m_host, k_host = np.asarray(self.masses), np.asarray(k)
            if not (np.all(m_host == m_host[0]) and np.all(k_host == k_host[0])):
                raise ValueError(
                    "MassSpringChain.normal_mode_frequencies: the closed form needs equal `masses` "
                    "and equal `stiffness`; for a general chain diagonalise the mass-weighted "
                    "Hessian of `potential_energy`."
                )
        modes = jnp.arange(n)
        return 2 * jnp.sqrt(k[0] / self.masses[0]) * jnp.sin(modes * jnp.pi / (2 * n))

    def equilibrium_state(self, dimension: int = 1, dtype=None) -> PhaseSpace:
        """Masses at rest along the first axis, neighbours one rest length apart."""
        n = self.masses.shape[0]
        gaps = jnp.broadcast_to(jnp.asarray(self.rest_length, dtype=dtype), (n - 1,))
        x = jnp.concatenate([jnp.zeros((1,), gaps.dtype), jnp.cumsum(gaps)])
        positions = jnp.zeros((n, dimension), gaps.dtype).at[:, 0].set(x)
        return PhaseSpace(positions, jnp.zeros_like(positions))

    @in_system_precision
    def default_state(self):
        state = self.equilibrium_state(1)
        shift = 0.1 * jnp.min(jnp.broadcast_to(self.rest_length, (self.masses.shape[0] - 1,)))
        return PhaseSpace(state.positions.at[0, 0].add(-shift), state.velocities)

    def conserved_quantities(self, t, y):
        return {"energy": self.energy(y), "momentum": self.momentum(y)}


def _as_pairs(springs) -> tuple[tuple[int, int], ...]:
    """Normalise a spring list (sequence of index pairs or an (S, 2) array) to a hashable tuple."""
    array = np.asarray(springs)
    if array.ndim != 2 or array.shape[1] != 2 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(
            f"MassSpringLattice: `springs` must be integer index pairs of shape (S, 2), got "
            f"shape {array.shape} and dtype {array.dtype}."
        )
    return tuple((int(i), int(j)) for i, j in array)


def _optional_array(value):
    return None if value is None else jnp.asarray(value)


class MassSpringLattice(AbstractHamiltonian):
    """A network of point masses joined by Hookean springs (e.g. a 2-D square lattice):

        U(q) = Σ_s ½ k_s (|q_{j_s} − q_{i_s}| − L_s)²,   s = (i_s, j_s) in `springs`

    The spring list is static configuration (a hashable tuple of index pairs). Free
    boundaries: energy, total momentum and (2-D/3-D) angular momentum are conserved.
    Build a square lattice with `MassSpringLattice.square(nx, ny, ...)`.

    **Arguments:**

    - `masses`: shape `(N,)`, positive (mass units).
    - `springs`: S index pairs (i, j), 0 ≤ i, j < N, i ≠ j (tuple of tuples or `(S, 2)` ints).
    - `stiffness`: k (energy/length², ≥ 0), scalar or `(S,)`; default 1.
    - `rest_lengths`: L (length, ≥ 0), scalar or `(S,)`; default 1.
    - `reference_positions`: optional `(N, d)` rest configuration, used by `rest_state`.
    """

    masses: jax.Array = eqx.field(converter=jnp.asarray)
    springs: tuple[tuple[int, int], ...] = eqx.field(static=True, converter=_as_pairs)
    stiffness: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    rest_lengths: jax.Array = eqx.field(converter=jnp.asarray, default=1.0)
    reference_positions: jax.Array | None = eqx.field(converter=_optional_array, default=None)

    def __check_init__(self):
        name = "MassSpringLattice"
        _check_masses(name, self.masses)
        n, n_springs = self.masses.shape[0], len(self.springs)
        if n_springs == 0:
            raise ValueError(f"{name}: `springs` must hold at least one index pair, got none.")
        pairs = np.asarray(self.springs)
        if pairs.min() < 0 or pairs.max() >= n:
            raise ValueError(
                f"{name}: `springs` indices must lie in [0, {n}) for {n} masses, got the range "
                f"[{pairs.min()}, {pairs.max()}]."
            )
        if np.any(pairs[:, 0] == pairs[:, 1]):
            bad = int(np.flatnonzero(pairs[:, 0] == pairs[:, 1])[0])
            raise ValueError(f"{name}: `springs` must join two different masses, got {self.springs[bad]} "
                             f"at index {bad}.")
        _check_per_item(name, "stiffness", self.stiffness, n_springs, "spring")
        _check_per_item(name, "rest_lengths", self.rest_lengths, n_springs, "spring")
        if self.reference_positions is not None:
            shape = jnp.shape(self.reference_positions)
            if len(shape) != 2 or shape[0] != n:
                raise ValueError(
                    f"{name}: `reference_positions` must have shape ({n}, d), got {shape}."
                )

    @classmethod
    def square(cls, nx: int, ny: int, *, spacing=1.0, stiffness=1.0, mass=1.0, diagonals: bool = False,
               dtype=None) -> "MassSpringLattice":
        """An `nx` × `ny` square lattice in 2-D, springs at rest in the lattice positions.

        Mass (ix, iy) has index `iy * nx + ix` and rest position (ix, iy) · `spacing`.
        Springs join horizontal and vertical neighbours (rest length `spacing`) and, with
        `diagonals=True`, both diagonals of each cell (rest length √2 · `spacing`), which gives
        the lattice shear stiffness. `stiffness` is a scalar or one value per spring.
        """
        if nx < 1 or ny < 1 or nx * ny < 2:
            raise ValueError(f"MassSpringLattice.square: need at least two masses, got nx={nx}, ny={ny}.")
        index = np.arange(nx * ny).reshape(ny, nx)
        pairs = [(index[y, x], index[y, x + 1]) for y in range(ny) for x in range(nx - 1)]
        pairs += [(index[y, x], index[y + 1, x]) for y in range(ny - 1) for x in range(nx)]
        lengths = [1.0] * len(pairs)
        if diagonals:
            diagonal = [(index[y, x], index[y + 1, x + 1]) for y in range(ny - 1) for x in range(nx - 1)]
            diagonal += [(index[y, x + 1], index[y + 1, x]) for y in range(ny - 1) for x in range(nx - 1)]
            pairs += diagonal
            lengths += [np.sqrt(2.0)] * len(diagonal)
        ix, iy = np.meshgrid(np.arange(nx), np.arange(ny))
        grid = np.stack([ix.ravel(), iy.ravel()], axis=-1).astype(float)
        spacing = jnp.asarray(spacing)
        return cls(
            masses=jnp.full((nx * ny,), mass),
            springs=pairs,
            stiffness=stiffness,
            rest_lengths=spacing * jnp.asarray(lengths, dtype=dtype),
            reference_positions=spacing * jnp.asarray(grid, dtype=dtype),
        )

    def potential_energy(self, positions):
        pairs = np.asarray(self.springs)
        return _spring_energy(positions, pairs[:, 0], pairs[:, 1], self.stiffness, self.rest_lengths)

    def angular_momentum(self, state: PhaseSpace):
        """Σ m r × v about the origin (a scalar in 2-D, a 3-vector in 3-D)."""
        return _angular_momentum(self.masses, state)

    def rest_state(self) -> PhaseSpace:
        """`reference_positions` with zero velocities."""
        if self.reference_positions is None:
            raise ValueError("MassSpringLattice.rest_state: this lattice has no `reference_positions`; "
                             "pass them to the constructor or build it with MassSpringLattice.square.")
        return PhaseSpace(self.reference_positions, jnp.zeros_like(self.reference_positions))

    @in_system_precision
    def default_state(self):
        """The rest state with the last mass shifted by 10% of the shortest rest length along
        every axis (by that length times √d, along the diagonal (1, ..., 1))."""
        state = self.rest_state()
        shift = 0.1 * jnp.min(jnp.broadcast_to(self.rest_lengths, (len(self.springs),)))
        return PhaseSpace(state.positions.at[-1].add(shift), state.velocities)

    def conserved_quantities(self, t, y):
        out = {"energy": self.energy(y), "momentum": self.momentum(y)}
        if y.positions.shape[-1] in (2, 3):
            out["angular_momentum"] = self.angular_momentum(y)
        return out
