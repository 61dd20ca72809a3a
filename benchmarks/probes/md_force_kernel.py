"""Probe: which layout of the LJ force kernel is fastest on one CPU core (LAMMPS in.lj, N=32,000,
rc = 2.5, skin 0.3, fcc ρ* = 0.8442). Run pinned to one core, from the repository root:

    taskset -c 1 python3 benchmarks/probes/md_force_kernel.py [float32|float64] [N-file]

Each row: median (and min–max) of repeated synchronised calls of one force evaluation (energy,
forces, virial), compile apart. The neighbour list comes from scipy's cKDTree so that only the
kernel is timed; the last rows time the list (re)build of `MDSystem` itself.

`NVE=100 taskset -c 1 python3 benchmarks/probes/md_force_kernel.py float32` instead times 100 steps
of the in.lj NVE run (velocity Verlet, rebuilds by displacement, grow-and-replay on overflow) in
sciax against the JAX-MD baseline (benchmarks/baselines/md_jaxmd.py), interleaved in one process.

Record (2026-11-28, jax 0.10.2, 2-core AMD EPYC with AVX-512, one core pinned, machine shared and
heavily loaded, load average 7-16: absolute figures are 3-5x below an idle core; ratios measured
interleaved), N = 32,000, float32, one force evaluation:

    full list, (N, K, 3) gather, atom-id order          276-394 ms
    full list, per-component gathers, atom-id order     145-228 ms
    half list + scatter-add                             356-440 ms
    full list, row blocks of 128/512/2048, atom-id      48 / 41 / 48 ms
    full list, row blocks of 128/512/2048, cell-sorted  32 / 33 / 40 ms   <- kept (blocks of 128)
    full list, loop over the K slots (lax.scan)         101-117 ms

XLA's CPU backend materialises every (N, K) intermediate of a whole-list kernel (its reductions
become separate library calls); row blocks keep them in cache. NVE, 100 steps from the in.lj start
(18 list builds in both engines): float32 sciax 0.288 M atom-steps/s vs JAX-MD 0.057 M (5.0x);
float64 sciax 0.105 M vs JAX-MD 0.016 M (6.6x).
"""
import os
import sys
import time

sys.path.insert(0, ".")
# isort: off
import sciax  # noqa: F401  (first, as a user script would: any settings it applies at import come before JAX starts)
import jax
import jax.numpy as jnp
import numpy as np
from scipy.spatial import cKDTree
# isort: on

jax.config.update("jax_enable_x64", True)
from sciax import md  # noqa: E402

DTYPE = jnp.dtype(sys.argv[1] if len(sys.argv) > 1 else "float32")
FILE = sys.argv[2] if len(sys.argv) > 2 else "benchmarks/data/lammps_inlj/fcc_32000.npz"
REPEATS = int(os.environ.get("REPEATS", "20"))
RC, SKIN = 2.5, 0.3


def timeit(f, *args):
    out = jax.block_until_ready(f(*args))  # compile
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t0)
    return np.median(times), min(times), max(times), out


def lj_r2(r2):
    inside = r2 < RC * RC
    s = jnp.where(inside, r2, RC * RC)
    s6 = (1.0 / s) ** 3
    return jnp.where(inside, 4 * (s6 * s6 - s6), 0.0)


def minimum_image(d, L):
    return d - L * jnp.round(d / L)


def full_aos(x, idx, L):
    n = x.shape[0]
    valid = idx < n
    d = minimum_image(x[:, None, :] - x[jnp.where(valid, idx, 0)], L)
    r2 = jnp.where(valid, jnp.sum(d * d, -1), jnp.inf)
    e, de = jax.jvp(lj_r2, (r2,), (jnp.ones_like(r2),))
    f = -2 * jnp.einsum("ij,ija->ia", de, d)
    w = -jnp.einsum("ij,ija,ijb->ab", de, d, d)
    return 0.5 * jnp.sum(e), f, w


def full_soa(x, idx, L):
    """Components gathered separately: three (N, K) gathers of scalars, no (N, K, 3) array."""
    n = x.shape[0]
    valid = idx < n
    safe = jnp.where(valid, idx, 0)
    comps = [minimum_image(x[:, a][:, None] - x[:, a][safe], L) for a in range(3)]
    r2 = jnp.where(valid, comps[0] ** 2 + comps[1] ** 2 + comps[2] ** 2, jnp.inf)
    e, de = jax.jvp(lj_r2, (r2,), (jnp.ones_like(r2),))
    f = jnp.stack([-2 * jnp.sum(de * c, 1) for c in comps], -1)
    w = jnp.stack([jnp.stack([-jnp.sum(de * a * b) for b in comps]) for a in comps])
    return 0.5 * jnp.sum(e), f, w


def full_soa_pad(x, idx, L):
    """As full_soa, but the sentinel N indexes an appended far-away row: no where on the index."""
    n = x.shape[0]
    far = jnp.full((1, 3), 0.0, x.dtype)
    xp = jnp.concatenate([x, far])
    comps = [minimum_image(x[:, a][:, None] - xp[:, a][idx], L) for a in range(3)]
    r2 = jnp.where(idx < n, comps[0] ** 2 + comps[1] ** 2 + comps[2] ** 2, jnp.inf)
    e, de = jax.jvp(lj_r2, (r2,), (jnp.ones_like(r2),))
    f = jnp.stack([-2 * jnp.sum(de * c, 1) for c in comps], -1)
    w = jnp.stack([jnp.stack([-jnp.sum(de * a * b) for b in comps]) for a in comps])
    return 0.5 * jnp.sum(e), f, w


def _block_terms(xb, idxb, x, L):
    n = x.shape[0]
    valid = idxb < n
    safe = jnp.where(valid, idxb, 0)
    comps = [minimum_image(xb[:, a][:, None] - x[:, a][safe], L) for a in range(3)]
    r2 = jnp.where(valid, comps[0] ** 2 + comps[1] ** 2 + comps[2] ** 2, jnp.inf)
    e, de = jax.jvp(lj_r2, (r2,), (jnp.ones_like(r2),))
    f = jnp.stack([-2 * jnp.sum(de * c, 1) for c in comps], -1)
    w = jnp.stack([jnp.stack([-jnp.sum(de * a * b) for b in comps]) for a in comps])
    return 0.5 * jnp.sum(e), f, w


def blocked(block):
    """Full list, rows in blocks of `block` (lax.scan): each block's temporaries stay in cache."""
    def kernel(x, idx, L):
        n, k = idx.shape
        nb = -(-n // block)
        pad = nb * block - n
        idxp = jnp.pad(idx, ((0, pad), (0, 0)), constant_values=n).reshape(nb, block, k)
        xp = jnp.pad(x, ((0, pad), (0, 0))).reshape(nb, block, 3)

        def body(carry, args):
            e, w = carry
            eb, fb, wb = _block_terms(args[0], args[1], x, L)
            return (e + eb, w + wb), fb

        zero = jnp.zeros((), x.dtype)
        (e, w), f = jax.lax.scan(body, (zero, jnp.zeros((3, 3), x.dtype)), (xp, idxp))
        return e, f.reshape(-1, 3)[:n], w
    kernel.__name__ = f"blocked_{block}"
    return kernel


def columns(x, idx, L):
    """Full list, a loop over the K neighbour slots; each step works on (N,) vectors."""
    n = x.shape[0]
    idxt = idx.T

    def body(carry, col):
        e, f, w = carry
        valid = col < n
        safe = jnp.where(valid, col, 0)
        d = minimum_image(x - x[safe], L)
        r2 = jnp.where(valid, jnp.sum(d * d, -1), jnp.inf)
        ee, de = jax.jvp(lj_r2, (r2,), (jnp.ones_like(r2),))
        return (e + 0.5 * jnp.sum(ee), f - 2 * de[:, None] * d, w - jnp.einsum("i,ia,ib->ab", de, d, d)), None

    zero = jnp.zeros((), x.dtype)
    (e, f, w), _ = jax.lax.scan(body, (zero, jnp.zeros_like(x), jnp.zeros((3, 3), x.dtype)), idxt)
    return e, f, w


def half_scatter(x, idx, L):
    """Half list (j > i only) and scatter-add of the reaction forces."""
    n = x.shape[0]
    valid = idx < n
    safe = jnp.where(valid, idx, 0)
    d = minimum_image(x[:, None, :] - x[safe], L)
    r2 = jnp.where(valid, jnp.sum(d * d, -1), jnp.inf)
    e, de = jax.jvp(lj_r2, (r2,), (jnp.ones_like(r2),))
    fij = -2 * de[..., None] * d
    f = jnp.sum(fij, 1)
    f = f.at[safe].add(-jnp.where(valid[..., None], fij, 0))
    w = -jnp.einsum("ij,ija,ijb->ab", de, d, d) * 2
    return jnp.sum(e), f, w


def lists(x, L, half):
    n = len(x)
    tree = cKDTree(np.asarray(x) % L, boxsize=L)
    pairs = tree.query_pairs(RC + SKIN, output_type="ndarray")
    if not half:
        pairs = np.concatenate([pairs, pairs[:, ::-1]])
    pairs = pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]
    counts = np.bincount(pairs[:, 0], minlength=n)
    k = counts.max()
    idx = np.full((n, k), n, np.int32)
    starts = np.cumsum(counts) - counts
    slot = np.arange(len(pairs)) - starts[pairs[:, 0]]
    idx[pairs[:, 0], slot] = pairs[:, 1]
    return idx


def spatial_order(x, L, cell):
    g = int(L // cell)
    c = np.floor(np.asarray(x) % L / L * g).astype(int).clip(0, g - 1)
    return np.lexsort((c[:, 0], c[:, 1], c[:, 2]))


def main():
    data = np.load(FILE)
    x0 = np.asarray(data["x"], np.float64)
    L = float(data["L"])
    n = len(x0)
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, N={n}, {DTYPE.name}, median of {REPEATS}")
    # a melted-ish configuration: jiggle the lattice so the list is liquid-like in size
    rng = np.random.default_rng(0)
    xs = (x0 + rng.normal(0, 0.08, x0.shape)) % L
    rows = []
    layouts = [] if os.environ.get("ONLY_SCIAX") else [("atom-id order", np.arange(n)),
                                                       ("cell-sorted order", spatial_order(xs, L, RC + SKIN))]
    for order_name, order in layouts:
        xo = xs[order]
        x = jnp.asarray(xo, DTYPE)
        Lj = jnp.asarray(L, DTYPE)
        full = jnp.asarray(lists(xo, L, half=False))
        half = jnp.asarray(lists(xo, L, half=True))
        ref = None
        for name, fn, idx in [("full list, (N,K,3) gather", full_aos, full),
                              ("full list, per-component gathers", full_soa, full),
                              ("full list, per-component, padded row", full_soa_pad, full),
                              ("full list, row blocks of 128", blocked(128), full),
                              ("full list, row blocks of 512", blocked(512), full),
                              ("full list, row blocks of 2048", blocked(2048), full),
                              ("full list, loop over slots", columns, full),
                              ("half list + scatter-add", half_scatter, half)]:
            med, lo, hi, out = timeit(jax.jit(fn), x, idx, Lj)
            if ref is None:
                ref = out
            err = float(jnp.max(jnp.abs(out[1] - ref[1])))
            rows.append((f"{order_name}: {name}", idx.shape[1], med, lo, hi, err))
            print(f"{rows[-1][0]:60s} K={idx.shape[1]:3d} {1e3 * med:8.2f} ms ({1e3 * lo:.2f}-{1e3 * hi:.2f})"
                  f"  {n / med / 1e6:6.2f} M atom-evals/s  max|dF|={err:.1e}", flush=True)
    # sciax itself: compute and the Verlet-list build
    x = jnp.asarray(xs, DTYPE)
    system = md.MDSystem(md.Box(jnp.asarray(L, DTYPE)), md.LennardJones(cutoff=RC), jnp.ones(n, DTYPE),
                         neighbours=md.VerletList(skin=SKIN)).allocate(x)
    build = jax.jit(lambda s, p: s.build_neighbours(p))
    med, lo, hi, nbrs = timeit(build, system, x)
    k = nbrs.indices.shape[1]
    print(f"{'sciax VerletList build':60s} K={k:3d} {1e3 * med:8.2f} ms ({1e3 * lo:.2f}-{1e3 * hi:.2f})")
    comp = jax.jit(lambda s, p, nb: s.compute(p, nb))
    med, lo, hi, _ = timeit(comp, system, x, nbrs)
    print(f"{'sciax MDSystem.compute':60s} K={k:3d} {1e3 * med:8.2f} ms ({1e3 * lo:.2f}-{1e3 * hi:.2f})")


def nve_throughput(n_steps=100):
    """Atom-steps/s of an in.lj NVE run (velocity Verlet, rebuilds by displacement) in sciax and in
    the JAX-MD baseline (benchmarks/baselines/md_jaxmd.py), same start, same process."""
    from benchmarks.baselines.md_jaxmd import JaxMDLJ

    data = np.load(FILE)
    L = float(data["L"])
    x0 = jnp.asarray(np.asarray(data["x"]) % L, DTYPE)
    v0 = jnp.asarray(data["v"], DTYPE)
    n = len(x0)
    dt = jnp.asarray(0.005, DTYPE)
    system = md.MDSystem(md.Box(jnp.asarray(L, DTYPE)), md.LennardJones(cutoff=RC), jnp.ones(n, DTYPE),
                         neighbours=md.VerletList(skin=SKIN)).allocate(x0)

    def make(system):
        @jax.jit
        def run(x, v):
            nbrs = system.build_neighbours(x)
            forces = system.compute(x, nbrs).forces

            def body(_, carry):
                x, v, f, nbrs = carry
                v = v + 0.5 * dt * f
                x, _ = system.box.wrap(x + dt * v)
                nbrs = system.update_neighbours(x, nbrs)
                f = system.compute(x, nbrs).forces
                return x, v + 0.5 * dt * f, f, nbrs

            x, v, f, nbrs = jax.lax.fori_loop(0, n_steps, body, (x, v, forces, nbrs))
            return x, v, system.compute(x, nbrs).energy, nbrs
        return run

    run = make(system)
    out = jax.block_until_ready(run(x0, v0))
    while int(out[3].overflow):  # grow and replay, as the driver does
        system = system.grow(out[3])
        run = make(system)
        out = jax.block_until_ready(run(x0, v0))
    base = JaxMDLJ(np.asarray(x0), np.asarray(v0), L)
    base.prepare(n_steps)
    times = {"sciax": [], "jax-md": []}
    for _ in range(max(3, REPEATS // 4)):
        t0 = time.perf_counter()
        out = jax.block_until_ready(run(x0, v0))
        times["sciax"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ref = jax.block_until_ready(base.run(n_steps))
        times["jax-md"].append(time.perf_counter() - t0)
    print(f"NVE {n_steps} steps, N={n}, {DTYPE.name}: sciax builds={int(out[3].n_builds)} "
          f"E/N={float(out[2]) / n:.6f}; jax-md builds={int(ref[4])} E/N={float(ref[2]) / n:.6f}")
    for name, ts in times.items():
        med = np.median(ts)
        print(f"  {name:8s} {med:7.3f} s  ({min(ts):.3f}-{max(ts):.3f})  {n * n_steps / med / 1e6:6.3f} M atom-steps/s")


if __name__ == "__main__":
    if os.environ.get("NVE"):
        nve_throughput(int(os.environ["NVE"]))
    else:
        main()
