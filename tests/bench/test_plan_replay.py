"""bench_plan_replay.py: a method's own plans replayed give its quality-grid branch back bit for bit, a mix takes the
first plan from one method and the later ones from the other, and the bench runs end to end in seconds."""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from bench_plan_replay import mixed_plans, parse_mix, plan_steps, ReplayedPlans  # noqa: E402
import bench_planner as bp  # noqa: E402


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


def test_plans_must_come_every_interval():
    run = bp.QualityRun("tiny", 100, 0.8, "snip_signal_gemm", 0, 100, 50, 64)
    assert plan_steps({"plans": [{"step": 0, "precisions": {}}, {"step": 50, "precisions": {"x": "fp8"}}]}, run) == {
        0: {}, 50: {"x": "fp8"}}
    with pytest.raises(SystemExit, match="not every 50 steps"):
        plan_steps({"plans": [{"step": 0, "precisions": {}}, {"step": 20, "precisions": {}}]}, run)


def test_bench_end_to_end_and_a_methods_own_plans_give_its_branch_back(tmp_path):
    env = {**os.environ, "SNIP_BENCH_CACHE": str(tmp_path / "cache")}
    subprocess.run([sys.executable, str(ROOT / "bench" / "bench_plan_replay.py"), "--phase", "2", "--budget", "0.75",
                    "--seeds", "0,1", "--steps", "2", "--interval", "1", "--eval-batches", "2", "--workers", "2",
                    "--mixes", "snip_ld_gemm+layer_type_gemm,layer_type_gemm+layer_type_gemm", "--results", str(tmp_path)],
                   cwd=ROOT, check=True, capture_output=True, text=True, timeout=600, env=env)
    out = json.loads((tmp_path / "cpu-planner-plan-replay.json").read_text())
    mix, own = out["rows"]
    assert (mix["first"], mix["then"], own["first"], own["then"]) == (
        "snip_ld_gemm", "layer_type_gemm", "layer_type_gemm", "layer_type_gemm")
    # bit for bit: every seed's replayed loss minus the branch's is 0 (mean 0, spread 0)
    assert (own["vs_first"], own["vs_first_se"], own["vs_then"]) == (0.0, 0.0, 0.0) and len(mix["gap_per_seed"]) == 2
    sources = json.loads((tmp_path / "cache" / "quality-runs.json").read_text())
    assert sum("/bf16/" in k for k in sources) == 2 and len(out["replays"]) == 4
    assert "| snip_ld_gemm + layer_type_gemm |" in (tmp_path / "cpu-planner-plan-replay.md").read_text()
