"""Compile and call the hand-written C reference `benchmarks/c/lorenz_rk4.c` through ctypes.

The C file is compiled at run time with the machine's gcc at ``-O3 -march=native`` (no
``-ffast-math``), so the floor is what this CPU can do with a plain optimising compiler.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).resolve().parent.parent / "c" / "lorenz_rk4.c"
CFLAGS = ("-O3", "-march=native", "-shared", "-fPIC")


def gcc_available() -> bool:
    return shutil.which("gcc") is not None


def compile_library(build_dir: Path) -> Path:
    """Build `liblorenz_rk4.so` in `build_dir`; raises `RuntimeError` with gcc's message."""
    if not gcc_available():
        raise RuntimeError("gcc not found on PATH")
    build_dir = Path(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    out = build_dir / "liblorenz_rk4.so"
    proc = subprocess.run(["gcc", *CFLAGS, str(SOURCE), "-o", str(out)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"gcc failed: {proc.stderr.strip()}")
    return out


class LorenzC:
    """The compiled reference: `LorenzC(path)(rho, u0, dt, n_steps) -> (B, 3)` final states."""

    def __init__(self, library: Path):
        self._lib = ctypes.CDLL(str(library))
        for name, ctype in (("lorenz_rk4_f32", ctypes.c_float), ("lorenz_rk4_f64", ctypes.c_double)):
            fn = getattr(self._lib, name)
            ptr = ctypes.c_void_p
            fn.argtypes = [ptr, ptr, ptr, ptr, ctypes.c_ssize_t, ctype, ctype, ctype, ctypes.c_long]
            fn.restype = None
        for name in ("fma_peak_f32", "fma_peak_f64"):
            getattr(self._lib, name).argtypes = [ctypes.c_long]
            getattr(self._lib, name).restype = ctypes.c_double

    def __call__(self, rho: np.ndarray, u0=(1.0, 0.0, 0.0), *, dt: float = 0.001, n_steps: int = 1000,
                 sigma: float = 10.0, beta: float = 8.0 / 3.0) -> np.ndarray:
        rho = np.ascontiguousarray(rho)
        dtype = rho.dtype
        fn = {np.dtype(np.float32): self._lib.lorenz_rk4_f32,
              np.dtype(np.float64): self._lib.lorenz_rk4_f64}[dtype]
        n = rho.shape[0]
        x, y, z = (np.full(n, float(c), dtype=dtype) for c in u0)
        fn(x.ctypes.data, y.ctypes.data, z.ctypes.data, rho.ctypes.data, n, sigma, beta, dt, n_steps)
        return np.stack([x, y, z], axis=-1)

    def peak_flops(self, dtype, *, iters: int = 20_000_000, repeats: int = 3) -> float:
        """This core's measured FMA throughput in flop/s for `dtype` (median of `repeats`)."""
        fn = {np.dtype(np.float32): self._lib.fma_peak_f32, np.dtype(np.float64): self._lib.fma_peak_f64}
        return float(np.median([fn[np.dtype(dtype)](iters) for _ in range(repeats)]))
