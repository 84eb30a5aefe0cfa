"""experiments.plan_replay: a method's own plans replayed give its quality-grid branch back bit for bit, a mix takes the
first plan from one method and the later ones from the other, a change moves the first plan's GEMMs or the rounding
seeds only, and the bench runs end to end in seconds."""

import argparse
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from experiments.plan_replay import (RESEED_SHIFT, ReplayedPlans, changed_plans, mixed_plans, parse_change, parse_mix,
                                     plan_steps)
from experiments.quality_table import QualityRun
from snip_ops import SnipLinear
import warm_python

ROOT = Path(__file__).resolve().parents[2]


def test_mixed_plans_take_the_first_plan_from_one_method_and_the_rest_from_the_other():
    first = {0: {"a": "fp8"}, 50: {"a": "fp4"}}
    then = {0: {"a": "fp4"}, 50: {"a": "fp8"}, 100: {"a": "fp8"}}
    assert mixed_plans(first, then) == {0: {"a": "fp8"}, 50: {"a": "fp8"}, 100: {"a": "fp8"}}


def test_mixes_are_checked():
    assert parse_mix("snip_signal_gemm+snip_ld_gemm") == ("snip_signal_gemm", "snip_ld_gemm")
    for bad in ("snip_signal_gemm", "snip_signal_gemm+", "a+b+c", "snip_horizon_drift_gemm+snip_ld_gemm", "nope+snip"):
        with pytest.raises((argparse.ArgumentTypeError, ValueError)):
            parse_mix(bad)
    with pytest.raises(ValueError, match="step 0"):
        ReplayedPlans({50: {}})


def test_changes_move_the_first_plans_gemms_or_nothing():
    plans = {0: {"model.layers.0.mlp.up_proj": "fp8", "model.layers.10.self_attn.q_proj": {
        "fprop": "fp8", "dgrad": "fp8", "wgrad": "fp4"}}, 50: {"model.layers.0.mlp.up_proj": "fp8"}}
    assert changed_plans(plans, "reseed") == plans
    assert changed_plans(plans, "bwd_fp4") == {0: {
        "model.layers.0.mlp.up_proj": {"fprop": "fp8", "dgrad": "fp4", "wgrad": "fp4"},
        "model.layers.10.self_attn.q_proj": {"fprop": "fp8", "dgrad": "fp4", "wgrad": "fp4"}}, 50: plans[50]}
    block0 = changed_plans(plans, "block0_bwd_fp4")[0]
    assert block0["model.layers.0.mlp.up_proj"] == {"fprop": "fp8", "dgrad": "fp4", "wgrad": "fp4"}
    assert block0["model.layers.10.self_attn.q_proj"] == {"fprop": "fp8", "dgrad": "fp8", "wgrad": "fp4"}
    deep = changed_plans(plans, "deep_fwd_fp4")[0]  # block 10 is deep; block 0 is not
    assert deep["model.layers.0.mlp.up_proj"] == {"fprop": "fp8", "dgrad": "fp8", "wgrad": "fp8"}
    assert deep["model.layers.10.self_attn.q_proj"] == {"fprop": "fp4", "dgrad": "fp8", "wgrad": "fp4"}
    assert parse_change("snip_signal_gemm:reseed") == ("snip_signal_gemm", "reseed")
    for bad in ("snip_signal_gemm", "snip_signal_gemm:nope", "nope:reseed", "snip_horizon_drift_gemm:reseed"):
        with pytest.raises((argparse.ArgumentTypeError, ValueError)):
            parse_change(bad)


def test_a_reseeded_replay_shifts_every_layers_rounding_seed_only():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    ReplayedPlans({0: {}}).on_setup(model, None)
    seeds = [m.seed for m in model if isinstance(m, SnipLinear)]
    other = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    ReplayedPlans({0: {}}, RESEED_SHIFT).on_setup(other, None)
    assert [m.seed for m in other] == [s + RESEED_SHIFT for s in seeds] and len(set(seeds)) == 2


def test_plans_must_come_every_interval():
    run = QualityRun.of("tiny", 100, 0.8, "snip_signal_gemm", 0, 100, 50, 64)
    assert plan_steps({"plans": [{"step": 0, "precisions": {}}, {"step": 50, "precisions": {"x": "fp8"}}]}, run) == {
        0: {}, 50: {"x": "fp8"}}
    with pytest.raises(SystemExit, match="not every 50 steps"):
        plan_steps({"plans": [{"step": 0, "precisions": {}}, {"step": 20, "precisions": {}}]}, run)


def test_study_end_to_end_and_a_methods_own_plans_give_its_branch_back(tmp_path):
    env = {**os.environ, "SNIP_BENCH_CACHE": str(tmp_path / "cache")}
    warm_python.run([sys.executable, "-m", "experiments.plan_replay", "--phase", "2", "--budget", "0.75",
                    "--seeds", "0,1", "--steps", "2", "--interval", "1", "--eval-batches", "2", "--workers", "2",
                    "--mixes", "snip_ld_gemm+layer_type_gemm,layer_type_gemm+layer_type_gemm",
                    "--changes", "layer_type_gemm:reseed,layer_type_gemm:bwd_fp4", "--results", str(tmp_path)],
                   cwd=ROOT, check=True, capture_output=True, text=True, timeout=600, env=env)
    out = json.loads((tmp_path / "cpu-planner-plan-replay.json").read_text())
    mix, own = out["rows"]
    assert (mix["first"], mix["then"], own["first"], own["then"]) == (
        "snip_ld_gemm", "layer_type_gemm", "layer_type_gemm", "layer_type_gemm")
    # bit for bit: every seed's replayed loss minus the branch's is 0 (mean 0, spread 0)
    assert (own["vs_first"], own["vs_first_se"], own["vs_then"]) == (0.0, 0.0, 0.0) and len(mix["gap_per_seed"]) == 2
    sources = json.loads((tmp_path / "cache" / "quality-runs.json").read_text())
    assert sum("/bf16/" in k for k in sources) == 2 and len(out["replays"]) == 8
    md = (tmp_path / "cpu-planner-plan-replay.md").read_text()
    assert "| snip_ld_gemm + layer_type_gemm |" in md and "| layer_type_gemm:reseed |" in md
    reseed, bwd = out["changes"]
    assert (reseed["change"], bwd["change"]) == ("reseed", "bwd_fp4")
    # the rounding bits (backward GEMMs in FP4 round stochastically) or the first plan's GEMMs differ, so every seed's
    # changed branch differs from the method's own
    changed = {k: v for k, v in out["replays"].items() if "~" in k}
    assert len(changed) == 4 and all(v["final_val_loss"] != sources[k.split("~")[0]]["final_val_loss"]
                                     for k, v in changed.items())
    # every source run and replay was trained under one numerics (the workers' and the bench's own check agree)
    assert len({r["numerics"] for r in [*sources.values(), *out["replays"].values()]}) == 1
