"""snip_ops.gemm_timing: a linear layer's GEMMs timed with their operands' quantization (CPU, a stand-in timer)."""

import json

import pytest
import torch

from planner.cost import LayerShape, MeasuredCost
from snip_ops import gemm_timing
from snip_ops.formats import GEMMS, gemm_dims
from snip_ops.quantize import dequantize


class CountingTimer:
    """Runs each call once and answers 1, 2, 3, ... ms in call order (never a wall clock)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, fn):
        fn()
        self.calls += 1
        return float(self.calls)


@pytest.mark.parametrize("gemm_name", GEMMS)
@pytest.mark.parametrize("precision", ["fp8", "fp4", "nvfp4"])
def test_operands_are_the_layers(gemm_name, precision):
    # The quantized operands multiply to the layer's own GEMM of the dequantized sources: a [m, k], b [n, k].
    m, n, k = 40, 24, 256
    a_src, b_src = gemm_timing.layer_gemm_inputs(gemm_name, m, n, k, "cpu", torch.float32)
    a, b = gemm_timing.quantize_for_gemm(gemm_name, precision, a_src, b_src)
    assert tuple(a.shape) == (m, k) and tuple(b.shape) == (n, k)
    source = {"fprop": (a_src, b_src.t()), "dgrad": (a_src, b_src), "wgrad": (a_src.t(), b_src)}[gemm_name]
    exact = source[0].double() @ source[1].double()
    got = dequantize(a).double() @ dequantize(b).double().t()
    assert (got - exact).norm() <= 0.25 * exact.norm()  # quantized, not another product


def test_measure_times_quantization_and_gemm_apart():
    timer = CountingTimer()
    table = gemm_timing.measure([(64, 48, 128), (64, 48, 128), (64, 128, 48)], ["bf16", "fp8"], "cpu", timer)
    rows = table["entries"]
    # (64, 48, 128) and (64, 128, 48) share no GEMM shape; the repeated layer is measured once
    assert len(rows) == 2 * 3 * 2
    assert len({(r["m"], r["n"], r["k"], r["gemm"], r["format"]) for r in rows}) == len(rows)
    for r in rows:
        assert r["time"] == pytest.approx((r["quantize_ms"] + r["gemm_ms"]) * 1e-3)
        if r["format"] == "bf16":
            assert r["quantize_ms"] == 0.0 and r["path"] == "bf16"
        else:
            assert r["quantize_ms"] > 0 and r["path"] == "fp32"  # the CPU's qgemm path
    assert timer.calls == sum(1 if r["format"] == "bf16" else 2 for r in rows)
    cost = MeasuredCost.from_json(table)
    layer = LayerShape("l", in_features=128, out_features=48, tokens=64)
    for r in rows:
        if (r["m"], r["n"], r["k"]) == gemm_dims(r["gemm"], 64, 48, 128):
            assert cost.gemm_cost(layer, r["gemm"], r["format"]) == r["time"]
    with pytest.raises(ValueError, match="does not quantize all three operands"):
        gemm_timing.quantize_for_gemm("fprop", "bf16", *gemm_timing.layer_gemm_inputs("fprop", 8, 8, 16, "cpu"))
    with pytest.raises(ValueError, match="unknown GEMM"):
        gemm_dims("xgrad", 1, 2, 3)
