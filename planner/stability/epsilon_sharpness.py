"""The stability paper's sharpness: an epsilon-sharpness in the style of Keskar et al., on the last token
(docs/design.md §5; our own metric, a KL divergence over all positions, is `sharpness`).

    phi_eps(theta) = 100 * max over delta in C_eps of (f(theta + delta) - f(theta)) / (1 + f(theta)),
    C_eps = { delta : |delta_i| <= eps (|theta_i| + 1) for every weight i }

(Keskar et al., "On Large-Batch Training for Deep Learning: Generalization Gap and Sharp Minima", ICLR
2017, in the full parameter space.) The box is relative to each weight's magnitude, plus one so that
weights near zero still move by ~eps; phi is the worst-case increase of f within it, in percent of 1 + f.

f, from the logits at the last position only. For one held-out batch of windows [B, T+1] the model reads
each window's first T tokens, and f is the mean over the B windows of the cross-entropy of the logits at
the last position (T-1) against the window's last token, computed in float64:

    f(theta) = mean over b of  -log softmax(logits_theta(window_b[:T])[T-1])[window_b[T]]

Why this f: Keskar's metric is defined on a loss -- dividing by 1 + f and reading the maximum as "the
worst-case increase" presume f >= 0 with lower better -- and the cross-entropy is the loss the model is
trained on, here restricted to the last position as the paper restricts its measurement. The last
position is the one whose prediction conditions on the whole window. A function of the logits that is
not a loss (a norm, the largest logit) has no such reading. The other positions still shape f through
attention, but their own predictions do not enter it (our KL sharpness averages over all of them).

Maximisation, approximate: projected sign-gradient ascent in the box (the L-infinity projected gradient
ascent of adversarial training). From a uniformly random point of the box (seeded generator), `steps`
times

    delta <- clip(delta + step_size * w * sign(grad f(theta + delta)), -w, w),   w = eps (|theta| + 1),

then f at the last point. The reported maximum is the largest f over every point evaluated, delta = 0
included, so phi >= 0; it is a lower bound of the exact maximum. Keskar et al. used L-BFGS-B, which keeps
several float64 copies of the whole parameter vector on the host; the sign steps work in place on the
parameters' device, and they reach the exact maximum of a separable convex objective whose maximiser is a
box vertex (tests/planner/test_stability_epsilon_sharpness.py checks a quadratic against its closed form).

One ascent per held-out batch: each is one sample; the result carries their mean, standard deviation and
standard error, like our metric's. The model is measured as `measurement` says (eval mode, by default
high precision, everything restored); gradients come from `torch.autograd.grad`, so the training
gradients in `.grad` are not touched.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from .measurement import measurement_state, restore, sample_statistics

__all__ = ["EpsilonSharpnessConfig", "EpsilonSharpnessResult", "epsilon_sharpness", "last_token_loss", "maximise_in_box"]


@dataclass(frozen=True)
class EpsilonSharpnessConfig:
    eps: float = 1e-3          # box size relative to |theta| + 1 (Keskar et al. report 1e-3 and 5e-4)
    steps: int = 5             # ascent steps: one forward and backward per held-out batch each
    step_size: float = 0.5     # per step, as a fraction of the box half-width w (5 x 0.5: the box crossed 1.25 times)
    high_precision: bool = True  # evaluate with SnipLinear layers un-quantized (see `measurement`)

    def __post_init__(self):
        if not self.eps > 0:
            raise ValueError(f"eps must be > 0, got {self.eps}")
        if self.steps < 1 or not self.step_size > 0:
            raise ValueError(f"steps must be >= 1 and step_size > 0, got {self.steps}, {self.step_size}")


@dataclass(frozen=True)
class EpsilonSharpnessResult:
    eps: float
    mean: float          # mean phi over samples (percent of 1 + f)
    std: float           # sample standard deviation (0 for a single sample)
    stderr: float        # std / sqrt(n)
    n: int               # samples: held-out batches
    clean_loss: float    # mean f(theta) over the batches (nats)
    worst_loss: float    # mean of the largest f found in the box (nats)

    def to_json(self) -> dict:
        return {
            "eps": self.eps, "mean": self.mean, "std": self.std, "stderr": self.stderr, "n": self.n,
            "clean_loss": self.clean_loss, "worst_loss": self.worst_loss,
        }


def last_token_loss(model: nn.Module, window: torch.Tensor) -> torch.Tensor:
    """f of the module docstring: mean cross-entropy (float64) of the last token of each window [B, T+1]."""
    logits = model(window[:, :-1])[:, -1]
    return F.cross_entropy(logits.double(), window[:, -1])


@torch.no_grad()
def _move(params: Sequence[torch.Tensor], origin: Sequence[torch.Tensor], deltas: Sequence[torch.Tensor]) -> None:
    for p, o, d in zip(params, origin, deltas):
        p.copy_(o + d)


def _larger(best: float, value: float) -> float:
    """max(best, value), NaN winning: a perturbation that makes f NaN is reported, not hidden."""
    return value if math.isnan(value) or value > best else best


def maximise_in_box(
    objective: Callable[[], torch.Tensor],
    params: Sequence[torch.Tensor],
    eps: float,
    steps: int,
    step_size: float,
    generator: torch.Generator,
) -> tuple[float, float]:
    """(f at the params' current values, the largest f found in the box C_eps around them), f = `objective()`
    a scalar computed from `params` (tensors that require grad). The ascent is the module docstring's; the
    params are moved during it and put back, bit for bit, at the end."""
    origin = [p.detach().clone() for p in params]
    widths = [eps * (o.abs() + 1) for o in origin]
    try:
        with torch.no_grad():
            clean = float(objective())
        best = clean
        # Drawn on the CPU generator whatever the device, so a seed means the same start everywhere.
        deltas = [(2 * torch.rand(w.shape, generator=generator) - 1).to(w) * w for w in widths]
        for _ in range(steps):
            _move(params, origin, deltas)
            value = objective()
            best = _larger(best, float(value.detach()))
            grads = torch.autograd.grad(value, params, allow_unused=True)
            with torch.no_grad():
                for d, g, w in zip(deltas, grads, widths):
                    if g is not None:  # a parameter f does not depend on stays where it started
                        d.add_(step_size * w * g.sign()).clamp_(min=-w, max=w)
        _move(params, origin, deltas)
        with torch.no_grad():
            best = _larger(best, float(objective()))
    finally:
        restore(params, origin)
    return clean, best


def epsilon_sharpness(
    model: nn.Module,
    batches: Sequence[torch.Tensor],
    config: EpsilonSharpnessConfig = EpsilonSharpnessConfig(),
    seed: int = 0,
) -> EpsilonSharpnessResult:
    """phi_eps of `model` (tokens [B, T] -> logits [B, T, V]) on held-out windows `batches` ([B, T+1]).

    `seed` fixes the ascents' random starts. See the module docstring for the definition."""
    if not batches:
        raise ValueError("epsilon-sharpness needs at least one held-out batch")
    generator = torch.Generator().manual_seed(seed)
    phis, clean_losses, worst_losses = [], [], []
    with measurement_state(model, config.high_precision) as (params, _):
        for batch in batches:
            clean, worst = maximise_in_box(functools.partial(last_token_loss, model, batch), params,
                                           config.eps, config.steps, config.step_size, generator)
            phis.append(100.0 * (worst - clean) / (1.0 + clean))
            clean_losses.append(clean)
            worst_losses.append(worst)
    mean, std, stderr = sample_statistics(phis)
    n = len(phis)
    return EpsilonSharpnessResult(config.eps, mean, std, stderr, n, sum(clean_losses) / n, sum(worst_losses) / n)
