"""The precision ILP (docs/design.md §4.5), solved with PuLP + CBC.

A *unit* is what one decision covers: a layer (granularity "layer", the paper's setting: one
precision for all three GEMMs) or one GEMM of a layer (granularity "gemm"). Binary x[u, p] says unit
u runs in precision p; exactly one p per unit. The objective is

    sum_u,p x[u, p] * (LD(l, p) + lambda * WD(l, p)) / L        restricted to u's GEMMs:
    fprop carries LD / L, dgrad lambda s_dgrad e_dgrad / L, wgrad lambda s_wgrad e_wgrad / L,

subject to the budget (cost.Budget) on the whole model, or on every pipeline stage separately when
`stages` is given (each stage then meets the budget on its own share, which keeps stages balanced).
Pinned layers are fixed, enter the budget as constants and are not decision variables.

A plan meets the budget when `Budget.satisfied_by(plan_metrics(...))` says so, stage by stage: the same
float check as every other plan's (baselines, reports). Per stage the ILP is a multiple-choice knapsack
(planner/exact.py), which is how it is solved exactly:

1. a Lagrangian bound rules out every option that cannot appear in a plan better than a greedy one;
2. CBC solves the ILP on the options left, the greedy plan's included, within CBC_NODE_LIMIT nodes (each
   unit's objective terms shifted by its least one and divided by the largest, so that CBC's absolute
   tolerances, ~1e-7, separate the plans it compares rather than drown them in an unrelated large term);
3. an exact search in integer arithmetic certifies CBC's plan optimal or finds a better one.

The plan's metrics say how it went: `certified_optimal` (1.0: no plan is better by more than
exact.REL_TOL of the objective), `optimality_gap` (how far the objective may be above the optimum; 0
unless the search hit its node limit, which also warns), `cbc_binaries`, `search_nodes` and
`cbc_suboptimal` (1.0 when the search had to improve on CBC's plan).
"""

from __future__ import annotations

import fnmatch
import math
import sys
import time
import warnings
from dataclasses import dataclass
from functools import partial
from typing import Callable, Mapping, Sequence

import pulp

from snip_ops import LinearPrecision
from snip_ops.formats import GEMMS, recipe

from .cost import Budget, LayerShape, PlanMetrics, gemm_flops, is_fp4, layer_shapes, plan_metrics
from .exact import NODE_LIMIT, Certificate, Knapsack, fill, relax, search
from .plan import Plan
from .stats import LayerStats, PlannerStats

__all__ = ["DEFAULT_LAMBDA", "OBJECTIVE_TERMS", "InfeasibleBudget", "Objective", "Constraints", "Heuristic", "solve",
           "make_plan", "gemm_objective", "snip_objective", "assignment_objective", "plan_objective",
           "validate_candidates", "stage_groups"]


OBJECTIVE_TERMS = ("ld+wd", "ld", "wd")

# An objective term: (layer statistics, GEMM, precision) -> its cost in the ILP's objective.
Objective = Callable[[LayerStats, str, str], float]

# WD is an excess training loss, so both terms are loss increases relative to L and lambda = 1 weighs them as
# the loss model says (divergence.py).
DEFAULT_LAMBDA = 1.0

# CBC's branch-and-bound nodes. A few nodes already find the optimum on nearly every instance, and the
# exact search repairs the rest; uncapped, CBC proves every plan itself but can spend minutes proving it
# on a 70B-like instance. Proof is the search's job, so CBC is capped.
CBC_NODE_LIMIT = 10


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


def gemm_objective(s: LayerStats, gemm: str, precision: str, loss: float, lam: float, terms: str = "ld+wd") -> float:
    """The objective term of one GEMM of one layer in `precision` (0 for bf16): LD / L on fprop, lambda WD / L on
    dgrad and wgrad. `terms` "ld" or "wd" keeps one of them (the ablation of OBJECTIVE_TERMS)."""
    if recipe(precision).is_bf16:
        return 0.0
    if precision not in s.errors:
        raise KeyError(f"no measured errors for {precision!r} on {s.name}")
    if gemm == "fprop":
        return s.ld(precision) / loss if "ld" in terms.split("+") else 0.0
    if "wd" not in terms.split("+"):
        return 0.0
    return lam * s.wd(precision, gemm) / loss


def snip_objective(stats: PlannerStats, lam: float, terms: str = "ld+wd") -> Objective:
    """SNIP's per-GEMM objective term under `stats` (gemm_objective with its loss bound)."""
    return partial(gemm_objective, loss=stats.loss, lam=lam, terms=terms)


def assignment_objective(assignment: Mapping[tuple[str, str], str], stats: PlannerStats, term: Objective) -> float:
    """The total of `term` over a plan {(layer, gemm): precision}: what the ILP minimises for that plan."""
    return math.fsum(term(s, g, assignment[(s.name, g)]) for s in stats.layers for g in GEMMS)


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
    return {"objective": ld + lam * wd, "ld_over_loss": ld, "wd": wd}  # wd: WD / L in loss units


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


@dataclass(frozen=True)
class _Stage:
    """One pipeline stage: its layers, its free units (indices into the problem's) and their knapsack."""

    layers: tuple[str, ...]
    units: tuple[int, ...]
    knapsack: Knapsack
    norm: float  # the stage's FLOPs (FP4 budget) or all-bf16 cost: the scale of its CBC budget row


@dataclass(frozen=True)
class _Problem:
    units: tuple[_Unit, ...]
    candidates: tuple[str, ...]
    pins: Mapping[str, LinearPrecision]
    shapes: Mapping[str, LayerShape]
    budget: Budget
    stages: Mapping[int, _Stage]

    def assignment(self, st: int, choice: Sequence[int]) -> dict[tuple[str, str], str]:
        """{(layer, GEMM): precision} of stage `st` with its units on candidates `choice`."""
        stage = self.stages[st]
        out = {(n, g): self.pins[n].gemm(g).name for n in stage.layers if n in self.pins for g in GEMMS}
        for i, j in zip(stage.units, choice):
            out.update({(self.units[i].layer, g): self.candidates[j] for g in self.units[i].gemms})
        return out

    def metrics(self, st: int, choice: Sequence[int]) -> PlanMetrics:
        return plan_metrics(self.assignment(st, choice), {n: self.shapes[n] for n in self.stages[st].layers},
                            self.budget.cost_model)

    def feasible(self, st: int, choice: Sequence[int]) -> bool:
        """The budget check of record, the same float arithmetic as every other plan's."""
        return self.budget.satisfied_by(self.metrics(st, choice))


def _formulate(stats: PlannerStats, budget: Budget, candidates: tuple[str, ...], term: Objective, granularity: str,
               pins: Mapping[str, LinearPrecision], groups: dict[int, list[str]],
               shapes: Mapping[str, LayerShape]) -> _Problem:
    """Per stage, a knapsack with the budget as `weight <= capacity`: the weight is the FLOPs not in FP4
    (FP4 fraction budget) or the cost; the capacity is what `Budget.satisfied_by` admits, less the pinned
    layers, plus the rounding error of `plan_metrics`' sums."""
    by_name = stats.by_name()
    fp4_budget = budget.kind == "fp4_fraction"

    def weight(name: str, gemm: str, precision: str) -> float:
        if fp4_budget:
            return 0.0 if is_fp4(precision) else gemm_flops(shapes[name], gemm)
        return budget.cost_model.gemm_cost(shapes[name], gemm, precision)

    units: list[_Unit] = []
    stages = {}
    for st, names in groups.items():
        free = [n for n in names if n not in pins]
        first = len(units)
        units += ([_Unit(n, (g,)) for n in free for g in GEMMS] if granularity == "gemm"
                  else [_Unit(n, GEMMS) for n in free])
        mine = units[first:]
        values = tuple(tuple(sum(term(by_name[u.layer], g, p) for g in u.gemms)
                             for p in candidates) for u in mine)
        weights = tuple(tuple(sum(weight(u.layer, g, p) for g in u.gemms) for p in candidates) for u in mine)
        norm = sum(gemm_flops(shapes[n], g) if fp4_budget else weight(n, g, "bf16") for n in names for g in GEMMS)
        pinned = sum(weight(n, g, pins[n].gemm(g).name) for n in names if n in pins for g in GEMMS)
        if norm == 0:  # plan_metrics reports 0 for every plan of this stage: the weights do not matter
            weights, capacity = tuple(tuple(0.0 for _ in row) for row in weights), 0.0
        else:
            share = 1.0 - budget.value + Budget.TOLERANCE if fp4_budget else budget.value + Budget.TOLERANCE
            capacity = norm * share - pinned + (3 * len(names) + 8) * sys.float_info.epsilon * (norm + pinned)
        stages[st] = _Stage(tuple(names), tuple(range(first, len(units))), Knapsack(values, weights, capacity), norm)
    return _Problem(tuple(units), candidates, pins, shapes, budget, stages)


def _solve_cbc(problem: _Problem, allowed: Mapping[int, list[list[int]]], time_limit: float | None
               ) -> tuple[dict[int, tuple[int, ...]], int]:
    """CBC's plan {stage: candidate per unit} on the `allowed` options (per stage and unit), and its number
    of binaries. Stages it found no plan for are missing.

    Each unit's objective terms are shifted by its least allowed one and all are divided by the largest
    shifted term, so that the plans CBC compares differ by O(1), not by 1e-8 of an unrelated large term.
    """
    choices = {st: [opts[0] if len(opts) == 1 else None for opts in allowed[st]] for st in allowed}
    open_units = [(st, k) for st in allowed for k, opts in enumerate(allowed[st]) if len(opts) > 1]
    if not open_units:
        return {st: tuple(c) for st, c in choices.items()}, 0
    ks = {st: problem.stages[st].knapsack for st in allowed}
    shifted = {(st, k): {j: ks[st].values[k][j] - min(ks[st].values[k][i] for i in allowed[st][k])
                         for j in allowed[st][k]} for st, k in open_units}
    scale = max(c for terms in shifted.values() for c in terms.values()) or 1.0
    prob = pulp.LpProblem("snip_precision_plan", pulp.LpMinimize)
    x = {(st, k, j): prob.add_variable(f"x_{st}_{k}_{j}", cat=pulp.LpBinary) for st, k in open_units
         for j in allowed[st][k]}
    # Expressions built from (variable, coefficient) lists: ~10x faster than lpSum of products.
    prob += pulp.LpAffineExpression([(v, shifted[st, k][j] / scale) for (st, k, j), v in x.items()])
    for st, k in open_units:
        prob += pulp.LpConstraint(pulp.LpAffineExpression([(x[st, k, j], 1) for j in allowed[st][k]]),
                                  pulp.LpConstraintEQ, rhs=1)
    for st, opts in allowed.items():
        w, norm = ks[st].weights, problem.stages[st].norm
        least = [min(w[k][j] for j in o) for k, o in enumerate(opts)]
        terms = [(x[st, k, j], (w[k][j] - least[k]) / norm) for k, o in enumerate(opts) if len(o) > 1 for j in o
                 if w[k][j] > least[k]]
        if terms:
            prob += pulp.LpConstraint(pulp.LpAffineExpression(terms), pulp.LpConstraintLE,
                                      rhs=(ks[st].capacity - math.fsum(least)) / norm)
    status = prob.solve(_cbc(time_limit))
    if pulp.LpStatus[status] == "Optimal":
        for (st, k, j), v in x.items():
            if (v.value() or 0.0) > 0.5:
                choices[st][k] = j
    return {st: tuple(c) for st, c in choices.items() if None not in c}, len(x)


@dataclass(frozen=True)
class _StageResult:
    certificate: Certificate
    cbc_value: float | None  # CBC's plan (if CBC solved this stage and its plan met the budget)
    cbc_open: bool  # CBC had binaries of this stage to decide


def _solve_exact(problem: _Problem, time_limit: float | None) -> tuple[dict[int, _StageResult], int]:
    """Per stage, the certified optimum: the Lagrangian bound rules options out, CBC solves what is left,
    the exact search certifies or repairs its plan. Also returns CBC's number of binaries."""
    relaxations, greedy, allowed = {}, {}, {}
    for st, stage in problem.stages.items():
        rx = relaxations[st] = relax(stage.knapsack)
        # The lightest plan meets the budget (_check_feasible); the rounded LP solution, filled up, almost
        # always does too, and is far better.
        greedy[st] = stage.knapsack.lightest()
        for plan in (fill(rx, rx.rounded), rx.rounded):
            if rx.exact_value(plan) < rx.exact_value(greedy[st]) and problem.feasible(st, plan):
                greedy[st] = plan
                break
        # CBC's ILP keeps the greedy plan, so that its plan is never worse.
        allowed[st] = [sorted({*options, j}) for options, j in zip(rx.allowed(greedy[st]), greedy[st])]
    cbc, binaries = _solve_cbc(problem, allowed, time_limit)
    results = {}
    for st, rx in relaxations.items():
        mine = cbc.get(st)
        cbc_ok = mine is not None and problem.feasible(st, mine)
        start = min([greedy[st]] + ([mine] if cbc_ok else []), key=rx.exact_value)
        results[st] = _StageResult(search(rx, start, partial(problem.feasible, st)),
                                   rx.knapsack.value(mine) if cbc_ok else None,
                                   any(len(o) > 1 for o in allowed[st]))
    return results, binaries


@dataclass(frozen=True)
class Constraints:
    """What a plan must respect besides the budget: `pinned` layers ({FQN or fnmatch pattern: precision}, first
    match; fixed, outside the ILP, their cost inside the budget), pipeline `stages` ({FQN or pattern: stage}, or a
    function of the FQN; each stage then meets the budget on its own share) and `tokens`, the M of every layer's
    costs (tokens of one training step, for measured costs, when the calibration batch is smaller than a training
    batch; default: the statistics' own)."""

    pinned: Mapping[str, object] | None = None
    stages: Mapping[str, int] | Callable[[str], int] | None = None
    tokens: int | None = None


@dataclass(frozen=True)
class Heuristic:
    """An objective in place of SNIP's: its per-GEMM term (layer stats, GEMM, precision) -> score, and the method
    its plans are named after (the baselines, planner.baselines, solve their scores this way)."""

    name: str
    term: Objective


def _check_options(lam: float, granularity: str, terms: str) -> None:
    if granularity not in ("layer", "gemm"):
        raise ValueError(f"granularity must be 'layer' or 'gemm', got {granularity!r}")
    if not lam >= 0:
        raise ValueError(f"lambda must be >= 0, got {lam}")
    if terms not in OBJECTIVE_TERMS:
        raise ValueError(f"terms must be one of {OBJECTIVE_TERMS}, got {terms!r}")


def solve(stats: PlannerStats, budget: Budget, candidates: Sequence[str] = ("fp8", "fp4"), *,
          lam: float = DEFAULT_LAMBDA, granularity: str = "layer", terms: str = "ld+wd",
          constraints: Constraints = Constraints(), heuristic: Heuristic | None = None,
          time_limit: float | None = None) -> Plan:
    """The plan of minimum sum (LD + lam WD) / L within `budget` and `constraints` (see the module docstring).

    `terms` ("ld+wd", "ld" or "wd", OBJECTIVE_TERMS) drops one of SNIP's two terms (an ablation); a `heuristic`
    replaces SNIP's objective under the same budget and solver. The plan's "objective" metric is always SNIP's
    full objective. `time_limit` (seconds) bounds CBC; the exact search after it is bounded by `exact.NODE_LIMIT`.
    """
    t0 = time.perf_counter()
    _check_options(lam, granularity, terms)
    candidates = validate_candidates(candidates, stats)
    if budget.kind == "fp4_fraction" and budget.value > 0 and not any(is_fp4(c) for c in candidates):
        raise InfeasibleBudget(f"budget '{budget.describe()}' needs a 4-bit candidate; got {list(candidates)}", 0.0)
    names = [s.name for s in stats.layers]
    shapes = layer_shapes(stats.layers, constraints.tokens)
    pins = _pins(names, constraints.pinned, set(candidates) | {"bf16"})
    term = heuristic.term if heuristic is not None else snip_objective(stats, lam, terms)
    problem = _formulate(stats, budget, candidates, term, granularity, pins, stage_groups(names, constraints.stages),
                         shapes)
    _check_feasible(problem, constraints.stages is not None)
    results, binaries = _solve_exact(problem, time_limit)
    choice = {}
    for st, r in results.items():
        choice.update(problem.assignment(st, r.certificate.choice))
    return make_plan(choice, stats, budget, shapes, candidates=candidates, lam=lam, granularity=granularity,
                     method=heuristic.name if heuristic is not None else "snip",
                     extra={**_search_metrics(results, binaries), "solve_time_s": time.perf_counter() - t0})


def _search_metrics(results: Mapping[int, _StageResult], binaries: int) -> dict[str, float]:
    """How the solve went (the module docstring), warning when the exact search stopped at its node limit."""
    certified = all(r.certificate.optimal for r in results.values())
    gap = math.fsum(r.certificate.gap for r in results.values())
    if not certified:
        warnings.warn(f"the exact search stopped at its node limit ({NODE_LIMIT} per stage): the plan's objective "
                      f"may be up to {gap:.3g} above the optimum (metrics['optimality_gap'])", RuntimeWarning,
                      stacklevel=3)
    cbc_suboptimal = any(r.cbc_open and (r.cbc_value is None or r.certificate.value < r.cbc_value)
                         for r in results.values())
    return {"certified_optimal": float(certified), "optimality_gap": gap, "cbc_binaries": float(binaries),
            "search_nodes": float(sum(r.certificate.nodes for r in results.values())),
            "cbc_suboptimal": float(cbc_suboptimal)}


def _cbc(time_limit: float | None):
    """CBC: a system / pulp[cbc] install when there is one, else the binary bundled with PuLP 3.

    Zero gap, at most CBC_NODE_LIMIT nodes, no preprocessing or cuts (the LP relaxation of this
    multiple-choice knapsack is almost integral), heuristics on (they find most plans at the root). No
    `threads` option: with it CBC runs its parallel code, whose master sometimes idles ~10 s waiting for
    the worker thread.
    """
    kw = dict(msg=False, timeLimit=time_limit, gapRel=0, gapAbs=0, maxNodes=CBC_NODE_LIMIT,
              options=["preprocess off", "cuts off"])
    system = pulp.COIN_CMD(**kw)
    if system.available():
        return system
    with warnings.catch_warnings():  # PuLP 3.3 deprecates its bundled CBC in favour of pulp[cbc]
        warnings.simplefilter("ignore", DeprecationWarning)
        return pulp.PULP_CBC_CMD(**kw)


def _check_feasible(pr: _Problem, staged: bool) -> None:
    """Raise InfeasibleBudget naming the tightest budget that some plan meets, unless every stage's lightest
    plan (most FP4 FLOPs, or least cost) meets the budget."""
    fp4 = pr.budget.kind == "fp4_fraction"
    reach, ok = {}, True
    for st, stage in pr.stages.items():
        m = pr.metrics(st, stage.knapsack.lightest())
        reach[st] = m.fp4_fraction if fp4 else m.relative_cost
        ok = ok and pr.budget.satisfied_by(m)
    if ok:
        return
    worst = min(reach.values()) if fp4 else max(reach.values())
    what = (f"at most {100 * worst:.4g}% of linear FLOPs can run in FP4" if fp4
            else f"the cheapest plan costs {worst:.4g} x all-bf16")
    where = " in the most constrained pipeline stage" if staged and len(reach) > 1 else ""
    pins = " and the pinned layers" if pr.pins else ""
    raise InfeasibleBudget(f"budget '{pr.budget.describe()}' is infeasible: with candidates {list(pr.candidates)}"
                           f"{pins}, {what}{where}; the tightest feasible budget is {worst:.6g}", worst)


def make_plan(choice: Mapping[tuple[str, str], str], stats: PlannerStats, budget: Budget,
              shapes: Mapping[str, LayerShape], *, candidates: Sequence[str], lam: float, granularity: str, method: str,
              extra: Mapping[str, float] | None = None) -> Plan:
    """A Plan of `stats`' layers from {(layer, gemm): precision}, with its budget metrics (costs of `shapes`) and
    (when measurable) objective."""
    precisions = {s.name: LinearPrecision(**{g: choice[(s.name, g)] for g in GEMMS}) for s in stats.layers}
    metrics = plan_metrics(choice, shapes, budget.cost_model)
    m = {"fp4_fraction": metrics.fp4_fraction, "relative_cost": metrics.relative_cost}
    try:
        m.update(plan_objective(choice, stats, lam))
    except KeyError:
        pass  # a precision without measured errors (pinned or baseline): no objective to report
    m.update(extra or {})
    return Plan(precisions, method=method, step=stats.step, granularity=granularity, candidates=tuple(candidates),
                lam=lam, budget=budget.to_json(), metrics=m, stats=stats)
