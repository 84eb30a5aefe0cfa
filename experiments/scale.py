"""How well LD and WD are calibrated: their size against the loss that amplified FP4 errors cost, at every layer.

    python -m experiments.scale                          # tiny: 100/400/1200 steps, fprop/dgrad/wgrad, k = 2, 3
    python -m experiments.scale --gemms fprop_train,wgrad --blocks 0,1,2,3 --amplify 3 --name scale-blocks

One layer's effect is below the noise of these runs, so every layer's error counts at once: from each checkpoint,
`--steps` steps with every layer's fprop, dgrad or wgrad error under FP4 amplified k times (AmplifiedError, k in
`--amplify`), paired with bf16 per seed, against k^2 times the planner's LD (fprop) or WD (dgrad, wgrad) of that GEMM
in FP4 summed over the layers, measured at the checkpoint with WD over the whole run along its learning rates (the
planner's WD over its re-plan interval is the same thing for one interval; wgrad's WD carries the planner's signal
share, the table's column). The validation loss is that of the model as trained, its forward error included
(fprop). Two factors give the measured exponent of the gap in k: 2 where the loss is quadratic in the error, as LD
and WD assume. Target "fprop_train": the forward error in training only, evaluated exactly; against fprop's, the
share of its cost that the perturbed trajectory carries and LD, the loss of the error itself, leaves out. With
`--blocks` each block's layers alone, against that block's LD / WD: how the cost divides among the blocks.
Results: bench/results/cpu-planner-<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics

import torch

from experiments import results
from experiments.amplified_error import AmplifiedError
from experiments.common import (CACHE, add_run_arguments, branch_config, calibration_batch, check_cache_numerics,
                                checkpoint, continue_from, floats, in_block, ints, model_at)
from planner import DivergenceConfig, PlannedModel, PlannerStats, StatsConfig, lm_logits, measure
from snip_ops.formats import GEMMS
from snip_train.train import learning_rates

# the targets: a GEMM whose error is amplified, and "fprop_train", the forward error in the training steps only
# (evaluation exact), priced against LD too: the part of the forward error's cost that comes through the trajectory
SCALE_TARGETS = {**{g: (g, True) for g in GEMMS}, "fprop_train": ("fprop", False)}


def stats_over(state: dict, steps: int) -> PlannerStats:
    """The planner's FP4 statistics at `state`, WD over `steps` steps along a branch's learning rates."""
    lrs = learning_rates(branch_config(state, steps, 0))
    model, opt, layers = model_at(state)
    return measure(PlannedModel(model, layers, opt, lambda m, b: m.loss(b), lm_logits), calibration_batch(), ("fp4",),
                   StatsConfig(), DivergenceConfig(wd_horizon=steps), lr_ratios=[lrs(s) / lrs(0) for s in range(steps)])


def gap(done: dict, cache, phase: int, target: str, k: float, seed: int, block: int | None, args) -> float:
    """The final validation loss of the amplified branch minus bf16's, trained into the cache where missing."""
    key = f"{phase}/{target}/{k:g}/{seed}" + ("" if block is None else f"/block{block}")
    if key not in done:
        check_cache_numerics(done, cache, phase)
        ckpt = checkpoint(phase)
        ref = f"{phase}/bf16/{seed}"
        if ref not in done:
            done[ref] = continue_from(ckpt, args.steps, seed, evals=1, eval_batches=args.eval_batches)["final_val_loss"]
        gemm, in_evaluation = SCALE_TARGETS[target]
        hooks = AmplifiedError(gemm, "fp4", k, in_evaluation, block)
        noisy = continue_from(ckpt, args.steps, seed, hooks=hooks, evals=1, eval_batches=args.eval_batches)
        done[key] = noisy["final_val_loss"] - done[ref]
        results.write_cache(cache, done)
        print(f"{key}: gap {done[key]:+.5f}", flush=True)
    return done[key]


def rows_of(args) -> list[dict]:
    cache = CACHE / f"scale-{args.steps}.json"  # {"phase/bf16/seed": val loss, "phase/target/k/seed[/block<b>]": gap}
    done = results.read_cache(cache)
    rows = []
    for phase in args.phases:
        # at the branch's start, and `steps` later on the bf16 trajectory (constant lr): how stale the first is
        stats, later = stats_over(checkpoint(phase), args.steps), stats_over(checkpoint(phase + args.steps), args.steps)
        share = stats.diagnostics.get("wgrad_signal_share")
        for target, block in itertools.product(args.gemms, args.blocks or [None]):
            gemm = SCALE_TARGETS[target][0]
            unit, unit_later = (sum(s.ld("fp4") if gemm == "fprop" else s.wd("fp4", gemm) for s in st.layers
                                    if in_block(s.name, block)) for st in (stats, later))
            per_factor = []
            for k in args.amplify:
                gaps = [gap(done, cache, phase, target, k, seed, block, args) for seed in args.seeds]
                mean = statistics.mean(gaps)
                per_factor.append({"phase": phase, "gemm": target, "block": block, "amplify": k, "predicted": k ** 2 * unit,
                                   "predicted_later": k ** 2 * unit_later, "gaps": gaps, "mean_gap": mean,
                                   "standard_error": statistics.stdev(gaps) / math.sqrt(len(gaps)) if len(gaps) > 1 else 0.0,
                                   "ratio": mean / (k ** 2 * unit) if unit else float("nan"),
                                   "signal_share": share if gemm == "wgrad" else None})
            if len(per_factor) > 1:
                lo, hi = per_factor[0], per_factor[-1]
                ok = lo["mean_gap"] > 0 and hi["mean_gap"] > 0
                hi["exponent"] = (math.log(hi["mean_gap"] / lo["mean_gap"]) / math.log(hi["amplify"] / lo["amplify"])
                                  if ok else float("nan"))
            rows += per_factor
    return rows


def markdown(args, rows: list[dict]) -> str:
    md = [f"Tiny preset; from each bf16 checkpoint, {args.steps} steps (cosine decay to lr/10) with every planned "
          f"layer's fprop, dgrad or wgrad error under FP4 amplified k = {', '.join(f'{k:g}' for k in args.amplify)} times "
          f"(its own structure and stochastic-rounding bits, energy x k^2; the other two GEMMs exact), seeds {args.seeds}, "
          f"each paired with bf16 on the same batches; gap: final validation loss ({args.eval_batches} batches, fprop "
          "error included) minus bf16's. Predicted: k^2 x the sum over layers of the planner's LD (fprop) or WD (dgrad, "
          f"wgrad) of that GEMM in FP4, measured at the checkpoint (WD within the run's {args.steps} steps along its "
          "learning rates; wgrad's times the planner's signal share, its column); 'later': the same measured "
          f"{args.steps} steps further along the bf16 trajectory (constant lr), near where the runs end. Exponent: of "
          "the measured gap in k between the smallest and the largest k (2: quadratic, as LD and WD assume)."
          + (" fprop_train: the forward error in the training steps only, the evaluation exact (the weights are those of "
             "the fprop run, bit for bit): the forward error's cost through the trajectory, priced against LD."
             if "fprop_train" in args.gemms else "")
          + (f" Per block (--blocks): the error in one transformer block's layers only, priced by that block's LD / WD; "
             f"measured / later: against the block's price {args.steps} steps on." if args.blocks else ""), "",
          "| checkpoint | GEMM | " + ("block | " if args.blocks else "") + "k | predicted (nats) | predicted later | "
          "measured gap: mean +- SE | per seed | measured / predicted | " + ("measured / later | " if args.blocks else "")
          + "signal share | exponent |",
          "|---|---|---|---|---|---|---|---|---|" + ("---|---|" if args.blocks else "")]
    md += [f"| {r['phase']} | {r['gemm']} | " + (f"{r['block']} | " if args.blocks else "")
           + f"{r['amplify']:g} | {r['predicted']:.4f} | {r['predicted_later']:.4f} | "
           f"{r['mean_gap']:+.4f} +- {r['standard_error']:.4f} | " + ", ".join(f"{g:+.4f}" for g in r["gaps"])
           + f" | {r['ratio']:.2f} | " + (f"{r['mean_gap'] / r['predicted_later']:.2f} | " if args.blocks else "")
           + ("- | " if r["signal_share"] is None else f"{r['signal_share']:.3f} | ")
           + (f"{r['exponent']:.1f}" if "exponent" in r else "") + " |" for r in rows]
    return "\n".join(md)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phases", type=ints, default=[100, 400, 1200], help="bf16 checkpoint steps (default: %(default)s)")
    p.add_argument("--steps", type=int, default=100, help="steps per branch (default: %(default)s)")
    p.add_argument("--seeds", type=ints, default=[0, 1, 2, 3])
    p.add_argument("--amplify", type=floats, default=[2.0, 3.0],
                   help="the factors on every layer's FP4 GEMM error (default: 2,3)")
    p.add_argument("--gemms", type=lambda s: s.split(","), default=list(GEMMS),
                   help=f"whose error is amplified, of {', '.join(SCALE_TARGETS)} (default: %(default)s)")
    p.add_argument("--blocks", type=ints, default=None,
                   help="amplify the error of one transformer block's layers at a time, these blocks (default: every "
                        "layer at once)")
    p.add_argument("--eval-batches", type=int, default=64, help="validation batches per evaluation (default: %(default)s)")
    p.add_argument("--name", default="scale", help="results file stem cpu-planner-<name> (default: %(default)s)")
    add_run_arguments(p)
    args = p.parse_args()
    if unknown := [g for g in args.gemms if g not in SCALE_TARGETS]:
        p.error(f"--gemms: unknown {', '.join(unknown)}; choose from {', '.join(SCALE_TARGETS)}")
    torch.set_num_threads(args.threads)
    rows = rows_of(args)
    results.write(args.results, args.name, {"steps": args.steps, "amplify": args.amplify, "seeds": args.seeds,
                                            "gemms": args.gemms, "blocks": args.blocks, "rows": rows},
                  markdown(args, rows))


if __name__ == "__main__":
    main()
