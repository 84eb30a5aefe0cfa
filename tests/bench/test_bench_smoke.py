"""Every CPU benchmark of bench/ runs end to end in a seconds-long setting, its results written to a
temporary directory (the committed ones in bench/results are never touched). The GPU benchmarks'
refusal without a GPU is tested with the command line (tests/train/test_cli_errors.py)."""

import json
import shutil
import sys
from pathlib import Path
import warm_python

ROOT = Path(__file__).resolve().parents[2]


def _bench(module: str, *args: str) -> None:
    warm_python.run([sys.executable, "-m", f"bench.{module}", *args], cwd=ROOT, check=True,
                   capture_output=True, text=True, timeout=600)


def test_planner_ilp_timing(tmp_path):
    # --ilp-only keeps the measurement section of the last full run: start from the committed one
    copied = shutil.copy(ROOT / "bench" / "results" / "cpu-planner-cost.json", tmp_path)
    committed = json.loads(Path(copied).read_text())
    _bench("bench_planner_cost", "--ilp-only", "--results", str(tmp_path))
    result = json.loads((tmp_path / "cpu-planner-cost.json").read_text())
    assert all(row["certified_optimal"] for row in result["ilp"])
    assert result["measurement"] == committed["measurement"]
    made = committed.get("measurement_made", committed)
    assert (result["measurement_made"]["date"], result["measurement_made"]["command"]) == (made["date"], made["command"])


def test_planner_cost(tmp_path):
    _bench("bench_planner_cost", "--presets", "tiny", "--reps", "1", "--results", str(tmp_path))
    result = json.loads((tmp_path / "cpu-planner-cost.json").read_text())
    tiny = result["measurement"]["tiny"]
    assert tiny["replan_default_over_bf16_step"] > tiny["measure_default_over_bf16_step"] > 0
    assert "time_gradient_variance_s" in tiny["breakdown_of_the_last_repeat"]["batched_hessian"]
    assert result["command"] == "python -m bench.bench_planner_cost --presets tiny --reps 1"
    assert "re-plan ratio" in (tmp_path / "cpu-planner-cost.md").read_text()


def test_stability_sweep(tmp_path):
    _bench("bench_stability", "--preset", "cpu-quick", "--precisions", "fp32,e5m2", "--lrs", "0.01", "--seeds", "0",
           "--steps", "2", "--batch-size", "2", "--seq-len", "16", "--sharpness-every", "0", "--workers", "1",
           "--threads", "1", "--no-progress", "--out", str(tmp_path / "cells"), "--results", str(tmp_path / "results"))
    written = sorted(p.name for p in (tmp_path / "results").iterdir())
    assert any(n.endswith("-heatmap.png") for n in written) and any(n.endswith("-cells.json") for n in written)


def test_cpu_step(tmp_path):
    _bench("bench_cpu_step", "--smoke", "--results", str(tmp_path))
    result = json.loads((tmp_path / "cpu-step-op.json").read_text())
    assert result["ratio"] > 0 and set(result["median_step_s"]) == {"bf16", "fp4"}
