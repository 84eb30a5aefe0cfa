"""From cell records to the sweep's findings: divergence per (precision, learning rate), final losses,
stable learning-rate ranges, and how well early sharpness predicts later divergence.

Divergence of a cell (see `planner.stability.divergence`): diverged online (non-finite loss or sustained blow-up),
or finished more than `baseline_nats` above the mean final loss of the baseline precision's runs
at the same learning rate. The baseline's own runs are judged by the same rule (so a baseline seed far
above its siblings counts too). Cells stopped by the time limit are left out of the rates (and
counted as `incomplete`).

Early sharpness is the measurement at `early_step` (default: the first one, `setup.sharpness_every`);
cells that diverged before it have none and are left out of the correlations. Each sharpness kind a
record carries is analysed alike (`SHARPNESS_KINDS`): ours in random and gradient directions (KL/rho^2)
and, where measured, the stability paper's epsilon-sharpness ("epsilon", percent). The correlations are
reported over all cells and within each learning rate, because the learning rate drives both
sharpness and divergence and would otherwise make any metric look predictive:

* `auc`: probability that a diverged cell had a higher early sharpness than a stable one (0.5 = no
  information), the Mann-Whitney statistic;
* `point_biserial_r`: Pearson correlation of log sharpness with the 0/1 divergence outcome;
* `spearman_final_loss`: rank correlation of early sharpness with the final loss of the cells that
  did not diverge.

Where the paper's epsilon-sharpness was measured, `metric_agreement` is the Spearman rank correlation,
over the cells that have both, of its early value with each of our kinds': do the two metrics order the
runs alike?
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any, Iterable

from scipy import stats

from planner.stability import exceeds_baseline

__all__ = ["SHARPNESS_KINDS", "baseline_losses", "judge", "summarize", "sharpness_at"]

# the keys of a sharpness measurement in a cell record (cell.run_cell), in report order
SHARPNESS_KINDS = ("random", "gradient", "epsilon")


def _cell(record: dict[str, Any]) -> tuple[str, float, int]:
    c = record["cell"]
    return c["precision"], float(c["lr"]), int(c["seed"])


def baseline_losses(records: Iterable[dict[str, Any]], baseline: str | None) -> dict[float, float]:
    """{lr: mean final loss of the baseline's runs that did not diverge online} (see divergence.py)."""
    losses: dict[float, list[float]] = defaultdict(list)
    for r in records:
        precision, lr, _ = _cell(r)
        if precision == baseline and not r["diverged_online"] and r["status"] == "complete" and r["final_loss"] is not None:
            losses[lr].append(r["final_loss"])
    return {lr: statistics.fmean(v) for lr, v in losses.items()}


def judge(records: Iterable[dict[str, Any]], baseline: str | None, baseline_nats: float) -> list[dict[str, Any]]:
    """Per cell: {precision, lr, seed, diverged (bool, None if incomplete), reason, final_loss, spikes, steps}."""
    records = list(records)
    base = baseline_losses(records, baseline)
    out = []
    for r in records:
        precision, lr, seed = _cell(r)
        reason = r["divergence_reason"] if r["diverged_online"] else None
        if reason is None and r["status"] == "time_limit":
            reason = "incomplete"
        elif reason is None and exceeds_baseline(r["final_loss"], base.get(lr), baseline_nats):
            reason = "above-baseline"
        diverged = None if reason == "incomplete" else reason is not None
        out.append({
            "precision": precision, "lr": lr, "seed": seed, "diverged": diverged, "reason": reason,
            "final_loss": r["final_loss"], "spikes": r["spikes"], "steps": r["steps"], "record": r,
        })
    return out


def sharpness_at(record: dict[str, Any], step: int, direction: str) -> float | None:
    for entry in record["sharpness"]:
        if entry["step"] == step and direction in entry:
            return entry[direction]["mean"]
    return None


def _auc(positive: list[float], negative: list[float]) -> float | None:
    if not positive or not negative:
        return None
    u = stats.mannwhitneyu(positive, negative, alternative="two-sided").statistic
    return float(u) / (len(positive) * len(negative))


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _finite(v: float) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def _correlation(points: list[tuple[float, bool, float | None]]) -> dict[str, Any]:
    """points: (early sharpness, diverged, final loss)."""
    xs = [math.log(max(x, 1e-30)) for x, _, _ in points]
    ys = [float(d) for _, d, _ in points]
    n_div = int(sum(ys))
    result: dict[str, Any] = {"n": len(points), "n_diverged": n_div}
    both = 0 < n_div < len(points)
    result["auc"] = _auc([x for x, d in zip(xs, ys) if d], [x for x, d in zip(xs, ys) if not d]) if both else None
    if both and len(set(xs)) > 1:
        r, p = stats.pearsonr(xs, ys)
        result["point_biserial_r"], result["point_biserial_p"] = _finite(float(r)), _finite(float(p))
    else:
        result["point_biserial_r"] = result["point_biserial_p"] = None
    stable = [(x, loss) for (x, d, loss) in points if loss is not None and not d]
    if len(stable) >= 3 and len({x for x, _ in stable}) > 1:
        rho, p = stats.spearmanr([x for x, _ in stable], [loss for _, loss in stable])
        result["spearman_final_loss"], result["spearman_final_loss_p"] = _finite(float(rho)), _finite(float(p))
    else:
        result["spearman_final_loss"] = result["spearman_final_loss_p"] = None
    return result


def summarize(
    records: Iterable[dict[str, Any]],
    baseline: str | None,
    baseline_nats: float,
    early_step: int | None = None,
    precisions: Iterable[str] | None = None,
    learning_rates: Iterable[float] | None = None,
) -> dict[str, Any]:
    """The sweep's tables (JSON-ready). Orders follow `precisions` / `learning_rates` when given."""
    records = list(records)
    verdicts = judge(records, baseline, baseline_nats)
    precisions = list(precisions) if precisions is not None else sorted({v["precision"] for v in verdicts})
    lrs = sorted(learning_rates) if learning_rates is not None else sorted({v["lr"] for v in verdicts})
    if early_step is None:
        steps = [e["step"] for v in verdicts for e in v["record"]["sharpness"]]
        early_step = min(steps) if steps else None

    by_cell: dict[tuple[str, float], list[dict[str, Any]]] = defaultdict(list)
    for v in verdicts:
        by_cell[(v["precision"], v["lr"])].append(v)
    table: dict[str, dict[str, Any]] = {}
    for p in precisions:
        row = {}
        for lr in lrs:
            vs = by_cell.get((p, lr), [])
            judged = [v for v in vs if v["diverged"] is not None]
            losses = [v["final_loss"] for v in judged if not v["diverged"] and v["final_loss"] is not None]
            row[repr(lr)] = {
                "n": len(judged),
                "diverged": sum(v["diverged"] for v in judged),
                "rate": sum(v["diverged"] for v in judged) / len(judged) if judged else None,
                "incomplete": len(vs) - len(judged),
                "reasons": sorted({v["reason"] for v in judged if v["reason"]}),
                "mean_final_loss": statistics.fmean(losses) if losses else None,
                "std_final_loss": statistics.stdev(losses) if len(losses) > 1 else None,
                "mean_spikes": statistics.fmean(v["spikes"] for v in vs) if vs else None,
                "median_early_sharpness": {d: _median(sharpness_at(v["record"], early_step, d) for v in vs)
                                           for d in SHARPNESS_KINDS} if early_step is not None else {},
            }
        judged_all = [c for c in row.values() if c["n"]]
        table[p] = {
            "by_lr": row,
            "divergence_rate": (sum(c["diverged"] for c in judged_all) / sum(c["n"] for c in judged_all)) if judged_all else None,
            "stable_lrs": [lr for lr in lrs if row[repr(lr)]["n"] and row[repr(lr)]["diverged"] == 0],
        }

    correlations: dict[str, Any] = {}
    if early_step is not None:
        for direction in SHARPNESS_KINDS:
            points = [
                (s, bool(v["diverged"]), v["final_loss"], v["lr"])
                for v in verdicts if v["diverged"] is not None
                for s in [sharpness_at(v["record"], early_step, direction)] if s is not None
            ]
            if not points:
                continue
            correlations[direction] = {
                "all": _correlation([pt[:3] for pt in points]),
                "within_lr": {repr(lr): _correlation([pt[:3] for pt in points if pt[3] == lr]) for lr in lrs},
            }
    agreement: dict[str, Any] = {}
    if early_step is not None:
        for ours in ("random", "gradient"):
            pairs = [(sharpness_at(v["record"], early_step, "epsilon"), sharpness_at(v["record"], early_step, ours))
                     for v in verdicts]
            pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
            if len(pairs) >= 3 and len({a for a, _ in pairs}) > 1 and len({b for _, b in pairs}) > 1:
                rho, p = stats.spearmanr([a for a, _ in pairs], [b for _, b in pairs])
                agreement[ours] = {"n": len(pairs), "spearman": _finite(float(rho)), "p": _finite(float(p))}
    return {
        "baseline": baseline,
        "baseline_nats": baseline_nats,
        "baseline_loss_by_lr": {repr(lr): v for lr, v in sorted(baseline_losses(records, baseline).items())},
        "precisions": precisions,
        "learning_rates": lrs,
        "cells": len(verdicts),
        "table": table,
        "early_sharpness_step": early_step,
        "sharpness_vs_divergence": correlations,
        "metric_agreement": agreement,
        "verdicts": [
            {**{k: v for k, v in x.items() if k != "record"},
             "early_sharpness": {d: sharpness_at(x["record"], early_step, d) for d in SHARPNESS_KINDS}
             if early_step is not None else {}}
            for x in verdicts
        ],
    }
