"""Traced programs kept on disk (`sciax._compile.program_cache`): a fit in a fresh process with a warm
cache skips tracing, computes the same numbers, and a key changes with everything the program
computes; what cannot be keyed, read or written falls back to the ordinary path."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optimistix as optx
import pytest

from sciax._compile import program_cache as _program_cache
from sciax._compile.program_cache import ProgramCache
from sciax.fitting import _optimise

ROOT = Path(__file__).resolve().parents[1]

# One damped-oscillator fit (noisy data, positive/bounded transforms) in a fresh process. With
# `--no-tracing`, Optimistix's `least_squares` raises if it is called: the fit can then only
# succeed through the program kept on disk. Prints the fitted values' bits and the entries.
CHILD = textwrap.dedent("""
    import json, sys
    import jax
    jax.config.update("jax_enable_x64", True)
    import numpy as np
    import optimistix
    import sciax
    from sciax import Bounded, Positive, Simulate
    from sciax.integrators import RK4
    from sciax.systems import DampedDrivenOscillator

    if sys.argv[2] == "--no-tracing":
        def refuse(*args, **kwargs):
            raise AssertionError("traced Optimistix again")
        optimistix.least_squares = refuse
    if sys.argv[1] != "-":
        sciax.enable_compilation_cache(sys.argv[1], min_compile_time_s=0)
    times = np.linspace(0.0, 4.0, 41)[1:]
    truth = sciax.simulate(DampedDrivenOscillator(omega=2.0, zeta=0.1), np.array([1.0, 0.0]), integrator=RK4(),
                           dt=0.05, n_steps=80, save_every=2)
    data = np.asarray(truth.states[1:, 0]) + 0.01 * np.random.default_rng(0).standard_normal(40)
    result = sciax.fit(DampedDrivenOscillator(omega=1.5, zeta=0.3), np.array([1.0, 0.0]), times, data,
                       params=("omega", "zeta"), observe=lambda y: y[0], rollout=Simulate(RK4(), dt=0.05),
                       transforms={"omega": Positive(), "zeta": Bounded(0.0, 1.0)}, sigma=0.01)
    bits = lambda x: np.asarray(x).tobytes().hex()
    out = {"v": bits(result.optimum), "cov": bits(result.covariance), "r": bits(result.residuals),
           "system": [bits(result.system.omega), bits(result.system.zeta)], "state0": bits(result.state0),
           "n_steps": result.n_steps, "converged": result.converged}
    import pathlib
    kept = pathlib.Path(sys.argv[1]) / "sciax-programs"
    out["entries"] = sorted(p.name for p in kept.glob("*")) if sys.argv[1] != "-" else []
    print(json.dumps(out))
""")


def _child(cache: str, mode: str = "--trace") -> dict:
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    out = subprocess.run([sys.executable, "-c", CHILD, cache, mode], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_fresh_process_fits_from_the_kept_program_without_tracing(tmp_path):
    reference = _child("-")  # no persistent cache: the ordinary jit
    cold = _child(str(tmp_path / "cache"))
    warm = _child(str(tmp_path / "cache"), "--no-tracing")
    assert len(cold["entries"]) == 1 and cold["entries"][0].startswith("_solve-")
    assert warm["entries"] == cold["entries"]  # the same key in a new process: found, not rewritten
    for run in (cold, warm):
        assert run["converged"]
        for name in ("v", "cov", "r", "system", "state0", "n_steps"):
            assert run[name] == reference[name], name  # bit for bit


def _toy(scale):
    """A cached function whose probe is the whole function (no library part)."""

    def model(x, config):
        return {"y": jnp.sin(x) * scale + config["shift"], "n": None}

    return ProgramCache(model, model, config=(1,), name="toy")


def test_the_key_follows_what_the_program_computes():
    x = jnp.arange(3.0)
    key = lambda cache, arg=x, shift=1.0: cache.key(arg, {"shift": shift})  # noqa: E731
    base = key(_toy(2.0))
    assert base is not None and len(base) == 64
    assert key(_toy(2.0)) == base  # re-created: the same program
    assert key(_toy(3.0)) != base  # a captured number (a literal in the jaxpr)
    assert key(_toy(np.float64(2.0))) == base
    assert key(_toy(2.0), shift=2.0) != base  # configuration, by value
    assert key(_toy(0.0)) != key(_toy(-0.0))  # by its bits
    assert key(_toy(2.0), arg=x.astype(jnp.float32)) != base  # argument dtypes
    assert key(_toy(2.0), arg=jnp.arange(4.0)) != base  # and shapes
    assert key(_toy(2.0), arg=jnp.arange(3.0) + 1) == base  # but not argument values
    table = np.array([1.0, 2.0, 3.0])
    closes_over = lambda t: ProgramCache(lambda a, c: a * jnp.asarray(t), lambda a, c: a * jnp.asarray(t),  # noqa: E731
                                         config=(1,), name="toy")
    assert closes_over(table).key(x, 0) == closes_over(table.copy()).key(x, 0)
    assert closes_over(table).key(x, 0) != closes_over(table + 1e-16 * table).key(x, 0)  # constants by bytes
    other = ProgramCache(lambda a, c: jnp.cos(a), lambda a, c: jnp.cos(a), config=(1,), name="toy")
    assert other.key(x, {"shift": 1.0}) != base  # other code
    # The fit's configuration: the solver and its tolerances.
    solvers = [optx.LevenbergMarquardt(rtol=1e-8, atol=1e-8), optx.LevenbergMarquardt(rtol=1e-9, atol=1e-8),
               optx.GaussNewton(rtol=1e-8, atol=1e-8)]
    keys = [ProgramCache(lambda a, s: a, lambda a, s: a, config=(1,), name="toy").key(x, s) for s in solvers]
    assert len(set(keys)) == 3


# Computes a toy program's key in a fresh process; with "edit", every sciax source file reads as
# edited from then on (sciax upgraded or edited on disk after this process imported it).
KEY_CHILD = textwrap.dedent("""
    import pathlib, sys
    import jax.numpy as jnp
    from sciax._compile.program_cache import ProgramCache
    if sys.argv[1] == "edit":
        read = pathlib.Path.read_bytes
        pathlib.Path.read_bytes = lambda self: read(self) + (b"# edited" if self.suffix == ".py" else b"")
    toy = ProgramCache(lambda a, c: 2 * a, lambda a, c: 2 * a, config=(1,), name="toy")
    print(toy.key(jnp.arange(3.0), 0))
""")


def test_the_key_describes_the_code_the_process_imported():
    """sciax's source was hashed at the first fit: a process that had imported the old code
    before an edit or upgrade filed the old code's program under the new code's key, and later
    processes running the new code loaded it (a different fit than without the cache)."""
    keys = [subprocess.run([sys.executable, "-c", KEY_CHILD, mode], capture_output=True, text=True, cwd=ROOT,
                           timeout=300) for mode in ("plain", "edit")]
    assert all(k.returncode == 0 for k in keys), [k.stderr[-2000:] for k in keys]
    assert keys[0].stdout == keys[1].stdout and len(keys[0].stdout.strip()) == 64


@jax.custom_jvp
def _user_rule(x):
    return jnp.sin(x)


_user_rule.defjvp(lambda primals, tangents: (_user_rule(primals[0]), jnp.cos(primals[0]) * tangents[0]))


class _UserSolver(optx.LevenbergMarquardt):
    pass


def _user_primitive(factor):
    """A primitive of the user's own: its rules (here its lowering) can change while its name
    and the jaxpr that holds it stay the same."""
    from jax.extend.core import Primitive
    from jax.interpreters import mlir

    p = Primitive("user_scale")
    p.def_impl(lambda x: x * factor)
    p.def_abstract_eval(lambda x: x)
    mlir.register_lowering(p, mlir.lower_fun(lambda x: x * factor, multiple_results=False))
    return p


def test_the_key_follows_closures_and_equation_contexts():
    x = jnp.arange(3.0)
    keep = lambda c: ProgramCache(lambda a, c: a, lambda a, c: a, config=(1,), name="toy").key(x, c)  # noqa: E731
    # A library function that wraps another carries its name (`functools.wraps`): what it closes
    # over is written too.
    keys = [keep(f) for f in (jnp.sin, jax.grad(jnp.sin), jax.grad(jnp.cos))]
    assert None not in keys and len(set(keys)) == 3
    policies = jax.checkpoint_policies
    both = [policies.save_from_both_policies(p, policies.nothing_saveable)
            for p in (policies.everything_saveable, policies.nothing_saveable)]
    assert len({keep(p) for p in both}) == 2

    # A context manager inside the model changes how an equation lowers, not `jax.config`.
    def draws(partitionable):
        def probe(a, c):
            with jax.threefry_partitionable(partitionable):
                return a + jax.random.uniform(jax.random.PRNGKey(0), a.shape, a.dtype)
        return ProgramCache(probe, probe, config=(1,), name="toy").key(x, 0)

    assert draws(True) != draws(False) and None not in (draws(True), draws(False))


def test_what_cannot_be_keyed_is_not_kept():
    x = jnp.arange(3.0)
    plain = lambda a, c: a  # noqa: E731
    # A user's derivative rule, a host callback: nothing that can be written down says what they do.
    assert ProgramCache(plain, lambda a, c: _user_rule(a), config=(1,), name="toy").key(x, 0) is None
    callback = lambda a, c: jax.pure_callback(np.sin, jax.ShapeDtypeStruct(a.shape, a.dtype), a)  # noqa: E731
    assert ProgramCache(plain, callback, config=(1,), name="toy").key(x, 0) is None
    # A primitive of the user's own (its rules are not in any library version).
    user = _user_primitive(2.0)
    assert ProgramCache(plain, lambda a, c: user.bind(a), config=(1,), name="toy").key(x, 0) is None
    # A configuration holding user code (a solver subclass, a function) is not written by value.
    assert ProgramCache(plain, plain, config=(1,), name="toy").key(x, _UserSolver(rtol=1e-8, atol=1e-8)) is None
    assert ProgramCache(plain, plain, config=(1,), name="toy").key(x, lambda y: y) is None
    assert ProgramCache(plain, plain, config=(1,), name="toy").key(x, np.sin) is not None  # library code


@pytest.fixture
def program_directory(tmp_path):
    """JAX's persistent cache on in `tmp_path` (conftest turns it off again afterwards)."""
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    return tmp_path / "sciax-programs"


def test_entries_are_written_whole_and_damaged_ones_rewritten(program_directory):
    x = jnp.arange(3.0)
    expected = jnp.sin(x) * 2.0 + 1.0
    out = _toy(2.0).lookup((x, {"shift": 1.0})).compile([x])(x)
    assert out["n"] is None
    np.testing.assert_array_equal(out["y"], expected)
    [entry] = program_directory.iterdir()
    assert entry.suffix == ".jaxexport" and entry.stat().st_size > 0
    size = entry.stat().st_size
    entry.write_bytes(entry.read_bytes()[: size // 2])  # cut short (a crash of another writer)
    again = _toy(2.0).lookup((x, {"shift": 1.0}))  # a new process's memo
    np.testing.assert_array_equal(again.compile([x])(x)["y"], expected)
    assert [p.name for p in program_directory.iterdir()] == [entry.name]  # no temporary files left
    assert entry.stat().st_size == size  # rewritten whole


def test_a_damaged_entry_is_not_run(program_directory):
    """One flipped bit: flatbuffers would load it and the program could crash the process; the
    checksum refuses it and the entry is written again."""
    x = jnp.arange(3.0)
    _toy(2.0).lookup((x, {"shift": 1.0}))
    [entry] = program_directory.iterdir()
    good = entry.read_bytes()
    for position in (len(good) // 3, len(good) - 1):
        damaged = bytearray(good)
        damaged[position] ^= 0x10
        entry.write_bytes(bytes(damaged))
        assert _program_cache._load(entry) is None
        kept = _toy(2.0).lookup((x, {"shift": 1.0}))
        np.testing.assert_array_equal(kept.compile([x])(x)["y"], jnp.sin(x) * 2.0 + 1.0)
        assert _program_cache._load(entry) is not None  # written again, whole


def test_a_kept_program_that_fails_leaves_the_ordinary_path(program_directory, monkeypatch, caplog):
    from sciax._compile.program_cache import Kept

    run = _small_fit
    expected = run().optimum
    [entry] = program_directory.iterdir()

    def broken(self, leaves):
        raise RuntimeError("Failed to deserialize StableHLO")

    monkeypatch.setattr(Kept, "compile", broken)
    monkeypatch.setattr(_optimise.solve.programs, "_memo", type(_optimise.solve.programs._memo)())  # a new process
    result = run()
    np.testing.assert_array_equal(result.optimum, expected)
    assert not entry.exists() and "running without it" in caplog.text
    run()  # and the rest of the process runs the ordinary jit (the memo says so)
    assert not entry.exists()


def test_arguments_it_cannot_describe_are_not_kept(program_directory):
    typed_key = jax.random.key(0)  # an extended dtype
    cache = ProgramCache(lambda k, c: jax.random.uniform(k), lambda k, c: jax.random.uniform(k), config=(1,),
                         name="toy")
    kept = cache.lookup((typed_key, 0))
    if kept is not None:  # exported after all: it must then compute what jit computes
        np.testing.assert_array_equal(kept.compile([typed_key])(typed_key), jax.random.uniform(typed_key))


def test_an_unwritable_directory_or_unkeyable_program_runs_all_the_same(program_directory):
    x = jnp.arange(3.0)
    program_directory.write_text("not a directory")  # entries cannot be stored
    kept = _toy(2.0).lookup((x, {"shift": 1.0}))
    np.testing.assert_array_equal(kept.compile([x])(x)["y"], jnp.sin(x) * 2.0 + 1.0)
    program_directory.unlink()
    unkeyable = ProgramCache(lambda a, c: _user_rule(a), lambda a, c: _user_rule(a), config=(1,), name="toy")
    assert unkeyable.lookup((x, 0)) is None  # the caller's own jit runs it
    assert not program_directory.exists()


def test_off_without_a_local_persistent_cache(monkeypatch):
    monkeypatch.setitem(jax.config.values, "jax_compilation_cache_dir", None)
    assert _program_cache.directory() is None
    assert _toy(2.0).lookup((jnp.arange(3.0), {"shift": 1.0})) is None
    monkeypatch.setitem(jax.config.values, "jax_compilation_cache_dir", "gs://bucket/cache")
    assert _program_cache.directory() is None


def test_kept_fit_program_takes_the_quick_compile_options(program_directory, monkeypatch):
    """`compilation="fast"` reaches XLA through a kept program as through the ordinary jit, and
    both compilations share one entry (the options are not part of the lowered program)."""
    import equinox as eqx

    programs = _optimise.solve.programs
    lookup, seen = programs.lookup, []
    monkeypatch.setattr(programs, "lookup", lambda args, options=None: seen.append((args, options))
                        or lookup(args, options))
    fits = [_small_fit(compilation=c) for c in ("optimised", "fast")]
    assert [options for _, options in seen] == [None, _optimise.FAST_CPU_COMPILER_OPTIONS]
    assert len(list(program_directory.iterdir())) == 1
    args = seen[0][0]
    leaves = jax.tree_util.tree_leaves(eqx.filter(args, eqx.is_array))
    text = lambda options: lookup(args, options).compile(leaves).as_text()  # noqa: E731
    assert text(_optimise.FAST_CPU_COMPILER_OPTIONS) != text(None)
    assert all(f.converged for f in fits)
    np.testing.assert_allclose(fits[1].optimum, fits[0].optimum, rtol=1e-9)


def _small_fit(**kwargs):
    import sciax
    from sciax.integrators import RK4
    from sciax.systems import DampedDrivenOscillator

    times = np.linspace(0.1, 2.0, 20)
    data = np.cos(2.0 * times) * np.exp(-0.2 * times)
    return sciax.fit(DampedDrivenOscillator(omega=1.8, zeta=0.05), np.array([1.0, 0.0]), times, data,
                     params=("omega", "zeta"), observe=lambda y: y[0], t0=0.0,
                     rollout=sciax.Simulate(RK4(), dt=0.01), **kwargs)


def test_an_unknown_compile_option_is_dropped_without_losing_the_entry(program_directory, monkeypatch, caplog):
    """The kept program meets the same unknown-option error as the ordinary jit: the option is
    dropped with its warning, and the entry (shared with `compilation="optimised"`) stays."""
    solve = _optimise.solve
    options = {**_optimise.FAST_CPU_COMPILER_OPTIONS, "xla_cpu_option_that_does_not_exist": True}
    monkeypatch.setattr(solve, "options", options)
    expected = _small_fit(compilation="optimised").optimum
    [entry] = program_directory.iterdir()
    with pytest.warns(RuntimeWarning, match="does not know the XLA option 'xla_cpu_option_that_does_not_exist'"):
        result = _small_fit(compilation="fast")
    assert solve.options == _optimise.FAST_CPU_COMPILER_OPTIONS
    np.testing.assert_allclose(result.optimum, expected, rtol=1e-9)
    assert entry.exists() and "running without it" not in caplog.text


def test_a_context_inside_the_trace_gets_its_own_program(program_directory):
    """As jit does, the in-process memo tells apart calls made under different tracing contexts."""
    from jax.experimental.xla_metadata import set_xla_metadata

    x = jnp.arange(3.0)
    plain = _toy(2.0)
    outside = plain.lookup((x, {"shift": 1.0}))
    with set_xla_metadata(sciax_test="yes"):
        inside = plain.lookup((x, {"shift": 1.0}))
    assert outside is not None and inside is not None and inside is not outside
    assert plain.lookup((x, {"shift": 1.0})) is outside
