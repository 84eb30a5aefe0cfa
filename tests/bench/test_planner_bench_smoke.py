"""The planner benchmark's quality grid and metric validity run end to end in a seconds-long setting
(a few training steps, a handful of layers), with their cache and results in temporary directories."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench(tmp_path: Path, *args: str, check: bool = True, cache: str = "cache") -> subprocess.CompletedProcess:
    env = {**os.environ, "SNIP_BENCH_CACHE": str(tmp_path / cache)}
    return subprocess.run([sys.executable, str(ROOT / "bench" / "bench_planner.py"), *args, "--results", str(tmp_path)],
                          cwd=ROOT, check=check, capture_output=True, text=True, timeout=600, env=env)


def test_quality_grid(tmp_path):
    _bench(tmp_path, "quality", "--phases", "2", "--budgets", "0.5,0.75", "--seeds", "0,1", "--steps", "2",
           "--interval", "1", "--methods", "bf16,snip,snip_ld,layer_type,uniform_fp4,snip_horizon_gemm,layer_type_gemm,"
           "random_gemm,random1_gemm,snip_horizon_drift_gemm,layer_type_drift_gemm,snip_cal_gemm,snip_oracle_gemm,"
           "snip_signal_gemm,snip_trend_gemm,snip_growth_gemm,snip_growth_oracle_gemm,snip_growth_to_end_gemm,"
           "snip_share_gemm,snip_struct_gemm,snip_dir_gemm,snip_end_gemm",
           "--claim", "snip_horizon_gemm", "--workers", "2", "--eval-batches", "2")
    out = json.loads((tmp_path / "cpu-planner-quality.json").read_text())
    cell = out["table"]["2/0.75"]
    assert set(cell) == {"bf16", "snip", "snip_ld", "layer_type", "uniform_fp4", "snip_horizon_gemm", "layer_type_gemm",
                         "random_gemm", "random1_gemm", "snip_horizon_drift_gemm", "layer_type_drift_gemm", "snip_cal_gemm",
                         "snip_oracle_gemm", "snip_signal_gemm", "snip_trend_gemm", "snip_growth_gemm",
                         "snip_growth_oracle_gemm", "snip_growth_to_end_gemm", "snip_share_gemm", "snip_struct_gemm",
                         "snip_dir_gemm", "snip_end_gemm"}
    rank = out["random_ranks"]["2/0.75"]
    assert rank["draws"] == ["random1_gemm", "random_gemm"] and 0 <= rank["below_draws"] <= 2
    assert "random1_gemm" not in (v["best_heuristic"] for v in out["verdicts"].values())  # a draw, not a rival
    assert "snip_ld" not in out["table"]["2/0.5"]  # the ablation at the middle budget only
    assert cell["bf16"]["gap_per_seed"] == [0.0, 0.0] and cell["uniform_fp4"]["fp4_fraction"] == 1.0
    assert cell["bf16"]["kept_above_fp4"] is None and cell["uniform_fp4"]["kept_above_fp4"] is None
    for m in ("snip_horizon_gemm", "layer_type_gemm", "snip"):
        assert sum(cell[m]["kept_above_fp4"].values()) == pytest.approx(1.0)
    assert len(set(cell["snip"]["kept_above_fp4"].values())) == 1  # per layer: the three GEMMs go together
    assert all(abs(cell[m]["fp4_fraction"] - 0.75) < 0.05 for m in ("snip", "layer_type", "snip_horizon_gemm"))
    assert set(out["verdicts"]) == {"2/0.5", "2/0.75"} and (tmp_path / "cpu-planner-quality.png").exists()
    growth = json.loads((tmp_path / "cache" / "ld-growth-tiny-2-2.json").read_text())  # snip_oracle's foresight
    assert len(growth) == 28 and all(g > 0 for g in growth.values())
    before = json.loads((tmp_path / "cache" / "curvature-tiny-1.json").read_text())  # snip_trend's first growth
    assert len(before) == 28 and all(h >= 0 for h in before.values())
    assert out["verdicts"]["2/0.75"]["best_heuristic"] in ("layer_type", "layer_type_gemm", "uniform_fp4", "random_gemm",
                                                           "layer_type_drift_gemm")
    per_gemm = next(r for k, r in out["runs"].items() if "/0.75/layer_type_gemm/" in k)
    assert any(isinstance(p, dict) for p in per_gemm["plans"][0]["precisions"].values())  # fprop / dgrad / wgrad apart
    snip = next(r for k, r in out["runs"].items() if "/0.75/snip/" in k and k.endswith("/e2/lr0.003"))  # tiny's lr
    assert len(snip["plans"]) == 2 and all(len(p["precisions"]) == 28 for p in snip["plans"])  # 4 blocks x 7 linears
    assert len(snip["val"]["step"]) == 3  # at the start, at the re-plan and at the end
    signal = next(r for k, r in out["runs"].items() if "/0.75/snip_signal_gemm/" in k)
    assert all(0 <= p["wgrad_signal_share"] <= 1 for p in signal["plans"]) and len(signal["plans"]) == 2
    assert "snip_signal's factor on wgrad's WD" in (tmp_path / "cpu-planner-quality.md").read_text()
    drift = next(r for k, r in out["runs"].items() if "/0.75/snip_horizon_drift_gemm/" in k)
    assert "regret" not in drift["plans"][0] and all(p["regret"] >= 0 for p in drift["plans"][1:])


def test_quality_cache_never_pairs_runs_of_other_numerics(tmp_path):
    grid = ("quality", "--phases", "2", "--budgets", "0.75", "--seeds", "0", "--steps", "2", "--interval", "1",
            "--eval-batches", "2", "--workers", "1")
    _bench(tmp_path, *grid, "--methods", "bf16,layer_type_gemm")
    _bench(tmp_path, *grid, "--methods", "bf16,layer_type_gemm,random_gemm")  # the bench's digest is its workers'
    cache = tmp_path / "cache" / "quality-runs.json"
    runs = json.loads(cache.read_text())
    assert len(runs) == 3 and len({r["numerics"] for r in runs.values()}) == 1
    committed = tmp_path / "committed.json"
    (tmp_path / "cpu-planner-quality.json").rename(committed)
    _bench(tmp_path, *grid, "--methods", "bf16,layer_type_gemm,random_gemm", "--report-only", "--runs-from",
           str(committed))  # the same runs in the cache and the file
    assert json.loads((tmp_path / "cpu-planner-quality.json").read_text())["runs_from"] == ["committed.json"]
    _bench(tmp_path, *grid, "--methods", "bf16,layer_type_gemm,random_gemm", "--report-only", "--runs-from",
           str(committed), cache="empty")  # a report of committed results elsewhere trains nothing, checkpoints neither
    assert not (tmp_path / "empty").exists()
    report, before = (json.loads(p.read_text()) for p in (tmp_path / "cpu-planner-quality.json", committed))
    assert report["table"] == before["table"] and report["checkpoint_val_loss"] == before["checkpoint_val_loss"]
    runs[next(k for k in runs if "/bf16/" in k)]["numerics"] = "another machine"  # a cache copied from elsewhere
    cache.write_text(json.dumps(runs))
    for more in (("--methods", "bf16,layer_type_gemm,random_gemm", "--report-only"),  # tabulating them
                 ("--methods", "bf16,layer_type_gemm,first_last_gemm")):  # training beside them
        out = _bench(tmp_path, *grid, *more, check=False)
        assert out.returncode != 0 and "trained under different numerics" in out.stderr
        assert "another machine: 1 (tiny/2/-/bf16/0/" in out.stderr
    out = _bench(tmp_path, *grid, "--methods", "bf16,layer_type_gemm", "--report-only", "--runs-from", str(committed),
                 check=False)
    assert out.returncode != 0 and "bf16/0/2/1/e2/lr0.003 differs from the one already read" in out.stderr
    assert len(json.loads(cache.read_text())) == 3  # nothing trained beside them


def test_validity(tmp_path):
    _bench(tmp_path, "validity", "--pre-steps", "2", "--steps", "1", "--seeds", "0,1", "--layers", "3")
    out = json.loads((tmp_path / "cpu-planner-validity.json").read_text())
    assert len(out["layers"]) == 3 and set(out["reliability"]) >= {"backward_trained", "trained", "forward_only_sr"}
    assert set(out["estimators"]) == {f"{m}_draws{d}" for m in ("fisher", "batched") for d in (1, 2, 8)}
    assert all(e["layers_with_curvature_<=_0"] == 0 for k, e in out["estimators"].items() if k.startswith("fisher"))


def test_wgrad_error(tmp_path):
    _bench(tmp_path, "wgrad_error", "--phases", "2", "--seeds", "0,1")
    out = json.loads((tmp_path / "cpu-planner-wgrad-error.json").read_text())
    (row,) = out["rows"]
    assert row["phase"] == 2 and row["sampled_rows"] == 128 and row["tokens"] == 1024
    assert all(0 < row[k]["min"] <= row[k]["median"] <= row[k]["max"] for k in ("own", "scaled"))


def test_scale(tmp_path):
    _bench(tmp_path, "scale", "--phases", "2", "--steps", "2", "--seeds", "0,1", "--eval-batches", "1", "--amplify", "1,2",
           "--gemms", "fprop,dgrad,wgrad,fprop_train")
    out = json.loads((tmp_path / "cpu-planner-scale.json").read_text())
    assert [(r["phase"], r["gemm"], r["amplify"]) for r in out["rows"]] == [
        (2, g, k) for g in ("fprop", "dgrad", "wgrad", "fprop_train") for k in (1.0, 2.0)]
    fprop, trained_only = out["rows"][:2], out["rows"][6:]  # priced alike (LD); measured apart
    assert [r["predicted"] for r in fprop] == [r["predicted"] for r in trained_only]
    assert all(a["gaps"] != b["gaps"] for a, b in zip(fprop, trained_only))
    assert all(r["predicted"] > 0 and len(r["gaps"]) == 2 for r in out["rows"])
    for unit, twice in zip(out["rows"][::2], out["rows"][1::2]):  # the prediction is quadratic in the factor
        assert twice["predicted"] == pytest.approx(4 * unit["predicted"]) and "exponent" in twice
    assert set(json.loads((tmp_path / "cache" / "scale-2.json").read_text())["numerics"]) == {"tiny/2"}


def test_scale_per_block(tmp_path):
    _bench(tmp_path, "scale", "--phases", "2", "--steps", "2", "--seeds", "0", "--eval-batches", "1", "--amplify", "2",
           "--gemms", "fprop_train,wgrad", "--blocks", "0,3", "--name", "scale-blocks")
    out = json.loads((tmp_path / "cpu-planner-scale-blocks.json").read_text())
    assert [(r["gemm"], r["block"]) for r in out["rows"]] == [(g, b) for g in ("fprop_train", "wgrad") for b in (0, 3)]
    assert all(r["predicted"] > 0 for r in out["rows"]) and "| block |" in (tmp_path / "cpu-planner-scale-blocks.md").read_text()


def test_horizon(tmp_path):
    _bench(tmp_path, "horizon", "--phases", "2", "--budgets", "0.5,0.8", "--interval", "3")
    out = json.loads((tmp_path / "cpu-planner-horizon.json").read_text())
    (row,) = out["rows"]
    assert row["phase"] == 2 and out["interval"] == 3
    assert all(-1 <= row[f"spearman_{k}"] <= 1 and row[f"median_ratio_{k}"] > 0 for k in ("s_wgrad", "s_dgrad"))
    assert all(0 <= row[f"same_gemms_at_{b}"] <= 1 for b in (0.5, 0.8))


def test_staleness(tmp_path):
    _bench(tmp_path, "staleness", "--phases", "2", "--offsets", "0,1", "--budgets", "0.5", "--interval", "2")
    out = json.loads((tmp_path / "cpu-planner-staleness.json").read_text())
    assert [(r["phase"], r["offset"]) for r in out["rows"]] == [(2, 0), (2, 1)]
    assert all(r["regret_at_0.5"] >= -1e-9 and set(r["ld_growth_per_block"]) == {"0", "1", "2", "3"} for r in out["rows"])


def test_schedule(tmp_path):
    _bench(tmp_path, "schedule", "--phases", "2", "--steps", "6", "--interval", "2", "--seeds", "0,1",
           "--budgets", "0.9,0.5,0.7")
    out = json.loads((tmp_path / "cpu-planner-schedule.json").read_text())
    assert set(out["table"]) == {"bf16", "snip", "snip_schedule"}
    whys = [why for step, why, share in out["table"]["snip_schedule"]["replans"][0]]
    assert ["lr_decay"] in whys or ["interval", "lr_decay"] in whys  # the decay starts in the second half
    assert out["table"]["snip"]["mean_fp4_share"] >= 0.7


def test_swap(tmp_path):
    _bench(tmp_path, "swap", "--phases", "2", "--steps", "2", "--seeds", "0,1", "--eval-batches", "2", "--budgets", "0.5",
           "--raise", "layers.3.mlp.down_proj", "--lower", "layers.0.self_attn.q_proj")
    out = json.loads((tmp_path / "cpu-planner-swap.json").read_text())
    assert set(out["table"]) == {"snip", "raised", "lowered", "swapped", "raised_fprop", "raised_bwd", "lowered_fprop",
                                 "lowered_bwd"}
    plans, table = out["plans"], out["table"]
    assert plans["swapped"]["model.layers.3.mlp.down_proj"] == "fp8" and plans["swapped"]["model.layers.0.self_attn.q_proj"] == "fp4"
    q, down = "model.layers.0.self_attn.q_proj", "model.layers.3.mlp.down_proj"
    assert plans["lowered_fprop"][q] == {"fprop": "fp4", "dgrad": plans["snip"][q], "wgrad": plans["snip"][q]}
    assert plans["raised_bwd"][down] == {"fprop": plans["snip"][down], "dgrad": "fp8", "wgrad": "fp8"}
    # the split moves' predicted costs add up to the whole move's (the objective is a sum over GEMMs)
    for move in ("raised", "lowered"):
        parts = table[f"{move}_fprop"]["objective"] + table[f"{move}_bwd"]["objective"] - table["snip"]["objective"]
        assert abs(parts - table[move]["objective"]) <= 1e-9 * abs(table[move]["objective"])
    assert all("trained_vs_snip" in r for label, r in table.items() if label != "snip")
    assert table["raised"]["fp4_share"] <= table["snip"]["fp4_share"] <= table["lowered"]["fp4_share"]
    assert all(len(r["gap_per_seed"]) == 2 for r in table.values())


def test_kept_above_fp4_counts_every_plans_gemms_by_kind():
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_planner import kept_above_fp4

    plan = {"precisions": {"a": "fp8", "b": {"fprop": "fp8", "dgrad": "fp4", "wgrad": "fp4"}, "c": "fp4"}}
    other = {"precisions": {"a": {"fprop": "fp4", "dgrad": "fp4", "wgrad": "fp8"}, "b": "fp4", "c": "fp4"}}
    kept = kept_above_fp4([{"plans": [plan]}, {"plans": [other]}])
    assert kept == {"fprop": 0.4, "dgrad": 0.2, "wgrad": 0.4}
    assert kept_above_fp4([{"plans": []}]) is None and kept_above_fp4([{"plans": [{"precisions": {"a": "fp4"}}]}]) is None


def test_quality_verdicts_call_a_margin_resolved_beyond_two_standard_errors_of_every_paired_difference():
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_planner import quality_verdicts

    def cell(**gaps):
        return {m: {"gap_per_seed": g, "mean_gap": sum(g) / len(g)} for m, g in gaps.items()}
    # below both heuristics on average, but random's paired difference (0.002, -0.001, 0.002) is within 2 SE
    table = {"100/0.8": cell(snip_gemm=[0.001, 0.003, 0.002], random_gemm=[0.003, 0.002, 0.004],
                             first_last_gemm=[0.011, 0.013, 0.012], snip_ld_gemm=[0.0, 0.0, 0.0])}
    v = quality_verdicts(table, "snip_gemm")["100/0.8"]
    assert v["below_every_heuristic"] and not v["resolved_below_every_heuristic"]
    assert set(v["margins"]) == {"random_gemm", "first_last_gemm"}  # the ablation is no rival
    assert v["best_heuristic"] == "random_gemm" and v["margin_standard_error"] == pytest.approx(0.001)
    assert v["margins"]["first_last_gemm"] == pytest.approx((0.01, 0.0))
    assert 12 <= v["seeds_to_resolve"] <= 13  # random's 0.001 +- 0.001 at 3 seeds: 2 SE fall below it beyond 12
    table["100/0.8"]["random_gemm"] = cell(x=[0.003, 0.0045, 0.0035])["x"]  # 0.0017 +- 0.0002 now
    v = quality_verdicts(table, "snip_gemm")["100/0.8"]
    assert v["resolved_below_every_heuristic"] and v["seeds_to_resolve"] == 3
    table["100/0.8"]["random_gemm"] = cell(x=[0.001, 0.003, 0.002])["x"]  # a tie: no number of seeds resolves it
    assert quality_verdicts(table, "snip_gemm")["100/0.8"]["seeds_to_resolve"] is None


def test_seeds_to_resolve_scale_the_standard_error_as_one_over_the_root_of_the_seeds():
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_planner import seeds_to_resolve
    assert seeds_to_resolve({"a": (0.003, 0.003)}, 3) == 13  # 2 SE = 2 margins at 3 seeds: 4x the seeds, and one more
    assert seeds_to_resolve({"a": (0.003, 0.003), "b": (0.004, 0.001)}, 3) == 13  # the worst margin decides
    assert seeds_to_resolve({"a": (0.004, 0.001)}, 10) == 10  # resolved already
    assert seeds_to_resolve({"a": (0.004, 0.001), "b": (-0.0001, 0.001)}, 10) is None
    assert seeds_to_resolve({"a": (0.0, 0.001)}, 10) is None


def test_forward_error(tmp_path):
    from snip_ops import SnipLinear, convert
    from snip_train.model import Llama
    names = [n for n, m in convert(Llama("tiny")).named_modules() if isinstance(m, SnipLinear)]
    fp4 = {"model.layers.0.mlp.up_proj", "model.layers.3.self_attn.q_proj"}
    plan = {n: {"fprop": "fp4" if n in fp4 else "fp8", "dgrad": "fp4", "wgrad": "fp4"} for n in names}
    runs = {"tiny/2/-/bf16/0/2/1/e2/lr0.003": {"final_val_loss": 4.0, "plans": []},
            "tiny/2/0.5/snip_gemm/0/2/1/e2/lr0.003": {"final_val_loss": 4.25, "plans": [{"precisions": plan}]},
            "tiny/9/0.5/snip_gemm/0/2/1/e2/lr0.003": {"final_val_loss": 9.0, "plans": [{"precisions": plan}]}}
    (tmp_path / "quality.json").write_text(json.dumps({"runs": runs}))
    env = {**os.environ, "SNIP_BENCH_CACHE": str(tmp_path / "cache")}
    subprocess.run([sys.executable, str(ROOT / "bench" / "bench_forward_error.py"), "--phases", "2", "--batches", "2",
                    "--draws", "2", "--plans", str(tmp_path / "quality.json"), "--results", str(tmp_path)],
                   cwd=ROOT, check=True, capture_output=True, text=True, timeout=600, env=env)
    (phase,) = json.loads((tmp_path / "cpu-planner-forward-error.json").read_text())["phases"]
    assert phase["phase"] == 2 and [r["layer"] for r in phase["layers"]] == names
    assert all(r["ld"] >= 0 and r["ld_struct"] >= 0 and r["measured_se"] >= 0 for r in phase["layers"])
    assert [b["block"] for b in phase["blocks"]] == [0, 1, 2, 3]
    assert phase["sum_measured"] == pytest.approx(sum(r["measured"] for r in phase["layers"]))
    (row,) = phase["plans"]  # the other checkpoint's run is not this one's
    assert (row["method"], row["fp4_forward_gemms"], row["trained_gap"]) == ("snip_gemm", 2, 0.25)
    by_layer = {r["layer"]: r for r in phase["layers"]}
    assert row["ld"] == pytest.approx(sum(by_layer[n]["ld"] for n in fp4))


def test_paired_caches_never_train_beside_runs_of_other_numerics(tmp_path):
    swap = ("swap", "--phases", "2", "--steps", "2", "--eval-batches", "1", "--budgets", "0.5",
            "--raise", "layers.3.mlp.down_proj", "--lower", "layers.0.self_attn.q_proj")
    _bench(tmp_path, *swap, "--seeds", "0")
    cache = tmp_path / "cache" / "swap-2-0.5-2-e1.json"
    runs = json.loads(cache.read_text())
    assert set(runs["numerics"]) == {"tiny/2"}
    _bench(tmp_path, *swap, "--seeds", "0,1")  # the second process trains under the first's numerics
    runs = json.loads(cache.read_text())
    assert len(runs) == 1 + 2 * 9  # the record and bf16 + 8 variants per seed
    for record in ({"tiny/2": "another machine"}, None):  # a cache from elsewhere, one from before the record
        cache.write_text(json.dumps({k: v for k, v in runs.items() if k != "numerics"}
                                    | ({} if record is None else {"numerics": record})))
        out = _bench(tmp_path, *swap, "--seeds", "0,1,2", check=False)
        assert out.returncode != 0 and "SNIP_BENCH_CACHE" in out.stderr
        assert ("trained under numerics another machine" if record else "carry no record of the numerics") in out.stderr
        assert len(json.loads(cache.read_text())) == len(runs) - (record is None)  # nothing trained beside them
