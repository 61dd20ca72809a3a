"""The output folder of a job: its exclusive lock, the progress line, the marked copy of the
scenario, and the records (`RunResult`, JSON-safe values, the difference between two settings)
that every job kind writes the same way."""

import dataclasses
import json
import math
import os
import time
from pathlib import Path

from .schema import ScenarioError


class ResumeError(ScenarioError):
    """`--resume` refused: the checkpoint belongs to a different scenario or cannot be used."""


@dataclasses.dataclass
class RunResult:
    """What `run` did.

    - `out_dir`: the output folder. `status`: `"completed"` or `"interrupted"` (stopped by
      `max_chunks` or Ctrl-C; continue with `resume=True`).
    - `steps_done`: steps completed in total (all invocations). `summary`: the `summary.json` dict.
    """

    out_dir: Path
    status: str
    steps_done: int
    summary: dict


class Progress:
    """One status line on stderr: units done / total, units/s, ETA. Redrawn in place on a TTY;
    when `stream` is not a terminal, a line every 2 s and the final one.

    `unit` names what is counted: `"steps"` (a run) or `"members"` (a sweep)."""

    def __init__(self, name: str, total: int, stream, enabled: bool, unit: str = "steps"):
        self.name, self.total, self.stream, self.enabled, self.unit = name, total, stream, enabled, unit
        self.tty = enabled and hasattr(stream, "isatty") and stream.isatty()
        self.last_print = -math.inf
        self.width = 0  # length of the line now on the terminal

    def update(self, done: int, session_steps: int, elapsed: float, *, final: bool = False):
        if not self.enabled:
            return
        now = time.monotonic()
        if not (final or self.tty or now - self.last_print >= 2.0):
            return
        self.last_print = now
        rate = session_steps / elapsed if elapsed > 0 else float("nan")
        eta = (self.total - done) / rate if rate > 0 else float("nan")
        pct = 100.0 * done / self.total if self.total else 100.0
        line = (f"{self.name}: {done}/{self.total} {self.unit} ({pct:5.1f}%)  {rate:.3g} {self.unit}/s  "
                f"ETA {hms(eta)}")
        if self.tty:  # padded over the previous line, which may have been longer
            self.stream.write("\r" + line.ljust(self.width) + ("\n" if final else ""))
            self.width = 0 if final else len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def message(self, text: str):
        if self.enabled:
            self.stream.write(text + "\n")
            self.stream.flush()


def hms(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "--:--:--"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


COPY_HEADER = "# copied by sciax"


def copied_by_sciax(path: Path) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            return f.readline().startswith(COPY_HEADER)
    except (OSError, UnicodeDecodeError):
        return False


class OutputFolderBusyError(ScenarioError):
    """Another `run` (in this or another process) is writing to the same output folder."""


LOCK_NAME = ".sciax.lock"


class FolderLock:
    """An exclusive lock on an output folder for the length of a run: `fcntl.flock` on the file
    `.sciax.lock` in it. The operating system releases it when the process ends, however it ends
    (a killed run leaves no stale lock); a second run finds it held and refuses at once.

    The lock file is removed on release, while still locked; a run that opened it just before
    and then gets the lock finds its file unlinked (another inode at the path, or none) and
    opens it again, so two runs never hold locks on two different files of the same name."""

    def __init__(self, root: Path):
        self.root, self.fd, self.created = root, None, False

    def __enter__(self):
        import fcntl

        root = self.root
        if root.exists() and not root.is_dir():
            raise ScenarioError(f"the output folder {root} is an existing file, not a folder; choose another "
                                "with --out or [output] dir.")
        self.created = not root.exists()
        root.mkdir(parents=True, exist_ok=True)
        path = root / LOCK_NAME
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = read_pid(fd)
                os.close(fd)
                raise OutputFolderBusyError(
                    f"the output folder {root} is in use by another sciax run"
                    f"{f' (process {holder})' if holder else ''}, and two runs in one folder would mix their "
                    "files. Wait for it to finish (then --resume continues it if it was interrupted), or "
                    "choose another folder with --out or [output] dir.") from None
            except BaseException:
                os.close(fd)
                raise
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # released and unlinked by its holder between our open and our lock: again
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    def __exit__(self, *exc):
        try:
            (self.root / LOCK_NAME).unlink(missing_ok=True)
        except OSError:
            pass
        os.close(self.fd)  # releases the lock
        if self.created:  # a folder this run made and left empty (refused before writing anything)
            try:
                self.root.rmdir()
            except OSError:
                pass
        return False


def read_pid(fd) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode().strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


def json_safe(x):
    """Replace non-finite floats by the strings "inf", "-inf", "nan" (JSON has no such numbers)."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_safe(v) for v in x]
    return x


def diff(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Human-readable differences between two nested dicts: `run.dt: 0.01 -> 0.02`."""
    out = []
    for key in sorted(set(old) | set(new), key=str):
        path = f"{prefix}{key}"
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            out += diff(a, b, path + ".")
        elif a != b or type(a) is not type(b):  # 28 vs 28.0 hash differently: name it
            out.append(f"{path}: {json.dumps(a)} -> {json.dumps(b)}")
    return out


def write_scenario_copy(path: Path, scenario) -> None:
    """Write the marked copy of `scenario`'s file to `path` (atomically): a `COPY_HEADER` line
    naming the sciax version, the source file and any command-line overrides, then the file's
    text (a copy of a copy keeps one header)."""
    from .. import io as sio
    from .._version import __version__

    header = f"{COPY_HEADER} {__version__} from {scenario.source}"
    if scenario.overrides:
        header += "; command-line overrides: " + ", ".join(f"{k}={v}" for k, v in scenario.overrides.items())
    text = scenario.text
    if text.startswith(COPY_HEADER):
        text = text.split("\n", 1)[1] if "\n" in text else ""
    with sio.atomic_write(path, "w") as f:
        f.write(header + "\n" + text)
