"""bench_host end to end in its CPU smoke setting, plain and on the stubbed sm_90 host path, its JSON checked;
and the stubbed path itself: the GEMMs take the sm_90 kernel paths, their launches never compute, and every
patch is undone afterwards. Outputs go to a temporary directory."""

import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from bench import bench_host
from module_exit import exit_message
from snip_ops import LinearPrecision, SnipLinear, _ext, autotune
from snip_ops import gemm_kernels as gk
import warm_python

ROOT = Path(__file__).resolve().parents[2]
needs_cpu_quantizer = pytest.mark.skipif(not _ext.kernel_available("quantize", "cpu"),
                                         reason="snip_ops._C not built (the sm_90 host path quantizes with its CPU op)")


def _run(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "host.json"
    warm_python.run([sys.executable, "-m", "bench.bench_host", "--smoke", *args, "--out", str(out)], cwd=ROOT,
                   check=True, capture_output=True, text=True, timeout=300)
    result = json.loads(out.read_text())
    assert result["device"] == "cpu (smoke run)" and result["shape"]["tokens"] == bench_host.TOKENS
    return result


def test_smoke(tmp_path):
    result = _run(tmp_path)
    assert [e["variant"] for e in result["entries"]] == ["bf16", *bench_host.PRECISIONS]
    assert result["entries"][0]["ratio_to_bf16"] == 1.0
    assert all(e["us_per_call"] > 0 and len(e["us_per_call_runs"]) == 1 for e in result["entries"])
    assert "ops_us_per_call" not in result["entries"][0]  # nn.Linear has no custom ops
    assert all(e["ops_us_per_call"] > 0 for e in result["entries"][1:])


@needs_cpu_quantizer
def test_sm90_host_path_smoke(tmp_path):
    result = _run(tmp_path, "--sm90-host-path")
    ran = {e["variant"]: e for e in result["entries"]}
    assert set(ran) == {"snip_fp8", "snip_fp4", "snip_fp8_fwd_fp4_bwd"}
    assert [s["variant"] for s in result["skipped"]] == ["snip_nvfp4_train"]  # Blackwell's GEMMs
    assert set(ran["snip_fp8"]["paths"].values()) == {"sm90_fp8"}
    assert set(ran["snip_fp4"]["paths"].values()) == {"sm90_fp4"}
    for e in ran.values():
        for prefix in ("", "ops_"):
            assert 0 < e[f"{prefix}cpu_kernels_us_per_call"] < e[f"{prefix}us_per_call"]
            assert e[f"{prefix}host_us_per_call"] == pytest.approx(e[f"{prefix}us_per_call"]
                                                                   - e[f"{prefix}cpu_kernels_us_per_call"])


@needs_cpu_quantizer
@pytest.mark.parametrize("precision", ["fp8", "fp4", LinearPrecision(fprop="fp8", dgrad="bf16", wgrad="fp4")])
def test_the_ops_alone_compute_what_the_layer_does(precision):
    """ops_fwd_bwd calls the layer's custom ops with the layer's arguments: the same bits as its backward."""
    lin = nn.Linear(128, 64, bias=False, dtype=torch.bfloat16)
    layer = SnipLinear.from_linear(lin, LinearPrecision.of(precision), seed=3)
    x = torch.randn(16, 128, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(16, 64, dtype=torch.bfloat16)
    layer(x).backward(dy)  # offset 0, the one the ops alone use
    dx, dw = bench_host.ops_fwd_bwd(layer, x, dy)()
    assert torch.equal(dx, x.grad) and torch.equal(dw, layer.weight.grad)


@needs_cpu_quantizer
def test_sm90_host_path_stubs_the_gemms_and_restores_everything():
    saved = (gk.device_arch, _ext.kernel_available, autotune.device_name, torch.ops.snip_C)
    layer = SnipLinear.from_linear(nn.Linear(128, 64, bias=False, dtype=torch.bfloat16), LinearPrecision("fp8"))
    x = torch.randn(16, 128, dtype=torch.bfloat16, requires_grad=True)
    with bench_host.sm90_host_path() as ops:
        y = layer(x)
        y.backward(torch.ones_like(y))
        assert gk.device_arch("cpu") == (9, 0) and ops.kernel_seconds > 0
        assert gk.select_path(*_operands()).path == "sm90_fp8"
    assert y.shape == (16, 64) and x.grad.shape == (16, 128) and layer.weight.grad.shape == (64, 128)
    assert (gk.device_arch, _ext.kernel_available, autotune.device_name, torch.ops.snip_C) == saved
    assert gk.device_arch("cpu") is None


def _operands():
    from snip_ops.formats import recipe
    from snip_ops.quantize import quantize

    r = recipe("fp8")
    return (quantize(torch.randn(16, 128), r.act, scale_layout="hopper"),
            quantize(torch.randn(64, 128), r.weight, scale_layout="hopper"))


def test_smoke_needs_out():
    assert "--smoke needs --out" in exit_message("bench.bench_host", "--smoke")
