"""Checkpoints: one `.npz` file holding the state (serialised with `eqx.tree_serialise_leaves`)
and a JSON metadata record, written atomically so a checkpoint is either the old one or the new one."""

import io
import json
import zipfile

import equinox as eqx
import numpy as np

from ._atomic import atomic_write


def save_checkpoint(path, state, meta: dict) -> None:
    """Write `state` (any pytree of arrays) and `meta` (JSON-serialisable dict) to `path` atomically."""
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, state)
    with atomic_write(path, "wb") as f:
        np.savez(f, meta=np.array(json.dumps(meta, sort_keys=True)),
                 state=np.frombuffer(buffer.getvalue(), dtype=np.uint8))


def load_checkpoint(path, like):
    """Read a checkpoint written by `save_checkpoint`.

    **Arguments:** `path`; `like`, a pytree with the structure, shapes and dtypes of the saved
    state (e.g. the run's initial state).

    **Returns:** `(state, meta)`.

    **Raises:** `ValueError` if the file is not a sciax checkpoint or its state does not match `like`.
    """
    try:
        with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as data:  # closed even if torn
            meta = json.loads(str(data["meta"]))
            raw = data["state"].tobytes()
    except (KeyError, OSError, ValueError, EOFError, zipfile.BadZipFile) as e:  # e.g. truncated
        raise ValueError(f"{path}: not a readable sciax checkpoint ({type(e).__name__}: {e}).") from e
    try:
        state = eqx.tree_deserialise_leaves(io.BytesIO(raw), like)
    except Exception as e:  # structure/shape/dtype mismatch inside equinox/numpy
        raise ValueError(
            f"{path}: the saved state does not match the scenario's state structure ({e})."
        ) from e
    return state, meta
