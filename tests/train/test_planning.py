"""The planner in the demo trainer (snip_train.planning): CLI flags, training-loop hooks, pictures."""

import argparse

import pytest

from planner import Budget, DivergenceConfig, Plan, PlannerConfig, StatsConfig
from snip_train.model import LlamaConfig
from snip_train.planning import add_planner_args, config_from_args, make_hooks
from snip_train.plots import plot_loss_comparison
from snip_train.train import TrainConfig, train

FAST = dict(stats=StatsConfig(max_rows=64), divergence=DivergenceConfig(draws=1))

pytestmark = pytest.mark.usefixtures("one_thread")


def test_cli_flags():
    parser = argparse.ArgumentParser()
    add_planner_args(parser)
    assert config_from_args(parser.parse_args([])) is None
    cfg = config_from_args(parser.parse_args(["--planner", "--planner-budget", "cost=0.4", "--planner-interval", "50",
                                              "--planner-pin", "*.layers.0.*=fp8", "--planner-granularity", "gemm"]))
    assert cfg.budget == Budget.relative_cost(0.4) and cfg.interval == 50 and cfg.pinned == {"*.layers.0.*": "fp8"}
    with pytest.raises(ValueError, match="cannot parse budget"):
        config_from_args(parser.parse_args(["--planner", "--planner-budget", "75%"]))


def test_training_loop_hooks_write_plan_and_pictures(tmp_path):
    hooks = make_hooks(PlannerConfig(interval=2, **FAST), out_dir=tmp_path, log=lambda msg: None)
    summary = train(TrainConfig(model=LlamaConfig(dim=128, n_layers=1, n_heads=4, n_kv_heads=2, ffn_hidden=128,
                                                  max_seq_len=16),
                                steps=2, batch_size=2, seq_len=16, eval_batches=1, eval_interval=0,
                                max_bytes=300_000, progress=False, **hooks.train_kwargs()))
    plan = hooks.finish()
    assert summary["steps"] == 2 and plan.metrics["fp4_fraction"] >= 0.75
    assert Plan.load(tmp_path / "plan.json").precisions == plan.precisions
    assert (tmp_path / "plan.png").stat().st_size > 0 and (tmp_path / "planner_state.json").exists()


def test_loss_comparison_plot(tmp_path):
    def summary(offset):
        return {"history": {"train": {"step": [1, 2, 3], "loss": [3.0 + offset, 2.5 + offset, float("nan")]},
                            "val": {"step": [0, 3], "loss": [3.1 + offset, 2.4 + offset]}}}
    plot_loss_comparison(tmp_path / "loss.png", {"bf16": summary(0), "SNIP": summary(0.01)}, title="t")
    assert (tmp_path / "loss.png").stat().st_size > 0
