"""Training-stability numerics (docs/design.md §5): check a precision plan before spending a cluster on it.

* `exmy`              -- eXmY bit-reduction simulation on chosen GEMM operands (`exmy_precision`, `Scheme`),
  including the stability paper's masking simulation (`paper_scheme`);
* `sharpness`         -- ours: loss-landscape sharpness of an autoregressive LM on its output distribution;
* `epsilon_sharpness` -- the stability paper's: Keskar et al.'s epsilon-sharpness of the last token's loss;
* `measurement`       -- how both measure a model without changing it;
* `divergence`        -- when a run counts as diverged, what counts as a loss spike (`LossMonitor` for any
  training loop).

The seed x learning-rate x precision sweep that uses them, its reports and pictures are the
application's (`snip_train.stability`, `snip sweep`).
"""

from .divergence import DivergenceRule, LossMonitor, exceeds_baseline
from .epsilon_sharpness import EpsilonSharpnessConfig, EpsilonSharpnessResult, epsilon_sharpness
from .exmy import BIT_REDUCTION_LADDER, OPERANDS, Scheme, exmy_precision, paper_scheme, parse_scheme
from .sharpness import SharpnessConfig, SharpnessResult, measure_sharpness, sharpness

__all__ = [
    "DivergenceRule", "LossMonitor", "exceeds_baseline", "BIT_REDUCTION_LADDER", "OPERANDS", "Scheme",
    "exmy_precision", "paper_scheme", "parse_scheme", "SharpnessConfig", "SharpnessResult", "measure_sharpness",
    "sharpness", "EpsilonSharpnessConfig", "EpsilonSharpnessResult", "epsilon_sharpness",
]
