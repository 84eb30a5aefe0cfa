"""The quality grid's tables from its trained runs: per cell (checkpoint phase, FP4 budget) every method's paired gap
to bf16 per seed, the claim's verdict against the heuristics, and its rank among random plans.

Tabulating needs the runs alone, no planner: a committed results file re-tabulates from its raw runs
(`retabulate`) whatever planner options its methods were trained with, and whatever layout its run keys have
(`QualityRun.from_key`: the earliest keys lack the evaluation batches, later ones the learning rate).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
import shlex
import statistics

from experiments.common import LRS, check_paired, mean_se
from snip_ops.formats import GEMMS

# The heuristics of planner.baselines that SNIP is judged against (uniform_fp8 is no contender).
HEURISTICS = ("uniform_fp4", "first_last", "layer_type", "min_rel_error", "min_abs_error", "random")
BUDGET_FREE = ("bf16", "uniform_fp4")  # methods whose run is the same at every budget
# a planned method's name + GEMM_SUFFIX: the same method with one precision per GEMM instead of per layer
GEMM_SUFFIX = "_gemm"
# a planned method's name + DRIFT_SUFFIX (before GEMM_SUFFIX): re-plans spaced by the schedule's drift trigger
DRIFT_SUFFIX = "_drift"
# "random<k>" (k >= 1): the random heuristic with the priorities of seed k ("random" is seed 0). One random plan is
# one draw; several give the distribution SNIP's plan is ranked in (quality_random_ranks), not more rivals.
RANDOM_DRAW = re.compile(r"random([1-9][0-9]*)")


def base_method(method: str) -> str:
    """A method without its granularity and re-plan suffixes ("min_abs_error_drift_gemm" -> "min_abs_error")."""
    return method.removesuffix(GEMM_SUFFIX).removesuffix(DRIFT_SUFFIX)


@dataclasses.dataclass(frozen=True)
class QualityRun:
    """One branch of the quality grid: `method` trained `steps` steps from the `phase`-step checkpoint of `preset`
    at learning rate `lr` on the batches of `seed`, re-planning every `interval` steps at `budget` (FP4 share),
    evaluated on `eval_batches` validation batches (the same ones for every branch). `budget` is None for a
    budget-free method's run read from its key; `eval_batches` and `lr` are None for keys of the layouts that
    did not record them."""

    preset: str
    phase: int
    budget: float | None
    method: str
    seed: int
    steps: int
    interval: int
    eval_batches: int | None
    lr: float | None

    @classmethod
    def of(cls, preset: str, phase: int, budget: float, method: str, seed: int, steps: int, interval: int,
           eval_batches: int) -> "QualityRun":
        """A run to train: at the preset's learning rate (experiments.common.LRS)."""
        return cls(preset, phase, budget, method, seed, steps, interval, eval_batches, LRS[preset])

    @classmethod
    def from_key(cls, key: str) -> "QualityRun":
        preset, phase, budget, method, seed, steps, interval, *rest = key.split("/")
        eval_batches = int(rest[0].removeprefix("e")) if rest else None
        lr = float(rest[1].removeprefix("lr")) if len(rest) > 1 else None
        run = cls(preset, int(phase), None if budget == "-" else float(budget), method, int(seed), int(steps),
                  int(interval), eval_batches, lr)
        if run.key != key:
            raise ValueError(f"{key!r} is not a quality run's key (read back as {run.key!r})")
        return run

    @property
    def key(self) -> str:
        budget = "-" if self.method in BUDGET_FREE else self.budget
        key = f"{self.preset}/{self.phase}/{budget}/{self.method}/{self.seed}/{self.steps}/{self.interval}"
        if self.eval_batches is not None:
            key += f"/e{self.eval_batches}"
        if self.lr is not None:
            key += f"/lr{self.lr:g}"
        return key


def grid(preset: str, phases, budgets, seeds, methods, steps: int, interval: int, eval_batches: int,
         ablation=()) -> list[QualityRun]:
    """The runs of a grid, cell by cell (phase, budget) in the order given, so that a partial grid leaves whole
    cells; the `ablation` methods at the middle budget only; each run once (budget-free ones are shared)."""
    runs = []
    for phase in phases:
        for budget in budgets:
            for seed in seeds:
                for m in methods:
                    if m in ablation and budget != budgets[len(budgets) // 2]:
                        continue
                    runs.append(QualityRun.of(preset, phase, budget, m, seed, steps, interval, eval_batches))
    return list({r.key: r for r in runs}.values())


def kept_above_fp4(results: list[dict]) -> dict[str, float] | None:
    """Of the GEMMs that a method's plans (every re-plan of every seed) keep above FP4, the share of each kind
    (fprop, dgrad, wgrad; by count); None for a method without plans (bf16, uniform FP4), one that keeps none, or
    runs recorded before their plans' precisions were."""
    plans = [plan for r in results for plan in r["plans"]]
    if not all("precisions" in plan for plan in plans):
        return None
    counts = collections.Counter(g for plan in plans for p in plan["precisions"].values()
                                 for g in GEMMS if (p if isinstance(p, str) else p[g]) != "fp4")
    total = sum(counts.values())
    return {g: counts[g] / total for g in GEMMS} if total else None


def quality_table(runs: list[QualityRun], done: dict, budgets, phases, seeds) -> dict:
    """Per (phase, budget): per method, the paired gaps to bf16 per seed, their mean and spread, the FP4 share,
    which GEMMs its plans keep above FP4. A method missing a seed's run (or its bf16 run) is left out."""
    table = {}
    for phase in phases:
        for budget in budgets:
            cell, paired = {}, collections.defaultdict(dict)  # paired: seed -> the runs its gaps subtract
            for r in runs:
                if r.phase != phase or (r.budget != budget and r.method not in BUDGET_FREE) or r.method in cell:
                    continue
                mine = [dataclasses.replace(r, budget=budget, seed=s).key for s in seeds]
                ref = [dataclasses.replace(r, budget=budget, method="bf16", seed=s).key for s in seeds]
                if any(k not in done for k in mine + ref):  # not trained (yet)
                    continue
                for s, a, b in zip(seeds, mine, ref):
                    paired[s].update({a: done[a], b: done[b]})
                results = [done[k] for k in mine]
                gaps = [done[a]["final_val_loss"] - done[b]["final_val_loss"] for a, b in zip(mine, ref)]
                cell[r.method] = {"gap_per_seed": gaps, "mean_gap": statistics.mean(gaps),
                                  "std_gap": statistics.stdev(gaps) if len(gaps) > 1 else 0.0,
                                  "fp4_fraction": statistics.mean(m["fp4_fraction"] for m in results),
                                  "kept_above_fp4": kept_above_fp4(results),
                                  "final_val_loss": [m["final_val_loss"] for m in results]}
            for s, unit in paired.items():
                check_paired(unit, f"cell {phase}/{budget}, seed {s}")
            if cell:
                table[f"{phase}/{budget}"] = cell
    return table


def seeds_to_resolve(margins: dict[str, tuple[float, float]], seeds: int) -> int | None:
    """How many paired seeds would resolve every margin {rival: (mean, standard error)} measured on `seeds` seeds, were
    each mean to stay as measured: the standard error falls as 1 / sqrt(seeds), so a margin d of standard error se
    exceeds two of them beyond seeds * (2 se / d)^2. `seeds` where every margin is resolved already; None where a
    margin is not positive (no number of seeds resolves it)."""
    if any(d <= 0 for d, _ in margins.values()):
        return None
    return max(seeds, *(math.floor(seeds * (2 * se / d) ** 2) + 1 for d, se in margins.values()))


def quality_verdicts(table: dict, claim: str) -> dict:
    """Per cell: is the `claim` method's mean gap below every heuristic's (per layer or per GEMM), its margin to
    the best one (with the standard error of the per-seed paired differences), whether it is below every one by
    more than two standard errors of that paired difference (resolved: a mean below by less is within what the
    seeds' rounding bits alone move a branch, experiments.plan_replay's reseed), how many seeds would resolve it were
    the margins to hold (seeds_to_resolve), and on how many seeds it is below every heuristic."""
    out = {}
    for key, cell in table.items():
        rivals = [m for m in cell if base_method(m) in HEURISTICS]
        if claim not in cell or not rivals:
            continue
        best = min(rivals, key=lambda m: cell[m]["mean_gap"])
        mine = cell[claim]
        margins = {m: mean_se([b - g for b, g in zip(cell[m]["gap_per_seed"], mine["gap_per_seed"])]) for m in rivals}
        out[key] = {"claim": claim, "below_every_heuristic": all(mine["mean_gap"] < cell[m]["mean_gap"] for m in rivals),
                    "resolved_below_every_heuristic": all(d > 2 * se for d, se in margins.values()),
                    "margins": margins, "best_heuristic": best,
                    "margin_to_best_heuristic": cell[best]["mean_gap"] - mine["mean_gap"],
                    "margin_standard_error": margins[best][1],
                    "seeds_to_resolve": seeds_to_resolve(margins, len(mine["gap_per_seed"])),
                    "seeds_below_every_heuristic": sum(all(mine["gap_per_seed"][i] < cell[m]["gap_per_seed"][i]
                                                           for m in rivals) for i in range(len(mine["gap_per_seed"])))}
    return out


def quality_random_ranks(table: dict, claim: str) -> dict:
    """Per cell with the random heuristic drawn more than once at the claim's granularity (random, random<k>):
    below how many of the draws the `claim` method's mean gap lies, and the paired per-seed difference between
    the draws' mean gap and the claim's (mean and standard error): SNIP against random choice, not one draw."""
    suffix = GEMM_SUFFIX if claim.endswith(GEMM_SUFFIX) else ""
    out = {}
    for key, cell in table.items():
        draws = [m for m in cell if m.endswith(suffix) and
                 (m.removesuffix(suffix) == "random" or RANDOM_DRAW.fullmatch(m.removesuffix(suffix)))]
        if claim not in cell or len(draws) < 2:
            continue
        mine = cell[claim]
        diffs = [statistics.mean(cell[m]["gap_per_seed"][i] for m in draws) - g
                 for i, g in enumerate(mine["gap_per_seed"])]
        out[key] = {"draws": sorted(draws), "below_draws": sum(mine["mean_gap"] < cell[m]["mean_gap"] for m in draws),
                    "draw_mean_gaps": sorted(cell[m]["mean_gap"] for m in draws),
                    "advantage_over_draw_mean": statistics.mean(diffs),
                    "advantage_standard_error": statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0}
    return out


def claim_of(summary: dict) -> str:
    """The method a quality summary judged: recorded as "claim", else the --claim of its command (default snip)."""
    if "claim" in summary:
        return summary["claim"]
    words = shlex.split(summary["command"])
    return words[words.index("--claim") + 1] if "--claim" in words else "snip"


def retabulate(summary: dict, runs: dict) -> dict:
    """A quality summary's "table", "verdicts" and "random_ranks" from its raw runs, as the grid tabulates them
    (experiments.quality --report-only): the runs' own keys give the grid, the summary its phases, budgets, seeds
    and claim."""
    claim = claim_of(summary)
    table = quality_table([QualityRun.from_key(k) for k in runs], runs, summary["budgets"], summary["phases"],
                          summary["seeds"])
    return {"table": table, "verdicts": quality_verdicts(table, claim), "random_ranks": quality_random_ranks(table, claim)}
