"""WD's horizon without logits (the gradient variance) against with them (the Gauss-Newton diagonal).

    python -m experiments.horizon [--phases 100,400,1200] [--interval 50] [--budgets 0.5,0.75,0.8]

WD over a horizon of `--interval` steps needs the loss's Gauss-Newton diagonal: the Fisher LD pass's sampled-label
gradients give it for a model with logits, N Var(g_i) from the half batch for one without. Per checkpoint: the
Spearman correlation of the layers' WD sensitivities under either, their median ratio, and how many GEMMs the
per-GEMM plans agree on when LD (the Fisher one) is the same and only WD differs.
Results: bench/results/cpu-planner-horizon.{json,md}.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

import torch

from experiments import results
from experiments.common import add_run_arguments, checkpoint, floats, ints, spearman, stats_at
from planner import Budget, DivergenceConfig, solve


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phases", type=ints, default=[100, 400, 1200], help="bf16 checkpoint steps (default: %(default)s)")
    p.add_argument("--interval", type=int, default=50, help="WD's horizon in steps (default: %(default)s)")
    p.add_argument("--budgets", type=floats, default=[0.5, 0.75, 0.8], help="FP4 shares (default: %(default)s)")
    add_run_arguments(p)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for phase in args.phases:
        ckpt = checkpoint(phase)
        gn, var = (stats_at(ckpt, DivergenceConfig().draws, method=method, wd_horizon=args.interval)
                   for method in ("auto", "batched"))  # the Gauss-Newton diagonal, the gradient variance
        row = {"phase": phase, "val_loss": ckpt["val_loss"]}
        for key in ("s_wgrad", "s_dgrad"):
            a, b = [getattr(s, key) for s in gn.layers], [getattr(s, key) for s in var.layers]
            row[f"spearman_{key}"] = spearman(a, b)
            row[f"median_ratio_{key}"] = statistics.median(y / x for x, y in zip(a, b))
        mixed = dataclasses.replace(gn, layers=tuple(dataclasses.replace(g, s_dgrad=v.s_dgrad, s_wgrad=v.s_wgrad)
                                                     for g, v in zip(gn.layers, var.layers)))
        for budget in args.budgets:
            plans = [solve(s, Budget.fp4_fraction(budget), ("fp8", "fp4"), granularity="gemm").assignment()
                     for s in (gn, mixed)]
            row[f"same_gemms_at_{budget}"] = sum(plans[0][k] == plans[1][k] for k in plans[0]) / len(plans[0])
        rows.append(row)
    md = [f"Tiny preset, bf16 checkpoints after {', '.join(map(str, args.phases))} steps, the calibration batch of the "
          f"quality grid; WD over a horizon of {args.interval} steps (PlannerConfig(interval={args.interval})). "
          "Gauss-Newton: the diagonal from the Fisher LD pass's sampled-label gradients (a model with logits); "
          "gradient variance: N Var(g_i) from the half batch (a model without). Plans per GEMM with the "
          "Gauss-Newton run's LD and either WD.", "",
          "| phase | val loss | Spearman s_wgrad | median ratio s_wgrad | Spearman s_dgrad | median ratio s_dgrad | " +
          " | ".join(f"same GEMMs at {b:.0%}" for b in args.budgets) + " |",
          "|---|---|---|---|---|---|" + "---|" * len(args.budgets)]
    md += [f"| {r['phase']} | {r['val_loss']:.4f} | {r['spearman_s_wgrad']:.3f} | {r['median_ratio_s_wgrad']:.2f} | "
           f"{r['spearman_s_dgrad']:.3f} | {r['median_ratio_s_dgrad']:.2f} | " +
           " | ".join(f"{r[f'same_gemms_at_{b}']:.1%}" for b in args.budgets) + " |" for r in rows]
    results.write(args.results, "horizon", {"interval": args.interval, "budgets": args.budgets, "rows": rows},
                  "\n".join(md))


if __name__ == "__main__":
    main()
