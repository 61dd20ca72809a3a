"""User functions keyed by code and captured values: a re-created lambda reuses the compiled
program, and a function that computes something else never does."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

import sciax
from sciax._callable_key import by_code
from sciax.integrators import RK4
from sciax.systems import DampedDrivenOscillator, Lorenz

FACTOR = 2.0
COMPILES = []
jax.monitoring.register_event_duration_secs_listener(
    lambda event, duration, **kw: COMPILES.append(event) if event == "/jax/core/compile/backend_compile_duration"
    else None)


def component(i):
    return lambda y: y[i]


def scaled(c):
    return lambda t, y, system: c * y[0]


def times_factor():
    return lambda t, y, system: FACTOR * y[0]


def times_array(a):
    return lambda y: a * y


def test_keys_compare_code_and_captured_values():
    assert by_code(component(0)) == by_code(component(0))
    assert hash(by_code(component(0))) == hash(by_code(component(0)))
    assert by_code(component(0)) != by_code(component(1))  # another closure value
    assert by_code(scaled(1.0)) != by_code(scaled(1))  # same value, another type
    assert by_code(scaled(0.0)) != by_code(scaled(-0.0))  # 1/c would differ
    assert by_code(component(0)) != by_code(lambda y: y[0])  # another code object
    a = np.ones(3)
    assert by_code(times_array(a)) == by_code(times_array(a))  # the same array object
    assert by_code(times_array(a)) != by_code(times_array(np.ones(3)))  # equal values, another object
    assert by_code(by_code(component(0))) == by_code(component(0))
    assert by_code(component(0))(jnp.arange(3.0)) == 0.0 and by_code(component(2)).__name__ == "<lambda>"


def test_non_functions_keep_their_own_equality():
    partial = functools.partial(np.add, 1)
    assert by_code(partial) is partial
    assert by_code(np.sin) is np.sin
    system = Lorenz()
    assert by_code(system) is system


def test_rebinding_a_referenced_global_changes_the_key_and_the_result():
    global FACTOR
    before = by_code(times_factor())
    system, y0 = DampedDrivenOscillator(omega=2.0, zeta=0.1), jnp.array([1.0, 0.0])

    def run():
        return sciax.simulate(system, y0, integrator=RK4(), dt=0.01, n_steps=10,
                              observables={"x": times_factor()}).observables["x"]

    first = run()
    try:
        FACTOR = 3.0
        assert by_code(times_factor()) != before
        np.testing.assert_allclose(run(), first * 1.5, rtol=1e-15)
    finally:
        FACTOR = 2.0


def test_simulate_with_a_new_lambda_reuses_the_compiled_rollout_and_other_closures_do_not():
    system, y0 = DampedDrivenOscillator(omega=2.0, zeta=0.1), jnp.array([1.0, 0.0])

    def run(observable):
        traj = sciax.simulate(system, y0, integrator=RK4(), dt=0.01, n_steps=20, observables={"o": observable})
        return jax.block_until_ready(traj.observables["o"])

    one = run(scaled(1.0))
    COMPILES.clear()
    again = run(scaled(1.0))
    assert COMPILES == []
    np.testing.assert_array_equal(again, one)
    np.testing.assert_allclose(run(scaled(2.0)), 2 * one, rtol=1e-15)


def test_sweep_with_a_new_output_lambda_does_not_recompile():
    system, u0 = Lorenz(), jnp.array([1.0, 1.0, 1.0])
    rho = jnp.linspace(20.0, 30.0, 8)
    options = dict(integrator=RK4(), dt=0.01, n_steps=20, save_every=20)

    def run(i):
        return sciax.sweep(system, u0, axes={"rho": rho}, simulate_kwargs=options,
                           output=lambda traj: traj.final_state[i]).outputs

    x = run(0)
    COMPILES.clear()
    np.testing.assert_array_equal(run(0), x)
    assert COMPILES == []
    z = run(2)
    assert not np.array_equal(z, x)
