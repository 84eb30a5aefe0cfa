"""A precision schedule against a constant budget at the same mean FP4 share, paired per seed.

    python -m experiments.schedule [--phase 400] [--steps 200] [--interval 25] [--budgets 0.85,0.62,0.75]

From the checkpoint the learning rate is held for half the branch and then decays; "snip_schedule" plans at the
first budget until the decay trigger fires and at the second after it, "snip" at the constant third budget (chosen
near the schedule's measured mean share). Both per layer with the settled WD, the setting of the committed results.
Results: bench/results/cpu-planner-schedule.json (summary), .runs.json.xz (the runs), .md.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from experiments import results
from experiments.common import LRS, CACHE, add_run_arguments, check_cache_numerics, checkpoint, continue_from, floats, ints
from planner import Budget, PlannerConfig, PrecisionSchedule
from snip_train.planning import make_hooks


def mean_fp4_share(history: list[dict], steps: int) -> float:
    """The FP4 share of linear FLOPs averaged over the steps of a run: each plan counts for the steps it ran."""
    starts = [h["step"] for h in history] + [steps]
    return sum(h["fp4_fraction"] * (b - a) for h, a, b in zip(history, starts, starts[1:])) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phase", type=int, default=400, help="the bf16 checkpoint's steps (default: %(default)s)")
    p.add_argument("--steps", type=int, default=200, help="steps per branch (default: %(default)s)")
    p.add_argument("--interval", type=int, default=25, help="re-plan interval (default: %(default)s)")
    p.add_argument("--seeds", type=ints, default=[0, 1, 2])
    p.add_argument("--budgets", type=floats, default=[0.85, 0.62, 0.75],
                   help="BEFORE_DECAY,AFTER_DECAY,CONSTANT FP4 shares (default: 0.85,0.62,0.75)")
    add_run_arguments(p)
    args = p.parse_args()
    if len(args.budgets) != 3:
        p.error("--budgets takes BEFORE_DECAY,AFTER_DECAY,CONSTANT")
    torch.set_num_threads(args.threads)
    ckpt = checkpoint(args.phase)
    high, low, constant = args.budgets
    paper = dict(granularity="layer", wd_horizon="settled")  # the setting of the committed schedule results
    methods = {
        "bf16": None,
        "snip": PlannerConfig(budget=Budget.fp4_fraction(constant), interval=args.interval, **paper),
        "snip_schedule": PlannerConfig(budget=Budget.fp4_fraction(high), interval=args.interval, **paper,
                                       schedule=PrecisionSchedule(lr_decay=0.05,
                                                                  raised_budget=Budget.fp4_fraction(low))),
    }
    cache = CACHE / f"schedule-{args.phase}-{args.steps}-{args.interval}-{high}-{low}-{constant}.json"
    done = results.read_cache(cache)
    for seed in args.seeds:
        for label, config in methods.items():
            key = f"{label}/{seed}"
            if key in done:
                continue
            check_cache_numerics(done, cache, args.phase)
            hooks = make_hooks(config, show_table=False, log=lambda m: None) if config else None
            s = continue_from(ckpt, args.steps, seed, hooks=hooks, constant_steps=args.steps // 2)
            history = [dict(h) for h in hooks.planner.history] if hooks else []
            done[key] = {"final_val_loss": s["final_val_loss"], "plans": history,
                         "mean_fp4_share": mean_fp4_share(history, args.steps) if history else 0.0}
            results.write_cache(cache, done)
            print(f"{key}: val {s['final_val_loss']:.4f}, mean FP4 share {done[key]['mean_fp4_share']:.3f}", flush=True)
    table = {}
    for label in methods:
        runs = [done[f"{label}/{s}"] for s in args.seeds]
        gaps = [r["final_val_loss"] - done[f"bf16/{s}"]["final_val_loss"] for r, s in zip(runs, args.seeds)]
        table[label] = {"gap_per_seed": gaps, "mean_gap": statistics.mean(gaps),
                        "std_gap": statistics.stdev(gaps) if len(gaps) > 1 else 0.0,
                        "mean_fp4_share": statistics.mean(r["mean_fp4_share"] for r in runs),
                        "replans": [[(h["step"], h["why"], round(h["fp4_fraction"], 4)) for h in r["plans"]]
                                    for r in runs]}
    closed = table["snip"]["mean_gap"] - table["snip_schedule"]["mean_gap"]
    md = [f"From the {args.phase}-step bf16 checkpoint of the tiny preset, {args.steps} steps per branch: lr {LRS['tiny']:g} "
          f"held for {args.steps // 2} steps, then a cosine decay to {LRS['tiny'] / 10:g}; seeds {args.seeds} (paired: same "
          f"state and batches per seed). snip: re-plans every {args.interval} steps at >= {100 * constant:.0f}% FP4, per "
          "layer with the settled WD. "
          f"snip_schedule: the same every {args.interval} steps at >= {100 * high:.0f}% FP4, and from the step the lr "
          f"falls 5% below its peak (a re-plan there) at >= {100 * low:.0f}%: the most sensitive GEMMs go up for "
          "the decay. Mean FP4 share: over the steps, each plan weighted by the steps it ran.", "",
          "| method | mean FP4 share | gap to bf16 per seed | mean gap +- std |", "|---|---|---|---|"]
    for label, r in table.items():
        md.append(f"| {label} | {100 * r['mean_fp4_share']:.1f}% | " + ", ".join(f"{g:+.4f}" for g in r["gap_per_seed"])
                  + f" | {r['mean_gap']:+.4f} +- {r['std_gap']:.4f} |")
    md += ["", f"The schedule closes {closed:+.4f} nats of SNIP's constant-budget gap "
           f"({100 * closed / table['snip']['mean_gap']:.0f}% of it) on the mean; per seed: "
           + ", ".join(f"{a - b:+.4f}" for a, b in zip(table["snip"]["gap_per_seed"], table["snip_schedule"]["gap_per_seed"]))
           + ".", "", "Re-plans (step, why, FP4 share) of the first seed: "
           + json.dumps({k: v["replans"][0] for k, v in table.items() if v["replans"][0]})]
    results.write(args.results, "schedule", {
        "phase": args.phase, "steps": args.steps, "interval": args.interval,
        "budgets": {"before_decay": high, "after_decay": low, "constant": constant}, "seeds": args.seeds,
        "table": table, "gap_closed": closed,
        "runs": {k: v for k, v in done.items() if k.split("/")[0] in methods and int(k.split("/")[1]) in args.seeds}},
        "\n".join(md))


if __name__ == "__main__":
    main()
