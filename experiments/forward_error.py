"""The forward GEMM's FP4 error against LD's model of it, at the checkpoints the quality grid starts from.

    python -m experiments.forward_error --preset mini --phases 400 --plans bench/results/cpu-planner-quality-mini-signal-75.json

The isotropic LD prices a layer's forward error as noise spread evenly over its output, independent from token to
token: LD = h_l e_fwd with h_l = rms(y_l)^2 tr(G_ll) / 2 (planner/divergence.py). The real error is not spread
evenly: the input's rounding reaches the output through the weight, where the output's curvature lies too. This
study measures, per layer of the planner's candidates:
  * measured: the loss change of that layer's FP4 forward alone (every other GEMM bf16), mean +- standard error over
    `--batches` training batches: the immediate cost LD estimates. It includes the first-order term g . e, whose mean
    over batches is <E[dW], Q(w) - w>: not zero while training is under way, and of either sign;
  * LD: the planner's (isotropic; Fisher curvature, its default draws, the calibration batch);
  * LD_struct: the Gauss-Newton quadratic form along the layer's actual FP4 output error e on the calibration batch,
    1/2 e^T G e = N/2 E_s sum_b (g_s,b . e_b)^2 over sampled-label cotangents g_s at the layer's output, summed per
    sequence b (sequences are independent, so the cross-sequence terms have mean zero); with isotropic e it is LD;
  * joint: all forward GEMMs in FP4 at once, against the sum of the layers' measured changes (additivity).
With `--plans` (a quality results summary, its runs beside it): each method's first plan at seed 0 from this
checkpoint, its forward GEMMs in FP4 at once (the backward bf16): the measured immediate change, LD and LD_struct of
that set, and the method's trained gap to bf16 from the file (mean over its seeds): whether the plans differ in what
they cost at once or only through training. On the tiny preset, the per-block training truths of the scale study's
--blocks run (cpu-planner-scale-blocks.json, the fprop rows, divided by k^2) are set beside each block's sums.
Results: bench/results/cpu-planner-<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from experiments import results
from experiments.common import (LRS, PRE_STEPS, add_run_arguments, calibration_batch, checkpoint, ints, mean_se,
                                model_at, spearman, stats_at)
from experiments.fp4_forward import fp4_forward_loss_changes, structured_ld
from planner import DivergenceConfig, block_index

FIRST_BATCH_SEED = 100  # the measured batches: calibration_batch(100 + i), none of them the calibration batch


def plan_sets(path: Path, preset: str, phase: int, names: list[str]) -> dict[str, dict]:
    """{method: {"fp4": its first plan's FP4 forward GEMMs at seed 0, "gap": its mean trained gap to bf16}} from a
    quality results summary's runs, for the runs from this checkpoint ("method @budget" where the file holds several
    budgets)."""
    runs = results.read_runs(path)
    finals: dict[str, dict[str, float]] = {}
    first_plan = {}
    keys = [key.split("/")[:5] for key in runs]
    budgets = {k[2] for k in keys if k[0] == preset and int(k[1]) == phase and k[2] != "-"}
    for key, (p, ph, budget, method, seed) in zip(runs, keys):
        if p != preset or int(ph) != phase:
            continue
        label = method if budget == "-" or len(budgets) < 2 else f"{method} @{budget}"
        finals.setdefault(label, {})[seed] = runs[key]["final_val_loss"]
        if seed == "0" and runs[key]["plans"]:
            precisions = runs[key]["plans"][0]["precisions"]
            first_plan[label] = [n for n in names if (precisions[n] if isinstance(precisions[n], str)
                                                      else precisions[n]["fprop"]) == "fp4"]
    bf16 = finals.get("bf16", {})
    out = {}
    for label, fp4 in first_plan.items():
        seeds = [s for s in finals[label] if s in bf16]
        out[label] = {"fp4": fp4, "gap": statistics.mean(finals[label][s] - bf16[s] for s in seeds) if seeds else None}
    return out


def block_truths(preset: str, phase: int) -> dict[int, float]:
    """{block: its training truth per unit error energy} from the scale study's committed --blocks run (tiny only),
    else {}."""
    if preset != "tiny":
        return {}
    return {r["block"]: r["mean_gap"] / r["amplify"] ** 2 for r in results.scale_block_rows()
            if r["gemm"] == "fprop" and r["phase"] == phase and r["block"] is not None}


def study_phase(args, phase: int) -> dict:
    ckpt = checkpoint(phase, args.preset)
    model, _, layers = model_at(ckpt)
    names = list(layers)
    stats = stats_at(ckpt, draws=DivergenceConfig().draws)
    ld = {s.name: s.ld("fp4") for s in stats.layers}
    struct = structured_ld(model, layers, calibration_batch(), args.draws)
    batches = [calibration_batch(FIRST_BATCH_SEED + i) for i in range(args.batches)]
    sets = {n: [n] for n in names}
    sets["joint"] = names
    plans = plan_sets(args.plans, args.preset, phase, names) if args.plans else {}
    sets.update({f"plan:{m}": p["fp4"] for m, p in plans.items()})
    changes = fp4_forward_loss_changes(model, layers, batches, sets)
    measured = {key: dict(zip(("measured", "measured_se"), mean_se(v))) for key, v in changes.items()}
    layer_rows = [{"layer": n, "block": block_index(n), "ld": ld[n], "ld_struct": struct[n], **measured[n]}
                  for n in names]
    truths = block_truths(args.preset, phase)
    blocks = []
    for b in sorted({r["block"] for r in layer_rows}):
        rows = [r for r in layer_rows if r["block"] == b]
        blocks.append({"block": b, **{k: sum(r[k] for r in rows) for k in ("ld", "ld_struct", "measured")},
                       "trained_truth": truths.get(b)})
    plan_rows = [{"method": m, "fp4_forward_gemms": len(p["fp4"]), "ld": sum(ld[n] for n in p["fp4"]),
                  "ld_struct": sum(struct[n] for n in p["fp4"]), **measured[f"plan:{m}"], "trained_gap": p["gap"]}
                 for m, p in sorted(plans.items(), key=lambda kv: (kv[1]["gap"] is None, kv[1]["gap"]))]
    return {"phase": phase, "loss": stats.loss, "layers": layer_rows, "blocks": blocks, "plans": plan_rows,
            **{f"spearman_{k}": spearman([r[k] for r in layer_rows], [r["measured"] for r in layer_rows])
               for k in ("ld", "ld_struct")},
            "sum_ld": sum(ld.values()), "sum_ld_struct": sum(struct.values()),
            "sum_measured": sum(r["measured"] for r in layer_rows),
            "joint": measured["joint"]["measured"], "joint_se": measured["joint"]["measured_se"]}


def markdown(args, phases: list[dict]) -> str:
    md = [f"Preset {args.preset}; per layer of the planner's candidates, its forward GEMM alone in FP4 (every other "
          f"GEMM bf16): the loss change measured over {args.batches} training batches (mean +- standard error), "
          "against the planner's LD (isotropic noise, Fisher curvature, its default draws) and LD_struct (the "
          f"Gauss-Newton form along the layer's actual FP4 output error over whole sequences, {args.draws} label "
          "draws); all in nats. See the module docstring of experiments.forward_error for the definitions."]
    for ph in phases:
        md += ["", f"## checkpoint {ph['phase']} steps (calibration loss {ph['loss']:.4f})", "",
               f"- Spearman over the {len(ph['layers'])} layers, against the measured change: LD "
               f"{ph['spearman_ld']:.2f}, LD_struct {ph['spearman_ld_struct']:.2f}.",
               f"- Sums: LD {ph['sum_ld']:.5f}, LD_struct {ph['sum_ld_struct']:.5f}, measured {ph['sum_measured']:+.5f}; "
               f"every forward GEMM in FP4 at once {ph['joint']:+.5f} +- {ph['joint_se']:.5f} (additivity: joint "
               "against the sum of the measured).", "",
               "| block | LD | LD_struct | measured (sum over its layers) | trained truth per unit energy |",
               "|---|---|---|---|---|"]
        md += [f"| {b['block']} | {b['ld']:.5f} | {b['ld_struct']:.5f} | {b['measured']:+.5f} | "
               + ("-" if b["trained_truth"] is None else f"{b['trained_truth']:.5f}") + " |" for b in ph["blocks"]]
        if ph["plans"]:
            md += ["", "Each method's first plan at seed 0 (`--plans`), its FP4 forward GEMMs at once:", "",
                   "| method | FP4 forward GEMMs | LD | LD_struct | measured at once | trained gap to bf16 (mean over "
                   "seeds) |", "|---|---|---|---|---|---|"]
            md += [f"| {p['method']} | {p['fp4_forward_gemms']} | {p['ld']:.5f} | {p['ld_struct']:.5f} | "
                   f"{p['measured']:+.5f} +- {p['measured_se']:.5f} | "
                   + ("-" if p["trained_gap"] is None else f"{p['trained_gap']:+.4f}") + " |" for p in ph["plans"]]
        md += ["", "| layer | LD | LD_struct | measured |", "|---|---|---|---|"]
        md += [f"| {r['layer']} | {r['ld']:.6f} | {r['ld_struct']:.6f} | {r['measured']:+.6f} +- "
               f"{r['measured_se']:.6f} |" for r in ph["layers"]]
    return "\n".join(md)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny", choices=sorted(LRS))
    p.add_argument("--phases", type=ints, default=[PRE_STEPS], help="bf16 checkpoint steps (default: %(default)s)")
    p.add_argument("--batches", type=int, default=16, help="training batches the measured change averages over")
    p.add_argument("--draws", type=int, default=8, help="label draws of LD_struct (default: %(default)s)")
    p.add_argument("--plans", type=Path, default=None, help="a quality results summary whose plans are measured too")
    p.add_argument("--name", default="forward-error", help="results file stem cpu-planner-<name>")
    add_run_arguments(p)
    args = p.parse_args()
    if args.batches < 2:
        p.error("--batches must be >= 2 (the standard error needs two)")
    torch.set_num_threads(args.threads)
    phases = [study_phase(args, phase) for phase in args.phases]
    results.write(args.results, args.name, {"preset": args.preset, "batches": args.batches, "draws": args.draws,
                                            "plans_from": args.plans.name if args.plans else None, "phases": phases},
                  markdown(args, phases))


if __name__ == "__main__":
    main()
