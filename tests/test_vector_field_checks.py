"""A system's vector field (and an SDE's diffusion) must return the state's structure, shapes
and dtype: checked while the program is traced, so a wrong shape is an error naming the system
and both structures, not a broadcast and a wrong trajectory."""

import jax
import jax.numpy as jnp
import pytest

import sciax
from sciax._errors import StateMismatchError


class OneComponentField(sciax.systems.AbstractODE):
    """dy/dt for a (2,) state, written wrongly with one component: y + dt * f would broadcast."""

    def vector_field(self, t, y, args=None):
        return -y[:1]


class Decay(sciax.systems.AbstractODE):
    def vector_field(self, t, y, args=None):
        return -y


class WrongDiffusion(sciax.systems.AbstractSDE):
    def vector_field(self, t, y, args=None):
        return -y

    def diffusion(self, t, y, args=None):
        return jnp.ones(1, dtype=y.dtype)


MESSAGE = (r"OneComponentField.vector_field\(t, y, args\) returned array of shape \(1,\) and dtype float64 for "
           r"a state y that is array of shape \(2,\) and dtype float64")


def test_solve_refuses_a_vector_field_of_the_wrong_shape():
    with pytest.raises(StateMismatchError, match="solve: " + MESSAGE):
        sciax.solve(OneComponentField(), jnp.array([1.0, 2.0]), t0=0.0, t1=1.0, rtol=1e-6, atol=1e-8)


def test_simulate_refuses_a_vector_field_of_the_wrong_shape():
    with pytest.raises(StateMismatchError, match="simulate: " + MESSAGE):
        sciax.simulate(OneComponentField(), jnp.array([1.0, 2.0]), integrator=sciax.integrators.RK4(),
                       dt=0.1, n_steps=10)


def test_simulate_refuses_a_wrong_shape_also_under_jit_and_vmap():
    def final(y0):
        return sciax.simulate(OneComponentField(), y0, integrator=sciax.integrators.Euler(), dt=0.1,
                              n_steps=4).final_state

    with pytest.raises(StateMismatchError, match=MESSAGE):
        jax.jit(jax.vmap(final))(jnp.ones((3, 2)))


def test_a_wrong_dtype_and_a_wrong_structure_are_refused():
    class Float32Field(sciax.systems.AbstractODE):
        def vector_field(self, t, y, args=None):
            return (-y).astype(jnp.float32)

    class TupleField(sciax.systems.AbstractODE):
        def vector_field(self, t, y, args=None):
            return (-y[0], -y[1])

    y0 = jnp.array([1.0, 2.0])
    with pytest.raises(StateMismatchError, match=r"returned array of shape \(2,\) and dtype float32"):
        sciax.solve(Float32Field(), y0, t0=0.0, t1=1.0, rtol=1e-6, atol=1e-8)
    with pytest.raises(StateMismatchError, match=r"TupleField.vector_field\(t, y, args\) returned \(\(\) float64, "
                                                 r"\(\) float64\) for a state y that is array of shape \(2,\)"):
        sciax.simulate(TupleField(), y0, integrator=sciax.integrators.RK4(), dt=0.1, n_steps=2)


def test_simulate_refuses_an_sde_diffusion_of_the_wrong_shape(key):
    with pytest.raises(StateMismatchError, match=r"WrongDiffusion.diffusion\(t, y, args\) returned array of "
                                                 r"shape \(1,\)"):
        sciax.simulate(WrongDiffusion(), jnp.array([1.0, 2.0]), integrator=sciax.integrators.EulerMaruyama(),
                       dt=0.1, n_steps=4, key=key)


def test_a_right_vector_field_still_runs_and_matches_the_exact_solution():
    y0 = jnp.array([1.0, 2.0])
    traj = sciax.solve(Decay(), y0, t0=0.0, t1=1.0, rtol=1e-10, atol=1e-12)
    assert jnp.allclose(traj.final_state, y0 * jnp.exp(-1.0), rtol=1e-8)
    traj = sciax.simulate(Decay(), y0, integrator=sciax.integrators.RK4(), dt=0.01, n_steps=100)
    assert jnp.allclose(traj.final_state, y0 * jnp.exp(-1.0), rtol=1e-8)


def test_the_abstract_ode_docstring_example_runs_as_written():
    """The example in AbstractODE's docstring (how to write a system), run as written."""
    import re
    import textwrap

    import equinox as eqx

    doc = sciax.systems.AbstractODE.__doc__
    code = textwrap.dedent(re.search(r"```python\n(.*?)```", doc, re.S).group(1))
    namespace = {"sciax": sciax, "jax": jax, "jnp": jnp, "eqx": eqx}
    exec(code, namespace)  # noqa: S102
    expected = jnp.array([1.0, 2.0]) * jnp.exp(-0.5)
    assert jnp.allclose(namespace["traj"].final_state, expected, rtol=1e-9)
