"""Operands quantized straight into the Blackwell scale layout (`scale_layout="blackwell"`): the
same quantization as the plain layout, scales moved by `scale_layout.to_blackwell`, and the sm100
GEMM preparation hands those scales to the kernel as they are -- no relayout per call."""

import pytest
import torch

from snip_ops import gemm_kernels as gk
from snip_ops.quantize import quantize, quantize_rowcol
from snip_ops.formats import E2M1, E4M3, QuantSpec, Rounding, ScaleKind
from snip_ops.qparts import from_parts, meta_parts, to_parts
from snip_ops.reference import QTensor, dequantize, plain_scales
from snip_ops.scale_layout import to_blackwell

SPECS = {
    "nvfp4": QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, Rounding.SR),
    "mxfp4": QuantSpec(E2M1, (1, 32), ScaleKind.E8M0),
    "mxfp8": QuantSpec(E4M3, (1, 32), ScaleKind.E8M0),
}
SHAPES = [(1, 1), (7, 40), (129, 200), (300, 64)]


def _x(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * torch.logspace(-3, 3, shape[1])


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("kind", SPECS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("transpose", [False, True])
def test_blackwell_layout_is_the_plain_quantization_permuted(kind, shape, transpose):
    spec = SPECS[kind]
    x = _x(shape)
    plain = quantize(x, spec, seed=3, offset=5, transpose=transpose)
    bw = quantize(x, spec, seed=3, offset=5, transpose=transpose, scale_layout="blackwell")
    assert bw.scale_layout == "blackwell" and plain.scale_layout == "plain"
    assert torch.equal(bw.codes.view(torch.uint8), plain.codes.view(torch.uint8))
    assert _same_bits(bw.scales, to_blackwell(plain.scales))
    assert _same_bits(plain_scales(bw), plain.scales)
    assert torch.equal(dequantize(bw).view(torch.int32), dequantize(plain).view(torch.int32))


@pytest.mark.parametrize("kind", SPECS)
def test_rowcol_applies_the_layout_to_both_outputs(kind):
    spec = SPECS[kind]
    x = _x((130, 96), seed=1)
    row, col = quantize_rowcol(x, spec, seed=1, offset=2, offset_t=3, scale_layout="blackwell")
    ref_row, ref_col = quantize_rowcol(x, spec, seed=1, offset=2, offset_t=3)
    for q, ref in ((row, ref_row), (col, ref_col)):
        assert q.scale_layout == "blackwell"
        assert _same_bits(q.scales, to_blackwell(ref.scales))


@pytest.mark.parametrize("kind", SPECS)
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (7, 13, 40), (129, 200, 96), (64, 8, 300)])
def test_prepare_sm100_uses_quantizer_scales_as_they_are(kind, m, n, k):
    spec = SPECS[kind]
    xa, xb = _x((m, k), seed=2), _x((n, k), seed=3)
    a, b = quantize(xa, spec, seed=1), quantize(xb, spec, seed=1, offset=1)
    a_bw, b_bw = (QTensor(q.codes, to_blackwell(q.scales), q.spec, q.shape, q.tensor_scale, "blackwell") for q in (a, b))
    plain_args = gk.prepare_sm100(kind, a, b)
    bw_args = gk.prepare_sm100(kind, a_bw, b_bw)
    for p, w in zip(plain_args[:4], bw_args[:4]):
        assert _same_bits(p, w)
    assert bw_args[1] is a_bw.scales and bw_args[3] is b_bw.scales  # no relayout, no copy
    assert bw_args[5] == plain_args[5]


@pytest.mark.parametrize("kind", SPECS)
def test_gemm_of_blackwell_layout_operands_is_the_plain_gemm(kind):
    spec = SPECS[kind]
    a = quantize(_x((33, 96), seed=4), spec, scale_layout="blackwell")
    b = quantize(_x((17, 96), seed=5), spec, offset=1, scale_layout="blackwell")
    a_plain = quantize(_x((33, 96), seed=4), spec)
    b_plain = quantize(_x((17, 96), seed=5), spec, offset=1)
    y = gk.qgemm(a, b, out_dtype=torch.float32)
    assert torch.equal(y, gk.qgemm(a_plain, b_plain, out_dtype=torch.float32))


@pytest.mark.parametrize("kind", SPECS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_parts_round_trip_and_meta_shapes(kind, shape):
    spec = SPECS[kind]
    q = quantize(_x(shape), spec, scale_layout="blackwell")
    parts = to_parts(q)
    meta = meta_parts(spec, q.shape, torch.empty(0, device="meta"), "blackwell")
    assert [(p.shape, p.dtype) for p in parts] == [(m.shape, m.dtype) for m in meta]
    back = from_parts(parts, spec, q.shape, "blackwell")
    assert back.scale_layout == "blackwell" and _same_bits(back.scales, q.scales)


def test_scale_layout_is_checked():
    x = _x((8, 128))
    with pytest.raises(ValueError, match="blackwell scale layout holds"):
        quantize(x, QuantSpec(E4M3, (1, 128), ScaleKind.FP32), scale_layout="blackwell")
    with pytest.raises(ValueError, match="blackwell scale layout holds"):
        quantize(x, QuantSpec(E4M3, (16, 16), ScaleKind.E8M0), scale_layout="blackwell")
    with pytest.raises(ValueError, match="scale_layout must be one of"):
        quantize(x, SPECS["mxfp8"], scale_layout="row-major")
    q = quantize(x, SPECS["mxfp8"])
    with pytest.raises(ValueError, match="scale_layout must be one of"):
        QTensor(q.codes, q.scales, q.spec, q.shape, None, "tiled")


def test_layout_is_plain_off_blackwell():
    for spec in SPECS.values():
        assert gk.scale_layout_for(spec, "cpu") == "plain"
    assert gk.scale_layout_for(QuantSpec(E4M3, (1, 128), ScaleKind.FP32), "cpu") == "plain"


def test_layout_is_blackwell_where_the_sm100_kernel_runs(monkeypatch):
    monkeypatch.setattr(gk, "device_arch", lambda device: (10, 0))
    monkeypatch.setattr(gk._ext, "kernel_available", lambda op, device: True)
    for spec in SPECS.values():
        assert gk.scale_layout_for(spec, "cuda") == "blackwell"
    # sm_100a's blockwise FP8 kernel reads the Hopper layout (tests/ops/test_hopper_scale_operands.py)
    assert gk.scale_layout_for(QuantSpec(E4M3, (1, 128), ScaleKind.FP32), "cuda") == "hopper"
    assert gk.scale_layout_for(QuantSpec(E2M1, (1, 32), ScaleKind.NVFP4), "cuda") == "plain"
    monkeypatch.setattr(gk._ext, "kernel_available", lambda op, device: op != "mxfp8_gemm_nt")
    gk._ext.gate_changed()  # the kernels' availability changed: decisions kept before are dropped
    assert gk.scale_layout_for(SPECS["mxfp8"], "cuda") == "plain"


@pytest.mark.gpu
@pytest.mark.parametrize("kind", SPECS)
def test_cuda_quantizer_writes_the_blackwell_layout(kind):
    from snip_ops import _ext

    if not _ext.kernel_available("quantize", "cuda"):
        pytest.skip("the quantize kernel is not usable on this machine")
    spec = SPECS[kind]
    x = _x((257, 200), seed=6)
    row, col = quantize_rowcol(x.cuda(), spec, seed=2, offset=4, offset_t=5, scale_layout="blackwell")
    ref_row, ref_col = quantize_rowcol(x, spec, seed=2, offset=4, offset_t=5, scale_layout="blackwell")
    for q, ref in ((row, ref_row), (col, ref_col)):
        assert torch.equal(q.codes.cpu().view(torch.uint8), ref.codes.view(torch.uint8))
        assert _same_bits(q.scales.cpu(), ref.scales)
        if ref.tensor_scale is not None:
            assert torch.equal(q.tensor_scale.cpu(), ref.tensor_scale)
