"""Sharded sweeps: the member axis split over a 1-D device mesh gives the single-device results.

tests/conftest.py forces 4 host CPU devices for this process; one slow test also starts a fresh
interpreter with XLA_FLAGS set before jax is imported, so it does not depend on conftest.
"""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import sciax
from sciax import integrators as si
from sciax.systems import DoublePendulum, Lorenz, NBody

Y0 = jnp.array([1.0, 0.0, 0.0])
KW = dict(integrator=si.RK4(), dt=0.01, n_steps=60, save_every=20)
AXES = {"rho": jnp.linspace(5.0, 30.0, 45), "sigma": jnp.array([8.0, 10.0, 1e4])}  # 135 members, 45 fail

needs_4 = pytest.mark.skipif(len(jax.devices("cpu")) < 4, reason="needs 4 host CPU devices (tests/conftest.py)")


def run(devices, **kwargs):
    return sciax.sweep(Lorenz(), Y0, axes=AXES, rollout=sciax.Simulate(**KW), devices=devices, keep=True,
                       reduce={"mean": "mean", "var": "var", "max": "max"}, reduce_over="rho", **kwargs)


# The one-chunk case is slow: the two-chunk case runs the same comparison (single device vs 4 devices
# vs a Mesh: bitwise members, failures, reductions, padding) in the default run, and one-chunk
# shard_map sweeps are compared bitwise with one device by test_sharded_equals_unsharded_beyond_lorenz
# and test_chunks_copy_nothing_between_devices.
@needs_4
@pytest.mark.parametrize("batch_size", [pytest.param(None, marks=pytest.mark.slow), 128],  # one chunk; two chunks
                         ids=["None", "128"])                                             # of 32 members per device
def test_sharded_equals_unsharded_in_process(batch_size):
    single = run(1)
    sharded = run(4, batch_size=batch_size)
    mesh = run(Mesh(np.array(jax.devices("cpu")[:4]), ("members",)), batch_size=batch_size)
    assert single.info["devices"] == 1 and sharded.info["devices"] == mesh.info["devices"] == 4
    assert sharded.info["partitioning"] == "shard_map"
    assert sharded.info["padding"] > 0  # 135 members do not divide evenly over 4 devices
    assert sharded.info["chunks"] == (2 if batch_size else 1)
    for other in (sharded, mesh):
        for a, b in zip(jax.tree.leaves(single.outputs), jax.tree.leaves(other.outputs)):
            np.testing.assert_array_equal(a, b)  # bitwise, NaNs of failed members included
        np.testing.assert_array_equal(single.ok, other.ok)
        assert single.failures == other.failures and len(single.failures) == 45
        for name in ("mean", "var", "max"):  # summation order may differ: tight tolerance
            for a, b in zip(jax.tree.leaves(single.reductions[name]), jax.tree.leaves(other.reductions[name])):
                np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)


# The RK4 case is slow: the Tsit5 case runs the same float32 sweeps in the same three layouts (and is
# the one that differed), and test_sharded_equals_unsharded_in_process shards RK4 (float64).
@needs_4
@pytest.mark.parametrize("integrator", [pytest.param(si.RK4(), marks=pytest.mark.slow), si.Tsit5()],
                         ids=["rk4", "tsit5"])
def test_sharded_float32_equals_unsharded(integrator):
    """Float32, one device vs four (two chunks of 32 members per device) vs one device running
    chunks of 32: the same bits. Tsit5 used to differ (9 of 90 finite members, up to 4.5e-6
    relative after 60 chaotic steps): XLA folded `dt` into the products with the tableau's
    coefficients in the single-device program only, until `simulate` put `dt` behind an
    optimisation barrier."""
    kw = dict(KW, integrator=integrator)

    def go(devices, batch_size=None):
        return sciax.sweep(Lorenz(), Y0.astype(jnp.float32), axes=AXES, rollout=sciax.Simulate(**kw), devices=devices,
                           batch_size=batch_size, output=_final)

    sharded, chunked, whole = go(4, batch_size=128), go(1, batch_size=32), go(1)
    assert (sharded.info["batch_size"], chunked.info["batch_size"], whole.info["batch_size"]) == (128, 32, 160)
    assert sharded.outputs.dtype == jnp.float32 and sharded.info["partitioning"] == "shard_map"
    assert sharded.failures == chunked.failures == whole.failures and len(whole.failures) == 45
    for other in (sharded, chunked):
        np.testing.assert_array_equal(other.outputs, whole.outputs)  # NaNs of failed members included


@needs_4
@pytest.mark.parametrize("case", ["nbody-rk4-float64", "double-pendulum-tsit5-float32"])
def test_sharded_equals_unsharded_beyond_lorenz(case):
    """1, 2 and 4 devices give the same bits for a three-body sweep (float64, RK4) and a
    double-pendulum sweep (float32, Tsit5; sines and cosines in the vector field). The
    three-body sweep differed in 7 of 100 members (~1e-16) before the sweep turned off XLA's
    CSE on CPU: the multi-device program shared one broadcast of the masses between the four
    stages, and XLA rewrote `force / masses` as `force * (1 / masses)` in the single-device
    program only."""
    if case.startswith("nbody"):
        system, state0 = NBody.figure_eight()
        axes, kw = {"softening": jnp.linspace(0.0, 0.1, 100)}, dict(integrator=si.RK4(), dt=1e-3, n_steps=100)
    else:
        system, state0 = sciax.astype(DoublePendulum(), jnp.float32), jnp.array([1.5, 1.5, 0.0, 0.0], jnp.float32)
        axes, kw = {"state0[0]": jnp.linspace(0.5, 2.5, 100)}, dict(integrator=si.Tsit5(), dt=5e-3, n_steps=200)
    kw["save_every"] = kw["n_steps"]

    def go(devices):
        return sciax.sweep(system, state0, axes=axes, rollout=sciax.Simulate(**kw), devices=devices, output=_final)

    one = go(1)
    assert jax.tree.leaves(one.outputs)[0].dtype == (jnp.float64 if case.endswith("64") else jnp.float32)
    for devices in (2, 4):
        other = go(devices)
        assert other.info["partitioning"] == "shard_map"
        for a, b in zip(jax.tree.leaves(one.outputs), jax.tree.leaves(other.outputs)):
            np.testing.assert_array_equal(a, b)


@needs_4
def test_auto_partitioning_fallback_equals_single_device(monkeypatch):
    """Rollouts that cannot be traced in shard_map (Diffrax implicit solvers, see _chunk) fall
    back to XLA's partitioning of the NamedSharding-sharded member axis: same results."""
    from sciax.ensemble import _sweep

    monkeypatch.setattr(_sweep, "_traces_in_shard_map", lambda *args: False)
    auto, single = run(4), run(1)
    assert auto.info["partitioning"] == "auto" and single.info["partitioning"] == "single"
    for a, b in zip(jax.tree.leaves(single.outputs), jax.tree.leaves(auto.outputs)):
        np.testing.assert_array_equal(a, b)
    assert auto.failures == single.failures


@needs_4
def test_implicit_solver_sweep_on_four_devices_equals_one():
    """Diffrax's implicit solvers do not trace inside shard_map (lineax and Equinox compare a
    traced value's structure with a constant's, see docs/multihost.md). Lineax's failure fell back
    to XLA's partitioning, but Equinox's, met by a `run` whose initial state is a constant, reached
    the user as "Closure-converted function called with different dynamic arguments". It falls
    back now too, with the single-device bits."""
    from sciax.systems import VanDerPol

    kw = dict(t0=0.0, t1=1.0, solver="kvaerno5", rtol=1e-8, atol=1e-10)
    res = {d: sciax.sweep(VanDerPol(), jnp.array([2.0, 0.0]), axes={"mu": jnp.linspace(1.0, 30.0, 13)}, devices=d,
                          run=lambda s, y, k: sciax.solve(s, jnp.array([2.0, 0.0]), **kw).final_state)
           for d in (1, 4)}
    assert res[4].info["partitioning"] == "auto" and res[4].info["devices"] == 4
    assert np.isfinite(res[1].outputs).all() and not res[1].failures
    np.testing.assert_array_equal(res[4].outputs, res[1].outputs)


@needs_4
def test_no_cross_device_communication_while_stepping():
    """Without reductions the sharded chunk has no collective at all; with them, one per chunk
    for the partial statistics, outside the time-stepping loops."""
    from sciax.ensemble._execute import _chunk_runner
    from sciax.ensemble._sweep import _plan

    def hlo(reduce):
        plan = _plan(Lorenz(), Y0, AXES, mode="grid", rollout=sciax.Simulate(**KW), run=None, output=None,
                     reduce=reduce, reduce_over=None, keep=None, key=None, batch_size=None, memory_budget=None,
                     devices=4, check_finite=True, order=None, gather=True)
        tables = [jnp.asarray(a.values) for a in plan.axes]
        chunk = _chunk_runner(plan.mesh)
        return chunk.lower(plan.config, plan.payload, tables, None, jnp.int32(0), jnp.int32(135)).compile() \
            .compiled.as_text()

    collectives = ("all-reduce", "all-gather", "collective-permute", "all-to-all", "reduce-scatter")
    plain = hlo(None)
    assert "while" in plain and not any(c in plain for c in collectives)
    computations = hlo("mean").split("\n\n")
    entry = [c for c in computations if c.lstrip().startswith("ENTRY")]
    assert len(entry) == 1 and "all-reduce" in entry[0]  # combining the partial statistics
    for computation in computations:  # loop bodies, fusions: no collective anywhere else
        if not computation.lstrip().startswith("ENTRY"):
            assert not any(f"{c}(" in computation or f"{c}-start(" in computation for c in collectives)


@needs_4
def test_chunks_copy_nothing_between_devices():
    """Axis values, member order, system and state0 are placed on every device once per sweep,
    not copied from the default device at every chunk (on a multi-GPU host each copy of a large
    axis table would cross the interconnect). Checked with JAX's transfer guard, over several
    chunks, with a member order and on the memory-budget (ahead-of-time compiled) path."""
    def sweep(**kwargs):
        return sciax.sweep(Lorenz(), Y0, axes={"rho": jnp.linspace(5.0, 30.0, 256)}, rollout=sciax.Simulate(**KW),
                           devices=4,
                           output=_final, reduce="mean", **kwargs)

    reference = sweep()
    member = reference.info["member_bytes"]
    with jax.transfer_guard_device_to_device("disallow"):
        chunked = sweep(batch_size=128)
        ordered = sweep(batch_size=128, order=np.arange(256)[::-1].copy())
        budgeted = sweep(memory_budget=40 * member)
    assert chunked.info["chunks"] == ordered.info["chunks"] == 2
    for other in (chunked, ordered, budgeted):
        np.testing.assert_array_equal(other.outputs, reference.outputs)


def _final(traj):
    return traj.final_state


SCRIPT = textwrap.dedent("""
    import json, os
    assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=4"
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp, numpy as np
    import sciax
    from sciax import integrators as si
    from sciax.systems import Lorenz
    assert len(jax.devices()) == 4, jax.devices()
    kw = dict(integrator=si.RK4(), dt=0.01, n_steps=60, save_every=20)
    axes = {"rho": jnp.linspace(5.0, 30.0, 45), "state0[0]": jnp.array([1.0, 2.0, 3.0])}
    runs = [sciax.sweep(Lorenz(), jnp.array([1.0, 0.0, 0.0]), axes=axes, rollout=sciax.Simulate(**kw), devices=d,
                        batch_size=b, reduce="mean", keep=True)
            for d, b in [(1, None), (4, None), (4, 128)]]
    print(json.dumps({
        "devices": [r.info["devices"] for r in runs],
        "chunks": [r.info["chunks"] for r in runs],
        "bitwise": [all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(runs[0].outputs),
                                                             jax.tree.leaves(r.outputs))) for r in runs],
        "mean_diff": [float(np.max(np.abs(runs[0].reductions["mean"].states - r.reductions["mean"].states)))
                      for r in runs],
    }))
""")


# Slow (7 s): test_sharded_equals_unsharded_in_process checks the same runs (1 vs 4 devices, one and
# two chunks: bitwise members, failures, reductions) in the default run, on the 4 host devices that
# tests/conftest.py sets up exactly as this child does (XLA_FLAGS before jax is imported).
@pytest.mark.slow
def test_sharded_equals_unsharded_in_a_fresh_process():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["devices"] == [1, 4, 4] and out["chunks"][2] == 2
    assert out["bitwise"] == [True, True, True]
    assert max(out["mean_diff"]) < 1e-12
