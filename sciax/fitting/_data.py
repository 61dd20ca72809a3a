"""Host-side checks of the data handed to `fit`: times, observations, mask and sigma. Every
failure names what was wrong and what was expected."""

import jax.tree_util as jtu
import numpy as np

from .._validation import describe, real_scalar


def _is_real(dtype) -> bool:
    return np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.integer)


def check_times(times, t0):
    times = np.asarray(times)
    if times.ndim != 1 or times.size == 0 or not _is_real(times.dtype):
        raise ValueError(f"fit: `times` must be a non-empty 1-D array of observation times, got {describe(times)}.")
    eps = float(np.finfo(times.dtype).eps) if np.issubdtype(times.dtype, np.floating) else 0.0
    times = times.astype(np.float64)
    if not np.all(np.isfinite(times)):
        raise ValueError(f"fit: `times` must be finite; times[{int(np.flatnonzero(~np.isfinite(times))[0])}] is not.")
    if t0 is not None:
        t0 = real_scalar("t0", t0)
        if not np.isfinite(t0):
            raise ValueError(f"fit: `t0` must be a finite time, got {t0!r}.")
        # t0 given in the times' own (e.g. float32) rounding: 0.7 -> 0.69999999 is t0.
        times[(times < t0) & (times >= t0 - eps * 8 * (abs(t0) + np.abs(times)))] = t0
    bad = np.flatnonzero(np.diff(times) <= 0)
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"fit: `times` must be strictly increasing; times[{i}] = {float(times[i]):.10g} is followed by "
            f"times[{i + 1}] = {float(times[i + 1]):.10g}. Sort the observations by time (and merge repeats)."
        )
    if t0 is None:
        t0 = float(times[0])
    if times[0] < t0:
        raise ValueError(
            f"fit: observation times must lie in the integration range [t0, ...) with t0 = {t0:.10g}; "
            f"times[0] = {float(times[0]):.10g} is before t0. Pass an earlier `t0` (with the state at that "
            "time) or drop the earlier observations."
        )
    if times[-1] <= t0:
        raise ValueError(
            f"fit: the last observation time ({float(times[-1]):.10g}) must be after t0 = {t0:.10g}: there is "
            "nothing to integrate."
        )
    return times, t0, eps


def check_observed(observed, n_times, expected, dtype):
    """Leaves of `observed` as numpy arrays, checked against the model output `expected`, and
    per leaf the entries a NumPy masked array marks as missing (None for a plain array)."""
    exp_leaves, exp_def = jtu.tree_flatten(expected)
    if isinstance(observed, list | tuple) and jtu.treedef_is_leaf(exp_def):
        observed = np.asarray(observed)  # rows of numbers (e.g. from .tolist()): one array, as measured
    leaves, treedef = jtu.tree_flatten(observed)
    if treedef != exp_def:
        raise ValueError(
            f"fit: `observed` has the structure {treedef} but `observe(state)` returns {exp_def}; pass "
            "observe=... returning what was measured (e.g. observe=lambda s: s.positions)."
        )
    out, missing = [], []
    for leaf, exp in zip(leaves, exp_leaves):
        masked = np.ma.isMaskedArray(leaf)  # np.asarray would drop the mask and fit the masked values
        arr = np.ma.getdata(leaf) if masked else np.asarray(leaf)
        if not _is_real(arr.dtype):
            raise TypeError(f"fit: `observed` must hold real numbers, got {describe(arr)}.")
        if arr.ndim == 0 or arr.shape[0] != n_times:
            raise ValueError(
                f"fit: `times` has {n_times} entries but `observed` has "
                f"{'no time axis' if arr.ndim == 0 else f'{arr.shape[0]} rows'} (shape {arr.shape}); the "
                "leading axis of `observed` must run over the observation times."
            )
        if arr.shape[1:] != tuple(exp.shape):
            raise ValueError(
                f"fit: each observation has shape {arr.shape[1:]} but `observe(state)` returns shape "
                f"{tuple(exp.shape)}; pass `observe=` to select the measured components (e.g. "
                "observe=lambda y: y[:2]) or reshape `observed` to (n_times, *shape)."
            )
        out.append(arr.astype(dtype))
        missing.append(np.ma.getmaskarray(leaf) if masked else None)
    return out, treedef, missing


def _as_leaves(value, treedef, shapes, what):
    """Broadcast `value` (None, scalar, array or pytree like `observed`) to one array per leaf."""
    if value is None:
        return None
    try:
        leaves = treedef.flatten_up_to(value)
    except (ValueError, TypeError):
        # One value for every leaf: a scalar, or anything array-like for a single leaf; never a
        # dict or other container whose structure differs from `observed`'s.
        container = not jtu.treedef_is_leaf(jtu.tree_structure(value))
        broadcast = len(shapes) == 1 and (not container or isinstance(value, list | tuple)) or \
            not container and np.ndim(value) == 0
        leaves = [value] * len(shapes) if broadcast else None
        if leaves is None:
            raise ValueError(
                f"fit: `{what}` must be a scalar, an array broadcastable to `observed`, or a pytree with "
                f"the structure of `observed`; got {describe(value)}."
            ) from None
    out = []
    for leaf, shape in zip(leaves, shapes):
        try:
            out.append(np.broadcast_to(np.asarray(leaf), shape))
        except ValueError:
            raise ValueError(
                f"fit: `{what}` of shape {np.shape(leaf)} does not broadcast to `observed` of shape {shape}."
            ) from None
    return out


def check_mask_sigma(obs_leaves, treedef, times, mask, sigma, missing):
    """The mask (`mask`, and False where a masked array in `observed` is masked) and sigma
    per leaf, checked: NaN/Inf only at missing entries, sigma real, positive and finite."""
    shapes = [x.shape for x in obs_leaves]
    mask_leaves = _as_leaves(mask, treedef, shapes, "mask")
    if mask_leaves is None:
        mask_leaves = [np.ones(s, bool) for s in shapes]
        given = False
    else:
        if not all(m.dtype == np.bool_ for m in mask_leaves):
            raise TypeError("fit: `mask` must be boolean: True where a value was observed, False where it is missing.")
        given = True
    if any(m is not None for m in missing):
        mask_leaves = [m if miss is None else m & ~miss for m, miss in zip(mask_leaves, missing)]
        given = True
    for leaf, m in zip(obs_leaves, mask_leaves):
        bad = m & ~np.isfinite(leaf)
        if np.any(bad):
            idx = np.argwhere(bad)[0]
            n = int(bad.sum())
            where = f"times[{int(idx[0])}] = {float(times[idx[0]]):.10g}"
            if len(idx) > 1:
                where += f", component {tuple(int(j) for j in idx[1:])}"
            if given:
                raise ValueError(
                    f"fit: `observed` has {n} NaN/Inf value(s) at entries marked as observed (by `mask` or "
                    f"a masked array's mask; first at {where}); mark them as missing there."
                )
            raise ValueError(
                f"fit: `observed` has {n} NaN/Inf value(s) (first at {where}) and no `mask` was given; "
                "pass mask=np.isfinite(observed) to treat them as missing data."
            )
    if not any(np.any(m) for m in mask_leaves):
        raise ValueError("fit: `mask` marks every value as missing; nothing to fit.")
    sigma_leaves = _as_leaves(sigma, treedef, shapes, "sigma")
    if sigma_leaves is not None:
        numbered = jtu.tree_unflatten(treedef, list(range(len(shapes))))
        paths = [jtu.keystr(p) for p, _ in jtu.tree_flatten_with_path(numbered)[0]]
        scalar = jtu.treedef_is_leaf(jtu.tree_structure(sigma)) and np.ndim(sigma) == 0
        for s, m, path in zip(sigma_leaves, mask_leaves, paths):
            if not _is_real(s.dtype):
                raise TypeError(
                    f"fit: `sigma` (the standard deviation of each observation) must hold real numbers, "
                    f"got {describe(s)}."
                )
            bad = ~(np.isfinite(s) & (s > 0))
            if np.any(bad):
                idx = tuple(int(i) for i in np.argwhere(bad)[0])
                at = "sigma" if scalar else f"sigma{path}{list(idx)}"
                hint = "For weights w pass sigma = 1/sqrt(w)"
                if m[idx] and np.isposinf(s[idx]):
                    hint += "; an observation of weight 0 is missing: mark it False in `mask` instead"
                raise ValueError(
                    f"fit: `sigma` (the standard deviation of each observation) must be positive and "
                    f"finite everywhere, including at masked entries; got {at} = {float(s[idx]):.10g}"
                    f"{'' if scalar else f' ({int(bad.sum())} such value(s))'}. {hint}."
                )
    return mask_leaves, sigma_leaves, given


# ---------------------------------------------------------------------------------------------
# The problem
