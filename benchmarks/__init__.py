"""Benchmarks for sciax against NumPy, PyTorch, C and peer libraries (opt-in, never part of the tests).

Run with ``python -m benchmarks --quick`` (see ``benchmarks/README.md``). This package is not
part of the installed ``sciax`` package; nothing in ``sciax`` imports it. Importing this
``__init__`` is cheap on purpose: ``python -m benchmarks`` must be able to set thread counts
and CPU affinity before NumPy, JAX or PyTorch are imported.
"""
