"""Baseline plans for comparison (DESIGN.md §4 "Validation"), with the same interface as `ilp.solve`.

    baseline(name, stats, budget, high="fp8", low="fp4", ...) -> Plan

* "uniform_<p>" (e.g. "uniform_fp8", "uniform_fp4"): every layer in p; the budget is not enforced,
  `metrics["meets_budget"]` says whether it is met.
* the others rank the layers and, starting from all-`high`, switch whole layers to `low` in that
  order until the budget is met (so they sit at the same budget as the ILP, overshooting it by at
  most one layer):
  - "first_last":  the first and last transformer blocks stay `high` longest (middle blocks go first);
  - "layer_type":  layers whose name ends in one of `keep` (default down_proj, o_proj) go last;
  - "min_error":   layers with the smallest forward quantization error e_fwd(low) go first
                   (greedy on e_fwd only: no curvature, no backward);
  - "random":      a random order (seeded).
Ties keep the model's module order.
"""

from __future__ import annotations

import random
import re
from typing import Sequence

from snip_ops.formats import GEMMS

from .cost import Budget, LayerShape, plan_metrics
from .ilp import DEFAULT_LAMBDA, InfeasibleBudget, make_plan, validate_candidates
from .plan import Plan
from .stats import PlannerStats

__all__ = ["BASELINES", "baseline", "block_index"]

BASELINES = ("uniform_fp8", "uniform_fp4", "first_last", "layer_type", "min_error", "random")
_BLOCK = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


def block_index(name: str) -> int | None:
    """The transformer block of a layer FQN: the first integer path component ("model.layers.3.mlp" -> 3)."""
    m = _BLOCK.search(name)
    return int(m.group(1)) if m else None


def _order(name: str, stats: PlannerStats, low: str, seed: int, keep: Sequence[str]) -> list[str]:
    names = [s.name for s in stats.layers]
    if name == "first_last":
        blocks = {n: block_index(n) for n in names}
        known = [b for b in blocks.values() if b is not None]
        first, last = (min(known), max(known)) if known else (0, 0)
        # Distance to the nearest end block; layers outside blocks count as ends (kept high).
        dist = {n: min(b - first, last - b) if b is not None else -1 for n, b in blocks.items()}
        return sorted(names, key=lambda n: -dist[n])
    if name == "layer_type":
        return sorted(names, key=lambda n: n.rsplit(".", 1)[-1] in keep)
    if name == "min_error":
        by_name = stats.by_name()
        return sorted(names, key=lambda n: by_name[n].errors[low]["fprop"])
    if name == "random":
        order = list(names)
        random.Random(seed).shuffle(order)
        return order
    raise ValueError(f"unknown baseline {name!r}; known: {', '.join(BASELINES)} (or uniform_<precision>)")


def baseline(name: str, stats: PlannerStats, budget: Budget, high: str = "fp8", low: str = "fp4", *,
             lam: float = DEFAULT_LAMBDA, seed: int = 0, keep: Sequence[str] = ("down_proj", "o_proj"),
             tokens: int | None = None) -> Plan:
    """The baseline plan `name` at `budget` (see the module docstring)."""
    names = [s.name for s in stats.layers]
    shapes = {s.name: s.shape if tokens is None else
              LayerShape(s.name, s.shape.in_features, s.shape.out_features, tokens) for s in stats.layers}
    if name.startswith("uniform_"):
        p = name[len("uniform_"):]
        validate_candidates([p])
        choice = {(n, g): p for n in names for g in GEMMS}
        met = budget.satisfied_by(plan_metrics(choice, shapes, budget.cost_model))
        return make_plan(choice, names, stats, budget, (p,), lam, "layer", shapes, name, {"meets_budget": float(met)})
    candidates = validate_candidates([high, low], stats if name == "min_error" else None)
    order = _order(name, stats, low, seed, keep)
    choice = {(n, g): high for n in names for g in GEMMS}
    metrics = plan_metrics(choice, shapes, budget.cost_model)
    for n in order:
        if budget.satisfied_by(metrics):
            break
        for g in GEMMS:
            choice[(n, g)] = low
        metrics = plan_metrics(choice, shapes, budget.cost_model)
    if not budget.satisfied_by(metrics):
        best = metrics.fp4_fraction if budget.kind == "fp4_fraction" else metrics.relative_cost
        raise InfeasibleBudget(f"baseline {name}: budget '{budget.describe()}' is infeasible even with every "
                               f"layer in {low}; the tightest feasible budget is {best:.6g}", best)
    return make_plan(choice, names, stats, budget, candidates, lam, "layer", shapes, name, {"meets_budget": 1.0})
