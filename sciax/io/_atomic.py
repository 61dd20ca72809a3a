"""Atomic file writes: write a temporary file in the same folder, fsync, then `os.replace`."""

import contextlib
import os
import tempfile
from pathlib import Path


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


@contextlib.contextmanager
def atomic_write(path, mode: str = "wb"):
    """Open a temporary file next to `path`; on success it replaces `path` in one step.

    If the block raises, the temporary file is removed and `path` is left as it was.

    ```python
    with atomic_write("summary.json", "w") as f:
        json.dump(summary, f)
    ```
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file ordinary permissions
        # Text as UTF-8 whatever the locale: scenario copies are read back as UTF-8.
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path, data: bytes) -> None:
    """Write `data` to `path` atomically."""
    with atomic_write(path, "wb") as f:
        f.write(data)
