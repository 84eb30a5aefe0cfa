"""The quality grid: SNIP against the heuristics and bf16, paired per seed, from checkpoints at several phases.

    python -m experiments.quality                       # tiny: 100/400/1200 steps x 50/75/80% FP4 x 3 seeds
    python -m experiments.quality --methods bf16,snip_signal_gemm,random_gemm,min_abs_error_gemm \\
        --claim snip_signal_gemm --phases 100 --budgets 0.8 --seeds 0,1,2,3 --name quality-x --workers 2
    python -m experiments.quality --report-only --runs-from bench/results/cpu-planner-quality-signal.json \\
        --methods ... --phases ... --budgets ... --seeds ...   # tabulate committed runs, train nothing

From each bf16 checkpoint every method trains `--steps` steps (cosine decay to lr/10) on the batches of each seed:
every method of a seed sees the same batches from the same state (paired). Every planned method re-plans every
`--interval` steps from the same statistics with the same ILP at the same budget (the FP4 share of linear FLOPs).
Gap: final validation loss minus the bf16 branch's. Methods:
  bf16, uniform_fp4        the references (one run per seed, whatever the budget);
  snip_signal              SNIP at the planner's defaults, per layer (WD over the re-plan interval along the branch's
                           learning rates, wgrad's WD times Adam's signal share); snip_signal_gemm is exactly what
                           `snip train` plans;
  snip_ld                  LD alone (the ablation; WD's settings do not enter its plans);
  snip_struct              snip_signal with each layer's LD along its actual FP4 forward error (experiments.fp4_forward)
                           at every re-plan: the variant whose gain over the defaults is still open;
  the heuristics           first_last, layer_type, min_rel_error, min_abs_error, random (planner.baseline), and
                           random<k>: the random heuristic's draw k, among which the claim is ranked;
  + _drift                 re-plans spaced by the drift trigger instead of every interval; + _gemm: one precision per
                           GEMM instead of per layer.
Committed results of methods no longer here (experiments/README.md) re-tabulate from their raw runs with
--report-only: tabulating needs no planner.

Trained runs are cached in $SNIP_BENCH_CACHE/quality-runs.json (an interrupted grid resumes) with a digest of the
numerics they were trained under; runs of different digests are never paired (experiments.common.check_paired).
Results: bench/results/cpu-planner-<name>.json (summary), .runs.json.xz (the raw runs), .md, .png.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from experiments import results
from experiments.common import (CACHE, LRS, RUN, add_run_arguments, branch_config, check_trainable_beside, checkpoint,
                                checkpoint_path, continue_from, floats, ints, numerics)
from experiments.fp4_forward import StructuredLD
from experiments.quality_table import (DRIFT_SUFFIX, GEMM_SUFFIX, HEURISTICS, RANDOM_DRAW, QualityRun, base_method,
                                       grid, quality_random_ranks, quality_table, quality_verdicts)
from planner import DEFAULT_LAMBDA, Budget, PlannerConfig, PrecisionSchedule
from snip_ops.formats import GEMMS
from snip_train.planning import make_hooks
from snip_train.train import learning_rates

# The SNIP variants as PlannerConfig fields over a per-layer plan with the settled WD.
SNIP_VARIANTS = {"snip_signal": {"wd_horizon": "interval"}, "snip_ld": {"terms": "ld"},
                 "snip_struct": {"wd_horizon": "interval"}}
LR_SCHEDULED = ("snip_signal", "snip_struct")  # WD's horizon follows the branch's decay (SnipPlanner's lr_schedule)
ADJUSTED_STATS = {"snip_struct": StructuredLD}  # variants whose planner solves with adjusted statistics
ABLATION = ("snip_ld",)  # trained at the grid's middle budget only
# the drift trigger's re-plans: from interval / DRIFT_MIN_FRACTION steps apart up to the interval
DRIFT, DRIFT_MIN_FRACTION = 0.05, 5
CACHE_FILE = "quality-runs.json"


def drift_schedule(interval: int) -> PrecisionSchedule:
    return PrecisionSchedule(drift=DRIFT, min_interval=max(1, interval // DRIFT_MIN_FRACTION))


def planner_config(method: str, budget: float, interval: int) -> PlannerConfig:
    """The PlannerConfig of a planned method (SNIP_VARIANTS, a heuristic, random<k>; either + _drift, + _gemm)."""
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


def check_methods(methods: list[str], interval: int) -> None:
    """An unknown method fails here, not in a worker."""
    for m in methods:
        if m not in ("bf16", "uniform_fp4"):
            planner_config(m, 0.5, interval)


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
            hooks = adjusted(hooks)
        summary = continue_from(ckpt, run.steps, run.seed, hooks=hooks, **evaluate)
    plans = [dict(h) for h in hooks.planner.history] if hooks else []
    for summary_of_plan, plan in zip(plans, hooks.plans if hooks else []):  # which layer got which precision
        summary_of_plan["precisions"] = {n: p.to_json() for n, p in plan.precisions.items()}
    return {"final_val_loss": summary["final_val_loss"], "val": summary["history"]["val"],
            "fp4_fraction": statistics.mean(h["fp4_fraction"] for h in plans) if plans else
            (1.0 if run.method == "uniform_fp4" else 0.0),
            "plans": plans, "time_s": time.perf_counter() - t, "numerics": numerics(run.phase, run.preset)}


def train_missing(runs: list[QualityRun], done: dict, cache: Path, workers: int) -> None:
    """Train the runs not in `done` into it and into the cache, in `workers` processes."""
    todo = [r for r in runs if r.key not in done]
    for phase, seed in sorted({(r.phase, r.seed) for r in todo}):
        cached = {r.key: done[r.key] for r in runs if (r.phase, r.seed) == (phase, seed) and r.key in done}
        check_trainable_beside(cached, runs[0].preset, phase, seed)
    print(f"quality: {len(runs)} runs, {len(todo)} to train, {workers} workers", flush=True)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for r, result in zip(todo, pool.map(run_quality, todo)):
            done[r.key] = result
            results.save_run(cache, r.key, result)
            print(f"{r.key}: val {result['final_val_loss']:.4f} ({result['time_s']:.0f}s)", flush=True)


def checkpoint_val_losses(args) -> dict[int, float | None]:
    """{phase: its checkpoint's validation loss}: the checkpoint's, trained if need be; a report (--report-only)
    trains nothing and takes it from the cache, else from the first --runs-from summary that recorded it, else None."""
    out = {}
    for phase in args.phases:
        if not args.report_only or checkpoint_path(phase, args.preset).exists():
            out[phase] = checkpoint(phase, args.preset)["val_loss"]
            continue
        recorded = (json.loads(p.read_text()).get("checkpoint_val_loss", {}).get(str(phase))
                    for p in args.runs_from)
        out[phase] = next((v for v in recorded if v is not None), None)
    return out


def plot_quality(table: dict, path: Path, title: str, claim: str) -> None:
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
        colors = ["tab:red" if m == claim else "tab:orange" if m.startswith("snip") else "tab:gray" for m in methods]
        ax.barh(methods, [cell[m]["mean_gap"] for m in methods], xerr=[cell[m]["std_gap"] for m in methods],
                color=colors)
        ax.axvline(0.0, color="black", linewidth=0.8)
        phase, budget = key.split("/")
        ax.set_title(f"phase {phase}, {100 * float(budget):.0f}% FP4", fontsize=9)
        ax.tick_params(labelsize=7)
        ax.invert_yaxis()
    fig.suptitle(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def markdown(args, runs: list[QualityRun], done: dict, table: dict, verdicts: dict, ranks: dict,
             ckpts: dict[int, float | None]) -> str:
    md = [f"Preset {args.preset}; bf16 checkpoints after {', '.join(map(str, args.phases))} steps (one trajectory, "
          f"constant lr {LRS[args.preset]:g} after warmup; val loss "
          f"{', '.join('-' if v is None else f'{v:.4f}' for v in ckpts.values())}); from each, "
          f"{args.steps} steps per method (cosine decay to lr/10), seeds {args.seeds}: the seed picks the batches, and "
          "every method of a seed sees the same ones from the same state (paired). Every planned method re-plans "
          f"every {args.interval} steps from the same statistics with the same ILP at the same budget (FP4 share of "
          f"linear FLOPs). Gap: final validation loss (mean over the same {args.eval_batches} validation batches of "
          f"{RUN['batch_size']} x {RUN['seq_len']} tokens for every branch) minus the bf16 branch's, mean +- std over "
          f"seeds. snip_signal: SNIP at the planner's defaults (lambda {DEFAULT_LAMBDA:g}), per layer; snip_ld: LD "
          "alone; snip_struct: snip_signal with each layer's LD along its actual FP4 forward error; "
          f"*{GEMM_SUFFIX}: one precision per GEMM (forward, dgrad, wgrad) instead of per layer (snip_signal{GEMM_SUFFIX} "
          f"is what snip train plans); *{DRIFT_SUFFIX}: re-plans spaced by the drift trigger (regret threshold "
          f"{DRIFT:g}, from {drift_schedule(args.interval).min_interval} up to {args.interval} steps apart). Above FP4: "
          "of the GEMMs a method's plans keep above FP4 (every re-plan, every seed), the share that are forward, "
          "dgrad and wgrad GEMMs (by count). Methods are described in the module docstring of experiments.quality.",
          ""]
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
        if v := verdicts.get(key):
            md += ["", f"{args.claim} below every heuristic: {'yes' if v['below_every_heuristic'] else 'NO'}; margin to the "
                   f"best heuristic ({v['best_heuristic']}): {v['margin_to_best_heuristic']:+.4f} +- "
                   f"{v['margin_standard_error']:.4f} (paired per seed, standard error); below every heuristic "
                   f"on {v['seeds_below_every_heuristic']} of {len(args.seeds)} seeds; below every heuristic by more "
                   f"than two standard errors: {'yes' if v['resolved_below_every_heuristic'] else 'NO'}; were the "
                   "margins to hold, paired seeds that would resolve them: "
                   f"{v['seeds_to_resolve'] or 'none (a margin is not positive)'}.", ""]
        if r := ranks.get(key):
            md += [f"{args.claim} against {len(r['draws'])} random plans (mean gaps "
                   f"{', '.join(f'{g:+.4f}' for g in r['draw_mean_gaps'])}): below {r['below_draws']} of them; the "
                   f"draws' mean gap minus {args.claim}'s, paired per seed: {r['advantage_over_draw_mean']:+.4f} +- "
                   f"{r['advantage_standard_error']:.4f} (standard error).", ""]
    shares = collections.defaultdict(list)  # the planner's factor on wgrad's WD per phase and re-plan step
    for r in runs:
        for plan in done.get(r.key, {}).get("plans", []):
            if "wgrad_signal_share" in plan:
                shares[r.phase, plan["step"]].append(plan["wgrad_signal_share"])
    if shares:
        md += ["SNIP's factor on wgrad's WD (the signal share of Adam's v), mean [min, max] over its runs: "
               + "; ".join(f"{phase} steps + {step}: {statistics.mean(f):.3f} [{min(f):.3f}, {max(f):.3f}]"
                           for (phase, step), f in sorted(shares.items())) + ".", ""]
    return "\n".join(md)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny", choices=sorted(LRS), help="the model preset (default: %(default)s)")
    p.add_argument("--phases", type=ints, default=[100, 400, 1200],
                   help="bf16 checkpoint steps the branches start from (default: 100,400,1200)")
    p.add_argument("--budgets", type=floats, default=[0.5, 0.75, 0.8],
                   help="FP4 shares of linear FLOPs (default: 0.5,0.75,0.8)")
    p.add_argument("--seeds", type=ints, default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=100, help="training steps per branch (default: %(default)s)")
    p.add_argument("--interval", type=int, default=50, help="re-plan interval (default: %(default)s)")
    p.add_argument("--methods", type=lambda s: s.split(","), default=None,
                   help="bf16, uniform_fp4, SNIP variants, heuristics, random<k>, each planned one optionally + "
                        f"{DRIFT_SUFFIX!r}, + {GEMM_SUFFIX!r} (default: bf16, the SNIP variants and the heuristics, "
                        "per layer)")
    p.add_argument("--claim", default="snip_signal", help="the method judged against every heuristic in the grid")
    p.add_argument("--eval-batches", type=int, default=64,
                   help="validation batches per evaluation, the same for every branch; the paired gap's sampling error "
                        "falls as 1/sqrt of it (default: %(default)s)")
    p.add_argument("--workers", type=int, default=1, help="worker processes, one thread each")
    p.add_argument("--name", default="quality", help="results file stem cpu-planner-<name> (default: %(default)s)")
    p.add_argument("--report-only", action="store_true", help="tabulate the runs already trained, train nothing")
    p.add_argument("--runs-from", type=lambda s: [Path(v) for v in s.split(",")], default=[],
                   help="with --report-only: also tabulate the raw runs of these results summaries (seeds trained on "
                        "another machine)")
    add_run_arguments(p)
    args = p.parse_args()
    if args.runs_from and not args.report_only:
        p.error("--runs-from tabulates committed runs: with --report-only only")
    torch.set_num_threads(args.threads)
    methods = args.methods or ["bf16", *SNIP_VARIANTS, *HEURISTICS]
    if not args.report_only:  # a report tabulates whatever methods its runs were trained with
        check_methods(methods, args.interval)
    runs = grid(args.preset, args.phases, args.budgets, args.seeds, methods, args.steps, args.interval,
                args.eval_batches, ABLATION)
    cache = CACHE / CACHE_FILE
    done = results.with_runs_from(results.read_cache(cache), args.runs_from)
    t0 = time.perf_counter()
    if not args.report_only:
        for phase in args.phases:  # before the workers start, so that they only read them
            checkpoint(phase, args.preset)
        train_missing(runs, done, cache, args.workers)
    table = quality_table(runs, done, args.budgets, args.phases, args.seeds)
    verdicts, ranks = quality_verdicts(table, args.claim), quality_random_ranks(table, args.claim)
    ckpts = checkpoint_val_losses(args)
    if table:
        plot_quality(table, args.results / f"cpu-planner-{args.name}.png",
                     f"{args.preset}: gap to bf16 per method (mean +- std over {len(args.seeds)} seeds)", args.claim)
    results.write(args.results, args.name, {
        "preset": args.preset, "phases": args.phases, "budgets": args.budgets, "seeds": args.seeds, "steps": args.steps,
        "interval": args.interval, "eval_batches": args.eval_batches, "methods": methods, "claim": args.claim,
        "checkpoint_val_loss": ckpts, "wall_s": time.perf_counter() - t0, "table": table, "verdicts": verdicts,
        "random_ranks": ranks, "runs_from": [p.name for p in args.runs_from],
        "complete": all(r.key in done for r in runs), "runs": {r.key: done[r.key] for r in runs if r.key in done}},
        markdown(args, runs, done, table, verdicts, ranks, ckpts))


if __name__ == "__main__":
    main()
