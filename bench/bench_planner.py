"""Planner benchmarks (issue #3 "Measure"): metric validity, plan quality, cost, and the main job's time.

    python bench/bench_planner.py cost        # ILP on a 70B-like problem; measurement vs a training step
    python bench/bench_planner.py cost --ilp-only   # the ILP part alone (seconds)
    python bench/bench_planner.py validity    # Spearman(LD/L + lambda WD, true loss increase per fp4 layer)
    python bench/bench_planner.py quality     # 75% FP4 FLOPs: SNIP vs baselines vs bf16, from one checkpoint
    python bench/bench_planner.py demo        # snip_train.planning.run_comparison wall time

Each writes bench/results/cpu-planner-<name>.json (raw numbers, command, machine, date) and .md.
Every run emulates the low-precision GEMMs with the reference quantizer (Philox SR bits included).
Results committed before the reference became as fast were made with a float32 stand-in that drew
its SR bits from torch's generator (same distribution, other bits); each file names its quantizer.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner import Budget, DivergenceConfig, PlannerConfig, StatsConfig, baseline, measure, solve  # noqa: E402
from planner.cost import LayerShape  # noqa: E402
from planner.ilp import DEFAULT_LAMBDA  # noqa: E402
from planner.stats import LayerStats, PlannerStats  # noqa: E402
from snip_ops import LinearPrecision, SnipLinear, convert  # noqa: E402
from snip_ops import gemm as snip_gemm  # noqa: E402
from snip_ops.formats import GEMMS, Rounding, recipe  # noqa: E402
from snip_train.data import TokenData  # noqa: E402
from snip_train.model import Llama, LlamaConfig  # noqa: E402
from snip_train.planning import make_hooks, run_comparison  # noqa: E402
from snip_train.train import TrainConfig, train  # noqa: E402

RESULTS = ROOT / "bench" / "results"
CACHE = Path(os.environ.get("SNIP_BENCH_CACHE", "/tmp/snip-planner-bench"))
# The tiny preset, batch 8 x 128 tokens; a "mid-training" checkpoint after PRE_STEPS steps at constant lr.
RUN = dict(preset="tiny", batch_size=8, seq_len=128, weight_decay=0.1, grad_clip=1.0, eval_batches=8,
           progress=False, max_bytes=8 * 2**20)
PRE_STEPS, LR = 400, 3e-3
BUDGET = Budget.fp4_fraction(0.75)
SR_DRAWS = 8  # stochastic-rounding passes per layer in the forward-only SR truth
LAMBDAS = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)


def machine() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "loadavg_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None}


def write(name: str, payload: dict, markdown: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": " ".join(sys.argv),
               "machine": machine(), **payload}
    (RESULTS / f"cpu-planner-{name}.json").write_text(json.dumps(payload, indent=1))
    (RESULTS / f"cpu-planner-{name}.md").write_text(
        f"# planner bench: {name}\n\n{payload['date']} | `{payload['command']}` | {payload['machine']}\n\n{markdown}\n")
    print(markdown)


# ---------------------------------------------------------------------------------------------
# the checkpoint and continuing from it
# ---------------------------------------------------------------------------------------------
def checkpoint() -> dict:
    """A bf16 tiny model after PRE_STEPS steps (constant lr after warmup), with its AdamW state."""
    path = CACHE / f"ckpt-tiny-{PRE_STEPS}.pt"
    if path.exists():
        return torch.load(path)
    CACHE.mkdir(parents=True, exist_ok=True)
    box = {}
    summary = train(TrainConfig(**RUN, steps=PRE_STEPS, lr=LR, min_lr_ratio=1.0, warmup_steps=40, seed=1234,
                                eval_interval=100, on_setup=lambda m, o: box.update(model=m, opt=o)))
    ckpt = {"model": box["model"].state_dict(), "optimizer": box["opt"].state_dict(),
            "val_loss": summary["final_val_loss"], "time_s": summary["time_s"]}
    torch.save(ckpt, path)
    return ckpt


def continue_from(ckpt: dict, steps: int, seed: int, precision=None, hooks=None, evals: int = 4) -> dict:
    """Train `steps` more steps from the checkpoint (cosine lr decay LR -> LR/10), return the summary."""
    def on_setup(model, opt):
        opt.load_state_dict(copy.deepcopy(ckpt["optimizer"]))  # AdamW would step the checkpoint's tensors in place
        if hooks is not None:
            hooks.on_setup(model, opt)

    def prepare(model):
        model.load_state_dict(ckpt["model"])
        return model

    return train(TrainConfig(**RUN, steps=steps, lr=LR, min_lr_ratio=0.1, warmup_steps=0, seed=seed,
                             eval_interval=max(1, steps // evals) if evals else 0, precision=precision, prepare_model=prepare,
                             on_setup=on_setup, on_step=hooks.on_step if hooks else None))


def model_at(ckpt: dict):
    model = convert(Llama(LlamaConfig.preset("tiny")))
    model.load_state_dict(ckpt["model"])
    params = list(model.parameters())  # the same two groups as snip_train.train (decay / no decay)
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2]},
                             {"params": [p for p in params if p.dim() < 2]}], lr=LR)
    opt.load_state_dict(copy.deepcopy(ckpt["optimizer"]))  # also restores betas, eps, weight decay
    return model, opt, {n: m for n, m in model.named_modules() if isinstance(m, SnipLinear)}


def calibration_batch(seed: int = 7) -> torch.Tensor:
    data = TokenData.from_path(None, max_bytes=RUN["max_bytes"])
    return data.get_batch("train", RUN["batch_size"], RUN["seq_len"], torch.Generator().manual_seed(seed))


def stats_at(ckpt: dict, draws: int, candidates=("fp8", "fp4")) -> PlannerStats:
    model, opt, layers = model_at(ckpt)
    return measure(model, layers, opt, calibration_batch(), lambda m, b: m.loss(b), candidates,
                   StatsConfig(), DivergenceConfig(draws=draws))


def plan_dict(plan) -> dict:
    return {n: p.to_json() for n, p in plan.precisions.items()}


# ---------------------------------------------------------------------------------------------
# cost
# ---------------------------------------------------------------------------------------------
def synthetic_70b(seed: int = 0) -> PlannerStats:
    """80 blocks x 7 linears with Llama-2-70B shapes and random divergences / errors."""
    r = random.Random(seed)
    shapes = {"q_proj": (8192, 8192), "k_proj": (8192, 1024), "v_proj": (8192, 1024), "o_proj": (8192, 8192),
              "gate_proj": (8192, 28672), "up_proj": (8192, 28672), "down_proj": (28672, 8192)}
    layers = []
    for b in range(80):
        for kind, (k, n) in shapes.items():
            errors = {p: {g: r.uniform(lo, 10 * lo) for g in GEMMS} for p, lo in (("fp8", 1e-4), ("fp4", 5e-3))}
            errors["bf16"] = {g: 0.0 for g in GEMMS}
            parent = "self_attn" if kind[0] in "qkvo" else "mlp"
            layers.append(LayerStats(LayerShape(f"model.layers.{b}.{parent}.{kind}", k, n, 4096 * 1024), 1, 1, 1, 1,
                                     r.lognormvariate(-8, 2), r.lognormvariate(-8, 2), r.lognormvariate(-6, 2), errors))
    return PlannerStats(tuple(layers), 2.0)


def step_time(model, opt, batch, reps: int = 5) -> float:
    """The fastest of `reps` training steps (after one warm-up): the machine is shared, min is robust."""
    times = []
    for _ in range(reps + 1):
        t = time.perf_counter()
        model.loss(batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
    return min(times[1:])


def measure_time(model, layers, opt, batch, draws: int, reps: int) -> tuple[float, dict]:
    """The fastest of `reps` planner measurements (like the steps: the machine is shared) and its
    per-phase breakdown."""
    runs = []
    for _ in range(reps):
        t = time.perf_counter()
        s = measure(model, layers, opt, batch, lambda m, b: m.loss(b), ("fp8", "fp4"), StatsConfig(),
                    DivergenceConfig(draws=draws))
        runs.append((time.perf_counter() - t, s))
    best, s = min(runs, key=lambda r: r[0])
    return best, {k: v for k, v in s.diagnostics.items() if k.startswith("time_")}


def small_preset_cost() -> dict:
    """Measurement vs a bf16 step on the 'small' preset (~25M parameters, same batch), 3 AdamW steps in:
    the overheads that dominate the tiny model's ratio (quantizer calls, hooks) weigh less here."""
    torch.manual_seed(0)
    model = convert(Llama(LlamaConfig.preset("small")))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = calibration_batch()
    layers = {n: m for n, m in model.named_modules() if isinstance(m, SnipLinear)}
    out = {"bf16_step_s": step_time(model, opt, batch, reps=3)}
    for draws in (1, 2):
        best, breakdown = measure_time(model, layers, opt, batch, draws, reps=2)
        out[f"measure_s_draws{draws}"] = best
        out[f"measure_breakdown_draws{draws}"] = breakdown
        out[f"measure_over_bf16_step_draws{draws}"] = best / out["bf16_step_s"]
    return out


def ilp_timing() -> list[dict]:
    """solve() on the 70B-like problem, 3 runs per row: the bench's four settings, plus a budget between
    two weight multiples (seed 1, bf16/fp4 per GEMM, cost 0.47) that CBC alone took over a minute to prove."""
    rows = [(synthetic_70b(), granularity, ("bf16", "fp8", "fp4"), budget) for granularity in ("gemm", "layer")
            for budget in (Budget.fp4_fraction(0.75), Budget.relative_cost(0.3))]
    rows.append((synthetic_70b(1), "gemm", ("bf16", "fp4"), Budget.relative_cost(0.47)))
    out = []
    for stats, granularity, candidates, budget in rows:
        times = []
        for _ in range(3):
            t = time.perf_counter()
            plan = solve(stats, budget, candidates, granularity=granularity)
            times.append(time.perf_counter() - t)
        m = plan.metrics
        out.append({"granularity": granularity, "candidates": list(candidates), "budget": budget.to_json(),
                    "binary_variables": len(stats.layers) * (3 if granularity == "gemm" else 1) * len(candidates),
                    "solve_s": times, "objective": m["objective"], "certified_optimal": m["certified_optimal"],
                    "cbc_binaries": m["cbc_binaries"], "search_nodes": m["search_nodes"],
                    "cbc_suboptimal": m["cbc_suboptimal"], "fp4_fraction": m["fp4_fraction"],
                    "relative_cost": m["relative_cost"]})
    return out


def ilp_markdown(ilp: list[dict]) -> list[str]:
    md = ["## ILP solve time, 70B-like problem (80 blocks x 7 linears)", "",
          "`solve()` end to end: formulation, Lagrangian bound, CBC on the options the bound leaves, exact search "
          "(planner/exact.py). The last row's budget falls between two weight multiples: uncapped, CBC took over a "
          "minute to prove its plan.", "",
          "| granularity | candidates | budget | binaries | CBC binaries | search nodes | certified | solve s (3 runs) |",
          "|---|---|---|---|---|---|---|---|"]
    for r in ilp:
        budget, times = r["budget"], ", ".join(f"{t:.2f}" for t in r["solve_s"])
        md.append(f"| {r['granularity']} | {'/'.join(r['candidates'])} | {budget['kind']}={budget['value']} | "
                  f"{r['binary_variables']} | {r['cbc_binaries']:.0f} | {r['search_nodes']:.0f} | "
                  f"{'yes' if r['certified_optimal'] else 'no'} | {times} |")
    return md


def measurement_markdown(timing: dict, provenance: str) -> list[str]:
    return ["", "## Measurement vs one training step (tiny model, batch 8 x 128, CPU, 1 thread; fastest of 3-5 "
            "repeats since the machine is shared; `small_preset`: the 25M-parameter preset at the same batch)"
            + provenance, "", "```", json.dumps(timing, indent=1), "```"]


def bench_cost(args) -> None:
    ilp = ilp_timing()
    if args.ilp_only:  # keep the measurement section, and say when and how it was made
        old = json.loads((RESULTS / "cpu-planner-cost.json").read_text())
        made = old.get("measurement_made") or {k: old[k] for k in ("date", "command", "machine")}
        md = ilp_markdown(ilp) + measurement_markdown(
            old["measurement"], f"; measured {made['date']} by `{made['command']}`")
        write("cost", {"ilp": ilp, "measurement": old["measurement"], "measurement_made": made}, "\n".join(md))
        return
    ckpt = checkpoint()
    batch = calibration_batch()
    model, opt, layers = model_at(ckpt)
    timing = {"bf16_step_s": step_time(model, opt, batch)}
    model, opt, layers = model_at(ckpt)
    plan = solve(stats_at(ckpt, 1), BUDGET)
    plan.apply(model)
    timing["snip_plan_step_s"] = step_time(model, opt, batch, reps=3)
    for draws in (1, 2):
        best, breakdown = measure_time(model, layers, opt, batch, draws, reps=3)
        timing[f"measure_s_draws{draws}"] = best
        timing[f"measure_breakdown_draws{draws}"] = breakdown
        timing[f"measure_over_bf16_step_draws{draws}"] = best / timing["bf16_step_s"]
        timing[f"measure_over_snip_step_draws{draws}"] = best / timing["snip_plan_step_s"]
    timing["small_preset"] = small_preset_cost()
    write("cost", {"ilp": ilp, "measurement": timing}, "\n".join(ilp_markdown(ilp) + measurement_markdown(timing, "")))


# ---------------------------------------------------------------------------------------------
# metric validity
# ---------------------------------------------------------------------------------------------
def spearman(a, b) -> float:
    from scipy.stats import spearmanr
    return float(spearmanr(a, b).statistic)


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


def bench_validity(args) -> None:
    ckpt = checkpoint()
    stats = {d: stats_at(ckpt, d) for d in (1, 2, 8)}  # the planner as it runs: the reference quantizer
    names = [s.name for s in stats[8].layers]
    # ground truth 1: forward-only loss increase, fprop of one layer in fp4, on 8 validation batches
    model, _, layers = model_at(ckpt)
    data = TokenData.from_path(None, max_bytes=RUN["max_bytes"])
    gen = torch.Generator().manual_seed(0x5EED)
    val = [data.get_batch("val", RUN["batch_size"], RUN["seq_len"], gen) for _ in range(8)]

    def val_losses():
        with torch.no_grad():
            return [float(model.loss(b)) for b in val]
    base = val_losses()
    fwd, fwd_sr = {}, {}  # per layer: per-batch (RNE) and per-draw (SR) loss increases
    # (a') the same with the fprop operands stochastically rounded (unbiased noise, fresh bits per
    # forward), averaged over SR_DRAWS passes: the quantity LD estimates, E[L(y + noise)] - L(y),
    # without the first-order term g . delta of one fixed round-to-nearest perturbation.
    fp4 = recipe("fp4")
    fp4_sr = dataclasses.replace(fp4, name="fp4_sr", act=dataclasses.replace(fp4.act, rounding=Rounding.SR),
                                 weight=dataclasses.replace(fp4.weight, rounding=Rounding.SR))
    for n in names:
        layers[n].set_precision(LinearPrecision(fprop="fp4", dgrad="bf16", wgrad="bf16"))
        fwd[n] = [q - b for q, b in zip(val_losses(), base)]
        layers[n].set_precision(LinearPrecision(fprop=fp4_sr, dgrad="bf16", wgrad="bf16"))
        fwd_sr[n] = [statistics.mean(val_losses()) - statistics.mean(base) for _ in range(SR_DRAWS)]
        layers[n].set_precision("bf16")
    first = first_order_terms(model, layers, names, val)
    # ground truth 2: K training steps with one layer (all three GEMMs) in fp4, minus the same in bf16
    # Two readings per run, both paired with a bf16 run on the same batches: the mean training-loss
    # increase over the K steps (the loss the quantized layer trains on, forward error included) and
    # the final validation-loss increase.
    cache = CACHE / f"validity-{args.steps}.json"  # {"seed/layer": {"train": d, "val": d}}
    done = json.loads(cache.read_text()) if cache.exists() else {}
    truth = {n: {"train": [], "val": []} for n in names}
    for seed in args.seeds:
        ref = None
        for n in names:
            key = f"{seed}/{n}"
            if key not in done:
                ref = ref or continue_from(ckpt, args.steps, seed, evals=0)
                run = continue_from(ckpt, args.steps, seed, precision={n: "fp4"}, evals=0)
                done[key] = {"train": statistics.mean(run["history"]["train"]["loss"])
                             - statistics.mean(ref["history"]["train"]["loss"]),
                             "val": run["final_val_loss"] - ref["final_val_loss"]}
                cache.write_text(json.dumps(done))
                print(f"seed {seed} {n}: train {done[key]['train']:+.5f} val {done[key]['val']:+.5f}", flush=True)
            for k in ("train", "val"):
                truth[n][k].append(done[key][k])
    trained = [statistics.mean(truth[n]["train"]) for n in names]
    trained_val = [statistics.mean(truth[n]["val"]) for n in names]
    fwd_mean = {n: statistics.mean(fwd[n]) for n in names}
    first_mean = {n: statistics.mean(first[n]) for n in names}
    second = {n: fwd_mean[n] - first_mean[n] for n in names}  # what is left of the RNE truth: second order and up
    truths = {
        "forward_only": fwd_mean,
        "forward_only_minus_first_order": second,
        "forward_only_sr": {n: statistics.mean(fwd_sr[n]) for n in names},
        "trained": dict(zip(names, trained)),
        "final_val": dict(zip(names, trained_val)),
    }
    # forward truths: validation batches 0-3 vs 4-7 (SR: draws); trained truths: seeds, first half vs second
    reliability = {
        "forward_only": split_half(fwd, names),
        "forward_only_minus_first_order": split_half({n: [a - b for a, b in zip(fwd[n], first[n])] for n in names},
                                                     names),
        "forward_only_sr": split_half(fwd_sr, names),
        "trained": split_half({n: truth[n]["train"] for n in names}, names),
        "final_val": split_half({n: truth[n]["val"] for n in names}, names),
        "first_order_term_alone": split_half(first, names),
    }
    rne = {
        "spearman_forward_only_vs_first_order_term": spearman([fwd_mean[n] for n in names],
                                                             [first_mean[n] for n in names]),
        "layers_with_negative_forward_only_truth": sum(fwd_mean[n] < 0 for n in names),
        "median_abs_first_order_over_abs_remainder": statistics.median(
            abs(first_mean[n]) / max(abs(second[n]), 1e-12) for n in names),
    }
    default = DivergenceConfig().draws
    rows, corr = [], {}
    for d, st in stats.items():
        by = st.by_name()
        ld = [by[n].ld("fp4") / st.loss for n in names]
        wd = [by[n].wd("fp4") for n in names]
        corr[f"draws{d}"] = {
            **{f"spearman_LD_vs_{k}_truth": spearman(ld, [t[n] for n in names]) for k, t in truths.items()},
            "spearman_WD_vs_trained_truth": spearman(wd, trained),
            "spearman_LD+lambda*WD_vs_trained_truth": {str(lam): spearman([a + lam * b for a, b in zip(ld, wd)], trained)
                                                       for lam in LAMBDAS},
            "spearman_LD+lambda*WD_vs_final_val_truth": {str(lam): spearman([a + lam * b for a, b in zip(ld, wd)],
                                                                            trained_val) for lam in LAMBDAS},
            f"bootstrap_90pct_spearman_at_default_lambda_{DEFAULT_LAMBDA:g}": {
                truth_name: bootstrap_spearman([a + DEFAULT_LAMBDA * b for a, b in zip(ld, wd)], t)
                for truth_name, t in (("trained", trained), ("final_val", trained_val))},
        }
        if d == default:
            rows = [{"layer": n, "LD/L": a, "WD": b, **{f"{k}_truth": t[n] for k, t in truths.items()},
                     "first_order_term": first_mean[n], "per_seed": truth[n]}
                    for n, a, b in zip(names, ld, wd)]
    by = stats[default].by_name()
    objective = [by[n].ld("fp4") / stats[default].loss + DEFAULT_LAMBDA * by[n].wd("fp4") for n in names]
    summary = {k: spearman(objective, [t[n] for n in names]) for k, t in truths.items()}
    md = [f"Checkpoint: tiny model, {PRE_STEPS} bf16 steps (val loss {ckpt['val_loss']:.4f}); the planner's statistics "
          f"with the reference quantizer at its defaults ({default} draws, lambda {DEFAULT_LAMBDA:g}) unless a draws "
          f"count is named. Ground truths, fp4 on one layer at a time:",
          "(a) forward-only loss increase on 8 validation batches (fprop in fp4, round to nearest);",
          "(a-1) (a) minus its first-order term g_l . (Q(y_l) - y_l), computed per batch with the bf16 gradient;",
          f"(a') forward-only with stochastically rounded fprop operands, mean of {SR_DRAWS} passes with fresh bits "
          "(the quantity LD estimates: E[L(y + noise)] - L(y));",
          f"(b) 'trained': mean training-loss increase over {args.steps} steps from the checkpoint (all three GEMMs "
          f"in fp4), paired with bf16 on the same batches, mean over seeds {args.seeds}; (c) final validation-loss "
          "increase of the same runs.", "",
          "| truth | Spearman with LD/L + lambda WD | split-half reliability of the truth |", "|---|---|---|"]
    md += [f"| {k} | {v:.3f} | {reliability[k]:.3f} |" for k, v in summary.items()]
    md += ["", "Round-to-nearest truth, decomposed: " + json.dumps(rne), "",
           "Split-half reliability: Spearman between the truth's means over two halves of its readings (validation "
           "batches 0-3 vs 4-7; SR draws; seeds), how reproducible its ranking is: " + json.dumps(reliability), "",
           "```", json.dumps(corr, indent=1), "```", "",
           "| layer | LD/L | WD | fwd-only | first-order term | fwd-only minus first order | fwd-only SR | trained "
           "| final val |", "|---|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['layer']} | {r['LD/L']:.3e} | {r['WD']:.3e} | {r['forward_only_truth']:+.5f} | "
           f"{r['first_order_term']:+.5f} | {r['forward_only_minus_first_order_truth']:+.5f} | "
           f"{r['forward_only_sr_truth']:+.6f} | {r['trained_truth']:+.5f} | {r['final_val_truth']:+.5f} |"
           for r in rows]
    write("validity", {"steps": args.steps, "seeds": args.seeds, "checkpoint_val_loss": ckpt["val_loss"],
                       "summary_at_defaults": summary, "reliability": reliability, "round_to_nearest": rne,
                       "correlations": corr, "layers": rows,
                       "stats": {str(d): s.to_json() for d, s in stats.items()}}, "\n".join(md))


# ---------------------------------------------------------------------------------------------
# plan quality
# ---------------------------------------------------------------------------------------------
def bench_quality(args) -> None:
    ckpt = checkpoint()
    out = CACHE / "quality.json"
    done = json.loads(out.read_text()) if out.exists() and args.resume else {}
    stats = stats_at(ckpt, 2)
    static = {name: baseline(name, stats, BUDGET) for name in
              ("uniform_fp4", "first_last", "layer_type", "min_error", "random")}
    snip_lambdas = {"snip_lam1": 1.0, "snip_lam0.01": 0.01, "snip_lam0.001": 0.001}
    for seed in args.seeds:
        for label in ["bf16", *snip_lambdas, *static]:
            key = f"{label}/{seed}"
            if key in done:
                continue
            t = time.perf_counter()
            if label in snip_lambdas:
                hooks = make_hooks(PlannerConfig(budget=BUDGET, interval=args.interval, lam=snip_lambdas[label]),
                                   show_table=False, log=lambda m: None)
                s = continue_from(ckpt, args.steps, seed, hooks=hooks)
                extra = {"plans": [dict(h) for h in hooks.planner.history],
                         "final_plan": plan_dict(hooks.planner.plan)}
            else:
                s = continue_from(ckpt, args.steps, seed, precision=plan_dict(static[label]) if label != "bf16" else None)
                extra = {}
            done[key] = {"final_val_loss": s["final_val_loss"], "val": s["history"]["val"], "time_s": time.perf_counter() - t,
                         **extra}
            out.write_text(json.dumps(done))
            print(f"{key}: val {s['final_val_loss']:.4f} ({time.perf_counter() - t:.0f}s)", flush=True)
    labels = ["bf16", *snip_lambdas, *static]
    table = {}
    for label in labels:
        vals = [done[f"{label}/{s}"]["final_val_loss"] for s in args.seeds]
        gaps = [v - done[f"bf16/{s}"]["final_val_loss"] for v, s in zip(vals, args.seeds)]
        plan = static.get(label)
        if label in snip_lambdas:  # re-planned: the mean over its plans (objective at its own lambda)
            plans = [h for s in args.seeds for h in done[f"{label}/{s}"]["plans"]]
            fp4, objective = (statistics.mean(h[k] for h in plans) for k in ("fp4_fraction", "objective"))
        else:
            fp4 = plan.metrics["fp4_fraction"] if plan else 0.0
            objective = plan.metrics.get("objective") if plan else None
        table[label] = {"val_loss": vals, "mean": statistics.mean(vals), "gap_to_bf16": gaps,
                        "mean_gap": statistics.mean(gaps), "fp4_fraction": fp4, "planner_objective": objective}
    md = [f"From the {PRE_STEPS}-step bf16 checkpoint (val {ckpt['val_loss']:.4f}), {args.steps} steps per plan, "
          f"seeds {args.seeds}; budget: {BUDGET.describe()}. The SNIP runs (lambda 1, 0.01, 0.001) re-plan every "
          f"{args.interval} steps (FP4 share and objective: means over their plans, objective at their own "
          f"lambda); the baselines are fixed plans made at the checkpoint (objective: LD/L + lambda WD with the "
          f"default lambda {DEFAULT_LAMBDA:g}, under the checkpoint statistics). Gaps are paired per seed (same batches and initial state).", "",
          "| plan | FP4 FLOPs | objective | final val loss per seed | mean | mean gap to bf16 |", "|---|---|---|---|---|---|"]
    for label, r in sorted(table.items(), key=lambda kv: kv[1]["mean"]):
        f4 = "-" if r["fp4_fraction"] is None else f"{100 * r['fp4_fraction']:.1f}%"
        obj = "-" if r["planner_objective"] is None else f"{r['planner_objective']:.3e}"
        md.append(f"| {label} | {f4} | {obj} | " + ", ".join(f"{v:.4f}" for v in r["val_loss"])
                  + f" | {r['mean']:.4f} | {r['mean_gap']:+.4f} |")
    base_names = list(static)
    for label in snip_lambdas:
        beaten = [b for b in base_names if table[label]["mean_gap"] < table[b]["mean_gap"]]
        per_seed = sum(all(table[label]["val_loss"][i] < table[b]["val_loss"][i] for b in base_names)
                       for i in range(len(args.seeds)))
        md.append(f"\n{label}: mean gap smaller than {len(beaten)} of {len(base_names)} baselines; below every "
                  f"baseline on {per_seed} of {len(args.seeds)} seeds.")
    write("quality", {"steps": args.steps, "seeds": args.seeds, "interval": args.interval, "budget": BUDGET.to_json(),
                      "checkpoint_val_loss": ckpt["val_loss"], "table": table, "runs": done,
                      "static_plans": {k: p.to_json(with_stats=False) for k, p in static.items()},
                      "stats": stats.to_json()}, "\n".join(md))


def bench_demo(args) -> None:
    """The main job (run_comparison: bf16 vs SNIP vs layer_type) end to end, timed."""
    out = CACHE / "demo"
    t = time.perf_counter()
    runs = run_comparison(out, PlannerConfig(budget=BUDGET, interval=args.interval), "layer_type",
                          preset="tiny", steps=args.steps, batch_size=args.batch, progress=False)
    total = time.perf_counter() - t
    res = {label: {"final_val_loss": s["final_val_loss"], "time_s": s["time_s"], "step_time_s": s["step_time_s"]}
           for label, s in runs.items()}
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    write("demo", {"steps": args.steps, "batch_size": args.batch, "interval": args.interval, "quantizer": "reference",
                   "total_s": total, "runs": res, "files": files},
          f"snip_train.planning.run_comparison (bf16 vs SNIP vs layer_type), tiny preset, {args.steps} steps, batch "
          f"{args.batch} x 128, reference quantizer: {total:.0f}s in total\n\n```\n{json.dumps(res, indent=1)}\n```"
          f"\n\nfiles: {files}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("cost", "validity", "quality", "demo"))
    p.add_argument("--steps", type=int, default=None, help="training steps per run")
    p.add_argument("--seeds", type=lambda s: [int(v) for v in s.split(",")], default=None)
    p.add_argument("--interval", type=int, default=None, help="SNIP re-plan interval")
    p.add_argument("--resume", action="store_true", help="quality: skip runs already in the cache")
    p.add_argument("--batch", type=int, default=16, help="demo: sequences per step (default: %(default)s)")
    p.add_argument("--ilp-only", action="store_true",
                   help="cost: re-time the ILP only, keeping the measurement section of the last full run")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: on a shared 2-core machine two threads oversubscribe)")
    p.add_argument("--results", type=Path, default=None, help="where the results go (default: bench/results)")
    args = p.parse_args()
    if args.results is not None:
        global RESULTS
        RESULTS = args.results
    torch.set_num_threads(args.threads)
    defaults = {"validity": (30, [0, 1], None), "quality": (100, [0, 1, 2], 50), "demo": (300, [0], 100), "cost": (0, [0], 0)}
    steps, seeds, interval = defaults[args.what]
    args.steps = args.steps if args.steps is not None else steps
    args.seeds = args.seeds or seeds
    args.interval = args.interval or interval
    {"cost": bench_cost, "validity": bench_validity, "quality": bench_quality, "demo": bench_demo}[args.what](args)


if __name__ == "__main__":
    main()
