"""equilibrium(): positions and implicit-function-theorem gradients against closed forms and FD."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciax
from sciax.systems import Lorenz, MassSpringChain, MassSpringLattice

K = jnp.array([2.0, 5.0, 3.0, 4.0])  # spring constants of a 5-mass chain
L0 = 1.0
F = 0.7


def loaded_chain(stiffness, force=F):
    """5 masses on a line, mass 0 clamped at the origin, pulled by `force` at mass 4."""
    chain = MassSpringChain(masses=jnp.ones(5), stiffness=stiffness, rest_length=L0)
    q0 = jnp.arange(5.0)[:, None] * L0 + 0.1 * jnp.sin(jnp.arange(5.0))[:, None]
    q0 = q0.at[0].set(0.0)
    load = jnp.zeros((5, 1)).at[4, 0].set(force)
    fixed = jnp.zeros((5, 1), bool).at[0].set(True)
    return sciax.equilibrium(chain, q0, external_force=load, fixed=fixed)


def test_loaded_chain_positions_closed_form():
    # Springs in series carry the same tension F: spring i stretches by F / k_i.
    eq = loaded_chain(K)
    expected = np.concatenate([[0.0], np.cumsum(L0 + F / np.asarray(K))])
    np.testing.assert_allclose(eq.positions[:, 0], expected, rtol=1e-12, atol=1e-12)
    assert bool(eq.converged)


def test_a_chain_with_nothing_fixed_says_why_and_keeps_the_bfgs_minimum():
    """Nothing fixed and no load: the chain can translate, the Hessian is singular and Newton's
    steps are NaN. The error did not say so, and throw=False returned all-NaN positions although
    BFGS had found a minimum (every spring at its rest length)."""
    chain = MassSpringChain(masses=jnp.ones(5), stiffness=K, rest_length=L0)
    q0 = jnp.arange(5.0)[:, None] * L0 + 0.1 * jnp.sin(jnp.arange(5.0))[:, None]
    with pytest.raises(Exception, match=r"did not converge from the BFGS minimum \(a singular Hessian does this: a "  # noqa: B017
                                        r"chain or network with nothing `fixed` can translate and rotate\)"):
        jax.block_until_ready(sciax.equilibrium(chain, q0).positions)
    eq = sciax.equilibrium(chain, q0, throw=False)
    assert not bool(eq.converged) and np.isfinite(eq.positions).all()
    np.testing.assert_allclose(np.diff(eq.positions[:, 0]), L0, rtol=1e-6)


@pytest.mark.parametrize(("k", "force"), [(1e3, 100.0), (1e5, 100.0), (1e6, 0.7), (1e6, 100.0), (1e8, 100.0)])
def test_stiff_chain_converges_at_round_off(k, force):
    # Round-off in ∇E is ~k |q| ε (1e-12 for k = 1e3), above any fixed absolute bound near 1e-13,
    # and Newton's steps from the BFGS start are round-off from the first one. The result is
    # exact and must be reported as converged (throw=True raises otherwise).
    stiffness = jnp.full(4, k)
    eq = loaded_chain(stiffness, force=force)
    expected = np.concatenate([[0.0], np.cumsum(L0 + force / np.asarray(stiffness))])
    np.testing.assert_allclose(eq.positions[:, 0], expected, rtol=1e-12, atol=1e-12)
    assert bool(eq.converged)


def test_float32_chain_converges_with_default_tolerances():
    chain = sciax.astype(MassSpringChain(masses=jnp.ones(5), stiffness=K, rest_length=L0), jnp.float32)
    q0 = (jnp.arange(5.0)[:, None] * L0 * 1.01).astype(jnp.float32)
    load = jnp.zeros((5, 1), jnp.float32).at[4, 0].set(F)
    fixed = jnp.zeros((5, 1), bool).at[0].set(True)
    eq = sciax.equilibrium(chain, q0, external_force=load, fixed=fixed)  # throw=True: must converge
    assert eq.positions.dtype == jnp.float32 and bool(eq.converged)
    expected = np.concatenate([[0.0], np.cumsum(L0 + F / np.asarray(K))])
    np.testing.assert_allclose(eq.positions[:, 0], expected, rtol=2e-6)


def test_a_second_call_with_new_values_reuses_the_compiled_program(compiles):
    """Called eagerly, Optimistix's loops were traced and compiled anew at every call (3.6 s each
    for this chain); a load sweep must compile once."""
    cases = [(0.9, K), (1.3, 2 * K)]  # (2 * K compiles a small program of its own)
    loaded_chain(K, 0.5)
    compiles.clear()
    for force, stiffness in cases:
        eq = loaded_chain(stiffness, force)
        expected = np.concatenate([[0.0], np.cumsum(L0 + force / np.asarray(stiffness))])
        np.testing.assert_allclose(np.asarray(eq.positions)[:, 0], expected, rtol=1e-12, atol=1e-12)
    assert compiles == []


def test_implicit_gradient_closed_form_and_finite_differences():
    end = lambda k: loaded_chain(k).positions[4, 0]
    g = jax.jit(jax.grad(end))(K)  # each gradient one program: compiles faster than eagerly
    np.testing.assert_allclose(g, -F / np.asarray(K) ** 2, rtol=1e-7)  # d/dk_i Σ F/k_j = -F/k_i²
    h = 1e-5
    fd = [(end(K.at[i].add(h)) - end(K.at[i].add(-h))) / (2 * h) for i in range(4)]
    np.testing.assert_allclose(g, fd, rtol=1e-6)
    # with respect to the load: d x_end / dF = Σ 1/k_i
    np.testing.assert_allclose(jax.jit(jax.grad(lambda f, k: loaded_chain(k, f).positions[4, 0]))(F, K),
                               np.sum(1 / np.asarray(K)), rtol=1e-7)


def test_lattice_under_gravity_gradient_matches_finite_differences():
    lattice = MassSpringLattice.square(3, 3, spacing=1.0, stiffness=10.0, mass=1.0, diagonals=True)
    q0 = lattice.rest_state().positions
    top = q0[:, 1] == q0[:, 1].max()
    fixed = jnp.broadcast_to(top[:, None], q0.shape)
    load = jnp.zeros_like(q0).at[:, 1].set(-0.5)

    def sag(stiffness):
        system = MassSpringLattice.square(3, 3, spacing=1.0, stiffness=stiffness, mass=1.0, diagonals=True)
        return jnp.min(sciax.equilibrium(system, q0, external_force=load, fixed=fixed).positions[:, 1])

    g = jax.jit(jax.grad(sag))(10.0)
    fd = (sag(10.0 + 1e-4) - sag(10.0 - 1e-4)) / 2e-4
    np.testing.assert_allclose(g, fd, rtol=1e-6)
    assert g > 0  # stiffer springs sag less


def test_bad_input():
    chain = MassSpringChain(masses=jnp.ones(3))
    with pytest.raises(TypeError, match="AbstractHamiltonian particle system, got Lorenz"):
        sciax.equilibrium(Lorenz(), jnp.zeros((3, 1)))
    with pytest.raises(ValueError, match=r"`positions0` must have shape masses.shape \+ \(d,\) = \(3,\)"):
        sciax.equilibrium(chain, jnp.zeros((4, 1)))
    with pytest.raises(ValueError, match="`external_force` must have the shape"):
        sciax.equilibrium(chain, jnp.zeros((3, 1)), external_force=jnp.zeros(3))
    with pytest.raises(ValueError, match="`fixed` must be a bool array"):
        sciax.equilibrium(chain, jnp.zeros((3, 1)), fixed=jnp.zeros((3, 1)))
    # One precision, as in simulate: a float64 load on float32 positions is refused, not cast.
    chain32 = sciax.astype(chain, jnp.float32)
    with pytest.raises(TypeError, match=r"the state is float32 but `external_force` has wider float parameters"):
        sciax.equilibrium(chain32, jnp.zeros((3, 1), jnp.float32), external_force=jnp.ones((3, 1), jnp.float64))
    with pytest.raises(sciax.StateMismatchError, match=r"equilibrium: `positions0`: .*floating point"):
        sciax.equilibrium(chain, jnp.zeros((3, 1), jnp.int32))


def _chain_inputs():
    chain = MassSpringChain(masses=jnp.ones(3))
    q0 = jnp.array([[0.0], [1.1], [2.2]])
    fixed = jnp.zeros((3, 1), bool).at[0].set(True)
    return chain, q0, fixed


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    (dict(positions0=jnp.array([[0.0], [jnp.nan], [2.2]])), ValueError,
     r"^equilibrium: `positions0` holds NaN or Inf \(1 value\(s\), the first at positions0\[1, 0\]\)"),
    (dict(positions0=jnp.array([[0.0], [1.1], [jnp.inf]])), ValueError,
     r"^equilibrium: `positions0` holds NaN or Inf"),
    (dict(external_force=jnp.zeros((3, 1)).at[2, 0].set(jnp.nan)), ValueError,
     r"^equilibrium: `external_force` holds NaN or Inf \(1 value\(s\), the first at external_force\[2, 0\]\); "
     r"the load must be finite"),
    (dict(max_steps=0), ValueError, r"^equilibrium: `max_steps` must be a positive integer, got 0\.$"),
    (dict(max_steps=-5), ValueError, r"^equilibrium: `max_steps` must be a positive integer, got -5\.$"),
    (dict(max_steps=10.5), TypeError, r"^equilibrium: `max_steps` must be a Python int, got float 10\.5\.$"),
    (dict(max_steps=True), TypeError, r"^equilibrium: `max_steps` must be a Python int, got bool True\.$"),
    (dict(rtol="a"), TypeError, r"^equilibrium: `rtol` must be a real number, got str 'a'\.$"),
    (dict(atol="a"), TypeError, r"^equilibrium: `atol` must be a real number, got str 'a'\.$"),
    (dict(rtol=1j), TypeError, r"^equilibrium: `rtol` must be a real number, got complex 1j\.$"),
    (dict(atol=True), TypeError, r"^equilibrium: `atol` must be a real number, got bool True\.$"),
    (dict(rtol=jnp.array([1e-8, 1e-8])), ValueError,
     r"^equilibrium: `rtol` must be a scalar, got array of shape \(2,\)"),
    (dict(rtol=-1), ValueError, r"^equilibrium: `rtol` must be finite and >= 0, got -1\.0\.$"),
    (dict(atol=-1e-8), ValueError, r"^equilibrium: `atol` must be finite and >= 0, got -1e-08\.$"),
    (dict(rtol=float("nan")), ValueError, r"^equilibrium: `rtol` must be finite and >= 0, got nan\.$"),
    (dict(atol=float("inf")), ValueError, r"^equilibrium: `atol` must be finite and >= 0, got inf\.$"),
    (dict(rtol=0.0, atol=0), ValueError, r"^equilibrium: `rtol` and `atol` are both 0"),
    (dict(throw="no"), TypeError, r"^equilibrium: `throw` must be True or False, got str 'no'\.$"),
    (dict(throw=1), TypeError, r"^equilibrium: `throw` must be True or False, got int 1\.$"),
])
def test_bad_arguments_are_refused_on_the_host(kwargs, error, message):
    chain, q0, fixed = _chain_inputs()
    kwargs = dict(positions0=q0, fixed=fixed) | kwargs
    with pytest.raises(error, match=message):
        sciax.equilibrium(chain, **kwargs)


def test_float32_infinite_load_after_cast_is_refused():
    chain, q0, fixed = _chain_inputs()
    chain32 = sciax.astype(chain, jnp.float32)
    load = np.zeros((3, 1)).astype(np.float32)
    with pytest.raises(ValueError, match=r"^equilibrium: `external_force` holds NaN or Inf"):
        sciax.equilibrium(chain32, q0.astype(jnp.float32), fixed=fixed, external_force=load + np.float32(np.inf))


def test_valid_edge_arguments_are_accepted():
    # rtol=0 (absolute tolerance only), NumPy scalars and np.bool_ are valid; throw=False runs.
    chain, q0, fixed = _chain_inputs()
    eq = sciax.equilibrium(chain, q0, fixed=fixed, rtol=0.0, atol=np.float64(1e-10), max_steps=np.int64(500),
                           throw=np.bool_(True))
    assert bool(eq.converged)
    np.testing.assert_allclose(eq.positions[:, 0], [0.0, 1.0, 2.0], atol=1e-9)


def test_checks_skip_traced_values():
    # Under jit/grad the positions and tolerances are tracers: the value checks are skipped, not failed.
    chain, q0, fixed = _chain_inputs()
    load = jnp.zeros((3, 1)).at[2, 0].set(0.5)
    run = jax.jit(lambda q, f, r: sciax.equilibrium(chain, q, external_force=f, fixed=fixed, rtol=r).positions)
    np.testing.assert_allclose(run(q0, load, 1e-10)[:, 0], [0.0, 1.5, 3.0], atol=1e-9)
    g = jax.grad(lambda f: sciax.equilibrium(chain, q0, external_force=f, fixed=fixed).positions[2, 0])(load)
    np.testing.assert_allclose(g[:, 0], [0.0, 1.0, 2.0], atol=1e-7)  # stiffness 1: dx_2/df_2 = 2, dx_1/df_2 = 1
