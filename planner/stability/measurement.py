"""How the sharpness metrics measure a model without changing it, and how they summarise their samples.

Both metrics (`sharpness`: ours, `epsilon_sharpness`: the stability paper's) evaluate the model in eval
mode and, by default, with every `SnipLinear` temporarily in high precision: they describe the landscape
of the (high-precision) weights the optimizer moves, whereas a quantized forward is piecewise constant in
the weights and would read ~0 for any perturbation below the format's quantum. Layer precisions, SR step
counters, the training flag and the weights are all restored afterwards, so measuring during training
does not change the run.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator, Sequence

import torch
from torch import nn

from snip_ops import SnipLinear

__all__ = ["measurement_state", "restore", "sample_statistics"]


@torch.no_grad()
def restore(params: Sequence[nn.Parameter], originals: Sequence[torch.Tensor]) -> None:
    """Copy `originals` back into `params`."""
    for p, w in zip(params, originals):
        p.copy_(w)


@contextlib.contextmanager
def measurement_state(model: nn.Module, high_precision: bool) -> Iterator[tuple[list[nn.Parameter], list[torch.Tensor]]]:
    """Eval mode, optionally un-quantized layers, and everything put back afterwards (weights included).

    Yields the trainable parameters and copies of their values."""
    snip_layers = [m for m in model.modules() if isinstance(m, SnipLinear)]
    saved_precisions = [m.precision for m in snip_layers]
    saved_sr_steps = [m.sr_step.clone() for m in snip_layers]
    params = [p for p in model.parameters() if p.requires_grad]
    saved_weights = [p.detach().clone() for p in params]
    was_training = model.training
    model.eval()
    if high_precision:
        for m in snip_layers:
            m.set_precision(None)
    try:
        yield params, saved_weights
    finally:
        restore(params, saved_weights)
        for m, prec, step in zip(snip_layers, saved_precisions, saved_sr_steps):
            m.precision = prec
            m.sr_step.copy_(step)
        model.train(was_training)


def sample_statistics(samples: Sequence[float]) -> tuple[float, float, float]:
    """(mean, sample standard deviation, standard error of the mean); std 0 for a single sample."""
    n = len(samples)
    if n == 0:
        raise ValueError("no samples")
    mean = sum(samples) / n
    std = math.sqrt(sum((s - mean) ** 2 for s in samples) / (n - 1)) if n > 1 else 0.0
    return mean, std, std / math.sqrt(n)
