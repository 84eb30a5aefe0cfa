"""The precision ILP against brute force, budgets, cost models and error messages (no model needed)."""

import itertools
import random

import pytest

from planner.cost import Budget, LayerShape, MeasuredCost, TheoreticalCost, is_fp4, plan_metrics
from planner.ilp import InfeasibleBudget, plan_objective, solve
from planner.stats import LayerStats, PlannerStats
from snip_ops.formats import GEMMS

DIMS = ((128, 128), (128, 384), (384, 128), (256, 64))


def synthetic_stats(n_layers: int, seed: int, tokens: int = 512, names=None) -> PlannerStats:
    r = random.Random(seed)
    layers = []
    for i in range(n_layers):
        k, n = DIMS[r.randrange(len(DIMS))]
        errors = {"bf16": {g: 0.0 for g in GEMMS},
                  "fp8": {g: r.uniform(1e-4, 1e-3) for g in GEMMS},
                  "fp4": {g: r.uniform(5e-3, 5e-2) for g in GEMMS}}
        name = names[i] if names else f"model.layers.{i}.proj"
        layers.append(LayerStats(LayerShape(name, k, n, tokens), 1.0, 1.0, 1.0, 1.0,
                                 r.uniform(-1e-3, 1e-2), r.uniform(0, 1e-2), r.uniform(0, 1e-2), errors))
    return PlannerStats(tuple(layers), loss=r.uniform(2.0, 4.0))


def brute_force(stats, budget, candidates, lam, granularity, pinned=None, groups=None):
    """min objective over every assignment that meets the budget (per group), or None."""
    names = [s.name for s in stats.layers]
    shapes = {s.name: s.shape for s in stats.layers}
    free = [n for n in names if n not in (pinned or {})]
    units = [(n, (g,)) for n in free for g in GEMMS] if granularity == "gemm" else [(n, GEMMS) for n in free]
    best = None
    for combo in itertools.product(candidates, repeat=len(units)):
        choice = {(n, g): p for n, p in (pinned or {}).items() for g in GEMMS}
        for (n, gs), p in zip(units, combo):
            for g in gs:
                choice[(n, g)] = p
        ok = all(budget.satisfied_by(plan_metrics({k: v for k, v in choice.items() if k[0] in members},
                                                  {m: shapes[m] for m in members}, budget.cost_model))
                 for members in (groups or [names]))
        if ok:
            obj = plan_objective(choice, stats, lam)["objective"]
            best = obj if best is None or obj < best else best
    return best


@pytest.mark.parametrize("seed", range(6))
def test_ilp_matches_brute_force(seed):
    r = random.Random(100 + seed)
    stats = synthetic_stats(r.choice([3, 4]), seed)
    granularity = "gemm" if seed % 3 == 0 else "layer"
    n_units = len(stats.layers) * (3 if granularity == "gemm" else 1)
    candidates = ("fp8", "fp4") if granularity == "gemm" or seed % 2 else ("bf16", "fp8", "fp4")
    assert len(candidates) ** n_units <= 5000
    budget = Budget.fp4_fraction(r.uniform(0.2, 0.9)) if seed % 2 else Budget.relative_cost(r.uniform(0.28, 0.6))
    lam = r.choice([0.0, 0.3, 1.0, 10.0])
    plan = solve(stats, budget, candidates, lam=lam, granularity=granularity)
    expected = brute_force(stats, budget, candidates, lam, granularity)
    assert plan.metrics["objective"] == pytest.approx(expected, rel=1e-9, abs=1e-15)
    assert budget.satisfied_by(plan_metrics(plan.assignment(), {s.name: s.shape for s in stats.layers}))


def test_ilp_with_pins_and_stages_matches_brute_force():
    stats = synthetic_stats(5, 7)
    names = [s.name for s in stats.layers]
    stages = {names[0]: 0, names[1]: 0, names[2]: 0, "*": 1}
    pinned = {names[1]: "fp8"}
    budget = Budget.fp4_fraction(0.4)
    plan = solve(stats, budget, ("fp8", "fp4"), lam=2.0, pinned=pinned, stages=stages)
    assert plan.precisions[names[1]].fprop.name == "fp8"
    expected = brute_force(stats, budget, ("fp8", "fp4"), 2.0, "layer", pinned, [names[:3], names[3:]])
    assert plan.metrics["objective"] == pytest.approx(expected, rel=1e-9)
    shapes = {s.name: s.shape for s in stats.layers}
    for members in (names[:3], names[3:]):
        sub = plan_metrics({k: v for k, v in plan.assignment().items() if k[0] in members}, {m: shapes[m] for m in members})
        assert sub.fp4_fraction >= 0.4


def test_budget_met_exactly_at_the_boundary():
    # Four equal layers: 75% FP4 is reachable only with exactly three layers in fp4.
    stats = synthetic_stats(4, 3)
    stats = PlannerStats(tuple(LayerStats(LayerShape(s.name, 128, 128, 256), *[getattr(s, f) for f in (
        "out_rms", "grad_out_rms", "grad_in_rms", "weight_grad_rms", "curvature", "s_dgrad", "s_wgrad", "errors")])
        for s in stats.layers), stats.loss)
    plan = solve(stats, Budget.fp4_fraction(0.75), ("fp8", "fp4"))
    assert plan.metrics["fp4_fraction"] == 0.75
    assert sum(p.fprop.name == "fp4" for p in plan.precisions.values()) == 3
    plan = solve(stats, Budget.relative_cost(0.3125), ("fp8", "fp4"))  # 3 x fp4 + 1 x fp8 = 0.3125
    assert plan.metrics["relative_cost"] == 0.3125


def test_everything_pinned():
    stats = synthetic_stats(2, 8)
    plan = solve(stats, Budget.fp4_fraction(0.0), ("fp8", "fp4"), pinned={"*": "fp8"})
    assert all(str(p) == "fp8" for p in plan.precisions.values())


def test_zero_lambda_and_bf16_candidate():
    stats = synthetic_stats(3, 1)
    plan = solve(stats, Budget.relative_cost(1.0), ("bf16", "fp8", "fp4"))
    assert all(p.is_bf16 for p in plan.precisions.values())  # bf16 has zero divergence and fits
    assert plan.metrics["objective"] == 0.0


def test_infeasible_budgets_name_the_tightest_feasible_value():
    stats = synthetic_stats(4, 2)
    with pytest.raises(InfeasibleBudget, match="cheapest plan costs 0.25") as e:
        solve(stats, Budget.relative_cost(0.2), ("fp8", "fp4"))
    assert e.value.cheapest == pytest.approx(0.25)
    name = stats.layers[0].name
    with pytest.raises(InfeasibleBudget, match="pinned") as e:
        solve(stats, Budget.fp4_fraction(1.0), ("fp8", "fp4"), pinned={name: "fp8"})
    shapes = {s.name: s.shape for s in stats.layers}
    total = sum(s.in_features * s.out_features for s in shapes.values())
    assert e.value.cheapest == pytest.approx(1 - shapes[name].in_features * shapes[name].out_features / total)
    with pytest.raises(InfeasibleBudget, match="4-bit candidate"):
        solve(stats, Budget.fp4_fraction(0.5), ("bf16", "fp8"))


def test_bad_inputs_give_clear_errors():
    stats = synthetic_stats(3, 4)
    with pytest.raises(ValueError, match="unknown precision 'fp5'"):
        solve(stats, Budget.fp4_fraction(0.5), ("fp8", "fp5"))
    with pytest.raises(ValueError, match="duplicate"):
        solve(stats, Budget.fp4_fraction(0.5), ("fp4", "fp4"))
    with pytest.raises(ValueError, match="no measured quantization errors"):
        solve(stats, Budget.fp4_fraction(0.5), ("mxfp8", "fp4"))
    with pytest.raises(ValueError, match="non-empty"):
        solve(stats, Budget.fp4_fraction(0.5), ())
    with pytest.raises(ValueError, match="granularity"):
        solve(stats, Budget.fp4_fraction(0.5), granularity="tensor")
    with pytest.raises(ValueError, match="matches no planned layer"):
        solve(stats, Budget.fp4_fraction(0.5), pinned={"nothing.*": "fp8"})
    with pytest.raises(ValueError, match="must be a candidate or bf16"):
        solve(stats, Budget.fp4_fraction(0.5), pinned={"*": "mxfp4"})
    with pytest.raises(ValueError, match="no pipeline stage"):
        solve(stats, Budget.fp4_fraction(0.5), stages={stats.layers[0].name: 0})
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        Budget.fp4_fraction(1.5)
    with pytest.raises(ValueError, match="> 0"):
        Budget.relative_cost(0.0)
    with pytest.raises(ValueError, match="cannot parse budget"):
        Budget.parse("fp4>0.75")
    assert Budget.parse("fp4=75%") == Budget.fp4_fraction(0.75)
    assert Budget.parse("cost=0.3").kind == "relative_cost"


def test_measured_cost_table():
    layer = LayerShape("l", 256, 512, 1024)
    table = MeasuredCost.from_json({"device": "test-gpu", "entries": [
        {"m": 1024, "n": 512, "k": 256, "format": "bf16", "time": 4.0},
        {"m": 1024, "n": 512, "k": 256, "format": "fp4", "time": 1.5},
        {"m": 2048, "n": 2048, "k": 2048, "format": "fp4", "time": 20.0},
    ]})
    assert table.gemm_cost(layer, "fprop", "fp4") == 1.5  # exact shape
    # dgrad (1024, 256, 512) has the same FLOPs: priced from the nearest entry, scaled by FLOPs
    assert table.gemm_cost(layer, "dgrad", "fp4") == pytest.approx(1.5)
    big = LayerShape("b", 2048, 2048, 4096)
    assert table.gemm_cost(big, "fprop", "fp4") == pytest.approx(40.0)
    with pytest.raises(ValueError, match="no entry for format 'fp8'"):
        table.gemm_cost(layer, "fprop", "fp8")
    with pytest.raises(ValueError, match="could not read"):
        MeasuredCost.from_json({"entries": [{"m": 1}]})
    assign = {("l", g): "fp4" for g in GEMMS}
    assert plan_metrics(assign, {"l": layer}, table).relative_cost == pytest.approx(1.5 / 4.0)
    assert plan_metrics(assign, {"l": layer}, TheoreticalCost()).relative_cost == pytest.approx(0.25)
    assert is_fp4("nvfp4") and is_fp4("mxfp4") and not is_fp4("fp8") and not is_fp4("bf16")


def test_measured_cost_budget_in_the_ilp():
    stats = synthetic_stats(3, 5)
    entries = []
    for s in stats.layers:
        for g in GEMMS:
            from planner.cost import gemm_shape
            m, n, k = gemm_shape(s.shape, g)
            for fmt, t in (("bf16", 1.0), ("fp8", 0.7), ("fp4", 0.6)):  # FP4 barely faster than FP8 here
                entries.append({"m": m, "n": n, "k": k, "format": fmt, "time": t * m * n * k * 1e-9})
    table = MeasuredCost.from_json({"entries": entries})
    plan = solve(stats, Budget.relative_cost(0.65, table), ("fp8", "fp4"))
    assert plan.metrics["relative_cost"] <= 0.65 + 1e-12
    assert plan.budget["cost_model"] == "measured"
