"""Reductions over ensemble members, computed chunk by chunk while a sweep runs.

A streaming reduction keeps a small partial state per group of members (a group is one point
of the axes that are not reduced over) and merges the partial state of each chunk into it, so
a million-member sweep keeps only the reduced results:

- `partial(x, mask, groups, n_groups) -> state` for one chunk (on device, inside `jit`):
  `x` is `(B, *leaf_shape)`, `mask` `(B,)` is False for padding and failed members, `groups`
  `(B,)` is each member's group.
- `merge(a, b) -> state`: associative; used between chunks and between processes.
- `finalize(state) -> (n_groups, *result_shape)`.

Exact order statistics (`Quantile`, `Median`) and arbitrary functions of all values (`Apply`)
cannot stream in bounded memory: they keep each member's (reduced, per-member) output on the
host and compute once at the end. Make the per-member `output` small (a final state, a
maximum) when using them: the memory is `n_members * bytes(output)`.
"""

import dataclasses
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np


class Reduction:
    """Base class (see module docstring). Subclasses are streaming unless `needs_values`."""

    needs_values = False


def _count_dtype():
    return jnp.int64 if jax.config.jax_enable_x64 else jnp.int32


def _float_dtype(dtype):
    return dtype if jnp.issubdtype(dtype, jnp.inexact) else jnp.result_type(float)


def _sum_dtype(dtype):
    """The dtype `jnp.sum` adds in: small integers and booleans widen to the default integer."""
    return jax.eval_shape(jnp.sum, jax.ShapeDtypeStruct((1,), dtype)).dtype


def _bcast(mask, x):
    return mask.reshape(mask.shape + (1,) * (x.ndim - 1))


def _abs2(x):
    """|x|² (real for complex x)."""
    return (x * jnp.conj(x)).real if jnp.issubdtype(x.dtype, jnp.complexfloating) else x * x


_SUM_BLOCK = 256  # members per block of a grouped sum


def _segment_sum(x, groups, n_groups):
    """Σ over the members of each group: `(B, ...)` -> `(n_groups, ...)`.

    A segment sum (a scatter-add) adds members one after another, so its float round-off grows
    with the number of members; it runs here within blocks of max(256, n_groups) members, and
    the blocks' sums are added by a reduction. The block partials take at most B entries.
    """
    if n_groups == 1:
        return jnp.sum(x, axis=0, keepdims=True)
    size = x.shape[0]
    block = max(_SUM_BLOCK, n_groups)
    n_blocks = -(-size // block)
    if n_blocks == 1:
        return jax.ops.segment_sum(x, groups, num_segments=n_groups, indices_are_sorted=False)
    pad = n_blocks * block - size  # padded members add 0 to group 0
    x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
    ids = jnp.arange(n_blocks * block) // block * n_groups + jnp.pad(groups, (0, pad))
    partial = jax.ops.segment_sum(x, ids, num_segments=n_blocks * n_groups, indices_are_sorted=False)
    return jnp.sum(partial.reshape((n_blocks, n_groups) + x.shape[1:]), axis=0)


def _segment_min(x, groups, n_groups):
    if n_groups == 1:
        return jnp.min(x, axis=0, keepdims=True)
    return jax.ops.segment_min(x, groups, num_segments=n_groups, indices_are_sorted=False)


def _pivoted_sums(x, mask, groups, n_groups):
    """Per group: the count n, a finite pivot p and S = Σ (x − p) over the counted members.

    Two passes: about the group's first counted member with a finite value, then about the mean
    that gives (0 if none; 0 for integers, which add exactly). Summing deviations from the mean
    instead of the raw values keeps a float32 sum accurate whatever the data's offset (10^5 values
    of 10^4 + N(0, 1) summed raw by one scatter-add lost ~7 in the mean, and the variance about
    that mean came out 56 instead of 1).
    """
    n = _segment_sum(mask.astype(_count_dtype()), groups, n_groups)
    x = x.astype(_sum_dtype(x.dtype))  # as jnp.sum: a grouped int8 sum must not wrap at 128
    m = _bcast(mask, x)
    zero = jnp.zeros((), x.dtype)
    if jnp.issubdtype(x.dtype, jnp.inexact):
        size = x.shape[0]
        index = jnp.broadcast_to(_bcast(jnp.arange(size), x), x.shape)
        first = _segment_min(jnp.where(m & jnp.isfinite(x), index, size), groups, n_groups)
        found = first < size
        pivot = jnp.where(found, jnp.take_along_axis(x, jnp.minimum(first, size - 1), axis=0), zero)
        # Second pass about the first pass's mean: a pivot far from the group's mean (an outlier
        # first, or two clusters at ±a) made every deviation large and of one sign, and a float32
        # sum of 10^5 of them lost the mean's sign.
        s = _segment_sum(jnp.where(m, x - pivot[groups], zero), groups, n_groups)
        moved = pivot + s / _bcast(jnp.maximum(n, 1), s).astype(x.dtype)
        pivot = jnp.where(jnp.isfinite(moved), moved, pivot)
    else:
        pivot = jnp.zeros((n_groups,) + x.shape[1:], x.dtype)
    return n, pivot, _segment_sum(jnp.where(m, x - pivot[groups], zero), groups, n_groups)


def _merge_pivoted(a, b):
    """Merge two (n, p, S) states onto one pivot: a's, or b's when a is empty. Pivots are
    finite and near their groups' means, so the shift n_b (p_b − p) is an accurate correction, and
    the running sum never carries the data's offset (merging 1,000 float32 chunks of
    10^6 + N(0, 1) through running means drifted the mean by 0.06)."""
    na, pa, sa = a[:3]
    nb, pb, sb = b[:3]
    pivot = jnp.where(_bcast(na, pa) > 0, pa, pb)
    shift = _bcast(nb, sb).astype(sb.dtype) * (pb - pivot)
    return na + nb, pivot, sa + jnp.where(_bcast(nb, sb) > 0, sb + shift, jnp.zeros((), sb.dtype))


def _pivoted_total(state):
    n, pivot, s = state[:3]
    return _bcast(n, s).astype(s.dtype) * pivot + s


class _Leafwise(Reduction):
    """A streaming reduction applied independently to every numeric leaf."""

    def partial(self, x, mask, groups, n_groups):
        raise NotImplementedError

    def merge(self, a, b):
        raise NotImplementedError

    def finalize(self, state):
        raise NotImplementedError

    def finalize_leaf(self, state, dtype):
        """The result for an output leaf of `dtype` (booleans were reduced as 0/1 integers)."""
        return self.finalize(state)

    def applies_to(self, dtype) -> bool:
        return jnp.issubdtype(dtype, jnp.number) or dtype == jnp.bool_  # booleans count as 0 and 1


@dataclasses.dataclass(frozen=True)
class Sum(_Leafwise):
    """Sum over members (failed members excluded)."""

    def partial(self, x, mask, groups, n_groups):
        return _pivoted_sums(x, mask, groups, n_groups)

    def merge(self, a, b):
        return _merge_pivoted(a, b)

    def finalize(self, state):
        return _pivoted_total(state)


@dataclasses.dataclass(frozen=True)
class Count(_Leafwise):
    """Number of members that contributed (finite members, unless `check_finite=False`)."""

    def partial(self, x, mask, groups, n_groups):
        return _segment_sum(mask.astype(_count_dtype()), groups, n_groups)

    def merge(self, a, b):
        return a + b

    def finalize(self, state):
        return state

    def applies_to(self, dtype) -> bool:
        return True


@dataclasses.dataclass(frozen=True)
class _Moments(_Leafwise):
    """Count n, pivot p, S = Σ (x − p) and M2 = Σ |x − mean|², with mean = p + S/n.

    Within a chunk the pivot is a first pass's mean (`_pivoted_sums`) and M2 comes from the
    deviations (x − p) − S/n about the mean (two passes, no cancellation, and no rounding of
    the mean to the data's magnitude). Chunks and processes are merged onto one pivot (`_merge_pivoted`), with

        δ = mean_b − mean_a = (p_b − p_a) + S_b/n_b − S_a/n_a,
        M2 = M2_a + M2_b + |δ|² n_a n_b / n

    (Chan, Golub & LeVeque 1979). Neither the sums nor δ carry the data's offset, so float32
    stays accurate for data far from zero and over any number of chunks; an empty side
    merges as nothing, and infinite values give what NumPy gives (mean ±inf, variance NaN).
    """

    ddof: int = 0

    def partial(self, x, mask, groups, n_groups):
        x = x.astype(_float_dtype(x.dtype))
        n, pivot, s = _pivoted_sums(x, mask, groups, n_groups)
        # Deviations from the mean as (x − p) − S/n: the mean itself, rounded to the data's
        # magnitude, would bias M2 by n (rounding)² (float32 at 10^6: ulp 0.06, variance +3e-4).
        offset = s / _bcast(jnp.maximum(n, 1), s).astype(x.dtype)
        dev = jnp.where(_bcast(mask, x), (x - pivot[groups]) - offset[groups], jnp.zeros((), x.dtype))
        return n, pivot, s, _segment_sum(_abs2(dev), groups, n_groups)

    def merge(self, a, b):
        na, pa, sa, m2a = a
        nb, pb, sb, m2b = b
        n, pivot, s = _merge_pivoted(a, b)
        real = m2a.dtype  # M2 = Σ|x − mean|² is real, also for complex outputs
        fa, fb = _bcast(na, sa).astype(real), _bcast(nb, sb).astype(real)
        delta = (pb - pa) + sb / jnp.maximum(fb, 1) - sa / jnp.maximum(fa, 1)
        both = (fa > 0) & (fb > 0)
        cross = jnp.where(both, _abs2(delta) * (fa * fb / jnp.maximum(fa + fb, 1)), jnp.zeros((), real))
        return n, pivot, s, m2a + m2b + cross


@dataclasses.dataclass(frozen=True)
class Mean(_Moments):
    """Mean over members (NaN for a group with no finite member)."""

    def finalize(self, state):
        n, pivot, s, _ = state
        mean = pivot + s / _bcast(jnp.maximum(n, 1), s).astype(s.dtype)
        return jnp.where(_bcast(n > 0, mean), mean, jnp.nan)


@dataclasses.dataclass(frozen=True)
class Variance(_Moments):
    """Variance over members, M2 / (n − ddof) (`ddof=0`: population variance; 1: sample),
    with M2 = Σ|x − mean|² (real for complex outputs, as `numpy.var`)."""

    def finalize(self, state):
        n, _, _, m2 = state
        denom = _bcast(n - self.ddof, m2)
        return jnp.where(denom > 0, m2 / jnp.maximum(denom, 1).astype(m2.dtype), jnp.nan)


@dataclasses.dataclass(frozen=True)
class Std(Variance):
    """Standard deviation over members, √Variance(ddof)."""

    def finalize(self, state):
        return jnp.sqrt(super().finalize(state))


class _Extremum(_Leafwise):
    take_min = True

    def _identity(self, dtype):
        if jnp.issubdtype(dtype, jnp.inexact):
            return jnp.asarray(jnp.inf if self.take_min else -jnp.inf, dtype)
        info = jnp.iinfo(dtype)
        return jnp.asarray(info.max if self.take_min else info.min, dtype)

    def partial(self, x, mask, groups, n_groups):
        m = _bcast(mask, x)
        # NaN is counted apart: a min/max all-reduce across devices (XLA:CPU) drops NaN, a sum does not.
        nans = _segment_sum((m & jnp.isnan(x)).astype(_count_dtype()), groups, n_groups)
        x = jnp.where(m, x, self._identity(x.dtype))
        if n_groups == 1:
            value = (jnp.min if self.take_min else jnp.max)(x, axis=0, keepdims=True)
        else:
            seg = jax.ops.segment_min if self.take_min else jax.ops.segment_max
            value = seg(x, groups, num_segments=n_groups)
        return _segment_sum(mask.astype(_count_dtype()), groups, n_groups), value, nans

    def merge(self, a, b):
        return a[0] + b[0], (jnp.minimum if self.take_min else jnp.maximum)(a[1], b[1]), a[2] + b[2]

    def finalize(self, state):
        n, value, nans = state
        if jnp.issubdtype(value.dtype, jnp.inexact):
            return jnp.where((_bcast(n, value) > 0) & (nans == 0), value, jnp.nan)
        return value

    def finalize_leaf(self, state, dtype):
        # A flag's extremum is a flag, as in NumPy: min = "all set", max = "any set". An empty
        # group's identity (the widened integer's largest / smallest value) becomes True / False.
        value = self.finalize(state)
        return value > 0 if dtype == jnp.bool_ else value


@dataclasses.dataclass(frozen=True)
class Min(_Extremum):
    """Minimum over members (NaN for a group with no finite member). Integer outputs keep their
    dtype, so such a group holds the dtype's largest value, and a boolean output gives a boolean
    ("all members set it"; True for such a group): check `Count` for empty groups."""

    take_min = True


@dataclasses.dataclass(frozen=True)
class Max(_Extremum):
    """Maximum over members (NaN for a group with no finite member). Integer outputs keep their
    dtype, so such a group holds the dtype's smallest value, and a boolean output gives a boolean
    ("any member set it"; False for such a group): check `Count` for empty groups."""

    take_min = False


@dataclasses.dataclass(frozen=True)
class Streaming(Reduction):
    """A user-defined streaming reduction of the whole output pytree.

    **Arguments:**

    - `partial`: `partial(values, weights) -> state` for one chunk: `values` is the output
      pytree with a leading `(B,)` member axis, `weights` a `(B,)` array of 0/1 (0 for padding,
      failed members and members of other groups). The numeric values of members with weight
      0 are replaced by zeros, so a failed member's NaN cannot leak through 0 · NaN. Must be
      jittable. `partial` runs once per group of kept axes on the whole chunk (vmapped), so
      with G groups a chunk holds G copies of its outputs: for many groups (thousands) prefer
      the built-in reductions, which use one segment sum.
    - `merge`: `merge(a, b) -> state`, associative (chunks arrive in any grouping).
    - `finalize`: `finalize(state) -> result` (default: the state itself).

    ```python
    second_moment = Streaming(
        partial=lambda v, w: (jnp.sum(w), jnp.sum(w[:, None] * v**2, axis=0)),
        merge=lambda a, b: (a[0] + b[0], a[1] + b[1]),
        finalize=lambda s: s[1] / s[0])
    ```
    """

    partial: Callable
    merge: Callable
    finalize: Callable | None = None


@dataclasses.dataclass(frozen=True)
class Quantile(Reduction):
    """Exact quantile(s) over members, `numpy.quantile(..., method=method)`.

    Exact quantiles need every value: each member's output is kept on the host (memory
    `n_members * bytes(output)`), so choose a small per-member `output`. Failed members are
    left out. Results have shape `(kept axes..., *jnp.shape(q), *leaf_shape)` and, as `Mean`'s,
    the output's float type (integers and booleans, counted as 0 and 1, give the default float);
    complex outputs get `None`.
    """

    q: object
    method: str = "linear"
    needs_values = True

    def __post_init__(self):
        q = np.asarray(self.q, dtype=float)
        if q.size == 0 or np.any((q < 0) | (q > 1)) or np.any(np.isnan(q)):
            raise ValueError(f"Quantile: `q` must be in [0, 1], got {self.q!r}.")

    def from_values(self, values, valid, reduce_axes, ignore_invalid):
        """`values` (grid..., leaf...), `valid` (grid...): quantile over `reduce_axes`."""

        def leaf(x):
            if not (jnp.issubdtype(x.dtype, jnp.floating) or jnp.issubdtype(x.dtype, jnp.integer)
                    or x.dtype == np.bool_):
                return None
            # As for Mean: a float output keeps its type (bfloat16 and float16 computed in float32),
            # integers and booleans (0 and 1) give the default float.
            result_dtype = x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.result_type(float)
            x = np.asarray(x, dtype=np.result_type(result_dtype, np.float32))
            x_valid = x
            if ignore_invalid:
                x = np.where(valid.reshape(valid.shape + (1,) * (x.ndim - valid.ndim)), x, np.nan)
            kept = [a for a in range(valid.ndim) if a not in reduce_axes]

            def members_first(a):
                a = np.moveaxis(a, list(reduce_axes), list(range(len(reduce_axes))))
                return a.reshape((-1,) + a.shape[len(reduce_axes):])

            x, x_valid = members_first(x), members_first(
                np.where(valid.reshape(valid.shape + (1,) * (x_valid.ndim - valid.ndim)), x_valid, 0))
            q = np.asarray(self.q)
            fn = np.nanquantile if ignore_invalid else np.quantile
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN group -> NaN
                r = fn(x, q, axis=0, method=self.method).astype(x.dtype)  # a float64 q promotes float32
            if ignore_invalid:  # a NaN output of a member that did not fail propagates, as in Mean
                r = np.where(np.any(np.isnan(x_valid), axis=0), np.nan, r)
            # r: (*q.shape, kept..., leaf...) -> (kept..., *q.shape, leaf...)
            return np.moveaxis(r, list(range(q.ndim)), list(range(len(kept), len(kept) + q.ndim))).astype(result_dtype)

        return jtu.tree_map(leaf, values)


class Median(Quantile):
    """Exact median over members (see `Quantile`)."""

    def __init__(self, method: str = "linear"):
        super().__init__(q=0.5, method=method)


@dataclasses.dataclass(frozen=True)
class Apply(Reduction):
    """Any function of all members' outputs, `fn(values) -> result`, per group.

    `values` is the output pytree with a leading axis over the finite members of the group
    (NumPy arrays on the host). Like `Quantile`, this keeps every member's output on the host.
    In a group whose members all failed that axis is empty, so `fn` must accept empty arrays
    (`np.max` of none raises, `np.mean` gives NaN with a warning).
    """

    fn: Callable
    needs_values = True

    def from_values(self, values, valid, reduce_axes, ignore_invalid):
        kept_shape = tuple(n for a, n in enumerate(valid.shape) if a not in reduce_axes)
        moved = jtu.tree_map(lambda x: np.moveaxis(x, list(reduce_axes), list(range(len(reduce_axes)))), values)
        v = np.moveaxis(valid, list(reduce_axes), list(range(len(reduce_axes))))
        n_red = int(np.prod([valid.shape[a] for a in reduce_axes]))
        moved = jtu.tree_map(lambda x: x.reshape((n_red, -1) + x.shape[valid.ndim:]), moved)
        v = v.reshape(n_red, -1)
        results = []
        for g in range(int(np.prod(kept_shape))):
            sel = v[:, g] if ignore_invalid else np.ones(n_red, bool)
            results.append(self.fn(jtu.tree_map(lambda x, g=g, sel=sel: x[:, g][sel], moved)))
        return jtu.tree_map(lambda *r: np.stack([np.asarray(x) for x in r]).reshape(kept_shape + np.shape(r[0])),
                            *results)


_NAMED = {
    "mean": Mean,
    "var": Variance,
    "variance": Variance,
    "std": Std,
    "min": Min,
    "max": Max,
    "sum": Sum,
    "count": Count,
    "median": Median,
}


def resolve_reductions(reduce) -> dict[str, Reduction]:
    """Normalise `reduce` (None, a name, a list of names, or a dict name -> Reduction/name)."""
    if reduce is None:
        return {}
    if isinstance(reduce, str):
        reduce = [reduce]
    if isinstance(reduce, list | tuple):
        named = [r for r in reduce if not isinstance(r, str)]
        if named:
            raise TypeError(f"sweep: a list in `reduce` holds reduction names such as 'mean', got {named[0]!r}; "
                            "name each reduction object's result with a dict instead, e.g. "
                            "{'mean': Mean(), 'p90': Quantile(0.9)}.")
        reduce = {r: r for r in reduce}
    if not isinstance(reduce, dict):
        raise TypeError(
            "sweep: `reduce` must be None, a name such as 'mean', a list of names, or a dict "
            f"mapping result names to reductions (e.g. {{'p95': Quantile(0.95)}}); got {reduce!r}."
        )
    out = {}
    for name, r in reduce.items():
        if isinstance(r, str):
            if r not in _NAMED:
                raise ValueError(f"sweep: unknown reduction {r!r}; valid names: {sorted(_NAMED)}, "
                                 "or pass a Reduction such as Quantile(0.9), Streaming(...) or Apply(fn).")
            r = _NAMED[r]()
        if not isinstance(r, Reduction):
            raise TypeError(f"sweep: reduction {name!r} must be a name or a sciax.ensemble reduction, got {r!r}.")
        out[name] = r
    return out


def tree_partial(red: Reduction, outs, mask, groups, n_groups):
    """One chunk's partial state (`outs` has a leading member axis; runs inside jit).

    Leaves a reduction does not apply to get `None`. Booleans count as 0 and 1, as in NumPy (the
    mean of a flag is the fraction of members that set it, its sum their number).
    """
    if isinstance(red, _Leafwise):
        def leaf(x):
            if not red.applies_to(x.dtype):
                return None
            return red.partial(x.astype(_sum_dtype(x.dtype)) if x.dtype == jnp.bool_ else x, mask, groups, n_groups)

        return jtu.tree_map(leaf, outs)
    # Streaming: one partial per group; the weights select the group's members.
    one_hot = (groups[None, :] == jnp.arange(n_groups)[:, None]) & mask[None, :]

    def group(member):
        values = jtu.tree_map(
            lambda x: jnp.where(_bcast(member, x), x, jnp.zeros((), x.dtype))
            if jnp.issubdtype(x.dtype, jnp.number) else x, outs)
        return red.partial(values, member.astype(_weights_dtype(outs)))

    return jax.vmap(group)(one_hot)


def _weights_dtype(outs):
    leaves = [x for x in jtu.tree_leaves(outs) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return leaves[0].dtype if leaves else jnp.result_type(float)


def tree_merge(red: Reduction, struct, a, b):
    """Merge two partial states (from two chunks or two processes); `struct` is the output's
    shape-dtype tree, which says where the partial states' leaves are."""
    if isinstance(red, _Leafwise):
        return jtu.tree_map(lambda s, x, y: red.merge(x, y) if red.applies_to(s.dtype) else None, struct, a, b)
    return jax.vmap(red.merge)(a, b)


def tree_finalize(red: Reduction, struct, state, kept_shape):
    """Final results on the host with the kept axes in front: `(kept..., *result_shape)`."""
    if isinstance(red, _Leafwise):
        res = jtu.tree_map(lambda s, st: red.finalize_leaf(st, s.dtype) if red.applies_to(s.dtype) else None,
                           struct, state)
    else:
        res = jax.vmap(red.finalize)(state) if red.finalize is not None else state
    return jtu.tree_map(lambda r: np.asarray(r).reshape(kept_shape + np.shape(r)[1:]), res)
