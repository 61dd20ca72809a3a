"""How sciax compiles its programs, kept apart from the physics.

Each piece is judged by what it buys on a workload a user sees (the README's
`sciax run sims/lorenz.toml`, the `python -m benchmarks` suites): kept if at least 20% or
0.5 s. One line of evidence each, from `benchmarks/results/2026-11-28-compile-machinery.md`
(5 interleaved fresh processes on one core, CPU time unless it says wall) unless it names
another file:

- `cpu_fusion`: `fuse_values` / `fuse_cotangents`, identity primitives lowered on CPU as one
  variadic `reduce`, so XLA:CPU computes all of a step's outputs (and, in reverse mode, its
  cotangents) in one loop. Lorenz sweep, 1e5 members, RK4, float32: 102.6 ms per call with,
  171.9 ms without; bitwise the same.
- `callable_key`: `by_code`, user functions compared by their code and captured values, so a
  lambda re-created at every call does not recompile. The same sweep at 1e4 members with a new
  `output=` lambda per call: 60 ms wall with, 2.2 s without.
- `operation_count`: the arithmetic of a jaxpr, counted before compiling; `fit(compilation="auto")`
  compiles a problem quickly below 5·10⁸ operations and fully optimised above. The `fit` suite's
  first fit in a fresh process: 1.00 s, against 1.93 s compiled optimised (large models keep
  the optimised compile: 147 against 1,276 ms per fit, `2026-11-27-fit.md`).
- `program_cache`: `fit`'s solve kept traced and lowered (`jax.export`) next to JAX's persistent
  cache. The `fit` suite's first fit with a warm cache: 0.35 s with, 0.71 s without.
- `compilation_cache`: `sciax.enable_compilation_cache()`, JAX's persistent cache in a per-user
  directory, on in `sciax run`. `sciax run sims/lorenz.toml` computes for 0.72 s with a warm
  cache, 2.49 s with `--no-compilation-cache`.
- `async_dispatch`: `async_filter_jit`, Equinox's argument split on a plain `jax.jit`. Kept as
  the one filtered jit that takes per-program XLA `compiler_options` (`eqx.filter_jit` takes
  none): `sweep`'s CPU chunk is compiled without CSE, so a member's bits do not depend on the
  device count or chunk layout (`tests/test_sharding.py::test_sharded_equals_unsharded_beyond_lorenz`
  fails with CSE on; a process-wide `XLA_FLAGS` would change every other program). It also
  returns once a program is queued, which on CPU buys nothing measurable (`sciax run
  sims/lorenz.toml` 0.717 s against 0.725 s, a sweep in 8 chunks 0.556 s against 0.561 s;
  accelerators not measured); `equinox_errors` raises an `eqx.error_if` failure met while
  reading outputs with its message.
"""
