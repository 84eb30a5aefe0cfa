"""planner: chooses the precision of every linear layer (and GEMM) from divergence statistics (docs/design.md §4).

    from planner import SnipPlanner, PlannerConfig, Budget
    planner = SnipPlanner(model, optimizer, PlannerConfig(budget=Budget.fp4_fraction(0.75), interval=100))
    planner.step(step, batch)                       # in the training loop, before each step

    stats = planner.measure(batch)                  # offline: statistics and divergences ...
    plan = solve(stats, Budget.parse("fp4=0.75"))   # ... and the ILP
    plan.save("plan.json")

Modules: stats (recording), qerror (quantization errors), divergence (LD / WD), cost (shapes, cost
models, budgets), ilp (the PuLP/CBC formulation), exact (its optimality certificate), baselines, plan
(Plan JSON and its table), schedule (re-plan triggers, a raised budget), controller (SnipPlanner).
`planner.stability` holds the training-stability numerics (eXmY simulation, sharpness, the divergence
rule). The planner depends on snip_ops only; the demo trainer, the command line and every picture are
the application's (snip_train).

The names below are imported lazily, so that subpackages (e.g. planner.stability) do not pay for
PuLP and the rest when they are imported on their own.
"""

import importlib

_EXPORTS = {
    "BASELINES": "baselines", "baseline": "baselines", "block_index": "baselines",
    "PlannerConfig": "controller", "SnipPlanner": "controller",
    "Budget": "cost", "LayerShape": "cost", "MeasuredCost": "cost", "TheoreticalCost": "cost",
    "layer_shapes": "cost", "plan_metrics": "cost",
    "DivergenceConfig": "divergence", "PlannedModel": "divergence", "lm_logits": "divergence",
    "fisher_labels": "divergence", "measure": "divergence",
    "DEFAULT_LAMBDA": "ilp", "InfeasibleBudget": "ilp", "plan_objective": "ilp", "solve": "ilp",
    "Plan": "plan",
    "PrecisionSchedule": "schedule",
    "gemm_errors": "qerror", "relative_error": "qerror",
    "LayerStats": "stats", "PlannerStats": "stats", "StatsConfig": "stats", "high_precision": "stats",
    "mean_stats": "stats", "record": "stats",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
