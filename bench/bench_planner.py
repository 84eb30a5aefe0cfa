"""Planner benchmarks: metric validity, plan quality, a precision schedule, cost, and the main job's time.

    python bench/bench_planner.py cost        # ILP on a 70B-like problem; a re-plan's measurement vs a training step
    python bench/bench_planner.py cost --ilp-only   # the ILP part alone (seconds)
    python bench/bench_planner.py validity    # per-layer scores vs the true effect of FP4 on one layer
    python bench/bench_planner.py horizon     # WD's horizon without logits (gradient variance) vs with (Gauss-Newton)
    python bench/bench_planner.py staleness   # how stale a plan goes within a re-plan interval (the drift trigger)
    python bench/bench_planner.py wgrad_error # e_wgrad from the row sample vs the whole batch's
    python bench/bench_planner.py scale       # LD's and WD's size vs the loss that amplified FP4 errors cost
    python bench/bench_planner.py quality     # SNIP vs the heuristics vs bf16: presets x phases x budgets x seeds
    python bench/bench_planner.py schedule    # a precision schedule vs a constant budget at the same mean FP4 share
    python bench/bench_planner.py swap --raise A,B --lower C,D   # SNIP's plan with layers moved: predicted vs trained
    python bench/bench_planner.py demo        # snip_train.planning.run_comparison (paired) wall time

Each writes bench/results/cpu-planner-<name>.json (raw numbers, command, machine, date) and .md. Every
comparison is paired: branches start from one checkpoint and see the same batches per seed. The
low-precision GEMMs are emulated with the quantizer's CPU implementation where it is built, else with
the PyTorch reference: the same bits either way (Philox SR bits included).
Trained runs are cached under $SNIP_BENCH_CACHE, so an interrupted grid resumes. The quality grid's runs record a
digest of the bits their machine trains with (`numerics`), and runs of different digests are never paired: a cache
copied from another machine fails with the runs it holds, where pairing them would mix another CPU's rounding into
every paired difference. The other benches whose cached runs are subtracted from each other (scale, schedule, swap,
bench_forward_train.py's routes) record the digest per checkpoint in the cache and train nothing beside runs of another
(`check_cache_numerics`); validity caches differences that one process trained both sides of.
"""

from __future__ import annotations

import argparse
import collections
import copy
import dataclasses
import fcntl
import functools
import hashlib
import itertools
import json
import math
import multiprocessing
import os
import platform
import random
import re
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable

import torch
from torch.nn import functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner import (Budget, DivergenceConfig, Plan, PlannerConfig, PrecisionSchedule, StatsConfig,  # noqa: E402
                     measure, solve)
from planner.baselines import block_index  # noqa: E402
from planner.divergence import _generator as divergence_generator, _sample as sample_labels  # noqa: E402
from planner.divergence import lm_logits, signal_fractions, weighted_signal_share  # noqa: E402
from planner.cost import LayerShape, layer_shapes, plan_metrics  # noqa: E402
from planner.ilp import DEFAULT_LAMBDA, plan_objective  # noqa: E402
from planner.qerror import gemm_errors, relative_error  # noqa: E402
from planner.stats import LayerStats, PlannerStats, high_precision, record  # noqa: E402
from snip_ops import LinearPrecision, SnipLinear, convert  # noqa: E402
from snip_ops.module import layer_seed  # noqa: E402
from snip_ops import gemm as snip_gemm  # noqa: E402
from snip_ops.formats import GEMMS, Rounding, recipe  # noqa: E402
from snip_train.data import TokenData  # noqa: E402
from snip_train.model import Llama, LlamaConfig  # noqa: E402
from snip_train.planning import ComparisonConfig, make_hooks, run_comparison  # noqa: E402
from snip_train.state import set_sr_counters, sr_counters  # noqa: E402
from snip_train.train import TrainConfig, learning_rates, train  # noqa: E402

RESULTS = ROOT / "bench" / "results"
CACHE = Path(os.environ.get("SNIP_BENCH_CACHE", "/tmp/snip-planner-bench"))
# The tiny preset, batch 8 x 128 tokens; a "mid-training" checkpoint after PRE_STEPS steps at constant lr.
RUN = dict(preset="tiny", batch_size=8, seq_len=128, weight_decay=0.1, grad_clip=1.0, eval_batches=8,
           progress=False, max_bytes=8 * 2**20)
PRE_STEPS = 400
PRE_WARMUP = 40  # the checkpoints' warmup: every checkpoint longer than it is a point of one trajectory
# Peak learning rate per preset (the checkpoints' constant rate after warmup; the branches' cosine starts there):
# tiny's 3e-3, scaled as 1 / width for the wider presets (Adam's hidden-layer rate under muP; mini is 3x as wide).
# At 3e-3 mini's paired branches spread 0.02-0.03 nats by method at one seed, uniform FP4 below SNIP's 80% plan
# (bench/results/cpu-planner-quality-mini-signal-lr3e-3.md): chaos, not precision, ranked them.
LRS = {"tiny": 3e-3, "mini": 1e-3}


def preset_lr(ckpt: dict) -> float:
    return LRS[ckpt.get("preset", "tiny")]


BUDGET = Budget.fp4_fraction(0.75)
SR_DRAWS = 8  # stochastic-rounding passes per layer in the forward-only SR truth
FP4_FORWARD = LinearPrecision(fprop="fp4", dgrad="bf16", wgrad="bf16")  # a layer's forward GEMM alone in FP4


def machine() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "loadavg_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None}


def mean_se(values: list[float]) -> tuple[float, float]:
    """The mean and its standard error (0 for a single value)."""
    return statistics.mean(values), statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0


def scale_block_rows() -> list[dict]:
    """The committed rows of bench scale --blocks (the tiny preset's per-block truths), [] without the file."""
    path = ROOT / "bench" / "results" / "cpu-planner-scale-blocks.json"
    return json.loads(path.read_text())["rows"] if path.exists() else []


def results_json(payload: dict) -> str:
    """`payload` as indented JSON, except that each raw run under "runs" is one compact line: the runs
    (every re-plan's per-GEMM precisions) are most of a quality grid's bytes, and indenting them
    tripled the committed results."""
    runs = payload.get("runs")
    rest = {k: v for k, v in payload.items() if k != "runs"}
    if not isinstance(runs, dict) or not runs:
        return json.dumps(payload, indent=1)
    lines = [f"  {json.dumps(key)}: {json.dumps(run, separators=(',', ':'))}" for key, run in runs.items()]
    head = json.dumps(rest, indent=1)[:-2] + "," if rest else "{"
    return head + '\n "runs": {\n' + ",\n".join(lines) + "\n }\n}"


def write(name: str, payload: dict, markdown: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    argv = list(sys.argv)
    if "--results" in argv:  # where the files went is not how they were made
        del argv[argv.index("--results"):argv.index("--results") + 2]
    payload = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": " ".join(argv),
               "machine": machine(), **payload}
    (RESULTS / f"cpu-planner-{name}.json").write_text(results_json(payload))
    (RESULTS / f"cpu-planner-{name}.md").write_text(
        f"# planner bench: {name}\n\n{payload['date']} | `{payload['command']}` | {payload['machine']}\n\n{markdown}\n")
    print(markdown)


# ---------------------------------------------------------------------------------------------
# the checkpoint and continuing from it
# ---------------------------------------------------------------------------------------------
def checkpoint_path(steps: int, preset: str) -> Path:
    return CACHE / f"ckpt-{preset}-{steps}-lr{LRS[preset]:g}.pt"


@functools.lru_cache(maxsize=4)
def checkpoint(steps: int = PRE_STEPS, preset: str = "tiny") -> dict:
    """The bf16 `preset` model after `steps` steps (constant lr after warmup, seed 1234), with its AdamW state:
    checkpoints of one trajectory at different steps are its training phases. Loaded once per process
    (a worker trains many branches from it); callers copy what they change (`continue_from`)."""
    path = checkpoint_path(steps, preset)
    if path.exists():
        return torch.load(path)
    CACHE.mkdir(parents=True, exist_ok=True)
    box = {}
    summary = train(TrainConfig(**{**RUN, "preset": preset}, steps=steps, lr=LRS[preset], min_lr_ratio=1.0,
                                warmup_steps=PRE_WARMUP if steps > PRE_WARMUP else steps // 2, seed=1234,
                                eval_interval=0,
                                on_setup=lambda m, o: box.update(model=m, opt=o)))
    ckpt = {"preset": preset, "steps": steps, "model": box["model"].state_dict(), "optimizer": box["opt"].state_dict(),
            "val_loss": summary["final_val_loss"], "time_s": summary["time_s"]}
    torch.save(ckpt, path)
    return ckpt


@functools.lru_cache(maxsize=8)
def numerics(phase: int, preset: str = "tiny", threads: int = 1) -> str:
    """A digest of the bits this process trains with from the `phase`-step checkpoint of `preset`: one step's loss and
    gradients on the calibration batch, under `threads` torch threads (1: as the quality grid's workers train).
    Branches are paired only when trained under one digest: another CPU's kernels (vector width, BLAS blocking) move
    every branch, and a checkpoint trained on another CPU lands elsewhere (tiny's bf16 branches: 5e-5 nats apart from
    the 100-step checkpoints of two x86 machines, 0.004 from the 400- and 1200-step ones), which the same batches no
    longer cancel."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model, _, _ = model_at(checkpoint(phase, preset))
        loss = model.loss(calibration_batch())
        loss.backward()
    finally:
        torch.set_num_threads(before)
    digest = hashlib.sha256()
    for t in (loss.detach(), *(p.grad for p in model.parameters())):
        digest.update(t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def check_paired(runs: dict[str, dict], what: str) -> None:
    """Fail unless the cached runs {key: result} that one paired comparison subtracts were trained under one `numerics`
    digest (a run cached before the bench recorded it counts as a digest of its own)."""
    by_digest = collections.defaultdict(list)
    for key, r in sorted(runs.items()):
        by_digest[r.get("numerics", "not recorded")].append(key)
    if len(by_digest) > 1:
        kinds = "; ".join(f"{d}: {len(keys)} ({keys[0]}, ...)" for d, keys in sorted(by_digest.items()))
        raise SystemExit(f"{what}: runs trained under different numerics (another machine or checkpoint) are not "
                         f"paired, and a paired comparison needs them all: {kinds}. Train them in a cache of their own "
                         "(SNIP_BENCH_CACHE)")


def check_trainable_beside(cached: dict[str, dict], preset: str, phase: int, seed: int) -> None:
    """Before training runs from `preset`'s `phase`-step checkpoint on `seed`'s batches: the cached runs {key: result}
    they will be paired with were trained under this process's numerics."""
    check_paired({**cached, "(this machine's runs to train)": {"numerics": numerics(phase, preset)}},
                 f"{preset}, checkpoint {phase}, seed {seed}")


# the entry of a paired cache (scale, schedule, swap, bench_forward_train's routes) that records, per checkpoint
# "preset/phase", the `numerics` its runs were trained under
CACHE_NUMERICS = "numerics"


def read_cache(path: Path) -> dict:
    """A bench's cache of runs {key: result}, {} before the first run."""
    return json.loads(path.read_text()) if path.exists() else {}


def check_cache_numerics(done: dict, path: Path, phase: int, preset: str = "tiny") -> None:
    """Before a run from `preset`'s `phase`-step checkpoint is trained into `done` (the cache read from `path`), whose
    results the bench subtracts from each other: the runs it holds from that checkpoint were trained under this
    process's `numerics` (at its torch threads), which `done` records for the cache's next write. A cache that holds
    runs but no record was written before the bench kept one: its runs' numerics are unknown, so none is trained beside
    them."""
    if done and CACHE_NUMERICS not in done:
        raise SystemExit(f"{path}: its runs carry no record of the numerics they were trained under (cached before the "
                         "bench kept one), and a paired difference needs them all trained under one. Train them in a "
                         "cache of their own (SNIP_BENCH_CACHE)")
    checkpoint_key, mine = f"{preset}/{phase}", numerics(phase, preset, torch.get_num_threads())
    recorded = done.setdefault(CACHE_NUMERICS, {})
    if recorded.setdefault(checkpoint_key, mine) != mine:
        raise SystemExit(f"{path}: its runs from {preset}'s {phase}-step checkpoint were trained under numerics "
                         f"{recorded[checkpoint_key]}, this process trains under {mine} (another machine, checkpoint or "
                         "thread count), and runs of two are not paired. Train them in a cache of their own "
                         "(SNIP_BENCH_CACHE)")


def branch_config(ckpt: dict, steps: int, seed: int, evals: int = 4, eval_batches: int = RUN["eval_batches"],
                  precision=None) -> TrainConfig:
    """The TrainConfig of a branch of `steps` steps from the checkpoint (the callbacks aside): the preset's lr
    decaying along a cosine to a tenth of it at the last step; every evaluation (`evals` of them, plus the one at
    the start) averages `eval_batches` validation batches."""
    return TrainConfig(**{**RUN, "preset": ckpt.get("preset", "tiny"), "eval_batches": eval_batches},
                       steps=steps, lr=preset_lr(ckpt), min_lr_ratio=0.1, warmup_steps=0, seed=seed,
                       eval_interval=max(1, steps // evals) if evals else 0, precision=precision)


def continue_from(ckpt: dict, steps: int, seed: int, precision=None, hooks=None, evals: int = 4,
                  constant_steps: int = 0, eval_batches: int = RUN["eval_batches"]) -> dict:
    """Train `steps` more steps from the checkpoint (`branch_config`), return the summary. With `constant_steps`
    the learning rate stays at the preset's for that many steps first, then decays."""
    box = {}

    def on_setup(model, opt):
        opt.load_state_dict(copy.deepcopy(ckpt["optimizer"]))  # AdamW would step the checkpoint's tensors in place
        box["opt"] = opt
        if hooks is not None:
            hooks.on_setup(model, opt)

    def prepare(model):
        model.load_state_dict(ckpt["model"])
        return model

    def on_step(step, model, batch):
        if constant_steps:  # the loop set the cosine lr of the whole branch: hold it first, decay after
            t = min(1.0, max(0, step - constant_steps) / max(1, steps - 1 - constant_steps))
            lr = preset_lr(ckpt)
            min_lr = lr * 0.1
            for g in box["opt"].param_groups:
                g["lr"] = min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * t))
        if hooks is not None:
            hooks.on_step(step, model, batch)

    cfg = branch_config(ckpt, steps, seed, evals, eval_batches, precision)
    return train(dataclasses.replace(cfg, prepare_model=prepare, on_setup=on_setup, on_step=on_step))


def model_at(ckpt: dict):
    model = convert(Llama(LlamaConfig.preset(ckpt.get("preset", "tiny"))))
    model.load_state_dict(ckpt["model"])
    params = list(model.parameters())  # the same two groups as snip_train.train (decay / no decay)
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2]},
                             {"params": [p for p in params if p.dim() < 2]}], lr=preset_lr(ckpt))
    opt.load_state_dict(copy.deepcopy(ckpt["optimizer"]))  # also restores betas, eps, weight decay
    return model, opt, {n: m for n, m in model.named_modules() if isinstance(m, SnipLinear)}


def calibration_batch(seed: int = 7) -> torch.Tensor:
    data = TokenData.from_path(None, max_bytes=RUN["max_bytes"])
    return data.get_batch("train", RUN["batch_size"], RUN["seq_len"], torch.Generator().manual_seed(seed))


def stats_at(ckpt: dict, draws: int, candidates=("fp8", "fp4"), method: str = "auto",
             wd_units: str = "loss", wd_horizon: int | None = None, calibration_seed: int = 7,
             ld_form: str = "isotropic") -> PlannerStats:
    """The planner's statistics at the checkpoint, as SnipPlanner measures them (the Fisher curvature from
    the logits unless `method` says otherwise)."""
    model, opt, layers = model_at(ckpt)
    config = DivergenceConfig(draws=draws, method=method, wd_units=wd_units, wd_horizon=wd_horizon, ld_form=ld_form,
                              wgrad_signal_share=wd_units == "loss")  # the share scales an excess loss only
    return measure(model, layers, opt, calibration_batch(calibration_seed), lambda m, b: m.loss(b), candidates,
                   StatsConfig(), config, logits_fn=lm_logits)


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


def measurement_cost(model, opt, layers, batch, reps: int) -> dict:
    """One training step (bf16) against one planner measurement at the planner's default settings (Fisher
    curvature from the logits, 2 draws, WD over the default re-plan interval; with the default ILP solve
    after it, a whole re-plan), with the directional LD and with the batched Hessian curvature (the horizon's
    diagonal then from a half-batch gradient), interleaved `reps` times: the fastest of each (the machine is
    shared; interleaving exposes all of them to the same load)."""
    planner = PlannerConfig()
    default = planner.divergence_config
    configs = {"default": default, "directional_ld": dataclasses.replace(default, ld_form="directional"),
               "batched_hessian": dataclasses.replace(default, method="batched")}
    times = {"bf16_step_s": [], **{f"measure_{k}_s": [] for k in configs}, "solve_default_s": []}
    breakdown = {}
    for _ in range(reps):
        times["bf16_step_s"].append(step_time(model, opt, batch, reps=2))
        for label, config in configs.items():
            t = time.perf_counter()
            s = measure(model, layers, opt, batch, lambda m, b: m.loss(b), planner.candidates, StatsConfig(), config,
                        logits_fn=lm_logits)
            times[f"measure_{label}_s"].append(time.perf_counter() - t)
            breakdown[label] = {k: v for k, v in s.diagnostics.items() if k.startswith("time_")}
            if label == "default":  # the rest of a re-plan: the ILP at the default budget and granularity
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
    """measurement_cost on `preset` with the batch of the quality runs, 3 AdamW steps in (the optimizer has
    state, as when the planner re-plans)."""
    torch.manual_seed(0)
    model = convert(Llama(LlamaConfig.preset(preset)))
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2]},
                             {"params": [p for p in params if p.dim() < 2]}], lr=LRS[preset])
    batch = calibration_batch()
    step_time(model, opt, batch, reps=2)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, SnipLinear)}
    return {"params": sum(p.numel() for p in params), **measurement_cost(model, opt, layers, batch, reps)}


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
    md = ["", "## Measurement vs one training step (batch 8 x 128, CPU, 1 thread; fastest of interleaved repeats, "
          "since the machine may be shared)" + provenance, "",
          "| preset | parameters | bf16 step s | measurement s (default: Fisher) | ratio | + ILP solve s | re-plan "
          "ratio | measurement s (directional LD) | ratio | measurement s (batched Hessian) | ratio |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for preset, t in timing.items():
        if not isinstance(t, dict) or "solve_default_s" not in t:  # an earlier layout of this file
            continue
        md.append(f"| {preset} | {t['params'] / 1e6:.2f}M | {t['bf16_step_s']:.3f} | {t['measure_default_s']:.3f} | "
                  f"{t['measure_default_over_bf16_step']:.2f}x | {t['solve_default_s']:.3f} | "
                  f"{t['replan_default_over_bf16_step']:.2f}x | "
                  + (f"{t['measure_directional_ld_s']:.3f} | {t['measure_directional_ld_over_bf16_step']:.2f}x | "
                     if "measure_directional_ld_s" in t else "- | - | ")
                  + f"{t['measure_batched_hessian_s']:.3f} | "
                  f"{t['measure_batched_hessian_over_bf16_step']:.2f}x |")
    return md + ["", "```", json.dumps(timing, indent=1), "```"]


def bench_cost(args) -> None:
    ilp = ilp_timing()
    if args.ilp_only:  # keep the measurement section, and say when and how it was made
        old = json.loads((RESULTS / "cpu-planner-cost.json").read_text())
        made = old.get("measurement_made") or {k: old[k] for k in ("date", "command", "machine")}
        md = ilp_markdown(ilp) + measurement_markdown(
            old["measurement"], f"; measured {made['date']} by `{made['command']}`")
        write("cost", {"ilp": ilp, "measurement": old["measurement"], "measurement_made": made}, "\n".join(md))
        return
    timing = {preset: preset_cost(preset, args.reps or {"tiny": 5}.get(preset, 3)) for preset in args.presets}
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
    if not vals:  # every resample was all ties (a handful of layers)
        return [float("nan"), float("nan")]
    return [vals[int(0.05 * len(vals))], vals[int(0.95 * len(vals)) - 1]]


def fp4_forward_loss_changes(model, layers, batches, sets: dict[str, list[str]]) -> dict[str, list[float]]:
    """{set name: [loss with the set's layers' forward GEMMs in FP4 (round to nearest) minus bf16, per batch]}, every
    other GEMM in bf16; the layers' precisions are put back after."""
    out = {}
    with torch.no_grad(), high_precision(layers):
        base = [float(model.loss(x)) for x in batches]
        for key, names in sets.items():
            for n in names:
                layers[n].set_precision(FP4_FORWARD)
            try:
                out[key] = [float(model.loss(x)) - b for x, b in zip(batches, base)]
            finally:
                for n in names:
                    layers[n].set_precision("bf16")
    return out


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
    the steps ("train") and the final validation-loss increase ("val"). Cached per (kind, steps)."""
    cache = CACHE / f"validity-{kind}-{steps}.json"  # {"seed/layer": {"train": d, "val": d}}
    done = read_cache(cache)
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
                cache.write_text(json.dumps(done))
                print(f"{kind} seed {seed} {n}: train {done[key]['train']:+.5f} val {done[key]['val']:+.5f}",
                      flush=True)
            for k in ("train", "val"):
                truth[n][k].append(done[key][k])
    return truth


ESTIMATORS = (("fisher", 1), ("fisher", 2), ("fisher", 8), ("batched", 1), ("batched", 2), ("batched", 8))
WD_LAMBDAS = (0.0, 0.1, 0.3, 1.0, 3.0, 10.0)


def bench_validity(args) -> None:
    ckpt = checkpoint(args.pre_steps)
    # the planner's statistics, per loss-curvature estimator and number of draws (WD in loss units), and the
    # earlier update-unit WD for comparison
    stats = {(m, d): stats_at(ckpt, d, method=m) for m, d in ESTIMATORS}
    update_units = stats_at(ckpt, 2, method="batched", wd_units="update")
    names = [s.name for s in update_units.layers][:args.layers]
    # ground truth 1: forward-only loss increase, fprop of one layer in fp4, on 8 validation batches
    model, _, layers = model_at(ckpt)
    data = TokenData.from_path(None, max_bytes=RUN["max_bytes"])
    gen = torch.Generator().manual_seed(0x5EED)
    val = [data.get_batch("val", RUN["batch_size"], RUN["seq_len"], gen) for _ in range(8)]

    def val_losses():
        with torch.no_grad():
            return [float(model.loss(b)) for b in val]
    base = val_losses()
    fwd = fp4_forward_loss_changes(model, layers, val, {n: [n] for n in names})  # per layer, per batch (RNE)
    fwd_sr = {}  # per layer, per draw
    # (a') the same with the fprop operands stochastically rounded (unbiased noise, fresh bits per
    # forward), averaged over SR_DRAWS passes: the quantity LD estimates, E[L(y + noise)] - L(y),
    # without the first-order term g . delta of one fixed round-to-nearest perturbation.
    fp4 = recipe("fp4")
    fp4_sr = dataclasses.replace(fp4, name="fp4_sr", act=dataclasses.replace(fp4.act, rounding=Rounding.SR),
                                 weight=dataclasses.replace(fp4.weight, rounding=Rounding.SR))
    for n in names:
        layers[n].set_precision(LinearPrecision(fprop=fp4_sr, dgrad="bf16", wgrad="bf16"))
        fwd_sr[n] = [statistics.mean(val_losses()) - statistics.mean(base) for _ in range(SR_DRAWS)]
        layers[n].set_precision("bf16")
    first = first_order_terms(model, layers, names, val)
    # ground truth 2: K training steps with one layer's three GEMMs in fp4, minus the same in bf16;
    # ground truth 3: the same with only its dgrad and wgrad in fp4 (the fprop in bf16): the backward's
    # own effect, which WD claims to measure
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
    default = stats[("fisher", DivergenceConfig().draws)]
    by = default.by_name()
    ld = [by[n].ld("fp4") / default.loss for n in names]
    wd = [by[n].wd("fp4") / default.loss for n in names]
    wd_update = [update_units.by_name()[n].wd("fp4") for n in names]
    wd_validity = {
        f"spearman_{label}_vs_{k}": spearman(values, column(truths[k]))
        for label, values in (("WD_loss_units", wd), ("WD_update_units", wd_update), ("LD", ld))
        for k in ("backward_trained", "backward_final_val", "trained")}
    objective = {str(lam): {k: spearman([a + lam * b for a, b in zip(ld, wd)], column(truths[k]))
                            for k in ("trained", "final_val")} for lam in WD_LAMBDAS}
    objective["WD only"] = {k: spearman(wd, column(truths[k])) for k in ("trained", "final_val")}
    bootstrap = {k: bootstrap_spearman([a + DEFAULT_LAMBDA * b for a, b in zip(ld, wd)], column(truths[k]))
                 for k in ("trained", "backward_trained")}
    rows = [{"layer": n, "LD/L": a, "WD/L": b, "WD_update_units": c, **{f"{k}_truth": t[n] for k, t in truths.items()},
             "first_order_term": first_mean[n], "per_seed_all": both[n], "per_seed_backward": backward[n]}
            for n, a, b, c in zip(names, ld, wd, wd_update)]
    md = [f"Checkpoint: tiny model, {args.pre_steps} bf16 steps (val loss {ckpt['val_loss']:.4f}). Ground truths, fp4 on one "
          "layer at a time:",
          "(a) forward-only loss increase on 8 validation batches (fprop in fp4, round to nearest);",
          "(a-1) (a) minus its first-order term g_l . (Q(y_l) - y_l), computed per batch with the bf16 gradient;",
          f"(a') forward-only with stochastically rounded fprop operands, mean of {SR_DRAWS} passes with fresh bits "
          "(the quantity LD estimates: E[L(y + noise)] - L(y));",
          f"(b) 'trained': mean training-loss increase over {args.steps} steps from the checkpoint (all three GEMMs "
          f"in fp4), paired with bf16 on the same batches, mean over seeds {args.seeds}; (c) 'final_val': final "
          "validation-loss increase of the same runs;",
          "(d) 'backward_trained' / 'backward_final_val': the same with only dgrad and wgrad in fp4 (fprop bf16): "
          "the backward-only ground truth for WD.", "",
          "## Reliability of the truths", "",
          "Split-half reliability: Spearman between the truth's means over two halves of its readings (validation "
          "batches 0-3 vs 4-7; SR draws; seeds): how reproducible its ranking is, roughly the ceiling for any "
          "metric's correlation with it.", "", "| truth | split-half reliability |", "|---|---|"]
    md += [f"| {k} | {v:.3f} |" for k, v in reliability.items()]
    md += ["", "## Loss curvature estimators (LD = h e_fwd, fp4)", "",
           "| estimator | Spearman vs fwd-only SR | vs fwd-only minus 1st order | vs trained | vs final val | "
           "layers with h <= 0 | LD time s | whole measurement s |", "|---|---|---|---|---|---|---|---|"]
    for label, e in estimators.items():
        c = e["spearman_LD_vs"]
        md.append(f"| {label} | {c['forward_only_sr']:.3f} | {c['forward_only_minus_first_order']:.3f} | "
                  f"{c['trained']:.3f} | {c['final_val']:.3f} | {e['layers_with_curvature_<=_0']} of {len(names)} | "
                  f"{e['time_loss_divergence_s']:.2f} | {e['time_measure_s']:.2f} |")
    md += ["", "## Weight divergence against the backward-only truth (fisher, 2 draws)", "",
           "| metric | vs backward trained | vs backward final val | vs trained (all GEMMs) |", "|---|---|---|---|"]
    for label in ("WD_loss_units", "WD_update_units", "LD"):
        md.append(f"| {label} | {wd_validity[f'spearman_{label}_vs_backward_trained']:.3f} | "
                  f"{wd_validity[f'spearman_{label}_vs_backward_final_val']:.3f} | "
                  f"{wd_validity[f'spearman_{label}_vs_trained']:.3f} |")
    md += ["", "## The objective LD/L + lambda WD/L against the all-GEMM truths", "",
           "| lambda | vs trained | vs final val |", "|---|---|---|"]
    md += [f"| {lam} | {v['trained']:.3f} | {v['final_val']:.3f} |" for lam, v in objective.items()]
    md += ["", f"Bootstrap 90% interval of Spearman at lambda {DEFAULT_LAMBDA:g}: " + json.dumps(bootstrap), "",
           "| layer | LD/L | WD/L | WD (update units) | fwd-only SR | trained | final val | backward trained | "
           "backward final val |", "|---|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['layer']} | {r['LD/L']:.3e} | {r['WD/L']:.3e} | {r['WD_update_units']:.3e} | "
           f"{r['forward_only_sr_truth']:+.6f} | {r['trained_truth']:+.5f} | {r['final_val_truth']:+.5f} | "
           f"{r['backward_trained_truth']:+.5f} | {r['backward_final_val_truth']:+.5f} |" for r in rows]
    write("validity", {"steps": args.steps, "seeds": args.seeds, "checkpoint_val_loss": ckpt["val_loss"],
                       "reliability": reliability, "estimators": estimators, "wd_validity": wd_validity,
                       "objective_vs_lambda": objective, "bootstrap_at_default_lambda": bootstrap, "layers": rows,
                       "stats": {f"{m}_draws{d}": s.to_json() for (m, d), s in stats.items()},
                       "stats_update_units": update_units.to_json()}, "\n".join(md))


def bench_wgrad_error(args) -> None:
    """e_wgrad from the planner's row sample against the whole batch's, at each checkpoint: the sample's own
    relative error (before the scaling of planner/qerror.py) and the scaled estimate, each as a ratio to
    the error of the wgrad over every row of the calibration batch, per layer, FP4."""
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
    write("wgrad-error", {"preset": args.preset, "seeds": args.seeds, "rows": rows}, "\n".join(md))


def in_block(name: str, block: int | None) -> bool:
    """Whether layer `name` is in transformer block `block` (None: every layer is)."""
    return block is None or block_index(name) == block


class AmplifiedError:
    """Hooks for `continue_from`: every planned linear layer (those `convert` swaps, kept in bf16) computes one of
    its GEMMs exactly and adds `amplify` times the error that GEMM makes under `precision` on the same operands (the
    layer's own stochastic-rounding bits, fresh every step; in evaluation too for fprop). `amplify` 1 is that GEMM in
    `precision` in every layer; larger factors keep the error's structure and multiply its energy by amplify^2: a
    ground truth of LD (fprop) or WD (dgrad, wgrad) that runs of a hundred steps resolve. With `in_evaluation`
    False the forward error is added in the training steps only (evaluation is exact): what it costs through the
    trajectory, the gradients it perturbs, which LD (the loss of the forward error itself) does not price."""

    def __init__(self, gemm: str, precision: str, amplify: float, in_evaluation: bool = True, block: int | None = None):
        if gemm not in GEMMS:
            raise ValueError(f"gemm must be one of {GEMMS}, got {gemm!r}")
        if not in_evaluation and gemm != "fprop":
            raise ValueError(f"only the forward GEMM runs in evaluation: in_evaluation=False is for fprop, not {gemm!r}")
        self.gemm, self.recipe, self.amplify, self.step = gemm, recipe(precision), amplify, 0
        self.in_evaluation, self.block = in_evaluation, block  # block: that transformer block's layers only
        self.enabled = True  # off: every GEMM exact (the exact gradient on the same weights, bench_forward_train.py)

    def on_setup(self, model, opt) -> None:
        convert(model)  # bf16: the same numbers as the unconverted model (and the same layers as the planner's)
        add = {"fprop": self._fprop, "dgrad": self._dgrad, "wgrad": self._wgrad}[self.gemm]
        for name, module in model.named_modules():
            if isinstance(module, SnipLinear) and in_block(name, self.block):
                add(module, layer_seed(name))

    def on_step(self, step, model, batch) -> None:
        self.step = step

    def _fprop(self, module, seed: int) -> None:
        def hook(mod, args, out):
            if not self.enabled or not (self.in_evaluation or torch.is_grad_enabled()):  # evaluation: no autograd
                return out
            x = args[0].detach().reshape(-1, mod.in_features).float()
            w = mod.weight.detach().float()
            error = snip_gemm.fprop(x, w, self.recipe, seed=seed, offset=self.step, emulate=True) - snip_gemm.fp32_mm(x, w.t())
            return out + (self.amplify * error).reshape(out.shape).to(out.dtype)
        module.register_forward_hook(hook)

    def _dgrad(self, module, seed: int) -> None:
        def hook(mod, grad_input, grad_output):
            if not self.enabled:
                return grad_input
            dy = grad_output[0].detach().reshape(-1, mod.out_features).float()
            w = mod.weight.detach().float()
            error = snip_gemm.dgrad(dy, w, self.recipe, seed=seed, offset=self.step, emulate=True) - snip_gemm.fp32_mm(dy, w)
            dx = grad_input[0]
            return (dx + (self.amplify * error).reshape(dx.shape).to(dx.dtype),) + tuple(grad_input[1:])
        module.register_full_backward_hook(hook)

    def _wgrad(self, module, seed: int) -> None:
        operands = {}

        def keep(mod, args, out):
            if out.requires_grad:  # not in evaluation
                operands["x"] = args[0].detach().reshape(-1, mod.in_features).float()
                out.register_hook(lambda g: operands.update(dy=g.detach().reshape(-1, mod.out_features).float()))

        def add_error(grad):
            if not self.enabled:
                return grad
            dy, x = operands["dy"], operands["x"]
            error = snip_gemm.wgrad(dy, x, self.recipe, seed=seed, offset=self.step, emulate=True) - snip_gemm.fp32_mm(dy.t(), x)
            return grad + (self.amplify * error).to(grad.dtype)
        module.register_forward_hook(keep)
        module.weight.register_hook(add_error)


# bench scale's targets: a GEMM whose error is amplified, and "fprop_train", the forward error in the training steps
# only (evaluation exact), priced against LD too: the part of the forward error's cost that comes through the trajectory
SCALE_TARGETS = {**{g: (g, True) for g in GEMMS}, "fprop_train": ("fprop", False)}


def bench_scale(args) -> None:
    """LD's and WD's size against ground truths at every layer at once (one layer's effect is below the noise of
    these runs): from each checkpoint, `steps` steps with every layer's fprop, dgrad or wgrad error under FP4
    amplified k times (AmplifiedError, k in `amplify`), paired with bf16 per seed, against k^2 times the planner's
    LD (fprop) or WD (dgrad, wgrad) of that GEMM in FP4 summed over the layers, measured at the checkpoint, WD with
    the horizon of the whole run along its learning rates (the planner's WD over its re-plan interval is the same
    thing for one interval). The validation loss is that of the model as trained, its forward error included
    (fprop). Two factors give the measured exponent of the gap in k: 2 where the loss is quadratic in the error, as
    LD and WD assume, and larger where a bigger error starts to cost out of proportion. Target "fprop_train" (with
    `--gemms`): the forward error in training only, evaluated exactly; against fprop's, the share of its cost that
    the perturbed trajectory carries and LD, the loss of the error itself, leaves out. With `--blocks` each block's
    layers alone, against that block's LD / WD: how the cost divides among the blocks."""
    # {"phase/bf16/seed": val loss, "phase/target/k/seed[/block<b>]": gap}
    cache = CACHE / f"scale-{args.steps}.json"
    done = read_cache(cache)
    rows = []
    for phase in args.phases:
        ckpt = checkpoint(phase)
        lrs = learning_rates(branch_config(ckpt, args.steps, 0))
        config = DivergenceConfig(wd_horizon=args.steps, wgrad_signal_share=False)  # the share is a column of its own

        def stats_of(state: dict) -> PlannerStats:
            model, opt, layers = model_at(state)
            return measure(model, layers, opt, calibration_batch(), lambda m, b: m.loss(b), ("fp4",), StatsConfig(),
                           config, logits_fn=lm_logits, lr_ratios=[lrs(s) / lrs(0) for s in range(args.steps)])
        # at the branch's start, and `steps` later on the bf16 trajectory (constant lr): how stale the first is
        stats, later = stats_of(ckpt), stats_of(checkpoint(phase + args.steps))
        if "wgrad" in args.gemms:  # the layers' signal fractions at the checkpoint, as the planner measures them
            model, opt, layers = model_at(ckpt)
            signal = signal_fractions(record(model, layers, calibration_batch(), lambda m, b: m.loss(b), opt,
                                             StatsConfig(), sequence_grads=True), layers)
        for target, block in itertools.product(args.gemms, args.blocks or [None]):
            gemm, in_evaluation = SCALE_TARGETS[target]
            unit, unit_later = (sum(s.ld("fp4") if gemm == "fprop" else s.wd("fp4", gemm) for s in st.layers
                                    if in_block(s.name, block)) for st in (stats, later))
            # the signal share of Adam's v over these layers, the planner's factor on their wgrad WD
            share = (weighted_signal_share({n: f for n, f in signal.items() if in_block(n, block)},
                                           {s.name: s.s_wgrad for s in stats.layers}, {s.name: s.errors for s in stats.layers})
                     if gemm == "wgrad" else None)
            per_factor = []
            for k in args.amplify:
                gaps = []
                for seed in args.seeds:
                    key = f"{phase}/{target}/{k:g}/{seed}" + ("" if block is None else f"/block{block}")
                    if key not in done:
                        check_cache_numerics(done, cache, phase)
                        ref = f"{phase}/bf16/{seed}"
                        if ref not in done:
                            done[ref] = continue_from(ckpt, args.steps, seed, evals=1,
                                                      eval_batches=args.eval_batches)["final_val_loss"]
                        hooks = AmplifiedError(gemm, "fp4", k, in_evaluation, block)
                        noisy = continue_from(ckpt, args.steps, seed, hooks=hooks, evals=1,
                                              eval_batches=args.eval_batches)["final_val_loss"]
                        done[key] = noisy - done[ref]
                        cache.write_text(json.dumps(done))
                        print(f"{key}: gap {done[key]:+.5f}", flush=True)
                    gaps.append(done[key])
                mean = statistics.mean(gaps)
                per_factor.append({"phase": phase, "gemm": target, "block": block, "amplify": k, "predicted": k ** 2 * unit,
                                   "predicted_later": k ** 2 * unit_later, "gaps": gaps, "mean_gap": mean,
                                   "standard_error": statistics.stdev(gaps) / math.sqrt(len(gaps)) if len(gaps) > 1 else 0.0,
                                   "ratio": mean / (k ** 2 * unit) if unit else float("nan"), "signal_share": share})
            if len(per_factor) > 1:
                lo, hi = per_factor[0], per_factor[-1]
                ok = lo["mean_gap"] > 0 and hi["mean_gap"] > 0
                hi["exponent"] = (math.log(hi["mean_gap"] / lo["mean_gap"]) / math.log(hi["amplify"] / lo["amplify"])
                                  if ok else float("nan"))
            rows += per_factor
    md = [f"Tiny preset; from each bf16 checkpoint, {args.steps} steps (cosine decay to lr/10) with every planned "
          f"layer's fprop, dgrad or wgrad error under FP4 amplified k = {', '.join(f'{k:g}' for k in args.amplify)} times "
          f"(its own structure and stochastic-rounding bits, energy x k^2; the other two GEMMs exact), seeds {args.seeds}, "
          f"each paired with bf16 on the same batches; gap: final validation loss ({args.eval_batches} batches, fprop "
          "error included) minus bf16's. Predicted: k^2 x the sum over layers of the planner's LD (fprop) or WD (dgrad, "
          f"wgrad) of that GEMM in FP4, measured at the checkpoint (WD within the run's {args.steps} steps along its "
          f"learning rates); 'later': the same measured {args.steps} steps further along the bf16 trajectory (constant "
          "lr), near where the runs end. Exponent: of the measured gap in k between the smallest and the largest k (2: "
          "quadratic, as LD and WD assume)."
          + (" fprop_train: the forward error in the training steps only, the evaluation exact (the weights are those of "
             "the fprop run, bit for bit): the forward error's cost through the trajectory, priced against LD."
             if "fprop_train" in args.gemms else "")
          + (f" Per block (--blocks): the error in one transformer block's layers only, priced by that block's LD / WD; "
             f"measured / later: against the block's price {args.steps} steps on." if args.blocks else "")
          + (" Signal share (wgrad): the share mu^2 / v of Adam's second moment that is signal, over the layers weighted "
             "by their wgrad WD at the checkpoint (the planner's factor, divergence.signal_fractions on the calibration "
             "batch's sequences); / share: measured over predicted x share, 1 where Adam's normalisation is what WD misses."
             if "wgrad" in args.gemms else ""), "",
          "| checkpoint | GEMM | " + ("block | " if args.blocks else "") + "k | predicted (nats) | predicted later | "
          "measured gap: mean +- SE | per seed | measured / predicted | " + ("measured / later | " if args.blocks else "")
          + "signal share | measured / (predicted x share) | exponent |",
          "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if args.blocks else "")]
    md += [f"| {r['phase']} | {r['gemm']} | " + (f"{r['block']} | " if args.blocks else "")
           + f"{r['amplify']:g} | {r['predicted']:.4f} | {r['predicted_later']:.4f} | "
           f"{r['mean_gap']:+.4f} +- {r['standard_error']:.4f} | " + ", ".join(f"{g:+.4f}" for g in r["gaps"])
           + f" | {r['ratio']:.2f} | " + (f"{r['mean_gap'] / r['predicted_later']:.2f} | " if args.blocks else "")
           + ("- | - | " if r["signal_share"] is None else f"{r['signal_share']:.3f} | "
              + (f"{r['ratio'] / r['signal_share']:.2f} | " if r["signal_share"] > 0 else "inf | "))
           + (f"{r['exponent']:.1f}" if "exponent" in r else "") + " |" for r in rows]
    write(args.name, {"steps": args.steps, "amplify": args.amplify, "seeds": args.seeds, "gemms": args.gemms,
                      "blocks": args.blocks, "rows": rows}, "\n".join(md))


def bench_horizon(args) -> None:
    """WD over the default horizon (the re-plan interval) with the Gauss-Newton diagonal of the Fisher draws
    against the one a model without logits gets, from the half-batch gradient variance: per checkpoint, the
    Spearman correlation of the layers' WD sensitivities, their median ratio, and how many GEMMs the per-GEMM
    plans agree on when LD (the Fisher one) is the same and only WD differs."""
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
    write("horizon", {"interval": args.interval, "budgets": args.budgets, "rows": rows}, "\n".join(md))


def bench_staleness(args) -> None:
    """How stale a plan goes within a re-plan interval: the plan made at a checkpoint (the planner's defaults,
    per GEMM, WD over `interval` steps) against the statistics `offset` steps later on the same bf16
    trajectory, as the regret of the drift trigger (planner.schedule): F(old) / F(new) - 1 under the later
    statistics. Offset 0 measures on another calibration batch at the same step: the estimator's own
    floor. Also each transformer block's share of the total LD and its growth."""
    def block_ld(stats: PlannerStats) -> dict[int, float]:  # each block's LD/L in FP4
        out = collections.defaultdict(float)
        for layer in stats.layers:
            out[block_index(layer.name)] += layer.ld("fp4") / stats.loss
        return out

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
    write("staleness", {"interval": args.interval, "budgets": args.budgets, "offsets": args.offsets, "rows": rows},
          "\n".join(md))


# ---------------------------------------------------------------------------------------------
# plan quality
# ---------------------------------------------------------------------------------------------
# The heuristics of planner.baselines that the quality bench compares SNIP with (uniform_fp8 is no contender).
HEURISTICS = ("uniform_fp4", "first_last", "layer_type", "min_rel_error", "min_abs_error", "random")
# SNIP as the paper has it (WD settled), its two terms alone and a smaller weight of WD (the ablation), as
# PlannerConfig fields; snip_horizon: WD as the excess loss within one re-plan interval; snip_signal: that with
# wgrad's WD times Adam's signal share (divergence.py, "Adam's signal share"); snip_dir: that with the directional LD
# (divergence.py, "Directional LD"); snip_end: snip_signal with WD as the excess loss the plan's noise leaves at the
# branch's end (wd_horizon "run_end", planner.horizon). The planner's defaults are snip_signal_gemm; snip_signal_gemm
# and snip_lrs_gemm are planned as `snip train` plans, along the run's learning rates. Every variant but snip_signal
# and the ones built on it prices wgrad without the signal share, as the planner did before it.
WITHOUT_SIGNAL_SHARE = {"divergence": DivergenceConfig(wgrad_signal_share=False)}
SNIP_VARIANTS = {"snip": WITHOUT_SIGNAL_SHARE, "snip_ld": {"terms": "ld", **WITHOUT_SIGNAL_SHARE},
                 "snip_wd": {"terms": "wd", **WITHOUT_SIGNAL_SHARE}, "snip_lam0.1": {"lam": 0.1, **WITHOUT_SIGNAL_SHARE},
                 **{m: {"wd_horizon": "interval", **WITHOUT_SIGNAL_SHARE}
                    for m in ("snip_horizon", "snip_lrs", "snip_cal", "snip_oracle")},
                 **{m: {"wd_horizon": "interval"}
                    for m in ("snip_signal", "snip_trend", "snip_growth", "snip_growth_oracle", "snip_growth_to_end",
                              "snip_share", "snip_struct")},
                 "snip_dir": {"wd_horizon": "interval", "divergence": DivergenceConfig(ld_form="directional")},
                 "snip_end": {"wd_horizon": "run_end"}}
# SNIP variants whose WD horizon follows the branch's learning-rate decay (SnipPlanner's lr_schedule)
LR_SCHEDULED = ("snip_lrs", "snip_cal", "snip_oracle", "snip_signal", "snip_trend", "snip_growth",
                "snip_growth_oracle", "snip_growth_to_end", "snip_share", "snip_struct", "snip_dir", "snip_end")
# snip_cal: snip_lrs with each backward GEMM's WD times the loss it measurably costs per unit of predicted WD,
# relative to LD's (bench scale, bench/results/cpu-planner-scale.md: the geometric mean over the three checkpoints
# of (measured / predicted for the GEMM) / (measured / predicted for fprop) is 1.61-1.68 for dgrad and 0.13-0.16
# for wgrad at 2x-3x amplified FP4 errors). Fit on the tiny preset's checkpoints the quality grid starts from, so
# an in-sample diagnostic of how much of SNIP's gap WD's calibration explains, not a method
CALIBRATED_WD = {"dgrad": 1.65, "wgrad": 0.16}
# snip_oracle: snip_lrs whose LD foresees how each layer's curvature grows while a plan lives. Every re-plan's
# measured curvature is multiplied by that layer's growth along the bf16 trajectory over the branch (its
# curvature at the checkpoint `steps` later over that at the branch's, geometric mean over the calibration
# batches FORESIGHT_BATCHES, FORESIGHT_DRAWS Fisher draws each), raised to interval / steps: the growth within one
# plan's life at a constant rate. Foresight no planner has: a diagnostic of how much of SNIP's early gap LD's
# staleness explains (LD grows up to 60x per 100 steps at the 100-step checkpoint, bench staleness), not a method
FORESIGHT_BATCHES, FORESIGHT_DRAWS = (7, 8), 8
# snip_share: snip_signal with dgrad's WD times the signal share too. The share prices noise that Adam's v absorbs;
# dgrad's error is linear in dy (dy's rounding noise, and dy (Q(w) - w) for the weight's), so its mean over batches is
# as small a part of it as the gradient's mean is of the gradient, which the planner's default (wgrad only) does not
# assume
# snip_struct: snip_signal whose LD prices each layer's forward error along its actual FP4 output error instead of as
# isotropic noise: at every re-plan each layer's curvature times structured_ld / LD in FP4 on the calibration batch,
# the whole Gauss-Newton form with its cross terms between positions (2 draws; snip_dir estimates it without them,
# on the statistics pass's rows). It is 1.2-4x the isotropic LD and matches the measured immediate cost of every
# forward GEMM in FP4 at once (bench_forward_error.py)
# snip_trend: snip_signal whose LD prices each layer's curvature over the plan's life instead of at its start: with
# g the layer's curvature growth over one interval, extrapolated from the previous measurement, the mean over the
# interval of a geometric growth, (g - 1) / ln g. The first plan of a branch reads its growth from the curvature
# at the checkpoint one interval before the branch's (calibration batch 7): what a planner that had been
# re-planning along the bf16 trajectory would have measured
# snip_growth: snip_signal whose LD prices what a layer's forward error costs through training as well as at the end of
# the plan's life: LD(end) + max(0, LD(end) - LD(start)), i.e. its curvature times max(g, 2 g - 1), g its growth over
# one interval extrapolated as snip_trend's. Why: training under a forward error follows the gradient of L + LD (the
# error's even-order bias; bench_forward_train.py: the cost comes through Adam's first moment, as a bias that an
# error of alternating sign keeps and stochastic rounding of the forward does not lower), so to first order it costs
# the exact loss what the exact trajectory would have raised LD by: LD(end) - LD(start). Against bench scale --blocks'
# per-block forward costs, that price with LD 100 steps on along the bf16 trajectory is within 1.1-2.6x of every
# block's at every checkpoint, LD(start) within 1.0-72x (cpu-planner-forward-train.md). It plans no better at the
# 100-step checkpoint (cpu-planner-quality-growth-early.md)
# snip_growth_oracle: snip_growth with snip_oracle's foresight instead of the extrapolated growth: the layer's growth
# along the bf16 trajectory over the branch, to the power interval / steps. Whether the price would plan better with
# a perfect forecast of LD's growth (a diagnostic, not a method)
# snip_growth_to_end: snip_growth_oracle with the growth from the plan's step to the branch's end instead of over one
# plan's life. A forward error held early displaces the weights, and the displacement costs by the curvature where the
# branch ends: the plan made at the checkpoint decides a branch's gap, the re-plan 50 steps later hardly moves it
# (bench_plan_replay.py), and this price, with the growth over the whole branch, is within 1.1-2.6x of every block's
# forward cost at the three checkpoints (cpu-planner-forward-train.md). A diagnostic (foresight), not a method
# the variants that read the LD growth along the bf16 trajectory (ld_growth), and those that extrapolate it from the
# curvature one interval before the branch (curvature_at)
FORESEEN, TRENDED = ("snip_oracle", "snip_growth_oracle", "snip_growth_to_end"), ("snip_trend", "snip_growth")
ABLATION = ("snip_ld", "snip_wd", "snip_lam0.1")
# a planned method's name + GEMM_SUFFIX: the same method with one precision per GEMM instead of per layer
GEMM_SUFFIX = "_gemm"
# a planned method's name + DRIFT_SUFFIX (before GEMM_SUFFIX): re-plans spaced by the schedule's drift trigger
# (planner.schedule) instead of every interval: from interval / DRIFT_MIN_FRACTION steps up to the interval
DRIFT_SUFFIX, DRIFT, DRIFT_MIN_FRACTION = "_drift", 0.05, 5
# "random<k>" (k >= 1): the random heuristic with the priorities of seed k ("random" is seed 0). One random plan is
# one draw; several give the distribution SNIP's plan is ranked in (quality_random_ranks), not more rivals.
RANDOM_DRAW = re.compile(r"random([1-9][0-9]*)")


def drift_schedule(interval: int) -> PrecisionSchedule:
    return PrecisionSchedule(drift=DRIFT, min_interval=max(1, interval // DRIFT_MIN_FRACTION))


def base_method(method: str) -> str:
    """A quality-grid method without its granularity and re-plan suffixes ("min_abs_error_drift_gemm" -> "min_abs_error")."""
    return method.removesuffix(GEMM_SUFFIX).removesuffix(DRIFT_SUFFIX)


def planner_config(method: str, budget: float, interval: int) -> PlannerConfig:
    """The PlannerConfig of a planned method of the quality grid (SNIP_VARIANTS, a heuristic, either + _drift, + _gemm)."""
    base = base_method(method)
    drift = method.removesuffix(GEMM_SUFFIX).endswith(DRIFT_SUFFIX)
    common = dict(budget=Budget.fp4_fraction(budget), interval=interval,
                  granularity="gemm" if method.endswith(GEMM_SUFFIX) else "layer",
                  schedule=drift_schedule(interval) if drift else None)
    if base in SNIP_VARIANTS:
        return PlannerConfig(**common, **{"wd_horizon": "settled", **SNIP_VARIANTS[base]})
    if base in HEURISTICS:
        return PlannerConfig(**common, method=base)
    if draw := RANDOM_DRAW.fullmatch(base):
        return PlannerConfig(**common, method="random", baseline_seed=int(draw.group(1)))
    raise ValueError(f"unknown method {method!r}: bf16, or one of {', '.join(SNIP_VARIANTS)}, {', '.join(HEURISTICS)}, "
                     f"random<k>, optionally + {DRIFT_SUFFIX!r}, optionally + {GEMM_SUFFIX!r}")


@dataclasses.dataclass(frozen=True)
class QualityRun:
    """One branch of the quality grid: `method` trained `steps` steps from the `phase`-step checkpoint of
    `preset` on the batches of `seed`, re-planning every `interval` steps at `budget` (FP4 share), evaluated
    on `eval_batches` validation batches (the same ones for every branch)."""

    preset: str
    phase: int
    budget: float
    method: str
    seed: int
    steps: int
    interval: int
    eval_batches: int

    @property
    def key(self) -> str:
        budget = "-" if self.method in ("bf16", "uniform_fp4") else self.budget  # budget-independent runs
        return (f"{self.preset}/{self.phase}/{budget}/{self.method}/{self.seed}/{self.steps}/{self.interval}/"
                f"e{self.eval_batches}/lr{LRS[self.preset]:g}")


class AdjustedStats:
    """Planner hooks whose planner solves with every measured layer's statistics passed through `adjust`
    (LayerStats -> LayerStats); otherwise the hooks they wrap."""

    def __init__(self, hooks, adjust: Callable[[LayerStats], LayerStats]):
        self.hooks, self.adjust = hooks, adjust

    def __getattr__(self, name):
        return getattr(self.hooks, name)

    def on_setup(self, model, opt) -> None:
        self.hooks.on_setup(model, opt)
        measure = self.hooks.planner.measure

        def adjusted(batch, *args, **kwargs) -> PlannerStats:
            return self.adjust_stats(measure(batch, *args, **kwargs), batch)
        self.hooks.planner.measure = adjusted

    def adjust_stats(self, stats: PlannerStats, batch) -> PlannerStats:
        """`stats` as the planner solves with them; `batch`: the calibration batch they were measured on."""
        return dataclasses.replace(stats, layers=tuple(self.adjust(s) for s in stats.layers))


def curvature_times(stats: PlannerStats, factor: Callable[[LayerStats], float]) -> PlannerStats:
    """`stats` with every layer's curvature (so its LD) times factor(layer)."""
    return dataclasses.replace(stats, layers=tuple(dataclasses.replace(s, curvature=s.curvature * factor(s))
                                                   for s in stats.layers))


class DgradSignalShare(AdjustedStats):
    """Planner hooks whose planner solves with dgrad's WD times the signal share that the measurement applied to
    wgrad's (snip_share)."""

    def __init__(self, hooks):
        super().__init__(hooks, adjust=None)

    def adjust_stats(self, stats: PlannerStats, batch) -> PlannerStats:
        share = stats.diagnostics["wgrad_signal_share"]
        return dataclasses.replace(stats, layers=tuple(dataclasses.replace(s, s_dgrad=s.s_dgrad * share)
                                                       for s in stats.layers))


def weighted_wd(weights: dict[str, float]) -> Callable[[LayerStats], LayerStats]:
    """Each backward GEMM's WD times its weight (CALIBRATED_WD)."""
    return lambda s: dataclasses.replace(s, s_dgrad=s.s_dgrad * weights["dgrad"], s_wgrad=s.s_wgrad * weights["wgrad"])


def foreseen_ld(growth: dict[str, float], power: float,
                 price: Callable[[float], float] = lambda g: g) -> Callable[[LayerStats], LayerStats]:
    """Each layer's curvature (so its LD) times `price` of its growth (`ld_growth`) to the power `power`."""
    return lambda s: dataclasses.replace(s, curvature=s.curvature * price(growth[s.name] ** power))


def ld_growth(preset: str, phase: int, steps: int) -> dict[str, float]:
    """{layer: its curvature at the `phase + steps`-step checkpoint over that at the `phase`-step one}, the
    geometric mean over the pair of calibration batches FORESIGHT_BATCHES (cached: the workers only read it)."""
    path = CACHE / f"ld-growth-{preset}-{phase}-{steps}.json"
    if path.exists():
        return json.loads(path.read_text())
    now, later = ([stats_at(checkpoint(p, preset), FORESIGHT_DRAWS, calibration_seed=b).by_name()
                   for b in FORESIGHT_BATCHES] for p in (phase, phase + steps))
    floor = 1e-12  # a layer the Fisher draws found flat: no growth to read, a bounded ratio instead of inf / nan
    product = dict.fromkeys(now[0], 1.0)  # the product of the two batches' ratios
    for before, after in zip(now, later):
        for n in product:
            product[n] = product[n] * max(after[n].curvature, floor) / max(before[n].curvature, floor)
    growth = {n: math.sqrt(p) for n, p in product.items()}
    path.write_text(json.dumps(growth))
    return growth


def end_and_growth(growth: float) -> float:
    """LD(end) + max(0, LD(end) - LD(start)) over LD(start), for a quantity that grows by `growth` (snip_growth)."""
    return max(growth, 2.0 * growth - 1.0)


def life_mean(growth: float) -> float:
    """The mean over [0, 1] of growth ** t: a quantity's mean over an interval in which it grows geometrically by `growth`."""
    return 1.0 if abs(growth - 1.0) < 1e-9 else (growth - 1.0) / math.log(growth)


class TrendedStats(AdjustedStats):
    """Planner hooks whose planner solves with every layer's curvature times `price` (`life_mean` by default) of its
    growth over one interval, extrapolated from the previous measurement (the first one's: `before`, `interval` steps
    earlier)."""

    def __init__(self, hooks, interval: int, before: dict[str, float], price: Callable[[float], float] = life_mean):
        super().__init__(hooks, adjust=None)
        self.interval, self.previous, self.price = interval, (-interval, before), price

    def adjust_stats(self, stats: PlannerStats, batch) -> PlannerStats:
        (step_before, before), self.previous = self.previous, (stats.step, {s.name: s.curvature for s in stats.layers})

        def factor(s: LayerStats) -> float:
            h0, h1 = before[s.name], s.curvature
            if not (h0 > 0 and h1 > 0 and stats.step > step_before):
                return 1.0
            return self.price((h1 / h0) ** (self.interval / (stats.step - step_before)))
        return curvature_times(stats, factor)


def fp4_output_errors(model, layers, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(logits, {layer: its bf16 output, in the graph}, {layer: its FP4 forward's output minus the bf16 one on the
    same input}) on a window batch, every other GEMM in bf16. The SR counters are put back: the forward GEMMs round
    to nearest, but a branch must draw the same bits however often it is measured."""
    inputs, outputs = {}, {}

    def keep(name):
        def hook(mod, args, y):
            inputs[name], outputs[name] = args[0].detach(), y
        return hook

    handles = [m.register_forward_hook(keep(n)) for n, m in layers.items()]
    try:
        with high_precision(layers):
            logits = lm_logits(model, batch)
    finally:
        for h in handles:
            h.remove()
    counters = sr_counters(model)
    errors = {}
    try:
        with torch.no_grad():
            for n, m in layers.items():
                saved = m.precision
                m.set_precision(FP4_FORWARD)
                try:
                    errors[n] = m(inputs[n]).float() - outputs[n].detach().float()
                finally:
                    m.set_precision(saved)
    finally:
        set_sr_counters(model, counters)
    return logits, outputs, errors


def structured_ld(model, layers, batch, draws: int, seed: int = 0) -> dict[str, float]:
    """{layer: 1/2 e^T G e}, the Gauss-Newton form of LD along the layer's actual FP4 forward error e on `batch`
    instead of isotropic noise of e's energy (with isotropic e it is LD): N/2 E_s sum_b (g_s,b . e_b)^2 over `draws`
    sampled-label cotangents g_s at the layer's output (planner/divergence.py, method "fisher"), summed per sequence
    b (independent sequences: the cross-sequence terms have mean zero)."""
    logits, outputs, errors = fp4_output_errors(model, layers, batch)
    logits = logits.reshape(-1, logits.shape[-1]).float()
    probs = logits.detach().softmax(-1)
    names = list(layers)
    out = {n: 0.0 for n in names}
    for d in range(draws):
        labels = sample_labels(probs, divergence_generator(seed, (d,), probs.device))
        grads = torch.autograd.grad(F.cross_entropy(logits, labels), [outputs[n] for n in names],
                                    retain_graph=d + 1 < draws)
        for n, g in zip(names, grads):
            per_sequence = (g.float() * errors[n]).flatten(1).sum(1)
            out[n] += logits.shape[0] / 2 * float(per_sequence.pow(2).sum()) / draws
    return out


class StructuredLD(AdjustedStats):
    """Planner hooks whose planner solves with every layer's curvature times structured_ld / LD in FP4, measured on
    each re-plan's calibration batch (snip_struct)."""

    def __init__(self, hooks):
        super().__init__(hooks, adjust=None)

    def adjust_stats(self, stats: PlannerStats, batch) -> PlannerStats:
        planner = self.hooks.planner
        struct = structured_ld(planner.model, planner.layers, batch, DivergenceConfig().draws)

        def factor(s: LayerStats) -> float:
            iso = s.ld("fp4")
            return struct[s.name] / iso if iso > 0 else 1.0
        return curvature_times(stats, factor)


def curvature_at(preset: str, steps: int) -> dict[str, float]:
    """{layer: its curvature} at the `steps`-step checkpoint as the planner measures it (calibration batch 7;
    cached: the workers only read it)."""
    path = CACHE / f"curvature-{preset}-{steps}.json"
    if path.exists():
        return json.loads(path.read_text())
    curvature = {n: s.curvature for n, s in stats_at(checkpoint(steps, preset), DivergenceConfig().draws).by_name().items()}
    path.write_text(json.dumps(curvature))
    return curvature


def foresight(run: "QualityRun") -> tuple[dict[str, float], float]:
    """foreseen_ld's growth and power for a branch: the growth over the branch, to the power of one plan's share."""
    return ld_growth(run.preset, run.phase, run.steps), run.interval / run.steps


def curvature_before(run: "QualityRun") -> dict[str, float]:
    """The curvatures one re-plan interval before the branch's checkpoint (TrendedStats' first `before`)."""
    return curvature_at(run.preset, run.phase - run.interval)


class GrowthToEnd(AdjustedStats):
    """Planner hooks whose planner solves with every layer's curvature times end_and_growth of its growth from the
    plan's step to the end of a branch of `steps` steps (`growth`: ld_growth over the whole branch, to the power of
    the share of the branch still ahead; snip_growth_to_end)."""

    def __init__(self, hooks, growth: dict[str, float], steps: int):
        super().__init__(hooks, adjust=None)
        self.growth, self.steps = growth, steps

    def adjust_stats(self, stats: PlannerStats, batch) -> PlannerStats:
        ahead = max(0, self.steps - stats.step) / self.steps
        return curvature_times(stats, lambda s: end_and_growth(self.growth[s.name] ** ahead))


# the diagnostic SNIP variants whose planner solves with adjusted statistics: (run, hooks) -> the hooks that adjust them
ADJUSTED_STATS = {
    "snip_cal": lambda run, hooks: AdjustedStats(hooks, weighted_wd(CALIBRATED_WD)),
    "snip_oracle": lambda run, hooks: AdjustedStats(hooks, foreseen_ld(*foresight(run))),
    "snip_share": lambda run, hooks: DgradSignalShare(hooks),
    "snip_struct": lambda run, hooks: StructuredLD(hooks),
    "snip_trend": lambda run, hooks: TrendedStats(hooks, run.interval, curvature_before(run)),
    "snip_growth": lambda run, hooks: TrendedStats(hooks, run.interval, curvature_before(run), end_and_growth),
    "snip_growth_oracle": lambda run, hooks: AdjustedStats(hooks, foreseen_ld(*foresight(run), end_and_growth)),
    "snip_growth_to_end": lambda run, hooks: GrowthToEnd(hooks, ld_growth(run.preset, run.phase, run.steps), run.steps)}


def run_quality(run: QualityRun) -> dict:
    """Train one branch (in a worker process: one torch thread) and return what the tables need."""
    torch.set_num_threads(1)
    ckpt = checkpoint(run.phase, run.preset)
    t = time.perf_counter()
    hooks = None
    # evaluated at the start, at every re-plan and at the end
    evaluate = dict(evals=max(1, run.steps // run.interval), eval_batches=run.eval_batches)
    if run.method == "bf16":
        summary = continue_from(ckpt, run.steps, run.seed, **evaluate)
    elif run.method == "uniform_fp4":  # one plan whatever the statistics say: no planner needed
        summary = continue_from(ckpt, run.steps, run.seed, precision="fp4", **evaluate)
    else:
        lr_schedule = None
        if base_method(run.method) in LR_SCHEDULED:
            lr_schedule = learning_rates(branch_config(ckpt, run.steps, run.seed, **evaluate))
        hooks = make_hooks(planner_config(run.method, run.budget, run.interval), show_table=False, log=lambda m: None,
                           lr_schedule=lr_schedule)
        if adjusted := ADJUSTED_STATS.get(base_method(run.method)):
            hooks = adjusted(run, hooks)
        summary = continue_from(ckpt, run.steps, run.seed, hooks=hooks, **evaluate)
    plans = [dict(h) for h in hooks.planner.history] if hooks else []
    for summary_of_plan, plan in zip(plans, hooks.plans if hooks else []):  # which layer got which precision
        summary_of_plan["precisions"] = {n: p.to_json() for n, p in plan.precisions.items()}
    return {"final_val_loss": summary["final_val_loss"], "val": summary["history"]["val"],
            "fp4_fraction": statistics.mean(h["fp4_fraction"] for h in plans) if plans else
            (1.0 if run.method == "uniform_fp4" else 0.0),
            "plans": plans, "time_s": time.perf_counter() - t, "numerics": numerics(run.phase, run.preset)}


def quality_grid(args) -> list[QualityRun]:
    methods = ["bf16", *SNIP_VARIANTS, *HEURISTICS] if args.methods is None else args.methods
    for m in methods:
        if m not in ("bf16", "uniform_fp4"):
            planner_config(m, 0.5, args.interval)  # an unknown name fails here, not in a worker
    runs = []
    for phase in args.phases:  # cell by cell (phase, budget), in the order given: partial runs leave whole cells
        for budget in args.budgets:
            for seed in args.seeds:
                for m in methods:
                    if m in ABLATION and budget != args.budgets[len(args.budgets) // 2]:
                        continue  # the ablation at the middle budget only
                    runs.append(QualityRun(args.preset, phase, budget, m, seed, args.steps, args.interval, args.eval_batches))
    return list({r.key: r for r in runs}.values())


def kept_above_fp4(results: list[dict]) -> dict[str, float] | None:
    """Of the GEMMs that a method's plans (every re-plan of every seed) keep above FP4, the share of each kind
    (fprop, dgrad, wgrad; by count); None for a method without plans (bf16, uniform FP4) or that keeps none."""
    counts = collections.Counter(g for r in results for plan in r["plans"] for p in plan["precisions"].values()
                                 for g in GEMMS if (p if isinstance(p, str) else p[g]) != "fp4")
    total = sum(counts.values())
    return {g: counts[g] / total for g in GEMMS} if total else None


def quality_table(runs: list[QualityRun], done: dict, budgets, phases, seeds) -> dict:
    """Per (phase, budget): per method, the paired gaps to bf16 per seed, their mean and spread, the FP4 share,
    which GEMMs its plans keep above FP4."""
    table = {}
    for phase in phases:
        for budget in budgets:
            cell, paired = {}, collections.defaultdict(dict)  # paired: seed -> the runs its gaps subtract
            for r in runs:
                if r.phase != phase or (r.budget != budget and r.method not in ("bf16", "uniform_fp4")):
                    continue
                if r.method in cell:
                    continue
                mine = [done.get(dataclasses.replace(r, budget=budget, seed=s).key) for s in seeds]
                ref = [done.get(dataclasses.replace(r, budget=budget, method="bf16", seed=s).key) for s in seeds]
                if None in mine or None in ref:  # not trained (yet): --report-only on a partial cache
                    continue
                for s, a, b in zip(seeds, mine, ref):
                    paired[s].update({dataclasses.replace(r, budget=budget, seed=s).key: a,
                                      dataclasses.replace(r, budget=budget, method="bf16", seed=s).key: b})
                gaps = [a["final_val_loss"] - b["final_val_loss"] for a, b in zip(mine, ref)]
                cell[r.method] = {"gap_per_seed": gaps, "mean_gap": statistics.mean(gaps),
                                  "std_gap": statistics.stdev(gaps) if len(gaps) > 1 else 0.0,
                                  "fp4_fraction": statistics.mean(m["fp4_fraction"] for m in mine),
                                  "kept_above_fp4": kept_above_fp4(mine),
                                  "final_val_loss": [m["final_val_loss"] for m in mine]}
            for s, unit in paired.items():
                check_paired(unit, f"cell {phase}/{budget}, seed {s}")
            if cell:
                table[f"{phase}/{budget}"] = cell
    return table


def seeds_to_resolve(margins: dict[str, tuple[float, float]], seeds: int) -> int | None:
    """How many paired seeds would resolve every margin {rival: (mean, standard error)} measured on `seeds` seeds, were
    each mean to stay as measured: the standard error falls as 1 / sqrt(seeds), so a margin d of standard error se
    exceeds two of them beyond seeds * (2 se / d)^2. `seeds` where every margin is resolved already; None where a
    margin is not positive (no number of seeds resolves it)."""
    if any(d <= 0 for d, _ in margins.values()):
        return None
    return max(seeds, *(math.floor(seeds * (2 * se / d) ** 2) + 1 for d, se in margins.values()))


def quality_verdicts(table: dict, claim: str = "snip") -> dict:
    """Per cell: is the `claim` method's mean gap below every heuristic's (per layer or per GEMM), its margin to
    the best one (with the standard error of the per-seed paired differences), whether it is below every one by
    more than two standard errors of that paired difference (resolved: a mean below by less is within what the
    seeds' rounding bits alone move a branch, bench_plan_replay.py's reseed), how many seeds would resolve it were the
    margins to hold (seeds_to_resolve), and on how many seeds it is below every heuristic."""
    out = {}
    for key, cell in table.items():
        if claim not in cell:
            continue
        rivals = [m for m in cell if base_method(m) in HEURISTICS]
        if not rivals:
            continue
        best = min(rivals, key=lambda m: cell[m]["mean_gap"])
        mine = cell[claim]
        margins = {m: mean_se([b - g for b, g in zip(cell[m]["gap_per_seed"], mine["gap_per_seed"])]) for m in rivals}
        out[key] = {"claim": claim, "below_every_heuristic": all(mine["mean_gap"] < cell[m]["mean_gap"] for m in rivals),
                    "resolved_below_every_heuristic": all(d > 2 * se for d, se in margins.values()),
                    "margins": margins, "best_heuristic": best,
                    "margin_to_best_heuristic": cell[best]["mean_gap"] - mine["mean_gap"],
                    "margin_standard_error": margins[best][1],
                    "seeds_to_resolve": seeds_to_resolve(margins, len(mine["gap_per_seed"])),
                    "seeds_below_every_heuristic": sum(all(mine["gap_per_seed"][i] < cell[m]["gap_per_seed"][i]
                                                           for m in rivals) for i in range(len(mine["gap_per_seed"])))}
    return out


def quality_random_ranks(table: dict, claim: str) -> dict:
    """Per cell with the random heuristic drawn more than once at the claim's granularity (random, random<k>):
    below how many of the draws the `claim` method's mean gap lies, and the paired per-seed difference between
    the draws' mean gap and the claim's (mean and standard error): SNIP against random choice, not one draw."""
    suffix = GEMM_SUFFIX if claim.endswith(GEMM_SUFFIX) else ""
    out = {}
    for key, cell in table.items():
        draws = [m for m in cell if m.endswith(suffix) and
                 (m.removesuffix(suffix) == "random" or RANDOM_DRAW.fullmatch(m.removesuffix(suffix)))]
        if claim not in cell or len(draws) < 2:
            continue
        mine = cell[claim]
        diffs = [statistics.mean(cell[m]["gap_per_seed"][i] for m in draws) - g
                 for i, g in enumerate(mine["gap_per_seed"])]
        out[key] = {"draws": sorted(draws), "below_draws": sum(mine["mean_gap"] < cell[m]["mean_gap"] for m in draws),
                    "draw_mean_gaps": sorted(cell[m]["mean_gap"] for m in draws),
                    "advantage_over_draw_mean": statistics.mean(diffs),
                    "advantage_standard_error": statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0}
    return out


def save_run(cache: Path, key: str, result: dict) -> None:
    """Add one trained run to the cache file, merged under a lock with what is there: bench processes running at the
    same time (another preset, another cell) share the cache, and none may drop the others' runs."""
    with open(cache.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        runs = read_cache(cache)
        runs[key] = result
        partial = cache.with_suffix(".partial")
        partial.write_text(json.dumps(runs))
        partial.replace(cache)


def with_runs_from(done: dict, paths: list[Path]) -> dict:
    """The cached runs `done` and those of committed quality results (their "runs"), for tabulating seeds trained
    elsewhere beside this cache's: a run in two places must be the same run (the tables pair a seed's runs only under
    one numerics, `check_paired`)."""
    out = dict(done)
    for path in paths:
        for key, result in json.loads(path.read_text())["runs"].items():
            if key in out and out[key] != result:
                raise SystemExit(f"{path}: run {key} differs from the one already read (another machine's or "
                                 "checkpoint's): tabulate them apart")
            out[key] = result
    return out


def checkpoint_val_losses(args) -> dict[int, float | None]:
    """{phase: its checkpoint's validation loss} for the quality tables: the checkpoint's, trained if need be; a report
    (--report-only) trains nothing and takes it from the cache, else from the first --runs-from file that recorded it,
    else None."""
    out = {}
    for phase in args.phases:
        if not args.report_only or checkpoint_path(phase, args.preset).exists():
            out[phase] = checkpoint(phase, args.preset)["val_loss"]
            continue
        recorded = (json.loads(path.read_text()).get("checkpoint_val_loss", {}).get(str(phase)) for path in args.runs_from)
        out[phase] = next((v for v in recorded if v is not None), None)
    return out


def bench_quality(args) -> None:
    """SNIP vs the heuristics (each re-planned at the same interval and budget by the same ILP) and SNIP's
    ablation, paired per seed from bf16 checkpoints at several training phases."""
    runs = quality_grid(args)
    cache = CACHE / "quality-runs.json"
    done = read_cache(cache)
    done = with_runs_from(done, args.runs_from)
    bases = {base_method(r.method) for r in runs}
    for phase in args.phases if not args.report_only else ():  # before the workers start, so that they only read them
        checkpoint(phase, args.preset)
        if bases & set(FORESEEN):
            ld_growth(args.preset, phase, args.steps)
        if bases & set(TRENDED):
            curvature_at(args.preset, phase - args.interval)
    todo = [r for r in runs if r.key not in done and not args.report_only]
    for phase, seed in sorted({(r.phase, r.seed) for r in todo}):
        cached = {r.key: done[r.key] for r in runs if (r.phase, r.seed) == (phase, seed) and r.key in done}
        check_trainable_beside(cached, args.preset, phase, seed)
    print(f"quality: {len(runs)} runs, {len(todo)} to train, {args.workers} workers", flush=True)
    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(args.workers, mp_context=ctx) as pool:
        for r, result in zip(todo, pool.map(run_quality, todo)):
            done[r.key] = result
            save_run(cache, r.key, result)
            print(f"{r.key}: val {result['final_val_loss']:.4f} ({result['time_s']:.0f}s)", flush=True)
    table = quality_table(runs, done, args.budgets, args.phases, args.seeds)
    verdicts = quality_verdicts(table, args.claim)
    ranks = quality_random_ranks(table, args.claim)
    ckpts = checkpoint_val_losses(args)
    md = [f"Preset {args.preset}; bf16 checkpoints after {', '.join(map(str, args.phases))} steps (one trajectory, "
          f"constant lr {LRS[args.preset]:g} after warmup; val loss "
          f"{', '.join('-' if v is None else f'{v:.4f}' for v in ckpts.values())}); from each, "
          f"{args.steps} steps per method (cosine decay to lr/10), seeds {args.seeds}: the seed picks the batches, and "
          "every method of a seed sees the same ones from the same state (paired). Every planned method -- SNIP, its "
          f"ablations and the heuristics -- re-plans every {args.interval} steps from the same statistics with the same "
          "ILP at the same budget (FP4 share of linear FLOPs). Gap: final validation loss (mean over the same "
          f"{args.eval_batches} validation batches of {RUN['batch_size']} x {RUN['seq_len']} tokens for every branch) minus the "
          f"bf16 branch's, mean +- std over seeds. snip: SNIP per layer as the paper plans (Fisher LD, WD in loss units "
          f"once settled, lambda {DEFAULT_LAMBDA:g}); snip_ld / snip_wd: one term alone; snip_lam0.1: lambda 0.1; "
          f"snip_horizon: WD as the excess loss within the {args.interval}-step re-plan interval instead of the settled "
          f"one; snip_lrs: snip_horizon with the interval's learning rates read from the branch's decay "
          f"(SnipPlanner's lr_schedule, as snip train plans) instead of held at the re-plan step's; snip_cal: snip_lrs "
          f"with dgrad's WD times {CALIBRATED_WD['dgrad']:g} and wgrad's times "
          f"{CALIBRATED_WD['wgrad']:g}, their loss per unit of WD relative to LD's in bench scale on these "
          f"checkpoints (an in-sample diagnostic); snip_oracle: snip_lrs with each layer's LD at every re-plan times "
          f"its curvature's growth along the bf16 trajectory from the checkpoint to {args.steps} steps later, to the "
          f"power {args.interval}/{args.steps} (its growth within one plan's life: foresight, a diagnostic); "
          "snip_signal: snip_lrs with wgrad's WD times the signal share mu^2 / v of Adam's second moment, measured at "
          "every re-plan from the calibration batch's sequences (one factor for all layers; Adam's normalisation, "
          "which WD's fixed preconditioner leaves out); every other SNIP variant prices wgrad without it; snip_trend: "
          "snip_signal with each layer's LD over the plan's life, (g - 1) / ln g times its curvature, g the growth over "
          "one interval extrapolated from the previous measurement (the first plan's: the checkpoint one interval "
          "earlier, what a planner re-planning along the bf16 trajectory would have measured); snip_growth: "
          "snip_signal with each layer's LD at the end of the plan's life plus its growth within it, max(g, 2 g - 1) "
          "times its curvature, g as snip_trend's (the forward error's cost through training: LD(end) - LD(start)); "
          "snip_growth_oracle: snip_growth with snip_oracle's foresight of g (a diagnostic); snip_growth_to_end: "
          "snip_growth_oracle with g the growth from the plan's step to the branch's end instead of over one interval "
          "(what an early forward error costs where the branch ends; a diagnostic); "
          "snip_share: "
          "snip_signal with dgrad's WD times the same share (its error, linear in dy, treated as noise that Adam's v "
          "absorbs like wgrad's); snip_struct: snip_signal with each layer's LD along its actual FP4 forward error "
          "(the Gauss-Newton form 1/2 e^T G e from the Fisher draws, per sequence; LD prices it as isotropic noise of "
          "the same energy) at every re-plan, as its curvature times that over LD in FP4; snip_dir: snip_signal with "
          "the directional LD (the same form per position, on the statistics pass's sampled rows, for every "
          "precision: divergence.py, \"Directional LD\"); every other variant prices the forward error as isotropic "
          "noise; snip_end: snip_signal with WD as the excess loss the plan's gradient noise leaves at the branch's end "
          "(wd_horizon 'run_end': the noise of the plan's life, contracting without more of it along the schedule's "
          "later steps: planner.horizon), not at the plan's end; every other variant prices WD at the plan's end or "
          "settled; "
          f"*{GEMM_SUFFIX}: one precision per GEMM (forward, dgrad, wgrad) instead of per layer; the planner's "
          f"defaults are snip_signal{GEMM_SUFFIX}, as snip train plans; *{DRIFT_SUFFIX}: re-plans spaced by the drift trigger (regret "
          f"threshold {DRIFT:g}, from {drift_schedule(args.interval).min_interval} up to {args.interval} steps apart) "
          "instead of every interval. Above FP4: of the GEMMs a method's plans keep above FP4 (every re-plan, every "
          "seed), the share that are forward, dgrad and wgrad GEMMs (by count).", ""]
    if args.runs_from:
        md += [f"Runs read from {', '.join(f'`{p.name}`' for p in args.runs_from)} as well as the cache: each seed's "
               "runs were trained on one machine from one copy of the checkpoint (paired), different seeds possibly "
               "on different ones; the checkpoint's validation loss above is this machine's.", ""]
    trained = sum(r.key in done for r in runs)
    if trained < len(runs):
        md += [f"**Partial:** {trained} of the grid's {len(runs)} runs are trained; only complete cells are shown.", ""]
    for key, cell in table.items():
        phase, budget = key.split("/")
        md += [f"## phase {phase} steps, budget {100 * float(budget):.0f}% FP4", "",
               "| method | FP4 share | above FP4: fprop / dgrad / wgrad | gap per seed | mean gap +- std |",
               "|---|---|---|---|---|"]
        for m, r in sorted(cell.items(), key=lambda kv: kv[1]["mean_gap"]):
            kept = r["kept_above_fp4"]
            md.append(f"| {m} | {100 * r['fp4_fraction']:.1f}% | "
                      + (" / ".join(f"{100 * kept[g]:.0f}" for g in GEMMS) + "%" if kept else "-") + " | "
                      + ", ".join(f"{g:+.4f}" for g in r["gap_per_seed"])
                      + f" | {r['mean_gap']:+.4f} +- {r['std_gap']:.4f} |")
        v = verdicts.get(key)
        if v:
            md += ["", f"{args.claim} below every heuristic: {'yes' if v['below_every_heuristic'] else 'NO'}; margin to the "
                   f"best heuristic ({v['best_heuristic']}): {v['margin_to_best_heuristic']:+.4f} +- "
                   f"{v['margin_standard_error']:.4f} (paired per seed, standard error); below every heuristic "
                   f"on {v['seeds_below_every_heuristic']} of {len(args.seeds)} seeds; below every heuristic by more "
                   f"than two standard errors: {'yes' if v['resolved_below_every_heuristic'] else 'NO'}; were the "
                   "margins to hold, paired seeds that would resolve them: "
                   f"{v['seeds_to_resolve'] or 'none (a margin is not positive)'}.", ""]
        r = ranks.get(key)
        if r:
            md += [f"{args.claim} against {len(r['draws'])} random plans (mean gaps "
                   f"{', '.join(f'{g:+.4f}' for g in r['draw_mean_gaps'])}): below {r['below_draws']} of them; the "
                   f"draws' mean gap minus {args.claim}'s, paired per seed: {r['advantage_over_draw_mean']:+.4f} +- "
                   f"{r['advantage_standard_error']:.4f} (standard error).", ""]
    fractions = collections.defaultdict(list)  # snip_signal's factor per phase and re-plan step, over its runs
    for r in runs:
        for plan in done.get(r.key, {}).get("plans", []):
            if "wgrad_signal_share" in plan:
                fractions[r.phase, plan["step"]].append(plan["wgrad_signal_share"])
    if fractions:
        md += ["snip_signal's factor on wgrad's WD (the signal share of Adam's v), mean [min, max] over its runs: "
               + "; ".join(f"{phase} steps + {step}: {statistics.mean(f):.3f} [{min(f):.3f}, {max(f):.3f}]"
                           for (phase, step), f in sorted(fractions.items())) + ".", ""]
    if table:
        plot_quality(table, RESULTS / f"cpu-planner-{args.name}.png",
                     f"{args.preset}: gap to bf16 per method (mean +- std over {len(args.seeds)} seeds)", args.claim)
    write(args.name, {"preset": args.preset, "phases": args.phases, "budgets": args.budgets, "seeds": args.seeds,
                      "steps": args.steps, "interval": args.interval, "checkpoint_val_loss": ckpts,
                      "wall_s": time.perf_counter() - t0, "table": table, "verdicts": verdicts, "random_ranks": ranks,
                      "runs": {r.key: done[r.key] for r in runs if r.key in done},
                      "runs_from": [p.name for p in args.runs_from],
                      "complete": all(r.key in done for r in runs)}, "\n".join(md))


def plot_quality(table: dict, path: Path, title: str, claim: str = "snip") -> None:
    """One panel per (phase, budget): each method's mean gap to bf16 with its spread over seeds."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cells = list(table.items())
    cols = min(3, len(cells))
    rows = -(-len(cells) // cols)
    fig = Figure(figsize=(4.5 * cols, 3.2 * rows), constrained_layout=True)
    FigureCanvasAgg(fig)
    for k, (key, cell) in enumerate(cells):
        ax = fig.add_subplot(rows, cols, k + 1)
        methods = [m for m in cell if m != "bf16"]
        means = [cell[m]["mean_gap"] for m in methods]
        spread = [cell[m]["std_gap"] for m in methods]
        colors = ["tab:red" if m == claim else "tab:orange" if m.startswith("snip") else "tab:gray" for m in methods]
        ax.barh(methods, means, xerr=spread, color=colors)
        ax.axvline(0.0, color="black", linewidth=0.8)
        phase, budget = key.split("/")
        ax.set_title(f"phase {phase}, {100 * float(budget):.0f}% FP4", fontsize=9)
        ax.tick_params(labelsize=7)
        ax.invert_yaxis()
    fig.suptitle(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def mean_fp4_share(history: list[dict], steps: int) -> float:
    """The FP4 share of linear FLOPs averaged over the steps of a run: each plan counts for the steps it ran."""
    starts = [h["step"] for h in history] + [steps]
    return sum(h["fp4_fraction"] * (b - a) for h, a, b in zip(history, starts, starts[1:])) / steps


def bench_schedule(args) -> None:
    """A precision schedule against a constant budget at the same mean FP4 share, paired per seed: from the
    mid-training checkpoint, the learning rate is held for half the branch and then decays; "snip_schedule"
    plans at args.budgets[0] until the decay trigger fires and at args.budgets[1] after it, "snip" at
    the constant budget args.budgets[2] (chosen near the schedule's measured mean share)."""
    ckpt = checkpoint(args.phases[0])
    high, low, constant = args.budgets
    paper = dict(granularity="layer", wd_horizon="settled")  # the setting of the committed schedule results
    methods = {
        "bf16": None,
        "snip": PlannerConfig(budget=Budget.fp4_fraction(constant), interval=args.interval, **paper),
        "snip_schedule": PlannerConfig(budget=Budget.fp4_fraction(high), interval=args.interval, **paper,
                                       schedule=PrecisionSchedule(lr_decay=0.05,
                                                                  raised_budget=Budget.fp4_fraction(low))),
    }
    cache = CACHE / f"schedule-{args.phases[0]}-{args.steps}-{args.interval}-{high}-{low}-{constant}.json"
    done = read_cache(cache)
    for seed in args.seeds:
        for label, config in methods.items():
            key = f"{label}/{seed}"
            if key in done:
                continue
            check_cache_numerics(done, cache, args.phases[0])
            hooks = make_hooks(config, show_table=False, log=lambda m: None) if config else None
            s = continue_from(ckpt, args.steps, seed, hooks=hooks, constant_steps=args.steps // 2)
            history = [dict(h) for h in hooks.planner.history] if hooks else []
            done[key] = {"final_val_loss": s["final_val_loss"], "plans": history,
                         "mean_fp4_share": mean_fp4_share(history, args.steps) if history else 0.0}
            cache.write_text(json.dumps(done))
            print(f"{key}: val {s['final_val_loss']:.4f}, mean FP4 share {done[key]['mean_fp4_share']:.3f}", flush=True)
    table = {}
    for label in methods:
        gaps = [done[f"{label}/{s}"]["final_val_loss"] - done[f"bf16/{s}"]["final_val_loss"] for s in args.seeds]
        table[label] = {"gap_per_seed": gaps, "mean_gap": statistics.mean(gaps),
                        "std_gap": statistics.stdev(gaps) if len(gaps) > 1 else 0.0,
                        "mean_fp4_share": statistics.mean(done[f"{label}/{s}"]["mean_fp4_share"] for s in args.seeds),
                        "replans": [[(h["step"], h["why"], round(h["fp4_fraction"], 4)) for h in done[f"{label}/{s}"]["plans"]]
                                    for s in args.seeds]}
    closed = table["snip"]["mean_gap"] - table["snip_schedule"]["mean_gap"]
    md = [f"From the {args.phases[0]}-step bf16 checkpoint of the tiny preset, {args.steps} steps per branch: lr {LRS['tiny']:g} "
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
    write("schedule", {"phase": args.phases[0], "steps": args.steps, "interval": args.interval,
                       "budgets": {"before_decay": high, "after_decay": low, "constant": constant},
                       "seeds": args.seeds, "table": table, "gap_closed": closed, "runs": done}, "\n".join(md))


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


def bench_swap(args) -> None:
    """Fixed plans, paired per seed from one checkpoint: SNIP's plan (made once on the calibration batch at the
    first budget) and the variants of `swap_variants`, which move layer groups across precisions, whole or one
    side (forward / backward) at a time. This tests the planner's additive per-layer model directly: its
    objective predicts what each move costs, LD for the forward GEMM and WD for the backward ones; the
    branches measure it."""
    if not args.raise_layers or not args.lower_layers:
        raise SystemExit("swap needs --raise and --lower (layer-name suffixes)")
    ckpt = checkpoint(args.phases[0])
    stats = stats_at(ckpt, DivergenceConfig().draws)
    budget = Budget.fp4_fraction(args.budgets[0])
    plan = solve(stats, budget, ("fp8", "fp4"))
    variants = swap_variants({n: p.to_json() for n, p in plan.precisions.items()}, args.raise_layers,
                             args.lower_layers, "fp8", "fp4")
    shapes = layer_shapes(stats.layers)
    predicted = {}
    for label, v in variants.items():  # what SNIP's ILP would score each variant
        choice = Plan(v).assignment()
        predicted[label] = {**plan_objective(choice, stats, DEFAULT_LAMBDA),
                            "fp4_share": plan_metrics(choice, shapes, budget.cost_model).fp4_fraction}
    cache = CACHE / f"swap-{args.phases[0]}-{args.budgets[0]}-{args.steps}-e{args.eval_batches}.json"
    done = read_cache(cache)
    runs = {}  # {label: final validation loss per seed}
    for seed in args.seeds:
        for label, v in {"bf16": None, **variants}.items():
            key = f"{label}/{seed}/" + json.dumps(v, sort_keys=True)
            if key not in done:
                check_cache_numerics(done, cache, args.phases[0])
                s = continue_from(ckpt, args.steps, seed, precision=v, evals=1, eval_batches=args.eval_batches)
                done[key] = s["final_val_loss"]
                cache.write_text(json.dumps(done))
                print(f"{label} seed {seed}: val {done[key]:.4f}", flush=True)
            runs.setdefault(label, []).append(done[key])
    table = {}
    for label in variants:
        gaps = [v - b for v, b in zip(runs[label], runs["bf16"])]
        table[label] = {**predicted[label], "gap_per_seed": gaps, "mean_gap": statistics.mean(gaps),
                        "std_gap": statistics.stdev(gaps) if len(gaps) > 1 else 0.0}
    loss = stats.loss
    md = [f"From the {args.phases[0]}-step bf16 checkpoint of the tiny preset, {args.steps} steps per branch (cosine "
          f"decay to lr/10), seeds {args.seeds}, paired; fixed plans, no re-planning. snip: SNIP's plan at "
          f">= {100 * args.budgets[0]:.0f}% FP4 (fp8/fp4 per layer, planned once on the calibration batch). raised: "
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
    write("swap", {"phase": args.phases[0], "budget": args.budgets[0], "steps": args.steps, "seeds": args.seeds,
                   "eval_batches": args.eval_batches, "raise": args.raise_layers, "lower": args.lower_layers,
                   "calibration_loss": loss, "plans": variants, "table": table}, "\n".join(md))


def bench_demo(args) -> None:
    """The paired comparison (run_comparison: a bf16 warm-up of half the steps, then bf16, SNIP and
    layer_type branched from it on the same batches), end to end, timed."""
    out = CACHE / "demo"
    t = time.perf_counter()
    result = run_comparison(out, TrainConfig(preset="tiny", steps=args.steps, batch_size=args.batch, progress=False),
                            ComparisonConfig(branch_at=args.steps // 2, planner=PlannerConfig(budget=BUDGET,
                                                                                             interval=args.interval),
                                             baselines=("layer_type",), seeds=tuple(args.seeds)))
    total = time.perf_counter() - t
    res = {label: {"final_val_loss": row["final_val_loss"], "mean_gap_to_bf16": row["mean_gap"],
                   "time_s": [b["time_s"] for b in result["branches"] if b["method"] == label]}
           for label, row in result["table"].items()}
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    write("demo", {"steps": args.steps, "branch_at": args.steps // 2, "batch_size": args.batch,
                   "interval": args.interval, "seeds": args.seeds, "total_s": total, "runs": res, "files": files},
          f"snip_train.planning.run_comparison (a bf16 warm-up of {args.steps // 2} steps, then bf16, SNIP and "
          f"layer_type branched from it, seeds {args.seeds}), tiny preset, {args.steps} steps in all, batch "
          f"{args.batch} x 128: {total:.0f}s in total\n\n```\n{json.dumps(res, indent=1)}\n```\n\nfiles: {files}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("cost", "validity", "horizon", "wgrad_error", "scale", "staleness", "quality",
                                   "schedule", "swap", "demo"))
    p.add_argument("--steps", type=int, default=None, help="training steps per run")
    p.add_argument("--seeds", type=lambda s: [int(v) for v in s.split(",")], default=None)
    p.add_argument("--interval", type=int, default=None, help="SNIP re-plan interval")
    p.add_argument("--pre-steps", type=int, default=PRE_STEPS,
                   help="validity: bf16 steps of the checkpoint (default: %(default)s)")
    p.add_argument("--layers", type=int, default=None, help="validity: ground truths for the first N layers only")
    p.add_argument("--preset", default="tiny", choices=sorted(LRS),
                   help="quality: the model preset (default: %(default)s)")
    p.add_argument("--phases", type=lambda s: [int(v) for v in s.split(",")], default=None,
                   help="quality, horizon: bf16 checkpoint steps the branches start from (default: 100,400,1200); "
                        "schedule: the first one (default: 400)")
    p.add_argument("--budgets", type=lambda s: [float(v) for v in s.split(",")], default=None,
                   help="quality, horizon: FP4 shares of linear FLOPs (default: 0.5,0.75,0.8); schedule: before decay, "
                        "after decay, constant (default: 0.85,0.62,0.75)")
    p.add_argument("--methods", type=lambda s: s.split(","), default=None,
                   help="quality: bf16, snip, its ablations snip_ld, snip_wd, snip_lam0.1, snip_horizon, and heuristics; "
                        "random<k>: the random heuristic's draw k (the claim is ranked among the draws); "
                        f"a planned method + {GEMM_SUFFIX!r} plans per GEMM (default: all, per layer)")
    p.add_argument("--workers", type=int, default=1, help="quality: worker processes, one thread each")
    p.add_argument("--name", default=None, help="quality, scale: results file stem cpu-planner-<name> (default: the bench's)")
    p.add_argument("--claim", default="snip", help="quality: the method judged against every heuristic in the grid")
    p.add_argument("--report-only", action="store_true", help="quality: tabulate the runs already trained")
    p.add_argument("--runs-from", type=lambda s: [Path(v) for v in s.split(",")], default=[],
                   help="quality, with --report-only: also tabulate the runs of these results JSON files (seeds "
                        "trained on another machine)")
    p.add_argument("--eval-batches", type=int, default=64,
                   help="quality, scale: validation batches per evaluation, the same for every branch; the paired gap's "
                        "sampling error falls as 1/sqrt of it (default: %(default)s)")
    p.add_argument("--raise", dest="raise_layers", type=lambda s: s.split(","), default=None,
                   help="swap: layers (name suffixes) SNIP's plan also keeps in fp8")
    p.add_argument("--lower", dest="lower_layers", type=lambda s: s.split(","), default=None,
                   help="swap: layers (name suffixes) SNIP's plan also puts in fp4")
    p.add_argument("--batch", type=int, default=16, help="demo: sequences per step (default: %(default)s)")
    p.add_argument("--presets", type=lambda s: s.split(","), default=["tiny", "mini"],
                   help="cost: the presets whose measurement is timed (default: tiny,mini)")
    p.add_argument("--reps", type=int, default=None,
                   help="cost: interleaved repeats per preset (default: 5 for tiny, 3 otherwise)")
    p.add_argument("--offsets", type=lambda s: [int(v) for v in s.split(",")], default=[0, 10, 50],
                   help="staleness: steps after each phase at which its plan is judged (default: 0,10,50)")
    p.add_argument("--ilp-only", action="store_true",
                   help="cost: re-time the ILP only, keeping the measurement section of the last full run")
    p.add_argument("--amplify", type=lambda s: [float(v) for v in s.split(",")], default=[2.0, 3.0],
                   help="scale: the factors on every layer's FP4 GEMM error (default: 2,3)")
    p.add_argument("--gemms", type=lambda s: s.split(","), default=list(GEMMS),
                   help=f"scale: whose error is amplified, of {', '.join(SCALE_TARGETS)} (default: %(default)s)")
    p.add_argument("--blocks", type=lambda s: [int(v) for v in s.split(",")], default=None,
                   help="scale: amplify the error of one transformer block's layers at a time, these blocks (default: "
                        "every layer at once)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: on a shared 2-core machine two threads oversubscribe)")
    p.add_argument("--results", type=Path, default=None, help="where the results go (default: bench/results)")
    args = p.parse_args()
    if args.results is not None:
        global RESULTS
        RESULTS = args.results
    torch.set_num_threads(args.threads)
    defaults = {"validity": (30, [0, 1], None), "horizon": (0, [0], 50), "staleness": (0, [0], 50),
                "wgrad_error": (0, [0, 1, 2, 3], 0), "scale": (100, [0, 1, 2, 3], 0),
                "quality": (100, [0, 1, 2], 50),
                "schedule": (200, [0, 1, 2], 25),
                "swap": (100, [0, 1, 2, 3], 0),
                "demo": (300, [0], 100), "cost": (0, [0], 0)}
    steps, seeds, interval = defaults[args.what]
    args.steps = args.steps if args.steps is not None else steps
    args.seeds = args.seeds or seeds
    args.interval = args.interval or interval
    args.name = args.name or args.what
    if unknown := [g for g in args.gemms if g not in SCALE_TARGETS]:
        p.error(f"--gemms: unknown {', '.join(unknown)}; choose from {', '.join(SCALE_TARGETS)}")
    schedule = args.what == "schedule"
    args.phases = args.phases or ([PRE_STEPS] if schedule or args.what == "swap" else [100, PRE_STEPS, 1200])
    args.budgets = args.budgets or ([0.85, 0.62, 0.75] if schedule else [0.8] if args.what == "swap" else [0.5, 0.75, 0.8])
    if args.runs_from and not (args.what == "quality" and args.report_only):
        p.error("--runs-from tabulates committed runs: quality --report-only only")
    if schedule and len(args.budgets) != 3:
        p.error("schedule takes --budgets BEFORE_DECAY,AFTER_DECAY,CONSTANT")
    {"cost": bench_cost, "validity": bench_validity, "horizon": bench_horizon, "wgrad_error": bench_wgrad_error,
     "scale": bench_scale,
     "staleness": bench_staleness,
     "quality": bench_quality,
     "schedule": bench_schedule, "swap": bench_swap, "demo": bench_demo}[args.what](args)


if __name__ == "__main__":
    main()
