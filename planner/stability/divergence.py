"""When a training run counts as diverged, and what counts as a loss spike.

Two kinds of judgement:

* online, during the run (`LossMonitor`), so a hopeless run stops early and the sweep stays bounded:
  a non-finite loss, or a sustained blow-up -- the smoothed (EMA) training loss staying more than
  `blowup_nats` above the untrained model's loss for `blowup_patience` consecutive steps. Patience
  matters: at high learning rates small models often jump far above the initial loss during warmup
  and then recover; such a run has spikes, it has not diverged. A spike is a single step whose loss
  exceeds the EMA before it by a factor `spike_ratio`; spikes are counted and never stop a run.
* offline, against the baseline precision (`exceeds_baseline`, applied by the sweep's analysis, so
  the threshold can be changed without retraining): a finished run whose final held-out loss is more
  than `baseline_nats` above the mean final loss of the baseline
  precision's runs (those that did not diverge) at the same learning rate. The mean over seeds, not
  the same seed's run, because near the stability edge single baseline runs vary by tenths of a nat.
  This catches runs that never learn properly (e.g. weights or gradients flushed to zero by a narrow
  exponent range) or that settle far above high precision. Where every baseline run at that learning
  rate diverged, the online rule alone decides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["DivergenceRule", "LossMonitor", "exceeds_baseline"]


@dataclass(frozen=True)
class DivergenceRule:
    """The online rule (part of a run's configuration: it decides when the run stops)."""

    blowup_nats: float = 1.0     # EMA loss above the untrained loss by this much ...
    blowup_patience: int = 25    # ... for this many consecutive steps: diverged
    spike_ratio: float = 1.25    # a step's loss above the previous EMA times this: a spike
    ema_alpha: float = 0.1       # EMA weight of the newest step (~10-step memory)

    def __post_init__(self):
        if self.blowup_nats <= 0 or self.blowup_patience < 1 or self.spike_ratio <= 1 or not 0 < self.ema_alpha <= 1:
            raise ValueError(f"invalid divergence rule {self}")


def exceeds_baseline(final_loss: float | None, baseline_loss: float | None, baseline_nats: float) -> bool:
    """The offline rule; False when either loss is unknown (the online rule then decides alone)."""
    if final_loss is None or baseline_loss is None:
        return False
    return final_loss > baseline_loss + baseline_nats


class LossMonitor:
    """Feeds on one training loss per step and says when the run has diverged (online rule)."""

    def __init__(self, rule: DivergenceRule, initial_loss: float):
        self.rule = rule
        self.ceiling = initial_loss + rule.blowup_nats
        self.ema: float | None = None
        self.steps_above = 0
        self.spike_steps: list[int] = []
        self.reason: str | None = None  # "non-finite" or "blow-up" once diverged

    def update(self, step: int, loss: float) -> bool:
        """Record `loss` at `step`; True when the run has diverged and should stop."""
        if not math.isfinite(loss):
            self.reason = "non-finite"
            return True
        if self.ema is not None and loss > self.ema * self.rule.spike_ratio:
            self.spike_steps.append(step)
        self.ema = loss if self.ema is None else (1 - self.rule.ema_alpha) * self.ema + self.rule.ema_alpha * loss
        self.steps_above = self.steps_above + 1 if self.ema > self.ceiling else 0
        if self.steps_above >= self.rule.blowup_patience:
            self.reason = "blow-up"
            return True
        return False
