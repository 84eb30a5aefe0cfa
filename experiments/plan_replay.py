"""Which of a branch's plans decides its gap, and what a plan's GEMMs buy: the quality grid's branches trained again
with their plans mixed or changed.

    python -m experiments.plan_replay --phase 100 --budget 0.8 --seeds 0,1,2,3,4,5,6,7,8,9 \\
        --mixes snip_signal_gemm+snip_ld_gemm,snip_ld_gemm+snip_signal_gemm --workers 2
    python -m experiments.plan_replay --phase 100 --budget 0.8 --seeds 0,1,2,3,4,5,6,7,8,9 \\
        --changes snip_signal_gemm:reseed,snip_signal_gemm:bwd_fp4 --workers 2

A planned branch of the quality grid (experiments.quality) installs a plan at its first step and re-plans every
`--interval` steps. The mix "A+B" trains seed s's branch again, from the same checkpoint on the same batches, with
method A's first plan (the one A made at step 0 of that branch) and method B's later ones (those B made at steps
interval, 2 interval, ...), installed as fixed plans at the steps they were made: no statistics, no solver. The plans
are read from the quality grid's cached runs (and from committed quality results, --runs-from), which are trained
first where missing. A method's own plans replayed (A+A) give its branch back bit for bit
(tests/experiments/test_plan_replay.py), so every mix is paired with the grid's
branches of A and B: where A+B lands on A, the first plan decides the gap; where it lands on B, the later ones.

A change "A:C" trains A's branch again with A's own plans changed by C (CHANGES): "reseed" keeps the plans and gives
every layer another stochastic-rounding seed, so that only the rounding bits differ from A's branch. How far that moves
a branch is the grid's noise floor: two plans whose paired difference is within it are not told apart by these seeds.
The others move some GEMMs of A's first plan (the one that decides a branch) to another precision: what those GEMMs in
FP8 buy, paired on the same batches and state, where A's own gap is all they can be compared with.

Every replay records the numerics it was trained under (experiments.common.numerics), and a seed's replays and grid branches
are paired only under one: a cache copied from another machine fails here rather than mix two CPUs' rounding.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import re
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from experiments import results
from experiments.common import (CACHE, LRS, add_run_arguments, check_paired, check_trainable_beside, checkpoint,
                                continue_from, mean_se, numerics)
from experiments.quality import CACHE_FILE, planner_config, run_quality
from experiments.quality_table import DRIFT_SUFFIX, GEMM_SUFFIX, QualityRun
from planner import Plan
from snip_ops import SnipLinear, convert
from snip_ops.formats import GEMMS, LinearPrecision


class ReplayedPlans:
    """Hooks for `experiments.common.continue_from` that install fixed plans ({step: {layer: precision}}) at their steps,
    on the model the planner's hooks would have converted (SnipLinear layers, bf16 until the first plan), with every
    layer's stochastic-rounding seed shifted by `seed_shift` (0: the seeds the planned branch had)."""

    def __init__(self, plans: dict[int, dict], seed_shift: int = 0):
        if 0 not in plans:
            raise ValueError(f"a replay needs a plan at step 0, got plans at steps {sorted(plans)}")
        self.plans, self.seed_shift = plans, seed_shift

    def on_setup(self, model, opt) -> None:
        convert(model)
        for layer in model.modules():
            if isinstance(layer, SnipLinear):
                layer.seed += self.seed_shift

    def on_step(self, step, model, batch) -> None:
        if step in self.plans:
            Plan(self.plans[step]).apply(model)


@dataclasses.dataclass(frozen=True)
class Mix:
    """The branch of `first` (a quality-grid run) with its own plan at step 0 and method `then`'s plans after it."""

    first: QualityRun
    then: str

    @property
    def key(self) -> str:
        return f"{self.first.key}+{self.then}"

    @property
    def seed(self) -> int:
        return self.first.seed


# A change's GEMMs: (layer FQN pattern, GEMMs, the precision they get in the first plan). Block 0 is the embedding's
# neighbour, whose backward GEMMs SNIP's early plans keep in FP8; the deeper blocks' forward GEMMs are what LD alone
# keeps instead (docs/planner-evidence.md, "Which plan decides a branch").
MOVED_GEMMS = {"bwd_fp4": (r"\.layers\.\d+\.", ("dgrad", "wgrad"), "fp4"),
               "block0_bwd_fp4": (r"\.layers\.0\.", ("dgrad", "wgrad"), "fp4"),
               "deep_fwd_fp4": (r"\.layers\.(?!0\.)\d+\.", ("fprop",), "fp4")}
CHANGES = ("reseed", *MOVED_GEMMS)
RESEED_SHIFT = 1_000_003  # added to every layer's seed: another Philox stream for every rounding


@dataclasses.dataclass(frozen=True)
class Change:
    """The branch of `run` (a quality-grid run) replayed with its own plans changed by `change` (CHANGES)."""

    run: QualityRun
    change: str

    @property
    def key(self) -> str:
        return f"{self.run.key}~{self.change}"

    @property
    def seed(self) -> int:
        return self.run.seed


def per_gemm(precision) -> dict[str, str]:
    """A plan's precision of one layer (one name for all three GEMMs, or one per GEMM) as one name per GEMM."""
    precision = LinearPrecision.of(precision)
    return {g: precision.gemm(g).name for g in GEMMS}


def moved(plan: dict, change: str) -> dict:
    """`plan` ({layer: precision}) with the GEMMs of MOVED_GEMMS[change] at that change's precision."""
    pattern, gemms, to = MOVED_GEMMS[change]
    out = {}
    for name, precision in plan.items():
        precision = per_gemm(precision)
        if re.search(pattern, name):
            precision = {g: to if g in gemms else p for g, p in precision.items()}
        out[name] = precision
    return out


def changed_plans(plans: dict[int, dict], change: str) -> dict[int, dict]:
    """A branch's plans changed: the same ones for "reseed", else the first one's GEMMs moved."""
    if change == "reseed":
        return plans
    return {step: moved(plan, change) if step == 0 else plan for step, plan in plans.items()}


def parse_change(text: str) -> tuple[str, str]:
    method, sep, change = text.partition(":")
    if not sep or change not in CHANGES:
        raise argparse.ArgumentTypeError(f"a change is METHOD:CHANGE, CHANGE one of {', '.join(CHANGES)}; got {text!r}")
    parse_mix(f"{method}+{method}")  # a planned method of the grid that re-plans every interval
    return method, change


def source_run(args, method: str, seed: int) -> QualityRun:
    return QualityRun.of(args.preset, args.phase, args.budget, method, seed, args.steps, args.interval,
                          args.eval_batches)


def plan_steps(result: dict, run: QualityRun) -> dict[int, dict]:
    """{step: precisions} of a cached planned run; its plans must come every interval (no drift trigger)."""
    plans = {p["step"]: p["precisions"] for p in result["plans"]}
    expected = list(range(0, run.steps, run.interval))
    if sorted(plans) != expected:
        raise SystemExit(f"{run.key}: plans at steps {sorted(plans)}, not every {run.interval} steps {expected}: "
                         "a replay mixes plans made at the same steps (no drift trigger)")
    return plans


def mixed_plans(first: dict[int, dict], then: dict[int, dict]) -> dict[int, dict]:
    return {step: first[step] if step == 0 else then[step] for step in then}


def replay(job: tuple[QualityRun, dict[int, dict], int]) -> dict:
    """Train one replayed branch (in a worker process: one torch thread); its final validation loss and the numerics
    it was trained under (experiments.common.numerics)."""
    run, plans, seed_shift = job
    torch.set_num_threads(1)
    summary = continue_from(checkpoint(run.phase, run.preset), run.steps, run.seed, hooks=ReplayedPlans(plans, seed_shift),
                            evals=max(1, run.steps // run.interval), eval_batches=run.eval_batches)
    return {"final_val_loss": summary["final_val_loss"], "numerics": numerics(run.phase, run.preset)}


def cached_replay(entry) -> dict:
    """A replay cache entry as `replay` returns it (the cache held bare losses before it recorded the numerics)."""
    return entry if isinstance(entry, dict) else {"final_val_loss": entry}


def seed_runs(seed: int, runs: list[QualityRun], sources: dict, done: dict, replays: list) -> dict[str, dict]:
    """The cached source runs and replays of `seed` {key: result}: the runs a replay of that seed is paired with."""
    return {**{r.key: sources[r.key] for r in runs if r.seed == seed and r.key in sources},
            **{m.key: done[m.key] for m in replays if m.seed == seed and m.key in done}}


def parse_mix(text: str) -> tuple[str, str]:
    first, sep, then = text.partition("+")
    if not sep or not first or not then or "+" in then:
        raise argparse.ArgumentTypeError(f"a mix is FIRST+THEN (two quality-grid methods), got {text!r}")
    for method in (first, then):
        planner_config(method, 0.5, 1)  # an unknown method fails here
        if method.removesuffix(GEMM_SUFFIX).endswith(DRIFT_SUFFIX):
            raise argparse.ArgumentTypeError(f"{method}: a drift-triggered method re-plans at its own steps")
    return first, then


def replayed_gaps(args, seeds: list[int], loss: list[float], sources: dict[str, dict]) -> tuple[list[float], dict]:
    """The bf16 branches' losses of `seeds`, and a table row's gap fields for replayed losses `loss` on them."""
    bf16 = [sources[source_run(args, "bf16", s).key]["final_val_loss"] for s in seeds]
    gaps = [v - b for v, b in zip(loss, bf16)]
    mean, se = mean_se(gaps)
    return bf16, {"seeds": seeds, "gap_per_seed": gaps, "mean_gap": mean, "se_gap": se}


def rows(args, done: dict, mixes: list[Mix], sources: dict[str, dict]) -> list[dict]:
    """Per mix: the gap per seed to bf16, and the paired differences to the branches of its two methods."""
    out = []
    for first, then in args.mixes:
        per_seed = [m for m in mixes if (m.first.method, m.then) == (first, then)]
        loss = [done[m.key]["final_val_loss"] for m in per_seed]
        bf16, gaps = replayed_gaps(args, [m.first.seed for m in per_seed], loss, sources)
        own = {method: [sources[source_run(args, method, m.first.seed).key]["final_val_loss"] for m in per_seed]
               for method in (first, then)}
        row = {"first": first, "then": then, **gaps}
        for label, method in (("vs_first", first), ("vs_then", then)):
            row[label], row[label + "_se"] = mean_se([v - o for v, o in zip(loss, own[method])])
        row["own_gaps"] = {method: mean_se([o - b for o, b in zip(own[method], bf16)]) for method in (first, then)}
        out.append(row)
    return out


def change_rows(args, done: dict, changes: list[Change], sources: dict[str, dict]) -> list[dict]:
    """Per change: the gap per seed to bf16, and the paired difference to the method's own branch."""
    out = []
    for method, change in args.changes:
        per_seed = [c for c in changes if (c.run.method, c.change) == (method, change)]
        loss = [done[c.key]["final_val_loss"] for c in per_seed]
        bf16, gaps = replayed_gaps(args, [c.run.seed for c in per_seed], loss, sources)
        own = [sources[c.run.key]["final_val_loss"] for c in per_seed]
        vs_own = [v - o for v, o in zip(loss, own)]
        row = {"method": method, "change": change, **gaps, "own_gap": mean_se([o - b for o, b in zip(own, bf16)])}
        row["vs_own"], row["vs_own_se"] = mean_se(vs_own)
        row["vs_own_sd"] = statistics.stdev(vs_own) if len(vs_own) > 1 else 0.0
        out.append(row)
    return out


def markdown(args, table: list[dict], changes: list[dict]) -> str:
    md = [f"Preset {args.preset}, the quality grid's {args.phase}-step checkpoint at {100 * args.budget:g}% FP4: "
          f"{args.steps}-step branches re-planned every {args.interval} steps (cosine decay to lr/10), seeds "
          f"{args.seeds}, {args.eval_batches} validation batches. Gap: final validation loss minus the bf16 branch's, "
          "mean +- standard error."]
    if table:
        md += ["", f"A+B: A's plan from step 0, B's from step {args.interval} on, replayed as fixed plans on the same "
               "batches as the grid's branches of A and B (paired). vs A, vs B: the mean paired difference to A's and "
               "to B's own branch. Near 0 against A: the first plan decides the gap; against B: the later ones.", "",
               "| mix (first + then) | gap per seed | gap | A's own gap | B's own gap | vs A | vs B |",
               "|---|---|---|---|---|---|---|"]
    for r in table:
        (a, a_se), (b, b_se) = r["own_gaps"][r["first"]], r["own_gaps"][r["then"]]
        md.append(f"| {r['first']} + {r['then']} | " + ", ".join(f"{g:+.4f}" for g in r["gap_per_seed"])
                  + f" | {r['mean_gap']:+.4f} +- {r['se_gap']:.4f} | {a:+.4f} +- {a_se:.4f} | {b:+.4f} +- {b_se:.4f} | "
                  f"{r['vs_first']:+.4f} +- {r['vs_first_se']:.4f} | {r['vs_then']:+.4f} +- {r['vs_then_se']:.4f} |")
    if changes:
        md += ["", "A:C: A's own plans changed by C, replayed on the same batches as A's branch (paired). reseed: the "
               "same plans, every layer's stochastic-rounding seed another, so only the rounding bits differ (the noise "
               "floor of a paired comparison); " + "; ".join(
                   f"{c}: the first plan's {'/'.join(g)} GEMMs of the layers matching `{pat}` in {to.upper()}"
                   for c, (pat, g, to) in MOVED_GEMMS.items())
               + ". vs A: the mean paired difference to A's own branch (+- standard error; sd: the per-seed spread).",
               "", "| A:C | gap per seed | gap | A's own gap | vs A | sd of vs A |", "|---|---|---|---|---|---|"]
    for r in changes:
        own, own_se = r["own_gap"]
        md.append(f"| {r['method']}:{r['change']} | " + ", ".join(f"{g:+.4f}" for g in r["gap_per_seed"])
                  + f" | {r['mean_gap']:+.4f} +- {r['se_gap']:.4f} | {own:+.4f} +- {own_se:.4f} | "
                  f"{r['vs_own']:+.4f} +- {r['vs_own_se']:.4f} | {r['vs_own_sd']:.4f} |")
    return "\n".join(md)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny", choices=sorted(LRS))
    p.add_argument("--phase", type=int, default=100, help="the bf16 checkpoint's steps (default: %(default)s)")
    p.add_argument("--budget", type=float, default=0.8, help="the FP4 share (default: %(default)s)")
    p.add_argument("--seeds", type=lambda s: [int(v) for v in s.split(",")], default=[0, 1, 2, 3])
    p.add_argument("--steps", type=int, default=100, help="branch length (default: %(default)s)")
    p.add_argument("--interval", type=int, default=50, help="re-plan interval (default: %(default)s)")
    p.add_argument("--eval-batches", type=int, default=64, help="validation batches (default: %(default)s)")
    p.add_argument("--mixes", type=lambda s: [parse_mix(m) for m in s.split(",")], default=[],
                   help="FIRST+THEN,...: the method whose first plan and the one whose later plans a branch gets")
    p.add_argument("--changes", type=lambda s: [parse_change(c) for c in s.split(",")], default=[],
                   help=f"METHOD:CHANGE,...: a method's own plans changed, CHANGE one of {', '.join(CHANGES)}")
    p.add_argument("--runs-from", type=lambda s: [Path(v) for v in s.split(",")], default=[],
                   help="committed quality results whose raw runs are source runs too (their plans are replayed)")
    p.add_argument("--workers", type=int, default=1, help="worker processes, one thread each")
    p.add_argument("--name", default="plan-replay", help="results file stem cpu-planner-<name>")
    add_run_arguments(p)
    args = p.parse_args()
    if not args.mixes and not args.changes:
        p.error("nothing to replay: pass --mixes, --changes or both")
    if args.mixes and args.steps <= args.interval:
        p.error(f"--steps ({args.steps}) must exceed --interval ({args.interval}): a branch with one plan has no mix")
    torch.set_num_threads(args.threads)
    methods = sorted({"bf16", *(m for mix in args.mixes for m in mix), *(m for m, _ in args.changes)})
    runs = [source_run(args, m, s) for m in methods for s in args.seeds]
    cache = CACHE / CACHE_FILE
    sources = results.with_runs_from(results.read_cache(cache), args.runs_from)
    replay_cache = CACHE / "plan-replays.json"
    done = {k: cached_replay(v) for k, v in results.read_cache(replay_cache).items()}
    mixes = [Mix(source_run(args, first, s), then) for first, then in args.mixes for s in args.seeds]
    changes = [Change(source_run(args, method, s), change) for method, change in args.changes for s in args.seeds]
    todo = [r for r in runs if r.key not in sources]
    checkpoint(args.phase, args.preset)  # before the workers start, so that they only read it
    if todo or any(m.key not in done for m in mixes + changes):
        for seed in args.seeds:
            check_trainable_beside(seed_runs(seed, runs, sources, done, mixes + changes), args.preset, args.phase, seed)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(args.workers, mp_context=ctx) as pool:
        for r, result in zip(todo, pool.map(run_quality, todo)):
            sources[r.key] = result
            results.save_run(cache, r.key, result)
            print(f"{r.key}: val {result['final_val_loss']:.4f} (source run)", flush=True)
        todo, jobs = [], []
        for m in mixes:
            if m.key not in done:
                then = source_run(args, m.then, m.first.seed)
                todo.append(m)
                jobs.append((m.first, mixed_plans(plan_steps(sources[m.first.key], m.first),
                                                  plan_steps(sources[then.key], then)), 0))
        for c in changes:
            if c.key not in done:
                todo.append(c)
                jobs.append((c.run, changed_plans(plan_steps(sources[c.run.key], c.run), c.change),
                             RESEED_SHIFT if c.change == "reseed" else 0))
        for m, result in zip(todo, pool.map(replay, jobs)):
            done[m.key] = result
            results.save_run(replay_cache, m.key, result)
            print(f"{m.key}: val {result['final_val_loss']:.4f}", flush=True)
    for seed in args.seeds:
        check_paired(seed_runs(seed, runs, sources, done, mixes + changes),
                     f"{args.preset}, checkpoint {args.phase}, seed {seed}")
    table, changed = rows(args, done, mixes, sources), change_rows(args, done, changes, sources)
    results.write(args.results, args.name, {
        "preset": args.preset, "phase": args.phase, "budget": args.budget, "steps": args.steps,
        "interval": args.interval, "eval_batches": args.eval_batches, "seeds": args.seeds, "rows": table,
        "changes": changed, "replays": {m.key: done[m.key] for m in mixes + changes},
        "runs_from": [p.name for p in args.runs_from]}, markdown(args, table, changed))


if __name__ == "__main__":
    main()
