"""Loss-landscape sharpness of an autoregressive LM, measured on its output distribution (docs/design.md §5).

    sharpness(rho, d) = mean over held-out tokens of KL( p_theta(. | prefix) || p_{theta + delta}(. | prefix) ) / rho^2

with a relative weight perturbation: every parameter tensor W moves by `delta_W = rho * ||W|| * d_W / ||d_W||`
(per-tensor normalisation, so the perturbation is scale-invariant: rescaling a layer does not change
its share). The direction `d` is either

* "random":   i.i.d. Gaussian per tensor (from a seeded generator, so repeated measurements over training
              use the same directions), or
* "gradient": the gradient of the next-token cross-entropy on the same held-out batch (the ascent
              direction; first order, the steepest way to change the outputs).

For small rho the KL is quadratic, KL ~ rho^2/2 * d^T F d (F the Fisher of the output distribution), so
KL/rho^2 tends to a finite, direction-dependent constant -- the sharpness -- while the KL itself tends
to 0. Every (direction, batch) pair is one sample; the result carries their mean, standard deviation
and standard error, so two measurements can be compared with their noise.

The model is evaluated in eval mode and, by default, with every `SnipLinear` temporarily in high
precision, and left exactly as it was (`measurement`). The stability paper's own metric, an
epsilon-sharpness in the style of Keskar et al. on the last token, is `epsilon_sharpness`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn

from .measurement import measurement_state, restore, sample_statistics

__all__ = ["DIRECTIONS", "SharpnessConfig", "SharpnessResult", "sharpness", "measure_sharpness"]

DIRECTIONS = ("random", "gradient")


@dataclass(frozen=True)
class SharpnessConfig:
    rho: float = 0.01                  # relative size of the weight perturbation
    directions: tuple[str, ...] = DIRECTIONS
    random_directions: int = 2         # random directions per measurement (each over every batch)
    high_precision: bool = True        # evaluate with SnipLinear layers un-quantized (see module docstring)

    def __post_init__(self):
        if not self.rho > 0:
            raise ValueError(f"rho must be > 0, got {self.rho}")
        if not self.directions or any(d not in DIRECTIONS for d in self.directions):
            raise ValueError(f"directions must be a non-empty subset of {DIRECTIONS}, got {self.directions}")
        if self.random_directions < 1:
            raise ValueError("random_directions must be >= 1")


@dataclass(frozen=True)
class SharpnessResult:
    direction: str
    rho: float
    mean: float          # mean KL / rho^2 over samples
    std: float           # sample standard deviation (0 for a single sample)
    stderr: float        # std / sqrt(n)
    n: int               # samples: (direction, held-out batch) pairs
    kl_mean: float       # mean KL itself (nats per token), i.e. mean * rho^2

    def to_json(self) -> dict:
        return {
            "direction": self.direction, "rho": self.rho, "mean": self.mean, "std": self.std,
            "stderr": self.stderr, "n": self.n, "kl_mean": self.kl_mean,
        }


def _next_token_log_probs(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """[tokens, vocab] float64 log-probabilities of the next token at every position of `batch[:, :-1]`."""
    logits = model(batch[:, :-1])
    return torch.log_softmax(logits.double().reshape(-1, logits.shape[-1]), dim=-1)


def _mean_kl(clean_log_p: torch.Tensor, perturbed_log_q: torch.Tensor) -> float:
    """Mean over tokens of KL(p || q), nats."""
    return float((clean_log_p.exp() * (clean_log_p - perturbed_log_q)).sum(-1).mean())


@torch.no_grad()
def _perturb(params: Sequence[nn.Parameter], originals: Sequence[torch.Tensor], directions, rho: float) -> None:
    """Set every parameter to W + rho * ||W|| * d / ||d|| (a tensor with d == 0 stays at W)."""
    restore(params, originals)
    for p, w, d in zip(params, originals, directions):
        d_norm = float(d.norm())
        if d_norm > 0:
            p.add_(d, alpha=rho * float(w.norm()) / d_norm)


def _random_directions(params: Sequence[nn.Parameter], generator: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(p.shape, generator=generator, dtype=torch.float32).to(p) for p in params]


def _gradient_directions(model: nn.Module, params: Sequence[nn.Parameter], batch: torch.Tensor) -> list[torch.Tensor]:
    logits = model(batch[:, :-1])
    loss = nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    # torch.autograd.grad, not backward(): the training gradients in p.grad must not be touched.
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g.detach() for p, g in zip(params, grads)]


def _summary(direction: str, rho: float, samples: list[float]) -> SharpnessResult:
    mean, std, stderr = sample_statistics(samples)
    return SharpnessResult(direction, rho, mean, std, stderr, len(samples), mean * rho * rho)


def sharpness(
    model: nn.Module,
    batches: Sequence[torch.Tensor],
    rho: float = 0.01,
    direction: str = "random",
    random_directions: int = 2,
    seed: int = 0,
    high_precision: bool = True,
) -> SharpnessResult:
    """Sharpness of `model` (tokens [B, T] -> logits [B, T, V]) on held-out windows `batches` ([B, T+1]).

    `seed` fixes the random directions. See the module docstring for the definition.
    """
    return measure_sharpness(
        model, batches, SharpnessConfig(rho, (direction,), random_directions, high_precision), seed
    )[direction]


def measure_sharpness(
    model: nn.Module, batches: Sequence[torch.Tensor], config: SharpnessConfig = SharpnessConfig(), seed: int = 0
) -> dict[str, SharpnessResult]:
    """Sharpness in every direction kind of `config`, as {direction: SharpnessResult}."""
    if not batches:
        raise ValueError("sharpness needs at least one held-out batch")
    results = {}
    with measurement_state(model, config.high_precision) as (params, originals):
        with torch.no_grad():
            clean = [_next_token_log_probs(model, b) for b in batches]
        rho2 = config.rho ** 2
        if "random" in config.directions:
            generator = torch.Generator().manual_seed(seed)
            samples = []
            for _ in range(config.random_directions):
                dirs = _random_directions(params, generator)
                _perturb(params, originals, dirs, config.rho)
                with torch.no_grad():
                    samples += [_mean_kl(c, _next_token_log_probs(model, b)) / rho2 for c, b in zip(clean, batches)]
            results["random"] = _summary("random", config.rho, samples)
        if "gradient" in config.directions:
            samples = []
            for c, b in zip(clean, batches):
                restore(params, originals)
                dirs = _gradient_directions(model, params, b)
                _perturb(params, originals, dirs, config.rho)
                with torch.no_grad():
                    samples.append(_mean_kl(c, _next_token_log_probs(model, b)) / rho2)
            results["gradient"] = _summary("gradient", config.rho, samples)
    return results
