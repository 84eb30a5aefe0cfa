"""The GPU kernel benchmarks (bench_gemm, bench_quant, bench_optim gpu) end to end in their --smoke
setting: seconds on the CPU, through the same code as a GPU run except the kernel launches, so that
none of them rots unseen between GPU runs. Their output goes to a temporary directory."""

import json
import sys
from pathlib import Path

import pytest
import torch

from module_exit import exit_message
from snip_ops import _ext
import warm_python

ROOT = Path(__file__).resolve().parents[2]
needs_cpu_kernels = pytest.mark.skipif(not _ext.kernel_available("quantize", "cpu"),
                                       reason="snip_ops._C not built (its CPU implementations run the smoke)")


def _smoke(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "result.json"
    warm_python.run([sys.executable, *args, "--smoke", "--out", str(out)], cwd=ROOT, check=True,
                   capture_output=True, text=True, timeout=300)
    result = json.loads(out.read_text())
    assert result["device"] == "cpu (smoke run)"
    return result


def test_bench_gemm_smoke(tmp_path):
    result = _smoke(tmp_path, "-m", "bench.bench_gemm")
    assert {(e["gemm"], e["format"]) for e in result["entries"]} == {(g, "bf16") for g in ("fprop", "dgrad", "wgrad")}
    timed = {(b["gemm"], b["format"]) for b in result["baselines"]}
    assert {(g, f) for g in ("fprop", "dgrad", "wgrad") for f in ("scaled_mm_rowwise", "scaled_mm_tensorwise")} <= timed
    assert result["targets"] == []  # no snip kernel ran: no verdict


def test_gemm_targets_set_the_bf16_output_wgrad_beside_scaled_mm():
    # The layer's wgrad for BF16 weights writes BF16, as _scaled_mm does: that pair is reported apart from
    # the FP32-output kernel's row.
    from bench.bench_gemm import targets

    row = dict(shape="llama_N4096_K4096", gemm="wgrad")
    entries = [dict(row, format="fp8", ms=2.0), dict(row, format="bf16", ms=3.0)]
    baselines = [dict(row, format="fp8_wgrad_bf16", ms=1.6), dict(row, format="scaled_mm_rowwise", ms=2.0)]
    (t,) = targets(entries, baselines)
    assert (t["fp8_ms"], t["vs_scaled_mm_rowwise"], t["bf16_out_ms"]) == (2.0, 1.0, 1.6)
    assert t["bf16_out_vs_scaled_mm_rowwise"] == 1.25
    (t,) = targets(entries, baselines[1:])  # an FP32-only run (Blackwell, or E5M2) has no such fields
    assert "bf16_out_ms" not in t


@needs_cpu_kernels
def test_bench_quant_smoke(tmp_path):
    result = _smoke(tmp_path, "-m", "bench.bench_quant")
    assert len(result["entries"]) == 13 and all(e["pass"] is None and e["time_s"] > 0 for e in result["entries"])


@needs_cpu_kernels
def test_bench_optim_gpu_smoke(tmp_path):
    result = _smoke(tmp_path, "-m", "bench.bench_optim", "gpu")
    assert [e["name"] for e in result["entries"]][1:] == [
        "snip AdamW bf16 SR, float32 moments", "snip AdamW bf16 SR, bfloat16 moments",
        "torch.optim.AdamW(fused=True) on FP32 master + BF16 copy"]


@pytest.mark.parametrize("args", [["bench.bench_gemm"], ["bench.bench_quant"], ["bench.bench_optim", "gpu"]])
def test_smoke_needs_out_and_plain_run_needs_a_gpu(args):
    assert "--smoke needs --out" in exit_message(*args, "--smoke")
    if not torch.cuda.is_available():
        assert "needs a CUDA GPU" in exit_message(*args)
