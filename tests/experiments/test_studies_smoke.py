"""The planner-quality studies other than the grid end to end in seconds-long settings (a 2-step checkpoint, a
handful of steps, layers and seeds), their caches and results in temporary directories."""

import json
import os
from subprocess import CompletedProcess
import sys
from pathlib import Path

import pytest

from experiments.results import write_runs
from snip_ops import SnipLinear, convert
from snip_train.model import Llama
import warm_python

ROOT = Path(__file__).resolve().parents[2]


def _study(tmp_path: Path, study: str, *args: str, check: bool = True) -> CompletedProcess:
    env = {**os.environ, "SNIP_BENCH_CACHE": str(tmp_path / "cache")}
    return warm_python.run([sys.executable, "-m", f"experiments.{study}", *args, "--results", str(tmp_path)],
                          cwd=ROOT, check=check, capture_output=True, text=True, timeout=600, env=env)


def _result(tmp_path: Path, name: str) -> dict:
    return json.loads((tmp_path / f"cpu-planner-{name}.json").read_text())


def test_validity(tmp_path):
    _study(tmp_path, "validity", "--pre-steps", "2", "--steps", "1", "--seeds", "0,1", "--layers", "3")
    out = _result(tmp_path, "validity")
    assert len(out["layers"]) == 3 and set(out["reliability"]) >= {"backward_trained", "trained", "forward_only_sr"}
    assert set(out["estimators"]) == {f"{m}_draws{d}" for m in ("fisher", "batched") for d in (1, 2, 8)}
    assert all(e["layers_with_curvature_<=_0"] == 0 for k, e in out["estimators"].items() if k.startswith("fisher"))


def test_wgrad_error(tmp_path):
    _study(tmp_path, "wgrad_error", "--phases", "2", "--seeds", "0,1")
    (row,) = _result(tmp_path, "wgrad-error")["rows"]
    assert row["phase"] == 2 and row["sampled_rows"] == 128 and row["tokens"] == 1024
    assert all(0 < row[k]["min"] <= row[k]["median"] <= row[k]["max"] for k in ("own", "scaled"))


def test_scale(tmp_path):
    _study(tmp_path, "scale", "--phases", "2", "--steps", "2", "--seeds", "0,1", "--eval-batches", "1", "--amplify", "1,2",
           "--gemms", "fprop,dgrad,wgrad,fprop_train")
    out = _result(tmp_path, "scale")
    assert [(r["phase"], r["gemm"], r["amplify"]) for r in out["rows"]] == [
        (2, g, k) for g in ("fprop", "dgrad", "wgrad", "fprop_train") for k in (1.0, 2.0)]
    fprop, trained_only = out["rows"][:2], out["rows"][6:]  # priced alike (LD); measured apart
    assert [r["predicted"] for r in fprop] == [r["predicted"] for r in trained_only]
    assert all(a["gaps"] != b["gaps"] for a, b in zip(fprop, trained_only))
    assert all(r["predicted"] > 0 and len(r["gaps"]) == 2 for r in out["rows"])
    assert all((r["signal_share"] is not None) == (r["gemm"] == "wgrad") for r in out["rows"])
    for unit, twice in zip(out["rows"][::2], out["rows"][1::2]):  # the prediction is quadratic in the factor
        assert twice["predicted"] == pytest.approx(4 * unit["predicted"]) and "exponent" in twice
    assert set(json.loads((tmp_path / "cache" / "scale-2.json").read_text())["numerics"]) == {"tiny/2"}


def test_scale_per_block(tmp_path):
    _study(tmp_path, "scale", "--phases", "2", "--steps", "2", "--seeds", "0", "--eval-batches", "1", "--amplify", "2",
           "--gemms", "fprop_train,wgrad", "--blocks", "0,3", "--name", "scale-blocks")
    out = _result(tmp_path, "scale-blocks")
    assert [(r["gemm"], r["block"]) for r in out["rows"]] == [(g, b) for g in ("fprop_train", "wgrad") for b in (0, 3)]
    assert all(r["predicted"] > 0 for r in out["rows"]) and "| block |" in (tmp_path / "cpu-planner-scale-blocks.md").read_text()


def test_horizon(tmp_path):
    _study(tmp_path, "horizon", "--phases", "2", "--budgets", "0.5,0.8", "--interval", "3")
    out = _result(tmp_path, "horizon")
    (row,) = out["rows"]
    assert row["phase"] == 2 and out["interval"] == 3
    assert all(-1 <= row[f"spearman_{k}"] <= 1 and row[f"median_ratio_{k}"] > 0 for k in ("s_wgrad", "s_dgrad"))
    assert all(0 <= row[f"same_gemms_at_{b}"] <= 1 for b in (0.5, 0.8))


def test_staleness(tmp_path):
    _study(tmp_path, "staleness", "--phases", "2", "--offsets", "0,1", "--budgets", "0.5", "--interval", "2")
    out = _result(tmp_path, "staleness")
    assert [(r["phase"], r["offset"]) for r in out["rows"]] == [(2, 0), (2, 1)]
    assert all(r["regret_at_0.5"] >= -1e-9 and set(r["ld_growth_per_block"]) == {"0", "1", "2", "3"} for r in out["rows"])


def test_schedule(tmp_path):
    _study(tmp_path, "schedule", "--phase", "2", "--steps", "6", "--interval", "2", "--seeds", "0",
           "--budgets", "0.9,0.5,0.7")
    out = _result(tmp_path, "schedule")
    assert set(out["table"]) == {"bf16", "snip", "snip_schedule"} and "runs" not in out
    whys = [why for step, why, share in out["table"]["snip_schedule"]["replans"][0]]
    assert ["lr_decay"] in whys or ["interval", "lr_decay"] in whys  # the decay starts in the second half
    assert out["table"]["snip"]["mean_fp4_share"] >= 0.7
    assert (tmp_path / "cpu-planner-schedule.runs.json.xz").exists()


SWAP = ("--phase", "2", "--steps", "2", "--eval-batches", "1", "--budget", "0.5",
        "--raise", "layers.3.mlp.down_proj", "--lower", "layers.0.self_attn.q_proj")


def test_swap_and_its_cache_never_training_beside_runs_of_other_numerics(tmp_path):
    _study(tmp_path, "swap", *SWAP, "--seeds", "0")
    cache = tmp_path / "cache" / "swap-2-0.5-2-e1.json"
    assert set(json.loads(cache.read_text())["numerics"]) == {"tiny/2"}
    _study(tmp_path, "swap", *SWAP, "--seeds", "0,1")  # the second process trains under the first's numerics
    out = _result(tmp_path, "swap")
    assert set(out["table"]) == {"snip", "raised", "lowered", "swapped", "raised_fprop", "raised_bwd", "lowered_fprop",
                                 "lowered_bwd"}
    plans, table = out["plans"], out["table"]
    q, down = "model.layers.0.self_attn.q_proj", "model.layers.3.mlp.down_proj"
    assert plans["swapped"][down] == "fp8" and plans["swapped"][q] == "fp4"
    assert plans["lowered_fprop"][q] == {"fprop": "fp4", "dgrad": plans["snip"][q], "wgrad": plans["snip"][q]}
    assert plans["raised_bwd"][down] == {"fprop": plans["snip"][down], "dgrad": "fp8", "wgrad": "fp8"}
    # the split moves' predicted costs add up to the whole move's (the objective is a sum over GEMMs)
    for move in ("raised", "lowered"):
        parts = table[f"{move}_fprop"]["objective"] + table[f"{move}_bwd"]["objective"] - table["snip"]["objective"]
        assert abs(parts - table[move]["objective"]) <= 1e-9 * abs(table[move]["objective"])
    assert all("trained_vs_snip" in r for label, r in table.items() if label != "snip")
    assert table["raised"]["fp4_share"] <= table["snip"]["fp4_share"] <= table["lowered"]["fp4_share"]
    assert all(len(r["gap_per_seed"]) == 2 for r in table.values())
    runs = json.loads(cache.read_text())
    assert len(runs) == 1 + 2 * 9  # the record and bf16 + 8 variants per seed
    for record in ({"tiny/2": "another machine"}, None):  # a cache from elsewhere, one from before the record
        cache.write_text(json.dumps({k: v for k, v in runs.items() if k != "numerics"}
                                    | ({} if record is None else {"numerics": record})))
        out = _study(tmp_path, "swap", *SWAP, "--seeds", "0,1,2", check=False)
        assert out.returncode != 0 and "SNIP_BENCH_CACHE" in out.stderr
        assert ("trained under numerics another machine" if record else "carry no record of the numerics") in out.stderr
        assert len(json.loads(cache.read_text())) == len(runs) - (record is None)  # nothing trained beside them


def test_forward_error(tmp_path):
    names = [n for n, m in convert(Llama("tiny")).named_modules() if isinstance(m, SnipLinear)]
    fp4 = {"model.layers.0.mlp.up_proj", "model.layers.3.self_attn.q_proj"}
    plan = {n: {"fprop": "fp4" if n in fp4 else "fp8", "dgrad": "fp4", "wgrad": "fp4"} for n in names}
    summary = tmp_path / "cpu-planner-quality-x.json"
    summary.write_text("{}")
    write_runs(summary, {"tiny/2/-/bf16/0/2/1/e2/lr0.003": {"final_val_loss": 4.0, "plans": []},
                         "tiny/2/0.5/snip_gemm/0/2/1/e2/lr0.003": {"final_val_loss": 4.25, "plans": [{"precisions": plan}]},
                         "tiny/9/0.5/snip_gemm/0/2/1/e2/lr0.003": {"final_val_loss": 9.0, "plans": [{"precisions": plan}]}})
    _study(tmp_path, "forward_error", "--phases", "2", "--batches", "2", "--draws", "2", "--plans", str(summary))
    (phase,) = _result(tmp_path, "forward-error")["phases"]
    assert phase["phase"] == 2 and [r["layer"] for r in phase["layers"]] == names
    assert all(r["ld"] >= 0 and r["ld_struct"] >= 0 and r["measured_se"] >= 0 for r in phase["layers"])
    assert [b["block"] for b in phase["blocks"]] == [0, 1, 2, 3]
    assert phase["sum_measured"] == pytest.approx(sum(r["measured"] for r in phase["layers"]))
    (row,) = phase["plans"]  # the other checkpoint's run is not this one's
    assert (row["method"], row["fp4_forward_gemms"], row["trained_gap"]) == ("snip_gemm", 2, 0.25)
    by_layer = {r["layer"]: r for r in phase["layers"]}
    assert row["ld"] == pytest.approx(sum(by_layer[n]["ld"] for n in fp4))
