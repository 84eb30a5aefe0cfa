"""`SnipCallback`: the SNIP planner inside Hugging Face `transformers.Trainer.train()`.

    trainer = Trainer(model, args, train_dataset=data, callbacks=[SnipCallback(PlannerConfig(interval=50))])
    trainer.train()                                  # writes <output_dir>/snip_plan.json at every re-plan

At `on_train_begin` the callback converts the model's linear layers (not the embeddings or the output
head) to SnipLinear, in bf16 and sharing their parameters, so the optimizer the Trainer already built
keeps training them; it also starts keeping the last training batch that reaches the model's forward.
At `on_step_end` of the first optimizer step and every `interval` steps after it, between two
optimizer steps, it re-plans on the batch that step trained on (its last micro-batch) and installs the
plan, which the next step uses; the first step runs in bf16. The planner's passes use
`torch.autograd.grad` and leave the gradients alone. The world's process zero writes each plan to
`<output_dir>/<plan_file>`. A resumed run re-plans at the end of its first step.
WD's horizon looks ahead along the Trainer's learning-rate schedule (`trainer_lr_schedule`).
"""

from __future__ import annotations

import functools
import os
from typing import Callable, Mapping

import torch
from torch import nn
from transformers import TrainerCallback

from ..controller import PlannerConfig, SnipPlanner

__all__ = ["SnipCallback", "model_loss", "trainer_lr_schedule"]


def trainer_lr_schedule(lr_scheduler, max_steps: int) -> Callable[[int], float] | None:
    """The Trainer's learning-rate multiplier at an optimizer step, 0 from `max_steps` on, which WD's horizon
    looks ahead along (SnipPlanner's lr_schedule): the first lambda of a LambdaLR, as every schedule of
    transformers.get_scheduler is; None for another scheduler (the horizon then holds the current rate)."""
    lambdas = getattr(lr_scheduler, "lr_lambdas", None)
    return functools.partial(_until, lambdas[0], max_steps) if lambdas else None


def _until(multiplier: Callable[[int], float], end: int, step: int) -> float:
    return float(multiplier(step)) if step < end else 0.0


def model_loss(model: nn.Module, batch: Mapping) -> torch.Tensor:
    """The loss a Hugging Face model computes itself from a batch with labels: `model(**batch).loss`."""
    loss = model(**batch).loss
    if loss is None:
        raise ValueError("the model returned no loss: the training batches carry no 'labels'; pass "
                         "SnipCallback(loss_fn=(model, batch) -> loss)")
    return loss


class SnipCallback(TrainerCallback):
    """Converts the model at the start of training and re-plans between optimizer steps (see the module
    docstring). `loss_fn(model, batch) -> loss` gets the keyword arguments of a training forward."""

    def __init__(self, config: PlannerConfig | None = None, *, loss_fn: Callable | None = None,
                 plan_file: str = "snip_plan.json"):
        self.config = config or PlannerConfig()
        self.loss_fn = loss_fn or model_loss
        self.plan_file = plan_file
        self.planner: SnipPlanner | None = None
        self._batch: dict | None = None
        self._hook = None
        self._planning = False  # the planner's own forward passes are not training batches

    def on_train_begin(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        if model is None:
            raise ValueError("SnipCallback needs the Trainer's model (the 'model' argument of on_train_begin)")
        # Accelerate wraps the optimizer; the planner reads the wrapped one's learning rate and Adam state.
        optimizer = getattr(optimizer, "optimizer", optimizer)
        self.planner = SnipPlanner(model, optimizer, self.config, loss_fn=self.loss_fn,
                                   lr_schedule=trainer_lr_schedule(lr_scheduler, state.max_steps))
        self._hook = model.register_forward_pre_hook(self._keep_batch, with_kwargs=True)

    def _keep_batch(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if not module.training or self._planning:
            return
        if args:
            raise TypeError("SnipCallback expects the Trainer's model(**batch) calls, got positional inputs")
        # num_items_in_batch scales the loss to the whole accumulated batch; the planner wants the
        # mean loss of this micro-batch.
        self._batch = {k: v for k, v in kwargs.items() if k != "num_items_in_batch"}

    def on_step_end(self, args, state, control, **kwargs):
        if self._batch is None:
            raise RuntimeError("no training batch reached the model's forward before the optimizer step")
        self._planning = True
        try:
            plan = self.planner.step(state.global_step, self._batch)
        finally:
            self._planning = False
        if plan is not None and self.plan_file and state.is_world_process_zero:
            os.makedirs(args.output_dir, exist_ok=True)
            plan.save(os.path.join(args.output_dir, self.plan_file))

    def on_train_end(self, args, state, control, **kwargs):
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._batch = None
