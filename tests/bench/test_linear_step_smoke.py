"""bench_linear and bench_step end to end in their CPU smoke settings (seconds: tiny shapes, the tiny
preset, one or two calls each), their JSON checked field by field; and the fixed 75% FP4 plan that
bench_step times, on the 1b preset's shapes. Outputs go to a temporary directory."""

import json
import sys
from pathlib import Path

import pytest
import torch

from bench.bench_step import fixed_plan, linear_shapes
from module_exit import exit_message
from snip_train.model import Llama
import warm_python

ROOT = Path(__file__).resolve().parents[2]
PROVENANCE = {"date", "commit", "command", "platform", "cpus", "torch"}


def _smoke(tmp_path: Path, module: str, *flags: str) -> dict:
    out = tmp_path / f"{module}.json"
    warm_python.run([sys.executable, "-m", f"bench.{module}", "--smoke", *flags, "--out", str(out)], cwd=ROOT,
                    check=True, capture_output=True, text=True, timeout=300)
    result = json.loads(out.read_text())
    assert result["device"] == "cpu (smoke run)" and PROVENANCE <= set(result)
    assert result["command"] == " ".join([f"python -m bench.{module} --smoke", *flags, f"--out {out}"])
    return result


def _torchao_expected(result: dict) -> set[str]:
    if result["torchao"].startswith("not importable"):
        return set()
    return {"torchao_rowwise", "torchao_tensorwise"}


def test_linear_smoke(tmp_path):
    result = _smoke(tmp_path, "bench_linear", "--profile")
    assert result["tokens"] == 256 and result["capability"] is None
    layers = {(e["model"], e["layer"]) for e in result["entries"]}
    assert layers == {("smoke", n) for n in ("q_proj/o_proj", "k_proj/v_proj", "gate_proj/up_proj", "down_proj")}
    ran_or_skipped = {e["variant"] for e in result["entries"]} | {s["variant"] for s in result["skipped"]}
    assert ran_or_skipped == {"bf16", "snip_fp8", "snip_fp8_fused_wgrad", "snip_fp8_reused_weight", "snip_fp4",
                              "snip_fp8_fwd_fp4_bwd"} | \
        _torchao_expected(result)
    assert not [s for s in result["skipped"] if s["variant"].startswith("snip") or s["variant"] == "bf16"]
    for e in result["entries"]:
        assert e["time_s"] > 0 and e["tflops"] > 0 and e["finite"] and e["tokens"] == 256
        assert e["speedup_vs_bf16"] > 0
        if e["variant"] == "bf16":
            assert e["speedup_vs_bf16"] == 1.0
        if e["variant"].startswith("snip"):
            assert e["paths"] == {"fprop": "fp32", "dgrad": "fp32", "wgrad": "fp32"}  # the CPU's GEMM path
        # --profile: the baseline's and FP8's host time per call; no CUDA kernels on the CPU
        if e["variant"] in ("bf16", "snip_fp8"):
            assert e["profile"]["calls"] == 3 and e["profile"]["host_us_per_call"] > 0
            assert e["profile"]["kernels"] == [] and e["profile"]["device_us_per_call"] == 0
        else:
            assert "profile" not in e


def test_step_smoke(tmp_path):
    result = _smoke(tmp_path, "bench_step")
    assert result["complete"] and result["failed"] == []
    assert (result["preset"], result["batch_size"], result["seq_len"], result["tokens_per_step"]) == ("tiny", 2, 32, 64)
    variants = {"bf16", "fp8", "snip_75"} | _torchao_expected(result)
    assert {(r["variant"], r["compiled"]) for r in result["runs"]} == {(v, c) for v in variants for c in (False, True)}
    for r in result["runs"]:
        assert r["peak_memory_bytes"] is None and r["finite"] and len(r["step_s"]) == 2 and len(r["losses"]) == 3
        assert r["tokens_per_s"] > 0 and r["speedup_vs_bf16_same_compile"] > 0 and r["speedup_vs_bf16_eager"] > 0
        assert r["compile_backend"] == ("aot_eager" if r["compiled"] else None)
    # every block compiled once: a snip layer's seed (one per layer) is no constant of the compiled code
    graphs = {r["variant"]: r["compiled_graphs"] for r in result["runs"] if r["compiled"]}
    assert graphs["fp8"] == graphs["snip_75"] == graphs["bf16"] and graphs["bf16"] >= 1
    plan = result["snip_75_plan"]
    assert plan["format"] == "snip-plan/1" and 0.75 <= plan["metrics"]["fp4_fraction"] < 0.8
    assert len(plan["plan"]) == 4 * 7  # every projection of the 4 blocks, not lm_head


def test_fixed_plan_on_the_1b_shapes():
    with torch.device("meta"):
        shapes = linear_shapes(Llama("1b"), tokens=8192)
    plan = fixed_plan(shapes)
    # gate_proj's forward GEMM is 16 of a block's 58 forward units: with every backward GEMM FP4,
    # 2/3 + 16 / (3 * 58) of the FLOPs
    assert plan.metrics["fp4_fraction"] == pytest.approx(2 / 3 + 16 / 174)
    fp4_forward = {n.rsplit(".", 1)[-1] for n, p in plan.precisions.items() if p.fprop.name == "fp4"}
    assert fp4_forward == {"gate_proj"} and len(plan.precisions) == 16 * 7
    assert all(p.dgrad.name == p.wgrad.name == "fp4" for p in plan.precisions.values())
    assert len({id(p) for p in plan.precisions.values()}) == 2  # shared objects: one compiled graph per block


@pytest.mark.parametrize("module", ["bench_linear", "bench_step"])
def test_smoke_needs_out(module):
    assert "--smoke needs --out" in exit_message(f"bench.{module}", "--smoke")
