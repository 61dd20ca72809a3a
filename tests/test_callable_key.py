"""User functions keyed by code and captured values: a re-created lambda reuses the compiled
program, and a function that computes something else never does."""

import copy
import functools
import pickle
import sys
import time
import types

import jax
import jax.numpy as jnp
import numpy as np

import sciax
from sciax._compile.callable_key import by_code
from sciax.integrators import RK4
from sciax.systems import DampedDrivenOscillator, Lorenz

FACTOR = 2.0


def component(i):
    return lambda y: y[i]


def scaled(c):
    return lambda t, y, system: c * y[0]


def times_factor():
    return lambda t, y, system: FACTOR * y[0]


def times_array(a):
    return lambda y: a * y


def test_functions_that_can_reach_mutable_state_are_left_unwrapped():
    """A re-created lambda that reads a dict, list, NumPy array, `self`, a user class or a
    function attribute could compute something new without its code or captures changing:
    it is not keyed (it recompiles, as before), so a result is never stale."""
    cfg, cols, weights = {"gain": 1.0}, [0], np.ones(3)

    class Holder:
        gain = 1.0

        def make(self):
            return lambda y: self.gain * y

    def helper(y):
        return helper.scale * y

    helper.scale = 2.0
    partial = functools.partial(np.multiply, 2.0)
    for make in (lambda: (lambda y: cfg["gain"] * y), lambda: (lambda y: y[cols[0]]),
                 lambda: (lambda y: weights * y), Holder().make, lambda: (lambda y: Holder.gain * y),
                 lambda: (lambda y: helper(y)), lambda: (lambda y: partial(y))):
        fn = make()
        assert by_code(fn) is fn


GAIN = 1.0


def _potential(x):
    return 0.5 * GAIN * jnp.sum(x**2)


_FORCE = jax.grad(_potential)  # a library wrapper (defined in jax) around user code
_SENSOR = jnp.vectorize(lambda x: GAIN * x)


def test_library_wrappers_around_user_code_are_judged_by_what_they_wrap():
    """`jax.grad(f)`, `jax.vmap(f)`, `jnp.vectorize(f)`, `jax.checkpoint(f)` return functions
    defined in jax that run `f`: a lambda calling one must see a global `f` reads change (it
    was keyed as library code, so a rebound GAIN reused the stale program)."""
    global GAIN
    system, y0 = DampedDrivenOscillator(omega=2.0, zeta=0.1), jnp.array([1.0, 0.0])
    kw = dict(integrator=RK4(), dt=0.01, n_steps=4, save_every=2)
    for wrap in (jax.grad, jax.vmap, jnp.vectorize, jax.checkpoint, jax.jacfwd):
        assert by_code(wrap(_potential)) is not None
    try:
        results = []
        for gain in (1.0, 10.0):
            GAIN = gain
            traj = sciax.simulate(system, y0, **kw, observables={"f": lambda t, y, s: _FORCE(y)[0] + _SENSOR(y)[1]})
            results.append(np.asarray(traj.observables["f"]))
        np.testing.assert_allclose(results[1], 10 * results[0], rtol=1e-12)
    finally:
        GAIN = 1.0
    # Library functions that close over nothing of the user's are still keyed by identity,
    # also when a library transform wraps library code.
    keyed = type(by_code(lambda y: y))
    assert isinstance(by_code(lambda y: jnp.sin(y) + jnp.sum(y) + jax.nn.relu(y)), keyed)
    for wrapped in (jax.grad(jnp.sin), jax.vmap(jnp.sin), jnp.vectorize(jnp.sin), jax.hessian(jnp.sum)):
        assert isinstance(by_code(lambda y, f=wrapped: f(y)), keyed)


def test_attribute_names_are_not_taken_for_globals():
    """`s.omega` reads an attribute: a user global that happens to be called `omega` (a NumPy
    array, which is not keyable) must not stop the lambda from being keyed."""
    sys.modules[__name__].omega = np.ones(3)
    try:
        fn = lambda t, y, s: s.omega * y[0]  # noqa: E731
        assert by_code(fn) is not fn
        uses_global = lambda t, y, s: omega * y[0]  # noqa: E731, F821
        assert by_code(uses_global) is uses_global
    finally:
        del sys.modules[__name__].omega


def test_mutable_state_read_by_a_new_lambda_is_seen_by_simulate_fit_and_sweep():
    system, y0 = DampedDrivenOscillator(omega=2.0, zeta=0.1), jnp.array([1.0, 0.0])
    cfg = {"gain": 1.0}

    def run():
        return sciax.simulate(system, y0, integrator=RK4(), dt=0.01, n_steps=3,
                              observables={"x": lambda t, y, s: cfg["gain"] * y[0]}).observables["x"]

    first = run()
    cfg["gain"] = 10.0
    np.testing.assert_allclose(run(), 10 * first, rtol=1e-15)

    cols = [0]
    lorenz, u0, rho = Lorenz(), jnp.array([1.0, 1.0, 1.0]), jnp.linspace(20.0, 30.0, 4)
    options = dict(integrator=RK4(), dt=0.01, n_steps=10, save_every=10)

    def final():
        return sciax.sweep(lorenz, u0, axes={"rho": rho}, rollout=sciax.Simulate(**options),
                           output=lambda traj: traj.final_state[cols[0]]).outputs

    x = final()
    cols[0] = 2
    assert not np.array_equal(final(), x)


def test_hidden_reads_user_modules_and_imports_are_left_unwrapped():
    """Reads the key cannot follow (a user module's attributes, getattr by name, an import inside
    the function) leave the function unwrapped, so it always sees the current values."""
    config = types.ModuleType("user_config")
    config.K = 2.0
    sys.modules["user_config"] = config
    namespace = {"config": config}
    exec("def via_module():\n    return lambda y: config.K * y\n"
         "def via_getattr():\n    return lambda y: getattr(config, 'K') * y\n"
         "def via_import():\n    def f(y):\n        import user_config\n        return user_config.K * y\n"
         "    return f\n", namespace)
    try:
        for make in ("via_module", "via_getattr", "via_import"):
            fn = namespace[make]()
            assert by_code(fn) is fn, make
    finally:
        del sys.modules["user_config"]


def test_a_user_decorator_copying_a_library_name_is_not_taken_for_library_code():
    """`functools.wraps(jnp.tanh)` copies `__module__ = 'jax.numpy'` (and sets attributes): the
    wrapper is user code whose closure may change, so it and a lambda calling it stay unwrapped."""
    cfg = {"gain": 1.0}

    def with_gain(f):
        @functools.wraps(f)
        def wrapper(x):
            return cfg["gain"] * f(x)
        return wrapper

    gained = with_gain(jnp.tanh)
    assert by_code(gained) is gained
    caller = (lambda g: (lambda y: g(y)))(gained)
    assert by_code(caller) is caller


def test_deep_or_wide_helpers_are_cheap_to_key_or_left_unwrapped():
    namespace = {}
    source = "\n".join(f"def f{i}(y):\n    return " + " + ".join(f"f{j}(y)" for j in range(12) if j != i)
                       for i in range(12))
    exec(source + "\ndef make():\n    return lambda y: f0(y)\n", namespace)
    fn = namespace["make"]()
    start = time.perf_counter()
    wrapped = by_code(fn)
    assert time.perf_counter() - start < 0.05  # a budget, not a benchmark: exponential blow-up was 0.1–0.5 s
    assert wrapped is fn  # mutually recursive helpers: not keyed
    nested = (1,)
    for _ in range(5000):
        nested = (nested,)
    deep = (lambda n: (lambda y: n and y))(nested)
    assert by_code(deep) is deep


def test_wrapped_functions_copy_pickle_and_bind_like_functions():
    wrapped = by_code(component(1))
    assert copy.deepcopy(wrapped) is wrapped and copy.copy(wrapped)(jnp.arange(3.0)) == 1.0
    module_level = by_code(times_factor)
    assert pickle.loads(pickle.dumps(module_level)) == module_level

    class C:
        method = by_code(lambda self, y: y + 1)

    assert C().method(2) == 3


def test_keys_compare_code_and_captured_values():
    assert by_code(component(0)) == by_code(component(0))
    assert hash(by_code(component(0))) == hash(by_code(component(0)))
    assert by_code(component(0)) != by_code(component(1))  # another closure value
    assert by_code(scaled(1.0)) != by_code(scaled(1))  # same value, another type
    assert by_code(scaled(0.0)) != by_code(scaled(-0.0))  # 1/c would differ
    assert by_code(component(0)) != by_code(lambda y: y[0])  # another code object
    a = jnp.ones(3)
    assert by_code(times_array(a)) == by_code(times_array(a))  # the same (immutable) JAX array
    assert by_code(times_array(a)) != by_code(times_array(jnp.ones(3)))  # equal values, another object
    assert by_code(scaled(np.float32(1.0))) == by_code(scaled(np.float32(1.0)))  # NumPy scalars by value
    assert by_code(scaled(np.float32(1.0))) != by_code(scaled(np.float64(1.0)))
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


def test_simulate_with_a_new_lambda_reuses_the_compiled_rollout_and_other_closures_do_not(compiles):
    system, y0 = DampedDrivenOscillator(omega=2.0, zeta=0.1), jnp.array([1.0, 0.0])

    def run(observable):
        traj = sciax.simulate(system, y0, integrator=RK4(), dt=0.01, n_steps=20, observables={"o": observable})
        return jax.block_until_ready(traj.observables["o"])

    one = run(scaled(1.0))
    compiles.clear()
    again = run(scaled(1.0))
    assert compiles == []
    np.testing.assert_array_equal(again, one)
    np.testing.assert_allclose(run(scaled(2.0)), 2 * one, rtol=1e-15)


def test_sweep_with_a_new_output_lambda_does_not_recompile(compiles):
    system, u0 = Lorenz(), jnp.array([1.0, 1.0, 1.0])
    rho = jnp.linspace(20.0, 30.0, 8)
    options = dict(integrator=RK4(), dt=0.01, n_steps=20, save_every=20)

    def run(i):
        return sciax.sweep(system, u0, axes={"rho": rho}, rollout=sciax.Simulate(**options),
                           output=lambda traj: traj.final_state[i]).outputs

    x = run(0)
    compiles.clear()
    np.testing.assert_array_equal(run(0), x)
    assert compiles == []
    z = run(2)
    assert not np.array_equal(z, x)


def test_sweep_with_a_new_streaming_reduction_or_axis_where_does_not_recompile(compiles):
    """`Streaming` reductions and `Axis(where=...)` were compared by identity: re-created at every
    call (lambdas in a loop) they recompiled the chunk, unlike `output`, `run` and observables."""
    from sciax.ensemble import Axis, Streaming

    system, u0 = Lorenz(), jnp.array([1.0, 1.0, 1.0])
    rho = jnp.linspace(20.0, 30.0, 8)
    options = dict(integrator=RK4(), dt=0.01, n_steps=20, save_every=20)

    def run(power):
        moment = Streaming(partial=lambda v, w: (jnp.sum(w), jnp.sum(w[:, None] * v ** power, axis=0)),
                           merge=lambda a, b: (a[0] + b[0], a[1] + b[1]), finalize=lambda s: s[1] / s[0])
        res = sciax.sweep(system, u0, axes={"r": Axis(rho, where=lambda s, y: s.rho)},
                          rollout=sciax.Simulate(**options),
                          output=lambda traj: traj.final_state, reduce={"m": moment}, keep=True)
        return np.asarray(res.reductions["m"]), np.asarray(res.outputs)

    m2, finals = run(2)
    np.testing.assert_allclose(m2, np.mean(finals ** 2, axis=0), rtol=1e-13)
    compiles.clear()
    again, _ = run(2)
    assert compiles == []
    np.testing.assert_array_equal(again, m2)
    m3, _ = run(3)  # another captured value: compiled anew, its own result
    np.testing.assert_allclose(m3, np.mean(finals ** 3, axis=0), rtol=1e-13)
