"""Which of a branch's plans decides its gap: the quality grid's branches trained again with their plans mixed.

    python bench/bench_plan_replay.py --phase 100 --budget 0.8 --seeds 0,1,2,3,4,5,6,7,8,9 \\
        --mixes snip_signal_gemm+snip_ld_gemm,snip_ld_gemm+snip_signal_gemm --workers 2

A planned branch of the quality grid (bench_planner.py quality) installs a plan at its first step and re-plans every
`--interval` steps. The mix "A+B" trains seed s's branch again, from the same checkpoint on the same batches, with
method A's first plan (the one A made at step 0 of that branch) and method B's later ones (those B made at steps
interval, 2 interval, ...), installed as fixed plans at the steps they were made: no statistics, no solver. The plans
are read from the quality grid's cached runs, which are trained first where missing. A method's own plans replayed
(A+A) give its branch back bit for bit (tests/bench/test_plan_replay.py), so every mix is paired with the grid's
branches of A and B: where A+B lands on A, the first plan decides the gap; where it lands on B, the later ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_planner as bp  # noqa: E402
from planner import Plan  # noqa: E402
from snip_ops import convert  # noqa: E402


class ReplayedPlans:
    """Hooks for `bench_planner.continue_from` that install fixed plans ({step: {layer: precision}}) at their steps,
    on the model the planner's hooks would have converted (SnipLinear layers, bf16 until the first plan)."""

    def __init__(self, plans: dict[int, dict]):
        if 0 not in plans:
            raise ValueError(f"a replay needs a plan at step 0, got plans at steps {sorted(plans)}")
        self.plans = plans

    def on_setup(self, model, opt) -> None:
        convert(model)

    def on_step(self, step, model, batch) -> None:
        if step in self.plans:
            Plan(self.plans[step]).apply(model)


@dataclasses.dataclass(frozen=True)
class Mix:
    """The branch of `first` (a quality-grid run) with its own plan at step 0 and method `then`'s plans after it."""

    first: bp.QualityRun
    then: str

    @property
    def key(self) -> str:
        return f"{self.first.key}+{self.then}"


def source_run(args, method: str, seed: int) -> bp.QualityRun:
    return bp.QualityRun(args.preset, args.phase, args.budget, method, seed, args.steps, args.interval,
                         args.eval_batches)


def plan_steps(result: dict, run: bp.QualityRun) -> dict[int, dict]:
    """{step: precisions} of a cached planned run; its plans must come every interval (no drift trigger)."""
    plans = {p["step"]: p["precisions"] for p in result["plans"]}
    expected = list(range(0, run.steps, run.interval))
    if sorted(plans) != expected:
        raise SystemExit(f"{run.key}: plans at steps {sorted(plans)}, not every {run.interval} steps {expected}: "
                         "a replay mixes plans made at the same steps (no drift trigger)")
    return plans


def mixed_plans(first: dict[int, dict], then: dict[int, dict]) -> dict[int, dict]:
    return {step: first[step] if step == 0 else then[step] for step in then}


def replay(job: tuple[bp.QualityRun, dict[int, dict]]) -> float:
    """Train one mixed branch (in a worker process: one torch thread); its final validation loss."""
    run, plans = job
    torch.set_num_threads(1)
    summary = bp.continue_from(bp.checkpoint(run.phase, run.preset), run.steps, run.seed, hooks=ReplayedPlans(plans),
                               evals=max(1, run.steps // run.interval), eval_batches=run.eval_batches)
    return summary["final_val_loss"]


def parse_mix(text: str) -> tuple[str, str]:
    first, sep, then = text.partition("+")
    if not sep or not first or not then or "+" in then:
        raise argparse.ArgumentTypeError(f"a mix is FIRST+THEN (two quality-grid methods), got {text!r}")
    for method in (first, then):
        bp.planner_config(method, 0.5, 1)  # an unknown method fails here
        if method.removesuffix(bp.GEMM_SUFFIX).endswith(bp.DRIFT_SUFFIX):
            raise argparse.ArgumentTypeError(f"{method}: a drift-triggered method re-plans at its own steps")
    return first, then


def rows(args, done: dict, mixes: list[Mix], sources: dict[str, dict]) -> list[dict]:
    """Per mix: the gap per seed to bf16, and the paired differences to the branches of its two methods."""
    out = []
    for first, then in args.mixes:
        per_seed = [m for m in mixes if (m.first.method, m.then) == (first, then)]
        loss = [done[m.key] for m in per_seed]
        bf16 = [sources[source_run(args, "bf16", m.first.seed).key]["final_val_loss"] for m in per_seed]
        own = {method: [sources[source_run(args, method, m.first.seed).key]["final_val_loss"] for m in per_seed]
               for method in (first, then)}
        gaps = [v - b for v, b in zip(loss, bf16)]
        row = {"first": first, "then": then, "seeds": [m.first.seed for m in per_seed], "gap_per_seed": gaps}
        row["mean_gap"], row["se_gap"] = bp.mean_se(gaps)
        for label, method in (("vs_first", first), ("vs_then", then)):
            row[label], row[label + "_se"] = bp.mean_se([v - o for v, o in zip(loss, own[method])])
        row["own_gaps"] = {method: bp.mean_se([o - b for o, b in zip(own[method], bf16)]) for method in (first, then)}
        out.append(row)
    return out


def markdown(args, table: list[dict]) -> str:
    md = [f"Preset {args.preset}, the quality grid's {args.phase}-step checkpoint at {100 * args.budget:g}% FP4: "
          f"{args.steps}-step branches re-planned every {args.interval} steps (cosine decay to lr/10), seeds "
          f"{args.seeds}, {args.eval_batches} validation batches. A+B: A's plan from step 0, B's from step "
          f"{args.interval} on, replayed as fixed plans on the same batches as the grid's branches of A and B (paired). "
          "Gap: final validation loss minus the bf16 branch's, mean +- standard error; vs A, vs B: the mean paired "
          "difference to A's and to B's own branch. Near 0 against A: the first plan decides the gap; against B: "
          "the later ones.", "",
          "| mix (first + then) | gap per seed | gap | A's own gap | B's own gap | vs A | vs B |", "|---|---|---|---|---|---|---|"]
    for r in table:
        (a, a_se), (b, b_se) = r["own_gaps"][r["first"]], r["own_gaps"][r["then"]]
        md.append(f"| {r['first']} + {r['then']} | " + ", ".join(f"{g:+.4f}" for g in r["gap_per_seed"])
                  + f" | {r['mean_gap']:+.4f} +- {r['se_gap']:.4f} | {a:+.4f} +- {a_se:.4f} | {b:+.4f} +- {b_se:.4f} | "
                  f"{r['vs_first']:+.4f} +- {r['vs_first_se']:.4f} | {r['vs_then']:+.4f} +- {r['vs_then_se']:.4f} |")
    return "\n".join(md)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny", choices=sorted(bp.LRS))
    p.add_argument("--phase", type=int, default=100, help="the bf16 checkpoint's steps (default: %(default)s)")
    p.add_argument("--budget", type=float, default=0.8, help="the FP4 share (default: %(default)s)")
    p.add_argument("--seeds", type=lambda s: [int(v) for v in s.split(",")], default=[0, 1, 2, 3])
    p.add_argument("--steps", type=int, default=100, help="branch length (default: %(default)s)")
    p.add_argument("--interval", type=int, default=50, help="re-plan interval (default: %(default)s)")
    p.add_argument("--eval-batches", type=int, default=64, help="validation batches (default: %(default)s)")
    p.add_argument("--mixes", type=lambda s: [parse_mix(m) for m in s.split(",")], required=True,
                   help="FIRST+THEN,...: the method whose first plan and the one whose later plans a branch gets")
    p.add_argument("--workers", type=int, default=1, help="worker processes, one thread each")
    p.add_argument("--name", default="plan-replay", help="results file stem cpu-planner-<name>")
    p.add_argument("--results", type=Path, default=None, help="where the results go (default: bench/results)")
    args = p.parse_args()
    if args.steps <= args.interval:
        p.error(f"--steps ({args.steps}) must exceed --interval ({args.interval}): a branch with one plan has no mix")
    if args.results is not None:
        bp.RESULTS = args.results
    methods = sorted({"bf16", *(m for mix in args.mixes for m in mix)})
    runs = [source_run(args, m, s) for m in methods for s in args.seeds]
    cache = bp.CACHE / "quality-runs.json"
    sources = json.loads(cache.read_text()) if cache.exists() else {}
    todo = [r for r in runs if r.key not in sources]
    bp.checkpoint(args.phase, args.preset)  # before the workers start, so that they only read it
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(args.workers, mp_context=ctx) as pool:
        for r, result in zip(todo, pool.map(bp.run_quality, todo)):
            sources[r.key] = result
            bp.save_run(cache, r.key, result)
            print(f"{r.key}: val {result['final_val_loss']:.4f} (source run)", flush=True)
        mixes = [Mix(source_run(args, first, s), then) for first, then in args.mixes for s in args.seeds]
        replay_cache = bp.CACHE / "plan-replays.json"
        done = json.loads(replay_cache.read_text()) if replay_cache.exists() else {}
        todo = [m for m in mixes if m.key not in done]
        jobs = []
        for m in todo:
            then = source_run(args, m.then, m.first.seed)
            jobs.append((m.first, mixed_plans(plan_steps(sources[m.first.key], m.first),
                                              plan_steps(sources[then.key], then))))
        for m, loss in zip(todo, pool.map(replay, jobs)):
            done[m.key] = loss
            bp.save_run(replay_cache, m.key, loss)
            print(f"{m.key}: val {loss:.4f}", flush=True)
    table = rows(args, done, mixes, sources)
    bp.write(args.name, {"preset": args.preset, "phase": args.phase, "budget": args.budget, "steps": args.steps,
                         "interval": args.interval, "eval_batches": args.eval_batches, "seeds": args.seeds,
                         "rows": table, "replays": {m.key: done[m.key] for m in mixes}}, markdown(args, table))


if __name__ == "__main__":
    main()
