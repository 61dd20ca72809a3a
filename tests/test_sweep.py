"""sweep(): axes and coordinates, chunking, reductions, failures, adaptive solves, bad input."""

import jax
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import sciax
from sciax import PhaseSpace, integrators as si
from sciax.ensemble import Apply, Axis, Count, Mean, Quantile, Std, Streaming, Variance
from sciax.systems import HarmonicOscillator, Lorenz, OrnsteinUhlenbeck, VanDerPol

Y0 = jnp.array([1.0, 0.0, 0.0])
KW = dict(integrator=si.RK4(), dt=0.01, n_steps=60, save_every=20)
RHO = jnp.linspace(5.0, 30.0, 5)
X0 = jnp.array([1.0, 2.0, 3.0])


# Module-level functions: an identical sweep reuses the compiled chunk (the jit cache keys
# on the function objects), which keeps this file fast.
def final(traj):
    return traj.final_state


def z_frames(traj):
    return traj.states[..., 2]


def identity(system, state0, key):
    return state0


def reference(rho, x0):
    """One member computed directly (float64)."""
    return sciax.simulate(Lorenz(rho=rho), Y0.at[0].set(x0), **KW).final_state


def lorenz_grid(**kwargs):
    kwargs.setdefault("output", final)
    return sciax.sweep(Lorenz(), Y0, axes={"rho": RHO, "state0[0]": X0}, rollout=sciax.Simulate(**KW), **kwargs)


# ------------------------------------------------------------------------------ axes, coords
def test_grid_outputs_shaped_by_axes_and_equal_direct_runs():
    res = lorenz_grid()
    assert res.dims == ("rho", "state0[0]") and res.shape == (5, 3)
    assert res.outputs.shape == (5, 3, 3) and res.outputs.dtype == jnp.float64
    for i, rho in enumerate(RHO):
        for j, x0 in enumerate(X0):
            np.testing.assert_allclose(res.outputs[i, j], reference(rho, x0), rtol=1e-12, atol=1e-12)
    assert res.ok.shape == (5, 3) and res.ok.all() and res.failures == []


def test_grid_coordinates_that_round_onto_each_other_in_the_run_precision_are_warned_about():
    """28.0 and 28.0000005 are both 28.0 in float32: the two grid members ran the same value
    under two labels, silently. Not in zip mode (random samples do this by chance), nor for
    repeated coordinates (given twice on purpose), NaN, or ±0."""
    lorenz32 = sciax.astype(Lorenz(), jnp.float32)
    y32 = Y0.astype(jnp.float32)
    with pytest.warns(RuntimeWarning, match=r"axis 'rho': in float32, the precision of its target, 1 distinct value "
                                            r"rounds onto another \(e.g. 28.0 and 28.0000005 are both 28.0\)") as w:
        res = sciax.sweep(lorenz32, y32, axes={"rho": np.array([28.0, 28.0000005, 29.0])}, run=identity)
    assert w[0].filename == __file__
    np.testing.assert_array_equal(res.outputs[0], res.outputs[1])  # what it is about
    with pytest.warns(RuntimeWarning, match=r"axis 'state0\[0\]': in float32, .* 2 distinct values round onto"):
        sciax.sweep(lorenz32, y32, axes={"state0[0]": 1.0 + np.array([0.0, 1e-9, 2e-9])}, run=identity)
    # Once with order="cost" too (its pilot sweep warned a second time, from inside sciax).
    with pytest.warns(RuntimeWarning, match="rounds onto another") as w:
        sciax.sweep(sciax.astype(VanDerPol(), jnp.float32), jnp.array([2.0, 0.0], jnp.float32),
                    axes={"mu": np.array([1.0, 1.0 + 1e-9, 2.0])}, rollout=sciax.Solve(t0=0.0, t1=0.1), order="cost")
    assert len(w) == 1 and w[0].filename == __file__
    # No warning (filterwarnings = error):
    sciax.sweep(lorenz32, y32, axes={"rho": np.array([28.0, 28.0000005]), "sigma": np.array([1.0, 2.0])},
                mode="zip", run=identity)
    sciax.sweep(lorenz32, y32, axes={"rho": np.array([28.0, 28.0, np.nan, np.nan, 0.0, -0.0])}, run=identity)
    sciax.sweep(Lorenz(), Y0, axes={"rho": np.array([28.0, 28.0000005])}, run=identity)  # distinct in float64


def test_sel_and_isel_by_coordinate():
    res = lorenz_grid()
    one = res.sel(rho=11.25, **{"state0[0]": 2.0})
    assert one.dims == () and one.outputs.shape == (3,)
    np.testing.assert_array_equal(one.outputs, res.outputs[1, 1])
    np.testing.assert_array_equal(res.sel(rho=12.0, method="nearest").outputs, res.outputs[1])
    np.testing.assert_array_equal(res.isel(rho=4).sel(**{"state0[0]": 3.0}).outputs, res.outputs[4, 2])
    assert res.coords(5) == {"rho": 11.25, "state0[0]": 3.0}
    with pytest.raises(ValueError, match=r"no member with rho = 12.0; nearest values: \[11.25, 17.5, 5.0\]"):
        res.sel(rho=12.0)
    with pytest.raises(ValueError, match=r"'sigma' is not an axis of this sweep; axes: \['rho', 'state0\[0\]'\]"):
        res.sel(sigma=10.0)


def test_zip_mode_varies_axes_together():
    rho, x0 = jnp.array([10.0, 20.0, 28.0]), jnp.array([1.0, 0.5, 2.0])
    res = sciax.sweep(Lorenz(), Y0, axes={"rho": rho, "state0[0]": x0}, mode="zip", rollout=sciax.Simulate(**KW),
                      output=final)
    assert res.dims == ("member",) and res.outputs.shape == (3, 3)
    for i in range(3):
        np.testing.assert_allclose(res.outputs[i], reference(rho[i], x0[i]), rtol=1e-12)
    np.testing.assert_array_equal(res.sel(rho=20.0).outputs, res.outputs[1])
    assert res.sel(rho=20.0).axes == {"rho": 20.0, "state0[0]": 0.5}


def test_python_number_fields_are_sweepable():
    class Decay(sciax.systems.AbstractODE):
        k: float = 1.0  # a plain Python float, not an array

        def vector_field(self, t, y, args=None):
            return -self.k * y

    kw = dict(integrator=si.RK4(), dt=0.01, n_steps=100, save_every=100)
    res = sciax.sweep(Decay(), jnp.ones(1), axes={"k": np.array([0.5, 2.0])}, rollout=sciax.Simulate(**kw),
                      output=final)
    for i, k in enumerate([0.5, 2.0]):
        np.testing.assert_allclose(res.outputs[i], sciax.simulate(Decay(k=k), jnp.ones(1), **kw).final_state,
                                   rtol=1e-14)
    np.testing.assert_allclose(res.outputs[:, 0], np.exp(-np.array([0.5, 2.0])), rtol=1e-8)  # RK4 error
    # A Python float takes the run's precision: a float32 state sweeps in float32 (x64 is on here).
    res32 = sciax.sweep(Decay(), jnp.ones(1, jnp.float32), axes={"k": np.array([0.5, 2.0])},
                        rollout=sciax.Simulate(**kw),
                        output=final)
    assert res32.outputs.dtype == jnp.float32
    np.testing.assert_allclose(res32.outputs, res.outputs, rtol=1e-6)
    # The same through Axis(where=...) (it cast the values to float64, and the sweep raised).
    by_where = sciax.sweep(Decay(), jnp.ones(1, jnp.float32), axes={"k": Axis(np.array([0.5, 2.0]),
                                                                              where=lambda s, y: s.k)},
                           rollout=sciax.Simulate(**kw), output=final)
    np.testing.assert_array_equal(by_where.outputs, res32.outputs)
    assert by_where.outputs.dtype == jnp.float32


@pytest.mark.parametrize("values", [np.array([10.0, 20.0], np.float32), [10, 20]], ids=["float32", "ints"])
def test_a_weakly_typed_field_sweeps_in_the_states_precision(values):
    """Lorenz() holds weakly typed float64 fields when x64 is on (converter=jnp.asarray of a
    Python float). simulate runs them in a float32 state's precision; sweep cast the axis values
    to float64 and refused the member ('wider float parameters at .rho')."""
    y32 = Y0.astype(jnp.float32)
    assert Lorenz().rho.weak_type and Lorenz().rho.dtype == jnp.float64
    res = sciax.sweep(Lorenz(), y32, axes={"rho": values}, rollout=sciax.Simulate(**KW), output=final)
    assert res.outputs.dtype == jnp.float32
    for i, rho in enumerate([10.0, 20.0]):
        direct = sciax.simulate(Lorenz(rho=rho), y32, **KW).final_state
        assert direct.dtype == jnp.float32
        np.testing.assert_allclose(res.outputs[i], direct, rtol=1e-5)
    assert sciax.sweep(Lorenz(), Y0, axes={"rho": values}, rollout=sciax.Simulate(**KW), output=final).outputs.dtype \
        == jnp.float64  # a float64 state keeps float64


def test_whole_state_particle_state_and_where_axes():
    osc = HarmonicOscillator(stiffness=1.0, masses=1.0)
    state = PhaseSpace(jnp.array([1.0, 0.0]), jnp.array([0.0, 0.5]))
    kw = dict(integrator=si.VelocityVerlet(), dt=0.01, n_steps=100, save_every=100)
    res = sciax.sweep(
        osc, state,
        axes={"state0.positions[1]": jnp.array([0.0, 0.3]),
              "k": Axis(jnp.array([1.0, 4.0]), where=lambda s, y: s.stiffness)},
        rollout=sciax.Simulate(**kw), output=final)
    assert res.outputs.positions.shape == (2, 2, 2)
    for i, q1 in enumerate([0.0, 0.3]):
        for j, k in enumerate([1.0, 4.0]):
            exact = HarmonicOscillator(stiffness=k).exact(PhaseSpace(state.positions.at[1].set(q1),
                                                                     state.velocities), 1.0)
            np.testing.assert_allclose(res.outputs.positions[i, j], exact.positions, atol=1e-4)


def test_seed_axis_gives_each_seed_its_own_noise(key):
    ou = OrnsteinUhlenbeck(theta=1.0, mu=0.0, sigma=0.5)
    kw = dict(integrator=si.EulerMaruyama(), dt=0.01, n_steps=50, save_every=50)
    res = sciax.sweep(ou, jnp.array([1.0]), axes={"theta": jnp.array([1.0, 2.0]), "seed": jnp.arange(3)},
                      rollout=sciax.Simulate(**kw), output=final, key=key)
    for i, theta in enumerate([1.0, 2.0]):
        for s in range(3):
            direct = sciax.simulate(OrnsteinUhlenbeck(theta=theta, mu=0.0, sigma=0.5), jnp.array([1.0]),
                                    key=jr.fold_in(key, s), **kw).final_state
            np.testing.assert_allclose(res.outputs[i, s], direct, rtol=1e-12)
    assert len(np.unique(res.outputs[0])) == 3  # different seeds, different noise


# ------------------------------------------------------------------------------ chunks, memory
# The float32 Tsit5 case is slow: the RK4 case runs every layout here (all devices, chunks of 32 on one
# device, a shuffled order, a memory budget) in the default run, and
# test_sharding.py::test_sharded_float32_equals_unsharded[tsit5] compares the float32 Tsit5 bits of 4
# devices, chunks of 32 on one device and one whole chunk (the case that differed) by default.
@pytest.mark.parametrize(("integrator", "dtype"), [(si.RK4(), jnp.float64),
                                                   pytest.param(si.Tsit5(), jnp.float32, marks=pytest.mark.slow)],
                         ids=["rk4-float64", "tsit5-float32"])
def test_chunked_equals_unchunked(integrator, dtype):
    """45 members: one chunk over every device (tests/conftest.py gives 4), two chunks of 32 on
    one device, a shuffled order, and chunks sized by a memory budget: the same bits in every
    layout. (Float32 Tsit5 differed by a few ulps between the 4-device and 1-device programs
    until `simulate` hid `dt` from XLA's constant folding; see `_rollout`.)"""
    kw = dict(KW, integrator=integrator)

    def grid(**kwargs):
        return sciax.sweep(Lorenz(), Y0.astype(dtype), axes={"rho": jnp.linspace(5.0, 30.0, 15), "state0[0]": X0},
                           rollout=sciax.Simulate(**kw), output=final, **kwargs)

    whole = grid()
    chunked = grid(batch_size=32, devices=1)
    assert whole.info["chunks"] == 1 and chunked.info["chunks"] == 2 and whole.outputs.dtype == dtype
    shuffled = grid(batch_size=32, devices=1, order=np.random.default_rng(0).permutation(45))
    np.testing.assert_array_equal(shuffled.outputs, chunked.outputs)  # run order does not matter
    budget = 32 * whole.info["member_bytes"] + 1  # room for 32 members, not 45
    bounded = grid(memory_budget=budget, devices=1)
    assert bounded.info["chunks"] == 2 and bounded.info["batch_size"] * bounded.info["member_bytes"] <= budget
    np.testing.assert_array_equal(bounded.outputs, chunked.outputs)
    np.testing.assert_array_equal(chunked.outputs, whole.outputs)


def test_cache_blocks_on_cpu_and_one_vmap_on_accelerators_give_the_same_members(monkeypatch):
    """On CPU a chunk runs in cache-sized blocks one after another; on a GPU/TPU as one vmap
    (blocks in sequence would leave the accelerator idle). Both give the same members."""
    from sciax.ensemble import _chunking, _sweep

    assert _chunking._cache_block("cpu") == _chunking._CACHE_BLOCK
    assert _chunking._cache_block("gpu") is None and _chunking._cache_block("tpu") is None
    # A long saved trajectory per member is not blocked (its transpose after each block costs more).
    limit = _chunking._CACHE_BLOCK_MAX_OUTPUT_BYTES
    assert _chunking._cache_block("cpu", limit - 1) == _chunking._CACHE_BLOCK
    assert _chunking._cache_block("cpu", limit) is None
    assert _chunking._cache_block("cpu", limit, threads=4) is None and _chunking._cache_block("gpu", 0, 4) is None
    every_step = _sweep._plan(Lorenz(), Y0, {"rho": RHO}, mode="grid", rollout=sciax.Simulate(**dict(KW, save_every=1)),
                              run=None, output=None, reduce=None, reduce_over=None, keep=None,
                              key=None, batch_size=None, memory_budget=None, devices=1, check_finite=True,
                              order=None, gather=True)
    assert every_step.config.cache_block is None  # 61 float64 frames of 3 components per member
    whole = lorenz_grid(devices=1)
    monkeypatch.setattr(_chunking, "_cache_block", lambda *a: 8)  # 15 members (16 with padding): two blocks
    blocked = lorenz_grid(devices=1)
    monkeypatch.setattr(_chunking, "_cache_block", lambda *a: None)  # what an accelerator runs
    one_vmap = lorenz_grid(devices=1)
    for other in (blocked, one_vmap):
        np.testing.assert_array_equal(other.outputs, whole.outputs)
        np.testing.assert_array_equal(other.ok, whole.ok)


def test_cache_blocks_grow_with_the_threads_of_each_cpu_device(monkeypatch):
    """XLA:CPU splits each kernel over its threads, which does not pay for a block of 8,192
    members: with several cores per device a block holds `_CACHE_BLOCK_PER_THREAD` members per
    thread; the cores this process may use (its affinity) are shared by the mesh's devices."""
    from sciax.ensemble import _chunking, _sweep

    assert _chunking._cache_block("cpu", 0, threads=1) == _chunking._CACHE_BLOCK == 8192
    assert _chunking._cache_block("cpu", 0, threads=2) == 2 * _chunking._CACHE_BLOCK_PER_THREAD
    assert _chunking._cache_block("cpu", 0, threads=8) == 8 * _chunking._CACHE_BLOCK_PER_THREAD

    def plan(devices):
        return _sweep._plan(Lorenz(), Y0, {"rho": RHO}, mode="grid", rollout=sciax.Simulate(**KW),
                            run=None, output=final, reduce=None, reduce_over=None, keep=None, key=None,
                            batch_size=None, memory_budget=None, devices=devices, check_finite=True, order=None,
                            gather=True)

    monkeypatch.setattr(_chunking, "_cgroup_cpu_quota", lambda: None)
    monkeypatch.delenv("XLA_FLAGS", raising=False)  # read when the threads are counted, not at import
    cases = [(1, 1, 1), (2, 1, 2), (8, 4, 2), (4, 4, 1), (6, 4, 1), (2, 4, 1)]  # cores, devices, threads
    for cores, devices, threads in cases:
        monkeypatch.setattr(_chunking.os, "sched_getaffinity", lambda pid, n=cores: set(range(n)), raising=False)
        assert _chunking._cpu_threads_per_device(devices) == threads
        assert plan(devices).config.cache_block == (_chunking._CACHE_BLOCK if threads == 1
                                                    else threads * _chunking._CACHE_BLOCK_PER_THREAD)
    monkeypatch.setattr(_chunking, "_cgroup_cpu_quota", lambda: 3)  # docker --cpus=2.5 on an 8-core host
    monkeypatch.setattr(_chunking.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert _chunking._cpu_threads_per_device(1) == 3
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")  # XLA on one thread
    assert _chunking._cpu_threads_per_device(1) == 1
    monkeypatch.delenv("XLA_FLAGS")
    monkeypatch.setattr(_chunking, "_cgroup_cpu_quota", lambda: None)
    monkeypatch.delattr(_chunking.os, "sched_getaffinity", raising=False)  # not Linux: all cores
    monkeypatch.setattr(_chunking.os, "cpu_count", lambda: 4)
    assert _chunking._cpu_threads_per_device(2) == 2


def test_cgroup_cpu_quota(tmp_path, monkeypatch):
    from sciax.ensemble import _chunking

    path = tmp_path / "cpu.max"
    monkeypatch.setattr(_chunking, "_CGROUP_CPU_MAX", str(path))
    assert _chunking._cgroup_cpu_quota() is None  # no file: no cgroup v2 limit
    for text, cores in (("250000 100000\n", 3), ("100000 100000\n", 1), ("50000 100000\n", 1),
                        ("max 100000\n", None), ("garbage\n", None)):
        path.write_text(text)
        assert _chunking._cgroup_cpu_quota() == cores


def test_on_an_accelerator_the_memory_check_always_runs_and_chunks_are_one_vmap(monkeypatch):
    """What a GPU/TPU run does differently, exercised on CPU by naming the platform "gpu":
    no cache blocks, XLA's memory analysis checked even when the estimate is far below the
    budget (device memory is scarce and running out is fatal), same members."""
    from sciax.ensemble import _chunking, _sweep

    def plan():
        return _sweep._plan(Lorenz(), Y0, {"rho": RHO, "state0[0]": X0}, mode="grid", rollout=sciax.Simulate(**KW),
                            run=None, output=final, reduce=None, reduce_over=None, keep=None,
                            key=None, batch_size=None, memory_budget=None, devices=1, check_finite=True, order=None,
                            gather=True)

    assert plan().config.cache_block is not None
    on_cpu = lorenz_grid(devices=1)
    assert on_cpu.info["chunk_bytes"] is None  # estimate far below the default budget: no check
    monkeypatch.setattr(_chunking, "_platform", lambda mesh: "gpu")
    assert plan().config.cache_block is None
    as_gpu = lorenz_grid(devices=1)
    assert as_gpu.info["chunk_bytes"] is not None
    np.testing.assert_array_equal(as_gpu.outputs, on_cpu.outputs)
    np.testing.assert_array_equal(as_gpu.ok, on_cpu.ok)


# order='cost' only hands `_batch` its bucket size as a batch size, and `_batch` caps any batch size
# alike: the batch_size=64 case covers the cap in the default run; test_cost_buckets_are_small_on_cpu_and_
# fill_an_accelerator covers the bucket size an accelerator gets. The cost case (15 s) is slow.
@pytest.mark.parametrize("chunking", [dict(batch_size=64), pytest.param(dict(order="cost"), marks=pytest.mark.slow)])
def test_default_memory_budget_caps_a_batch_size_and_cost_buckets(monkeypatch, chunking):
    """A batch size (the user's, or the buckets order='cost' picks) used to switch the default
    budget off, and with it the memory check that an accelerator always runs."""
    from sciax.ensemble import _chunking

    monkeypatch.setattr(_chunking, "_platform", lambda mesh: "gpu")
    mu = jnp.linspace(1.0, 5.0, 64)
    if "order" in chunking:  # order='cost' estimates the cost of adaptive solves
        rollout = sciax.Solve(t0=0.0, t1=1.0, save_at=jnp.linspace(0.0, 1.0, 20), rtol=1e-5, atol=1e-5)
    else:  # any rollout: fixed steps compile in a sixth of a Diffrax solve's time
        rollout = sciax.Simulate(si.RK4(), dt=0.05, n_steps=20)
    free = sciax.sweep(VanDerPol(), jnp.array([2.0, 0.0]), axes={"mu": mu}, rollout=rollout, devices=1, **chunking)
    budget = 20 * free.info["member_bytes"]  # a nearly full device: 16 members fit
    monkeypatch.setattr(_chunking, "_default_budget", lambda mesh: budget)
    res = sciax.sweep(VanDerPol(), jnp.array([2.0, 0.0]), axes={"mu": mu}, rollout=rollout, devices=1, **chunking)
    assert res.info["memory_budget"] == budget and res.info["batch_size"] == 16
    assert 0 < res.info["chunk_bytes"] <= budget
    np.testing.assert_array_equal(res.outputs.states, free.outputs.states)


def test_memory_estimate_counts_a_streaming_reductions_copy_per_group():
    """`Streaming` evaluates its partial once per kept group over the whole chunk, so a member
    costs (groups) x its output more (a 30x underestimate before, measured with XLA)."""
    from sciax.ensemble._sweep import _plan

    second_moment = Streaming(partial=lambda v, w: (jnp.sum(w), jnp.sum(w[:, None] * v ** 2, axis=0)),
                              merge=lambda a, b: (a[0] + b[0], a[1] + b[1]))

    def member_bytes(reduce, reduce_over):
        axes = {"rho": jnp.linspace(5.0, 30.0, 16), "state0[0]": jnp.linspace(1.0, 2.0, 4)}
        return _plan(Lorenz(), Y0, axes, mode="grid", rollout=sciax.Simulate(**KW), run=None, output=final,
                     reduce=reduce, reduce_over=reduce_over, keep=False, key=None, batch_size=None,
                     memory_budget=None, devices=1, check_finite=True, order=None, gather=True).member_bytes

    plain = member_bytes("mean", "state0[0]")
    assert member_bytes({"m2": second_moment}, "state0[0]") == plain + 16 * 3 * 8  # 16 rho groups, 3 float64
    assert member_bytes({"m2": second_moment}, None) == plain + 3 * 8  # everything reduced: one group


def test_memory_budget_is_checked_against_the_compiled_chunk():
    """With the budget binding, XLA's memory analysis of the compiled chunk (per device) fits it."""
    whole = lorenz_grid(output=None)
    budget = 9 * whole.info["member_bytes"]  # 8 members per device fit by the estimate
    res = lorenz_grid(output=None, memory_budget=budget, devices=1)  # whole trajectories
    assert res.info["chunks"] == 2 and res.info["batch_size"] == 8
    assert 0 < res.info["chunk_bytes"] <= budget
    np.testing.assert_array_equal(res.outputs.states, whole.outputs.states)


def test_memory_budget_below_a_compiled_one_member_chunk_is_an_error():
    """The estimate per member fits, but XLA's analysis of a one-member chunk does not: refuse,
    never run over the budget."""
    member = lorenz_grid(output=None).info["member_bytes"]
    with pytest.raises(ValueError, match=r"memory_budget=\d+ bytes is too small: XLA's memory analysis of a "
                                         r"chunk of 1 member\(s\) per device needs \d+ bytes"):
        lorenz_grid(output=None, memory_budget=member, devices=1)


def sorted_sines(system, state0, key):
    """A member with a 1.6 MB temporary (200,000 float64 values sorted) and a scalar result."""
    return jnp.sort(jnp.sin(jnp.arange(200_000.0) * system.rho))[::1000].sum()


def test_a_given_memory_budget_counts_temporaries_the_estimate_cannot_see():
    """The member estimate sees results, outputs and carries, not a rollout's temporaries. On
    CPU a given budget far above the estimate skipped XLA's analysis, and a 1 MB budget ran
    a 102 MB chunk. A given budget is now always checked against the compiled chunk."""
    axes = {"rho": jnp.linspace(1.0, 2.0, 32)}  # 32 members: 3 chunks of 11 within 20 MB
    free = sciax.sweep(Lorenz(), Y0, axes=axes, run=sorted_sines, devices=1)
    assert free.info["member_bytes"] * 64 * 4 < 2_000_000  # the estimate alone would not check
    with pytest.raises(ValueError, match=r"memory_budget=1000000 bytes is too small: XLA's memory analysis"):
        sciax.sweep(Lorenz(), Y0, axes=axes, run=sorted_sines, devices=1, memory_budget=1_000_000)
    bounded = sciax.sweep(Lorenz(), Y0, axes=axes, run=sorted_sines, devices=1, memory_budget=20_000_000)
    assert bounded.info["chunks"] > 1 and 0 < bounded.info["chunk_bytes"] <= 20_000_000
    # A member's sum of 200 values is vectorised differently in smaller chunks: round-off only.
    np.testing.assert_allclose(bounded.outputs, free.outputs, rtol=1e-13)


def test_million_members_keep_only_reductions():
    values = jnp.linspace(-1.0, 1.0, 1_000_000)
    res = sciax.sweep(Lorenz(), Y0, axes={"state0[0]": values}, run=identity, output=lambda y: y[0],
                      reduce=["mean", "max", "count"], memory_budget=2**22)
    assert res.outputs is None and res.info["chunks"] > 1
    np.testing.assert_allclose(res.reductions["mean"], 0.0, atol=1e-12)
    assert res.reductions["max"] == 1.0 and res.reductions["count"] == 1_000_000


# ------------------------------------------------------------------------------ reductions
def test_reductions_equal_statistics_of_the_full_ensemble():
    full = lorenz_grid(output=z_frames)  # (5, 3, 4)
    z = full.outputs
    reduce = {"mean": "mean", "var": Variance(ddof=1), "std": Std(), "min": "min", "max": "max", "sum": "sum",
              "count": Count(), "median": "median", "q": Quantile([0.1, 0.9]),
              "sq": Streaming(partial=lambda v, w: jnp.sum(w[:, None] * v**2, axis=0), merge=jnp.add),
              "range": Apply(lambda v: v.max(axis=0) - v.min(axis=0))}
    for batch in (None, 8):  # one chunk, and two chunks merged with Chan's formula
        res = lorenz_grid(output=z_frames, reduce=reduce, batch_size=batch)
        r = res.reductions
        assert res.outputs is None and res.kept_dims == () and res.reduced_dims == ("rho", "state0[0]")
        flat = z.reshape(15, 4)
        for name, expected in [("mean", flat.mean(0)), ("var", flat.var(0, ddof=1)), ("std", flat.std(0)),
                               ("min", flat.min(0)), ("max", flat.max(0)), ("sum", flat.sum(0)),
                               ("median", np.median(flat, 0)), ("q", np.quantile(flat, [0.1, 0.9], axis=0)),
                               ("sq", (flat**2).sum(0)), ("range", np.ptp(flat, 0))]:
            np.testing.assert_allclose(r[name], expected, rtol=1e-12, atol=1e-12, err_msg=name)
        assert r["count"] == 15


def test_reductions_over_some_axes_keep_the_others():
    z = lorenz_grid(output=z_frames).outputs
    res = lorenz_grid(output=z_frames, reduce={"m": Mean(), "v": "var", "q": Quantile(0.5), "n": "count"},
                      reduce_over=("state0[0]",), batch_size=8)
    assert res.kept_dims == ("rho",) and res.reduced_dims == ("state0[0]",)
    np.testing.assert_allclose(res.reductions["m"], z.mean(1), rtol=1e-12)
    np.testing.assert_allclose(res.reductions["v"], z.var(1), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(res.reductions["q"], np.median(z, 1), rtol=1e-12)
    np.testing.assert_array_equal(res.reductions["n"], [3] * 5)
    np.testing.assert_allclose(res.sel(rho=30.0).reductions["m"], z[4].mean(0), rtol=1e-12)


def test_chunked_variance_is_numerically_sound_in_float32():
    """Values 1e4 + O(1) in float32: E[x²] − E[x]² would lose every digit; Chan's merge keeps them."""
    rng = np.random.default_rng(0)
    x = (1e4 + rng.standard_normal(4096)).astype(np.float32)
    res = sciax.sweep(Lorenz(sigma=jnp.float32(10), rho=jnp.float32(28), beta=jnp.float32(8 / 3)),
                      jnp.zeros(3, jnp.float32), axes={"state0[0]": x}, run=identity, output=lambda y: y[0],
                      reduce={"var": "var", "mean": "mean"}, batch_size=256)
    assert res.info["chunks"] == 16 and res.reductions["var"].dtype == np.float32
    exact = np.var(x.astype(np.float64))
    np.testing.assert_allclose(res.reductions["var"], exact, rtol=1e-3)
    np.testing.assert_allclose(res.reductions["mean"], np.mean(x.astype(np.float64)), rtol=1e-6)


LORENZ32 = Lorenz(sigma=jnp.float32(10), rho=jnp.float32(28), beta=jnp.float32(8 / 3))


def first_component(y):
    return y[0]


@pytest.mark.parametrize("case", ["offset 1e4", "two clusters at ±1e4", "outlier first"])
def test_float32_moments_stay_accurate_in_groups(case):
    """Float32 data, 5·10^4 members in each of two kept groups (a grouped, segment sum).
    Summed raw, 10^4 + N(0, 1) lost 0.06 in the mean and 4e-3 in the variance; summed about
    the first member, clusters at ±10^4 got the mean's sign wrong and an outlier first member
    (10^6, then N(0, 1)) a mean of 453 instead of 10. Reference: the same float32 values'
    statistics in float64 NumPy; the mean to a few float32 ulps or 1e-8 of mean |x|."""
    rng = np.random.default_rng(0)
    n = 50_000
    x = {"offset 1e4": 1e4 + rng.standard_normal(n),
         "two clusters at ±1e4": rng.choice([-1e4, 1e4], n) + rng.standard_normal(n),
         "outlier first": np.concatenate([[1e6], rng.standard_normal(n - 1)])}[case].astype(np.float32)
    res = sciax.sweep(LORENZ32, jnp.zeros(3, jnp.float32),
                      axes={"state0[0]": x, "state0[1]": np.array([0.0, 1.0], np.float32)}, run=identity,
                      output=first_component, reduce={"var": "var", "mean": "mean", "sum": "sum"},
                      reduce_over="state0[0]")
    exact = x.astype(np.float64)
    mean_tol = max(4 * np.spacing(np.float32(exact.mean())), 1e-8 * np.abs(exact).mean())
    for group in (0, 1):
        assert res.reductions["var"][group].dtype == np.float32
        np.testing.assert_allclose(res.reductions["var"][group], exact.var(), rtol=2e-6)
        np.testing.assert_allclose(res.reductions["mean"][group], exact.mean(), rtol=0, atol=mean_tol)
        np.testing.assert_allclose(res.reductions["sum"][group], exact.sum(), rtol=0, atol=4e-7 * np.abs(exact).sum())


def test_float32_moments_stay_accurate_over_many_chunks():
    """10^6 + N(0, 1) in float32 merged over ~100 chunks: running means drifted the variance by
    1.5e-3; merged onto one pivot it matches float64 NumPy on the same values."""
    x = (1e6 + np.random.default_rng(1).standard_normal(40_000)).astype(np.float32)
    res = sciax.sweep(LORENZ32, jnp.zeros(3, jnp.float32), axes={"state0[0]": x}, run=identity,
                      output=first_component, reduce={"var": "var", "mean": "mean"}, batch_size=384)
    assert res.info["chunks"] > 90  # 96 members per device (a multiple of 32) on 4 devices: 105 chunks
    np.testing.assert_allclose(res.reductions["var"], x.astype(np.float64).var(), rtol=2e-5)
    np.testing.assert_allclose(res.reductions["mean"], x.astype(np.float64).mean(), rtol=1e-7)


def test_merging_chunks_with_infinite_or_absent_members_gives_numpys_answer():
    """An infinite output of a member that did not fail makes the mean and sum inf (NumPy), in
    one chunk or two; a group absent from a chunk merges as nothing, also at 1e20 in float32."""
    rho = jnp.arange(0.0, 48.0)  # 1/rho: +inf for the first member, in the first chunk only
    for batch in (None, 32):
        res = sciax.sweep(Lorenz(), Y0, axes={"rho": rho}, run=lambda s, y, k: s.rho, output=lambda r: 1.0 / r,
                          reduce=["mean", "sum", "max"], batch_size=batch, devices=1)
        assert res.info["chunks"] == (1 if batch is None else 2)
        assert res.reductions == {"mean": np.inf, "sum": np.inf, "max": np.inf}
    scale = np.array([1e20, 1.0], np.float32)  # kept; the 1e20 group is absent from the second chunk
    spread = (1.0 + np.linspace(0.0, 1e-3, 32)).astype(np.float32)
    values = scale[:, None].astype(np.float64) * spread[None, :].astype(np.float64)
    for batch in (None, 32):
        res = sciax.sweep(LORENZ32, jnp.zeros(3, jnp.float32), axes={"state0[0]": scale, "state0[1]": spread},
                          run=lambda s, y, k: y[0] * y[1], reduce={"var": "var", "mean": "mean"},
                          reduce_over="state0[1]", batch_size=batch, devices=1)
        np.testing.assert_allclose(res.reductions["var"], values.var(1), rtol=1e-5)
        np.testing.assert_allclose(res.reductions["mean"], values.mean(1), rtol=1e-6)


def test_reductions_of_a_boolean_output_count_it_as_0_and_1():
    """A flag per member ("did it escape?"): mean and sum came back None and, with keep off by
    default under reduce=, the outputs were dropped too. Now as NumPy: the mean is the fraction,
    the sum the number of members that set it; checked in one chunk and in two."""
    rho = jnp.linspace(0.0, 30.0, 40)
    kw = dict(integrator=si.RK4(), dt=0.01, n_steps=10)
    for batch in (None, 32):
        res = sciax.sweep(Lorenz(), Y0, axes={"rho": rho}, rollout=sciax.Simulate(**kw),
                          output=lambda t: t.final_state[1] > 0.3,
                          reduce=["mean", "sum", "var", "min", "max", "median"], keep=True, batch_size=batch, devices=1)
        flags = np.asarray(res.outputs)
        assert flags.dtype == np.bool_ and 0 < flags.sum() < 40 and res.info["chunks"] == (1 if batch is None else 2)
        assert res.reductions["sum"] == flags.sum() and np.issubdtype(res.reductions["sum"].dtype, np.integer)
        np.testing.assert_allclose(res.reductions["mean"], flags.mean(), rtol=1e-15)
        np.testing.assert_allclose(res.reductions["var"], flags.var(), rtol=1e-14)
        assert res.reductions["median"] == np.median(flags)
        for name in ("min", "max"):  # a flag's extremum is a flag ("all set", "any set"), as NumPy's
            expected = getattr(np, name)(flags)
            assert res.reductions[name].dtype == np.bool_ and res.reductions[name] == expected, name


def test_extremum_of_a_boolean_output_per_group_and_for_an_empty_group():
    """min/max of a flag kept per group come back as flags; a group whose members all failed gets
    the identities (min: True = "all of none", max: False = "any of none"), with count 0."""
    sigma = jnp.array([10.0, 1e4])  # RK4 at dt=0.01 is unstable for sigma = 1e4: that group is empty
    rho = jnp.linspace(0.0, 30.0, 40)
    res = sciax.sweep(Lorenz(), Y0, axes={"rho": rho, "sigma": sigma}, rollout=sciax.Simulate(**KW),
                      output=lambda t: (t.final_state[1] > 0.3, t.final_state[1]), reduce=["min", "max", "count"],
                      reduce_over="rho", keep=True, devices=1)
    flags = np.asarray(res.outputs[0])[:, 0]
    assert 0 < flags.sum() < 40 and list(res.reductions["count"][0]) == [40, 0]
    for name, empty in (("min", True), ("max", False)):
        got = res.reductions[name][0]
        assert got.dtype == np.bool_ and list(got) == [getattr(np, name)(flags), empty], name


# ------------------------------------------------------------------------------ failures
def test_failing_members_reported_with_coordinates_others_complete():
    sigma = jnp.array([10.0, 1e4])  # RK4 at dt=0.01 is unstable for sigma = 1e4
    res = sciax.sweep(Lorenz(), Y0, axes={"rho": RHO, "sigma": sigma}, rollout=sciax.Simulate(**KW), output=final,
                      reduce={"mean": "mean", "n": "count"}, keep=True, batch_size=8)
    assert [f["index"] for f in res.failures] == [1, 3, 5, 7, 9]
    assert res.failures[0] == {"index": 1, "rho": 5.0, "sigma": 10000.0}
    assert not res.ok[:, 1].any() and res.ok[:, 0].all()
    assert np.isfinite(res.outputs[:, 0]).all()
    for i, rho in enumerate(RHO):
        np.testing.assert_allclose(res.outputs[i, 0], reference(rho, 1.0), rtol=1e-12)
    assert res.reductions["n"] == 5  # failed members are left out of the reductions
    np.testing.assert_allclose(res.reductions["mean"], res.outputs[:, 0].mean(0), rtol=1e-12)
    assert "failed members: 5" in repr(res)


def test_failures_and_outputs_land_on_their_members_when_run_out_of_order():
    """With a member order, chunk k runs members order[k*batch : (k+1)*batch]; which member
    each returned `ok` flag and output belongs to is worked out on the host from that order
    (only `ok` and the outputs come back from the device)."""
    sigma = jnp.array([10.0, 1e4])
    order = np.random.default_rng(3).permutation(40)
    base = dict(axes={"rho": jnp.linspace(5.0, 30.0, 20), "sigma": sigma}, rollout=sciax.Simulate(**KW), output=final,
                keep=True, devices=1)
    in_order = sciax.sweep(Lorenz(), Y0, **base)
    shuffled = sciax.sweep(Lorenz(), Y0, batch_size=32, order=order, **base)
    assert shuffled.info["chunks"] == 2 and shuffled.info["padding"] == 24
    assert [f["index"] for f in shuffled.failures] == list(range(1, 40, 2))
    np.testing.assert_array_equal(shuffled.ok, in_order.ok)
    np.testing.assert_array_equal(shuffled.outputs, in_order.outputs)


def test_failed_members_leave_every_reduction_finite():
    """A failed member's NaN output must not reach a reduction, also not a user's Streaming
    one through 0 · NaN (its weight is 0)."""
    sigma = jnp.array([10.0, 1e4, 12.0])  # the middle one blows up
    second_moment = Streaming(partial=lambda v, w: (jnp.sum(w), jnp.sum(w[:, None] * v**2, axis=0)),
                              merge=lambda a, b: (a[0] + b[0], a[1] + b[1]), finalize=lambda s: s[1] / s[0])
    res = sciax.sweep(Lorenz(), Y0, axes={"sigma": sigma, "rho": RHO[:2]}, rollout=sciax.Simulate(**KW), output=final,
                      reduce={"m2": second_moment, "q": Quantile(0.5), "var": "var"}, reduce_over="sigma",
                      keep=True)
    good = res.outputs[[0, 2]]  # (2 sigmas, 2 rhos, 3)
    assert not res.ok[1].any() and res.ok[[0, 2]].all()
    np.testing.assert_allclose(res.reductions["m2"], (good**2).mean(0), rtol=1e-12)
    np.testing.assert_allclose(res.reductions["q"], np.median(good, axis=0), rtol=1e-12)
    np.testing.assert_allclose(res.reductions["var"], good.var(0), rtol=1e-12)


def test_nan_output_of_a_member_that_did_not_fail_propagates_like_numpy():
    """check_finite looks at the trajectory, not at `output`: a NaN the output function makes
    for a finite member is data, and every reduction propagates it (as NumPy would)."""
    res = sciax.sweep(Lorenz(), Y0, axes={"rho": jnp.array([1.0, 2.0, 3.0])}, run=lambda s, y, k: s.rho * y[0],
                      output=lambda r: jnp.where(r > 2.5, jnp.nan, r),  # NaN for rho = 3 only
                      reduce={"mean": "mean", "q": Quantile(0.5), "max": "max", "min": "min"})
    assert res.failures == [] and res.info["devices"] == 4  # the Min/Max all-reduce across devices

    for name in ("mean", "q", "max", "min"):
        assert np.isnan(res.reductions[name]), name


def test_variance_of_complex_outputs_is_real_like_numpy():
    phases = jnp.arange(4.0)
    res = sciax.sweep(Lorenz(), Y0, axes={"rho": phases}, run=lambda s, y, k: jnp.exp(1j * s.rho),
                      reduce={"var": "var", "std": "std", "mean": "mean"}, batch_size=8)
    z = np.exp(1j * np.arange(4.0))
    np.testing.assert_allclose(res.reductions["var"], np.var(z), rtol=1e-12)
    assert not np.iscomplexobj(res.reductions["var"])
    np.testing.assert_allclose(res.reductions["std"], np.std(z), rtol=1e-12)
    np.testing.assert_allclose(res.reductions["mean"], np.mean(z), rtol=1e-12)


def flag(system, state0, key):
    return jnp.int8(1)


def test_grouped_integer_sums_widen_like_jnp_sum_instead_of_wrapping():
    """A kept axis sums each group with a segment sum, which added int8 in int8: 200 members of
    1 gave -56. Now every sum and mean adds in jnp.sum's (widened) integer type."""
    axes = {"state0[0]": jnp.arange(200.0), "state0[1]": jnp.array([0.0, 1.0])}
    whole = sciax.sweep(Lorenz(), Y0, axes=axes, run=flag, reduce=["sum", "mean"])
    grouped = sciax.sweep(Lorenz(), Y0, axes=axes, run=flag, reduce=["sum", "mean"], reduce_over="state0[0]")
    assert whole.reductions["sum"] == 400 and whole.reductions["sum"].dtype == jnp.sum(jnp.int8(1)).dtype
    np.testing.assert_array_equal(grouped.reductions["sum"], [200, 200])
    assert grouped.reductions["sum"].dtype == whole.reductions["sum"].dtype
    np.testing.assert_array_equal(grouped.reductions["mean"], [1.0, 1.0])


def test_median_and_quantiles_keep_float32_like_numpy():
    values = np.linspace(-1.0, 1.0, 64, dtype=np.float32) ** 3
    res = sciax.sweep(Lorenz(), Y0.astype(jnp.float32), axes={"state0[0]": values}, run=identity,
                      output=lambda y: y[0], reduce={"median": "median", "q": Quantile([0.1, 0.5])})
    assert res.reductions["median"].dtype == np.float32 and res.reductions["q"].dtype == np.float32
    assert res.reductions["median"] == np.median(values)
    np.testing.assert_array_equal(res.reductions["q"], np.quantile(values, [0.1, 0.5]).astype(np.float32))


def test_quantiles_of_narrow_float_integer_and_boolean_outputs():
    """bfloat16 outputs got None (NumPy does not count ml_dtypes' bfloat16 as a number) and
    float16 ones a float32 median; now each keeps its float type, as Mean does, and integers and
    booleans (0 and 1) give the default float, as their means do. Values against NumPy in float64."""
    values = np.linspace(-1.0, 1.0, 41) ** 3
    out = lambda y: {"bf16": y[0].astype(jnp.bfloat16), "f16": y[0].astype(jnp.float16),  # noqa: E731
                     "i32": (100 * y[0]).astype(jnp.int32), "flag": y[0] > 0.2, "c64": y[0].astype(jnp.complex64)}
    res = sciax.sweep(Lorenz(), Y0, axes={"state0[0]": values}, run=identity, output=out, keep=True,
                      reduce={"median": "median", "q": Quantile([0.25, 0.9]), "mean": "mean"})
    assert res.reductions["median"]["c64"] is None
    for name in ("bf16", "f16", "i32", "flag"):
        kept = np.asarray(res.outputs[name])
        for r in ("median", "q"):
            got = res.reductions[r][name]
            assert got.dtype == res.reductions["mean"][name].dtype, (name, r)
            assert got.dtype == (kept.dtype if name in ("bf16", "f16") else jnp.result_type(float)), (name, r)
        expected = np.quantile(kept.astype(np.float64), [0.25, 0.9])
        np.testing.assert_array_equal(res.reductions["q"][name], expected.astype(res.reductions["q"][name].dtype))
        assert res.reductions["median"][name] == np.median(kept.astype(np.float64)).astype(got.dtype)


def test_sel_matches_relatively_and_isel_keeps_the_failures_of_the_selected_members():
    tiny = jnp.array([1e-14, 1e-13, 1e-12])
    res = sciax.sweep(Lorenz(), Y0, axes={"rho": tiny}, run=lambda s, y, k: s.rho * jnp.ones(1))
    for i, value in enumerate([1e-14, 1e-13, 1e-12]):
        assert res.sel(rho=value).outputs[0] == tiny[i]
    with pytest.raises(ValueError, match="no member with rho"):
        res.sel(rho=0.0)
    # ... relative to the coordinates too: np.arange puts -2.2e-16 where 0 is meant
    grid = np.arange(-1, 1.01, 0.1)
    arange = sciax.sweep(Lorenz(), Y0, axes={"rho": grid}, run=lambda s, y, k: s.rho * jnp.ones(()))
    assert arange.sel(rho=0.0).outputs == grid[10] and arange.sel(rho=0.3).outputs == grid[13]
    # Failures are selected by position, not by coordinate value (duplicates, NaN coordinates).
    grid = sciax.sweep(Lorenz(), Y0, axes={"state0[0]": jnp.array([1.0, jnp.nan]), "rho": jnp.array([5.0, 5.0])},
                       run=identity)
    # A selection's failures are numbered within it (its `coords` and `ok.ravel()` take that
    # index; it was the whole sweep's), with the whole sweep's index as "sweep_index".
    assert [f["index"] for f in grid.failures] == [2, 3] and "sweep_index" not in grid.failures[0]
    sub = grid.isel(rho=0)
    [failure] = sub.failures
    assert (failure["index"], failure["sweep_index"], failure["rho"]) == (1, 2, 5.0)
    assert np.isnan(failure["state0[0]"]) and np.isnan(sub.coords(1)["state0[0]"])
    assert not sub.ok.ravel()[1] and sub.ok.ravel()[0]
    assert grid.isel(**{"state0[0]": 0}).failures == []
    one = grid.isel(rho=1).isel(**{"state0[0]": -1})
    assert [(f["index"], f["sweep_index"]) for f in one.failures] == [(0, 3)]
    zipped = sciax.sweep(Lorenz(), Y0, axes={"state0[0]": jnp.array([1.0, jnp.nan]), "rho": jnp.array([1.0, 2.0])},
                         mode="zip", run=identity)
    assert [(f["index"], f["sweep_index"], f["rho"]) for f in zipped.isel(member=-1).failures] == [(0, 1, 2.0)]
    assert zipped.isel(member=0).failures == []

    # The tolerance is relative to each coordinate, not to the axis's largest one: on a logspace
    # axis 2e-4 is not 1e-4, and seed 6 is not seed 5 (both were silently "matched").
    log = sciax.sweep(Lorenz(), Y0, axes={"rho": np.logspace(-6, 3, 10)}, run=lambda s, y, k: s.rho * jnp.ones(()))
    for missing in [2e-4, 0.0, -5e-4, 1.0005]:
        with pytest.raises(ValueError, match="no member with rho"):
            log.sel(rho=missing)
    assert log.sel(rho=1e-4).outputs == 1e-4 and log.sel(rho=1000.0).outputs == 1000.0
    seeds = sciax.sweep(OrnsteinUhlenbeck(), jnp.zeros(1), axes={"seed": np.array([0, 5, 2**32 - 1])},
                        run=lambda s, y, k: y)
    with pytest.raises(ValueError, match="no member with seed = 6"):
        seeds.sel(seed=6)
    big = sciax.sweep(OrnsteinUhlenbeck(), jnp.zeros(1), axes={"seed": np.array([1_000_000, 2_000_000])},
                      run=lambda s, y, k: y)
    with pytest.raises(ValueError, match="no member with seed = 1000001"):  # integer axes match exactly
        big.sel(seed=1_000_001)
    f32 = sciax.sweep(Lorenz(rho=jnp.float32(1.0)), Y0.astype(jnp.float32),
                      axes={"rho": np.logspace(-10, -2, 9, dtype=np.float32)}, run=lambda s, y, k: s.rho)
    assert f32.sel(rho=1e-9).outputs == np.float32(1e-9)
    for missing in [2e-10, 3e-9]:
        with pytest.raises(ValueError, match="no member with rho"):
            f32.sel(rho=missing)
    from sciax.ensemble._result import _match

    assert _match("w", np.array([1 + 1j, 1 + 2j]), 1 + 2j, None, np.arange(2)).tolist() == [1]  # complex
    assert seeds.sel(seed=2**32 - 1).coords(0) == {"seed": 2**32 - 1}


def test_sel_matches_an_infinite_coordinate_only_to_itself():
    """The relative tolerance 1e-6 max(|c|, |v|) is infinite at an infinite coordinate: every
    value matched it, and `sel(rho=inf)` returned rho = 1."""
    res = sciax.sweep(Lorenz(), Y0, axes={"rho": np.array([1.0, 2.0, np.inf])}, run=identity, output=lambda y: y[0])
    assert res.sel(rho=np.inf).axes["rho"] == np.inf and res.sel(rho=np.inf).outputs == 1.0
    assert res.sel(rho=2.0).axes["rho"] == 2.0
    for value in (5.0, -3.0, -np.inf):
        with pytest.raises(ValueError, match=f"no member with rho = {value}"):
            res.sel(rho=value)


def test_sel_nearest_skips_nan_coordinates_and_a_selected_zip_member_keeps_its_coordinates():
    res = sciax.sweep(Lorenz(), Y0, axes={"state0[0]": jnp.array([1.0, jnp.nan, 3.0])}, run=identity)
    np.testing.assert_array_equal(res.sel(method="nearest", **{"state0[0]": 2.9}).outputs, [3.0, 0.0, 0.0])
    zipped = sciax.sweep(Lorenz(), Y0, axes={"rho": jnp.array([1.0, 2.0]), "state0[0]": jnp.array([3.0, 4.0])},
                         mode="zip", run=identity)
    one = zipped.isel(member=1)
    assert one.coords(0) == {"rho": 2.0, "state0[0]": 4.0}
    with pytest.raises(ValueError, match="the member was already selected"):
        one.sel(rho=2.0)
    # A fully selected grid still reports its coordinates.
    assert lorenz_grid().isel(rho=1).coords(2) == {"rho": 11.25, "state0[0]": 3.0}


# The default run keeps the cost-ordered variant, which covers failure reporting too.
@pytest.mark.parametrize("order", [pytest.param(None, marks=pytest.mark.slow), "cost"])
def test_adaptive_solve_failures_and_cost_order(order):
    """A member that hits max_steps is reported; ordering members by cost changes nothing else."""
    mus = jnp.array([1.0, 300.0, 3.0, 30.0, 100.0, 10.0])
    kw = dict(t0=0.0, t1=20.0, solver="tsit5", rtol=1e-5, atol=1e-7, max_steps=2000)
    res = sciax.sweep(VanDerPol(), jnp.array([2.0, 0.0]), axes={"mu": mus}, rollout=sciax.Solve(**kw),
                      output=lambda traj: (traj.final_state, traj.stats["num_steps"]), order=order)
    assert [f["mu"] for f in res.failures] == [300.0]
    steps = res.outputs[1]
    assert steps[0] < steps[3] < steps[4] and steps[1] == 2000
    direct = sciax.solve(VanDerPol(mu=10.0), jnp.array([2.0, 0.0]), **kw)
    np.testing.assert_allclose(res.sel(mu=10.0).outputs[0], direct.final_state, rtol=1e-10)
    if order == "cost":  # buckets of COST_BUCKET members per device
        assert res.info["batch_size"] <= 32 * res.info["devices"]


def test_cost_order_cuts_the_lane_steps_of_an_adaptive_ensemble():
    """What order='cost' is for: a vmapped adaptive bucket steps until its slowest member is
    done, so a bucket costs (members) x (its largest step count). Van der Pol over shuffled
    mu in [1, 60]: buckets of 32 in the pilot's order need far fewer lane-steps than in index
    order, counted from each member's true step count (no timing). A pilot that ranked
    nothing (a constant estimate) would leave the index order."""
    from sciax.ensemble._ordering import COST_BUCKET, _cost_order

    mus = np.random.default_rng(0).permutation(np.geomspace(1.0, 60.0, 128))
    kw = dict(t0=0.0, t1=20.0, solver="tsit5", rtol=1e-5, atol=1e-7, max_steps=4000)
    axes = {"mu": jnp.asarray(mus)}
    steps = np.asarray(sciax.sweep(VanDerPol(), jnp.array([2.0, 0.0]), axes=axes, rollout=sciax.Solve(**kw),
                                   output=lambda traj: traj.stats["num_steps"], devices=1).outputs)
    ranked, batch = _cost_order("cost", VanDerPol(), jnp.array([2.0, 0.0]), axes, "grid", sciax.Solve(**kw), None,
        None, None, 1)
    assert batch == COST_BUCKET and sorted(ranked) == list(range(128))

    def lane_steps(order):
        return sum(len(b) * steps[b].max() for b in np.split(np.asarray(order), range(batch, 128, batch)))

    assert lane_steps(ranked) < 0.6 * lane_steps(np.arange(128))
    assert lane_steps(ranked) < 1.2 * lane_steps(np.argsort(-steps))  # near the true-cost order


def test_cost_buckets_are_small_on_cpu_and_fill_an_accelerator():
    """Buckets run in sequence: 32 members per CPU device, but on a GPU/TPU an eighth of the
    device's members (at least 16,384), so that one bucket can fill it."""
    from sciax.ensemble._ordering import _cost_bucket

    assert _cost_bucket(10**6, "cpu") == 32 and _cost_bucket(10, "cpu") == 32
    assert _cost_bucket(10**6, "gpu") == 125_000 and _cost_bucket(8 * 10**6 + 1, "tpu") == 10**6 + 1
    assert _cost_bucket(1000, "gpu") == 16_384


# ------------------------------------------------------------------------------ bad input
class TestBadInput:
    def test_called_inside_a_jax_transformation(self):
        """Under jax.jit it said "axis 'rho': values must be an array, got array of shape (5,)"."""
        system = Lorenz()
        with pytest.raises(TypeError, match=r"^sweep: `axes` is being traced by a JAX transformation .* sweep runs "
                                            r"on the host: .* outside the transformation"):
            jax.jit(lambda rho: sciax.sweep(system, Y0, axes={"rho": rho}, rollout=sciax.Simulate(**KW)).outputs)(RHO)
        with pytest.raises(TypeError, match=r"^Simulate: `dt` is being traced by a JAX transformation"):
            jax.jit(lambda dt: sciax.sweep(system, Y0, axes={"rho": RHO},
                                           rollout=sciax.Simulate(**{**KW, "dt": dt})).outputs)(0.01)

    def test_zip_axes_of_different_lengths(self):
        with pytest.raises(ValueError, match=r"zip mode every axis must have the same length; got lengths "
                                             r"\{'rho': 5, 'sigma': 2\}"):
            sciax.sweep(Lorenz(), Y0, axes={"rho": RHO, "sigma": jnp.array([1.0, 2.0])}, mode="zip",
                        rollout=sciax.Simulate(**KW))

    def test_axis_naming_a_missing_field_lists_valid_names(self):
        with pytest.raises(ValueError, match=r"axis 'r' does not name a field of Lorenz \(no such field\); "
                                             r"valid names: 'sigma', 'rho', 'beta', 'state0', 'state0\[i\]', 'seed'"):
            sciax.sweep(Lorenz(), Y0, axes={"r": RHO}, rollout=sciax.Simulate(**KW))

    def test_a_where_naming_a_missing_field_names_the_axis(self):
        """It raised a bare AttributeError from inside the user's lambda."""
        with pytest.raises(ValueError, match=r"axis 'k': its `where` failed on the system and initial state "
                                             r"\('Lorenz' object has no attribute 'kappa'\); valid names: 'sigma'"):
            sciax.sweep(Lorenz(), Y0, axes={"k": Axis(RHO, where=lambda s, y: s.kappa)}, rollout=sciax.Simulate(**KW))

    def test_a_field_name_on_a_system_without_fields(self):
        """A string system raised "must be called with a dataclass type or instance"; a plain
        pytree system still sweeps with `run=` over state0 and `where` axes."""
        with pytest.raises(ValueError, match=r"axis 'rho' does not name a field of str \(no such field\); "
                                             r"valid names: 'state0', 'state0\[i\]', 'seed'"):
            sciax.sweep("lorenz", Y0, axes={"rho": RHO}, rollout=sciax.Simulate(**KW))
        plain = {"a": jnp.asarray(2.0)}
        for axes in ({"state0[0]": jnp.arange(3.0)}, {"a": Axis(jnp.arange(3.0), where=lambda s, y: s["a"])}):
            res = sciax.sweep(plain, jnp.ones(2), axes=axes, run=lambda s, y, k: s["a"] * y)
            assert res.outputs.shape == (3, 2)

    def test_bad_batch_size_with_cost_order_is_refused_before_the_pilot(self, monkeypatch):
        """The pilot solved every member first, then the bad batch_size was refused."""
        from sciax.ensemble import _ordering

        monkeypatch.setattr(_ordering, "_cost_order", lambda *a, **k: pytest.fail("the pilot ran"))
        with pytest.raises(ValueError, match="`batch_size` must be a positive number of members per chunk, got 0"):
            sciax.sweep(VanDerPol(), jnp.array([2.0, 0.0]), axes={"mu": jnp.array([1.0, 2.0])},
                        rollout=sciax.Solve(t0=0.0, t1=1.0), order="cost", batch_size=0)

    @pytest.mark.parametrize("batch_size", [0, -3])
    def test_batch_size_not_positive(self, batch_size):
        with pytest.raises(ValueError, match=f"`batch_size` must be a positive number of members per chunk, "
                                             f"got {batch_size}"):
            lorenz_grid(batch_size=batch_size)

    def test_memory_budget_smaller_than_one_member(self):
        with pytest.raises(ValueError, match=r"memory_budget=100 bytes is smaller than one member, which "
                                             r"needs about \d+ bytes"):
            lorenz_grid(memory_budget=100)

    @pytest.mark.parametrize("budget", [0, -1.0, True, float("inf"), float("nan")])
    def test_memory_budget_not_positive(self, budget):
        with pytest.raises(ValueError, match="`memory_budget` must be a positive, finite number of bytes"):
            lorenz_grid(memory_budget=budget)

    def test_values_of_the_wrong_shape(self):
        with pytest.raises(ValueError, match=r"axis 'rho': each value must have the shape of its target \(\), "
                                             r"so the values must have shape \(n, \*\(\)\); got \(2, 2\)"):
            sciax.sweep(Lorenz(), Y0, axes={"rho": jnp.ones((2, 2))}, rollout=sciax.Simulate(**KW))

    def test_state_index_out_of_range(self):
        with pytest.raises(ValueError, match=r"index \[3\] is out of range for an array of shape \(3,\)"):
            sciax.sweep(Lorenz(), Y0, axes={"state0[3]": RHO}, rollout=sciax.Simulate(**KW))

    def test_unreadable_axis_name(self):
        with pytest.raises(ValueError, match=r"cannot read axis name 'rho\]'"):
            sciax.sweep(Lorenz(), Y0, axes={"rho]": RHO}, rollout=sciax.Simulate(**KW))

    @pytest.mark.parametrize("seeds", [[0, 2**32], [-1, 3]])
    def test_seeds_outside_32_bits(self, seeds):
        # fold_in takes 32 bits: 2**32 would share the noise of seed 0.
        with pytest.raises(ValueError, match=r"axis 'seed' values must be in \[0, 2\*\*32 - 1\]"):
            sciax.sweep(Lorenz(), Y0, axes={"seed": np.array(seeds)}, run=identity)

    def test_non_integer_values_for_an_integer_field(self):
        with pytest.raises(ValueError, match=r"axis 'rho': its target holds int\d+ values, and 24.5 cannot be "
                                             r"represented .* \(e.g. rho=28.0, not 28\)"):
            sciax.sweep(Lorenz(rho=28), Y0, axes={"rho": np.array([24.0, 24.5])}, run=identity)
        # integral values are exact: allowed
        res = sciax.sweep(Lorenz(rho=28), Y0, axes={"rho": np.array([24.0, 25.0])},
                          run=lambda s, y, k: s.rho * jnp.ones(()))
        np.testing.assert_array_equal(res.outputs, [24, 25])

    def test_a_value_that_overflows_the_target_s_precision(self):
        """1e40 in float32 ran as inf, reported under its original value."""
        lorenz32, y32 = sciax.astype(Lorenz(), jnp.float32), Y0.astype(jnp.float32)
        with pytest.raises(ValueError, match=r"axis 'rho': 1e\+?40 overflows float32, the precision of its target "
                                             r"\(largest finite value 3.40282e\+38\), and would run as inf"):
            sciax.sweep(lorenz32, y32, axes={"rho": np.array([28.0, 1e40])}, run=identity)
        res = sciax.sweep(lorenz32, y32, axes={"rho": np.array([28.0, np.inf])}, run=lambda s, y, k: s.rho * y)
        assert res.outputs[1, 0] == np.inf  # an infinite value asked for is kept

    def test_keep_false_without_reductions_or_checks_is_refused(self):
        """With check_finite=False it ran every member and returned nothing; with the check it
        reports which members failed without copying their outputs to the host."""
        with pytest.raises(ValueError, match=r"keep=False without `reduce` and with check_finite=False would run "
                                             r"every member and return nothing"):
            sciax.sweep(Lorenz(), Y0, axes={"rho": RHO}, rollout=sciax.Simulate(**KW), keep=False, check_finite=False)
        res = sciax.sweep(Lorenz(), Y0, axes={"state0[0]": jnp.array([1.0, jnp.nan])}, rollout=sciax.Simulate(**KW),
                          keep=False)
        assert res.outputs is None and list(res.ok) == [True, False] and [f["index"] for f in res.failures] == [1]

    def test_output_leaves_that_are_not_arrays(self):
        """Python and NumPy numbers in a member's output crashed the sweep with "'int' object has
        no attribute 'shape'"; they become arrays, as under jax.vmap. A string or a PRNG key is
        refused by its path."""
        out = lambda t: {"x": t.final_state[0], "tag": 1, "w": np.float32(2.5), "on": True}  # noqa: E731
        res = sciax.sweep(Lorenz(), Y0, axes={"rho": RHO}, rollout=sciax.Simulate(**KW), output=out, keep=True,
                          reduce="mean")
        assert res.outputs["tag"].dtype == jnp.asarray(1).dtype and (res.outputs["tag"] == 1).all()
        assert res.outputs["w"].dtype == np.float32 and res.outputs["on"].all() and res.reductions["mean"]["tag"] == 1
        with pytest.raises(TypeError, match=r"`output` returned str 'a' at \['name'\]; a member's output must "
                                            r"hold arrays or numbers only"):
            sciax.sweep(Lorenz(), Y0, axes={"rho": RHO}, rollout=sciax.Simulate(**KW), output=lambda t: {"name": "a"})
        with pytest.raises(TypeError, match=r"`output` returned array of shape \(1,\) and dtype <U1 at the top level"):
            sciax.sweep(Lorenz(), Y0, axes={"rho": RHO}, rollout=sciax.Simulate(**KW), output=lambda t: np.array(["a"]))
        with pytest.raises(TypeError, match=r"`run` returned a PRNG key array at \[0\]; return "
                                            r"jax.random.key_data\(key\)"):
            sciax.sweep(Lorenz(), Y0, axes={"seed": np.arange(2)}, run=lambda s, y, k: (k, y))
        # a key the output leaves out is fine
        res = sciax.sweep(Lorenz(), Y0, axes={"seed": np.arange(2)}, run=lambda s, y, k: (k, y), output=lambda r: r[1])
        np.testing.assert_array_equal(res.outputs, np.broadcast_to(Y0, (2, 3)))

    def test_seed_must_be_integers(self):
        with pytest.raises(ValueError, match="axis 'seed' must be a 1-D array of integers"):
            sciax.sweep(Lorenz(), Y0, axes={"seed": jnp.array([0.5])}, rollout=sciax.Simulate(**KW))

    def test_exactly_one_rollout(self):
        with pytest.raises(ValueError, match=r"pass exactly one of `rollout=sciax.Simulate.* got both"):
            sciax.sweep(Lorenz(), Y0, axes={"rho": RHO}, rollout=sciax.Simulate(**KW), run=identity)
        with pytest.raises(ValueError, match="got neither"):
            sciax.sweep(Lorenz(), Y0, axes={"rho": RHO})

    def test_a_rollout_that_is_not_one(self):
        with pytest.raises(TypeError, match=r"`rollout` must be sciax.Simulate\(...\) or sciax.Solve\(...\), got dict"):
            sciax.sweep(Lorenz(), Y0, axes={"rho": RHO}, rollout=dict(KW))
        with pytest.raises(TypeError, match=r"unexpected keyword argument 'n_step'"):  # no **kwargs: a typo is an error
            sciax.Simulate(**dict(KW, n_step=3))

    def test_a_rollout_without_its_run_length(self):
        with pytest.raises(ValueError, match=r"^sweep: Simulate needs the run length: pass n_steps="):
            sciax.sweep(Lorenz(), Y0, axes={"rho": RHO}, rollout=sciax.Simulate(si.RK4(), dt=0.01))
        with pytest.raises(ValueError, match=r"^sweep: Solve needs the time span: pass t0=\.\.\. and t1="):
            sciax.sweep(Lorenz(), Y0, axes={"rho": RHO}, rollout=sciax.Solve())

    def test_stochastic_without_key_or_seed(self):
        with pytest.raises(ValueError, match="EulerMaruyama is stochastic: pass `key="):
            sciax.sweep(OrnsteinUhlenbeck(), jnp.array([1.0]), axes={"theta": jnp.array([1.0])},
                        rollout=sciax.Simulate(si.EulerMaruyama(), dt=0.1, n_steps=2))

    def test_unknown_reduction_and_reduce_over(self):
        with pytest.raises(ValueError, match=r"unknown reduction 'average'; valid names: \['count'"):
            lorenz_grid(reduce="average")
        with pytest.raises(ValueError, match=r"`reduce_over` names 'seed', which is not an axis; axes: \['rho'"):
            lorenz_grid(reduce="mean", reduce_over="seed")
        with pytest.raises(ValueError, match="`reduce_over` was given without `reduce`"):
            lorenz_grid(reduce_over="rho")
        with pytest.raises(ValueError, match=r"Quantile: `q` must be in \[0, 1\]"):
            Quantile(1.5)

    def test_bad_mode_order_and_devices(self):
        with pytest.raises(ValueError, match="`mode` must be 'grid' or 'zip', got 'product'"):
            lorenz_grid(mode="product")
        with pytest.raises(ValueError, match="`order` must be a permutation of the 15 flat member indices"):
            lorenz_grid(order=np.zeros(15, int))
        with pytest.raises(ValueError, match="order='cost' estimates the cost of adaptive solves"):
            lorenz_grid(order="cost")
        with pytest.raises(ValueError, match=r"`devices=99` but this process has \d+ local device"):
            lorenz_grid(devices=99)

    @pytest.mark.parametrize("axes", [
        {"state0[0]": X0, "state0[-3]": X0},  # one component, two spellings
        {"state0[1]": X0, "state0": jnp.ones((3, 3))},  # a component and the whole state
        {"rho": RHO, "k": Axis(RHO, where=lambda s, y: s.rho)},  # a name and a `where`
    ])
    def test_two_axes_setting_the_same_value(self, axes):
        with pytest.raises(ValueError, match="set the same value; one would silently overwrite the other"):
            sciax.sweep(Lorenz(), Y0, axes=axes, rollout=sciax.Simulate(**KW))

    def test_complex_values_for_a_real_field(self):
        with pytest.raises(ValueError, match=r"axis 'rho': its target holds real float64 values, got complex"):
            sciax.sweep(Lorenz(), Y0, axes={"rho": np.array([1 + 2j])}, rollout=sciax.Simulate(**KW))

    def test_more_members_than_int32_positions_can_index(self):
        big = np.zeros(50_000)
        with pytest.raises(ValueError, match=r"2500000000 members \(axis lengths \{'rho': 50000, 'sigma': 50000\}\) "
                                             r"exceed the 1073741824 one sweep can index"):
            sciax.sweep(Lorenz(), Y0, axes={"rho": big, "sigma": big}, run=identity, reduce="mean")

    def test_a_device_listed_twice(self):
        import jax

        with pytest.raises(ValueError, match="`devices` lists a device more than once"):
            lorenz_grid(devices=[jax.devices()[0]] * 2)

    def test_reduction_objects_in_a_list(self):
        with pytest.raises(TypeError, match=r"a list in `reduce` holds reduction names such as 'mean', got "
                                            r"Quantile\(q=\[0.1, 0.9\].*name each reduction object's result "
                                            r"with a dict"):
            lorenz_grid(reduce=["mean", Quantile([0.1, 0.9])])

    def test_where_selecting_an_element_instead_of_a_leaf(self):
        with pytest.raises(ValueError, match=r"axis 'x0': `where` must return a leaf of the system or initial state "
                                             r"as it is .* use a name such as 'state0\[0\]'"):
            sciax.sweep(Lorenz(), Y0, axes={"x0": Axis(X0, where=lambda s, y: y[0])}, rollout=sciax.Simulate(**KW))

    def test_empty_axes(self):
        with pytest.raises(TypeError, match="`axes` must be a non-empty dict"):
            sciax.sweep(Lorenz(), Y0, axes={}, rollout=sciax.Simulate(**KW))


def test_repeated_sweeps_reuse_member_structure_but_never_stale_values_or_shapes():
    """`sweep` memoises one member's output structure on its abstract signature: a second sweep
    with the same structure skips that trace, while new values, new functions and new dtypes
    still give their own results."""
    from sciax.ensemble import _sweep

    def run(system, y0=Y0, output=final):
        return sciax.sweep(system, y0, axes={"rho": RHO}, rollout=sciax.Simulate(**KW), output=output).outputs

    first = run(Lorenz(sigma=10.0))
    entries = len(_sweep._STRUCTURES)
    second = run(Lorenz(sigma=12.0))  # same structure, other values
    assert len(_sweep._STRUCTURES) == entries  # the memoised structure was used
    for i, rho in enumerate(RHO):
        np.testing.assert_allclose(second[i], sciax.simulate(Lorenz(sigma=12.0, rho=rho), Y0, **KW).final_state,
                                   rtol=1e-12)
    assert not np.allclose(first, second)
    x_only = run(Lorenz(), output=lambda traj: traj.final_state[0])  # another function: other shape
    assert x_only.shape == (RHO.size,)
    np.testing.assert_array_equal(x_only, run(Lorenz())[:, 0])
    single = run(sciax.astype(Lorenz(), jnp.float32), y0=Y0.astype(jnp.float32))  # another dtype
    assert single.dtype == np.float32


def test_chunk_compile_options_keep_the_users_disabled_passes(monkeypatch):
    """On CPU the chunk is compiled without XLA's CSE (same bits on one device and many, see
    `_chunk_runner`); passes the user disabled in XLA_FLAGS stay disabled; other platforms keep
    XLA's defaults."""
    from jax.sharding import Mesh

    from sciax.ensemble import _chunking, _execute

    mesh = Mesh(np.array(jax.devices("cpu")[:1]), ("members",))
    seen = []
    monkeypatch.setattr(_execute, "_jitted_chunk", seen.append)
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4 --xla_disable_hlo_passes=foo,bar")
    _execute._chunk_runner(mesh)
    monkeypatch.setenv("XLA_FLAGS", "")
    _execute._chunk_runner(mesh)
    monkeypatch.setenv("XLA_FLAGS", '--xla_disable_hlo_passes="algsimp,foo"')  # XLA strips the quotes
    _execute._chunk_runner(mesh)
    monkeypatch.setattr(_chunking, "_platform", lambda mesh: "gpu")
    _execute._chunk_runner(mesh)
    assert seen == ["bar,cse,foo", "cse", "algsimp,cse,foo", None]


@pytest.mark.parametrize(("gather", "reduce", "held"), [(False, None, 10), (True, None, 100),
                                                        (False, {"median": "median"}, 100)])
def test_host_memory_check_counts_what_this_process_keeps(monkeypatch, gather, reduce, held):
    """In a multi-process run with gather=False a process keeps only its own share of the
    outputs, so the host-memory check sizes that share; gathering, or a reduction that needs
    every value, keeps all members on every process."""
    from sciax.ensemble import _chunking, _devices, _sweep

    seen = []
    monkeypatch.setattr(_devices, "process_share", lambda n, *args: (0, 10))  # process 0 of 10
    monkeypatch.setattr(_chunking, "_check_host_memory", lambda needs, n, out: seen.append(n))
    _sweep._plan(Lorenz(), Y0, {"rho": jnp.linspace(0.0, 30.0, 100)}, mode="grid", rollout=sciax.Simulate(**KW),
                 run=None, output=final, reduce=reduce, reduce_over=None, keep=True, key=None,
                 batch_size=None, memory_budget=None, devices=1, check_finite=True, order=None, gather=gather)
    assert seen == [held]


def test_sel_along_a_reduced_away_dim_is_refused_naming_it_and_the_kept_dims():
    """With keep=False nothing per member is kept along a reduced dim: sel() returned a result with
    no outputs and no reductions, silently."""
    res = lorenz_grid(output=z_frames, reduce={"m": "mean"}, reduce_over=("state0[0]",))
    assert res.outputs is None
    with pytest.raises(ValueError, match=r"dim 'state0\[0\]' was reduced over \(reductions over \['state0\[0\]'\]\) "
                                         r"and the members were not kept \(keep=False\).*kept dims \['rho'\]"):
        res.sel(**{"state0[0]": 2.0})
    with pytest.raises(ValueError, match=r"dim 'state0\[0\]' was reduced over"):
        res.isel(**{"state0[0]": 0})
    assert res.sel(rho=30.0).reductions["m"].shape == res.reductions["m"].shape[1:]  # kept dims still work


def test_sel_on_a_grid_axis_holding_a_value_twice_is_refused_as_in_zip_mode():
    """It silently picked the first of the two members."""
    res = sciax.sweep(Lorenz(), Y0, axes={"rho": np.array([28.0, 10.0, 28.0])}, run=lambda s, y, k: s.rho * y)
    with pytest.raises(ValueError, match=r"sel: rho = 28.0 matches 2 positions \[0, 2\] of grid axis 'rho', which "
                                         r"holds that value more than once; use isel\(rho=i\)"):
        res.sel(rho=28.0)
    with pytest.raises(ValueError, match="matches 2 positions"):
        res.sel(rho=27.0, method="nearest")
    assert res.sel(rho=10.0).outputs.tolist() == [10.0, 0.0, 0.0]
