"""The planner in the demo trainer (snip_train.planning): CLI flags, training-loop hooks, pictures, and the
paired comparison (a bf16 warm-up, then bf16 / SNIP / baselines branched from its state)."""

import argparse
import json
import math

import pytest

from planner import BASELINES, Budget, DivergenceConfig, Plan, PlannerConfig, StatsConfig
from snip_train.model import LlamaConfig
from snip_train.planning import (DEFAULT_BASELINES, ComparisonConfig, PlannerHooks, add_planner_args,
                                 branch_data_seed, comparison_from_args, config_from_args, format_table, make_hooks,
                                 run_branch, run_comparison, summarize)
from snip_train.plots import plot_branch_gaps
from snip_train.train import TrainConfig, learning_rates, train

FAST = dict(stats=StatsConfig(max_rows=64), divergence=DivergenceConfig(draws=1))
MODEL = LlamaConfig(dim=128, n_layers=1, n_heads=4, n_kv_heads=2, ffn_hidden=128, max_seq_len=16)
RUN = dict(model=MODEL, batch_size=2, seq_len=16, eval_batches=1, max_bytes=300_000, progress=False)

pytestmark = pytest.mark.usefixtures("one_thread")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_planner_args(parser)
    parser.add_argument("--threads", type=int, default=None)  # snip train's
    return parser


def test_cli_flags():
    parser = _parser()
    assert config_from_args(parser.parse_args([])) is None and comparison_from_args(parser.parse_args([]), 10) is None
    cfg = config_from_args(parser.parse_args(["--planner", "--planner-budget", "cost=0.4", "--planner-interval", "50",
                                              "--planner-pin", "*.layers.0.*=fp8", "--planner-granularity", "gemm"]))
    assert cfg.budget == Budget.relative_cost(0.4) and cfg.interval == 50 and cfg.pinned == {"*.layers.0.*": "fp8"}
    assert cfg.wd_horizon == "interval" and cfg.divergence_config.wd_horizon == 50
    for flag, want in (("settled", "settled"), ("20", 20)):
        assert config_from_args(parser.parse_args(["--planner", "--planner-wd-horizon", flag])).wd_horizon == want
    for flag in ("soon", "run_end"):  # "run_end" (WD priced at the run's end) was removed
        with pytest.raises(SystemExit):
            parser.parse_args(["--planner", "--planner-wd-horizon", flag])
    with pytest.raises(ValueError, match="cannot parse budget"):
        config_from_args(parser.parse_args(["--planner", "--planner-budget", "75%"]))


def test_comparison_flags():
    parser = _parser()
    plain = comparison_from_args(parser.parse_args(["--planner"]), steps=300)  # --planner alone is meaningful
    assert plain.branch_at == 150 and plain.baselines == DEFAULT_BASELINES and plain.threads == 1
    assert plain.methods == ("bf16", "SNIP", *DEFAULT_BASELINES) and 1 <= plain.workers <= 2
    c = comparison_from_args(parser.parse_args(["--planner", "--branch-at", "20", "--branch-seeds", "3,4",
                                                "--baselines", "random,layer_type", "--workers", "3",
                                                "--threads", "2"]), steps=30)
    assert (c.branch_at, c.seeds, c.baselines, c.workers, c.threads) == (20, (3, 4), ("random", "layer_type"), 3, 2)
    assert comparison_from_args(parser.parse_args(["--planner", "--baselines", "none"]), 4).methods == ("bf16", "SNIP")
    assert c.planner_for("bf16") is None and c.planner_for("SNIP").method == "snip"
    assert c.planner_for("random") == PlannerConfig(method="random")
    with pytest.raises(ValueError, match="unknown baselines"):
        comparison_from_args(parser.parse_args(["--planner", "--baselines", "min_error"]), 10)
    with pytest.raises(ValueError, match="must not repeat"):
        ComparisonConfig(branch_at=1, seeds=(0, 0))
    assert set(DEFAULT_BASELINES) <= set(BASELINES)


def test_branch_data_seed():
    seeds = {branch_data_seed(0, 200, s) for s in range(4)} | {branch_data_seed(1, 200, 0), branch_data_seed(0, 100, 0)}
    assert len(seeds) == 6 and branch_data_seed(0, 200, 1) == branch_data_seed(0, 200, 1)
    assert all(0 <= s < 2**64 for s in seeds)


def test_training_loop_hooks_write_plan_and_pictures(tmp_path):
    hooks = make_hooks(PlannerConfig(interval=2, **FAST), out_dir=tmp_path, log=lambda msg: None)
    summary = train(TrainConfig(steps=2, eval_interval=0, **RUN, **hooks.train_kwargs()))
    plan = hooks.finish()
    assert summary["steps"] == 2 and plan.metrics["fp4_fraction"] >= 0.75
    assert Plan.load(tmp_path / "plan.json").precisions == plan.precisions
    assert (tmp_path / "plan.png").stat().st_size > 0 and (tmp_path / "planner_state.json").exists()


def test_a_branch_re_plans_from_its_own_first_step():
    cfg = TrainConfig(steps=8, eval_interval=0, **RUN)
    state = train(cfg, stop_at=3)["state"]
    hooks = PlannerHooks(PlannerConfig(interval=2, **FAST), log=lambda msg: None, show_table=False)
    train(TrainConfig(steps=8, eval_interval=0, **RUN, **hooks.train_kwargs()), start=state)
    assert [p.step for p in hooks.plans] == [3, 5, 7] and hooks.first_plan is hooks.plans[0]


def test_planners_of_the_trainer_look_ahead_along_the_runs_learning_rates(monkeypatch):
    """A comparison branch's planner gets the run's learning-rate schedule (WD's horizon decays with it)."""
    import snip_train.planning as planning

    seen = []

    class Recording(planning.SnipPlanner):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append(self.lr_schedule)

    monkeypatch.setattr(planning, "SnipPlanner", Recording)
    cfg = TrainConfig(steps=4, eval_interval=0, **RUN)
    state = train(cfg, stop_at=2)["state"]
    run_branch(state, cfg, ComparisonConfig(branch_at=2, planner=PlannerConfig(interval=1, **FAST), baselines=(),
                                            seeds=(0,)), "SNIP", 0)
    assert len(seen) == 1 and [seen[0](s) for s in range(6)] == [learning_rates(cfg)(s) for s in range(6)]
    assert seen[0](4) == 0.0


def _branch(method, seed, val, fp4=(0.75,)):
    return {"method": method, "seed": seed, "final_val_loss": val, "diverged": val is None,
            "val": {"step": [0, 1], "loss": [3.0, 3.0 if val is None else val]}, "train_loss": [],
            "plans": [{"metrics": {"fp4_fraction": f}} for f in fp4] if method != "bf16" else [], "time_s": 1.0}


def test_summarize_pairs_each_seed_with_its_bf16_branch():
    branches = [_branch("bf16", 0, 2.0), _branch("SNIP", 0, 2.01), _branch("random", 0, 2.03, (0.75, 0.8)),
                _branch("bf16", 1, 2.5), _branch("SNIP", 1, 2.52), _branch("random", 1, None)]
    table = summarize(branches, ("bf16", "SNIP", "random"), (0, 1))
    snip = table["SNIP"]
    assert snip["gap_to_bf16"] == pytest.approx([0.01, 0.02]) and snip["mean_gap"] == pytest.approx(0.015)
    assert snip["std_gap"] == pytest.approx(math.sqrt(2) * 0.005) and snip["min_gap"] == pytest.approx(0.01)
    assert snip["beats"] == {"bf16": 0, "random": 2} and snip["fp4_fraction"] == 0.75
    assert table["random"]["fp4_fraction"] == pytest.approx((0.75 + 0.8 + 0.75) / 3)  # over plans, not seeds
    assert table["random"]["mean_gap"] is None
    assert table["random"]["beats"] == {"bf16": 0, "SNIP": 0} and table["bf16"]["beats"] == {"SNIP": 2, "random": 2}
    text = format_table(table, (0, 1))
    assert text.index("\nbf16") < text.index("\nSNIP") < text.index("\nrandom") and "diverged" in text


def test_branch_gaps_plot(tmp_path):
    plot_branch_gaps(tmp_path / "gaps.png", {"SNIP": ([0, 5, 10], [[0.0, 0.01, 0.02], [0.0, 0.02]]),
                                             "random": ([0, 5, 10], [[0.0, 0.03, 0.05]])}, title="t")
    assert (tmp_path / "gaps.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_comparison_is_independent_of_the_workers(tmp_path, capsys):
    """2 methods x 2 seeds; 1 and 2 worker processes give the same numbers, which are those of the branch run
    in this process; the files and the printed verdict are there."""
    cfg = TrainConfig(steps=4, eval_interval=1, **RUN)
    comparisons = {w: ComparisonConfig(branch_at=2, planner=PlannerConfig(interval=1, **FAST), baselines=(),
                                       seeds=(0, 1), workers=w) for w in (1, 2)}
    results = {w: run_comparison(tmp_path / str(w), cfg, c) for w, c in comparisons.items()}
    out = capsys.readouterr().out
    assert results[1]["table"] == results[2]["table"]
    for a, b in zip(results[1]["branches"], results[2]["branches"]):
        assert [a[k] for k in ("method", "seed", "val", "train_loss")] == [b[k] for k in ("method", "seed", "val",
                                                                                         "train_loss")]
    assert [(b["method"], b["seed"]) for b in results[1]["branches"]] == [("bf16", 0), ("SNIP", 0), ("bf16", 1),
                                                                          ("SNIP", 1)]
    snip = results[1]["branches"][3]
    assert [p["step"] for p in snip["plans"]] == [2, 3] and snip["val"]["step"] == [2, 3, 4]
    state = train(cfg, stop_at=2)["state"]
    here = run_branch(state, cfg, comparisons[1], "SNIP", 1)
    assert here["val"] == snip["val"] and here["train_loss"] == snip["train_loss"]

    out_dir = tmp_path / "1"
    for name in ("snip/plan.json", "snip/plan.png", "branch_gaps.png", "comparison.json", "warmup/summary.json"):
        assert (out_dir / name).stat().st_size > 0, name
    assert json.loads((out_dir / "comparison.json").read_text())["table"]["SNIP"]["plans"] == 4
    assert Plan.load(out_dir / "snip" / "plan.json").step == 2
    assert "Why the ranking means something" in out and "fprop" in out  # the verdict and the plan table
    with pytest.raises(ValueError, match="must be below"):
        run_comparison(tmp_path / "x", cfg, ComparisonConfig(branch_at=4, baselines=(), seeds=(0,)))
