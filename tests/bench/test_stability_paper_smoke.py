"""The stability benchmark's "cpu-paper" preset (the paper's eXmY simulation and sharpness) runs end to end in a
seconds-long setting, results written to a temporary directory; a second run trains nothing (resumable)."""

import json
import sys
from pathlib import Path
import warm_python

ROOT = Path(__file__).resolve().parents[2]


def _bench(*args: str) -> str:
    return warm_python.run([sys.executable, "-m", "bench.bench_stability", *args], cwd=ROOT, check=True,
                          capture_output=True, text=True, timeout=600).stdout


def test_paper_preset_smoke(tmp_path):
    args = ["--preset", "cpu-paper", "--precisions", "fp32,e6m2:trunc", "--lrs", "0.01", "--seeds", "0",
            "--steps", "2", "--batch-size", "2", "--seq-len", "16", "--sharpness-every", "1", "--workers", "1",
            "--threads", "1", "--no-progress", "--out", str(tmp_path / "cells"), "--results", str(tmp_path / "results")]
    assert "2 trained now" in _bench(*args)
    names = sorted(p.name for p in (tmp_path / "results").iterdir())
    assert all(n.startswith("cpu-stability-paper-") for n in names)
    for suffix in (".json", ".md", "-cells.json", "-heatmap.png", "-sharpness.png", "-epsilon-sharpness.png"):
        assert any(n.endswith(suffix) for n in names), suffix
    summary = json.loads(next((tmp_path / "results").glob("*[0-9].json")).read_text())
    assert summary["context"]["spec"]["setup"]["epsilon_sharpness"]["eps"] == 1e-3
    assert all(v["early_sharpness"]["epsilon"] >= 0 for v in summary["verdicts"])
    report = next((tmp_path / "results").glob("*.md")).read_text()
    assert "the paper's epsilon-sharpness" in report and "| e6m2:trunc |" in report
    assert "0 trained now, 2 reused" in _bench(*args)
