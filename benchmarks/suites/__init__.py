"""Benchmark suites. Each module here defines `SUITE = benchmarks.harness.Suite(...)`.

The harness lists this package to find them: a new workload is one new module, with no
change to the harness.
"""
