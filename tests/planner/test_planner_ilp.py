"""The precision ILP against brute force, budgets, cost models and error messages (no model needed)."""

import functools
import itertools
import math
import random
from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch

from bounds import gamma

from planner.cost import (Budget, LayerShape, MeasuredCost, PlanMetrics, TheoreticalCost, gemm_flops, gemm_shape,
                          is_fp4, plan_metrics)
from planner.exact import Knapsack, relax, search
from planner.ilp import Constraints, Heuristic, InfeasibleBudget, gemm_objective, plan_objective, solve
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


@dataclass(frozen=True)
class Enumeration:
    """Every plan of a small instance: per plan its free units' candidate indices, objective and, per stage,
    the budget's metric (FP4 FLOP fraction or relative cost) computed as `plan_metrics` does."""

    units: tuple[tuple[str, tuple[str, ...]], ...]
    choices: np.ndarray    # [plans, units]
    objective: np.ndarray  # [plans]
    metric: np.ndarray     # [plans, stages]

    def feasible(self, budget: Budget) -> np.ndarray:
        """Which plans `budget.satisfied_by` accepts in every stage."""
        values, inverse = np.unique(self.metric, return_inverse=True)
        # satisfied_by reads the field of the budget's kind only
        ok = np.array([budget.satisfied_by(PlanMetrics(float(v), float(v), 1.0)) for v in values])
        return ok[inverse.reshape(self.metric.shape)].all(axis=1)


def enumerate_plans(stats, kind, candidates, lam, granularity, pinned=None, groups=None,
                    cost_model=TheoreticalCost()) -> Enumeration:
    names = [s.name for s in stats.layers]
    by_name = stats.by_name()
    pinned = pinned or {}
    groups = groups or [names]
    units = tuple((n, (g,)) for n in names if n not in pinned for g in GEMMS) if granularity == "gemm" else \
        tuple((n, GEMMS) for n in names if n not in pinned)
    choices = np.array(list(itertools.product(range(len(candidates)), repeat=len(units))), dtype=np.int64)
    choices = choices.reshape(-1, len(units))
    rows = np.arange(len(units))

    def table(term):  # [units, candidates] of a per-GEMM quantity summed over each unit's GEMMs
        rows = [[sum(term(n, g, p) for g in gs) for p in candidates] for n, gs in units]
        return np.array(rows).reshape(len(units), -1)

    def pinned_sum(term, members):
        return sum(term(n, g, pinned[n]) for n in members if n in pinned for g in GEMMS)

    def objective(n, g, p):
        return gemm_objective(by_name[n], g, p, stats.loss, lam)

    def fp4(n, g, p):
        return gemm_flops(by_name[n].shape, g) if is_fp4(p) else 0.0

    def cost(n, g, p):
        return cost_model.gemm_cost(by_name[n].shape, g, p)

    total = table(objective)[rows, choices].sum(axis=1) + pinned_sum(objective, names)
    metric = []
    for members in groups:
        inside = np.array([n in members for n, _ in units], dtype=bool)
        if kind == "fp4_fraction":
            part = (table(fp4)[rows, choices] * inside).sum(axis=1) + pinned_sum(fp4, members)
            norm = sum(gemm_flops(by_name[n].shape, g) for n in members for g in GEMMS)
        else:
            part = (table(cost)[rows, choices] * inside).sum(axis=1) + pinned_sum(cost, members)
            norm = sum(cost(n, g, "bf16") for n in members for g in GEMMS)
        metric.append(part / norm if norm else np.zeros(len(choices)))
    return Enumeration(units, choices, total, np.stack(metric, axis=1))


def brute_force(stats, budget, candidates, lam, granularity, pinned=None, groups=None):
    """min objective over every plan that meets the budget (in every group), or None; the winner is re-checked
    with `plan_metrics`, `Budget.satisfied_by` and `plan_objective` themselves."""
    names = [s.name for s in stats.layers]
    groups = groups or [names]
    plans = enumerate_plans(stats, budget.kind, candidates, lam, granularity, pinned, groups, budget.cost_model)
    ok = plans.feasible(budget)
    if not ok.any():
        return None
    best = int(np.flatnonzero(ok)[np.argmin(plans.objective[ok])])
    choice = {(n, g): p for n, p in (pinned or {}).items() for g in GEMMS}
    for (n, gs), j in zip(plans.units, plans.choices[best]):
        choice.update({(n, g): candidates[j] for g in gs})
    assert meets_budget(choice, stats, budget, groups)
    # Two summation orders of the same terms (plan_objective also divides and multiplies wgrad/dgrad
    # terms by lambda): at most 3 roundings per term apart, relative to the sum of |terms|.
    by_name = stats.by_name()
    terms = [gemm_objective(by_name[n], g, p, stats.loss, lam) for (n, g), p in choice.items()]
    bound = gamma(3 * len(terms) + 3, torch.float64) * math.fsum(abs(t) for t in terms)
    assert abs(plan_objective(choice, stats, lam)["objective"] - plans.objective[best]) <= bound
    return float(plans.objective[best])


def meets_budget(assignment, stats, budget, groups) -> bool:
    shapes = {s.name: s.shape for s in stats.layers}
    return all(budget.satisfied_by(plan_metrics({k: v for k, v in assignment.items() if k[0] in members},
                                                {m: shapes[m] for m in members}, budget.cost_model))
               for members in groups)


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


CANDIDATE_SETS = (("fp8", "fp4"), ("bf16", "fp8", "fp4"), ("bf16", "fp4"))
LAMBDAS = (0.0, 1e-3, 1.0, 1e3)
# Budget offsets from a plan's own metric: on it, inside and outside Budget.satisfied_by's 1e-9 tolerance, and
# clearly off it (none within float rounding of the tolerance's edge, where "feasible" would be a coin toss).
OFFSETS = (0.0, 0.0, 4e-10, -4e-10, 3e-9, -3e-9, 1e-6, -1e-6)


def random_instance(rng: np.random.Generator) -> dict:
    """A small planning problem whose objective terms span 1e-12..1e3, with ties, zeros, zero-FLOP layers,
    pins and pipeline stages, and a budget at, near or away from a plan's metric or the feasibility edge."""
    granularity = str(rng.choice(["layer", "gemm"]))
    candidates = CANDIDATE_SETS[rng.integers(len(CANDIDATE_SETS))]
    n_layers = int(rng.integers(1, 4 if granularity == "gemm" else (9 if len(candidates) == 2 else 8)))
    names = [f"model.layers.{i}.proj" for i in range(n_layers)]
    layers = []
    for name in names:
        dims = (64, 128, 256, 384)
        tokens = 0 if rng.random() < 0.08 else int(rng.choice([64, 128, 512]))
        errors = {"bf16": {g: 0.0 for g in GEMMS}}
        for p in ("fp8", "fp4"):
            errors[p] = {g: 0.0 if rng.random() < 0.15 else float(10 ** rng.uniform(-12, 3)) for g in GEMMS}
        if layers and rng.random() < 0.15:
            errors = layers[int(rng.integers(len(layers)))].errors  # ties
        curvature = -1.0 if rng.random() < 0.1 else 1.0
        layers.append(LayerStats(LayerShape(name, int(rng.choice(dims)), int(rng.choice(dims)), tokens), 1.0, 1.0,
                                 1.0, 1.0, curvature, 1.0, 1.0, errors))
    stats = PlannerStats(tuple(layers), loss=float(rng.uniform(1.0, 4.0)))
    pinned = {}
    if n_layers > 1 and rng.random() < 0.3:
        pinned[names[int(rng.integers(n_layers))]] = str(rng.choice(candidates + ("bf16",)))
    stages = None
    if n_layers > 1 and rng.random() < 0.4:
        cut = int(rng.integers(1, n_layers))
        stages = {n: int(i >= cut) for i, n in enumerate(rng.permutation(names))}
    groups = [[n for n in names if n in members] for members in
              ([[n for n in names if stages[n] == st] for st in (0, 1)] if stages else [names])]
    kind = str(rng.choice(["fp4_fraction", "relative_cost"]))
    cost_model = TheoreticalCost()
    if kind == "relative_cost" and rng.random() < 0.3:
        cost_model = MeasuredCost.from_json({"entries": [
            {"m": m, "n": n, "k": k, "format": f, "time": float(rng.uniform(0.1, 1.0)) * (m * n * k + 1)}
            for s in layers for g in GEMMS for m, n, k in [gemm_shape(s.shape, g)] for f in ("bf16", "fp8", "fp4")]})
    lam = LAMBDAS[rng.integers(len(LAMBDAS))]
    plans = enumerate_plans(stats, kind, candidates, lam, granularity, pinned, groups, cost_model)
    binding = plans.metric.min(axis=1) if kind == "fp4_fraction" else plans.metric.max(axis=1)
    offset = OFFSETS[rng.integers(len(OFFSETS))]
    mode = rng.integers(3)
    if mode == 0:
        value = binding[rng.integers(len(binding))] + offset
    elif mode == 1:
        value = (binding.max() if kind == "fp4_fraction" else binding.min()) + offset
    else:
        value = rng.uniform(binding.min(), binding.max())
    value = float(np.clip(value, 0.0, 1.0) if kind == "fp4_fraction" else max(value, 1e-3))
    budget = Budget(kind, value, cost_model)
    ok = plans.feasible(budget)
    optimum = float(plans.objective[ok].min()) if ok.any() else None
    return dict(stats=stats, budget=budget, candidates=candidates, lam=lam, granularity=granularity,
                pinned=pinned, stages=stages, groups=groups, optimum=optimum)


INSTANCES_PER_CHUNK = 75


@pytest.mark.parametrize("chunk", range(8))
def test_solve_is_exact_on_random_instances(chunk):
    """solve() against enumeration: never worse than the optimum (beyond float summation), always feasible,
    InfeasibleBudget exactly when no plan meets the budget, and certified optimal."""
    rng = np.random.default_rng(1000 + chunk)
    failures = []
    for k in range(INSTANCES_PER_CHUNK):
        case = random_instance(rng)
        what = (f"instance {chunk}/{k}: {case['granularity']}, {case['candidates']}, lam={case['lam']}, "
                f"{case['budget'].describe()}, {len(case['groups'])} stage(s), pinned={case['pinned']}")
        try:
            plan = solve(case["stats"], case["budget"], case["candidates"], lam=case["lam"],
                         granularity=case["granularity"],
                         constraints=Constraints(pinned=case["pinned"] or None, stages=case["stages"]))
        except InfeasibleBudget:
            if case["optimum"] is not None:
                failures.append(f"{what}: InfeasibleBudget, but the optimum is {case['optimum']:.6g}")
            continue
        except Exception as e:  # noqa: BLE001 -- every instance is judged, not just the first that breaks
            failures.append(f"{what}: {type(e).__name__}: {e}")
            continue
        objective = plan.metrics["objective"]
        if case["optimum"] is None:
            failures.append(f"{what}: no plan meets the budget, yet solve returned one")
        elif not objective <= case["optimum"] * (1 + 1e-9) + 1e-300:
            failures.append(f"{what}: objective {objective:.6g} > optimum {case['optimum']:.6g} "
                            f"({objective / case['optimum'] if case['optimum'] else float('inf'):.3g}x)")
        elif not meets_budget(plan.assignment(), case["stats"], case["budget"], case["groups"]):
            failures.append(f"{what}: the plan misses the budget")
        elif any(str(plan.precisions[n]) != p for n, p in case["pinned"].items()):
            failures.append(f"{what}: a pinned layer moved")
        elif plan.metrics.get("certified_optimal") != 1.0 or plan.metrics.get("optimality_gap") != 0.0:
            failures.append(f"{what}: not certified optimal ({plan.metrics})")
    assert not failures, f"{len(failures)} of {INSTANCES_PER_CHUNK} instances failed:\n" + "\n".join(failures)


def test_exact_search_alone_finds_the_optimum():
    """The search from the lightest plan (no CBC), on knapsacks with values spanning 1e-12..1e3, weights of
    one grain or of none, and capacities on, next to and between plan weights."""
    rng = np.random.default_rng(7)
    for k in range(300):
        n_units, n_options = int(rng.integers(1, 9)), int(rng.integers(1, 4))
        values = np.where(rng.random((n_units, n_options)) < 0.15, 0.0, 10 ** rng.uniform(-12, 3, (n_units, n_options)))
        grain = float(rng.choice([1, 7, 64]))
        weights = grain * rng.integers(0, 9, (n_units, n_options)).astype(float)
        if n_units > 1 and rng.random() < 0.3:  # identical units
            values[1:], weights[1:] = values[0], weights[0]
        plans = np.array(list(itertools.product(range(n_options), repeat=n_units))).reshape(-1, n_units)
        rows = np.arange(n_units)
        plan_weight, plan_value = weights[rows, plans].sum(axis=1), values[rows, plans].sum(axis=1)
        capacity = float(rng.choice(plan_weight) + rng.choice([0.0, -1.0, 1.0, grain / 2])
                         if rng.random() < 0.8 else rng.uniform(plan_weight.min() - 1, plan_weight.max()))
        if capacity < plan_weight.min():
            continue
        optimum = plan_value[plan_weight <= capacity].min()
        ks = Knapsack(tuple(map(tuple, values)), tuple(map(tuple, weights)), capacity)
        rx = relax(ks)

        def fits(choice):
            return sum(ks.weights[i][j] for i, j in enumerate(choice)) <= capacity

        found = search(rx, ks.lightest(), fits)
        assert found.optimal and found.gap == 0.0 and fits(found.choice), k
        assert found.value <= optimum * (1 + 1e-9) + 1e-300, (k, found.value, optimum)
        cut_short = search(rx, ks.lightest(), fits, node_limit=1)
        assert fits(cut_short.choice) and optimum * (1 - 1e-9) <= cut_short.value, k
        assert cut_short.value - cut_short.gap <= optimum + 1e-12 * cut_short.value, k  # a true bound (to rounding)


def test_tiny_terms_next_to_a_large_one():
    """The optimum (l1 alone in FP4) is 1e-8; CBC's absolute tolerances against the 1.0 term once made it 6e-8."""
    def layer(name, e):
        return LayerStats(LayerShape(name, 128, 128, 128), 1, 1, 1, 1, 1.0, 0.0, 0.0,
                          {"fp8": {g: 0.0 for g in GEMMS}, "fp4": {"fprop": e, "dgrad": 0.0, "wgrad": 0.0}})

    stats = PlannerStats((layer("l0", 1.0), layer("l1", 1e-8), layer("l2", 5e-8)), loss=1.0)
    plan = solve(stats, Budget.fp4_fraction(0.3), ("fp8", "fp4"), lam=0.0)
    assert plan.metrics["objective"] == 1e-8 and str(plan.precisions["l1"]) == "fp4"
    assert plan.metrics["certified_optimal"] == 1.0 and plan.metrics["optimality_gap"] == 0.0


def test_search_cut_short_warns_and_reports_its_gap(monkeypatch):
    def arguments(case):
        return dict(lam=case["lam"], granularity=case["granularity"],
                    constraints=Constraints(pinned=case["pinned"] or None, stages=case["stages"]))

    rng = np.random.default_rng(5)
    case = next(c for c in (random_instance(rng) for _ in range(1000))  # one whose proof takes the search a node
                if c["optimum"] is not None
                and solve(c["stats"], c["budget"], c["candidates"], **arguments(c)).metrics["search_nodes"] > 0)
    kwargs = arguments(case)
    monkeypatch.setattr("planner.ilp.search", functools.partial(search, node_limit=0))
    with pytest.warns(RuntimeWarning, match="node limit"):
        plan = solve(case["stats"], case["budget"], case["candidates"], **kwargs)
    m = plan.metrics
    assert m["certified_optimal"] == 0.0 and m["optimality_gap"] > 0
    assert meets_budget(plan.assignment(), case["stats"], case["budget"], case["groups"])
    assert m["objective"] - case["optimum"] <= m["optimality_gap"] + 1e-12 * m["objective"]


def test_degenerate_objectives_and_shapes():
    stats = synthetic_stats(6, 11)
    zero = PlannerStats(tuple(replace(s, curvature=0.0, s_dgrad=0.0, s_wgrad=0.0) for s in stats.layers), 1.0)
    for budget in (Budget.fp4_fraction(0.5), Budget.relative_cost(0.4)):
        plan = solve(zero, budget, ("bf16", "fp8", "fp4"), lam=1.0, granularity="gemm")
        assert plan.metrics["objective"] == 0.0 and plan.metrics["certified_optimal"] == 1.0
        assert budget.satisfied_by(plan_metrics(plan.assignment(), {s.name: s.shape for s in zero.layers}))
    empty = PlannerStats(tuple(replace(s, shape=replace(s.shape, tokens=0)) for s in stats.layers), 1.0)
    plan = solve(empty, Budget.fp4_fraction(0.0), ("bf16", "fp4"))  # no FLOPs: the fraction is 0 whatever the plan
    assert plan.metrics["objective"] == 0.0 and plan.metrics["fp4_fraction"] == 0.0
    with pytest.raises(InfeasibleBudget, match="at most 0% of linear FLOPs"):
        solve(empty, Budget.fp4_fraction(0.5), ("fp8", "fp4"))
    tied = PlannerStats(tuple(replace(stats.layers[0], shape=LayerShape(f"model.layers.{i}.proj", 256, 256, 512))
                              for i in range(60)), 2.0)
    for budget in (Budget.fp4_fraction(0.51), Budget.relative_cost(0.333)):  # between two plans' metrics
        plan = solve(tied, budget, ("bf16", "fp8", "fp4"), lam=1.0, granularity="gemm")
        assert plan.metrics["certified_optimal"] == 1.0


def test_ilp_with_pins_and_stages_matches_brute_force():
    stats = synthetic_stats(5, 7)
    names = [s.name for s in stats.layers]
    stages = {names[0]: 0, names[1]: 0, names[2]: 0, "*": 1}
    pinned = {names[1]: "fp8"}
    budget = Budget.fp4_fraction(0.4)
    plan = solve(stats, budget, ("fp8", "fp4"), lam=2.0, constraints=Constraints(pinned=pinned, stages=stages))
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
    plan = solve(stats, Budget.fp4_fraction(0.0), ("fp8", "fp4"), constraints=Constraints(pinned={"*": "fp8"}))
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
        solve(stats, Budget.fp4_fraction(1.0), ("fp8", "fp4"), constraints=Constraints(pinned={name: "fp8"}))
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
        solve(stats, Budget.fp4_fraction(0.5), constraints=Constraints(pinned={"nothing.*": "fp8"}))
    with pytest.raises(ValueError, match="must be a candidate or bf16"):
        solve(stats, Budget.fp4_fraction(0.5), constraints=Constraints(pinned={"*": "mxfp4"}))
    with pytest.raises(ValueError, match="no pipeline stage"):
        solve(stats, Budget.fp4_fraction(0.5), constraints=Constraints(stages={stats.layers[0].name: 0}))
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


def test_measured_cost_table_keyed_by_gemm():
    # A square layer's three GEMMs have one (m, n, k); a table with "gemm" prices each from its own entry,
    # and a shape it lacks from the nearest entry of the same GEMM (wgrad's kernel is not fprop's).
    layer = LayerShape("sq", 512, 512, 512)
    table = MeasuredCost.from_json({"entries": [
        {"m": 512, "n": 512, "k": 512, "format": "fp8", "gemm": "fprop", "time": 1.0},
        {"m": 512, "n": 512, "k": 512, "format": "fp8", "gemm": "dgrad", "time": 2.0},
        {"m": 512, "n": 512, "k": 512, "format": "fp8", "time": 5.0},  # any GEMM of the shape
        {"m": 1024, "n": 1024, "k": 1024, "format": "fp8", "gemm": "wgrad", "time": 24.0},
    ]})
    assert [table.gemm_cost(layer, g, "fp8") for g in GEMMS] == [1.0, 2.0, 5.0]
    big = LayerShape("b", 2048, 2048, 2048)
    assert table.gemm_cost(big, "wgrad", "fp8") == pytest.approx(24.0 * 8)
    assert table.gemm_cost(big, "fprop", "fp8") == pytest.approx(1.0 * 64)  # nearest fprop entry
    with pytest.raises(ValueError, match="keyed by"):
        MeasuredCost({(1, 1, 1, "fp8", "xgrad"): 1.0})


def test_measured_cost_budget_in_the_ilp():
    stats = synthetic_stats(3, 5)
    entries = []
    for s in stats.layers:
        for g in GEMMS:
            m, n, k = gemm_shape(s.shape, g)
            for fmt, t in (("bf16", 1.0), ("fp8", 0.7), ("fp4", 0.6)):  # FP4 barely faster than FP8 here
                entries.append({"m": m, "n": n, "k": k, "format": fmt, "time": t * m * n * k * 1e-9})
    table = MeasuredCost.from_json({"entries": entries})
    plan = solve(stats, Budget.relative_cost(0.65, table), ("fp8", "fp4"))
    assert plan.metrics["relative_cost"] <= 0.65 + 1e-12
    assert plan.budget["cost_model"] == "measured"


def test_objective_terms_ablation():
    """terms="ld" is lambda 0; terms="wd" ignores the curvature; an `objective` replaces the terms."""
    stats = synthetic_stats(8, 3)
    budget = Budget.fp4_fraction(0.5)
    assert solve(stats, budget, terms="ld").precisions == solve(stats, budget, lam=0.0).precisions
    flat = replace(stats, layers=tuple(replace(s, curvature=0.0) for s in stats.layers))
    wd_only = solve(stats, budget, terms="wd")
    assert wd_only.precisions == solve(flat, budget).precisions
    assert wd_only.metrics["objective"] == plan_objective(wd_only.assignment(), stats, 1.0)["objective"]
    custom = solve(stats, budget, heuristic=Heuristic("errors", lambda s, g, p: s.errors[p][g]))
    assert custom.method == "errors" and budget.satisfied_by(plan_metrics_of(custom, stats))
    with pytest.raises(ValueError, match="terms"):
        solve(stats, budget, terms="wd+ld")


def plan_metrics_of(plan, stats):
    from planner.cost import plan_metrics
    return plan_metrics(plan.assignment(), {s.name: s.shape for s in stats.layers})


def test_wd_enters_the_objective_as_an_excess_loss_over_the_loss():
    """lambda WD / L, as LD / L."""
    stats = synthetic_stats(1, 4)
    s = stats.layers[0]
    assert gemm_objective(s, "wgrad", "fp4", stats.loss, 2.0) == 2.0 * s.wd("fp4", "wgrad") / stats.loss
    assert gemm_objective(s, "fprop", "fp4", stats.loss, 2.0) == s.ld("fp4") / stats.loss
