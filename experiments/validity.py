"""Metric validity: the planner's per-layer LD and WD against the true effect of FP4 on one layer at a time.

    python -m experiments.validity                      # the tiny preset's 400-step checkpoint, 30-step truths
    python -m experiments.validity --layers 6 --seeds 0,1,2,3

Ground truths, FP4 on one layer at a time: (a) the forward-only loss increase on 8 validation batches (its forward
GEMM in FP4, round to nearest); (a-1) that minus its first-order term g . (Q(y) - y); (a') the same with the forward
operands rounded stochastically, the mean of SR_DRAWS passes (the quantity LD estimates); (b) the mean training-loss
increase over `--steps` steps with its three GEMMs in FP4, paired with bf16 per seed, and (c) the final validation
loss increase of those runs; (d) the same with only its dgrad and wgrad in FP4 (the backward-only truth for WD).
The planner's LD is measured per curvature estimator and number of draws; each truth's split-half reliability
bounds any metric's correlation with it. Results: bench/results/cpu-planner-validity.{json,md}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics

import torch

from experiments import results
from experiments.common import (CACHE, PRE_STEPS, RUN, add_run_arguments, checkpoint, continue_from, ints, model_at,
                                spearman, stats_at)
from experiments.fp4_forward import fp4_forward_loss_changes
from planner import DEFAULT_LAMBDA, DivergenceConfig
from snip_ops import LinearPrecision
from snip_ops import gemm as snip_gemm
from snip_ops.formats import Rounding, recipe
from snip_train.data import TokenData

SR_DRAWS = 8  # stochastic-rounding passes per layer in the forward-only SR truth
ESTIMATORS = (("fisher", 1), ("fisher", 2), ("fisher", 8), ("batched", 1), ("batched", 2), ("batched", 8))
WD_LAMBDAS = (0.0, 0.1, 0.3, 1.0, 3.0, 10.0)


def bootstrap_spearman(a, b, resamples: int = 2000, seed: int = 0) -> list[float]:
    """5th and 95th percentiles of Spearman(a, b) over layers resampled with replacement."""
    r = random.Random(seed)
    n, vals = len(a), []
    for _ in range(resamples):
        idx = [r.randrange(n) for _ in range(n)]
        v = spearman([a[i] for i in idx], [b[i] for i in idx])
        if v == v:  # a resample of ties gives NaN
            vals.append(v)
    vals.sort()
    if not vals:  # every resample was all ties (a handful of layers)
        return [float("nan"), float("nan")]
    return [vals[int(0.05 * len(vals))], vals[int(0.95 * len(vals)) - 1]]


def first_order_terms(model, layers, names, batches) -> dict[str, list[float]]:
    """Per layer and batch, g_l . (Q(y_l) - y_l): the first-order part of the loss change when layer l's
    fprop is rounded to nearest in fp4 (g_l = d loss / d y_l of the bf16 model)."""
    out = {n: [] for n in names}
    fp4 = recipe("fp4")
    for b in batches:
        xs, ys = {}, {}

        def keep(name):
            def hook(mod, args, y):
                xs[name], ys[name] = args[0].detach(), y
            return hook

        handles = [layers[n].register_forward_hook(keep(n)) for n in names]
        try:
            loss = model.loss(b)
        finally:
            for h in handles:
                h.remove()
        grads = torch.autograd.grad(loss, [ys[n] for n in names])
        for n, g in zip(names, grads):
            x2 = xs[n].reshape(-1, xs[n].shape[-1])
            w = layers[n].weight.detach()
            delta = snip_gemm.fprop(x2, w, fp4) - x2 @ w.t()
            out[n].append(float(torch.dot(g.reshape(-1).double(), delta.reshape(-1).double())))
    return out


def split_half(per_unit: dict[str, list[float]], names) -> float:
    """Spearman between the means of the first and the second half of each layer's readings
    (batches, SR draws or seeds): how reproducible a truth's ranking is -- the ceiling, roughly, for
    any metric's correlation with it."""
    half = len(per_unit[names[0]]) // 2
    return spearman([statistics.mean(per_unit[n][:half]) for n in names],
                    [statistics.mean(per_unit[n][half:]) for n in names])


def one_layer_truth(ckpt: dict, names, seeds, steps: int, kind: str, precision) -> dict[str, dict[str, list[float]]]:
    """Per layer, per seed: training `steps` steps from the checkpoint with that one layer in `precision`
    (a LinearPrecision JSON), paired with bf16 on the same batches -- the mean training-loss increase over
    the steps ("train") and the final validation-loss increase ("val"). Cached per (kind, steps): one process
    trains both sides of every difference it caches."""
    cache = CACHE / f"validity-{kind}-{steps}.json"  # {"seed/layer": {"train": d, "val": d}}
    done = results.read_cache(cache)
    truth = {n: {"train": [], "val": []} for n in names}
    for seed in seeds:
        ref = None
        for n in names:
            key = f"{seed}/{n}"
            if key not in done:
                ref = ref or continue_from(ckpt, steps, seed, evals=0)
                run = continue_from(ckpt, steps, seed, precision={n: precision}, evals=0)
                done[key] = {"train": statistics.mean(run["history"]["train"]["loss"])
                             - statistics.mean(ref["history"]["train"]["loss"]),
                             "val": run["final_val_loss"] - ref["final_val_loss"]}
                results.write_cache(cache, done)
                print(f"{kind} seed {seed} {n}: train {done[key]['train']:+.5f} val {done[key]['val']:+.5f}",
                      flush=True)
            for k in ("train", "val"):
                truth[n][k].append(done[key][k])
    return truth


def forward_truths(ckpt: dict, names: list[str]) -> tuple[dict, dict, dict]:
    """Per layer, per validation batch: its forward GEMM in FP4 (round to nearest) minus bf16, and the first-order
    term of that; per layer, per SR draw: the same rounded stochastically."""
    model, _, layers = model_at(ckpt)
    data = TokenData.from_path(None, max_bytes=RUN["max_bytes"])
    gen = torch.Generator().manual_seed(0x5EED)
    val = [data.get_batch("val", RUN["batch_size"], RUN["seq_len"], gen) for _ in range(8)]

    def val_losses():
        with torch.no_grad():
            return [float(model.loss(b)) for b in val]
    base = val_losses()
    fwd = fp4_forward_loss_changes(model, layers, val, {n: [n] for n in names})
    # the forward operands stochastically rounded (unbiased noise, fresh bits per forward), averaged over SR_DRAWS
    # passes: E[L(y + noise)] - L(y), without the first-order term of one fixed round-to-nearest perturbation
    fp4 = recipe("fp4")
    fp4_sr = dataclasses.replace(fp4, name="fp4_sr", act=dataclasses.replace(fp4.act, rounding=Rounding.SR),
                                 weight=dataclasses.replace(fp4.weight, rounding=Rounding.SR))
    fwd_sr = {}
    for n in names:
        layers[n].set_precision(LinearPrecision(fprop=fp4_sr, dgrad="bf16", wgrad="bf16"))
        fwd_sr[n] = [statistics.mean(val_losses()) - statistics.mean(base) for _ in range(SR_DRAWS)]
        layers[n].set_precision("bf16")
    return fwd, first_order_terms(model, layers, names, val), fwd_sr


def markdown(args, ckpt, reliability, estimators, wd_validity, objective, bootstrap, rows, n_layers) -> str:
    md = [f"Checkpoint: tiny model, {args.pre_steps} bf16 steps (val loss {ckpt['val_loss']:.4f}). Ground truths, "
          "fp4 on one layer at a time (see the module docstring of experiments.validity): forward-only (a), minus its "
          f"first-order term (a-1), with SR forward operands (a', {SR_DRAWS} passes); 'trained' / 'final_val': {args.steps} "
          f"steps with its three GEMMs in fp4, paired with bf16, mean over seeds {args.seeds}; 'backward_*': only its "
          "dgrad and wgrad in fp4.", "", "## Reliability of the truths", "",
          "Split-half reliability: Spearman between the truth's means over two halves of its readings (validation "
          "batches 0-3 vs 4-7; SR draws; seeds).", "", "| truth | split-half reliability |", "|---|---|"]
    md += [f"| {k} | {v:.3f} |" for k, v in reliability.items()]
    md += ["", "## Loss curvature estimators (LD = h e_fwd, fp4)", "",
           "| estimator | Spearman vs fwd-only SR | vs fwd-only minus 1st order | vs trained | vs final val | "
           "layers with h <= 0 | LD time s | whole measurement s |", "|---|---|---|---|---|---|---|---|"]
    for label, e in estimators.items():
        c = e["spearman_LD_vs"]
        md.append(f"| {label} | {c['forward_only_sr']:.3f} | {c['forward_only_minus_first_order']:.3f} | "
                  f"{c['trained']:.3f} | {c['final_val']:.3f} | {e['layers_with_curvature_<=_0']} of {n_layers} | "
                  f"{e['time_loss_divergence_s']:.2f} | {e['time_measure_s']:.2f} |")
    md += ["", "## Weight divergence against the backward-only truth (fisher, 2 draws)", "",
           "| metric | vs backward trained | vs backward final val | vs trained (all GEMMs) |", "|---|---|---|---|"]
    for label in ("WD", "LD"):
        md.append(f"| {label} | {wd_validity[f'spearman_{label}_vs_backward_trained']:.3f} | "
                  f"{wd_validity[f'spearman_{label}_vs_backward_final_val']:.3f} | "
                  f"{wd_validity[f'spearman_{label}_vs_trained']:.3f} |")
    md += ["", "## The objective LD/L + lambda WD/L against the all-GEMM truths", "",
           "| lambda | vs trained | vs final val |", "|---|---|---|"]
    md += [f"| {lam} | {v['trained']:.3f} | {v['final_val']:.3f} |" for lam, v in objective.items()]
    md += ["", f"Bootstrap 90% interval of Spearman at lambda {DEFAULT_LAMBDA:g}: " + json.dumps(bootstrap), "",
           "| layer | LD/L | WD/L | fwd-only SR | trained | final val | backward trained | backward final val |",
           "|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['layer']} | {r['LD/L']:.3e} | {r['WD/L']:.3e} | {r['forward_only_sr_truth']:+.6f} | "
           f"{r['trained_truth']:+.5f} | {r['final_val_truth']:+.5f} | {r['backward_trained_truth']:+.5f} | "
           f"{r['backward_final_val_truth']:+.5f} |" for r in rows]
    return "\n".join(md)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pre-steps", type=int, default=PRE_STEPS, help="bf16 steps of the checkpoint (default: %(default)s)")
    p.add_argument("--steps", type=int, default=30, help="training steps of the trained truths (default: %(default)s)")
    p.add_argument("--seeds", type=ints, default=[0, 1])
    p.add_argument("--layers", type=int, default=None, help="ground truths for the first N layers only")
    add_run_arguments(p)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    ckpt = checkpoint(args.pre_steps)
    stats = {(m, d): stats_at(ckpt, d, method=m) for m, d in ESTIMATORS}  # per curvature estimator and draws
    default = stats[("fisher", DivergenceConfig().draws)]
    names = [s.name for s in default.layers][:args.layers]
    fwd, first, fwd_sr = forward_truths(ckpt, names)
    both = one_layer_truth(ckpt, names, args.seeds, args.steps, "all", "fp4")
    backward = one_layer_truth(ckpt, names, args.seeds, args.steps, "backward",
                               {"fprop": "bf16", "dgrad": "fp4", "wgrad": "fp4"})
    fwd_mean = {n: statistics.mean(fwd[n]) for n in names}
    first_mean = {n: statistics.mean(first[n]) for n in names}
    truths = {
        "forward_only": fwd_mean,
        "forward_only_minus_first_order": {n: fwd_mean[n] - first_mean[n] for n in names},
        "forward_only_sr": {n: statistics.mean(fwd_sr[n]) for n in names},
        "trained": {n: statistics.mean(both[n]["train"]) for n in names},
        "final_val": {n: statistics.mean(both[n]["val"]) for n in names},
        "backward_trained": {n: statistics.mean(backward[n]["train"]) for n in names},
        "backward_final_val": {n: statistics.mean(backward[n]["val"]) for n in names},
    }
    # forward truths: validation batches 0-3 vs 4-7 (SR: draws); trained truths: seeds, first half vs second
    reliability = {
        "forward_only": split_half(fwd, names),
        "forward_only_minus_first_order": split_half({n: [a - b for a, b in zip(fwd[n], first[n])] for n in names},
                                                     names),
        "forward_only_sr": split_half(fwd_sr, names),
        "trained": split_half({n: both[n]["train"] for n in names}, names),
        "final_val": split_half({n: both[n]["val"] for n in names}, names),
        "backward_trained": split_half({n: backward[n]["train"] for n in names}, names),
        "backward_final_val": split_half({n: backward[n]["val"] for n in names}, names),
    }

    def column(values):
        return [values[n] for n in names]

    estimators = {}
    for (m, d), st in stats.items():
        by = st.by_name()
        ld = [by[n].ld("fp4") / st.loss for n in names]
        estimators[f"{m}_draws{d}"] = {
            "spearman_LD_vs": {k: spearman(ld, column(truths[k])) for k in
                               ("forward_only_sr", "forward_only_minus_first_order", "trained", "final_val")},
            "layers_with_curvature_<=_0": sum(by[n].curvature <= 0 for n in names),
            "time_loss_divergence_s": st.diagnostics["time_loss_divergence_s"],
            "time_measure_s": sum(v for k, v in st.diagnostics.items() if k.startswith("time_")),
        }
    by = default.by_name()
    ld = [by[n].ld("fp4") / default.loss for n in names]
    wd = [by[n].wd("fp4") / default.loss for n in names]
    wd_validity = {f"spearman_{label}_vs_{k}": spearman(values, column(truths[k]))
                   for label, values in (("WD", wd), ("LD", ld))
                   for k in ("backward_trained", "backward_final_val", "trained")}
    objective = {str(lam): {k: spearman([a + lam * b for a, b in zip(ld, wd)], column(truths[k]))
                            for k in ("trained", "final_val")} for lam in WD_LAMBDAS}
    objective["WD only"] = {k: spearman(wd, column(truths[k])) for k in ("trained", "final_val")}
    bootstrap = {k: bootstrap_spearman([a + DEFAULT_LAMBDA * b for a, b in zip(ld, wd)], column(truths[k]))
                 for k in ("trained", "backward_trained")}
    rows = [{"layer": n, "LD/L": a, "WD/L": b, **{f"{k}_truth": t[n] for k, t in truths.items()},
             "first_order_term": first_mean[n], "per_seed_all": both[n], "per_seed_backward": backward[n]}
            for n, a, b in zip(names, ld, wd)]
    results.write(args.results, "validity", {
        "pre_steps": args.pre_steps, "steps": args.steps, "seeds": args.seeds, "checkpoint_val_loss": ckpt["val_loss"],
        "reliability": reliability, "estimators": estimators, "wd_validity": wd_validity,
        "objective_vs_lambda": objective, "bootstrap_at_default_lambda": bootstrap, "layers": rows,
        "stats": {f"{m}_draws{d}": s.to_json() for (m, d), s in stats.items()}},
        markdown(args, ckpt, reliability, estimators, wd_validity, objective, bootstrap, rows, len(names)))


if __name__ == "__main__":
    main()
