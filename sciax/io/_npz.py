"""Trajectory `.npz` files: `times`, the state leaves and the observables, as flat named arrays.

Key names: `times`; `states` for an array state, or `states` + the leaf's path for a pytree
state (`states.positions`, `states.velocities` for a `PhaseSpace`); `observables.<name>`.
`np.load` reads them with no sciax installed; `load_trajectory` rebuilds a `Trajectory`.
"""

import jax.tree_util as jtu
import numpy as np

from .._phase_space import PhaseSpace
from .._trajectory import Trajectory
from ._atomic import atomic_write


def trajectory_arrays(times, states, observables: dict, finite=None) -> dict[str, np.ndarray]:
    """Flat `{key: array}` dict of a trajectory's fields (keys as in the module docstring)."""
    arrays = {"times": np.asarray(times)}
    if states is not None:
        for path, leaf in jtu.tree_flatten_with_path(states)[0]:
            arrays["states" + jtu.keystr(path)] = np.asarray(leaf)
    for name, value in observables.items():
        arrays[f"observables.{name}"] = np.asarray(value)
    if finite is not None:
        arrays["finite"] = np.asarray(finite)
    return arrays


def save_npz(path, arrays: dict) -> None:
    """Write `arrays` to `path` (uncompressed `.npz`) atomically."""
    with atomic_write(path, "wb") as f:
        np.savez(f, **arrays)


def load_npz(path) -> dict[str, np.ndarray]:
    """All arrays of an `.npz` file, loaded into memory."""
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def load_trajectory(path) -> Trajectory:
    """Rebuild a `Trajectory` (NumPy arrays) from a file written by `sciax run`.

    States come back as an array (`states` key), a `PhaseSpace` (`states.positions` and
    `states.velocities`), or otherwise a dict from leaf path to array.
    """
    arrays = load_npz(path)
    state_keys = {k[len("states"):]: v for k, v in arrays.items() if k.startswith("states")}
    if not state_keys:
        states = None
    elif set(state_keys) == {""}:
        states = state_keys[""]
    elif set(state_keys) == {".positions", ".velocities"}:
        # Unflatten (not the constructor) so NumPy arrays keep their dtype even without x64.
        treedef = jtu.tree_structure(PhaseSpace(0.0, 0.0))
        states = jtu.tree_unflatten(treedef, [state_keys[".positions"], state_keys[".velocities"]])
    else:
        states = state_keys
    observables = {k[len("observables."):]: v for k, v in arrays.items() if k.startswith("observables.")}
    times = arrays["times"]
    finite = arrays.get("finite", np.ones(times.shape, dtype=bool))
    return Trajectory(times=times, states=states, observables=observables, finite=finite)
