"""`python -m bench.bench_optim lr-range` end to end in a seconds-long setting (two steps per run), its results and
cache in a temporary directory (the committed results in bench/results are never touched)."""

import json
import os
import sys
from pathlib import Path
import warm_python

ROOT = Path(__file__).resolve().parents[2]
STRATEGIES = {"master", "bf16_sr", "bf16_sr_bf16_moments"}


def _lr_range(tmp_path: Path) -> dict:
    warm_python.run([sys.executable, "-m", "bench.bench_optim", "lr-range", "--steps", "2", "--seeds", "2",
                    "--lrs", "0.01,1", "--batch-size", "2", "--seq-len", "16", "--workers", "1",
                    "--results", str(tmp_path)],
                   cwd=ROOT, check=True, capture_output=True, text=True, timeout=300,
                   env={**os.environ, "SNIP_BENCH_CACHE": str(tmp_path / "cache")})
    return json.loads((tmp_path / "cpu-optim-lr-range.json").read_text())


def test_lr_range_smoke(tmp_path):
    result = _lr_range(tmp_path)
    assert result["runs_trained"] == 3 * 2 * 2
    assert {(v["precision"], v["lr"], v["seed"]) for v in result["verdicts"]} == \
        {(st, lr, seed) for st in STRATEGIES for lr in (0.01, 1.0) for seed in (0, 1)}
    assert all(isinstance(v["diverged"], bool) for v in result["verdicts"])
    assert set(result["summary"]) == STRATEGIES
    assert result["summary"]["master"]["ratio_to_baseline"][1] in ("=", "<=", "?")
    md = (tmp_path / "cpu-optim-lr-range.md").read_text()
    assert "## Largest stable learning rate" in md and result["command"] in md

    rerun = _lr_range(tmp_path)  # every run comes from the cache
    assert rerun["runs_trained"] == 0
    assert [v["final_loss"] for v in rerun["verdicts"]] == [v["final_loss"] for v in result["verdicts"]]
