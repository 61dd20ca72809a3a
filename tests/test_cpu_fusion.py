"""`sciax._compile.cpu_fusion`: the hints are the identity on values and derivatives, and on CPU they do
make XLA compute same-shape arrays in one loop."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciax
import sciax._simulate as simulate_module
from sciax._compile.cpu_fusion import fuse_cotangents, fuse_values
from sciax.integrators import RK4, Tsit5
from sciax.systems import Lorenz

SPECIAL = [0.0, -0.0, 1.0, -2.5, np.inf, -np.inf, np.nan, 1e-310, -1e-310, 3e38, -1e-45]


def _bits(a):
    a = np.asarray(a)
    return a if a.dtype.kind in "iub" else a.view(np.dtype(f"u{a.dtype.itemsize}"))  # floats, bfloat16


def _special(dtype):
    with np.errstate(over="ignore", under="ignore"):
        real = np.array(SPECIAL, np.float64).astype(np.finfo(dtype).dtype)
    if np.dtype(dtype).kind != "c":
        return real
    values = np.empty(real.shape, dtype)
    values.real, values.imag = real, real[::-1]
    return values


@pytest.mark.parametrize("hint", [fuse_values, fuse_cotangents])
def test_values_pass_through_bit_for_bit(hint):
    # Two arrays of each dtype and shape (a group of one is left alone), one of another shape.
    tree = {
        "f32": jnp.asarray(_special(np.float32)),
        "f32_reversed": jnp.asarray(_special(np.float32)[::-1]),
        "f64": jnp.asarray(_special(np.float64)),
        "f64_reversed": jnp.asarray(_special(np.float64)[::-1]),
        "c64": jnp.asarray(_special(np.complex64)),
        "c64_reversed": jnp.asarray(_special(np.complex64)[::-1]),
        "i32": jnp.arange(-5, 6, dtype=jnp.int32),
        "i32_negated": -jnp.arange(-5, 6, dtype=jnp.int32),
        "flag": jnp.asarray([True, False] * 5 + [True]),
        "other_shape": jnp.asarray([-0.0, np.nan]),
        "scalar": 3.0,
        "bf16": jnp.asarray(_special(np.float32)).astype(jnp.bfloat16),  # narrow floats: left alone
        "bf16_reversed": jnp.asarray(_special(np.float32)[::-1]).astype(jnp.bfloat16),
    }
    out = jax.jit(hint)(tree)
    if hint is fuse_values:  # one reduce per dtype group on CPU
        assert jax.jit(hint).lower(tree).as_text().count("stablehlo.reduce") == 4
    for name, leaf in tree.items():
        np.testing.assert_array_equal(_bits(out[name]), _bits(leaf), err_msg=name)
        assert np.asarray(out[name]).dtype == np.asarray(leaf).dtype, name


def _chain(x, y, z):
    for _ in range(3):
        x, y, z = jnp.sin(y) * z + x, jnp.cos(z) * x - y, x * y + jnp.exp(-z)
    return x, y, z


def _entry_hlo(fn, *args):
    text = jax.jit(fn).lower(*args).compile().as_text()
    return text[text.index("ENTRY"):]


def test_same_shape_outputs_are_computed_in_one_loop_on_cpu():
    """The reason for the hints: XLA:CPU emits each output of `_chain` as its own loop (which
    recomputes the whole chain); with the hint it is one loop, forward and backward."""
    x = jnp.linspace(0.0, 1.0, 1000)
    three = r"\(f64\[1000\]\{0\}, f64\[1000\]\{0\}, f64\[1000\]\{0\}\) fusion\("
    plain = _entry_hlo(_chain, x, x, x)
    hinted = _entry_hlo(lambda *a: fuse_values(_chain(*a)), x, x, x)
    assert len(re.findall(r" fusion\(", plain)) >= 3
    assert len(re.findall(r" fusion\(", hinted)) == 1 and re.search(three, hinted)
    # Forward mode: the tangents are hinted too (one loop for the values, one for the tangents).
    jvp = _entry_hlo(lambda *a: jax.jvp(lambda *b: fuse_values(_chain(*b)), a, a), x, x, x)
    assert len(re.findall(three, jvp)) == 2

    def backward(hint):
        return lambda *a: jax.vjp(lambda *b: _chain(*hint(b)), *a)[1]((x, 2 * x, 3 * x))

    assert not re.search(three, _entry_hlo(backward(lambda b: b), x, x, x))
    assert re.search(three, _entry_hlo(backward(fuse_cotangents), x, x, x))


@pytest.mark.parametrize("hint", [fuse_values, fuse_cotangents])
def test_derivatives_pass_through(hint):
    x, y = jnp.linspace(-1.0, 1.0, 7), jnp.linspace(2.0, 3.0, 7)
    n = jnp.arange(7)

    def f(x, y):
        x, y, m = hint((x, y, n))
        return x * jnp.sin(y) + m, y**2

    def f_plain(x, y):
        return x * jnp.sin(y) + n, y**2

    tx, ty = jnp.cos(x), jnp.exp(y)
    for fn in (f, jax.jit(f)):
        primal, tangent = jax.jvp(fn, (x, y), (tx, ty))
        primal_ref, tangent_ref = jax.jvp(f_plain, (x, y), (tx, ty))
        for a, b in zip(primal + tangent, primal_ref + tangent_ref, strict=True):
            np.testing.assert_array_equal(a, b)
        ct = (jnp.arange(7.0), -jnp.ones(7))
        for a, b in zip(jax.vjp(fn, x, y)[1](ct), jax.vjp(f_plain, x, y)[1](ct), strict=True):
            np.testing.assert_array_equal(a, b)
    # Under vmap, jax.checkpoint, second derivatives, and integer leaves (float0 tangents).
    loss = lambda x, y: jnp.sum(f(x, y)[0] ** 2 + f(x, y)[1])
    loss_plain = lambda x, y: jnp.sum(f_plain(x, y)[0] ** 2 + f_plain(x, y)[1])
    np.testing.assert_allclose(jax.jit(jax.grad(jax.checkpoint(loss)))(x, y), jax.grad(loss_plain)(x, y), rtol=1e-15)
    np.testing.assert_allclose(jax.hessian(loss)(x, y), jax.hessian(loss_plain)(x, y), rtol=1e-14)
    batched = jax.vmap(jax.grad(lambda a, b: jnp.sum(hint((a, b))[0] * b)), in_axes=(0, None))
    np.testing.assert_array_equal(batched(jnp.stack([x, y]), y), jnp.stack([y, y]))
    jvp_int = jax.jvp(lambda a: hint((a, n))[1] * 1.0, (x,), (tx,))
    np.testing.assert_array_equal(jvp_int[1], jnp.zeros(7))


def _without_hints(monkeypatch):
    monkeypatch.setattr(simulate_module, "fuse_values", lambda tree: tree)
    monkeypatch.setattr(simulate_module, "fuse_cotangents", lambda tree: tree)
    jax.clear_caches()


@pytest.mark.parametrize(("integrator", "dtype"), [(RK4(), jnp.float32), (Tsit5(), jnp.float64)])
def test_simulate_is_unchanged_by_the_hints(monkeypatch, integrator, dtype):
    """`simulate` puts the hints on every step of a componentwise state: the ensemble rollout
    is bitwise what it is without them, and the gradients agree to rounding."""
    rho = jnp.linspace(0.0, 28.0, 64, dtype=dtype)
    u0 = jnp.asarray([1.0, 0.5, 0.0], dtype)

    def final(r):
        system = Lorenz(sigma=jnp.asarray(10.0, dtype), rho=r, beta=jnp.asarray(8 / 3, dtype))
        return sciax.simulate(system, u0, integrator=integrator, dt=1e-3, n_steps=400, save_every=100).states

    def loss(r):
        return jnp.sum(jax.vmap(final)(r)[:, -1] ** 2)

    def run():
        return np.asarray(jax.jit(jax.vmap(final))(rho)), np.asarray(jax.jit(jax.grad(loss))(rho))

    jax.clear_caches()
    hinted = run()
    assert "sciax_fusion_hint" in str(jax.make_jaxpr(jax.vmap(final))(rho))
    _without_hints(monkeypatch)
    try:
        plain = run()
    finally:  # no hint-free trace is left in JAX's caches for later tests
        monkeypatch.undo()
        jax.clear_caches()
    np.testing.assert_array_equal(_bits(hinted[0]), _bits(plain[0]))
    np.testing.assert_allclose(hinted[1], plain[1], rtol=50 * np.finfo(dtype).eps, atol=0)


def test_hints_do_not_reach_array_states():
    """Only componentwise states (small 1-D ODE states stepped as scalars) get the hints."""
    from sciax import PhaseSpace
    from sciax.integrators import VelocityVerlet
    from sciax.systems import HarmonicOscillator

    s0 = PhaseSpace(jnp.ones((4, 3)), jnp.zeros((4, 3)))
    jaxpr = jax.make_jaxpr(lambda k: sciax.simulate(HarmonicOscillator(stiffness=k, masses=jnp.ones(4)), s0,
                                                    integrator=VelocityVerlet(), dt=0.01, n_steps=4).states)(1.0)
    assert "sciax_fusion_hint" not in str(jaxpr)


def _residual_bytes(adjoint):
    """Bytes of what reverse mode keeps from the forward pass (jax.linearize's residuals)."""

    def final(rho):
        return sciax.simulate(Lorenz(rho=rho), jnp.asarray([1.0, 0.5, 0.0]), integrator=RK4(), dt=1e-3,
                              n_steps=200, save_every=100, adjoint=adjoint).states[-1]

    _, f_jvp = jax.linearize(final, 28.0)
    return sum(np.asarray(leaf).nbytes for leaf in jax.tree_util.tree_leaves(f_jvp))


@pytest.mark.parametrize("adjoint", [sciax.DirectAdjoint(), sciax.CheckpointAdjoint(),
                                     sciax.CheckpointAdjoint(checkpoint_steps=False)])
def test_hints_keep_loop_invariant_work_out_of_the_loop(monkeypatch, adjoint):
    """Reverse mode stores no more with the hints than without: values computed from the
    parameters alone stay loop-invariant (computed and kept once, not once per step)."""
    jax.clear_caches()
    hinted = _residual_bytes(adjoint)
    _without_hints(monkeypatch)
    try:
        plain = _residual_bytes(adjoint)
    finally:
        monkeypatch.undo()
        jax.clear_caches()
    assert hinted <= plain
