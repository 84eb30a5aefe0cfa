"""The precision ILP (DESIGN.md §4.5), solved with PuLP + CBC.

A *unit* is what one decision covers: a layer (granularity "layer", the paper's setting: one
precision for all three GEMMs) or one GEMM of a layer (granularity "gemm"). Binary x[u, p] says unit
u runs in precision p; exactly one p per unit. The objective is

    sum_u,p x[u, p] * (LD(l, p) / L + lambda * WD(l, p))        restricted to u's GEMMs:
    fprop carries LD / L, dgrad carries lambda s_dgrad e_dgrad, wgrad lambda s_wgrad e_wgrad,

subject to the budget (cost.Budget) on the whole model, or on every pipeline stage separately when
`stages` is given (each stage then meets the budget on its own share, which keeps stages balanced).
Pinned layers are fixed, enter the budget as constants and are not decision variables.

Objective and constraint coefficients are normalised (by the largest objective term, by the group's
FLOPs or bf16 cost) so that CBC's absolute tolerances are meaningful; the chosen plan's budget is then
re-checked in exact float arithmetic.
"""

from __future__ import annotations

import fnmatch
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import pulp

from snip_ops import LinearPrecision
from snip_ops.formats import GEMMS, recipe

from .cost import Budget, LayerShape, gemm_flops, is_fp4, plan_metrics
from .plan import Plan
from .stats import LayerStats, PlannerStats

__all__ = ["DEFAULT_LAMBDA", "InfeasibleBudget", "solve", "make_plan", "gemm_objective", "plan_objective",
           "validate_candidates", "stage_groups"]


# LD/L is a relative loss increase, WD a relative squared change of the Adam update: different units.
# 1e-3 is calibrated on the tiny model (bench/results/cpu-planner-validity.md: Spearman with the measured
# loss increase 0.62 at 1e-3, 0.30 at 1e-2, -0.16 at 1; cpu-planner-quality.md: lambda 1e-3, 1e-2 and 1
# all beat every baseline). It depends on model, optimizer and horizon: treat it as a hyperparameter.
DEFAULT_LAMBDA = 1e-3


class InfeasibleBudget(ValueError):
    """No plan meets the budget; `cheapest` is the tightest budget value that some plan does meet."""

    def __init__(self, message: str, cheapest: float):
        super().__init__(message)
        self.cheapest = cheapest


def validate_candidates(candidates: Sequence[str], stats: PlannerStats | None = None) -> tuple[str, ...]:
    """Known, distinct recipe names whose errors were measured (bf16 needs no measurement)."""
    if isinstance(candidates, str) or not candidates:
        raise ValueError(f"candidates must be a non-empty sequence of precision names, got {candidates!r}")
    names = tuple(candidates)
    for n in names:
        if not isinstance(n, str):
            raise TypeError(f"candidates are precision names (e.g. 'fp8', 'fp4'), got {n!r}")
        recipe(n)  # raises a clear error for unknown names
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate candidates in {list(names)}")
    if stats is not None:
        missing = [n for n in names if not recipe(n).is_bf16 and n not in stats.candidates()]
        if missing:
            raise ValueError(f"candidates {missing} have no measured quantization errors in these statistics "
                             f"(measured: {sorted(stats.candidates())})")
    return names


def gemm_objective(s: LayerStats, gemm: str, precision: str, loss: float, lam: float) -> float:
    """The objective term of one GEMM of one layer in `precision` (0 for bf16)."""
    if recipe(precision).is_bf16:
        return 0.0
    if precision not in s.errors:
        raise KeyError(f"no measured errors for {precision!r} on {s.name}")
    if gemm == "fprop":
        return s.ld(precision) / loss
    return lam * s.wd(precision, gemm)


def plan_objective(assignment: Mapping[tuple[str, str], str], stats: PlannerStats, lam: float) -> dict[str, float]:
    """{"objective", "ld_over_loss", "wd"} of a plan {(layer, gemm): precision} under `stats`."""
    ld = wd = 0.0
    for s in stats.layers:
        for g in GEMMS:
            term = gemm_objective(s, g, assignment[(s.name, g)], stats.loss, lam)
            if g == "fprop":
                ld += term
            else:
                wd += term / lam if lam else 0.0
    return {"objective": ld + lam * wd, "ld_over_loss": ld, "wd": wd}


def stage_groups(names: Sequence[str], stages: Mapping[str, int] | Callable[[str], int] | None) -> dict[int, list[str]]:
    """{stage: layer names}; `stages` maps FQNs or fnmatch patterns (first match) to a stage, or is a function."""
    if stages is None:
        return {0: list(names)}
    groups: dict[int, list[str]] = {}
    for n in names:
        if callable(stages):
            st = stages(n)
        else:
            st = stages.get(n)
            if st is None:
                st = next((v for k, v in stages.items() if fnmatch.fnmatchcase(n, k)), None)
        if st is None:
            raise ValueError(f"layer {n!r} has no pipeline stage in {dict(stages) if not callable(stages) else stages}")
        groups.setdefault(int(st), []).append(n)
    return groups


def _pins(names: Sequence[str], pinned: Mapping[str, object] | None, allowed: set[str]) -> dict[str, LinearPrecision]:
    out = {}
    for key, value in (pinned or {}).items():
        hits = [n for n in names if n == key or fnmatch.fnmatchcase(n, key)]
        if not hits:
            raise ValueError(f"pinned entry {key!r} matches no planned layer")
        p = LinearPrecision.of(value)
        bad = {p.gemm(g).name for g in GEMMS} - allowed
        if bad:
            raise ValueError(f"pinned precision {sorted(bad)} for {key!r} must be a candidate or bf16 "
                             f"(its errors are needed for the objective); candidates: {sorted(allowed - {'bf16'})}")
        for n in hits:
            out.setdefault(n, p)
    return out


@dataclass(frozen=True)
class _Unit:
    layer: str
    gemms: tuple[str, ...]


@dataclass
class _Problem:
    """The ILP's data: per (unit index, precision) its objective term and budget term ("fp4" FLOPs or
    "cost"); per stage the budget's constant part (pinned layers) and normaliser (FLOPs or bf16 cost)."""

    units: list[_Unit]
    candidates: tuple[str, ...]
    what: str
    values: dict[tuple[int, str], dict[str, float]]
    groups: dict[int, list[str]]
    const: dict[int, float]
    norm: dict[int, float]


def _formulate(stats: PlannerStats, budget: Budget, candidates: tuple[str, ...], lam: float, granularity: str,
               pins: Mapping[str, LinearPrecision], groups: dict[int, list[str]],
               shapes: Mapping[str, LayerShape]) -> _Problem:
    by_name = stats.by_name()
    what = "fp4" if budget.kind == "fp4_fraction" else "cost"
    free = [n for n in by_name if n not in pins]
    units = [_Unit(n, (g,)) for n in free for g in GEMMS] if granularity == "gemm" else [_Unit(n, GEMMS) for n in free]

    def budget_term(name: str, gemm: str, precision: str) -> float:
        if what == "fp4":
            return gemm_flops(shapes[name], gemm) if is_fp4(precision) else 0.0
        return budget.cost_model.gemm_cost(shapes[name], gemm, precision)

    values = {(i, p): {"objective": sum(gemm_objective(by_name[u.layer], g, p, stats.loss, lam) for g in u.gemms),
                       what: sum(budget_term(u.layer, g, p) for g in u.gemms)}
              for i, u in enumerate(units) for p in candidates}
    const = {st: sum(budget_term(n, g, pins[n].gemm(g).name) for n in ns if n in pins for g in GEMMS)
             for st, ns in groups.items()}
    norm = {st: sum(gemm_flops(shapes[n], g) if what == "fp4" else budget_term(n, g, "bf16") for n in ns for g in GEMMS)
            for st, ns in groups.items()}
    return _Problem(units, candidates, what, values, groups, const, norm)


def _solve_lp(problem: _Problem, budget: Budget, time_limit: float | None) -> dict[int, str]:
    """{unit index: chosen precision} minimising the objective within the budget of every stage."""
    pr = problem
    if not pr.units:
        return {}
    group_of = {n: st for st, ns in pr.groups.items() for n in ns}
    scale = max(abs(v["objective"]) for v in pr.values.values()) or 1.0
    prob = pulp.LpProblem("snip_precision_plan", pulp.LpMinimize)
    x = {(i, p): prob.add_variable(f"x_{i}_{j}", cat=pulp.LpBinary) for i in range(len(pr.units))
         for j, p in enumerate(pr.candidates)}
    # Expressions built from (variable, coefficient) lists: ~10x faster than lpSum of products.
    prob += pulp.LpAffineExpression([(v, pr.values[k]["objective"] / scale) for k, v in x.items()])
    for i in range(len(pr.units)):
        prob += pulp.LpConstraint(pulp.LpAffineExpression([(x[i, p], 1) for p in pr.candidates]),
                                  pulp.LpConstraintEQ, rhs=1)
    for st in pr.groups:
        terms = [(x[i, p], pr.values[i, p][pr.what] / pr.norm[st]) for i, u in enumerate(pr.units)
                 if group_of[u.layer] == st for p in pr.candidates]
        sense = pulp.LpConstraintGE if pr.what == "fp4" else pulp.LpConstraintLE
        prob += pulp.LpConstraint(pulp.LpAffineExpression(terms), sense, rhs=budget.value - pr.const[st] / pr.norm[st])
    status = prob.solve(_cbc(time_limit))
    if pulp.LpStatus[status] != "Optimal":
        raise RuntimeError(f"CBC did not find an optimal plan: status {pulp.LpStatus[status]}")
    return {i: next(p for p in pr.candidates if x[i, p].value() > 0.5) for i in range(len(pr.units))}


def solve(stats: PlannerStats, budget: Budget, candidates: Sequence[str] = ("fp8", "fp4"), *,
          lam: float = DEFAULT_LAMBDA, granularity: str = "layer", pinned: Mapping[str, object] | None = None,
          stages: Mapping[str, int] | Callable[[str], int] | None = None, tokens: int | None = None,
          time_limit: float | None = None) -> Plan:
    """The plan of minimum sum LD/L + lam WD within `budget` (see the module docstring).

    `tokens` overrides the M of every layer (tokens of one training step, for measured costs, when the
    calibration batch is smaller than a training batch).
    """
    t0 = time.perf_counter()
    if granularity not in ("layer", "gemm"):
        raise ValueError(f"granularity must be 'layer' or 'gemm', got {granularity!r}")
    if not lam >= 0:
        raise ValueError(f"lambda must be >= 0, got {lam}")
    candidates = validate_candidates(candidates, stats)
    if budget.kind == "fp4_fraction" and budget.value > 0 and not any(is_fp4(c) for c in candidates):
        raise InfeasibleBudget(f"budget '{budget.describe()}' needs a 4-bit candidate; got {list(candidates)}", 0.0)
    names = [s.name for s in stats.layers]
    shapes = {s.name: s.shape if tokens is None else
              LayerShape(s.name, s.shape.in_features, s.shape.out_features, tokens) for s in stats.layers}
    pins = _pins(names, pinned, set(candidates) | {"bf16"})
    groups = stage_groups(names, stages)
    problem = _formulate(stats, budget, candidates, lam, granularity, pins, groups, shapes)
    _check_feasible(budget, problem, stages is not None, bool(pins))
    chosen = _solve_lp(problem, budget, time_limit)
    choice = {(n, g): p.gemm(g).name for n, p in pins.items() for g in GEMMS}
    for i, u in enumerate(problem.units):
        choice.update({(u.layer, g): chosen[i] for g in u.gemms})
    plan = make_plan(choice, names, stats, budget, candidates, lam, granularity, shapes, "snip",
                     {"solve_time_s": time.perf_counter() - t0})
    for st, members in groups.items():
        sub = plan_metrics({k: v for k, v in choice.items() if k[0] in members}, {n: shapes[n] for n in members},
                           budget.cost_model)
        if not budget.satisfied_by(sub):
            raise RuntimeError(f"CBC's plan violates the budget beyond float tolerance (stage {st}: {sub})")
    return plan


def _cbc(time_limit: float | None):
    """CBC: a system / pulp[cbc] install when there is one, else the binary bundled with PuLP 3.

    Plain branch and bound with zero gap: the LP relaxation of this multiple-choice knapsack is almost
    integral, and on a 70B-sized instance CBC's preprocessing, cuts and heuristics cost 4x the time and
    stopped at a slightly worse "optimal" plan (objective +1e-5 relative) than plain B&B finds.
    """
    kw = dict(msg=False, timeLimit=time_limit, threads=1, gapRel=0, gapAbs=0,
              options=["preprocess off", "cuts off", "heuristics off"])
    system = pulp.COIN_CMD(**kw)
    if system.available():
        return system
    with warnings.catch_warnings():  # PuLP 3.3 deprecates its bundled CBC in favour of pulp[cbc]
        warnings.simplefilter("ignore", DeprecationWarning)
        return pulp.PULP_CBC_CMD(**kw)


def _check_feasible(budget: Budget, pr: _Problem, staged: bool, has_pins: bool) -> None:
    """Raise InfeasibleBudget naming the tightest budget that some plan meets."""
    pick = max if pr.what == "fp4" else min
    best = {}
    for st, members in pr.groups.items():
        inside = set(members)
        total = pr.const[st] + sum(pick(pr.values[i, p][pr.what] for p in pr.candidates)
                                   for i, u in enumerate(pr.units) if u.layer in inside)
        best[st] = total / pr.norm[st]
    if pr.what == "fp4":
        worst = min(best.values())
        ok = worst >= budget.value - 1e-12
        reach = f"at most {100 * worst:.4g}% of linear FLOPs can run in FP4"
    else:
        worst = max(best.values())
        ok = worst <= budget.value + 1e-12
        reach = f"the cheapest plan costs {worst:.4g} x all-bf16"
    if not ok:
        where = " in the most constrained pipeline stage" if staged and len(best) > 1 else ""
        pins = " and the pinned layers" if has_pins else ""
        raise InfeasibleBudget(f"budget '{budget.describe()}' is infeasible: with candidates {list(pr.candidates)}"
                               f"{pins}, {reach}{where}; the tightest feasible budget is {worst:.6g}", worst)


def make_plan(choice: Mapping[tuple[str, str], str], names: Sequence[str], stats: PlannerStats, budget: Budget,
              candidates: Sequence[str], lam: float, granularity: str, shapes: Mapping[str, LayerShape], method: str,
              extra: Mapping[str, float] | None = None) -> Plan:
    """A Plan from {(layer, gemm): precision}, with its budget metrics and (when measurable) objective."""
    precisions = {n: LinearPrecision(**{g: choice[(n, g)] for g in GEMMS}) for n in names}
    metrics = plan_metrics(choice, shapes, budget.cost_model)
    m = {"fp4_fraction": metrics.fp4_fraction, "relative_cost": metrics.relative_cost}
    try:
        m.update(plan_objective(choice, stats, lam))
    except KeyError:
        pass  # a precision without measured errors (pinned or baseline): no objective to report
    m.update(extra or {})
    return Plan(precisions, method=method, step=stats.step, granularity=granularity, candidates=tuple(candidates),
                lam=lam, budget=budget.to_json(), metrics=m, stats=stats)
