"""How stale a plan goes within a re-plan interval: the plan made at a checkpoint judged by later statistics.

    python -m experiments.staleness [--phases 100,400,1200] [--offsets 0,10,50] [--interval 50]

The plan made at a checkpoint (the planner's defaults, per GEMM, WD over `--interval` steps) against the statistics
`offset` steps later on the same bf16 trajectory, as the regret the drift trigger (planner.schedule) reads:
F(old) / F(new) - 1 under the later statistics. Offset 0 measures on another calibration batch at the same step: the
estimator's own floor. Also each transformer block's share of the total LD and its growth.
Results: bench/results/cpu-planner-staleness.{json,md}.
"""

from __future__ import annotations

import argparse
import collections

import torch

from experiments import results
from experiments.common import add_run_arguments, checkpoint, floats, ints, stats_at
from planner import DEFAULT_LAMBDA, Budget, DivergenceConfig, PlannerStats, block_index, plan_objective, solve


def block_ld(stats: PlannerStats) -> dict[int, float]:
    """Each transformer block's LD/L in FP4."""
    out = collections.defaultdict(float)
    for layer in stats.layers:
        out[block_index(layer.name)] += layer.ld("fp4") / stats.loss
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phases", type=ints, default=[100, 400, 1200], help="bf16 checkpoint steps (default: %(default)s)")
    p.add_argument("--offsets", type=ints, default=[0, 10, 50],
                   help="steps after each phase at which its plan is judged (default: %(default)s)")
    p.add_argument("--interval", type=int, default=50, help="WD's horizon in steps (default: %(default)s)")
    p.add_argument("--budgets", type=floats, default=[0.5, 0.75, 0.8], help="FP4 shares (default: %(default)s)")
    add_run_arguments(p)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for phase in args.phases:
        base = stats_at(checkpoint(phase), DivergenceConfig().draws, wd_horizon=args.interval)
        made = {b: solve(base, Budget.fp4_fraction(b), ("fp8", "fp4"), granularity="gemm") for b in args.budgets}
        then = block_ld(base)
        for offset in args.offsets:
            later = stats_at(checkpoint(phase + offset), DivergenceConfig().draws, wd_horizon=args.interval,
                             calibration_seed=8)
            row = {"phase": phase, "offset": offset, "loss": later.loss}
            for budget, old in made.items():
                new = solve(later, Budget.fp4_fraction(budget), ("fp8", "fp4"), granularity="gemm")
                f_old, f_new = (plan_objective(p.assignment(), later, DEFAULT_LAMBDA)["objective"] for p in (old, new))
                row[f"regret_at_{budget}"] = f_old / f_new - 1
            row["ld_growth_per_block"] = {b: v / then[b] for b, v in block_ld(later).items()}
            rows.append(row)
    md = [f"Tiny preset, one bf16 trajectory (constant lr); the plan per GEMM at each phase (calibration batch 7, WD "
          f"over {args.interval} steps) judged under the statistics `offset` steps later (calibration batch 8). Regret: "
          "F(old) / F(new) - 1, F = LD/L + lambda WD/L. LD growth: each block's LD/L (FP4) later over then.", "",
          "| phase | offset | " + " | ".join(f"regret at {b:.0%}" for b in args.budgets) + " | LD growth per block |",
          "|---|---|" + "---|" * len(args.budgets) + "---|"]
    md += [f"| {r['phase']} | {r['offset']} | " + " | ".join(f"{r[f'regret_at_{b}']:.3f}" for b in args.budgets) + " | "
           + ", ".join(f"{b}: {g:.2f}x" for b, g in sorted(r["ld_growth_per_block"].items())) + " |" for r in rows]
    results.write(args.results, "staleness", {"interval": args.interval, "budgets": args.budgets,
                                              "offsets": args.offsets, "rows": rows}, "\n".join(md))


if __name__ == "__main__":
    main()
