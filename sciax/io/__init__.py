"""Files: atomic writes, state and observable CSV, trajectory `.npz`, checkpoints.

Leaves of the layer diagram: formats only, no physics loops. Every writer here either
appends whole rows in one write (CSV, with byte offsets recorded so a resume can truncate
back to a consistent point) or writes a temporary file and `os.replace`s it, so a crash
never leaves a half-written file behind.
"""

from ._atomic import atomic_write as atomic_write, atomic_write_bytes as atomic_write_bytes
from ._checkpoint import (
    checkpoint_meta as checkpoint_meta,
    load_checkpoint as load_checkpoint,
    save_checkpoint as save_checkpoint,
)
from ._csvfile import (
    append_csv_rows as append_csv_rows,
    frame_columns as frame_columns,
    truncate_file as truncate_file,
    write_csv_header as write_csv_header,
)
from ._drift import drift_errors as drift_errors, drift_summary as drift_summary
from ._npz import (
    load_npz as load_npz,
    load_trajectory as load_trajectory,
    save_npz as save_npz,
    trajectory_arrays as trajectory_arrays,
)
