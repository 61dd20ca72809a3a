"""`SweepResult`: a sweep's outputs with the sweep axes attached (host-side NumPy arrays)."""

import dataclasses

import jax.tree_util as jtu
import numpy as np

MEMBER = "member"


@dataclasses.dataclass
class SweepResult:
    """The result of `sciax.sweep`.

    **Fields:**

    - `axes`: dict axis name -> coordinates (NumPy, in the order the axes were given).
    - `mode`: `"grid"` or `"zip"`.
    - `dims`: names of the leading dimensions of `outputs` and `ok`: the axis names for a
      grid, `("member",)` for zipped axes.
    - `shape`: the sizes of those dimensions (grid: `(len(a), len(b), ...)`; zip: `(n,)`).
    - `outputs`: the per-member output pytree, every leaf with `shape` in front; `None` when
      members were not kept (`keep=False`, the default when reductions are requested).
    - `ok`: bool array of `shape`: the member finished with a finite state (and, for solves,
      the solver succeeded). `None` if `check_finite=False`.
    - `failures`: one dict per failed member: `{"index": flat_index, <axis>: coordinate, ...}`,
      the flat index counted in this result (what `coords` and `ok.ravel()` take). A result of
      `sel`/`isel` also gives `"sweep_index"`, the member's flat index in the whole sweep.
    - `reductions`: dict name -> reduced pytree, each leaf shaped `(kept dims..., ...)`.
    - `reduced_dims`: the dims the reductions ran over; `kept_dims`: the others.
    - `member_indices`: for `gather=False` results, the flat indices of the members this
      process holds (`outputs` then has one flat leading axis); else `None`.
    - `info`: how the sweep ran: members, chunks, batch size, devices, processes, bytes per
      member, padding.
    """

    axes: dict
    mode: str
    dims: tuple
    shape: tuple
    outputs: object
    ok: np.ndarray | None
    failures: list
    reductions: dict
    reduced_dims: tuple
    kept_dims: tuple
    info: dict
    member_indices: np.ndarray | None = None
    origin: tuple | None = None  # (dims, shape) of the whole sweep, for results of isel/sel
    selected: dict = dataclasses.field(default_factory=dict)  # dim -> position in the whole sweep

    # ----------------------------------------------------------------- lookups
    @property
    def n_members(self) -> int:
        return int(np.prod(self.shape))

    def coords(self, index: int) -> dict:
        """Coordinates of the member with flat index `index` (row-major over `dims`)."""
        if not 0 <= index < self.n_members:
            raise IndexError(f"member index {index} out of range for {self.n_members} members.")
        if self.mode == "zip":
            if MEMBER not in self.dims:  # one member, already selected: its coordinates are scalars
                return {name: _scalar(c) for name, c in self.axes.items()}
            return {name: _scalar(c[index]) for name, c in self.axes.items()}
        position = dict(zip(self.dims, np.unravel_index(index, self.shape)))
        # Axes already selected (by isel/sel) hold their one coordinate.
        return {name: _scalar(c[position[name]] if name in position else c) for name, c in self.axes.items()}

    def sel(self, method: str | None = None, **coords) -> "SweepResult":
        """Select members by coordinate value: `result.sel(rho=24.5, seed=3).outputs`.

        `method=None` asks for an exact match (integer axes exactly; float axes up to rounding:
        a relative difference of at most 1e-6 of the coordinate, and for a requested 0 a few
        ulps of the axis's largest value; the closest such coordinate); `method="nearest"` takes the
        closest coordinate. Selected grid dims
        are dropped; in zip mode the value(s) pick one member. Reductions are indexed too
        when only kept dims are selected.

        **Raises:** `ValueError` naming the valid axes, or the nearest available values when
        there is no exact match.
        """
        if method not in (None, "nearest"):
            raise ValueError(f"sel: `method` must be None (exact) or 'nearest', got {method!r}.")
        self._check_names(coords)
        if self.mode == "zip":
            candidates = np.arange(self.shape[0])
            for name, value in coords.items():
                candidates = _match(name, self.axes[name][candidates], value, method, candidates)
            if candidates.size > 1:
                raise ValueError(
                    f"sel: {coords} matches {candidates.size} zipped members {candidates[:10].tolist()}; "
                    "give more coordinates or use isel(member=i)."
                )
            return self.isel(member=int(candidates[0]))
        indices = {}
        for name, value in coords.items():
            found = _match(name, self.axes[name], value, method, np.arange(len(self.axes[name])))
            if found.size > 1:  # the axis holds this coordinate more than once
                raise ValueError(
                    f"sel: {name} = {np.asarray(value).tolist()} matches {found.size} positions "
                    f"{found[:10].tolist()} of grid axis {name!r}, which holds that value more than once; "
                    f"use isel({name}=i) to pick one.")
            indices[name] = int(found[0])
        return self.isel(**indices)

    def isel(self, **indices) -> "SweepResult":
        """Select members by integer position along named dims: `result.isel(rho=3)`."""
        for name in indices:
            if name not in self.dims:
                raise ValueError(f"isel: {name!r} is not a dim of this result; dims: {list(self.dims)}.")
        if self.member_indices is not None:
            raise ValueError("isel/sel: this result was made with gather=False and holds only this process's "
                             "members (flat, see `member_indices`); run with gather=True to index by axes.")
        gone = [d for d in indices if d in self.reduced_dims]
        if gone and self.outputs is None:  # nothing would be left: no members kept, no reductions
            raise ValueError(
                f"isel/sel: dim {gone[0]!r} was reduced over (reductions over {list(self.reduced_dims)}) and the "
                f"members were not kept (keep=False), so nothing is left to select along it; select along "
                f"the kept dims {list(self.kept_dims)}, or sweep with keep=True to keep every member.")
        index = tuple(indices.get(d, slice(None)) for d in self.dims)
        for d, i in indices.items():
            n = self.shape[self.dims.index(d)]
            if not isinstance(i, int | np.integer) or not -n <= i < n:
                raise IndexError(f"isel: index {i!r} out of range for dim {d!r} of size {n}.")
        keep = [d for d in self.dims if d not in indices]
        outputs = None if self.outputs is None else jtu.tree_map(lambda x: x[index], self.outputs)
        ok = None if self.ok is None else self.ok[index]
        if self.mode == "zip":
            i = indices.get(MEMBER)
            axes = {n: _scalar(c[i]) if i is not None else c for n, c in self.axes.items()}
        else:
            axes = {n: _scalar(c[indices[n]]) if n in indices else c for n, c in self.axes.items()}
        reductions, kept = self.reductions, self.kept_dims
        if any(d in self.reduced_dims for d in indices):
            reductions = {}
        elif indices:
            kidx = tuple(indices.get(d, slice(None)) for d in self.kept_dims)
            reductions = {k: jtu.tree_map(lambda x, kidx=kidx: x[kidx], v) for k, v in self.reductions.items()}
            kept = tuple(d for d in self.kept_dims if d not in indices)
        origin = self.origin or (self.dims, self.shape)
        selected = {**self.selected, **{d: int(i) % self.shape[self.dims.index(d)] for d, i in indices.items()}}
        shape = tuple(self.shape[self.dims.index(d)] for d in keep)
        failures = [_renumbered(f, origin, keep, shape) for f in self.failures
                    if _is_selected(f.get("sweep_index", f["index"]), origin, selected)]
        return SweepResult(
            axes=axes, mode=self.mode, dims=tuple(keep),
            shape=shape, outputs=outputs, ok=ok,
            failures=failures, reductions=reductions, reduced_dims=tuple(d for d in self.reduced_dims if d in keep),
            kept_dims=kept, info=self.info, origin=origin, selected=selected,
        )

    def _check_names(self, coords):
        for name in coords:
            if name not in self.axes:
                raise ValueError(f"sel: {name!r} is not an axis of this sweep; axes: {list(self.axes)}.")
            if self.mode == "grid" and name not in self.dims:
                raise ValueError(f"sel: axis {name!r} was already selected; remaining dims: {list(self.dims)}.")
            if self.mode == "zip" and MEMBER not in self.dims:
                raise ValueError(f"sel: the member was already selected ({self.coords(0)}); nothing is left "
                                 "to select.")

    def __repr__(self) -> str:
        dims = ", ".join(f"{d}: {n}" for d, n in zip(self.dims, self.shape))
        leaves = [] if self.outputs is None else jtu.tree_leaves(self.outputs)
        lines = [f"SweepResult({self.mode}; {dims or 'one member'})"]
        if leaves:
            lines.append("  outputs: " + ", ".join(f"{tuple(x.shape)} {x.dtype}" for x in leaves[:6])
                         + (" ..." if len(leaves) > 6 else ""))
        if self.reductions:
            lines.append(f"  reductions over {list(self.reduced_dims)}: {list(self.reductions)}")
        if self.ok is not None:
            lines.append(f"  failed members: {len(self.failures)}"
                         + (f" (first: {self.failures[0]})" if self.failures else ""))
        return "\n".join(lines)


def _scalar(x):
    x = np.asarray(x)
    return x.item() if x.ndim == 0 else x


def _is_selected(flat_index, origin, selected) -> bool:
    """Whether member `flat_index` of the whole sweep lies in the selection `selected`."""
    dims, shape = origin
    position = np.unravel_index(flat_index, shape)
    return all(position[dims.index(d)] == i for d, i in selected.items())


def _renumbered(failure, origin, dims, shape) -> dict:
    """`failure` with "index" counted within a selection of dims `dims` (sizes `shape`) and
    "sweep_index" the member's flat index in the whole sweep."""
    sweep_index = failure.get("sweep_index", failure["index"])
    position = np.unravel_index(sweep_index, origin[1])
    local = np.ravel_multi_index([position[origin[0].index(d)] for d in dims], shape) if dims else 0
    coords = {k: v for k, v in failure.items() if k not in ("index", "sweep_index")}
    return {"index": int(local), "sweep_index": int(sweep_index), **coords}


def _match(name, coords, value, method, positions) -> np.ndarray:
    """Positions (from `positions`) whose coordinate matches `value`."""
    coords = np.asarray(coords)
    value = np.asarray(value)
    if value.shape != coords.shape[1:]:
        raise ValueError(f"sel: a value of axis {name!r} has shape {coords.shape[1:]}, got {value.shape}.")
    exact = np.issubdtype(coords.dtype, np.integer) or coords.dtype == bool
    kind = np.result_type(coords.dtype, value.dtype, float)  # complex stays complex
    c = coords.astype(kind).reshape(len(coords), -1)
    v = value.astype(kind).reshape(-1)
    with np.errstate(invalid="ignore"):
        gap = np.abs(c - v)  # (members, entries)
    gap = np.where(c == v, 0.0, gap)  # an infinite coordinate matches itself (inf - inf is NaN)
    gap = np.where(np.isnan(gap), np.inf, gap)  # a NaN coordinate matches nothing
    diff = gap.max(axis=1)
    if method == "nearest":
        if not np.isfinite(diff).any():
            raise ValueError(f"sel: no coordinate of axis {name!r} is comparable with {value.tolist()} "
                             "(a NaN, or an infinite value among finite coordinates).")
        return positions[diff == diff.min()]
    # Exact up to rounding, entry by entry: integer axes exactly; floats within a relative 1e-6
    # of the larger of the coordinate and the value (so 2e-4 and 1e-4 stay apart on a logspace
    # axis, and 1e-13 and 1e-12), and a requested 0 also within a few ulps of the axis's scale
    # (it matches the -2.2e-16 that np.arange(-1, 1.01, 0.1) puts where 0 is meant).
    if exact:
        hit = diff == 0
    else:
        tolerance = 1e-6 * np.maximum(np.abs(c), np.abs(v))
        finite = np.abs(c[np.isfinite(c)])
        floor = 4 * np.finfo(coords.dtype).eps * finite.max(initial=0.0)
        tolerance = np.where(v == 0, np.maximum(tolerance, floor), tolerance)
        tolerance = np.where(np.isfinite(tolerance), tolerance, 0.0)  # inf matches only inf
        hit = np.all(gap <= tolerance, axis=1)
    if hit.any():
        hit &= diff == diff[hit].min()  # the closest of the matches
    if not hit.any():
        nearest = coords[np.argsort(diff, kind="stable")[:3]]
        raise ValueError(
            f"sel: no member with {name} = {value.tolist()}; nearest values: "
            f"{[np.asarray(c).tolist() for c in nearest]}. Use sel(..., method='nearest')."
        )
    return positions[hit]
