"""The quality grid end to end in a seconds-long setting (a 2-step checkpoint, 2-step branches re-planned every step,
2 validation batches), its cache and results in temporary directories: the table, verdicts and random ranks, the raw
runs beside the summary, --report-only over committed runs, and the numerics guard of the cache."""

import json
import os
from subprocess import CompletedProcess
import sys
from pathlib import Path

import pytest

from experiments.results import read_runs
import warm_python

ROOT = Path(__file__).resolve().parents[2]
GRID = ("--phases", "2", "--steps", "2", "--interval", "1", "--eval-batches", "2")


def _quality(tmp_path: Path, *args: str, check: bool = True, cache: str = "cache") -> CompletedProcess:
    env = {**os.environ, "SNIP_BENCH_CACHE": str(tmp_path / cache)}
    return warm_python.run([sys.executable, "-m", "experiments.quality", *GRID, *args, "--results", str(tmp_path)],
                          cwd=ROOT, check=check, capture_output=True, text=True, timeout=600, env=env)


def test_quality_grid(tmp_path):
    methods = ("bf16,snip_signal,snip_ld,layer_type,uniform_fp4,snip_signal_gemm,layer_type_gemm,random_gemm,"
               "random1_gemm,snip_signal_drift_gemm,snip_struct_gemm")
    _quality(tmp_path, "--budgets", "0.5,0.75", "--seeds", "0", "--methods", methods, "--claim", "snip_signal_gemm",
             "--workers", "2")
    summary = tmp_path / "cpu-planner-quality.json"
    out, runs = json.loads(summary.read_text()), read_runs(summary)
    assert "runs" not in out and out["command"].startswith("python -m experiments.quality --phases 2")
    cell = out["table"]["2/0.75"]
    assert set(cell) == set(methods.split(","))
    rank = out["random_ranks"]["2/0.75"]
    assert rank["draws"] == ["random1_gemm", "random_gemm"] and 0 <= rank["below_draws"] <= 2
    assert "random1_gemm" not in (v["best_heuristic"] for v in out["verdicts"].values())  # a draw, not a rival
    assert "snip_ld" not in out["table"]["2/0.5"]  # the ablation at the middle budget only
    assert cell["bf16"]["gap_per_seed"] == [0.0] and cell["uniform_fp4"]["fp4_fraction"] == 1.0
    assert cell["bf16"]["kept_above_fp4"] is None and cell["uniform_fp4"]["kept_above_fp4"] is None
    for m in ("snip_signal_gemm", "layer_type_gemm", "snip_signal"):
        assert sum(cell[m]["kept_above_fp4"].values()) == pytest.approx(1.0)
    assert len(set(cell["snip_signal"]["kept_above_fp4"].values())) == 1  # per layer: the three GEMMs go together
    assert all(abs(cell[m]["fp4_fraction"] - 0.75) < 0.05 for m in ("snip_signal", "layer_type", "snip_signal_gemm"))
    assert set(out["verdicts"]) == {"2/0.5", "2/0.75"} and (tmp_path / "cpu-planner-quality.png").exists()
    per_gemm = next(r for k, r in runs.items() if "/0.75/layer_type_gemm/" in k)
    assert any(isinstance(p, dict) for p in per_gemm["plans"][0]["precisions"].values())  # fprop / dgrad / wgrad apart
    snip = next(r for k, r in runs.items() if "/0.75/snip_signal/" in k and k.endswith("/e2/lr0.003"))  # tiny's lr
    assert len(snip["plans"]) == 2 and all(len(p["precisions"]) == 28 for p in snip["plans"])  # 4 blocks x 7 linears
    assert len(snip["val"]["step"]) == 3  # at the start, at the re-plan and at the end
    assert all(0 <= p["wgrad_signal_share"] <= 1 for p in snip["plans"])
    assert "SNIP's factor on wgrad's WD" in (tmp_path / "cpu-planner-quality.md").read_text()
    drift = next(r for k, r in runs.items() if "/0.75/snip_signal_drift_gemm/" in k)
    assert "regret" not in drift["plans"][0] and all(p["regret"] >= 0 for p in drift["plans"][1:])
    struct = next(r for k, r in runs.items() if "/0.75/snip_struct_gemm/" in k)  # structured LD at every re-plan
    assert len(struct["plans"]) == 2 and all(len(p["precisions"]) == 28 for p in struct["plans"])

def test_unknown_or_retired_methods_are_refused_before_training(tmp_path):
    out = _quality(tmp_path, "--budgets", "0.75", "--seeds", "0", "--methods", "bf16,snip_oracle_gemm", check=False)
    assert out.returncode != 0 and "unknown method 'snip_oracle_gemm'" in out.stderr
    assert not (tmp_path / "cache").exists()


def test_quality_cache_never_pairs_runs_of_other_numerics(tmp_path):
    grid = ("--budgets", "0.75", "--seeds", "0", "--workers", "1")
    _quality(tmp_path, *grid, "--methods", "bf16,layer_type_gemm")
    _quality(tmp_path, *grid, "--methods", "bf16,layer_type_gemm,random_gemm")  # the grid's digest is its workers'
    cache = tmp_path / "cache" / "quality-runs.json"
    runs = json.loads(cache.read_text())
    assert len(runs) == 3 and len({r["numerics"] for r in runs.values()}) == 1
    committed = tmp_path / "committed" / "cpu-planner-quality.json"
    committed.parent.mkdir()
    for suffix in (".json", ".runs.json.xz"):
        (tmp_path / f"cpu-planner-quality{suffix}").rename(committed.with_name(f"cpu-planner-quality{suffix}"))
    three = ("--methods", "bf16,layer_type_gemm,random_gemm", "--report-only", "--runs-from", str(committed))
    _quality(tmp_path, *grid, *three)  # the same runs in the cache and the file
    assert json.loads((tmp_path / "cpu-planner-quality.json").read_text())["runs_from"] == ["cpu-planner-quality.json"]
    _quality(tmp_path, *grid, *three, cache="empty")  # a report of committed results elsewhere trains nothing
    assert not (tmp_path / "empty").exists()
    report, before = (json.loads(p.read_text()) for p in (tmp_path / "cpu-planner-quality.json", committed))
    assert report["table"] == before["table"] and report["checkpoint_val_loss"] == before["checkpoint_val_loss"]
    runs[next(k for k in runs if "/bf16/" in k)]["numerics"] = "another machine"  # a cache copied from elsewhere
    cache.write_text(json.dumps(runs))
    for more in (("--methods", "bf16,layer_type_gemm,random_gemm", "--report-only"),  # tabulating them
                 ("--methods", "bf16,layer_type_gemm,first_last_gemm")):  # training beside them
        out = _quality(tmp_path, *grid, *more, check=False)
        assert out.returncode != 0 and "trained under different numerics" in out.stderr
        assert "another machine: 1 (tiny/2/-/bf16/0/" in out.stderr
    out = _quality(tmp_path, *grid, "--methods", "bf16,layer_type_gemm", "--report-only", "--runs-from", str(committed),
                   check=False)
    assert out.returncode != 0 and "bf16/0/2/1/e2/lr0.003 differs from the one already read" in out.stderr
    assert len(json.loads(cache.read_text())) == 3  # nothing trained beside them
