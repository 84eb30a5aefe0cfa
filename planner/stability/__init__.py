"""Training-stability tools (DESIGN.md §5): check a precision plan before spending a cluster on it.

* `exmy`       -- eXmY bit-reduction simulation on chosen GEMM operands (`exmy_precision`, `Scheme`);
* `sharpness`  -- loss-landscape sharpness of an autoregressive LM on its output distribution;
* `divergence` -- when a run counts as diverged, what counts as a loss spike;
* `cell`       -- one short, bounded training run of a sweep;
* `sweep`      -- seeds x learning rates x precisions, parallel and resumable;
* `analysis`, `report`, `heatmap` -- divergence tables, sharpness/divergence correlation, Markdown, PNGs;
* `presets`, `cli` -- named grids and the `snip sweep` command.
"""

from .cell import BASELINE, Cell, TrainingSetup, run_cell
from .divergence import DivergenceRule, LossMonitor
from .exmy import BIT_REDUCTION_LADDER, OPERANDS, Scheme, exmy_precision, parse_scheme
from .sharpness import SharpnessConfig, SharpnessResult, measure_sharpness, sharpness
from .sweep import SweepOutcome, SweepSpec, load_records, run_sweep

__all__ = [
    "BASELINE", "Cell", "TrainingSetup", "run_cell", "DivergenceRule", "LossMonitor", "BIT_REDUCTION_LADDER",
    "OPERANDS", "Scheme", "exmy_precision", "parse_scheme", "SharpnessConfig", "SharpnessResult",
    "measure_sharpness", "sharpness", "SweepOutcome", "SweepSpec", "load_records", "run_sweep",
]
