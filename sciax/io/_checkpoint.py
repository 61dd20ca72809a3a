"""Checkpoints: one `.npz` file holding the state (serialised with `eqx.tree_serialise_leaves`)
and a JSON metadata record, written atomically so a checkpoint is either the old one or the new one."""

import io
import json
import zipfile

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._atomic import atomic_write


def save_checkpoint(path, state, meta: dict) -> None:
    """Write `state` (any pytree of arrays) and `meta` (JSON-serialisable dict) to `path` atomically."""
    buffer = io.BytesIO()
    eqx.tree_serialise_leaves(buffer, state)
    with atomic_write(path, "wb") as f:
        np.savez(f, meta=np.array(json.dumps(meta, sort_keys=True)),
                 state=np.frombuffer(buffer.getvalue(), dtype=np.uint8))


def checkpoint_meta(path) -> dict:
    """The JSON metadata record of a checkpoint, without reading its state.

    **Raises:** `ValueError` if the file is not a readable sciax checkpoint."""
    try:
        with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
    except (KeyError, OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise ValueError(f"{path}: not a readable sciax checkpoint ({type(e).__name__}: {e}).") from e
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: not a sciax checkpoint (its metadata is not a record).")
    return meta


def load_checkpoint(path, like):
    """Read a checkpoint written by `save_checkpoint`.

    **Arguments:** `path`; `like`, a pytree with the structure, shapes and dtypes of the saved
    state (e.g. the run's initial state).

    **Returns:** `(state, meta)`.

    **Raises:** `ValueError` if the file is not a sciax checkpoint or its state does not match `like`
    (its structure, shapes or dtypes: a checkpoint is never converted to another precision).
    """
    try:
        with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as data:  # closed even if torn
            meta = json.loads(str(data["meta"]))
            raw = data["state"].tobytes()
    except (KeyError, OSError, ValueError, EOFError, zipfile.BadZipFile) as e:  # e.g. truncated
        raise ValueError(f"{path}: not a readable sciax checkpoint ({type(e).__name__}: {e}).") from e
    saved_dtypes = []  # (on disk, in `like`) for each array leaf
    try:
        state = eqx.tree_deserialise_leaves(io.BytesIO(raw), like, filter_spec=_recording_dtypes(saved_dtypes))
    except Exception as e:  # structure/shape/dtype mismatch inside equinox/numpy
        error = e
    else:
        error = None
    for saved, wanted in saved_dtypes:  # checked whatever the x64 setting (JAX loads float64 as float32 without it)
        if saved != wanted:
            x64 = " (float64 needs jax.config.update('jax_enable_x64', True))" \
                if saved == np.float64 and not jax.config.jax_enable_x64 else ""
            raise ValueError(
                f"{path}: the checkpoint holds {saved} data but `like` (the state to load into) is {wanted}; "
                f"load_checkpoint does not change precision. Load it with a {saved} `like`{x64}."
            ) from error
    if error is not None:
        raise ValueError(
            f"{path}: the saved state does not match the structure, shapes and dtypes of `like` "
            f"(the state to load into; the initial state when a run resumes) ({error})."
        ) from error
    return state, meta


def _recording_dtypes(out: list):
    """Equinox's leaf loader, appending `(dtype on disk, dtype of like)` to `out` for each array leaf."""

    def load(f, x):
        if isinstance(x, jax.Array | jax.ShapeDtypeStruct | np.ndarray | np.generic):
            start = f.tell()
            saved = np.load(f, allow_pickle=False).dtype
            f.seek(start)
            if saved == np.dtype("V2"):  # how jnp.save writes bfloat16
                saved = jnp.dtype(jnp.bfloat16)
            out.append((saved, x.dtype))
        return eqx.default_deserialise_filter_spec(f, x)

    return load
