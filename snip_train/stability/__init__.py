"""The stability sweep: seeds x learning rates x precisions of short training runs (`snip sweep`).

* `cell`     -- one short, bounded training run, recording loss, divergence, spikes and sharpness;
* `sweep`    -- the grid, run in parallel processes and resumable;
* `analysis`, `report` -- divergence tables, sharpness/divergence correlation, the Markdown report;
* `figures`  -- the picture of the paper's sharpness (the shared pictures are `snip_train.plots`');
* `presets`, `command` -- named grids and the `snip sweep` command.

The numerics it measures with (eXmY simulation, sharpness, the divergence rule) are the library's:
`planner.stability`.
"""

from .cell import BASELINE, Cell, TrainingSetup, run_cell
from .sweep import SweepOutcome, SweepSpec, load_records, run_sweep

__all__ = ["BASELINE", "Cell", "TrainingSetup", "run_cell", "SweepOutcome", "SweepSpec", "load_records", "run_sweep"]
