"""What planning costs: a re-plan's measurement against a training step, and the ILP on a 70B-like problem.

    python -m bench.bench_planner_cost               # both; writes bench/results/cpu-planner-cost.{json,md}
    python -m bench.bench_planner_cost --ilp-only    # the ILP part alone (seconds), keeping the measurement section

Measurement: one bf16 training step against one planner measurement at the planner's defaults (Fisher curvature
from the logits, WD over the default re-plan interval) and with the batched Hessian curvature, interleaved
`--reps` times on the CPU at one thread, the fastest of each (the machine may be shared); with the default ILP solve
after it, a whole re-plan. ILP: `planner.solve` on 80 blocks x 7 linears with Llama-2-70B shapes and random
statistics, per GEMM and per layer, at two budgets, plus a budget between two weight multiples.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from pathlib import Path

import torch

from bench.run_record import RESULTS, run_provenance
from planner import (Budget, LayerShape, LayerStats, PlannedModel, PlannerConfig, PlannerStats, StatsConfig, lm_logits,
                     measure, solve)
from snip_ops import SnipLinear, convert
from snip_ops.formats import GEMMS
from snip_train.data import TokenData
from snip_train.model import Llama, LlamaConfig

# The batch the planner measures on: the quality studies' calibration batch (experiments/common.py), 8 x 128 tokens.
BATCH_SIZE, SEQ_LEN, CALIBRATION_SEED, DATA_BYTES = 8, 128, 7, 8 * 2**20


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
            layers.append(LayerStats(shape=LayerShape(f"model.layers.{b}.{parent}.{kind}", k, n, 4096 * 1024),
                                     out_rms=1, grad_out_rms=1, grad_in_rms=1, weight_grad_rms=1,
                                     curvature=r.lognormvariate(-8, 2), s_dgrad=r.lognormvariate(-8, 2),
                                     s_wgrad=r.lognormvariate(-6, 2), errors=errors))
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


def measurement_cost(model, opt, layers, batch, reps: int) -> dict:
    """One training step (bf16) against one planner measurement at the planner's defaults and with the batched
    Hessian curvature (the horizon's diagonal then from a half-batch gradient), interleaved `reps` times: the fastest
    of each (interleaving exposes all of them to the same load). The default one is followed by the default ILP
    solve, the rest of a re-plan."""
    planner = PlannerConfig()
    default = planner.divergence_config
    configs = {"default": default, "batched_hessian": dataclasses.replace(default, method="batched")}
    times = {"bf16_step_s": [], **{f"measure_{k}_s": [] for k in configs}, "solve_default_s": []}
    breakdown = {}
    for _ in range(reps):
        times["bf16_step_s"].append(step_time(model, opt, batch, reps=2))
        for label, config in configs.items():
            t = time.perf_counter()
            s = measure(PlannedModel(model, layers, opt, lambda m, b: m.loss(b), lm_logits), batch, planner.candidates,
                        StatsConfig(), config)
            times[f"measure_{label}_s"].append(time.perf_counter() - t)
            breakdown[label] = {k: v for k, v in s.diagnostics.items() if k.startswith("time_")}
            if label == "default":
                t = time.perf_counter()
                solve(s, planner.budget, planner.candidates, lam=planner.lam, granularity=planner.granularity)
                times["solve_default_s"].append(time.perf_counter() - t)
    out = {k: min(v) for k, v in times.items()}
    out.update({f"measure_{k}_over_bf16_step": out[f"measure_{k}_s"] / out["bf16_step_s"] for k in configs})
    out["replan_default_over_bf16_step"] = (out["measure_default_s"] + out["solve_default_s"]) / out["bf16_step_s"]
    out["breakdown_of_the_last_repeat"] = breakdown
    out["all_times_s"] = times
    return out


def preset_cost(preset: str, reps: int) -> dict:
    """measurement_cost on `preset` with the calibration batch, 3 AdamW steps in (the optimizer has state, as
    when the planner re-plans)."""
    torch.manual_seed(0)
    model = convert(Llama(LlamaConfig.preset(preset)))
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2]},
                             {"params": [p for p in params if p.dim() < 2]}], lr=1e-3)
    data = TokenData.from_path(None, max_bytes=DATA_BYTES)
    batch = data.get_batch("train", BATCH_SIZE, SEQ_LEN, torch.Generator().manual_seed(CALIBRATION_SEED))
    step_time(model, opt, batch, reps=2)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, SnipLinear)}
    return {"params": sum(p.numel() for p in params), **measurement_cost(model, opt, layers, batch, reps)}


def ilp_timing() -> list[dict]:
    """solve() on the 70B-like problem, 3 runs per row: four settings, plus a budget between two weight multiples
    (seed 1, bf16/fp4 per GEMM, cost 0.47) that CBC alone took over a minute to prove."""
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


def measurement_markdown(timing: dict, provenance_note: str) -> list[str]:
    md = ["", "## Measurement vs one training step (batch 8 x 128, CPU, 1 thread; fastest of interleaved repeats, "
          "since the machine may be shared)" + provenance_note, "",
          "| preset | parameters | bf16 step s | measurement s (default: Fisher) | ratio | + ILP solve s | re-plan "
          "ratio | measurement s (batched Hessian) | ratio |",
          "|---|---|---|---|---|---|---|---|---|"]
    for preset, t in timing.items():
        md.append(f"| {preset} | {t['params'] / 1e6:.2f}M | {t['bf16_step_s']:.3f} | {t['measure_default_s']:.3f} | "
                  f"{t['measure_default_over_bf16_step']:.2f}x | {t['solve_default_s']:.3f} | "
                  f"{t['replan_default_over_bf16_step']:.2f}x | {t['measure_batched_hessian_s']:.3f} | "
                  f"{t['measure_batched_hessian_over_bf16_step']:.2f}x |")
    return md + ["", "```", json.dumps(timing, indent=1), "```"]


def write(results: Path, payload: dict, markdown: str) -> None:
    results.mkdir(parents=True, exist_ok=True)
    (results / "cpu-planner-cost.json").write_text(json.dumps(payload, indent=1))
    (results / "cpu-planner-cost.md").write_text(
        f"# planner bench: cost\n\n{payload['date']} | `{payload['command']}` | commit {payload['commit']} | "
        f"{payload['machine']}\n\n{markdown}\n")
    print(markdown)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", type=lambda s: s.split(","), default=["tiny", "mini"],
                   help="the presets whose measurement is timed (default: tiny,mini)")
    p.add_argument("--reps", type=int, default=None, help="interleaved repeats per preset (default: 5 for tiny, 3 "
                                                          "otherwise)")
    p.add_argument("--ilp-only", action="store_true",
                   help="re-time the ILP only, keeping the measurement section of the last full run")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: %(default)s)")
    p.add_argument("--results", type=Path, default=RESULTS, help="where the results go (default: bench/results)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    made = run_provenance()
    ilp = ilp_timing()
    if args.ilp_only:  # keep the measurement section, and say when and how it was made
        old = json.loads((args.results / "cpu-planner-cost.json").read_text())
        kept = old.get("measurement_made") or {"date": old["date"], "command": old["command"], "machine": old["machine"],
                                               "commit": old.get("commit", old.get("recorded_in"))}
        md = ilp_markdown(ilp) + measurement_markdown(old["measurement"],
                                                      f"; measured {kept['date']} by `{kept['command']}`")
        write(args.results, {**made, "ilp": ilp, "measurement": old["measurement"], "measurement_made": kept},
              "\n".join(md))
        return
    timing = {preset: preset_cost(preset, args.reps or {"tiny": 5}.get(preset, 3)) for preset in args.presets}
    write(args.results, {**made, "ilp": ilp, "measurement": timing},
          "\n".join(ilp_markdown(ilp) + measurement_markdown(timing, "")))


if __name__ == "__main__":
    main()
