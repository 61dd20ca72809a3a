"""Baseline implementations of the benchmark workloads: NumPy, PyTorch, JAX by hand, Diffrax, C.

Each baseline solves the same problem as sciax from the same initial state with the same
arithmetic (the same Runge–Kutta tableau and step), and `tests/test_baselines.py` checks that
it gives the same numbers, so a speed ratio compares equal work. PyTorch, torchdiffeq and gcc
are optional: their modules import them lazily and the suites report them as skipped when
they are missing.
"""
