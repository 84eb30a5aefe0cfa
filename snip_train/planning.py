"""The planner in the demo trainer, through the planner's public surface only.

    hooks = make_hooks(PlannerConfig(budget=Budget.parse("fp4=0.75"), interval=100), out_dir="runs/x")
    summary = train(TrainConfig(..., precision="bf16", **hooks.train_kwargs()))
    hooks.finish()                      # plan.json (also written at every re-plan) + plan.png heat map

`add_planner_args(parser)` / `config_from_args(args)` are the `snip train` flags; `run_comparison(...)`
is the main job: bf16 vs SNIP vs one baseline on the same data, with the plan table, plan JSON, loss
curves and heat map.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from planner import BASELINES, Budget, MeasuredCost, Plan, PlannerConfig, SnipPlanner, baseline

from .plots import plot_loss_comparison, plot_plan_heatmap
from .train import TrainConfig, train

__all__ = ["PlannerHooks", "make_hooks", "add_planner_args", "config_from_args", "run_comparison"]


def _tqdm_write(msg: str) -> None:
    from tqdm.auto import tqdm

    tqdm.write(msg)


@dataclass
class PlannerHooks:
    """`on_setup` / `on_step` callbacks for `train` that run a SnipPlanner."""

    config: PlannerConfig
    out_dir: Path | None = None
    log: Callable[[str], None] = _tqdm_write
    show_table: bool = True
    planner: SnipPlanner | None = field(default=None, init=False)
    first_plan: Plan | None = field(default=None, init=False)

    def on_setup(self, model, optimizer) -> None:
        self.planner = SnipPlanner(model, optimizer, self.config, log=self.log)

    def on_step(self, step: int, model, batch) -> None:
        plan = self.planner.step(step, batch)
        if plan is None:
            return
        if self.first_plan is None:
            self.first_plan = plan
            if self.show_table:
                self.log(plan.table())
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            plan.save(self.out_dir / "plan.json")

    def train_kwargs(self) -> dict[str, Any]:
        return {"on_setup": self.on_setup, "on_step": self.on_step}

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
               log: Callable[[str], None] | None = None, show_table: bool = True) -> PlannerHooks:
    return PlannerHooks(config or PlannerConfig(), Path(out_dir) if out_dir else None, log or _tqdm_write, show_table)


def add_planner_args(parser: argparse.ArgumentParser) -> None:
    """The planner's flags for `snip train` (all inert unless --planner is given)."""
    d = PlannerConfig()
    g = parser.add_argument_group("SNIP planner")
    g.add_argument("--planner", action="store_true", help="choose per-layer precisions with the SNIP planner")
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
    g.add_argument("--planner-method", choices=("snip",) + BASELINES, default="snip",
                   help="the ILP, or a baseline for comparison (default: %(default)s)")
    g.add_argument("--planner-cost-table", default=None, metavar="JSON",
                   help="measured GEMM times (bench output) for a 'cost=' budget; default: theoretical FLOP cost")
    g.add_argument("--planner-pin", action="append", default=[], metavar="PATTERN=PREC",
                   help="keep matching layers at a precision, e.g. '*.layers.0.*=fp8' (repeatable)")
    g.add_argument("--planner-calib-batch", type=int, default=None, metavar="N",
                   help="measure on the first N sequences of the batch (default: all)")


def config_from_args(args: argparse.Namespace) -> PlannerConfig | None:
    """A PlannerConfig from parsed `add_planner_args` flags; None without --planner."""
    if not args.planner:
        return None
    cost = MeasuredCost.from_json(args.planner_cost_table) if args.planner_cost_table else None
    pins = {}
    for item in args.planner_pin:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--planner-pin expects PATTERN=PRECISION, got {item!r}")
        pins[key] = value
    return PlannerConfig(
        candidates=tuple(c.strip() for c in args.planner_candidates.split(",") if c.strip()),
        budget=Budget.fp4_fraction(args.fp4_fraction) if args.fp4_fraction is not None else
        Budget.parse(args.planner_budget, cost), interval=args.planner_interval, lam=args.planner_lambda,
        granularity=args.planner_granularity, method=args.planner_method, pinned=pins,
        calib_batch_size=args.planner_calib_batch)


def run_comparison(out_dir: str | Path, config: PlannerConfig | None = None, baseline_name: str = "layer_type",
                   log: Callable[[str], None] | None = None, **train_kwargs) -> dict[str, dict]:
    """Train bf16, SNIP and one baseline with the same `train_kwargs` (TrainConfig fields).

    The baseline plan is made once, at the budget and from the statistics of SNIP's first plan.
    Writes under `out_dir`: snip/plan.json, snip/plan.png, baseline_plan.json, loss_comparison.png
    and each run's own summary.json / loss.png. Returns {label: summary}.
    """
    out = Path(out_dir)
    config = config or PlannerConfig()
    log = log or print
    train_kwargs = {k: v for k, v in train_kwargs.items() if k not in ("precision", "out_dir", "name")}
    hooks = make_hooks(config, out / "snip")
    runs = {"SNIP": train(TrainConfig(**train_kwargs, precision="bf16", out_dir=str(out / "snip"), name="snip",
                                      **hooks.train_kwargs()))}
    hooks.finish()
    base = baseline(baseline_name, hooks.first_plan.stats, config.budget, config.candidates[0], config.candidates[-1],
                    lam=config.lam)
    base.save(out / "baseline_plan.json")
    precisions = {n: p.to_json() for n, p in base.precisions.items()}
    runs[baseline_name] = train(TrainConfig(**train_kwargs, precision=precisions, out_dir=str(out / baseline_name),
                                            name=baseline_name))
    runs["bf16"] = train(TrainConfig(**train_kwargs, precision="bf16", out_dir=str(out / "bf16"), name="bf16"))
    plot_loss_comparison(out / "loss_comparison.png", runs,
                         title=f"{config.budget.describe()}: bf16 vs SNIP vs {baseline_name}")
    for label, s in runs.items():
        log(f"{label:>12}: final val loss {s['final_val_loss']:.4f}, {s['time_s']:.0f}s")
    log(f"SNIP plan: {out / 'snip' / 'plan.json'}; pictures: {out / 'loss_comparison.png'}, "
        f"{out / 'snip' / 'plan.png'}")
    return runs
