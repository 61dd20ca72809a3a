"""CPU code-generation setting applied when sciax is imported (before JAX starts its backend).

XLA's CPU compiler asks LLVM for 256-bit vectors by default, even on cores whose 512-bit units
run at full rate. 512-bit vectors give the same bits (element-wise arithmetic does not depend
on the vector width) and run the Lorenz ensemble ~1.7x faster on AVX-512 cores
(`benchmarks/results/2026-11-22-design-measurements.md`). So on CPUs that report `avx512f`, sciax adds
`--xla_cpu_prefer_vector_width=512` to `XLA_FLAGS` (in front of the user's flags).

It never overrides a vector width the user set, has no effect if JAX's backend was already
initialised before sciax was imported, and is skipped with `SCIAX_XLA_CPU_TUNING=0` (e.g. on
older Intel cores that lower their clock for 512-bit instructions).
"""

import os

_FLAG = "--xla_cpu_prefer_vector_width"


def _cpu_has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return "avx512f" in line.split()
    except OSError:
        pass
    return False


def apply_cpu_tuning() -> None:
    """Append the 512-bit vector-width flag to XLA_FLAGS when it helps and the user allows it."""
    if os.environ.get("SCIAX_XLA_CPU_TUNING", "1") == "0":
        return
    flags = os.environ.get("XLA_FLAGS", "")
    if _FLAG in flags or not _cpu_has_avx512():
        return
    # Prepended: XLA silently ignores every flag after a malformed token (a bare `name=value`
    # without `--`), so a flag appended after one would never take effect.
    os.environ["XLA_FLAGS"] = f"{_FLAG}=512 {flags}".strip()
