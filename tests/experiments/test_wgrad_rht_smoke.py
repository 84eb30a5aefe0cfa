"""`python -m experiments.wgrad_rht` end to end in its seconds-long setting, written to a temporary directory (the
committed results in bench/results are never touched)."""

import json
import sys
from pathlib import Path
import warm_python

ROOT = Path(__file__).resolve().parents[2]


def test_wgrad_rht_smoke(tmp_path):
    warm_python.run([sys.executable, "-m", "experiments.wgrad_rht", "--smoke", "--results", str(tmp_path)],
                   cwd=ROOT, check=True, capture_output=True, text=True, timeout=300)
    result = json.loads((tmp_path / "cpu-wgrad-rht.json").read_text())
    assert set(result["sqnr_db"]) == {"gaussian", "student_t3", "student_t2", "outlier_tokens", "row_scales", "tiny_model"}
    for per_seed in result["sqnr_db"].values():
        assert set(per_seed) == {"nvfp4", "nvfp4_train"}
        assert all(len(v) == 2 and all(5 < db < 60 for db in v) for v in per_seed.values())
    assert "| tiny_model |" in (tmp_path / "cpu-wgrad-rht.md").read_text()
