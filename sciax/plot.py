"""Matplotlib pictures of trajectories.

Figures are built with `matplotlib.figure.Figure` directly (no `pyplot`, no global backend
switch), so this works headless and in notebooks alike; `save_figure` writes PNG with the Agg
renderer, atomically.

What `plot_trajectory` draws, by the shape of the state:

- ODE with 3 components (Lorenz, SIR, ...): the 3-D phase portrait, and each component vs time.
- ODE with 2 components (Van der Pol, pendulum, ...): the phase portrait, and each component vs time.
- Particles in 2-D or 3-D (Kepler, N-body): the orbits in the x–y plane, and positions vs time.
- Particles in 1-D (harmonic oscillator): the (q, v) phase portrait, and q vs time.
- Anything else: each state component vs time (at most 12 lines).

A third panel shows the observables: the relative error (q(t) − q(0)) / |q(0)| of each
conserved quantity named in `conserved` (the absolute error when q(0) is zero up to rounding;
for a vector quantity |q(t) − q(0)| / |q(0)| with the Euclidean norm), and the value of any
other observable. An observable may be a pytree (tuple, dict, ...) of per-frame arrays: each
leaf is drawn on its own, labelled by its path (`pair[0]`, `d['a']`), and a conserved pytree
gets one error curve per leaf.
"""

import jax.tree_util as jtu
import numpy as np
from matplotlib.figure import Figure

from ._validation import positive_int
from .io._atomic import atomic_write
from .io._drift import drift_errors

_MAX_LINES = 12


def _np_states(states):
    """`("array", (F, n))`, `("particles", positions (F, N, d), velocities)` or `("tree", [(name, (F, k))])`."""
    if hasattr(states, "positions") and hasattr(states, "velocities"):
        q, v = np.asarray(states.positions), np.asarray(states.velocities)
        return "particles", q.reshape(q.shape[0], -1, q.shape[-1]), v.reshape(v.shape[0], -1, v.shape[-1])
    if isinstance(states, np.ndarray) or hasattr(states, "__array__"):
        a = np.asarray(states)
        if a.ndim == 2:
            return "array", a, None
        return "tree", [("y", a.reshape(a.shape[0], -1))], None
    return "tree", [(path.lstrip(".") or "y", x) for path, x in _leaf_matrices(states)], None


def _leaf_matrices(tree):
    """`[(path, (F, k) array)]`: each leaf of a pytree of per-frame arrays (frames first) as a
    frames × entries matrix, with its path as `jax.tree_util.keystr` writes it (`[0]`, `['a']`,
    `.x`; `""` when `tree` is a single array)."""
    out = []
    for path, x in jtu.tree_flatten_with_path(tree)[0]:
        x = np.asarray(x)
        out.append((jtu.keystr(path), x.reshape(x.shape[0], -1)))
    return out


def _stride(n_frames: int, max_points: int) -> int:
    return max(1, -(-n_frames // max_points))


def _components_vs_time(fig, spec, t, y, names, title="state"):
    """Stacked axes (<= 4 components) or one axes with several lines."""
    n = y.shape[1]
    if n <= 4:
        sub = spec.subgridspec(n, 1, hspace=0.08)
        axes = []
        for i in range(n):
            ax = fig.add_subplot(sub[i], sharex=axes[0] if axes else None)
            ax.plot(t, y[:, i], lw=0.8, color=f"C{i}")
            ax.set_ylabel(names[i])
            if i < n - 1:
                ax.tick_params(labelbottom=False)
            axes.append(ax)
        axes[0].set_title(f"{title} vs time")
        axes[-1].set_xlabel("t")
        return axes
    ax = fig.add_subplot(spec)
    for i in range(min(n, _MAX_LINES)):
        ax.plot(t, y[:, i], lw=0.8, label=names[i])
    shown = "" if n <= _MAX_LINES else f" (first {_MAX_LINES} of {n})"
    ax.set_title(f"{title} vs time{shown}")
    ax.set_xlabel("t")
    ax.legend(fontsize="small", ncol=2)
    return [ax]


def _phase_portrait_3d(fig, spec, y, names):
    ax = fig.add_subplot(spec, projection="3d")
    ax.plot(y[:, 0], y[:, 1], y[:, 2], lw=0.4, color="C0")
    ax.scatter(*y[0, :3], color="C3", s=12, label="start")
    ax.set_xlabel(names[0])
    ax.set_ylabel(names[1])
    ax.set_zlabel(names[2])
    ax.set_title("phase portrait")
    ax.legend(fontsize="small", loc="upper left")
    return ax


def _phase_portrait_2d(fig, spec, x, y, xlabel, ylabel):
    ax = fig.add_subplot(spec)
    ax.plot(x, y, lw=0.6, color="C0")
    ax.plot(x[:1], y[:1], "o", color="C3", ms=4, label="start")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title("phase portrait")
    ax.legend(fontsize="small")
    return ax


def _orbits(fig, spec, q):
    """x–y projection of each particle's path."""
    ax = fig.add_subplot(spec)
    n = q.shape[1]
    for i in range(min(n, _MAX_LINES)):
        ax.plot(q[:, i, 0], q[:, i, 1], lw=0.6, color=f"C{i % 10}")
        ax.plot(q[:1, i, 0], q[:1, i, 1], "o", ms=4, color=f"C{i % 10}")
    if n == 1:
        ax.plot([0.0], [0.0], "+", color="k", ms=8, label="origin")
        ax.legend(fontsize="small")
    ax.set_aspect("equal", adjustable="datalim")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    shown = "" if n <= _MAX_LINES else f" (first {_MAX_LINES} of {n} particles)"
    ax.set_title(("orbit" if n == 1 else "orbits") + (" (x–y projection)" if q.shape[2] > 2 else "") + shown)
    return ax


def _observables_panel(fig, spec, t, observables: dict, conserved):
    """`observables`: name -> `[(label, (F, k) values)]`, one entry per leaf of the observable."""
    ax = fig.add_subplot(spec)
    conserved = [k for k in conserved if k in observables]
    others = [k for k in observables if k not in conserved]
    n_lines = 0
    for name in conserved:
        for label, values in observables[name]:
            err, scale = drift_errors(values)
            if values.shape[1] == 1 and scale is not None:  # keep the sign for scalars
                v = values[:, 0].astype(np.float64)
                err, kind = (v - v[0]) / scale, "(q − q₀)/|q₀|"
            elif values.shape[1] == 1:
                v = values[:, 0].astype(np.float64)
                err, kind = v - v[0], "q − q₀ (q₀ ≈ 0)"
            else:
                kind = "|q − q₀|/|q₀|" if scale is not None else "|q − q₀| (q₀ ≈ 0)"
            ax.plot(t, err, lw=0.8, color=f"C{n_lines % 10}", label=f"{label}: {kind}")
            n_lines += 1
    for name in others:
        columns = [(label + (f"[{k}]" if v.shape[1] > 1 else ""), v[:, k])
                   for label, v in observables[name] for k in range(v.shape[1])]
        for label, y in columns[:3]:  # at most 3 lines per observable
            ax.plot(t, np.asarray(y, dtype=np.float64), lw=0.8, ls="--", color=f"C{n_lines % 10}", label=label)
            n_lines += 1
    ax.set_xlabel("t")
    ax.set_title("relative error of conserved quantities" if conserved and not others else "observables")
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax.legend(fontsize="small")
    return ax


def plot_trajectory(traj, *, system=None, conserved=(), title=None, component_names=None,
                    max_points: int = 50_000) -> Figure:
    """A figure of a trajectory: phase portrait or orbit, components vs time, observables.

    **Arguments:**

    - `traj`: a `sciax.Trajectory` (JAX or NumPy arrays; one trajectory, not an ensemble) with states.
    - `system`: the system, for the title and, without `component_names`, the component
      labels (its `component_names`, e.g. S, I, R) (optional).
    - `conserved`: names of observables to draw as relative error from their initial value
      (one curve per leaf of a pytree observable).
    - `title`: figure title. `component_names`: names of the components of an ODE state.
    - `max_points`: frames are thinned to at most this many points per line.

    **Returns:** a `matplotlib.figure.Figure` (save it with `save_figure` or `fig.savefig`).
    """
    max_points = positive_int("max_points", max_points, where="plot_trajectory")
    times = np.asarray(traj.times)
    if times.ndim != 1:
        raise ValueError(f"plot_trajectory draws one trajectory; got times of shape {times.shape} "
                         "(index the ensemble first).")
    if len(times) == 0:
        raise ValueError("plot_trajectory: the trajectory has no frames (times has length 0); nothing to draw.")
    if traj.states is None:
        raise ValueError("plot_trajectory needs states; this trajectory was made with save_states=False.")
    step = _stride(len(times), max_points)
    t = times[::step]
    kind, a, b = _np_states(traj.states)
    observables = {name: [(name + path, x[::step]) for path, x in _leaf_matrices(v)]
                   for name, v in (traj.observables or {}).items()}
    has_obs = bool(observables)

    if kind == "array":
        a = a[::step]
        n_cols = (2 if a.shape[1] in (2, 3) else 1) + has_obs
    elif kind == "particles":
        a, b = a[::step], b[::step]
        n_cols = 2 + has_obs
    else:
        a = [(name, y[::step]) for name, y in a]
        n_cols = 1 + has_obs

    if component_names is None and system is not None:
        component_names = getattr(system, "component_names", None)
    with np.errstate(over="ignore", invalid="ignore"):  # a blown-up run may hold huge values
        fig = _draw(kind, a, b, t, n_cols, names_in=component_names, observables=observables,
                    conserved=conserved)
    if title is None and system is not None:
        title = type(system).__name__
    if title:
        fig.suptitle(title)
    return fig


def _draw(kind, a, b, t, n_cols, *, names_in, observables, conserved) -> Figure:
    has_obs = bool(observables)
    fig = Figure(figsize=(5.2 * n_cols, 4.6), layout="constrained")
    grid = fig.add_gridspec(1, n_cols)
    col = 0
    if kind == "array":
        n = a.shape[1]
        names = list(names_in) if names_in is not None and len(names_in) == n else [f"y[{i}]" for i in range(n)]
        if n == 3:
            _phase_portrait_3d(fig, grid[col], a, names)
            col += 1
        elif n == 2:
            _phase_portrait_2d(fig, grid[col], a[:, 0], a[:, 1], names[0], names[1])
            col += 1
        _components_vs_time(fig, grid[col], t, a, names)
        col += 1
    elif kind == "particles":
        q, v = a, b
        if q.shape[2] == 1:
            _phase_portrait_2d(fig, grid[col], q[:, 0, 0], v[:, 0, 0], "position q", "velocity v")
        else:
            _orbits(fig, grid[col], q)
        col += 1
        flat = q.reshape(q.shape[0], -1)
        if q.shape[1] == 1:
            names = ["x", "y", "z"][: q.shape[2]] if q.shape[2] <= 3 else [f"q[{i}]" for i in range(q.shape[2])]
        else:
            names = [f"q[{i},{j}]" for i in range(q.shape[1]) for j in range(q.shape[2])]
        _components_vs_time(fig, grid[col], t, flat, names, title="positions")
        col += 1
    else:
        flat = np.concatenate([y for _, y in a], axis=1)
        names = [f"{name}[{i}]" for name, y in a for i in range(y.shape[1])]
        _components_vs_time(fig, grid[col], t, flat, names)
        col += 1
    if has_obs:
        _observables_panel(fig, grid[col], t, observables, conserved)
    return fig


def save_figure(fig: Figure, path, *, dpi: int = 120) -> None:
    """Write `fig` as PNG to `path` atomically (Agg renderer; no display needed)."""
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png", dpi=dpi)
