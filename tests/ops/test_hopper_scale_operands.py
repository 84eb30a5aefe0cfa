"""Operands quantized straight into the Hopper scale layout (`scale_layout="hopper"`, the MN-major FP32
scales of the blockwise FP8 GEMMs): the same quantization as the plain layout with the scales moved by
`scale_layout.to_hopper`; the GEMM preparation hands those scales to the kernel as they are (no relayout
kernel per call); and a layer whose operands take that layout gives the plain layout's bits."""

import pytest
import torch

from snip_ops import gemm_kernels as gk
from snip_ops import linear
from snip_ops.formats import E2M1, E4M3, E5M2, QuantSpec, Rounding, ScaleKind
from snip_ops.qparts import from_parts, meta_parts, to_parts
from snip_ops.quantize import quantize, quantize_rowcol
from snip_ops.reference import QTensor, dequantize, plain_scales
from snip_ops.scale_layout import hopper_shape, to_hopper

SPECS = {
    "act": QuantSpec(E4M3, (1, 128)),
    "weight": QuantSpec(E4M3, (128, 128)),
    "grad": QuantSpec(E5M2, (1, 128), rounding=Rounding.SR),
    "fp4": QuantSpec(E2M1, (1, 128), rounding=Rounding.SR),
    "pow2": QuantSpec(E4M3, (1, 128), ScaleKind.POW2),
}
# Rows that are and are not multiples of 4 (padded columns) and of 128, K inside one block and past it.
SHAPES = [(1, 1), (7, 40), (129, 200), (300, 257)]


def _x(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * torch.logspace(-3, 3, shape[1])


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _hopper(q: QTensor) -> QTensor:
    return QTensor(q.codes, to_hopper(q.scales), q.spec, q.shape, q.tensor_scale, "hopper")


def test_to_hopper_places_every_scale_and_zero_pads():
    s = torch.arange(1, 5 * 3 + 1, dtype=torch.float32).reshape(5, 3)  # block (r, k) holds 3r + k + 1
    h = to_hopper(s)
    assert h.shape == hopper_shape(5, 3) == (3, 8) and h.is_contiguous()
    for r in range(5):
        for k in range(3):
            assert h[k, r] == 3 * r + k + 1
    assert torch.equal(h[:, 5:], torch.zeros(3, 3))


@pytest.mark.parametrize("kind", SPECS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("transpose", [False, True])
def test_hopper_layout_is_the_plain_quantization_permuted(kind, shape, transpose):
    spec = SPECS[kind]
    x = _x(shape)
    plain = quantize(x, spec, seed=3, offset=5, transpose=transpose)
    hop = quantize(x, spec, seed=3, offset=5, transpose=transpose, scale_layout="hopper")
    assert hop.scale_layout == "hopper" and plain.scale_layout == "plain"
    assert torch.equal(hop.codes.view(torch.uint8), plain.codes.view(torch.uint8))
    assert _same_bits(hop.scales, to_hopper(plain.scales))
    assert _same_bits(plain_scales(hop), plain.scales)
    assert torch.equal(dequantize(hop).view(torch.int32), dequantize(plain).view(torch.int32))


@pytest.mark.parametrize("kind", SPECS)
def test_rowcol_applies_the_layout_to_both_outputs(kind):
    spec = SPECS[kind]
    x = _x((130, 300), seed=1)
    row, col = quantize_rowcol(x, spec, seed=1, offset=2, offset_t=3, scale_layout="hopper")
    ref_row, ref_col = quantize_rowcol(x, spec, seed=1, offset=2, offset_t=3)
    for q, ref in ((row, ref_row), (col, ref_col)):
        assert q.scale_layout == "hopper"
        assert _same_bits(q.scales, to_hopper(ref.scales))


# (a, b) of fprop (x, w), dgrad (dy, w^T) and wgrad (dy^T, x^T); N = 8k + 3 pads b past its scale pitch
# with a BF16 output, which the preparation then relays out.
@pytest.mark.parametrize("a_kind, b_kind", [("act", "weight"), ("grad", "weight"), ("grad", "act"), ("fp4", "fp4")])
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (7, 16, 40), (129, 200, 300), (64, 11, 130)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_prepare_sm90_uses_quantizer_scales_as_they_are(a_kind, b_kind, m, n, k, out_dtype):
    a = quantize(_x((m, k), seed=2), SPECS[a_kind], seed=1)
    b = quantize(_x((n, k), seed=3), SPECS[b_kind], seed=1, offset=1)
    ha, hb = _hopper(a), _hopper(b)
    plain_args = gk.prepare_sm90(a, b, out_dtype)
    hop_args = gk.prepare_sm90(ha, hb, out_dtype)
    for p, h in zip(plain_args, hop_args):
        assert _same_bits(p, h) if isinstance(p, torch.Tensor) else p == h
    assert hop_args[1] is ha.scales  # no relayout, no copy
    br, n_pad = SPECS[b_kind].block[0], hop_args[5]
    pitch_fits = hopper_shape(-(-n // br), 1) == hopper_shape(-(-n_pad // br), 1)  # b's pitch covers padded N
    assert (hop_args[3] is hb.scales) == pitch_fits


@pytest.mark.parametrize("a_kind, b_kind", [("act", "weight"), ("grad", "act")])
def test_gemm_of_hopper_layout_operands_is_the_plain_gemm(a_kind, b_kind):
    a_plain = quantize(_x((33, 300), seed=4), SPECS[a_kind], seed=2)
    b_plain = quantize(_x((17, 300), seed=5), SPECS[b_kind], seed=2, offset=1)
    y = gk.qgemm(_hopper(a_plain), _hopper(b_plain), out_dtype=torch.float32)
    assert torch.equal(y, gk.qgemm(a_plain, b_plain, out_dtype=torch.float32))


@pytest.mark.parametrize("kind", SPECS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_parts_round_trip_and_meta_shapes(kind, shape):
    spec = SPECS[kind]
    q = quantize(_x(shape), spec, scale_layout="hopper")
    parts = to_parts(q)
    meta = meta_parts(spec, q.shape, torch.empty(0, device="meta"), "hopper")
    assert [(p.shape, p.dtype) for p in parts] == [(m.shape, m.dtype) for m in meta]
    back = from_parts(parts, spec, q.shape, "hopper")
    assert back.scale_layout == "hopper" and _same_bits(back.scales, q.scales)


def test_scale_layout_is_checked():
    x = _x((8, 128))
    with pytest.raises(ValueError, match="hopper scale layout holds"):
        quantize(x, QuantSpec(E4M3, (1, 32), ScaleKind.E8M0), scale_layout="hopper")
    with pytest.raises(ValueError, match="hopper scale layout holds"):
        quantize(x, QuantSpec(E4M3, (1, 32)), scale_layout="hopper")


def test_layout_is_hopper_where_the_blockwise_kernel_runs(monkeypatch):
    for spec in SPECS.values():
        assert gk.scale_layout_for(spec, "cpu") == "plain"
    monkeypatch.setattr(gk, "device_arch", lambda device: (9, 0))
    monkeypatch.setattr(gk._ext, "kernel_available", lambda op, device: True)
    for spec in SPECS.values():
        assert gk.scale_layout_for(spec, "cuda") == "hopper"
    for spec in (QuantSpec(E4M3, (1, 32), ScaleKind.E8M0), QuantSpec(E4M3, (16, 16)), QuantSpec(E4M3, (1, 16))):
        assert gk.scale_layout_for(spec, "cuda") == "plain"
    monkeypatch.setattr(gk._ext, "kernel_available", lambda op, device: op != "fp8_gemm_nt_blockwise")
    gk._ext.gate_changed()  # the kernels' availability changed: decisions kept before are dropped
    assert gk.scale_layout_for(SPECS["act"], "cuda") == "plain"


@pytest.mark.parametrize("precision", ["fp8", "fp8_e5m2grad", "fp4"])
def test_linear_with_hopper_layout_operands_gives_the_plain_bits(monkeypatch, precision):
    """The layer's whole kernel-mode path (fused row + column quantization, saved parts, fake shapes,
    the backward GEMMs) with every operand in the Hopper layout, against the same layer in the plain layout."""
    import importlib

    from snip_ops import _ext

    linear_module = importlib.import_module("snip_ops.linear")

    if not _ext.kernel_available("quantize", "cpu"):
        pytest.skip("the extension's CPU quantizer is not built")
    g = torch.Generator().manual_seed(0)
    x0, w0, dy = torch.randn(70, 256, generator=g), torch.randn(96, 256, generator=g), torch.randn(70, 96, generator=g)

    def run():
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        y = linear(x, w, precision=precision, seed=3, offset=7)
        y.backward(dy)
        return y.detach(), x.grad, w.grad

    plain = run()
    layouts = []

    def hopper_where_it_applies(spec, device):  # what scale_layout_for answers on an sm_90a GPU
        layouts.append("hopper" if gk._blockwise_spec(spec) else "plain")
        return layouts[-1]
    monkeypatch.setattr(linear_module, "scale_layout_for", hopper_where_it_applies)
    hop = run()
    assert "hopper" in layouts
    for p, h in zip(plain, hop):
        assert torch.equal(p.view(torch.int32), h.view(torch.int32))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", SPECS)
def test_cuda_quantizer_writes_the_hopper_layout(kind):
    from snip_ops import _ext

    if not _ext.kernel_available("quantize", "cuda"):
        pytest.skip("the quantize kernel is not usable on this machine")
    spec = SPECS[kind]
    x = _x((257, 300), seed=6)
    row, col = quantize_rowcol(x.cuda(), spec, seed=2, offset=4, offset_t=5, scale_layout="hopper")
    ref_row, ref_col = quantize_rowcol(x, spec, seed=2, offset=4, offset_t=5, scale_layout="hopper")
    for q, ref in ((row, ref_row), (col, ref_col)):
        assert torch.equal(q.codes.cpu().view(torch.uint8), ref.codes.view(torch.uint8))
        assert _same_bits(q.scales.cpu(), ref.scales)
