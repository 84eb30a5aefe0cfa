"""SNIP's plan with layers moved across precisions: what the planner's additive objective predicts each move costs,
against what the branches measure.

    python -m experiments.swap --raise layers.1.self_attn.o_proj --lower layers.0.self_attn.q_proj \\
        [--phase 400] [--budget 0.8] [--steps 100] [--seeds 0,1,2,3]

Fixed plans, paired per seed from one checkpoint: SNIP's plan (made once on the calibration batch, fp8/fp4 per layer)
and its variants, which move layer groups across precisions, whole or one side at a time (`swap_variants`). The
objective predicts what each move costs, LD for the forward GEMM and WD for the backward ones; the branches measure
it. Results: bench/results/cpu-planner-swap.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics

import torch

from experiments import results
from experiments.common import (CACHE, add_run_arguments, check_cache_numerics, checkpoint, continue_from, ints,
                                stats_at)
from planner import DEFAULT_LAMBDA, Budget, DivergenceConfig, Plan, layer_shapes, plan_metrics, plan_objective, solve
from snip_ops.formats import GEMMS


def swap_variants(plan: dict[str, str], raised: list[str], lowered: list[str], high: str, low: str
                  ) -> dict[str, dict]:
    """SNIP's plan {layer: precision} and its variants: the `raised` layers in `high` ("raised"), the `lowered`
    layers in `low` ("lowered"), both ("swapped"); and each move split into its forward GEMM alone
    ("raised_fprop", "lowered_fprop") and its two backward GEMMs alone ("raised_bwd", "lowered_bwd"), which
    separate what LD prices (fprop) from what WD prices (dgrad, wgrad). A layer pattern is a suffix of the
    layer names."""
    def names(layers):
        found = [n for n in plan if any(n.endswith(pat) for pat in layers)]
        if len(found) != len(layers):
            raise SystemExit(f"swap: {layers} match {found}, not one layer each")
        return found

    before = Plan(plan).assignment()

    def moved(layers, precision, gemms=GEMMS):
        return {n: precision if gemms == GEMMS else {g: precision if g in gemms else before[n, g] for g in GEMMS}
                for n in names(layers)}

    out = {"snip": dict(plan), "raised": {**plan, **moved(raised, high)}, "lowered": {**plan, **moved(lowered, low)},
           "swapped": {**plan, **moved(raised, high), **moved(lowered, low)}}
    for label, layers, precision in (("raised", raised, high), ("lowered", lowered, low)):
        out[f"{label}_fprop"] = {**plan, **moved(layers, precision, ("fprop",))}
        out[f"{label}_bwd"] = {**plan, **moved(layers, precision, ("dgrad", "wgrad"))}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--raise", dest="raise_layers", type=lambda s: s.split(","), required=True,
                   help="layers (name suffixes) SNIP's plan also keeps in fp8")
    p.add_argument("--lower", dest="lower_layers", type=lambda s: s.split(","), required=True,
                   help="layers (name suffixes) SNIP's plan also puts in fp4")
    p.add_argument("--phase", type=int, default=400, help="the bf16 checkpoint's steps (default: %(default)s)")
    p.add_argument("--budget", type=float, default=0.8, help="SNIP's plan's FP4 share (default: %(default)s)")
    p.add_argument("--steps", type=int, default=100, help="steps per branch (default: %(default)s)")
    p.add_argument("--seeds", type=ints, default=[0, 1, 2, 3])
    p.add_argument("--eval-batches", type=int, default=64, help="validation batches (default: %(default)s)")
    add_run_arguments(p)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    ckpt = checkpoint(args.phase)
    stats = stats_at(ckpt, DivergenceConfig().draws)
    budget = Budget.fp4_fraction(args.budget)
    plan = solve(stats, budget, ("fp8", "fp4"))
    variants = swap_variants({n: p.to_json() for n, p in plan.precisions.items()}, args.raise_layers,
                             args.lower_layers, "fp8", "fp4")
    shapes = layer_shapes(stats.layers)
    predicted = {}
    for label, v in variants.items():  # what SNIP's ILP would score each variant
        choice = Plan(v).assignment()
        predicted[label] = {**plan_objective(choice, stats, DEFAULT_LAMBDA),
                            "fp4_share": plan_metrics(choice, shapes, budget.cost_model).fp4_fraction}
    cache = CACHE / f"swap-{args.phase}-{args.budget}-{args.steps}-e{args.eval_batches}.json"
    done = results.read_cache(cache)
    runs = {}  # {label: final validation loss per seed}
    for seed in args.seeds:
        for label, v in {"bf16": None, **variants}.items():
            key = f"{label}/{seed}/" + json.dumps(v, sort_keys=True)
            if key not in done:
                check_cache_numerics(done, cache, args.phase)
                s = continue_from(ckpt, args.steps, seed, precision=v, evals=1, eval_batches=args.eval_batches)
                done[key] = s["final_val_loss"]
                results.write_cache(cache, done)
                print(f"{label} seed {seed}: val {done[key]:.4f}", flush=True)
            runs.setdefault(label, []).append(done[key])
    table = {}
    for label in variants:
        gaps = [v - b for v, b in zip(runs[label], runs["bf16"])]
        table[label] = {**predicted[label], "gap_per_seed": gaps, "mean_gap": statistics.mean(gaps),
                        "std_gap": statistics.stdev(gaps) if len(gaps) > 1 else 0.0}
    loss = stats.loss
    md = [f"From the {args.phase}-step bf16 checkpoint of the tiny preset, {args.steps} steps per branch (cosine "
          f"decay to lr/10), seeds {args.seeds}, paired; fixed plans, no re-planning. snip: SNIP's plan at "
          f">= {100 * args.budget:.0f}% FP4 (fp8/fp4 per layer, planned once on the calibration batch). raised: "
          f"also {', '.join(args.raise_layers)} in fp8. lowered: also {', '.join(args.lower_layers)} in fp4. swapped: "
          "both. _fprop / _bwd: the move of the forward GEMM alone / of the two backward GEMMs alone. Gap: final "
          f"validation loss on {args.eval_batches} batches minus the bf16 branch's. Predicted: the plan's LD/L and "
          "WD/L by SNIP's statistics (what its ILP minimises).", "",
          "| plan | FP4 share | predicted LD/L + WD/L | gap per seed | mean gap +- std |", "|---|---|---|---|---|"]
    for label, r in table.items():
        md.append(f"| {label} | {100 * r['fp4_share']:.1f}% | {r['objective']:.5f} | "
                  + ", ".join(f"{g:+.4f}" for g in r["gap_per_seed"]) + f" | {r['mean_gap']:+.4f} +- {r['std_gap']:.4f} |")
    md += ["", f"Each variant against SNIP's plan, in nats (predicted: the objective's change times the calibration loss "
           f"{loss:.3f}; LD and WD its forward and backward parts). Trained: the mean paired difference to the snip "
           "branch, +- its standard error over seeds.", "",
           "| variant | predicted LD | predicted WD | predicted total | trained |", "|---|---|---|---|---|"]
    base = table["snip"]
    for label, r in table.items():
        if label == "snip":
            continue
        diffs = [v - b for v, b in zip(runs[label], runs["snip"])]
        se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0
        r["trained_vs_snip"], r["trained_vs_snip_se"] = statistics.mean(diffs), se
        md.append(f"| {label} | {(r['ld_over_loss'] - base['ld_over_loss']) * loss:+.4f} | "
                  f"{(r['wd'] - base['wd']) * DEFAULT_LAMBDA * loss:+.4f} | {(r['objective'] - base['objective']) * loss:+.4f} | "
                  f"{r['trained_vs_snip']:+.4f} +- {se:.4f} |")
    results.write(args.results, "swap", {
        "phase": args.phase, "budget": args.budget, "steps": args.steps, "seeds": args.seeds,
        "eval_batches": args.eval_batches, "raise": args.raise_layers, "lower": args.lower_layers,
        "calibration_loss": loss, "plans": variants, "table": table}, "\n".join(md))


if __name__ == "__main__":
    main()
