"""`TrainState`: everything a training run needs to continue exactly from a step.

    warm = train(TrainConfig(steps=300, ...), stop_at=200)            # 200 steps, then stop
    branch = train(TrainConfig(steps=300, ...), start=warm["state"])  # steps 200..299, bit for bit the
                                                                      # last 100 steps of a 300-step run

A state holds copies, never references: the model's and the optimizer's tensors are cloned when the
state is captured and again when a run starts from it (AdamW steps its moments in place), so one state
can start any number of branches that share no mutable tensor. Every field is a tensor, a plain Python
container or a number, so a state can be pickled (the paired comparison sends it to its workers) or
written with `torch.save`.

What makes a run continue exactly, besides the weights and the optimizer state:

* the generator of the training-batch order (`data_rng`): the next batch is the one the uninterrupted
  run would draw. `reseed_data` replaces it, for branches that should see other batches;
* the global torch, numpy and Python generators (nothing in the loop draws from them today; a state
  restores them so that a hook that does stays exact);
* the stochastic-rounding counters of the `SnipLinear` layers (`SnipLinear.sr_step`, not part of a
  state dict): a low-precision layer's next forward draws the SR bits it would have drawn.

The learning-rate schedule needs no state: it is a function of the step over the whole run
(`train.lr_at`), so a run that starts from a state at step W continues the schedule of its `steps`.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

__all__ = ["TrainState", "capture", "restore", "sr_counters", "set_sr_counters"]


@dataclass(frozen=True)
class TrainState:
    step: int                         # optimizer steps taken: the run continues with step `step`
    model: Mapping[str, torch.Tensor]  # model.state_dict(), cloned
    optimizer: Mapping[str, Any]      # optimizer.state_dict(), deep-copied
    sr_counters: Mapping[str, int]    # {FQN: SnipLinear.sr_step} of the low-precision layers
    data_rng: torch.Tensor            # torch.Generator state of the training-batch order
    torch_rng: torch.Tensor           # torch.get_rng_state()
    numpy_rng: tuple                  # np.random.get_state()
    python_rng: tuple                 # random.getstate()

    def reseed_data(self, seed: int) -> "TrainState":
        """The same state with the training-batch order drawn from a generator seeded with `seed`."""
        return dataclasses.replace(self, data_rng=torch.Generator().manual_seed(seed).get_state())


def _sr_layers(model: nn.Module) -> dict[str, nn.Module]:
    # SnipLinear is recognised by its SR counter, so that bf16-only runs need not import snip_ops.
    return {name: m for name, m in model.named_modules() if isinstance(getattr(m, "sr_step", None), torch.Tensor)}


def sr_counters(model: nn.Module) -> dict[str, int]:
    """{FQN: SR counter} of the model's low-precision (SnipLinear) layers."""
    return {name: int(m.sr_step) for name, m in _sr_layers(model).items()}


def set_sr_counters(model: nn.Module, counters: Mapping[str, int]) -> None:
    """Set the SR counters of the low-precision layers named in `counters`.

    A layer that was plain `nn.Linear` when the counters were read (a bf16 warm-up) keeps its 0, as in
    any fresh run; a counter of a layer that is plain `nn.Linear` now is not needed.
    """
    for name, m in _sr_layers(model).items():
        if name in counters:
            m.sr_step.fill_(counters[name])


def capture(step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
            data_rng: torch.Generator) -> TrainState:
    """A copy of the run's state before step `step` (see the module docstring)."""
    return TrainState(
        step=step,
        model={k: v.detach().clone() for k, v in model.state_dict().items()},
        optimizer=copy.deepcopy(optimizer.state_dict()),
        sr_counters=sr_counters(model),
        data_rng=data_rng.get_state(),
        torch_rng=torch.get_rng_state(),
        numpy_rng=np.random.get_state(),
        python_rng=random.getstate(),
    )


def restore(state: TrainState, model: nn.Module, optimizer: torch.optim.Optimizer,
            data_rng: torch.Generator) -> None:
    """Load `state` into a freshly built model, its optimizer and the batch-order generator.

    Copies: the optimizer would otherwise step the state's moment tensors in place (its
    `load_state_dict` keeps tensors that already have the parameter's dtype and device). The SR counters
    are set separately (`set_sr_counters`), once every low-precision layer exists.
    """
    model.load_state_dict(state.model)  # copies into the model's own parameters
    optimizer.load_state_dict(copy.deepcopy(dict(state.optimizer)))
    data_rng.set_state(state.data_rng)
    torch.set_rng_state(state.torch_rng)
    np.random.set_state(state.numpy_rng)
    random.setstate(state.python_rng)
