"""Ensembles: parameter, initial-state and seed sweeps in memory-bounded chunks, sharded over
devices and split across processes, with reductions over members computed on the fly."""

from ._axes import Axis as Axis
from ._devices import initialize_distributed as initialize_distributed
from ._reductions import (
    Apply as Apply,
    Count as Count,
    Max as Max,
    Mean as Mean,
    Median as Median,
    Min as Min,
    Quantile as Quantile,
    Reduction as Reduction,
    Std as Std,
    Streaming as Streaming,
    Sum as Sum,
    Variance as Variance,
)
from ._result import SweepResult as SweepResult
from ._sweep import sweep as sweep
