"""A precision schedule: re-plan when training needs it, not only every `interval` steps.

    schedule = PrecisionSchedule(lr_decay=0.05, raised_budget=Budget.fp4_fraction(0.65), loss_spike=0.3)
    planner = SnipPlanner(model, opt, PlannerConfig(budget=Budget.fp4_fraction(0.85), schedule=schedule))
    ... planner.step(step, batch); loss = ...; planner.observe_loss(float(loss))

Triggers (each optional):

* `loss_spike`: a training loss above (1 + loss_spike) x the exponential moving average of the losses
  before it (weight `loss_ema` on the past) makes the next step re-plan: the statistics of a plan
  made before a spike describe a model that is no longer there.
* `lr_decay`: the first step whose learning rate (the optimizer's first parameter group, set by the
  training loop before `step`) is below (1 - lr_decay) x the largest seen so far -- the start of the
  decay phase -- re-plans, and from then on every plan is made at `raised_budget`. Late in training
  the loss is within a few hundredths of a nat of what precision allows, and the last stretch of
  decay is where a precision gap stops closing; spending the FP4 FLOPs early and fewer late keeps the
  run's mean FP4 share while raising the most sensitive GEMMs when it matters.
* `noise_ratio`: at every re-plan the planner compares the gradient's own minibatch noise with the
  noise the plan's quantization adds, both as the excess loss they cost the optimizer (the weight
  divergence's loss units, divergence.py): gradient_noise_loss / sum_l WD(l, plan). Below
  `noise_ratio` the quantization noise is no longer hidden in the sampling noise, and that plan and all
  after it are made at `raised_budget`. Estimating the minibatch noise costs one extra half-batch
  backward per re-plan (stats.gradient_variance, shared with WD's horizon when it has no logits); a batch
  can be halved when its tensors share a leading size (stats.batch_rows).
* `drift`: re-plan sooner while the plans go stale. A plan is made from the statistics of one step and
  lives until the next re-plan; early in training the layers' divergences move by several times within
  a few dozen steps, and not together (on the tiny preset the deep blocks' loss divergence grows 3-8x
  in the 50 steps after step 100, the first block's 2x: bench/results/cpu-planner-staleness.md), so a plan made at the start of an interval is
  stale by its end. With `drift` the spacing of re-plans adapts: at every re-plan the previous plan's
  objective under the new statistics is compared with the new plan's (the regret, F(old) / F(new) - 1,
  F the configured method's own objective: SNIP's LD/L + lambda WD/L, a heuristic's score); above
  `drift` the next re-plan comes after half the current spacing (at least `min_interval` steps), else
  after twice it (at most the planner's `interval`). The first plan is followed by one `min_interval`
  steps later, so the spacing starts short and grows while the plans hold. WD's horizon stays the
  planner's `interval`: a GEMM kept in FP4 across re-plans keeps its noise.

`ScheduleState` holds the run's side of it (peak learning rate, loss average, which triggers fired) and
is part of the planner's checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Mapping

from .cost import Budget

__all__ = ["PrecisionSchedule", "ScheduleState"]


@dataclass(frozen=True)
class PrecisionSchedule:
    loss_spike: float | None = None      # re-plan after a loss above (1 + loss_spike) x its moving average
    lr_decay: float | None = None        # the start of decay: lr below (1 - lr_decay) x its peak
    noise_ratio: float | None = None     # raise precision once gradient noise / quantization noise < this
    raised_budget: Budget | None = None  # the budget after decay started or the noise ratio fell
    loss_ema: float = 0.9                # weight of the past in the loss average
    drift: float | None = None           # re-plan sooner while the last plan's regret exceeds this
    min_interval: int = 10               # with drift: the shortest spacing of re-plans, in steps

    def __post_init__(self):
        for name in ("loss_spike", "lr_decay", "noise_ratio", "drift"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if self.lr_decay is not None and not self.lr_decay < 1:
            raise ValueError(f"lr_decay must be < 1, got {self.lr_decay}")
        if self.min_interval < 1:
            raise ValueError(f"min_interval must be >= 1, got {self.min_interval}")
        if not 0 < self.loss_ema < 1:
            raise ValueError(f"loss_ema must be in (0, 1), got {self.loss_ema}")
        if (self.lr_decay is not None or self.noise_ratio is not None) and self.raised_budget is None:
            raise ValueError("the lr_decay and noise_ratio triggers raise precision: give raised_budget")


@dataclass
class ScheduleState:
    """What the triggers have seen so far (JSON-able, restored from the planner's checkpoint)."""

    peak_lr: float = 0.0
    loss_average: float | None = None
    spike_pending: bool = False
    decayed: bool = False
    noisy: bool = False
    spacing: int | None = None    # with drift: the steps from the last re-plan to the next
    next_step: int | None = None  # with drift: the step of the next re-plan

    def observe_loss(self, schedule: PrecisionSchedule, loss: float) -> bool:
        """Record a training loss; True when it is a spike (the next step re-plans)."""
        if not math.isfinite(loss):
            return False
        spike = (schedule.loss_spike is not None and self.loss_average is not None
                 and loss > (1 + schedule.loss_spike) * self.loss_average)
        self.spike_pending = self.spike_pending or spike
        a = schedule.loss_ema
        self.loss_average = loss if self.loss_average is None else a * self.loss_average + (1 - a) * loss
        return spike

    def observe_lr(self, schedule: PrecisionSchedule, lr: float) -> bool:
        """Record the step's learning rate; True at the step where decay is first seen."""
        self.peak_lr = max(self.peak_lr, lr)
        if schedule.lr_decay is None or self.decayed or not lr < (1 - schedule.lr_decay) * self.peak_lr:
            return False
        self.decayed = True
        return True

    def space_replans(self, schedule: PrecisionSchedule, interval: int, step: int, regret: float | None) -> None:
        """With drift: after the re-plan at `step` (whose previous plan had `regret` under the new
        statistics; None for the first plan), set when the next one comes."""
        if regret is None or self.spacing is None:
            spacing = schedule.min_interval
        elif regret > schedule.drift:
            spacing = max(schedule.min_interval, self.spacing // 2)
        else:
            spacing = min(interval, 2 * self.spacing)
        self.spacing, self.next_step = spacing, step + spacing

    def budget(self, schedule: PrecisionSchedule | None, base: Budget) -> Budget:
        raised = schedule is not None and schedule.raised_budget is not None and (self.decayed or self.noisy)
        return schedule.raised_budget if raised else base

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Mapping) -> "ScheduleState":
        return cls(**obj)
