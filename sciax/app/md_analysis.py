"""What an MD run's outputs say: the thermo rows read back, g(r) pair counts, means with
standard errors, the diffusion coefficient from the MSD, and the run's three plots
(`thermo.png`, `rdf.png`, `msd.png`). Used by `md_run` when it packages a run."""

import io
import math

import numpy as np

COLUMNS = ("step", "time", "stage", "temperature", "kinetic", "potential", "total", "extended", "pressure",
           "volume", "msd")
FILES = {"scenario": "scenario.toml", "trajectory": "trajectory.xyz", "thermo": "thermo.csv",
         "rdf": "rdf.csv", "summary": "summary.json", "checkpoint": "checkpoint.npz",
         "thermo_plot": "thermo.png", "rdf_plot": "rdf.png", "msd_plot": "msd.png"}


def read_thermo(path):
    if not path.exists():
        return None
    with open(path) as f:
        header = f.readline()
        if not header:
            return None
        body = f.read()
    if not body.strip():
        return np.zeros((0, len(header.split(","))))
    return np.loadtxt(io.StringIO(body), delimiter=",", ndmin=2)


def rdf_counts(positions, lengths, r_max, n_bins):
    """Pair-distance histogram of one frame (each unordered pair once, minimum image, r < r_max),
    as `sciax.md.rdf_histogram` counts, from a periodic k-d tree (host, float64)."""
    from scipy.spatial import cKDTree

    x = np.mod(np.asarray(positions, np.float64), lengths)
    x = np.where(x >= lengths, x - lengths, x)
    tree = cKDTree(x, boxsize=lengths)
    pairs = tree.query_pairs(r_max, output_type="ndarray")
    d = x[pairs[:, 0]] - x[pairs[:, 1]]
    d -= lengths * np.round(d / lengths)
    r = np.sqrt(np.sum(d * d, axis=1))
    r = r[r < r_max]
    bins = np.minimum((r * (n_bins / r_max)).astype(np.int64), n_bins - 1)
    return np.bincount(bins, minlength=n_bins)


def mean_error(values) -> dict:
    """Mean and standard error of a correlated series by block averaging (10 blocks; fewer with
    fewer values): SE = std(block means) / √(blocks − 1)."""
    values = np.asarray(values, np.float64)
    n_blocks = min(10, len(values))
    if n_blocks < 2:
        return {"mean": float(values.mean()), "standard_error": None, "n_values": len(values)}
    size = len(values) // n_blocks
    means = values[:size * n_blocks].reshape(n_blocks, size).mean(axis=1)
    return {"mean": float(values.mean()), "standard_error": float(means.std() / math.sqrt(n_blocks - 1)),
            "n_values": len(values), "n_blocks": n_blocks}


def diffusion_of(rows, stage, t_start):
    """D from the MSD of the last stage's rows (Einstein fit over its second half); times from the
    stage's start `t_start`, where the MSD is 0."""
    from ..md import diffusion_coefficient

    these = rows[rows[:, 2] == stage]
    if len(these) < 4:
        return None
    t = these[:, 1] - t_start
    msd = these[:, COLUMNS.index("msd")]
    if t[0] > 0:  # the stage's first row is its second frame: its start (MSD 0) is the previous stage's last
        t, msd = np.concatenate([[0.0], t]), np.concatenate([[0.0], msd])
    try:
        fit = diffusion_coefficient(t, msd, t_min=0.5 * t[-1])
    except ValueError:
        return None
    return {"D": fit.coefficient, "slope": fit.slope, "intercept": fit.intercept, "t_min": 0.5 * t[-1],
            "time": t, "msd": msd}


def plots(driver, rows, rdf, diffusion) -> list[str]:
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    from ..plot import save_figure

    sc = driver.sc
    c = {name: rows[:, i] for i, name in enumerate(COLUMNS)}
    units = ("T*", "P (ε/σ³)", "energy (ε)", "t (τ)") if sc.units == "lj" else ("T (K)", "P (bar)", "energy (eV)",
                                                                                 "t (ps)")
    fig = Figure(figsize=(8, 9), layout="constrained")
    axes = fig.subplots(4, 1, sharex=True)
    for name in ("total", "potential", "kinetic"):
        axes[0].plot(c["time"], c[name] / driver.n, label=name)
    axes[0].set_ylabel(f"{units[2]} / atom")
    axes[0].legend(loc="best", fontsize=8)
    starts = sc.stage_times()
    drift_text = []
    for k, stage in enumerate(sc.stages):
        sel = rows[:, 2] == k
        if sel.any():
            e = c["extended"][sel]
            axes[1].plot(c["time"][sel], (e - e[0]) / driver.n, label=f"{stage.name} ({stage.integrator})")
            drift_text.append(f"{stage.name}: {(e[-1] - e[0]) / driver.n:.2e}")
    axes[1].set_ylabel(f"extended − start\n{units[2]} / atom")
    axes[1].legend(loc="best", fontsize=8, title="drift " + "; ".join(drift_text), title_fontsize=7)
    axes[2].plot(c["time"], c["temperature"])
    axes[2].set_ylabel(units[0])
    axes[3].plot(c["time"], c["pressure"])
    axes[3].set_ylabel(units[1])
    axes[3].set_xlabel(units[3])
    for ax in axes:
        for t in starts[1:]:
            ax.axvline(t, color="0.7", lw=0.8, ls="--")
    fig.suptitle(f"{sc.name}: {driver.n} atoms, {sc.precision}")
    save_figure(fig, driver.path["thermo_plot"])
    files = [FILES["thermo_plot"]]
    if rdf is not None:
        fig = Figure(figsize=(6, 4), layout="constrained")
        ax = fig.subplots()
        ax.plot(*rdf)
        ax.axhline(1.0, color="0.6", lw=0.8)
        ax.set_xlabel("r (σ)" if sc.units == "lj" else "r (Å)")
        ax.set_ylabel("g(r)")
        ax.set_title(f"{sc.name}: g(r) over {sc.stages[-1].name} ({driver.rdf_frames} frames)")
        save_figure(fig, driver.path["rdf_plot"])
        files.append(FILES["rdf_plot"])
    if diffusion is not None:
        fig = Figure(figsize=(6, 4), layout="constrained")
        ax = fig.subplots()
        ax.plot(diffusion["time"], diffusion["msd"], label="MSD")
        t = diffusion["time"]
        ax.plot(t, diffusion["slope"] * t + diffusion["intercept"], ls="--",
                label=f"fit t ≥ {diffusion['t_min']:.3g}: D = {diffusion['D']:.4g}")
        ax.set_xlabel(units[3] + f" since {sc.stages[-1].name} began")
        ax.set_ylabel("MSD (σ²)" if sc.units == "lj" else "MSD (Å²)")
        ax.legend(loc="best")
        save_figure(fig, driver.path["msd_plot"])
        files.append(FILES["msd_plot"])
    return files


# --------------------------------------------------------------------------- command line
