"""`SnipTrainer`: torchtitan's Trainer with the SNIP planner re-planning between optimizer steps.

torchtitan (0.3.0) converters rewrite the model config before the model exists, and its trainer has
no hook that sees the model, the optimizer and the step's batch together; the planner needs all
three. So the live planner is a Trainer subclass (torchtitan's own pattern for trainers with extra
behaviour, e.g. FluxTrainer): at the start of every step it hands the step's first micro-batch to
`SnipPlanner.step`, which re-plans at the first step and every `interval` steps after it, before that
step's forward, and installs the plan on the `TitanSnipLinear` layers of `SnipLinearConverter`. The
planner's forward and backward passes use the trainer's own input processing and loss, and
`torch.autograd.grad`, so they leave the parameters' gradients, the token count and the data order
as they were. torchtitan shards the model with FSDP2 even on one rank; the planner measures the
whole, unsharded parameters and their Adam state (`planner.fsdp`). Rank 0 writes each
new plan to `<dump_folder>/<snip.plan_file>`. A resumed run re-plans at its first step. WD's horizon looks
ahead along the trainer's learning-rate schedule (`titan_lr_schedule`).

The job must run the model's whole forward in one call, once per layer: activation checkpointing
(its recomputation runs each layer again inside the backward) and a chunked loss (its output head runs
outside the model's forward, once per chunk, and FSDP2 reshards that head's parameters in the middle of
a measurement) are refused with the job config; `config_registry.llama3_debugmodel_snip_planner` turns
both off.
"""

from __future__ import annotations

import functools
import itertools
import os
from dataclasses import dataclass, field, fields
from typing import Callable, Literal

import torch
import torch.distributed as dist
from torchtitan.components.loss import IGNORE_INDEX, ChunkedLossWrapper
from torchtitan.components.optimizer import OptimizersContainer
from torchtitan.tools.logging import logger
from torchtitan.trainer import Trainer

from ...controller import PlannerConfig, SnipPlanner
from ...cost import Budget
from .converter import TitanSnipLinear

__all__ = ["SnipPlanning", "SnipTrainer", "snip_planner", "titan_lr_schedule"]


@dataclass(kw_only=True, slots=True)
class SnipPlanning:
    """The planner's job-config section (`--snip.interval 100 --snip.budget fp4=0.75`)."""

    interval: int = 100
    """Re-plan at the first step and every `interval` steps after it."""

    budget: str = "fp4=0.75"
    """'fp4=0.75' (at least 75% of the linear FLOPs in FP4) or 'cost=0.3' (30% of the all-bf16 cost)."""

    granularity: Literal["gemm", "layer"] = "gemm"
    """One precision per GEMM (fprop, dgrad, wgrad), or one per layer."""

    plan_file: str = "snip_plan.json"
    """Where rank 0 writes each new plan, relative to the dump folder ('' writes none)."""

    def __post_init__(self):
        self.planner_config()  # a bad interval, budget or granularity fails with the job config

    def planner_config(self) -> PlannerConfig:
        return PlannerConfig(interval=self.interval, budget=Budget.parse(self.budget), granularity=self.granularity)


def snip_planner(model_parts: list[torch.nn.Module], optimizers: torch.optim.Optimizer, config: PlannerConfig,
                 loss_fn: Callable, log: Callable[[str], None] | None = None,
                 lr_schedule: Callable[[int], float] | None = None) -> SnipPlanner:
    """A SnipPlanner for the `TitanSnipLinear` layers of a torchtitan model (one model part: no
    pipeline parallelism) trained by `optimizers` (an OptimizersContainer or one optimizer).
    `loss_fn(model, batch) -> scalar loss` runs the model on a batch of the training data;
    `lr_schedule` (`titan_lr_schedule`) the learning rate WD's horizon looks ahead along."""
    if len(model_parts) != 1:
        raise ValueError(f"the SNIP planner needs the whole model in one part, got {len(model_parts)} "
                         "(pipeline parallelism is not supported)")
    model = model_parts[0]
    weights = [m.weight for m in model.modules() if isinstance(m, TitanSnipLinear)]
    if not weights:
        raise ValueError("the model has no TitanSnipLinear layer: add SnipLinearConverter.Config() to the model "
                         "registry's converters")
    return SnipPlanner(model, _optimizer_of(weights, optimizers), config, loss_fn=loss_fn,
                       filter_fn=lambda module, name: isinstance(module, TitanSnipLinear), log=log,
                       lr_schedule=lr_schedule)


def titan_lr_schedule(lr_schedulers, steps: int) -> Callable[[int], float] | None:
    """The learning-rate multiplier of torchtitan's step (counted from 1, as `Trainer.step` is when the
    step runs), 0 after the last of `steps`: its LRSchedulersContainer's first LambdaLR, whose own count
    starts at 0; None for another scheduler (WD's horizon then holds the current rate)."""
    schedulers = getattr(lr_schedulers, "schedulers", [lr_schedulers])
    lambdas = getattr(schedulers[0], "lr_lambdas", None) if schedulers else None
    return functools.partial(_multiplier_of_step, lambdas[0], steps) if lambdas else None


def _multiplier_of_step(multiplier: Callable[[int], float], steps: int, step: int) -> float:
    return float(multiplier(step - 1)) if step <= steps else 0.0


def _optimizer_of(weights: list[torch.nn.Parameter], optimizers: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer that updates every planned weight: the planner reads its learning rate and Adam
    state, which an OptimizersContainer keeps in the optimizers it holds, not in itself."""
    candidates = list(optimizers) if isinstance(optimizers, OptimizersContainer) else [optimizers]
    wanted = {id(w) for w in weights}
    for optimizer in candidates:
        if wanted <= {id(p) for group in optimizer.param_groups for p in group["params"]}:
            return optimizer
    raise ValueError("no single optimizer updates all the TitanSnipLinear weights; the planner needs the one "
                     "optimizer whose learning rate and Adam state apply to them")


class SnipTrainer(Trainer):
    """torchtitan's Trainer plus `SnipPlanner.step` before every step (see the module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        snip: SnipPlanning = field(default_factory=SnipPlanning)

        def __post_init__(self):
            Trainer.Config.__post_init__(self)  # slots=True dataclasses cannot use a bare super()
            if not self.training.disable_cuda_graphs:
                raise ValueError("SnipTrainer needs --training.disable_cuda_graphs: a captured graph would replay "
                                 "the precisions and stochastic-rounding offsets of its capture")
            if self.parallelism.pipeline_parallel_degree > 1:
                raise ValueError("SnipTrainer does not support pipeline parallelism: the planner measures the "
                                 "whole model")
            if self.activation_checkpoint is not None:
                raise ValueError("SnipTrainer needs activation checkpointing off (the subcommand "
                                 "activation-checkpoint:none): its recomputation runs every layer a second time "
                                 "inside the planner's backward")
            if isinstance(self.loss, ChunkedLossWrapper.Config):
                raise ValueError("SnipTrainer needs a loss that is not chunked (e.g. CrossEntropyLoss.Config): the "
                                 "planner measures the model's whole forward, output head included")

        @classmethod
        def of(cls, config: Trainer.Config, snip: SnipPlanning | None = None) -> "SnipTrainer.Config":
            """A Trainer.Config (e.g. from a model's config_registry) with the planner section added."""
            values = {f.name: getattr(config, f.name) for f in fields(Trainer.Config)}
            return cls(**values, snip=snip or SnipPlanning())

    def __init__(self, config: Config):
        super().__init__(config)
        self.snip_planner = snip_planner(self.model_parts, self.optimizers, config.snip.planner_config(),
                                         loss_fn=self._planner_loss, log=logger.info,
                                         lr_schedule=titan_lr_schedule(self.lr_schedulers, config.training.steps))
        self.snip_plan_path = os.path.join(config.dump_folder, config.snip.plan_file) if config.snip.plan_file else None

    def train_step(self, data_iterator):
        """Re-plan on the step's first micro-batch when due (the planner's passes see the parameters
        unsharded, see planner/fsdp.py), then torchtitan's step on all of its micro-batches."""
        first = next(data_iterator)
        input_dict, labels = first
        batch = ({k: v.to(self.device) if torch.is_tensor(v) else v for k, v in input_dict.items()},
                 labels.to(self.device))
        if self.snip_planner.step(self.step, batch) is not None:
            self._save_plan()
        super().train_step(itertools.chain([first], data_iterator))

    def _planner_loss(self, model: torch.nn.Module, batch) -> torch.Tensor:
        """The training loss of `batch`, the mean over its valid tokens, as the trainer computes it."""
        input_dict, labels = batch
        tokens_seen = self.ntokens_seen
        inputs, labels, extra_kwargs = self.post_dataloading_process(dict(input_dict), labels)
        self.ntokens_seen = tokens_seen  # the planner's passes are not training tokens
        loss_kwargs = {"positions": extra_kwargs["positions"]} if "positions" in extra_kwargs else {}
        with self.train_context():
            pred = model(inputs, **extra_kwargs)
            loss, _ = self.loss_fn(pred, labels, (labels != IGNORE_INDEX).sum(), **loss_kwargs)
        return loss

    def _save_plan(self) -> None:
        if self.snip_plan_path is None or (dist.is_initialized() and dist.get_rank() != 0):
            return
        os.makedirs(os.path.dirname(self.snip_plan_path) or ".", exist_ok=True)
        self.snip_planner.plan.save(self.snip_plan_path)
