"""scripts/gpu_perf.sh --dry-run: every step of the GPU performance run in its CPU smoke setting, so
that a command or flag that would fail on the GPU machine fails here first. Output to a temporary
directory; at most 8 files, what a GPU machine's output folder hands back."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.cost import MeasuredCost

from snip_ops import _ext

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["linear", "host", "gemm", "cost", "quant", "optim", "step"]  # each writes <device>-<step>.json
CHECKS = ["quant-tests"]  # its output goes to the log, inside the summary


@pytest.mark.skipif(not _ext.kernel_available("quantize", "cpu"),
                    reason="snip_ops._C not built (bench_quant's and bench_optim's smoke runs use its CPU ops)")
def test_dry_run_writes_every_result(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "GPU_PERF_BUDGET_S": "450"}
    proc = subprocess.run(["bash", "scripts/gpu_perf.sh", "--dry-run", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = tmp_path / "bench" / "results"
    names = sorted(p.name for p in results.iterdir())
    expected = [f"cpu-smoke-run-{s}.json" for s in STEPS + ["perf-summary"]]  # the log inside the summary
    assert names == sorted(expected) and len(names) <= 8
    summary = json.loads((results / "cpu-smoke-run-perf-summary.json").read_text())
    assert summary["dry_run"] and summary["device"] == "cpu (smoke run)" and summary["seconds"] <= summary["budget_s"]
    assert [s["step"] for s in summary["steps"]] == STEPS + CHECKS
    for s in summary["steps"]:
        assert s["exit_status"] == 0
        if s["step"] in CHECKS:  # the GPU tests, collected and skipped on the CPU
            assert s["output"] is None and "-m gpu" in s["command"]
            continue
        assert s["output_written"]
        if s["step"] == "cost":  # `snip cost` on the CPU: the tiny preset, a table the planner reads
            assert "--preset tiny" in s["command"]
            MeasuredCost.from_json(results / s["output"])
            continue
        assert "--smoke" in s["command"]
        assert json.loads((results / s["output"]).read_text())["device"] == "cpu (smoke run)"
    assert "--quick --configs" in summary["steps"][2]["command"]  # the GPU run's flags, checked here too
    assert "--profile" in summary["steps"][0]["command"] and "--quick" not in summary["steps"][4]["command"]
    for s in summary["steps"]:
        if s["step"] in ("linear", "step"):  # timed with the configs the autotuner picks for this GPU
            assert "--tune" in s["command"] and json.loads((results / s["output"]).read_text())["gemm_tuning"] == "tune"
    assert any(line.startswith("gpu_perf: step exit status 0") for line in summary["log"]) and summary["loadavg_at_start"]


def test_unknown_option_is_refused(tmp_path):
    proc = subprocess.run(["bash", "scripts/gpu_perf.sh", "--dryrun", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "unknown option --dryrun" in proc.stderr
