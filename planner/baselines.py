"""Baseline plans for comparison (docs/design.md §4 "Validation"), with the same interface as `ilp.solve`.

    baseline(name, stats, budget, high="fp8", low="fp4", ...) -> Plan

Every heuristic is judged at exactly SNIP's budget: it scores the layers, and the same ILP, solver and
budget check as SNIP's (`ilp.solve` with the heuristic's `objective`) choose the plan of least total
score. A layer's score is what putting it in `low` costs; in `high` it costs nothing, except for the
error-based baselines, which pay the error of whichever precision the layer gets:

* "uniform_<p>" (e.g. "uniform_fp4"): every layer in p, no ILP; `metrics["meets_budget"]` says whether the
  budget is met (uniform FP4 meets every FP4-share budget, with more FP4 than it asks for);
* "first_last":    layers of the first and last transformer block (and layers outside blocks) score 1, the
                   others ~0, so the end blocks are the last to go low;
* "layer_type":    layers whose name ends in one of `keep` (default down_proj, o_proj) score 1, the rest ~0;
* "min_rel_error": the sum over the three GEMMs of the relative squared error e_g(p) (docs/design.md §4.2):
                   no curvature, no optimizer;
* "min_abs_error": the same errors times the squared norm of each GEMM's exact output, ||y||^2, ||dx||^2,
                   ||dW||^2 on the calibration batch: absolute squared error (a layer with large outputs
                   pays more; the gradient GEMMs' outputs are tiny next to activations, so in effect
                   the forward error decides);
* "random":        a score drawn uniformly per layer from a generator seeded with `seed`.

The ~0 scores are a tie-break of at most 1e-6 (module order; for first_last the distance to the nearest
end block, inner layers first), so that a plan is a function of the heuristic and the budget alone.

With granularity "gemm" every GEMM is a unit, as in SNIP's per-GEMM plans. The error-based baselines
score each GEMM by its own error; the others give a layer's dgrad and wgrad `BACKWARD_WEIGHT` times
its forward score, so that within a layer the backward GEMMs go low first and the layers' order is
the heuristic's.
"""

from __future__ import annotations

import random
import re
from typing import Sequence

from snip_ops.formats import GEMMS

from .cost import Budget, layer_shapes, plan_metrics
from .ilp import DEFAULT_LAMBDA, Constraints, Heuristic, Objective, make_plan, solve, validate_candidates
from .plan import Plan
from .stats import LayerStats, PlannerStats

__all__ = ["BASELINES", "baseline", "block_index", "baseline_objective"]

BASELINES = ("uniform_fp8", "uniform_fp4", "first_last", "layer_type", "min_rel_error", "min_abs_error", "random")
_BLOCK = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")
_TIE = 1e-6
BACKWARD_WEIGHT = 1e-3  # granularity "gemm": a layer's dgrad / wgrad score against its fprop score


def block_index(name: str) -> int | None:
    """The transformer block of a layer FQN: the first integer path component ("model.layers.3.mlp" -> 3)."""
    m = _BLOCK.search(name)
    return int(m.group(1)) if m else None


def _priorities(name: str, names: Sequence[str], seed: int, keep: Sequence[str]) -> dict[str, float]:
    """{layer: score of putting it low} for the heuristics that do not read errors."""
    n = len(names)
    order = {layer: _TIE * i / n for i, layer in enumerate(names)}
    if name == "first_last":
        blocks = {layer: block_index(layer) for layer in names}
        known = [b for b in blocks.values() if b is not None]
        first, last = (min(known), max(known)) if known else (0, 0)
        span = max(last - first, 1)
        out = {}
        for layer, b in blocks.items():
            dist = min(b - first, last - b) if b is not None else 0
            out[layer] = 1.0 if dist == 0 else _TIE * (1 - dist / span) + 1e-3 * order[layer]
        return out
    if name == "layer_type":
        return {layer: 1.0 if layer.rsplit(".", 1)[-1] in keep else order[layer] for layer in names}
    if name == "random":
        r = random.Random(seed)
        return {layer: r.random() for layer in names}
    raise ValueError(f"unknown baseline {name!r}; known: {', '.join(BASELINES)} (or uniform_<precision>)")


def _output_sq_norm(s: LayerStats, gemm: str) -> float:
    """||exact GEMM output||^2 on the calibration batch, from the recorded RMS values."""
    m, k, n = s.shape.tokens, s.shape.in_features, s.shape.out_features
    return {"fprop": s.out_rms**2 * m * n, "dgrad": s.grad_in_rms**2 * m * k, "wgrad": s.weight_grad_rms**2 * n * k}[gemm]


def baseline_objective(name: str, stats: PlannerStats, low: str, *, seed: int = 0,
                       keep: Sequence[str] = ("down_proj", "o_proj"), granularity: str = "layer") -> Objective:
    """The ILP objective term (layer stats, GEMM, precision) -> score of the heuristic `name`."""
    if name == "min_rel_error":
        return lambda s, g, p: s.errors[p][g]
    if name == "min_abs_error":
        return lambda s, g, p: s.errors[p][g] * _output_sq_norm(s, g)
    scores = _priorities(name, [s.name for s in stats.layers], seed, keep)
    backward = 0.0 if granularity == "layer" else BACKWARD_WEIGHT
    return lambda s, g, p: scores[s.name] * (1.0 if g == "fprop" else backward) if p == low else 0.0


def baseline(name: str, stats: PlannerStats, budget: Budget, high: str = "fp8", low: str = "fp4", *,
             lam: float = DEFAULT_LAMBDA, seed: int = 0, keep: Sequence[str] = ("down_proj", "o_proj"),
             granularity: str = "layer", tokens: int | None = None, time_limit: float | None = None) -> Plan:
    """The baseline plan `name` at `budget` (see the module docstring)."""
    if name.startswith("uniform_"):
        return _uniform(name, stats, budget, lam, tokens)
    objective = baseline_objective(name, stats, low, seed=seed, keep=keep, granularity=granularity)
    return solve(stats, budget, (high, low), lam=lam, granularity=granularity,
                 constraints=Constraints(tokens=tokens), heuristic=Heuristic(name, objective), time_limit=time_limit)


def _uniform(name: str, stats: PlannerStats, budget: Budget, lam: float, tokens: int | None) -> Plan:
    p = name[len("uniform_"):]
    validate_candidates([p])
    names = [s.name for s in stats.layers]
    shapes = layer_shapes(stats.layers, tokens)
    choice = {(n, g): p for n in names for g in GEMMS}
    met = budget.satisfied_by(plan_metrics(choice, shapes, budget.cost_model))
    return make_plan(choice, stats, budget, shapes, candidates=(p,), lam=lam, granularity="layer", method=name,
                     extra={"meets_budget": float(met)})
