"""`async_filter_jit`: Equinox's argument filtering, without waiting for the program to run."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciax
from sciax._compile.async_dispatch import async_filter_jit
from sciax.integrators import RK4
from sciax.systems import Lorenz


def _slow(x):
    """About 0.2 s of work on one core (JAX runs programs with host callbacks synchronously on
    CPU, so the test cannot hold the program with one; it outlasts the call instead)."""
    return jax.lax.fori_loop(0, 3000, lambda i, y: jnp.sin(y) * 1.0001, x)


def test_returns_before_the_program_has_run():
    """`eqx.filter_jit` returns only when the program has run; `async_filter_jit` returns once it
    is queued (its output is not ready yet), and the result is the same."""
    x = jnp.ones(100_000)
    waited = eqx.filter_jit(_slow)(x)
    assert waited.is_ready()
    out = async_filter_jit(_slow)(x)
    assert not out.is_ready()
    np.testing.assert_array_equal(out, waited)


def test_simulate_returns_before_the_rollout_has_run():
    """`simulate` queues its rollout and returns, so a host loop (the runner) can write the
    previous chunk while this one runs. 4·10^6 Lorenz steps: about 0.1 s. (1,001 frames: XLA:CPU
    runs a program inline, synchronously, when its cost analysis, which counts a loop body once,
    finds fewer than 1,000 flops, as it does for a rollout that keeps only a few frames.)

    The check reads the rollout's own output, `traj.states`: `traj.final_state` indexes it, and
    the first such index compiles a small program, which on a slow machine took 0.19 s of the
    0.2 s the rollout had left (the test failed once in the full suite that way)."""
    n = 4_000_000
    traj = sciax.simulate(Lorenz(), jnp.array([1.0, 1.0, 1.0]), integrator=RK4(), dt=1e-6, n_steps=n,
                          save_every=n // 1000)
    assert not traj.states.is_ready()
    assert np.isfinite(np.asarray(traj.final_state)).all()


def test_filters_like_eqx_filter_jit():
    """Non-array arguments are static (a new value compiles anew, functions are fine), array
    leaves are traced, non-array outputs come back as they are."""
    traces = []

    def fn(module, scale, activation, label):
        traces.append(1)
        return {"y": activation(module(jnp.ones(2))) * scale, "label": label, "none": None}

    f = async_filter_jit(fn)
    module = eqx.nn.Linear(2, 3, key=jax.random.key(0))
    expected = eqx.filter_jit(fn)(module, jnp.asarray(2.0), jnp.tanh, "a")
    out = f(module, jnp.asarray(2.0), jnp.tanh, "a")
    assert out["label"] == "a" and out["none"] is None
    np.testing.assert_array_equal(out["y"], expected["y"])
    n = len(traces)
    f(module, jnp.asarray(3.0), jnp.tanh, "a")  # new array value: no retrace
    assert len(traces) == n
    f(module, jnp.asarray(3.0), jnp.tanh, "b")  # new static value: retrace
    assert len(traces) == n + 1


def test_arguments_are_bound_to_the_signature():
    """`f(x, 2)` and `f(x, power=2)` are one call (one compiled program); the program is named
    after the function."""
    traces = []

    def power_of(x, power=2):
        traces.append(1)
        return x**power

    f = async_filter_jit(power_of)
    for call in (lambda: f(jnp.arange(3.0), 2), lambda: f(jnp.arange(3.0), power=2), lambda: f(jnp.arange(3.0))):
        np.testing.assert_array_equal(call(), [0.0, 1.0, 4.0])
    assert len(traces) == 2  # f(x) leaves the default unbound, as eqx.filter_jit does
    assert "power_of" in f.lower(jnp.arange(3.0), 2).as_text()


def test_ahead_of_time_compilation_checks_the_static_arguments():
    f = async_filter_jit(lambda x, power: x**power)
    compiled = f.lower(jnp.arange(3.0), 2).compile()
    np.testing.assert_array_equal(compiled(jnp.arange(3.0), 2), [0.0, 1.0, 4.0])
    np.testing.assert_array_equal(compiled(jnp.arange(3.0), power=2), [0.0, 1.0, 4.0])
    assert isinstance(compiled.compiled, jax.stages.Compiled)  # for memory analysis and HLO text
    with pytest.raises(ValueError, match="static arguments other than those it was compiled for"):
        compiled(jnp.arange(3.0), 3)


class _CheckedLorenz(Lorenz):
    """Lorenz with a runtime check in its vector field (as a user might write one)."""

    def vector_field(self, t, y, args):
        y = eqx.error_if(y, jnp.abs(y[0]) > 1e3, "x left the attractor")
        return super().vector_field(t, y, args)


def test_an_error_if_in_user_code_is_an_equinox_error_with_its_message():
    """Raised at the call or where sciax reads the outputs, as `eqx.filter_jit` would raise it,
    not as a bare `JaxRuntimeError`: in simulate (a system's check) and in a sweep."""
    near, far = jnp.array([1.0, 0.0, 0.0]), jnp.array([1e4, 0.0, 0.0])
    simulate = lambda y0: sciax.simulate(_CheckedLorenz(), y0, integrator=RK4(), dt=0.01, n_steps=3)  # noqa: E731
    sweep = lambda y0: sciax.sweep(  # noqa: E731
        _CheckedLorenz(), y0, axes={"rho": jnp.array([28.0, 29.0])},
        rollout=sciax.Simulate(RK4(), dt=0.01, n_steps=3),
        devices=1)  # sharded, JAX reports the other devices' failures again at exit
    for run in (simulate, sweep):
        jax.block_until_ready(run(near))  # compiled first: a compiled program fails with another error type
        for _ in range(2):
            with pytest.raises(eqx.EquinoxRuntimeError, match="x left the attractor"):
                jax.block_until_ready(run(far))
