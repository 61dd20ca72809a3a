"""How sciax compiles its programs: what is not physics, kept apart from it.

Each piece is here because it measurably speeds up a workload a user sees (the README's
`sciax run sims/lorenz.toml`, the `python -m benchmarks` suites); the evidence is the figure
named beside it (`benchmarks/results/`).

- `async_dispatch`: `async_filter_jit`, Equinox's argument split on a plain `jax.jit`, so a call
  returns once the program is queued and a host loop overlaps the device (`sciax run`,
  `sweep`'s chunks); `equinox_errors` re-raises an `eqx.error_if` failure with its message.
- `cpu_fusion`: `fuse_values` / `fuse_cotangents`, identity primitives lowered on CPU as one
  variadic `reduce`, so XLA:CPU computes a step's outputs (and cotangents) in one loop.
- `callable_key`: `by_code`, user functions compared by code and captured values, so a lambda
  re-created at every call does not recompile.
- `operation_count`: the arithmetic of a jaxpr counted before compiling; `fit(compilation="auto")`
  compiles small problems quickly and large ones fully optimised.
- `compilation_cache`: `sciax.enable_compilation_cache()`, JAX's persistent cache in a
  per-user directory (on in `sciax run`).
- `program_cache`: `fit`'s solve kept traced and lowered on disk next to that cache.
- `gc_threshold`: fewer cyclic garbage collections while a call traces and compiles.
- `cpu_vector_width`: 512-bit vectors for XLA:CPU on AVX-512 cores, set in `XLA_FLAGS` at import.
"""
