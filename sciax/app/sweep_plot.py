"""The picture of a sweep (`plot.png`): a bifurcation-diagram-like scatter of local maxima for one
axis, a heat map of one final-state component over two grid axes, a median and quantile band
(or mean and std) over time for trajectories reduced over members, or one final component
against one axis; `plot = "auto"` picks by the sweep's shape and output."""

import numpy as np

from .sweep_settings import SweepSettings, reduced_dims


def plot_kind(job: SweepSettings, reductions: dict) -> str | None:
    kind = job.plot["kind"]
    if kind != "auto":
        return None if kind == "none" else kind
    if job.output == "trajectory" and reductions:
        return "band"
    if job.output in ("maxima", "trajectory") and len(job.axes) == 1:
        return "bifurcation"
    if job.output == "final_state" and job.mode == "grid" and len(job.axes) == 2:
        return "heatmap"
    if job.output == "final_state" and len(job.axes) == 1:
        return "line"
    return None


def plot(scenario, built, outputs, ok, reductions, times, path) -> str | None:
    """Write `path`; returns None, or why there is no plot for this sweep."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..plot import save_figure

    job = scenario.job
    kind = plot_kind(job, reductions)
    if kind is None:
        path.unlink(missing_ok=True)
        return f"plot = \"{job.plot['kind']}\" (\"auto\" draws one axis with maxima, trajectories or final states; " \
               "two grid axes with final states; trajectories with reductions)"
    c, label = job.component, job.component_name
    names = list(job.axes)
    components = getattr(built.system, "component_names", None) or ()

    def axis_label(a):
        if a.startswith("state0[") and a[7:-1].isdigit() and int(a[7:-1]) < len(components):
            return f"initial {components[int(a[7:-1])]} ({a})"
        return a
    fig, ax = plt.subplots(figsize=(8, 5))
    title = f"{scenario.name}: {scenario.system_name}, {job.n_members} members"
    if kind == "bifurcation":
        if len(names) != 1:
            raise ValueError(f"a bifurcation plot needs one axis, this sweep has {len(names)} ({', '.join(names)})")
        x = job.axes[names[0]]
        if "maxima" in outputs:
            peaks = outputs["maxima"]
        else:
            z, t = outputs["states"][..., c], times
            after = t[1:-1] > (t[0] + job.transient)
            inner = z[:, 1:-1]
            peaks = np.where((inner > z[:, :-2]) & (inner >= z[:, 2:]) & after, inner, np.nan)
        rows, cols = np.nonzero(np.isfinite(peaks) & ok.reshape(-1, *([1] * (peaks.ndim - 1))))
        ax.plot(x[rows], peaks[rows, cols], ",k", alpha=0.5)
        ax.set(xlabel=axis_label(names[0]), ylabel=f"local maxima of {label}",
               title=f"{title}; maxima after t = {job.transient:g}")
    elif kind == "heatmap":
        if job.mode != "grid" or len(names) != 2 or "final_state" not in outputs:
            raise ValueError("a heat map needs two grid axes and output = \"final_state\"")
        value = np.where(ok, outputs["final_state"][..., c], np.nan)
        cmap = "viridis"
        if job.plot["periodic"]:
            value, cmap = np.angle(np.exp(1j * value)), "twilight"
        a, b = (job.axes[n] for n in names)
        image = ax.pcolormesh(a, b, value.T, shading="nearest", cmap=cmap,
                              **({"vmin": -np.pi, "vmax": np.pi} if job.plot["periodic"] else {}))
        fig.colorbar(image, ax=ax, label=f"final {label}" + (" (wrapped to (-pi, pi])" if job.plot["periodic"] else ""))
        ax.set(xlabel=axis_label(names[0]), ylabel=axis_label(names[1]), title=title)
        ax.set_aspect("equal" if np.ptp(job.axes[names[0]]) == np.ptp(job.axes[names[1]]) else "auto")
    elif kind == "line":
        x = job.axes[names[0]]
        ax.plot(x, np.where(ok, outputs["final_state"][..., c], np.nan), ".-")
        ax.set(xlabel=axis_label(names[0]), ylabel=f"final {label}", title=title)
    else:  # band
        if times is None or not reductions:
            raise ValueError("a band needs output = \"trajectory\" and reduce or quantiles")
        kept = [a for a in job.dims if a not in reduced_dims(job)]
        groups = [()] if not kept else list(np.ndindex(*(len(job.axes[a]) for a in kept)))[:8]
        for g, color in zip(groups, plt.rcParams["axes.prop_cycle"].by_key()["color"]):
            tag = ", ".join(f"{a} = {job.axes[a][i]:.4g}" for a, i in zip(kept, g))
            pick = lambda key, g=g: reductions[key][g][..., c] if key in reductions else None  # noqa: E731
            q = reductions.get("quantiles.states")
            if q is not None:
                q = q[g][..., c]
                for lo in range(len(job.quantiles) // 2):
                    hi = len(job.quantiles) - 1 - lo
                    ax.fill_between(times, q[lo], q[hi], color=color, alpha=0.15 + 0.15 * lo,
                                    label=f"{job.quantiles[lo]:g} to {job.quantiles[hi]:g} quantiles {tag}".strip())
            centre = pick("median.states")
            if centre is None and q is not None and 0.5 in job.quantiles:
                centre = q[job.quantiles.index(0.5)]
            if centre is not None:
                ax.plot(times, centre, color=color, lw=2, label=f"median {tag}".strip())
            mean, std = pick("mean.states"), pick("std.states")
            if mean is not None:
                ax.plot(times, mean, color=color, lw=1, ls="--", label=f"mean {tag}".strip())
                if std is not None and q is None:
                    ax.fill_between(times, mean - std, mean + std, color=color, alpha=0.25, label="mean +- std")
        over = "members" if job.mode == "zip" else ", ".join(reduced_dims(job))
        ax.set(xlabel="time", ylabel=label, title=f"{title} (over {over})")
        ax.legend(fontsize="small")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return None
