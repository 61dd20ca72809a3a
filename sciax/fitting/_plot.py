"""`plot_fit`: data, fitted curve and an uncertainty band from the fit's covariance."""

import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .._validation import describe
from ._result import FitResult


def plot_fit(result: FitResult, times, observed, *, mask=None, n_samples: int = 200, level: float = 0.95,
             seed: int = 0, n_points: int = 400, labels=None, components=None, title: str | None = None):
    """Draw the data, the fitted model and a `level` (default 95%) uncertainty band.

    The band is the pointwise `(1 − level)/2 … (1 + level)/2` quantile range of the model over
    `n_samples` parameter draws from the fit's Gaussian approximation: the fitted values
    (parameters and fitted initial-state entries) are drawn from N(optimum, covariance) in the
    optimiser's unconstrained space (so `Positive`/`Bounded` values stay in range), mapped to
    physical values, and integrated with the fit's own `rollout`. Multiple-shooting fits are
    drawn segment by segment from the fitted segment start states (held at their optimum).
    It shows parameter uncertainty only, not the observation noise. Draws whose model is not
    finite somewhere (parameters where the model blows up) are left out of the band, with a
    warning saying how many; with a non-finite covariance (a rank-deficient fit) there is no
    band, and a warning says so.

    **Arguments:**

    - `result`: a `FitResult` from `sciax.fit`.
    - `times`, `observed`: the data that were fitted (same layout as for `fit`).
    - `mask`: optional boolean like `observed`; False entries are not drawn (NaN never are).
    - `n_samples`: parameter draws for the band (0: no band). `level`: band probability.
    - `seed`: seed of the draws (the figure is reproducible).
    - `n_points`: about how many model points per curve.
    - `labels`: one name per drawn component; `components`: indices of the flattened observed
      components to draw (default: all, at most 8).
    - `title`: figure title.

    **Returns:** a `matplotlib.figure.Figure` (one panel per component; nothing is shown or
    saved: call `fig.savefig(path)`).
    """
    from matplotlib.figure import Figure

    if not isinstance(result, FitResult) or result.problem is None:
        raise TypeError(f"plot_fit: `result` must be the FitResult of sciax.fit, got {describe(result)}.")
    if not (0 < level < 1):
        raise ValueError(f"plot_fit: `level` must lie in (0, 1), got {level!r}.")
    if isinstance(n_samples, bool) or not isinstance(n_samples, int | np.integer) or n_samples < 0:
        raise ValueError(f"plot_fit: `n_samples` must be an int ≥ 0 (0: no band), got {describe(n_samples)}.")
    problem = result.problem
    times = np.asarray(times, dtype=np.float64)
    raw_leaves = problem.obs_treedef.flatten_up_to(observed)
    fitted_shapes = [np.shape(x) for x in problem.observed]
    if [np.shape(x) for x in raw_leaves] != fitted_shapes or times.shape != fitted_shapes[0][:1]:
        raise ValueError(
            f"plot_fit: `times` and `observed` must be the data that were fitted: times of shape "
            f"{fitted_shapes[0][:1]} and observed leaves of shapes {fitted_shapes}; got times of shape "
            f"{times.shape} and {[np.shape(x) for x in raw_leaves]}.")
    obs_leaves = [np.asarray(np.ma.getdata(x), dtype=np.float64) for x in raw_leaves]
    if mask is None:
        mask_leaves = [np.ones(x.shape, bool) for x in obs_leaves]
    else:
        try:
            mask_leaves = problem.obs_treedef.flatten_up_to(mask)
        except (ValueError, TypeError):
            mask_leaves = [mask] * len(obs_leaves)
        mask_leaves = [np.broadcast_to(np.asarray(m, bool), x.shape) for m, x in zip(mask_leaves, obs_leaves)]
    # As in fit: a NumPy masked array's masked entries are missing data, not points to draw.
    mask_leaves = [m & ~np.ma.getmaskarray(x) for m, x in zip(mask_leaves, raw_leaves)]
    data = np.concatenate([x.reshape(x.shape[0], -1) for x in obs_leaves], axis=1)
    shown = np.concatenate([m.reshape(m.shape[0], -1) for m in mask_leaves], axis=1) & np.isfinite(data)
    n_comp = data.shape[1]
    components = list(range(min(n_comp, 8))) if components is None else list(components)
    for c in components:
        if isinstance(c, bool) or not (isinstance(c, (int, np.integer)) and -n_comp <= c < n_comp):
            raise ValueError(f"plot_fit: `components` entries must be integers in -{n_comp} … {n_comp - 1} "
                             f"(the data have {n_comp} flattened components), got {c!r}.")
    components = [int(c) % n_comp for c in components]
    if labels is None:
        labels = [f"component {c}" for c in components] if n_comp > 1 else ["observed"]
    if len(labels) != len(components):
        raise ValueError(f"plot_fit: got {len(labels)} labels for {len(components)} components.")

    # Parameter draws in the unconstrained space.
    v_opt = np.asarray(result.optimum)
    q = problem.n_interest
    draws = v_opt[None]
    cov = np.asarray(result.covariance, dtype=np.float64)
    band = n_samples > 0 and np.all(np.isfinite(cov))
    if n_samples > 0 and not band:
        warnings.warn("plot_fit: the fit's covariance is not finite (a rank-deficient fit: some fitted "
                      "values are not identifiable from the data), so no uncertainty band is drawn.",
                      stacklevel=2)
    held = np.isin(np.asarray(result.labels), result.at_bounds)
    if band and held.any():
        warnings.warn(f"plot_fit: {', '.join(result.at_bounds)} lies within one standard error of a bound of its "
                      "Bounded transform, where the Gaussian approximation does not hold; the band holds it at its "
                      "fitted value.", stacklevel=2)
    if band:
        scale = np.where(held, 1.0, np.asarray(result.scale)[:q])
        cov_u = np.where(held[:, None] | held[None, :], 0.0, cov) / np.outer(scale, scale)
        w, vecs = np.linalg.eigh(0.5 * (cov_u + cov_u.T))
        root = vecs * np.sqrt(np.clip(w, 0, None))
        z = np.random.default_rng(seed).standard_normal((n_samples, q))
        u_opt = np.asarray(_to_unconstrained(problem, result.optimum))
        u = np.repeat(u_opt[None], n_samples, axis=0)
        u[:, :q] += z @ root.T
        draws = np.concatenate([draws, np.asarray(_to_physical(problem, jnp.asarray(u)))])

    dtype = result.optimum.dtype
    ends = list(result.segment_times[1:]) + [float(times[-1])]
    curves = []
    for j, (start, end) in enumerate(zip(result.segment_times, ends)):
        n_j = max(int(n_points * (end - start) / (ends[-1] - result.segment_times[0])), 8)
        plan, t_dense = problem.rollout.dense(start, end, n_j, dtype)
        values = _dense_model(problem, jnp.asarray(draws, dtype=dtype), j, plan)
        curves.append((t_dense, np.asarray(values)))
    if band:  # keep the draws whose model is finite on every segment
        finite = np.all([np.isfinite(values[1:]).all(axis=(1, 2)) for _, values in curves], axis=0)
        if not finite.all():
            band = finite.any()
            warnings.warn(f"plot_fit: {n_samples - finite.sum()} of {n_samples} parameter draws give a "
                          "non-finite model (it blows up there) and are left out of the band"
                          + ("." if band else "; no band is drawn."), stacklevel=2)
        curves = [(t_dense, values[np.concatenate([[True], finite])]) for t_dense, values in curves]

    fig = Figure(figsize=(7, 2.2 * len(components) + 0.6), layout="constrained")
    axes = fig.subplots(len(components), 1, sharex=True, squeeze=False)[:, 0]
    for ax, c, label in zip(axes, components, labels):
        for j, (t_dense, values) in enumerate(curves):
            ax.plot(t_dense, values[0, :, c], color="C0", lw=1.5, label="fit" if j == 0 else None)
            if band:
                lo, hi = np.quantile(values[1:, :, c], [(1 - level) / 2, (1 + level) / 2], axis=0)
                ax.fill_between(t_dense, lo, hi, color="C0", alpha=0.25, lw=0,
                                label=f"{100 * level:g}% band" if j == 0 else None)
        ax.plot(times[shown[:, c]], data[shown[:, c], c], "o", color="k", ms=3, label="data")
        ax.set_ylabel(label)
    axes[0].legend(loc="best", fontsize="small")
    axes[-1].set_xlabel("t")
    if title:
        fig.suptitle(title)
    return fig


@eqx.filter_jit
def _to_unconstrained(problem, v):
    return problem.to_unconstrained(v)


@eqx.filter_jit
def _to_physical(problem, u):
    return jax.vmap(problem.to_physical)(u)


@eqx.filter_jit
def _dense_model(problem, draws, segment, plan):
    """Observed components of the model on the dense plan of one segment, for every draw."""

    def one(v):
        system, flat0, segments = problem.values(v)
        start = flat0 if segment == 0 else segments[segment - 1]
        states = problem.rollout.run_plan(system, problem.layout.unflatten(start), plan, problem.args)
        out = jax.vmap(problem.observe)(states)
        return jnp.concatenate([x.reshape(x.shape[0], -1) for x in jtu.tree_leaves(out)], axis=1)

    return jax.vmap(one)(draws)
