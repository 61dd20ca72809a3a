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


def test_implicit_gradient_closed_form_and_finite_differences():
    end = lambda k: loaded_chain(k).positions[4, 0]
    g = jax.grad(end)(K)
    np.testing.assert_allclose(g, -F / np.asarray(K) ** 2, rtol=1e-7)  # d/dk_i Σ F/k_j = -F/k_i²
    h = 1e-5
    fd = [(end(K.at[i].add(h)) - end(K.at[i].add(-h))) / (2 * h) for i in range(4)]
    np.testing.assert_allclose(g, fd, rtol=1e-6)
    # with respect to the load: d x_end / dF = Σ 1/k_i
    np.testing.assert_allclose(jax.grad(lambda f: loaded_chain(K, f).positions[4, 0])(F), np.sum(1 / np.asarray(K)),
                               rtol=1e-7)


def test_lattice_under_gravity_gradient_matches_finite_differences():
    lattice = MassSpringLattice.square(3, 3, spacing=1.0, stiffness=10.0, mass=1.0, diagonals=True)
    q0 = lattice.rest_state().positions
    top = q0[:, 1] == q0[:, 1].max()
    fixed = jnp.broadcast_to(top[:, None], q0.shape)
    load = jnp.zeros_like(q0).at[:, 1].set(-0.5)

    def sag(stiffness):
        system = MassSpringLattice.square(3, 3, spacing=1.0, stiffness=stiffness, mass=1.0, diagonals=True)
        return jnp.min(sciax.equilibrium(system, q0, external_force=load, fixed=fixed).positions[:, 1])

    g = jax.grad(sag)(10.0)
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
