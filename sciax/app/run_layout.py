"""The output folder of a fixed-step run (`runner`): its file names, the chunk files and
their digests, and what makes a `checkpoint.npz` one that a sciax run wrote."""

import dataclasses
import json
import typing
import zlib
from pathlib import Path

import numpy as np

CHECKPOINT_FORMAT = "sciax-checkpoint-2"  # its `state` entry holds the integrator's whole loop carry
STATE_ONLY_FORMAT = "sciax-checkpoint-1"  # holds the state alone: a run's first checkpoint, older runs
CHUNK_PREFIX = "frames_"




CHECKPOINT_KEYS = ("format", "scenario_hash", "physics", "steps_done", "chunk_files", "csv_sizes")


def not_a_sciax_checkpoint(path: Path) -> str | None:
    """None if `path` is a checkpoint a sciax run wrote (an `.npz` holding `meta`, a JSON record
    with the checkpoint format string and the runner's keys); else why it is not."""
    try:
        with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as data:
            if "meta" not in data.files:
                return f"its checkpoint.npz holds {sorted(data.files)}, not a sciax checkpoint's meta record"
            meta = json.loads(str(data["meta"]))
    except Exception as e:  # not an npz, torn, not JSON, ...
        return f"its checkpoint.npz is not a readable sciax checkpoint: {type(e).__name__}"
    if not isinstance(meta, dict) or meta.get("format") not in (CHECKPOINT_FORMAT, STATE_ONLY_FORMAT) \
            or any(k not in meta for k in CHECKPOINT_KEYS):
        return f"its checkpoint.npz is not a {CHECKPOINT_FORMAT} checkpoint"
    return None


@dataclasses.dataclass(frozen=True)
class Layout:
    root: Path

    @property
    def chunks(self) -> Path:
        return self.root / "chunks"

    FILES: typing.ClassVar[dict] = {
        "scenario": "scenario.toml", "trajectory": "trajectory.npz", "summary": "summary.json",
        "observables_csv": "observables.csv", "states_csv": "states.csv", "plot": "plot.png",
        "checkpoint": "checkpoint.npz"}

    def __getattr__(self, name):
        if name in self.FILES:
            return self.root / self.FILES[name]
        raise AttributeError(name)

    def chunk_file(self, first_frame: int) -> Path:
        return self.chunks / f"{CHUNK_PREFIX}{first_frame:010d}.npz"

    def stale_temporaries(self) -> list[Path]:
        """Temporary files of the runner's own atomic writes (`.<output name>.*.tmp`) left by a
        process that was killed; nothing else in the folder is touched."""
        found = [p for n in self.FILES.values() for p in self.root.glob(f".{n}.*.tmp")]
        if self.chunks.is_dir():
            found += list(self.chunks.glob(f".{CHUNK_PREFIX}*.npz.*.tmp"))
        return found

    def chunk_files(self) -> list[Path]:
        if not self.chunks.is_dir():
            return []
        return sorted(p for p in self.chunks.iterdir()
                      if p.name.startswith(CHUNK_PREFIX) and p.suffix == ".npz")


def digest(data: bytes) -> str:
    """`"<size>:<CRC-32>"` of a file's bytes, recorded for each chunk file in the checkpoint."""
    return f"{len(data)}:{zlib.crc32(data):08x}"


def first_frame(chunk_name: str) -> int:
    """The first frame of a chunk file `frames_<first frame>.npz`."""
    return int(chunk_name[len(CHUNK_PREFIX):-len(".npz")])
