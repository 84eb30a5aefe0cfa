"""BF16 + stochastic-rounding AdamW benchmarks (snip_ops.optim.AdamW).

    python -m bench.bench_optim quality   # tiny Llama: bf16+SR vs FP32-master mixed precision vs bf16 nearest
    python -m bench.bench_optim lr-range  # tiny Llama: largest stable learning rate of master vs bf16+SR
    python -m bench.bench_optim memory    # bytes per parameter of each strategy, analytic and measured
    python -m bench.bench_optim gpu       # step time on 1B parameters vs torch.optim.AdamW(fused=True) + BF16 copy
    python -m bench.bench_optim gpu --smoke --out X   # seconds on the CPU: the code runs, nothing is measured

quality, lr-range and memory run on the CPU and write bench/results/cpu-optim-<name>.{json,md}; gpu
writes bench/results/<device>-optim.json.

Strategies (all with BF16 autocast compute, so only the weight storage and update differ):
  master        FP32 parameters = the FP32 master copy, torch.optim.AdamW; the BF16 weights the GEMMs
                see are autocast's per-use copies (the memory table also lists the Megatron-style
                layout with a persistent BF16 copy)
  bf16_sr       BF16 parameters, snip_ops.optim.AdamW writing back with stochastic rounding
  bf16_nearest  BF16 parameters, the same optimizer writing back with round-to-nearest-even
lr-range compares master with bf16_sr twice: FP32 moments (the optimizer's default) and BF16 moments
(`bf16_sr_bf16_moments`, the stochastic-rounding paper's setting).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch

from bench.gpu_bench import add_timing_options, device_and_timer, write_device_result
from bench.run_record import RESULTS, provenance, write_result

STRATEGIES = {"master": "fp32", "bf16_sr": "bf16_sr", "bf16_nearest": "bf16_nearest"}  # -> TrainConfig.weights


# ---- quality ----------------------------------------------------------------------------------


def _quality_cell(cell: tuple[str, float, int, int]) -> dict:
    strategy, lr, seed, steps = cell
    torch.set_num_threads(1)
    from snip_train.train import TrainConfig, train

    t0 = time.perf_counter()
    s = train(TrainConfig(preset="tiny", steps=steps, batch_size=8, seq_len=64, lr=lr, warmup_steps=steps // 10,
                          weights=STRATEGIES[strategy], amp=True, seed=seed, eval_interval=0, eval_batches=8,
                          progress=False))
    return {"strategy": strategy, "lr": lr, "seed": seed, "final_val_loss": s["final_val_loss"],
            "final_train_loss": s["final_train_loss"], "diverged": s["diverged"],
            "time_s": time.perf_counter() - t0}


def quality(args) -> None:
    cells = [(st, lr, seed, args.steps) for lr in args.lrs for st in STRATEGIES for seed in range(args.seeds)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        rows = list(pool.map(_quality_cell, cells))
    wall = time.perf_counter() - t0
    table: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        table.setdefault(r["strategy"], {}).setdefault(str(r["lr"]), []).append(r["final_val_loss"])
    cmd = (f"python -m bench.bench_optim quality --steps {args.steps} --seeds {args.seeds} "
           f"--lrs {','.join(map(str, args.lrs))} --workers {args.workers}")
    result = {**provenance(cmd), "wall_s": wall, "setup": "tiny Llama (853K params), batch 8 x 64 tokens, AdamW betas "
              "(0.9, 0.95), weight decay 0.1, warmup 10% + cosine to 0.1 x lr, grad clip 1.0, BF16 autocast compute",
              "steps": args.steps, "rows": rows, "mean_final_val_loss": {
                  st: {lr: statistics.mean(v) for lr, v in by_lr.items()} for st, by_lr in table.items()}}
    lines = [f"# BF16 + SR AdamW: training quality (CPU)\n",
             f"- date {result['date']}, commit {result['commit']}", f"- command: `{cmd}`",
             f"- {result['setup']}; {args.steps} steps; {args.seeds} seeds; wall {wall / 60:.1f} min on "
             f"{result['cpus']} cores (load at start {result['loadavg_at_start'][0]:.1f})",
             "- value: final validation loss (nats/token, 8 fixed held-out batches), mean ± std over seeds\n",
             "| strategy | " + " | ".join(f"lr {lr:g}" for lr in args.lrs) + " |",
             "|---|" + "---|" * len(args.lrs)]
    for st in STRATEGIES:
        vals = []
        for lr in args.lrs:
            v = table[st][str(lr)]
            vals.append(f"{statistics.mean(v):.4f} ± {statistics.pstdev(v):.4f}")
        lines.append(f"| {st} | " + " | ".join(vals) + " |")
    lines.append("\nGap to FP32-master mixed precision at the same learning rate (mean over seeds):\n")
    lines.append("| strategy | " + " | ".join(f"lr {lr:g}" for lr in args.lrs) + " |")
    lines.append("|---|" + "---|" * len(args.lrs))
    for st in ("bf16_sr", "bf16_nearest"):
        gaps = [statistics.mean(table[st][str(lr)]) - statistics.mean(table["master"][str(lr)]) for lr in args.lrs]
        lines.append(f"| {st} | " + " | ".join(f"{g:+.4f}" for g in gaps) + " |")
    write_result("cpu-optim-quality", result, "\n".join(lines) + "\n")


# ---- lr-range ---------------------------------------------------------------------------------

# name -> (TrainConfig.weights, dtype of snip_ops.optim.AdamW's moments; None: torch.optim.AdamW, FP32 moments)
LR_RANGE_STRATEGIES: dict[str, tuple[str, torch.dtype | None]] = {
    "master": ("fp32", None),
    "bf16_sr": ("bf16_sr", torch.float32),
    "bf16_sr_bf16_moments": ("bf16_sr", torch.bfloat16),
}
LR_RANGE_BASELINE = "master"
# The offline rule's margin: the stability sweep's (snip_train.stability.SweepSpec.baseline_nats).
LR_RANGE_BASELINE_NATS = 0.3
# Finished cells, one JSON line each, so an interrupted or repeated run trains only what is missing.
CACHE = Path(os.environ.get("SNIP_BENCH_CACHE", Path(tempfile.gettempdir()) / "snip-optim-bench"))


@dataclass(frozen=True)
class LrRangeCell:
    """One training run of the lr-range grid. Runs with the same seed share the initial weights (BF16
    strategies: rounded to BF16), the training batches and the held-out batches."""

    strategy: str
    lr: float
    seed: int
    steps: int
    batch_size: int
    seq_len: int

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


@dataclass(frozen=True)
class StabilityEdge:
    """Where a learning-rate grid stops being stable.

    largest_stable_lr: the largest grid learning rate at and below which every grid learning rate is
        stable (None: not even the smallest is);
    first_unstable_lr: the smallest unstable grid learning rate (None: every one is stable, so
        largest_stable_lr is only a lower bound of the edge);
    stable_above_edge: stable grid learning rates above first_unstable_lr (a non-monotone grid: a
        stable run past the edge does not move the edge up).
    """

    largest_stable_lr: float | None
    first_unstable_lr: float | None
    stable_above_edge: tuple[float, ...] = ()


def stability_edge(stable_by_lr: Mapping[float, bool]) -> StabilityEdge:
    """The stability edge of a grid {learning rate: stable}."""
    if not stable_by_lr:
        raise ValueError("stability_edge: empty grid")
    lrs = sorted(stable_by_lr)
    first_unstable = next((lr for lr in lrs if not stable_by_lr[lr]), None)
    if first_unstable is None:
        return StabilityEdge(lrs[-1], None)
    below = [lr for lr in lrs if lr < first_unstable]
    return StabilityEdge(below[-1] if below else None, first_unstable,
                         tuple(lr for lr in lrs if lr > first_unstable and stable_by_lr[lr]))


def edge_ratio(edge: StabilityEdge, reference: StabilityEdge) -> tuple[float | None, str]:
    """`edge`'s largest stable learning rate divided by `reference`'s, and how to read the quotient.

    Each edge is known only to the grid: the true one lies in [largest_stable_lr, first_unstable_lr).
    The relation is "=" when both grid edges are found (the ratio of the grid edges; the true ratio
    is within one grid factor of it either way); ">=" / "<=" when only `edge` / only `reference` is
    stable over the whole grid (its grid edge is a lower bound); ">" / "<" when `reference` / `edge`
    is stable nowhere on the grid (the value is then a bound from the grid's ends); "?" (value None)
    when both are stable everywhere or both nowhere.
    """
    if edge.largest_stable_lr is None and reference.largest_stable_lr is None:
        return None, "?"
    if edge.largest_stable_lr is None:  # edge < its smallest (= first unstable) grid lr
        return edge.first_unstable_lr / reference.largest_stable_lr, "<"
    if reference.largest_stable_lr is None:  # reference < its smallest grid lr
        return edge.largest_stable_lr / reference.first_unstable_lr, ">"
    edge_open, reference_open = edge.first_unstable_lr is None, reference.first_unstable_lr is None
    if edge_open and reference_open:
        return None, "?"
    relation = ">=" if edge_open else "<=" if reference_open else "="
    return edge.largest_stable_lr / reference.largest_stable_lr, relation


def _format_ratio(ratio: tuple[float | None, str]) -> str:
    value, relation = ratio
    return "undetermined" if value is None else f"{'' if relation == '=' else relation + ' '}{value:.3g}x"


def keep_moments_in(dtype: torch.dtype, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """A TrainConfig.on_setup hook (bound with functools.partial) that makes snip_ops.optim.AdamW keep
    its moments in `dtype`: TrainConfig has no option for it, and the optimizer creates the moments at
    its first step, in the dtype its parameter group names."""
    for group in optimizer.param_groups:
        group["state_dtype"] = dtype


def _lr_range_run(cell: LrRangeCell) -> dict:
    """Train one cell; its record in the form snip_train.stability.analysis.judge reads, plus the
    step where the online rule fired and a loss curve."""
    torch.set_num_threads(1)
    from planner.stability import DivergenceRule, LossMonitor
    from snip_train.train import TrainConfig, train

    weights, moment_dtype = LR_RANGE_STRATEGIES[cell.strategy]
    t0 = time.perf_counter()
    s = train(TrainConfig(preset="tiny", steps=cell.steps, batch_size=cell.batch_size, seq_len=cell.seq_len,
                          lr=cell.lr, warmup_steps=cell.steps // 10, weights=weights, amp=True, seed=cell.seed,
                          eval_interval=0, eval_batches=8, progress=False,
                          on_setup=None if moment_dtype is None else partial(keep_moments_in, moment_dtype)))
    losses = s["history"]["train"]["loss"]
    # The online rule, applied to the whole history afterwards: the trainer stops only at a
    # non-finite loss, so a blown-up run trains on and its final loss shows whether it recovered.
    monitor = LossMonitor(DivergenceRule(), s["initial_val_loss"])
    fired = [step for step, loss in enumerate(losses, 1) if monitor.update(step, loss)]
    reason = "non-finite" if s["diverged"] else "blow-up" if fired else None
    return {
        "cell": {"precision": cell.strategy, "lr": cell.lr, "seed": cell.seed},
        "status": "complete",
        "diverged_online": reason is not None,
        "divergence_reason": reason,
        "diverged_at_step": fired[0] if fired else None,
        "initial_loss": s["initial_val_loss"],
        "final_loss": None if s["diverged"] else s["final_val_loss"],  # held-out, 8 batches
        "final_train_loss": s["final_train_loss"] if math.isfinite(s["final_train_loss"]) else None,
        "max_train_loss": max((v for v in losses if math.isfinite(v)), default=None),
        "spikes": len(monitor.spike_steps),
        "steps": s["steps"],
        "train_loss_every_10": [round(v, 4) if math.isfinite(v) else None for v in losses[9::10]],
        "time_s": time.perf_counter() - t0,
    }


def _run_cells(cells: list[LrRangeCell], workers: int, cache: Path) -> tuple[dict[str, dict], int]:
    """({cell key: record} of every cell, how many were trained now): records come from the cache,
    else from training (and are appended to the cache)."""
    done: dict[str, dict] = {}
    if cache.exists():
        for line in cache.read_text().splitlines():
            entry = json.loads(line)
            done[entry["key"]] = entry["record"]
    todo = [c for c in cells if c.key() not in done]
    print(f"lr-range: {len(cells) - len(todo)} of {len(cells)} runs cached in {cache}, training {len(todo)}",
          flush=True)
    cache.parent.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(workers) as pool, cache.open("a") as out:
        for i, (cell, record) in enumerate(zip(todo, pool.map(_lr_range_run, todo)), 1):
            out.write(json.dumps({"key": cell.key(), "record": record}) + "\n")
            out.flush()
            done[cell.key()] = record
            print(f"  [{i}/{len(todo)}] {cell.strategy} lr {cell.lr:g} seed {cell.seed}: final "
                  f"{record['final_loss']}, {record['divergence_reason'] or 'stable online'} "
                  f"({record['time_s']:.1f} s)", flush=True)
    return {c.key(): done[c.key()] for c in cells}, len(todo)


def _mean_std(values: list[float]) -> str:
    if not values:
        return "–"
    return f"{statistics.mean(values):.3f} ± {statistics.pstdev(values):.3f}"


def summarize_lr_range(verdicts: list[dict], strategies: list[str], lrs: list[float], seeds: list[int],
                       baseline: str, near_best_nats: float) -> dict:
    """Per strategy, from judge()'s verdicts (one per strategy x lr x seed):

    * the stability edge over all seeds (a grid learning rate is stable when the runs of every seed
      are) and per seed, and their ratios to `baseline`'s (per seed: paired with the same seed's);
    * the learning rate with the lowest mean final loss among those up to the edge;
    * the quality edge: the stability edge of the grid from that learning rate up, with a learning
      rate counting only where, besides, the mean final loss is within `near_best_nats` of
      `baseline`'s lowest (it trains well, not just without diverging), and its ratio to `baseline`'s.
      (From the best learning rate up, because too small a learning rate trains too slowly to count.)
    """
    by = {(v["precision"], v["lr"], v["seed"]): v for v in verdicts}

    def stable(st, lr):
        return not any(by[st, lr, s]["diverged"] for s in seeds)

    def mean_loss(st, lr):
        return statistics.mean(by[st, lr, s]["final_loss"] for s in seeds)

    edges = {st: stability_edge({lr: stable(st, lr) for lr in lrs}) for st in strategies}
    seed_edges = {st: {s: stability_edge({lr: not by[st, lr, s]["diverged"] for lr in lrs}) for s in seeds}
                  for st in strategies}
    best = {st: min((lr for lr in lrs if edges[st].largest_stable_lr is not None
                     and lr <= edges[st].largest_stable_lr), key=lambda lr: mean_loss(st, lr), default=None)
            for st in strategies}
    ceiling = None if best[baseline] is None else mean_loss(baseline, best[baseline]) + near_best_nats
    quality_edges = {st: stability_edge({lr: ceiling is not None and stable(st, lr) and mean_loss(st, lr) <= ceiling
                                         for lr in lrs if best[st] is None or lr >= best[st]})
                     for st in strategies}
    return {st: {
        "edge": asdict(edges[st]),
        "ratio_to_baseline": edge_ratio(edges[st], edges[baseline]),
        "seed_edges": {s: asdict(e) for s, e in seed_edges[st].items()},
        "seed_ratios_to_baseline": [edge_ratio(seed_edges[st][s], seed_edges[baseline][s]) for s in seeds],
        "best_lr": best[st],
        "best_mean_final_loss": None if best[st] is None else mean_loss(st, best[st]),
        "quality_edge": asdict(quality_edges[st]),
        "quality_ratio_to_baseline": edge_ratio(quality_edges[st], quality_edges[baseline]),
    } for st in strategies}


def _lr_range_markdown(result: dict, strategies: list[str], lrs: list[float], seeds: list[int]) -> str:
    summary, baseline = result["summary"], result["baseline"]
    by = {(v["precision"], v["lr"], v["seed"]): v for v in result["verdicts"]}
    lines = [
        "# BF16 + SR AdamW: largest stable learning rate (CPU)\n",
        f"- date {result['date']}, commit {result['commit']}",
        f"- command: `{result['command']}`",
        f"- machine: {result['machine']['cpu']}, {result['machine']['cores']} cores, "
        f"torch {result['machine']['torch']}, "
        f"1 thread per run, {result['workers']} worker(s); load at start {result['loadavg_at_start'][0]:.1f}; "
        f"wall {result['wall_s'] / 60:.1f} min ({result['runs_trained']} of {len(result['verdicts'])} runs trained "
        f"now, the rest from the cache); training time summed over all runs "
        f"{sum(v['record']['time_s'] for v in result['verdicts']) / 60:.1f} min",
        f"- {result['setup']}; {result['steps']} steps; seeds {', '.join(map(str, seeds))} (paired: a seed fixes the "
        "initial weights, the batches and the SR bits for every strategy)",
        f"- grid: peak learning rates {', '.join(f'{lr:g}' for lr in lrs)}",
        f"- {result['divergence_rule']}",
        "- largest stable LR: the largest grid LR at and below which every grid LR is stable; a grid LR is "
        "stable for a strategy when the runs of all seeds are; per seed, the same over that seed's runs. "
        "The true edge lies between it and the next grid LR.",
        f"- largest LR near {baseline}'s best: the same, scanning up from the strategy's lowest-loss LR, with a grid "
        f"LR counting only where, besides, the mean final held-out loss is within {result['baseline_nats']} nats of "
        f"{baseline}'s lowest (it trains well, not just without diverging)\n",
        "## Largest stable learning rate\n",
        f"| strategy | largest stable LR (all seeds) | first unstable LR | ratio to {baseline} | per seed "
        f"(largest stable LR) | per-seed ratio to {baseline} (paired) |",
        "|---|---|---|---|---|---|",
    ]

    def lr_text(lr):
        return "none" if lr is None else f"{lr:g}"

    def edge_text(edge):
        above = f" (stable again at {', '.join(map(lr_text, edge['stable_above_edge']))})" \
            if edge["stable_above_edge"] else ""
        return f"{lr_text(edge['largest_stable_lr'])} | {lr_text(edge['first_unstable_lr'])}{above}"

    for st in strategies:
        s = summary[st]
        seed_edges = ", ".join(lr_text(s["seed_edges"][seed]["largest_stable_lr"]) for seed in seeds)
        seed_ratios = ", ".join(_format_ratio(r) for r in s["seed_ratios_to_baseline"])
        lines.append(f"| {st} | {edge_text(s['edge'])} | {_format_ratio(s['ratio_to_baseline'])} | {seed_edges} | "
                     f"{seed_ratios} |")
    lines += ["", "## Learning rates that train well\n",
              f"| strategy | lowest mean final loss (at LR) | largest LR near {baseline}'s best | next grid LR | "
              f"ratio to {baseline} |", "|---|---|---|---|---|"]
    for st in strategies:
        s = summary[st]
        best = "–" if s["best_lr"] is None else f"{s['best_mean_final_loss']:.3f} ({s['best_lr']:g})"
        lines.append(f"| {st} | {best} | {edge_text(s['quality_edge'])} | "
                     f"{_format_ratio(s['quality_ratio_to_baseline'])} |")

    verdict = _lr_range_verdict(summary, strategies, baseline, result["steps"], result["baseline_nats"])
    lines += ["", "## Verdict\n", verdict, ""]

    def by_lr_table(title, cell_text):
        rows = [f"## {title}\n", "| strategy | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |",
                "|---|" + "---|" * len(lrs)]
        for st in strategies:
            rows.append(f"| {st} | " + " | ".join(cell_text([by[st, lr, s] for s in seeds]) for lr in lrs) + " |")
        return rows + [""]

    def diverged_text(vs):
        n = sum(v["diverged"] for v in vs)
        reasons = sorted({v["reason"] for v in vs if v["reason"]})
        return f"{n}/{len(vs)}" + (f" ({', '.join(reasons)})" if reasons else "")

    lines += by_lr_table("Diverged runs (diverged / seeds, reasons)", diverged_text)
    lines += by_lr_table("Final held-out loss of the runs that did not diverge (nats/token, mean ± std over seeds)",
                         lambda vs: _mean_std([v["final_loss"] for v in vs if not v["diverged"]]))
    lines += by_lr_table("Final held-out loss of every run, diverged ones included (– : non-finite)",
                         lambda vs: _mean_std([v["final_loss"] for v in vs if v["final_loss"] is not None]))
    lines += by_lr_table("Highest training loss of a step (mean over seeds; untrained: "
                         f"{statistics.mean(v['record']['initial_loss'] for v in result['verdicts']):.2f})",
                         lambda vs: f"{statistics.mean(v['record']['max_train_loss'] or math.inf for v in vs):.1f}")
    if "bf16_sr" in strategies and "bf16_sr_bf16_moments" in strategies:
        lines.append("## BF16 vs FP32 moments\n")
        lines.append("BF16 moments minus FP32 moments (bf16_sr), final held-out loss, paired by seed, mean ± std over "
                     "seeds where neither run diverged:\n")
        lines.append("| | " + " | ".join(f"lr {lr:g}" for lr in lrs) + " |")
        lines.append("|---|" + "---|" * len(lrs))
        gaps = []
        for lr in lrs:
            d = [by["bf16_sr_bf16_moments", lr, s]["final_loss"] - by["bf16_sr", lr, s]["final_loss"] for s in seeds
                 if not by["bf16_sr_bf16_moments", lr, s]["diverged"] and not by["bf16_sr", lr, s]["diverged"]]
            gaps.append("–" if not d else f"{statistics.mean(d):+.3f} ± {statistics.pstdev(d):.3f}")
        lines.append("| gap | " + " | ".join(gaps) + " |\n")
    lines += ["## Caveats\n", _lr_range_caveats(result)]
    return "\n".join(lines) + "\n"


def _spacing(lrs: list[float]) -> str:
    factors = [b / a for a, b in zip(lrs, lrs[1:])]
    if factors and max(factors) - min(factors) <= 1e-9 * max(factors):
        return f"factor {factors[0]:.3g}: a ratio of 1x means between 1/{factors[0]:.3g}x and {factors[0]:.3g}x"
    return "not geometric: the steps between neighbouring grid learning rates bound the error"


def _lr_range_caveats(result: dict) -> str:
    """What the unstable runs did (from the records), then the limits of this setting."""
    records = [v["record"] for v in result["verdicts"]]
    blown_up = [r for r in records if r["divergence_reason"] == "blow-up"]
    non_finite = sum(r["divergence_reason"] == "non-finite" for r in records)
    lines = [f"- {len(blown_up)} runs blew up and {non_finite} had a non-finite loss."]
    if blown_up:
        from planner.stability import DivergenceRule

        # the rule fires `blowup_patience` steps after the smoothed loss first stays above its ceiling
        above_from = [r["diverged_at_step"] - DivergenceRule().blowup_patience + 1 for r in blown_up]
        finals = [r["final_loss"] for r in blown_up]
        lines[0] += (f" Their smoothed loss rose above the ceiling (untrained + 1 nat) at steps "
                     f"{min(above_from)}-{max(above_from)}, within the warmup ({result['steps'] // 10} steps), and "
                     "stayed "
                     f"above it for the rule's {DivergenceRule().blowup_patience} steps; "
                     f"trained on as the cosine schedule lowers the learning rate, the blown-up runs ended at held-out "
                     f"losses {min(finals):.2f}-{max(finals):.2f} (untrained: "
                     f"{statistics.mean(r['initial_loss'] for r in records):.2f}). The edge measured here is that "
                     "of an early blow-up the model recovers from, not of a late divergence.")
    lines += [
        f"- A 0.85M-parameter model trained for {result['steps']} steps of "
        f"{result['batch_size'] * result['seq_len']} tokens, not the paper's pre-training of models of up to 6.7B "
        "parameters. Gradient clipping at 1.0 and Adam's normalised update bound every step, so "
        "this model survives learning rates far above those that train it well; the failures that large learning "
        "rates cause late in long runs of large models cannot show here.",
        "- At learning rates that blow up, an Adam update (about the learning rate per element) is many BF16 ulps of "
        "weights of magnitude 1 or less, so how the weights are rounded "
        "(FP32 master, or BF16 with SR) changes little in the first steps, where the blow-up happens. SR's advantage "
        "over round-to-nearest is at small updates (bench/results/cpu-optim-quality.md).",
        "- beta2 is 0.95 here: (1 - beta2) g^2 is well above half a BF16 ulp of v, so this run does not test BF16 "
        "moments where the increment of v falls below the rounding step (beta2 = 0.999, the optimizer's default) and "
        "only SR keeps it, in expectation.",
        f"- Every edge and ratio is known only to the grid's spacing ({_spacing(result['learning_rates'])}).",
    ]
    return "\n".join(lines)


def _against_the_claim(ratio: tuple[float | None, str]) -> str:
    """What a ratio to master's learning rate (edge_ratio's) says about the paper's 2-4x."""
    value, relation = ratio
    if value is None:
        return "cannot be compared with the paper's 2-4x on this grid"
    if relation in ("=", "<=", "<") and value < 2:
        return "the paper's 2-4x is not reproduced"
    if relation == "=":
        return "the paper's 2-4x is reproduced" if value <= 4 else "more than the paper's 2-4x"
    if relation in (">=", ">"):
        return "at least the paper's 2x (a lower bound: stable over the whole grid)"
    return "not decided by this grid"


def _lr_range_verdict(summary: dict, strategies: list[str], baseline: str, steps: int, near_best_nats: float) -> str:
    """One plain sentence per compared strategy: is the paper's 2-4x reproduced here?"""
    sentences = []
    for st in strategies:
        if st == baseline:
            continue
        stability, quality = summary[st]["ratio_to_baseline"], summary[st]["quality_ratio_to_baseline"]
        sentences.append(
            f"**{st}** (tiny model, {steps} steps): largest stable learning rate {_format_ratio(stability)} "
            f"{baseline}'s"
            f" — {_against_the_claim(stability)}; largest learning rate training within {near_best_nats} nats of "
            f"{baseline}'s best loss {_format_ratio(quality)} {baseline}'s — {_against_the_claim(quality)}.")
    return "\n\n".join(sentences)


def lr_range(args) -> None:
    from planner.stability import DivergenceRule
    from snip_train.stability.analysis import judge
    from snip_train.stability.report import machine_info

    strategies, lrs, seeds = list(LR_RANGE_STRATEGIES), sorted(args.lrs), list(range(args.seeds))
    cells = [LrRangeCell(st, lr, seed, args.steps, args.batch_size, args.seq_len)
             for lr in lrs for seed in seeds for st in strategies]
    t0 = time.perf_counter()
    records, trained = _run_cells(cells, args.workers, CACHE / "lr-range-cells.jsonl")
    wall = time.perf_counter() - t0
    verdicts = judge(list(records.values()), LR_RANGE_BASELINE, LR_RANGE_BASELINE_NATS)
    rule = DivergenceRule()  # the online rule _lr_range_run applied
    cmd = (f"python -m bench.bench_optim lr-range --steps {args.steps} --seeds {args.seeds} --lrs "
           f"{','.join(map(str, lrs))} --batch-size {args.batch_size} --seq-len {args.seq_len} "
           f"--workers {args.workers}")
    result = {
        **provenance(cmd), "machine": machine_info(), "wall_s": wall, "workers": args.workers,
        "runs_trained": trained,
        "setup": f"tiny Llama (853K params), batch {args.batch_size} x {args.seq_len} tokens, AdamW betas (0.9, 0.95), "
                 "weight decay 0.1, warmup 10% + cosine to 0.1 x peak lr, grad clip 1.0, BF16 autocast compute",
        "steps": args.steps, "batch_size": args.batch_size, "seq_len": args.seq_len, "seeds": seeds,
        "learning_rates": lrs, "strategies": {
            st: {"weights": w, "moments": "torch.optim.AdamW FP32" if d is None else str(d).removeprefix("torch.")}
            for st, (w, d) in LR_RANGE_STRATEGIES.items()},
        "baseline": LR_RANGE_BASELINE, "baseline_nats": LR_RANGE_BASELINE_NATS,
        "divergence_rule": (
            "diverged (planner/stability/divergence.py, as the stability sweep applies it): online, a non-finite "
            f"training loss, or the EMA (alpha {rule.ema_alpha}) of the training loss above the untrained held-out "
            f"loss + {rule.blowup_nats} nats for {rule.blowup_patience} consecutive steps ('blow-up'; judged on the "
            "whole history, the run trains on); offline, a final "
            f"held-out loss more than {LR_RANGE_BASELINE_NATS} nats above the mean final loss of the "
            f"{LR_RANGE_BASELINE} runs at the same LR that did not diverge online ('above-baseline'; "
            f"{LR_RANGE_BASELINE}'s own runs "
            "included; where all of them diverged, the online rule alone decides). Stable: not diverged"),
        "verdicts": verdicts,
        "summary": summarize_lr_range(verdicts, strategies, lrs, seeds, LR_RANGE_BASELINE, LR_RANGE_BASELINE_NATS),
    }
    write_result("cpu-optim-lr-range", result, _lr_range_markdown(result, strategies, lrs, seeds), args.results)


# ---- memory -----------------------------------------------------------------------------------

# Persistent bytes per parameter: weights, gradient, optimizer state (excluding activations).
ANALYTIC = {
    "master (FP32 params + AdamW, BF16 autocast copies)": {"weights": 4, "grad": 4, "m+v": 8},
    "Megatron-style (BF16 weights + FP32 master + BF16 grads)": {"weights": 2, "master": 4, "grad": 2, "m+v": 8},
    "bf16_sr / bf16_nearest, FP32 moments": {"weights": 2, "grad": 2, "m+v": 8},
    "bf16_sr, BF16 moments": {"weights": 2, "grad": 2, "m+v": 4},
}


def _measured_bytes(weights: str, state_dtype: torch.dtype) -> dict:
    from snip_ops.optim import AdamW
    from snip_train.model import Llama, LlamaConfig

    torch.manual_seed(0)
    dtype = torch.float32 if weights == "fp32" else torch.bfloat16
    model = Llama(LlamaConfig.preset("small")).to(dtype)
    params = list(model.parameters())
    opt = (torch.optim.AdamW(params, lr=1e-3) if weights == "fp32"
           else AdamW(params, lr=1e-3, state_dtype=state_dtype))
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    n = sum(p.numel() for p in params)
    state = sum(t.nbytes for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor))
    return {"params": n, "weights": sum(p.nbytes for p in params) / n, "grad": sum(p.grad.nbytes for p in params) / n,
            "optimizer_state": state / n,
            "total": (sum(p.nbytes + p.grad.nbytes for p in params) + state) / n}


def memory(args) -> None:
    measured = {
        "master (FP32 params + torch AdamW)": _measured_bytes("fp32", torch.float32),
        "bf16_sr, FP32 moments": _measured_bytes("bf16_sr", torch.float32),
        "bf16_sr, BF16 moments": _measured_bytes("bf16_sr", torch.bfloat16),
    }
    result = {**provenance("python -m bench.bench_optim memory"), "analytic_bytes_per_param": ANALYTIC,
              "measured_bytes_per_param": measured,
              "method": "measured: tensor bytes of parameters, gradients and optimizer state (step counters "
                        "included) of the 'small' Llama after one step, divided by the parameter count"}
    lines = ["# BF16 + SR AdamW: memory per parameter\n", f"- date {result['date']}, commit {result['commit']}",
             "- command: `python -m bench.bench_optim memory`", f"- {result['method']}\n",
             "| strategy (analytic) | bytes / param | breakdown |", "|---|---|---|"]
    for name, parts in ANALYTIC.items():
        lines.append(f"| {name} | {sum(parts.values())} | " + ", ".join(f"{k} {v}" for k, v in parts.items()) + " |")
    lines += ["", f"| strategy (measured, {next(iter(measured.values()))['params'] / 1e6:.1f}M params) | "
              "weights | grad | optimizer state | total |", "|---|---|---|---|---|"]
    for name, m in measured.items():
        lines.append(f"| {name} | {m['weights']:.2f} | {m['grad']:.2f} | {m['optimizer_state']:.2f} | {m['total']:.2f} |")
    base = measured["master (FP32 params + torch AdamW)"]["total"]
    lines.append(f"\nbf16_sr with FP32 moments saves {1 - measured['bf16_sr, FP32 moments']['total'] / base:.0%} of "
                 f"the persistent training memory of the FP32-master layout, with BF16 moments "
                 f"{1 - measured['bf16_sr, BF16 moments']['total'] / base:.0%}.")
    write_result("cpu-optim-memory", result, "\n".join(lines) + "\n")


# ---- GPU step time ----------------------------------------------------------------------------


def gpu(args) -> None:
    from snip_ops.optim import AdamW

    dev, name, timer = device_and_timer(args, "bench_optim gpu")
    # a 1B-parameter set of tensors with Llama-1B-like shapes (a smoke run: two small ones)
    shapes = [(64, 48), (37, 5)] if args.smoke else [(2048, 2048)] * 4 * 16 + [(8192, 2048)] * 3 * 16 + [(32000, 2048)] * 2
    n = sum(a * b for a, b in shapes)
    entries = []

    def tensors(dtype):
        ps = [torch.nn.Parameter(torch.randn(s, device=dev, dtype=dtype) * 0.02) for s in shapes]
        for p in ps:
            p.grad = torch.randn_like(p) * 1e-3
        return ps

    # device copy bandwidth: read + write of a 2 GiB buffer
    src = torch.empty(2**10 if args.smoke else 2**30, dtype=torch.bfloat16, device=dev)
    dst = torch.empty_like(src)
    t = timer(lambda: dst.copy_(src))
    copy_bw = 2 * src.nbytes / t
    del src, dst
    entries.append({"name": "device copy", "seconds": t, "bandwidth_GBps": copy_bw / 1e9})

    for state_dtype, bytes_per in ((torch.float32, 2 * 2 + 2 + 4 * 4), (torch.bfloat16, 2 * 2 + 2 + 2 * 4)):
        ps = tensors(torch.bfloat16)
        opt = AdamW(ps, lr=1e-4, state_dtype=state_dtype, implementation="kernel")
        t = timer(opt.step)
        entries.append({"name": f"snip AdamW bf16 SR, {str(state_dtype)[6:]} moments", "seconds": t,
                        "bytes_moved": bytes_per * n, "bandwidth_fraction_of_copy": bytes_per * n / t / copy_bw})
        del ps, opt
        torch.cuda.empty_cache()  # a no-op where CUDA never started (smoke runs)

    master = tensors(torch.float32)
    bf16 = [p.detach().to(torch.bfloat16) for p in master]
    opt = torch.optim.AdamW(master, lr=1e-4, fused=True)

    def torch_step():
        opt.step()
        torch._foreach_copy_(bf16, master)

    t = timer(torch_step)
    entries.append({"name": "torch.optim.AdamW(fused=True) on FP32 master + BF16 copy", "seconds": t,
                    "bytes_moved": (4 * 2 + 4 + 8 * 2 + 4 + 2) * n})
    method = ("smoke run: one host-clocked step each" if args.smoke else
              f"CUDA events, L2 flushed, median of {args.iters} after {args.warmup} warm-up steps")
    result = {**provenance("python -m bench.bench_optim gpu"), "device": name, "params": n, "entries": entries,
              "method": method}
    write_device_result(result, "optim", args.out)
    print(json.dumps(result, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    q = sub.add_parser("quality")
    q.add_argument("--steps", type=int, default=200)
    q.add_argument("--seeds", type=int, default=3)
    q.add_argument("--lrs", type=lambda s: [float(x) for x in s.split(",")], default=[1e-4, 3e-4, 1e-3])
    q.add_argument("--workers", type=int, default=2)
    r = sub.add_parser("lr-range", help="largest stable learning rate: master vs bf16+SR (FP32 / BF16 moments)")
    r.add_argument("--steps", type=int, default=300)
    r.add_argument("--seeds", type=int, default=4)
    r.add_argument("--lrs", type=lambda s: [float(x) for x in s.split(",")],
                   default=[2.0**k for k in range(-10, 2)], help="peak learning rates (default: 2^-10 .. 2)")
    r.add_argument("--batch-size", type=int, default=8)
    r.add_argument("--seq-len", type=int, default=64)
    r.add_argument("--workers", type=int, default=1, help="training processes (one torch thread each)")
    r.add_argument("--results", type=Path, default=RESULTS, help="where the .json/.md go")
    sub.add_parser("memory")
    g = sub.add_parser("gpu")
    add_timing_options(g, "optim", warmup=3, iters=10)
    args = p.parse_args()
    {"quality": quality, "lr-range": lr_range, "memory": memory, "gpu": gpu}[args.what](args)


if __name__ == "__main__":
    main()
