"""The planner in the demo trainer, through the planner's public surface only, and the paired comparison.

    cfg = TrainConfig(..., precision="bf16")
    hooks = make_hooks(PlannerConfig(budget=Budget.parse("fp4=0.75"), interval=100), out_dir="runs/x",
                       lr_schedule=learning_rates(cfg))  # WD's horizon follows the run's learning-rate decay
    summary = train(dataclasses.replace(cfg, **hooks.train_kwargs()))
    hooks.finish()                      # plan.json (also written at every re-plan) + plan.png heat map

`add_planner_args(parser)` / `config_from_args(args)` / `comparison_from_args(args, steps)` are the
`snip train` planner flags: `--precision snip` trains one run whose precision a live planner chooses
(the hooks above), `--planner` runs the paired comparison. The hooks' `state_dict` goes into the run's
checkpoints (`snip_train.checkpoint`), and hooks made with `resume=` that state continue the planner
where it was: its plan, statistics, history, the step it re-plans from and its schedule's state.
`run_comparison(out_dir, train_config, ComparisonConfig(...))` is the main
job: a shared bf16 warm-up, then from its state one branch per method (bf16, SNIP, the baselines) and
branch seed, all methods of a seed on the same batches; it reports each method's final validation-loss
gap to the bf16 branch, paired per seed. Branches run in a pool of spawned processes, each a function of
(state, method, seed) alone, so the numbers do not depend on the number of workers or their order.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing
import os
import pickle
import statistics
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from planner import BASELINES, Budget, MeasuredCost, Plan, PlannerConfig, SnipPlanner

from snip_ops import LinearPrecision

from .checkpoint import differences
from .errors import UsageError, user_input
from .plots import plot_branch_gaps, plot_plan_heatmap
from .state import TrainState
from .train import TrainConfig, json_safe, jsonable, learning_rates, train

__all__ = ["PlannerHooks", "make_hooks", "add_planner_args", "config_from_args", "comparison_from_args",
           "ComparisonConfig", "DEFAULT_BASELINES", "DEFAULT_SEEDS", "LIVE_PLANNER", "COMPARISON_FLAGS",
           "branch_data_seed", "run_branch", "summarize", "format_table", "run_comparison"]

BF16, SNIP = "bf16", "SNIP"  # the method labels of the unplanned branch and of the planner's ILP
# The main job's baselines and branch seeds (bench/results/cpu-main-job.md: what fits its time budget).
DEFAULT_BASELINES = ("first_last", "layer_type", "min_rel_error", "min_abs_error", "random", "uniform_fp4")
DEFAULT_SEEDS = (0, 1)
LIVE_PLANNER = "snip"  # `snip train --precision snip`: one run, its precision chosen by a live planner
# The flags of the paired comparison alone, as `snip train` spells them, with their argparse names.
COMPARISON_FLAGS = {"--branch-at": "branch_at", "--branch-seeds": "branch_seeds", "--baselines": "baselines",
                    "--workers": "workers"}


def _default_workers() -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(2, cpus))


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def wd_horizon_arg(text: str) -> int | str:
    """A PlannerConfig.wd_horizon from the command line: 'interval', 'settled' or a number of steps."""
    if text in ("interval", "settled"):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'interval', 'settled' or a number of steps, "
                                         f"got {text!r}") from None


def _name_list(text: str) -> tuple[str, ...]:
    return () if text.strip() == "none" else tuple(v.strip() for v in text.split(",") if v.strip())


def _tqdm_write(msg: str) -> None:
    from tqdm.auto import tqdm

    tqdm.write(msg)


@dataclass
class PlannerHooks:
    """`on_setup` / `on_step` / `on_loss` callbacks for `train` that run a SnipPlanner (which re-plans at
    its first step and `config.interval` steps apart from it -- a branch that starts at step W re-plans
    at W, W + interval, ... -- and on the triggers of its precision schedule)."""

    config: PlannerConfig
    out_dir: Path | None = None
    log: Callable[[str], None] = _tqdm_write
    show_table: bool = True
    resume: dict | None = None  # a `state_dict` of the same run's hooks (a checkpoint's): continue from it
    lr_schedule: Callable[[int], float] | None = None  # the run's step -> lr (train.learning_rates), for WD's horizon
    planner: SnipPlanner | None = field(default=None, init=False)
    plans: list[Plan] = field(default_factory=list, init=False)  # every plan installed, in order

    def __post_init__(self):
        if self.resume is not None:  # refused before the run loads or builds anything
            diffs = differences(self.resume["config"], jsonable(self.config))
            if diffs:
                raise UsageError(f"the checkpoint's planner was configured otherwise: {'; '.join(diffs)}")

    @property
    def first_plan(self) -> Plan | None:
        return self.plans[0] if self.plans else None

    def on_setup(self, model, optimizer) -> None:
        self.planner = SnipPlanner(model, optimizer, self.config, log=self.log, lr_schedule=self.lr_schedule)
        if self.resume is not None:
            self.planner.load_state_dict(self.resume["planner"])  # installs its plan on the model
            self.plans = [Plan.from_json(p) for p in self.resume["plans"]]
            if self.plans:  # the planner's plan is the last one installed (the same object, as in the run)
                self.plans[-1] = self.planner.plan

    def state_dict(self) -> dict:
        """The configuration (to refuse another run's state), the planner's state (plan with statistics,
        history, the step re-plans count from, the schedule's state) and the plans installed so far (the
        first with its statistics)."""
        return {"config": jsonable(self.config), "planner": self.planner.state_dict(),
                "plans": [p.to_json(with_stats=i == 0) for i, p in enumerate(self.plans)]}

    def on_step(self, step: int, model, batch) -> None:
        plan = self.planner.step(step, batch)  # a new plan when due or triggered, else None
        if plan is None:
            return
        if not self.plans and self.show_table:
            self.log(plan.table())
        self.plans.append(plan)
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            plan.save(self.out_dir / "plan.json")

    def on_loss(self, step: int, loss: float) -> None:
        self.planner.observe_loss(loss)  # the precision schedule's loss-spike trigger

    def train_kwargs(self) -> dict[str, Any]:
        return {"on_setup": self.on_setup, "on_step": self.on_step, "on_loss": self.on_loss,
                "hooks_state": self.state_dict}

    def finish(self) -> Plan:
        """Print the final plan's table; write plan.json, planner_state.json and plan.png (heat map)."""
        plan = self.planner.plan
        if self.show_table and plan is not self.first_plan:
            self.log(plan.table())
        if self.out_dir is not None:
            plan.save(self.out_dir / "plan.json")
            self.planner.save(self.out_dir / "planner_state.json")
            plot_plan_heatmap(plan, self.out_dir / "plan.png")
        return plan


def make_hooks(config: PlannerConfig | None = None, out_dir: str | Path | None = None,
               log: Callable[[str], None] | None = None, show_table: bool = True,
               resume: dict | None = None, lr_schedule: Callable[[int], float] | None = None) -> PlannerHooks:
    return PlannerHooks(config or PlannerConfig(), Path(out_dir) if out_dir else None, log or _tqdm_write, show_table,
                        resume, lr_schedule)


def add_planner_args(parser: argparse.ArgumentParser) -> None:
    """The planner's flags for `snip train` (inert unless --planner or --precision snip is given)."""
    d = PlannerConfig()
    g = parser.add_argument_group(
        "SNIP planner", f"--precision {LIVE_PLANNER} trains one run whose precision the planner chooses as it goes; "
                        "--planner compares it with bf16 and baselines")
    g.add_argument("--planner", action="store_true",
                   help="compare the SNIP planner with bf16 and baselines, branched from one bf16 warm-up (the paired "
                        "comparison below)")
    g.add_argument("--planner-budget", default="fp4=0.75", metavar="BUDGET",
                   help="'fp4=0.75' (>= 75%% of linear FLOPs in FP4) or 'cost=0.3' (<= 0.3 x all-bf16 cost) "
                        "(default: %(default)s)")
    g.add_argument("--fp4-fraction", type=float, default=None, metavar="F",
                   help="shorthand for --planner-budget fp4=F")
    g.add_argument("--planner-candidates", default=",".join(d.candidates), metavar="P,P",
                   help="candidate precisions, high to low (default: %(default)s)")
    g.add_argument("--planner-interval", type=int, default=d.interval, metavar="N",
                   help="re-plan every N steps (default: %(default)s)")
    g.add_argument("--planner-lambda", type=float, default=d.lam, help="weight of WD vs LD/L (default: %(default)s)")
    g.add_argument("--planner-granularity", choices=("layer", "gemm"), default=d.granularity,
                   help="one precision per layer or per GEMM (default: %(default)s)")
    g.add_argument("--planner-wd-horizon", type=wd_horizon_arg, default=d.wd_horizon,
                   metavar="{interval,settled,N}",
                   help="WD prices the excess loss gradient noise causes within N steps, within one re-plan "
                        "interval, or once settled (default: %(default)s)")
    g.add_argument("--planner-cost-table", default=None, metavar="JSON",
                   help="measured GEMM times (bench output) for a 'cost=' budget; default: theoretical FLOP cost")
    g.add_argument("--planner-pin", action="append", default=[], metavar="PATTERN=PREC",
                   help="keep matching layers at a precision, e.g. '*.layers.0.*=fp8' (repeatable)")
    g.add_argument("--planner-calib-batch", type=int, default=None, metavar="N",
                   help="measure on the first N sequences of the batch (default: all)")
    g = parser.add_argument_group(
        "paired comparison (with --planner)",
        "a shared bf16 warm-up, then from its state one branch per method and branch seed up to --steps; "
        "all methods of a seed see the same batches; reported: each method's final validation-loss gap to the "
        "bf16 branch")
    g.add_argument("--branch-at", type=int, default=None, metavar="W",
                   help="bf16 warm-up steps shared by every branch; the branches run the remaining --steps - W "
                        "(default: half of --steps)")
    g.add_argument("--branch-seeds", type=_int_list, default=None, metavar="S,S",
                   help="branch seeds: each gives every method the same, other batch order "
                        f"(default: {','.join(map(str, DEFAULT_SEEDS))})")
    g.add_argument("--baselines", type=_name_list, default=None, metavar="NAME,NAME",
                   help=f"baselines next to bf16 and SNIP, from {', '.join(BASELINES)}; 'none' for none "
                        f"(default: {','.join(DEFAULT_BASELINES)})")
    g.add_argument("--workers", type=int, default=None, metavar="N",
                   help="processes running branches, each with --threads torch threads (1 unless given) "
                        "(default: min(2, CPUs))")


def config_from_args(args: argparse.Namespace) -> PlannerConfig | None:
    """A PlannerConfig from parsed `add_planner_args` flags; None without --planner or --precision snip.
    A flag value that cannot be used raises `UsageError` naming the flag."""
    if not (args.planner or getattr(args, "precision", None) == LIVE_PLANNER):
        return None
    cost = None
    if args.planner_cost_table:
        with user_input("--planner-cost-table"):
            cost = MeasuredCost.from_json(args.planner_cost_table)
    pins = {}
    for item in args.planner_pin:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--planner-pin expects PATTERN=PRECISION, got {item!r}")
        with user_input(f"--planner-pin {item}"):
            LinearPrecision.of(value)
        pins[key] = value
    if args.fp4_fraction is not None:
        with user_input("--fp4-fraction"):
            budget = Budget.fp4_fraction(args.fp4_fraction)
    else:
        with user_input("--planner-budget"):
            budget = Budget.parse(args.planner_budget, cost)
    candidates = tuple(c.strip() for c in args.planner_candidates.split(",") if c.strip())
    with user_input("--planner-candidates"):
        for name in candidates:
            LinearPrecision.of(name)
    with user_input("planner"):
        return PlannerConfig(
            candidates=candidates, budget=budget,
            interval=args.planner_interval, lam=args.planner_lambda, granularity=args.planner_granularity,
            wd_horizon=args.planner_wd_horizon, pinned=pins, calib_batch_size=args.planner_calib_batch)


def comparison_from_args(args: argparse.Namespace, steps: int) -> ComparisonConfig | None:
    """The paired comparison of `snip train --planner` (runs of `steps` steps in all); None without --planner."""
    if not args.planner:
        return None
    planner = config_from_args(args)
    with user_input():
        return ComparisonConfig(
            branch_at=args.branch_at if args.branch_at is not None else steps // 2, planner=planner,
            baselines=tuple(DEFAULT_BASELINES if args.baselines is None else args.baselines),
            seeds=tuple(DEFAULT_SEEDS if args.branch_seeds is None else args.branch_seeds),
            workers=args.workers if args.workers is not None else _default_workers(), threads=args.threads or 1)


# ---------------------------------------------------------------------------------------
# the paired comparison
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ComparisonConfig:
    """A shared bf16 warm-up of `branch_at` steps, then from its state one branch per method (bf16, SNIP,
    `baselines`) and seed, each to the run's last step. A seed fixes the branches' batch order; every
    method of a seed sees the same batches. The planned branches use `planner` with their own method."""

    branch_at: int
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    baselines: tuple[str, ...] = DEFAULT_BASELINES
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    workers: int = field(default_factory=_default_workers)  # processes running branches
    threads: int = 1  # torch threads per worker

    def __post_init__(self):
        object.__setattr__(self, "baselines", tuple(self.baselines))
        object.__setattr__(self, "seeds", tuple(self.seeds))
        unknown = [b for b in self.baselines if b not in BASELINES]
        if unknown:
            raise ValueError(f"unknown baselines {unknown}; known: {', '.join(BASELINES)}")
        if len(set(self.baselines)) != len(self.baselines) or len(set(self.seeds)) != len(self.seeds):
            raise ValueError("baselines and seeds must not repeat")
        if not self.seeds:
            raise ValueError("the comparison needs at least one branch seed")
        if self.branch_at < 0 or self.workers < 1 or self.threads < 1:
            raise ValueError("branch_at must be >= 0, workers and threads >= 1")

    @property
    def methods(self) -> tuple[str, ...]:
        return (BF16, SNIP, *self.baselines)

    def planner_for(self, method: str) -> PlannerConfig | None:
        """The planner of a method's branches (None: the plain bf16 branch)."""
        if method == BF16:
            return None
        return dataclasses.replace(self.planner, method="snip" if method == SNIP else method)


def branch_data_seed(run_seed: int, branch_at: int, seed: int) -> int:
    """The batch-order seed of the branches of seed `seed`: shared by every method, unlike the warm-up's."""
    return int(np.random.SeedSequence([run_seed, branch_at, seed]).generate_state(1, np.uint64)[0])


def run_branch(state: TrainState, train_config: TrainConfig, comparison: ComparisonConfig, method: str,
               seed: int) -> dict[str, Any]:
    """Train `method` from `state` to the run's last step on the batches of branch seed `seed`.

    A function of its arguments alone (and of the torch thread count): the comparison's numbers do not
    depend on which process runs a branch, or when."""
    planner = comparison.planner_for(method)
    hooks = None if planner is None else PlannerHooks(planner, log=lambda msg: None, show_table=False,
                                                      lr_schedule=learning_rates(train_config))
    cfg = dataclasses.replace(train_config, precision="bf16", name=f"{method}-seed{seed}", out_dir=None,
                              progress=False, verbose=False, **(hooks.train_kwargs() if hooks else {}))
    t0 = time.perf_counter()
    s = train(cfg, start=state.reseed_data(branch_data_seed(train_config.seed, state.step, seed)))
    plans = hooks.plans if hooks else []
    return {"method": method, "seed": seed, "diverged": s["diverged"],
            "final_val_loss": None if s["diverged"] else s["final_val_loss"],
            "val": s["history"]["val"], "train_loss": s["history"]["train"]["loss"],
            "plans": [p.to_json(with_stats=False) for p in plans],
            "first_plan": plans[0].to_json() if plans else None,  # with its statistics (the heat map's bars)
            "time_s": time.perf_counter() - t0}


_WORKER: dict[str, Any] = {}  # a worker process's (state, train config, comparison), sent once


def _init_worker(threads: int, payload: bytes) -> None:
    torch.set_num_threads(threads)
    _WORKER.update(pickle.loads(payload))


def _worker_branch(method: str, seed: int) -> dict[str, Any]:
    return run_branch(_WORKER["state"], _WORKER["train"], _WORKER["comparison"], method, seed)


def _run_branches(state: TrainState, train_config: TrainConfig, comparison: ComparisonConfig,
                  log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every (method, seed) branch, in a pool of spawned processes; results in (seed, method) order."""
    tasks = [(m, s) for s in comparison.seeds for m in comparison.methods]
    # the planned branches are the long ones: start them first, the bf16 ones fill the gaps at the end
    order = sorted(tasks, key=lambda t: t[0] == BF16)
    # plain pickle (not the pool's, which would put the tensors in shared memory): each worker its copy
    payload = pickle.dumps({"state": state, "train": train_config, "comparison": comparison})
    done: dict[tuple[str, int], dict] = {}
    with ProcessPoolExecutor(max_workers=min(comparison.workers, len(tasks)),
                             mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker,
                             initargs=(comparison.threads, payload)) as pool:
        futures = {pool.submit(_worker_branch, m, s): (m, s) for m, s in order}
        for future in as_completed(futures):
            r = future.result()
            done[futures[future]] = r
            val = "diverged" if r["diverged"] else f"final val loss {r['final_val_loss']:.4f}"
            log(f"  [{len(done)}/{len(tasks)}] seed {r['seed']} {r['method']}: {val} ({r['time_s']:.0f}s)")
    return [done[t] for t in tasks]


def summarize(branches: Sequence[dict], methods: Sequence[str], seeds: Sequence[int]) -> dict[str, dict]:
    """Per method: FP4 share (mean over its plans), final validation loss per seed, gap to the bf16 branch
    per seed (mean, std, min, max; None where a branch diverged) and, per other method, on how many seeds
    it ended lower (a diverged branch ends above every other)."""
    by = {(b["method"], b["seed"]): b for b in branches}
    val = {m: [by[m, s]["final_val_loss"] for s in seeds] for m in methods}
    rank = {m: [math.inf if v is None else v for v in val[m]] for m in methods}
    table = {}
    for m in methods:
        plans = [p for s in seeds for p in by[m, s]["plans"]]
        gaps = [None if v is None or b is None else v - b for v, b in zip(val[m], val[BF16])]
        known = None if None in gaps else gaps
        table[m] = {
            "fp4_fraction": statistics.fmean(p["metrics"]["fp4_fraction"] for p in plans) if plans else 0.0,
            "plans": len(plans),
            "final_val_loss": val[m],
            "gap_to_bf16": gaps,
            "mean_gap": statistics.fmean(known) if known else None,
            "std_gap": statistics.stdev(known) if known and len(known) > 1 else 0.0 if known else None,
            "min_gap": min(known) if known else None,
            "max_gap": max(known) if known else None,
            "beats": {o: sum(a < b for a, b in zip(rank[m], rank[o])) for o in methods if o != m},
        }
    return table


def _gap(x: float | None) -> str:
    return "diverged" if x is None else f"{x:+.4f}"


def format_table(table: dict[str, dict], seeds: Sequence[int]) -> str:
    """The per-method table (best mean gap first) and the matrix of seeds won, as text."""
    order = sorted(table, key=lambda m: (table[m]["mean_gap"] is None, table[m]["mean_gap"] or 0.0))
    width = max(len(m) for m in table)
    losses = f"final val loss, seed {','.join(map(str, seeds))}"
    head = f"{'method':<{width}}  {'FP4 FLOPs':>9}  {losses:<{9 * len(seeds) + 2}}  gap to bf16: mean +- std [min..max]"
    lines = [head, "-" * len(head)]
    for m in order:
        r = table[m]
        vals = " ".join("diverged" if v is None else f"{v:8.4f}" for v in r["final_val_loss"])
        spread = "" if r["mean_gap"] is None else f" +- {r['std_gap']:.4f} [{_gap(r['min_gap'])}..{_gap(r['max_gap'])}]"
        lines.append(f"{m:<{width}}  {100 * r['fp4_fraction']:8.1f}%  {vals:<{9 * len(seeds) + 2}}  "
                     f"{_gap(r['mean_gap'])}{spread}")
    lines += ["", f"seeds (of {len(seeds)}) on which the row's final validation loss is below the column's:",
              " " * width + " " + " ".join(f"{m[:11]:>11}" for m in order)]
    for m in order:
        lines.append(f"{m:<{width}} " + " ".join(f"{'-' if o == m else table[m]['beats'][o]:>11}" for o in order))
    return "\n".join(lines)


def _gap_curves(branches: Sequence[dict], methods: Sequence[str], seeds: Sequence[int]) -> dict[str, tuple]:
    """{method: (evaluation steps, [gap to the bf16 branch at those steps, per seed])}."""
    by = {(b["method"], b["seed"]): b["val"] for b in branches}
    curves = {}
    for m in methods:
        if m == BF16:
            continue
        steps = by[BF16, seeds[0]]["step"]
        per_seed = []
        for s in seeds:
            mine, ref = by[m, s], by[BF16, s]
            n = min(len(mine["loss"]), len(ref["loss"]))  # a diverged branch stops early
            per_seed.append([a - b for a, b in zip(mine["loss"][:n], ref["loss"][:n])])
        curves[m] = (steps, per_seed)
    return curves


def run_comparison(out_dir: str | Path, train_config: TrainConfig, comparison: ComparisonConfig,
                   log: Callable[[str], None] = print) -> dict[str, Any]:
    """The paired comparison (`ComparisonConfig`) of runs of `train_config.steps` steps in all.

    The warm-up trains `train_config` in bf16 (its `precision` is not used: the warm-up and the reference
    branch are bf16 by definition) and writes `warmup/summary.json` and `warmup/loss.png` under
    `out_dir`; then come `snip/plan.json` and `snip/plan.png` (SNIP's first plan, first seed),
    `branch_gaps.png` (each method's validation-loss gap to the bf16 branch over the branch steps) and
    `comparison.json` (configuration, every branch's curves and plans, the table). Prints the table.
    Returns the contents of comparison.json.
    """
    if any(getattr(train_config, h) is not None for h in ("prepare_model", "on_setup", "on_step", "on_loss")):
        raise ValueError("run_comparison installs its own hooks; pass a TrainConfig without hooks")
    if not comparison.branch_at < train_config.steps:
        raise ValueError(f"branch_at ({comparison.branch_at}) must be below the run's steps ({train_config.steps})")
    out = Path(out_dir)
    t0 = time.perf_counter()
    seeds, methods = comparison.seeds, comparison.methods
    branch_steps = train_config.steps - comparison.branch_at
    log(f"paired comparison: {comparison.branch_at} bf16 warm-up steps, then {branch_steps} steps per branch "
        f"from its state: {', '.join(methods)} x seeds {', '.join(map(str, seeds))} "
        f"({comparison.workers} workers x {comparison.threads} torch threads); budget "
        f"{comparison.planner.budget.describe()}, re-planned every {comparison.planner.interval} branch steps")
    warm = train(dataclasses.replace(train_config, precision="bf16", out_dir=str(out / "warmup"), name="warmup"),
                 stop_at=comparison.branch_at)
    if warm["diverged"]:
        raise RuntimeError("the bf16 warm-up diverged; nothing to branch from")
    t1 = time.perf_counter()
    branches = _run_branches(warm["state"], train_config, comparison, log)
    table = summarize(branches, methods, seeds)

    first = next(b for b in branches if b["method"] == SNIP)  # the first seed's
    plan = Plan.from_json(first["first_plan"])
    (out / "snip").mkdir(parents=True, exist_ok=True)
    plan.save(out / "snip" / "plan.json")
    plot_plan_heatmap(plan, out / "snip" / "plan.png")
    plot_branch_gaps(out / "branch_gaps.png", _gap_curves(branches, methods, seeds),
                     title=f"{comparison.planner.budget.describe()}: gap to the bf16 branch, mean and range over "
                           f"seeds {', '.join(map(str, seeds))}")
    result = {
        "warmup": {"steps": comparison.branch_at, "val_loss": warm["final_val_loss"], "time_s": t1 - t0},
        "branch_steps": branch_steps,
        "comparison": {"methods": list(methods), "seeds": list(seeds), "workers": comparison.workers,
                       "threads": comparison.threads, "planner": _planner_json(comparison.planner)},
        "train": warm["config"],
        "branches": [{k: v for k, v in b.items() if k != "first_plan"} for b in branches],
        "table": table,
        "time_s": {"warmup": t1 - t0, "branches": time.perf_counter() - t1, "total": time.perf_counter() - t0},
    }
    (out / "comparison.json").write_text(json.dumps(json_safe(result), indent=1))

    log(f"SNIP's first plan (seed {first['seed']}, step {comparison.branch_at}):\n{plan.table()}")
    log(format_table(table, seeds))
    log(f"Why the ranking means something: every branch continues the same bf16 state of step "
        f"{comparison.branch_at} on the same batches per seed, so each gap is paired (same start, same data) and "
        f"owes nothing to the init or the data order of one run.")
    log(f"files: {out / 'snip' / 'plan.json'}, {out / 'snip' / 'plan.png'}, {out / 'branch_gaps.png'}, "
        f"{out / 'comparison.json'} | {result['time_s']['total']:.0f}s "
        f"(warm-up {result['time_s']['warmup']:.0f}s, branches {result['time_s']['branches']:.0f}s)")
    return result


def _planner_json(config: PlannerConfig) -> dict[str, Any]:
    return {"budget": config.budget.describe(), "interval": config.interval, "lam": config.lam,
            "candidates": list(config.candidates), "granularity": config.granularity}
