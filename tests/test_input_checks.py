"""Bad input is refused with a message naming the function, the argument, what was expected and
what was received: checkpoint precision, `astype`'s dtype, numeric scalars of `simulate` and
`solve`, and `plot_trajectory`'s `max_points`. Nothing is downcast or truncated silently."""

import fractions
import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sciax
from sciax.integrators import RK4
from sciax.plot import plot_trajectory
from sciax.systems import Lorenz

REPO = pathlib.Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------------
# load_checkpoint
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_checkpoint_round_trip_keeps_the_dtype(tmp_path, dtype):
    state = jnp.array([1.0, 2.0], dtype)
    sciax.io.save_checkpoint(tmp_path / "c.npz", state, {"k": 1})
    loaded, meta = sciax.io.load_checkpoint(tmp_path / "c.npz", like=jnp.zeros(2, dtype))
    assert loaded.dtype == state.dtype and meta == {"k": 1}
    np.testing.assert_array_equal(np.asarray(loaded, np.float64), np.asarray(state, np.float64))


@pytest.mark.parametrize("saved, like", [("float64", "float32"), ("float32", "float64")])
def test_checkpoint_of_another_precision_is_refused(tmp_path, saved, like):
    sciax.io.save_checkpoint(tmp_path / "c.npz", jnp.ones(2, saved), {})
    with pytest.raises(ValueError, match=rf"holds {saved} data but `like` .* is {like}; load_checkpoint"):
        sciax.io.load_checkpoint(tmp_path / "c.npz", like=jnp.zeros(2, like))


def test_checkpoint_structure_mismatch_names_like_not_a_scenario(tmp_path):
    sciax.io.save_checkpoint(tmp_path / "c.npz", jnp.ones(2), {})
    with pytest.raises(ValueError, match="does not match the structure, shapes and dtypes of `like`") as info:
        sciax.io.load_checkpoint(tmp_path / "c.npz", like=jnp.zeros(3))
    assert "scenario" not in str(info.value)


def test_float64_checkpoint_is_not_downcast_when_x64_is_off(tmp_path):
    path = tmp_path / "c64.npz"
    sciax.io.save_checkpoint(path, jnp.array([1.0 + 1e-12, 2.0], jnp.float64), {})
    script = textwrap.dedent(f"""
        import jax, jax.numpy as jnp, sciax.io
        assert not jax.config.jax_enable_x64
        try:
            state, _ = sciax.io.load_checkpoint({str(path)!r}, like=jnp.zeros(2, jnp.float32))
        except ValueError as e:
            print("REFUSED:", e)
        else:
            print("LOADED:", state.dtype)
    """)
    env = {**os.environ, "JAX_ENABLE_X64": "0", "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "REFUSED:" in out.stdout, out.stdout
    assert "holds float64 data but `like`" in out.stdout and "jax_enable_x64" in out.stdout


def test_astype_to_float64_is_refused_when_x64_is_off():
    """JAX would make float32 arrays without a word; astype says why instead."""
    script = textwrap.dedent("""
        import jax, jax.numpy as jnp, sciax
        from sciax.systems import Lorenz
        assert not jax.config.jax_enable_x64
        try:
            sciax.astype(Lorenz(), jnp.float64)
        except ValueError as e:
            print("REFUSED:", e)
        print("FLOAT32:", sciax.astype(Lorenz(), jnp.float32).rho.dtype)
    """)
    env = {**os.environ, "JAX_ENABLE_X64": "0", "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "REFUSED: astype: float64 needs x64 on" in out.stdout and "FLOAT32: float32" in out.stdout, out.stdout


# ---------------------------------------------------------------------------------------------
# astype
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, shown", [(jnp.int32, "int32"), (bool, "bool"), ("foo", "'foo'"), (None, "None")])
def test_astype_refuses_a_non_floating_dtype(dtype, shown):
    with pytest.raises(TypeError, match=rf"astype: `dtype` must be a floating dtype \(float64, float32, float16 or "
                                        rf"bfloat16\), got {shown}\."):
        sciax.astype(Lorenz(), dtype)


@pytest.mark.parametrize("half", [jnp.float16, jnp.bfloat16])
def test_the_half_precisions_the_messages_name_are_the_ones_simulate_steps(half):
    """float16/bfloat16 states ran while the messages said "float32 or float64"."""
    system, y0 = sciax.astype(Lorenz(), half), jnp.array([1.0, 1.0, 1.0], half)
    traj = sciax.simulate(system, y0, integrator=RK4(), dt=0.01, n_steps=10)
    reference = sciax.simulate(Lorenz(), y0.astype(jnp.float64), integrator=RK4(), dt=0.01, n_steps=10)
    assert traj.states.dtype == half
    np.testing.assert_allclose(np.asarray(traj.final_state, np.float64), reference.final_state, rtol=2e-2)
    with pytest.raises(sciax.StateMismatchError,
                       match=r"floating point \(float64, float32, or the half precisions float16 and bfloat16\), "
                             r"got dtype int32"):
        sciax.simulate(Lorenz(), jnp.array([1, 1, 1], jnp.int32), integrator=RK4(), dt=0.01, n_steps=10)


def test_astype_to_a_floating_dtype_and_presets_still_work(dtype):
    system = sciax.astype(Lorenz(), dtype)
    assert system.beta.dtype == dtype
    assert system.default_state().dtype == dtype  # presets cast through astype internally


# ---------------------------------------------------------------------------------------------
# Numeric scalars of simulate and solve
# ---------------------------------------------------------------------------------------------

Y0 = jnp.ones(3)


def _simulate(**kw):
    return sciax.simulate(Lorenz(), Y0, integrator=RK4(), n_steps=2, **{"dt": 0.01, **kw})


def _solve(**kw):
    return sciax.solve(Lorenz(), Y0, **{"t0": 0.0, "t1": 0.1, **kw})


@pytest.mark.parametrize("call, name, value, shown", [
    (_simulate, "dt", "0.1", "str '0.1'"),
    (_simulate, "dt", True, "bool True"),
    (_simulate, "dt", 0.1j, "complex 0.1j"),
    (_simulate, "t0", "a", "str 'a'"),
    (_simulate, "t0", np.bool_(False), "dtype bool"),
    (_solve, "t1", "x", "str 'x'"),
    (_solve, "t0", jnp.array(0.0 + 0.0j), "dtype complex"),
    (_solve, "rtol", "a", "str 'a'"),
    (_solve, "atol", True, "bool True"),
    (_solve, "dt0", "0.01", "str '0.01'"),
])
def test_non_real_numbers_are_refused(call, name, value, shown):
    where = call.__name__.lstrip("_")
    with pytest.raises(TypeError, match=rf"{where}: `{name}` must be a real number, got .*{shown}"):
        call(**{name: value})


@pytest.mark.parametrize("dt", [0.01, np.float32(0.01), np.float64(0.01), np.array(0.01), jnp.array(0.01),
                                fractions.Fraction(1, 100)])
def test_real_numbers_are_accepted(dt):
    assert _simulate(dt=dt, t0=np.int64(0)).times.shape == (3,)
    assert _solve(t1=np.array(0.1), rtol=np.float64(1e-6), atol=jnp.array(1e-8)).states.shape[-1] == 3


def test_traced_time_scalars_still_work():
    def final_x(dt, t0):
        return _simulate(dt=dt, t0=t0).final_state[0]

    assert np.isfinite(jax.jit(final_x)(0.01, 0.0))
    assert np.isfinite(jax.grad(final_x)(0.01, 0.0))


# ---------------------------------------------------------------------------------------------
# plot_trajectory
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def traj():
    return _simulate()


@pytest.mark.parametrize("max_points, error, expected", [
    (0, ValueError, "must be a positive integer, got 0"),
    (-5, ValueError, "must be a positive integer, got -5"),
    (2.5, TypeError, "must be a Python int, got float 2.5"),
    (True, TypeError, "must be a Python int, got bool True"),
])
def test_plot_trajectory_refuses_a_bad_max_points(traj, max_points, error, expected):
    with pytest.raises(error, match=rf"plot_trajectory: `max_points` {expected}"):
        plot_trajectory(traj, max_points=max_points)


def test_plot_trajectory_accepts_a_numpy_int_max_points(traj):
    assert plot_trajectory(traj, max_points=np.int64(2)) is not None


# ---------------------------------------------------------------------------------------------
# a traced dt
# ---------------------------------------------------------------------------------------------


def test_a_traced_dt_that_is_not_positive_gives_non_finite_frames_not_a_backward_or_frozen_run():
    """jit(lambda d: simulate(..., dt=d))(-0.01) integrated backwards, and under vmap a zero dt gave
    a frozen member, both reported as finite. The host cannot see a traced dt: the frames say it."""
    y0 = jnp.array([1.0, 1.0, 1.0])

    def run(d):
        return sciax.simulate(Lorenz(), y0, integrator=RK4(), dt=d, n_steps=10, save_every=5)

    backwards = jax.jit(run)(-0.01)
    assert backwards.finite.tolist() == [True, False, False]
    assert np.all(np.isnan(np.asarray(backwards.states[1:]))) and np.all(np.isnan(np.asarray(backwards.times[1:])))
    members = jax.vmap(run)(jnp.array([0.01, 0.0]))
    assert members.finite.tolist() == [[True, True, True], [True, False, False]]
    reference = run(0.01)  # the positive member is untouched: bitwise the host-checked run
    np.testing.assert_array_equal(members.states[0], reference.states)
    np.testing.assert_array_equal(members.times[0], reference.times)
    with pytest.raises(Exception, match="non-finite"):
        jax.jit(lambda d: sciax.simulate(Lorenz(), y0, integrator=RK4(), dt=d, n_steps=10, save_every=5,
                                         check_finite=True).times)(0.0)


def test_concrete_values_closed_over_inside_jit_are_checked_on_the_host():
    """A system built inside `jax.jit` from arrays made outside it: the parameter checks ran
    `bool(jnp.all(...))` on them, which inside a trace is a tracer, and raised JAX's
    TracerBoolConversionError instead of building the system. They are checked as host values
    now: good ones pass, bad ones still get the checks' own message."""
    import sciax.md as md
    from sciax.systems import Kepler, MassSpringChain

    stiffness, masses = jnp.full(4, 2.0), jnp.ones(5)

    @jax.jit
    def build(scale):
        chain = MassSpringChain(masses=masses, stiffness=stiffness)
        assert chain.normal_mode_frequencies().shape == (5,)
        state = Kepler().orbit_state(semi_major_axis=jnp.asarray(1.5), eccentricity=jnp.asarray(0.2))
        velocities = md.maxwell_boltzmann(masses, 1.0, key=jax.random.key(0))
        return scale * chain.potential_energy(state.positions[None].repeat(5, 0)) + jnp.sum(velocities)

    assert np.isfinite(build(1.0))
    negative = -stiffness / 2
    with pytest.raises(ValueError, match=r"MassSpringChain: `stiffness` must be non-negative, got minimum -1\.0"):
        jax.jit(lambda: MassSpringChain(masses=masses, stiffness=negative))()
    with pytest.raises(ValueError, match=r"`masses` must all be positive and finite"):
        jax.jit(lambda: md.maxwell_boltzmann(negative, 1.0, key=jax.random.key(0)))()
