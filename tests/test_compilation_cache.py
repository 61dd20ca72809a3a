"""`enable_compilation_cache`: a program compiled in one process is loaded, not compiled, in the next."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import sciax

ROOT = Path(__file__).resolve().parents[1]

# Counts JAX's own cache-hit events while jitting a small simulate; prints them as JSON.
CHILD = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp
    import sciax
    hits = []
    jax.monitoring.register_event_listener(
        lambda event, **kw: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None)
    path = sciax.enable_compilation_cache(sys.argv[1], min_compile_time_s=0)
    traj = sciax.simulate(sciax.systems.Lorenz(), jnp.array([1.0, 0.0, 0.0]),
                          integrator=sciax.integrators.RK4(), dt=0.01, n_steps=100, save_every=10)
    print(json.dumps({"hits": len(hits), "path": str(path), "final": traj.states[-1].tolist()}))
""")


def _child(cache_dir, **environment):
    env = dict(os.environ, **environment)
    env.pop("XLA_FLAGS", None)
    out = subprocess.run([sys.executable, "-c", CHILD, str(cache_dir)], capture_output=True, text=True,
                         cwd=ROOT, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


# Slow: test_it_switches_jax_s_cache_on_when_the_environment_had_it_off runs the same two child
# processes and makes every assertion below (a nested directory created, its path returned, a hit
# in the second process, the same numbers); its environment only switches JAX's cache off first,
# and enable_compilation_cache switches it on in either case (the same code path).
@pytest.mark.slow
def test_second_process_loads_compiled_programs_from_disk(tmp_path):
    cache = tmp_path / "nested" / "cache"
    first = _child(cache)
    assert first["hits"] == 0 and first["path"] == str(cache)
    assert any(cache.iterdir()), "nothing was written to the cache"
    second = _child(cache)
    assert second["hits"] >= 1
    assert second["final"] == first["final"]  # the cached program computes the same numbers


def test_it_switches_jax_s_cache_on_when_the_environment_had_it_off(tmp_path):
    """It set the directory but left `jax_enable_compilation_cache` False: nothing was kept,
    and the returned path suggested otherwise. (Also what a second process in the default
    environment gets: the programs loaded from disk, computing the same numbers.)"""
    cache = tmp_path / "nested" / "cache"
    first = _child(cache, JAX_ENABLE_COMPILATION_CACHE="false")
    assert first["hits"] == 0 and first["path"] == str(cache)
    assert any(cache.iterdir()), "nothing was written to the cache"
    second = _child(cache, JAX_ENABLE_COMPILATION_CACHE="false")
    assert second["hits"] >= 1
    assert second["final"] == first["final"]  # the cached program computes the same numbers


def test_default_directory_follows_environment(monkeypatch, tmp_path):
    from sciax._compile.compilation_cache import default_cache_directory

    monkeypatch.setenv("SCIAX_CACHE_DIR", str(tmp_path / "a"))
    assert default_cache_directory() == tmp_path / "a"
    monkeypatch.delenv("SCIAX_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_directory() == tmp_path / "xdg" / "sciax" / "jax"


@pytest.mark.parametrize("bad", [-1.0, float("nan"), "1", True])
def test_bad_min_compile_time_names_the_argument(bad, tmp_path):
    with pytest.raises(ValueError, match="min_compile_time_s.*non-negative"):
        sciax.enable_compilation_cache(tmp_path, min_compile_time_s=bad)


def test_bad_directory_is_refused(tmp_path):
    with pytest.raises(TypeError, match="`directory` must be a path"):
        sciax.enable_compilation_cache(3)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="cannot create the cache directory"):
        sciax.enable_compilation_cache(blocker / "sub")


# ---------------------------------------------------------------------------------------------
# A `fit` with a `Solve` rollout is kept by the caches
# ---------------------------------------------------------------------------------------------

# I(t) of an SIR outbreak (beta = 0.5, gamma = 0.2, from (0.99, 0.01, 0)) on days 1..14, rounded.
SIR_DAYS = list(range(1, 15))
SIR_INFECTED = [0.0134, 0.0179, 0.0239, 0.0316, 0.0415, 0.0539, 0.0693, 0.0877, 0.1088, 0.1322, 0.1565,
                0.1803, 0.2016, 0.2189]

# One SIR fit with a `Solve` rollout in a fresh process. With `--no-tracing`, Optimistix's and
# Diffrax's entry points raise if called: the fit can then only run from the programs kept on disk.
SOLVE_FIT_CHILD = textwrap.dedent("""
    import json, sys
    import jax
    jax.config.update("jax_enable_x64", True)
    import numpy as np
    import diffrax, optimistix
    import sciax
    from sciax.systems import SIR

    if sys.argv[2] == "--no-tracing":
        def refuse(*args, **kwargs):
            raise AssertionError("traced the solve again")
        optimistix.least_squares = diffrax.diffeqsolve = refuse
    sciax.enable_compilation_cache(sys.argv[1], min_compile_time_s=0)
    result = sciax.fit(SIR(beta=0.3, gamma=0.1), np.array([0.99, 0.01, 0.0]), np.array(json.loads(sys.argv[3])),
                       np.array(json.loads(sys.argv[4])), params=("beta", "gamma"), observe=lambda y: y[1],
                       t0=0.0, rollout=sciax.Solve())
    bits = lambda x: np.asarray(x).tobytes().hex()
    print(json.dumps({"v": bits(result.optimum), "cov": bits(result.covariance), "r": bits(result.residuals),
                      "n_steps": result.n_steps, "converged": result.converged}))
""")


def test_a_solve_fit_in_a_fresh_process_runs_from_the_cache(tmp_path):
    """Diffrax's checks of the save times (`eqx.error_if`) made every `Solve` fit a program with
    host callbacks, which neither JAX's persistent cache nor `fit`'s kept programs store: each new
    process traced and compiled it again (3-4 s for this SIR fit). `fit` checks those times on
    the host and leaves the checks out, so a second process runs it without tracing, bit for bit."""
    def child(mode):
        env = dict(os.environ)
        env.pop("XLA_FLAGS", None)
        out = subprocess.run([sys.executable, "-c", SOLVE_FIT_CHILD, str(tmp_path), mode, json.dumps(SIR_DAYS),
                              json.dumps(SIR_INFECTED)], capture_output=True, text=True, cwd=ROOT, env=env,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    cold = child("--trace")
    assert cold["converged"]
    assert list(tmp_path.glob("sciax-programs/_solve-*")), "the traced solve was not kept on disk"
    warm = child("--no-tracing")
    assert warm == cold


def _solve_fit_arguments(**kwargs):
    """The arguments `fit`'s jitted solve gets for an SIR fit with `kwargs` (the persistent cache
    off); compiles nothing."""
    import numpy as np

    from sciax.fitting import _optimise

    class Stop(Exception):
        pass

    def stand_in(*args):
        raise Stop(args)

    data = np.array(kwargs.pop("data", SIR_INFECTED))
    fit_kwargs = {**dict(params=("beta", "gamma"), observe=lambda y: y[1], t0=0.0, rollout=sciax.Solve()), **kwargs}
    with pytest.MonkeyPatch.context() as patch, pytest.raises(Stop) as stop:
        patch.setattr(_optimise.solve, "optimised", stand_in)
        sciax.fit(sciax.systems.SIR(beta=0.3, gamma=0.1), np.array([0.99, 0.01, 0.0]), np.array(SIR_DAYS, float),
                  data, **fit_kwargs)
    return stop.value.args[0]


@pytest.mark.parametrize("case", ["reverse-dt0", "constant-steps"])
def test_the_program_of_a_solve_fit_holds_no_host_callback(case):
    """JAX keeps no program with a host callback in its persistent cache ("uses host callbacks").
    Diffrax's checks of times that `fit` made on the host (save times increasing and within
    [t0, t1], the sign of `dt0`; sciax's t1 >= t0 for constant steps) are left out of the
    compiled solve in either Jacobian mode and step control (the forward-mode default: the
    fresh-process test above)."""
    import re

    from sciax.fitting import _optimise

    kwargs = {"reverse-dt0": dict(jacobian="reverse", rollout=sciax.Solve(dt0=0.05)),
              "constant-steps": dict(rollout=sciax.Solve(rtol=None, dt0=0.05))}[case]
    text = _optimise.solve.optimised.lower(*_solve_fit_arguments(**kwargs)).lowered.as_text()
    assert not re.findall(r"custom_call @\w*callback", text)


def test_the_key_of_a_kept_solve_fit_follows_the_solve_settings_and_the_model():
    """The key of a `Solve` fit's kept program traces the model's vector field, not Diffrax (whose
    derivative rules cannot be written into a key), and holds the `Solve` by value: other
    tolerances, another solver or another model give another key; new data the same."""
    from sciax.fitting import _optimise

    def key(**kwargs):
        return _optimise.solve.programs.key(*_solve_fit_arguments(**kwargs))

    class SlowerRecovery(sciax.systems.SIR):
        def vector_field(self, t, y, args=None):
            return super().vector_field(t, y, args) * 0.5

    class OwnSolve(sciax.Solve):
        pass

    base = key()
    assert base is not None
    assert key(data=[0.5 * x for x in SIR_INFECTED]) == base
    others = [key(rollout=sciax.Solve(rtol=1e-7)), key(rollout=sciax.Solve(solver="dopri5")),
              key(rollout=sciax.Solve(max_steps=1000)), key(jacobian="reverse"),
              key(observe=lambda y: y[1] + y[2])]
    assert None not in others and len({base, *others}) == 6
    args = _solve_fit_arguments()
    assert _optimise.solve.programs.key(*args) == base
    import equinox as eqx

    other_model = eqx.tree_at(lambda p: p.system, args[0], SlowerRecovery(beta=0.3, gamma=0.1))
    assert _optimise.solve.programs.key(other_model, *args[1:]) != base
    assert key(rollout=OwnSolve()) is None  # a subclass may run other code: not kept


def test_only_the_checks_made_on_the_host_are_left_out():
    """`drop_host_checked` removes Diffrax's save-time check inside `checked_on_host()` only; a
    model's own `eqx.error_if` there, and the same check outside the scope, still raise."""
    import equinox as eqx
    import jax.numpy as jnp

    from sciax._compile.host_checked import checked_on_host, drop_host_checked

    message = "saveat.ts must be increasing or decreasing."

    def program(ts, x, marked):
        def checks(ts, x):
            ts = eqx.error_if(ts, ts[1:] < ts[:-1], message)
            return ts, eqx.error_if(x, x < 0, "the model's own check")
        if marked:
            with checked_on_host():
                return checks(ts, x)
        return checks(ts, x)

    run = eqx.filter_jit(drop_host_checked(program))
    decreasing, increasing = jnp.array([2.0, 1.0]), jnp.array([1.0, 2.0])
    ts, x = run(decreasing, jnp.array(1.0), True)  # left out: returned unchanged
    assert ts.tolist() == [2.0, 1.0] and float(x) == 1.0
    with pytest.raises(eqx.EquinoxRuntimeError, match="the model's own check"):
        run(increasing, jnp.array(-1.0), True)
    with pytest.raises(eqx.EquinoxRuntimeError, match="increasing or decreasing"):
        run(decreasing, jnp.array(1.0), False)
