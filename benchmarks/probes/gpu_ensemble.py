"""GPU probe, run once (2026-11-22, one NVIDIA H200, jax 0.11.2): the Lorenz-ensemble figures in
benchmarks/results/2026-11-22-gpu-h200.md. Kept as the record of how they were produced;
`python -m benchmarks --device gpu` is the maintained benchmark. From the repository root:
`python3 benchmarks/probes/gpu_ensemble.py [function names, e.g. sciax_vmap hand_scan]`, with
BIG / MID setting the two ensemble sizes (default 8,388,608 and 1,000,000). Each row's median of
10 (5 for the sweep, Diffrax and PyTorch) synchronised calls, compile apart; the final states of
512 members are compared with float64 NumPy."""
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import diffrax
import equinox
import jax
import jax.numpy as jnp
import numpy as np
import optimistix
from jax import lax

print("python", sys.version.split()[0], "jax", jax.__version__, jax.devices(), flush=True)
print("eqx", equinox.__version__, "diffrax", diffrax.__version__, "optx", optimistix.__version__, flush=True)
jax.config.update("jax_enable_x64", True)
sys.path.insert(0, ".")
import sciax
from benchmarks import workloads as wl
from benchmarks.baselines import numpy_lorenz
from sciax.integrators import RK4, Tsit5
from sciax.systems import Lorenz

OUT = os.environ.get("OUT", "/tmp")
rows = []


def seconds(f):
    """f's result and its wall time in seconds (f returns once its result is computed)."""
    t0 = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t0


def timeit(f, reps=10):
    """(median, min, max) seconds of `reps` calls of f after one warm-up call."""
    def done():
        return jax.block_until_ready(f())

    done()
    ts = [seconds(done)[1] for _ in range(reps)]
    return float(np.median(ts)), float(min(ts)), float(max(ts))


def compiled(fn, *args):
    """jit(fn) compiled for args, and the compile time in seconds."""
    return seconds(lambda: jax.jit(fn).lower(*args).compile())


def report(name, method, dtype, B, comp, t, out=None):
    med, lo, hi = t
    r = dict(name=name, method=method, dtype=str(np.dtype(dtype)), B=B, compile_s=comp, median_s=med,
             min_s=lo, max_s=hi, tps=B * 1000 / med)
    if out is not None:
        out = np.asarray(out, np.float64)
        idx = np.linspace(0, B - 1, 512).astype(int)
        ref = numpy_lorenz.lorenz_ensemble(np.linspace(0.0, 21.0, B)[idx], wl.ENSEMBLE_U0, dt=0.001,
                                           n_steps=1000, method=method)
        r["relerr_vs_np64"] = float(np.max(np.abs(out[idx] - ref)) / np.max(np.abs(ref)))
    rows.append(r)
    print(json.dumps(r), flush=True)


def sciax_vmap(method, dtype, B):
    integ = {"rk4": RK4(), "tsit5": Tsit5()}[method]
    u0 = jnp.asarray(wl.ENSEMBLE_U0, dtype)

    def one(rho):
        s = Lorenz(sigma=jnp.asarray(10.0, dtype), rho=rho, beta=jnp.asarray(8 / 3, dtype))
        return sciax.simulate(s, u0, integrator=integ, dt=0.001, n_steps=1000, save_every=1000).final_state

    rho = jnp.asarray(wl.ensemble_rhos(B, dtype))
    c, comp = compiled(jax.vmap(one), rho)
    t = timeit(lambda: c(rho))
    report("sciax jit(vmap(simulate))", method, dtype, B, comp, t, c(rho))


def sciax_sweep(method, dtype, B):
    integ = {"rk4": RK4(), "tsit5": Tsit5()}[method]
    s = Lorenz(sigma=jnp.asarray(10.0, dtype), rho=jnp.asarray(0.0, dtype), beta=jnp.asarray(8 / 3, dtype))
    u0 = jnp.asarray(wl.ENSEMBLE_U0, dtype)
    rho = jnp.asarray(wl.ensemble_rhos(B, dtype))

    def fs(tr):
        return tr.final_state

    kw = dict(integrator=integ, dt=0.001, n_steps=1000, save_every=1000)

    def call():
        return sciax.sweep(s, u0, axes={"rho": rho}, rollout=sciax.Simulate(**kw), output=fs,
                           check_finite=False).outputs

    out, first = seconds(lambda: jax.block_until_ready(call()))
    t = timeit(call, reps=5)
    report("sciax.sweep", method, dtype, B, first - t[0], t, out)


def hand_scan(method, dtype, B, unroll):
    """Hand-written SoA scan (RK4 or Tsit5 tableau) with lax.scan unroll."""
    dt = jnp.asarray(0.001, dtype)

    def f(x, y, z, r):
        return 10.0 * (y - x), x * (r - z) - y, x * y - (8 / 3) * z

    if method == "rk4":
        A = [[], [0.5], [0.0, 0.5], [0.0, 0.0, 1.0]]
        b = [1 / 6, 1 / 3, 1 / 3, 1 / 6]
    else:
        tab = diffrax.Tsit5.tableau
        A = [[]] + [list(map(float, a)) for a in tab.a_lower]
        b = list(map(float, tab.b_sol))

    def run(r):
        def step(u, _):
            ks = []
            for i in range(len(A)):
                ui = tuple(u[c] + dt * sum((A[i][j] * ks[j][c] for j in range(i) if A[i][j] != 0.0),
                                           jnp.zeros((), dtype)) for c in range(3))
                ks.append(f(*ui, r))
            return tuple(u[c] + dt * sum(b[j] * ks[j][c] for j in range(len(b)) if b[j] != 0.0)
                         for c in range(3)), None

        u = tuple(jnp.full(r.shape, v, dtype) for v in wl.ENSEMBLE_U0)
        u, _ = lax.scan(step, u, None, length=1000, unroll=unroll)
        return jnp.stack(u, -1)

    rho = jnp.asarray(wl.ensemble_rhos(B, dtype))
    c, comp = compiled(run, rho)
    t = timeit(lambda: c(rho))
    report(f"hand scan unroll={unroll}", method, dtype, B, comp, t, c(rho))


def diffrax_vmap(method, dtype, B):
    from benchmarks.baselines.diffrax_lorenz import make_ensemble
    fn = make_ensemble(method, dtype)
    rho = jnp.asarray(wl.ensemble_rhos(B, dtype))
    c, comp = seconds(lambda: fn.lower(rho).compile())
    t = timeit(lambda: c(rho), reps=5)
    report("Diffrax vmap(diffeqsolve)", method, dtype, B, comp, t, c(rho))


def torch_run(method, dtype, B, compile):
    import torch

    from benchmarks.baselines.torch_lorenz import TorchLorenzEnsemble
    solver = TorchLorenzEnsemble(method, compile=compile, u0=wl.ENSEMBLE_U0, dt=0.001, n_steps=1000)
    rho = torch.as_tensor(wl.ensemble_rhos(B, dtype), device="cuda")

    def call():
        out = torch.stack(solver(rho), -1)
        torch.cuda.synchronize()
        return out

    first = seconds(call)[1]
    timed = [seconds(call) for _ in range(5)]
    out = timed[-1][0]
    ts = [t for _, t in timed]
    report("torch.compile" if compile else "PyTorch eager", method, dtype, B, first - np.median(ts),
           (float(np.median(ts)), min(ts), max(ts)), out.cpu().numpy())


BIG = int(os.environ.get("BIG", 8_388_608))
MID = int(os.environ.get("MID", 1_000_000))
plan = [
    (sciax_vmap, ("tsit5", np.float32, BIG)), (sciax_vmap, ("rk4", np.float32, BIG)),
    (sciax_vmap, ("tsit5", np.float32, MID)), (sciax_vmap, ("rk4", np.float32, MID)),
    (sciax_sweep, ("tsit5", np.float32, BIG)), (sciax_sweep, ("tsit5", np.float32, MID)),
    (hand_scan, ("tsit5", np.float32, BIG, 1)), (hand_scan, ("tsit5", np.float32, BIG, 5)),
    (hand_scan, ("tsit5", np.float32, BIG, 10)), (hand_scan, ("rk4", np.float32, BIG, 10)),
    (sciax_vmap, ("tsit5", np.float64, BIG)), (sciax_vmap, ("rk4", np.float64, BIG)),
    (diffrax_vmap, ("tsit5", np.float32, MID)),
    (torch_run, ("tsit5", np.float32, MID, False)), (torch_run, ("tsit5", np.float32, BIG, True)),
    (diffrax_vmap, ("tsit5", np.float32, BIG)),
]
only = sys.argv[1:]
for fn, args in plan:
    if only and fn.__name__ not in only:
        continue
    try:
        fn(*args)
    except Exception as e:
        print("FAILED", fn.__name__, args, type(e).__name__, str(e)[:300], flush=True)
    json.dump(rows, open(f"{OUT}/probe1.json", "w"), indent=1)
subprocess.run(["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu", "--format=csv"])
