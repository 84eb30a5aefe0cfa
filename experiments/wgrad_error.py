"""The planner's wgrad error from its row sample against the whole batch's.

    python -m experiments.wgrad_error [--preset tiny] [--phases 100,400,1200] [--seeds 0,1,2,3]

At each checkpoint, per layer, FP4: the sample's own relative error ||Q(dy)^T Q(x) - dy^T x||^2 / ||dy^T x||^2 on its
rows ("own") and the planner's e_wgrad, the error energy scaled by M / m over the whole batch's gradient ("scaled",
planner/qerror.py), each as a ratio to the wgrad error over every row of the calibration batch, the mean over seeds
(each a row sample of the statistics pass and its SR bits). Results: bench/results/cpu-planner-wgrad-error.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from experiments import results
from experiments.common import LRS, add_run_arguments, calibration_batch, checkpoint, ints, model_at
from planner import StatsConfig, gemm_errors, record, relative_error
from snip_ops import gemm as snip_gemm
from snip_ops.formats import recipe


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny", choices=sorted(LRS))
    p.add_argument("--phases", type=ints, default=[100, 400, 1200], help="bf16 checkpoint steps (default: %(default)s)")
    p.add_argument("--seeds", type=ints, default=[0, 1, 2, 3])
    add_run_arguments(p)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model_loss = lambda m, b: m.loss(b)  # noqa: E731
    batch = calibration_batch()
    rows = []
    for phase in args.phases:
        model, opt, layers = model_at(checkpoint(phase, args.preset))
        every = record(model, layers, batch, model_loss, opt, StatsConfig(max_rows=1 << 30, memory_cap_bytes=1 << 40))
        whole = {n: statistics.mean(gemm_errors(r, ("fp4",), seed=s)["fp4"]["wgrad"] for s in args.seeds)
                 for n, r in every.layers.items()}
        scaled, own = {n: [] for n in whole}, {n: [] for n in whole}
        for s in args.seeds:  # a row sample and SR bits per seed
            for n, r in record(model, layers, batch, model_loss, opt, StatsConfig(seed=s)).layers.items():
                scaled[n].append(gemm_errors(r, ("fp4",), seed=s)["fp4"]["wgrad"])
                own[n].append(relative_error(snip_gemm.wgrad(r.dy, r.x, recipe("fp4"), seed=s, emulate=True),
                                             snip_gemm.fp32_mm(r.dy.t(), r.x)))
        row = {"phase": phase, "tokens": next(iter(every.layers.values())).shape.tokens,
               "sampled_rows": StatsConfig().max_rows}
        for label, values in (("own", own), ("scaled", scaled)):
            ratios = sorted(statistics.mean(values[n]) / whole[n] for n in whole)
            row[label] = {"median": statistics.median(ratios), "min": ratios[0], "max": ratios[-1]}
        rows.append(row)
        print(f"phase {phase}: own {row['own']['median']:.2f}x, scaled {row['scaled']['median']:.2f}x", flush=True)
    md = [f"Preset {args.preset}, FP4 (`fp4`), the calibration batch of the quality grid; per layer the mean over seeds "
          f"{args.seeds} (each a row sample of the statistics pass and its SR bits) divided by the wgrad error over every "
          "row (mean over the same SR seeds). 'own': the sample's own relative error ||Q(dy)^T Q(x) - dy^T x||^2 / "
          "||dy^T x||^2 on its rows; 'scaled': the planner's e_wgrad, the error energy scaled by M / m over the "
          "whole batch's gradient (planner/qerror.py).", "",
          "| checkpoint | rows sampled of | own: median ratio [min, max] over layers | scaled: median ratio [min, max] |",
          "|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['phase']} | {r['sampled_rows']} of {r['tokens']} | "
                  + " | ".join(f"{r[k]['median']:.2f} [{r[k]['min']:.2f}, {r[k]['max']:.2f}]" for k in ("own", "scaled"))
                  + " |")
    results.write(args.results, "wgrad-error", {"preset": args.preset, "seeds": args.seeds, "rows": rows},
                  "\n".join(md))


if __name__ == "__main__":
    main()
