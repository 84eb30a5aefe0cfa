"""The low-precision GEMMs' host side, on the CPU (no GPU needed): path selection by device
capability, operand conversions (E2M1 -> E4M3 re-encoding, MN-major Hopper scales, Blackwell blocked
scales, padding), the C++ ops' argument checks and Meta functions, the tile heuristic, the fallback
paths' numerics, and the SASS of the built kernels (QGMMA on sm_90a, UTC*MMA on sm_100a)."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bounds import assert_within_gemm_bound
from snip_ops import _ext, gemm, gemm_kernels as gk, reference
from snip_ops.cast import decode
from snip_ops.formats import E2M1, E4M3, QuantSpec, recipe
from snip_ops.reference import dequantize, quantize

SM90_OP = "fp8_gemm_nt_blockwise"
SM100_OPS = ("nvfp4_gemm_nt", "mxfp4_gemm_nt", "mxfp8_gemm_nt")


def _has(op: str) -> bool:
    return _ext.HAS_KERNELS and op in _ext.kernels()


needs_sm90_op = pytest.mark.skipif(not _has(SM90_OP), reason="extension built without the sm_90a GEMM")
needs_sm100_ops = pytest.mark.skipif(not all(_has(o) for o in SM100_OPS), reason="extension built without the sm_100a GEMMs")


def _operands(name: str, m: int, n: int, k: int, gemm_kind: str = "fprop", seed: int = 0):
    """(a, b) QTensors of one of a linear layer's GEMMs under recipe `name` (DESIGN.md §3)."""
    g = torch.Generator().manual_seed(seed)
    r = recipe(name)
    if gemm_kind == "fprop":  # x [m, k], w [n, k]
        return quantize(torch.randn(m, k, generator=g), r.act), quantize(torch.randn(n, k, generator=g), r.weight)
    if gemm_kind == "dgrad":  # dy [m, k(=N)], w [k, n(=K)] -> b = w^T
        dy, w = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
        wq = quantize(w, r.weight)
        b = wq.t() if r.weight.block[0] == r.weight.block[1] else quantize(w, r.weight, transpose=True)
        return quantize(dy, r.grad), b
    dy, x = torch.randn(k, m, generator=g), torch.randn(k, n, generator=g)  # wgrad: a = dy^T, b = x^T
    return quantize(dy, r.grad, transpose=True), quantize(x, r.act, transpose=True)


# ---- path selection -----------------------------------------------------------------------------


def test_paths_on_cpu_are_the_reference():
    a, b = _operands("fp8", 16, 24, 256)
    choice = gk.select_path(a, b)
    assert choice.path == "fp32"
    assert "sm_90" in choice.refused["sm90_fp8"] and "sm_100" in choice.refused["sm100_nvfp4"]
    assert "CPU" in choice.refused["bf16_exact"]


@pytest.fixture
def fake_arch(monkeypatch):
    """Pretend the operands' device is an sm_XY GPU with every kernel built (host plumbing only)."""

    def set_arch(arch):
        monkeypatch.setattr(gk, "device_arch", lambda device: arch)
        monkeypatch.setattr(gk._ext, "kernel_available", lambda name, device: True)

    return set_arch


@pytest.mark.parametrize(
    "name, arch, path",
    [
        ("fp8", (9, 0), "sm90_fp8"),
        ("fp4", (9, 0), "sm90_fp4"),           # E2M1 rides the FP8 kernel, exactly
        ("mxfp8", (9, 0), "fp32"),             # 1x32 E8M0 blocks: no Hopper kernel; CPU tensors: no BF16 path
        ("nvfp4", (9, 0), "fp32"),
        ("fp8_e5m2grad", (9, 0), "sm90_fp8"),  # fprop has no E5M2 operand
        ("nvfp4", (10, 0), "sm100_nvfp4"),
        ("mxfp4", (10, 0), "sm100_mxfp4"),
        ("mxfp8", (10, 0), "sm100_mxfp8"),
        ("fp8", (10, 0), "fp32"),              # no blockwise-FP8 kernel on Blackwell (yet)
        ("fp8", (8, 0), "fp32"),
        ("nvfp4", (12, 0), "fp32"),            # sm_100a cubins do not run on sm_120
    ],
)
def test_select_path_by_capability(fake_arch, name, arch, path):
    fake_arch(arch)
    a, b = _operands(name, 16, 24, 256)
    assert gk.select_path(a, b).path == path


def test_select_path_reasons(fake_arch):
    fake_arch((9, 0))
    a, b = _operands("fp8_e5m2grad", 16, 24, 256, "dgrad")
    refused = gk.select_path(a, b).refused
    assert "e5m2" in refused["sm90_fp8"]
    a, b = _operands("mxfp8", 16, 24, 256)
    assert "e8m0" in gk.select_path(a, b).refused["sm90_fp8"]
    fake_arch((10, 0))
    a, b = _operands("nvfp4", 16, 24, 256)
    choice = gk.select_path(a, b, out_dtype=torch.float32)
    assert choice.path == "fp32" and "BF16 only" in choice.refused["sm100_nvfp4"]
    assert gk.select_path(a, b, accumulate=True).path == "fp32"


def test_forced_path_errors():
    a, b = _operands("fp8", 16, 24, 256)
    with pytest.raises(ValueError, match="cannot run this GEMM: needs an sm_90 GPU"):
        gk.qgemm(a, b, path="sm90_fp8")
    with pytest.raises(ValueError, match="unknown GEMM path"):
        gk.qgemm(a, b, path="tensor_cores_please")


# ---- qgemm argument errors and the fallback numerics --------------------------------------------


def test_qgemm_argument_errors():
    a, b = _operands("fp8", 16, 24, 256)
    c, _ = _operands("fp8", 16, 24, 128)
    with pytest.raises(ValueError, match="same K"):
        gk.qgemm(a, c)
    with pytest.raises(TypeError, match="QTensor"):
        gk.qgemm(torch.zeros(16, 256), b)
    with pytest.raises(ValueError, match="bias must be 1-D"):
        gk.qgemm(a, b, bias=torch.zeros(23))
    with pytest.raises(ValueError, match="out must be"):
        gk.qgemm(a, b, out=torch.zeros(16, 24, dtype=torch.float16))
    with pytest.raises(ValueError, match="out_dtype"):
        gk.qgemm(a, b, out_dtype=torch.int32)
    with pytest.raises(ValueError, match="bias is not supported together with out"):
        gk.qgemm(a, b, out=torch.zeros(16, 24), bias=torch.zeros(24))


@pytest.mark.parametrize("name", ["fp8", "fp4", "mxfp8", "nvfp4", "mxfp4", "fp8_e5m2grad"])
@pytest.mark.parametrize("gemm_kind", ["fprop", "dgrad", "wgrad"])
def test_fallback_is_the_reference(name, gemm_kind):
    # An FP32 GEMM of the dequantized operands, in whatever order the BLAS sums: within gamma_K |a||b|.
    a, b = _operands(name, 37, 72, 300, gemm_kind)
    y = gk.qgemm(a, b, out_dtype=torch.float32)
    assert_within_gemm_bound(y, dequantize(a), dequantize(b), what=f"{name} {gemm_kind}")


def test_fallback_matches_gemm_emulation():
    # The same operands as snip_ops.gemm.fprop quantizes (RNE: no random bits involved), bit for bit,
    # in the same FP32 matmul call: the same bits out.
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(40, 200, generator=g), torch.randn(24, 200, generator=g)
    for name in ("fp8", "mxfp8", "nvfp4"):
        r = recipe(name)
        y = gk.qgemm(quantize(x, r.act), quantize(w, r.weight), out_dtype=torch.float32)
        assert torch.equal(y, gemm.fprop(x, w, r)), name


def test_bias_accumulate_dtype_and_empty():
    a, b = _operands("fp8", 9, 24, 130)
    da, db = dequantize(a), dequantize(b)
    ref = da.double() @ db.double().t()
    bias = torch.randn(24)
    # The FP32 GEMM, then one more FP32 rounding: the bias added, or the sum added into `out`.
    y = gk.qgemm(a, b, bias=bias, out_dtype=torch.float32)
    assert_within_gemm_bound(y, da, db, ref + bias.double(), rounded_to=(torch.float32,), what="bias")
    y = gk.qgemm(a, b)
    assert y.dtype == torch.bfloat16 and y.shape == (9, 24)
    assert torch.equal(y, gk.qgemm(a, b, out_dtype=torch.float32).bfloat16())  # one rounding, at the end
    out0 = torch.randn(9, 24)
    out = out0.clone()
    assert gk.qgemm(a, b, out=out) is out
    assert_within_gemm_bound(out, da, db, out0.double() + ref, rounded_to=(torch.float32,), what="out +=")
    e, f = _operands("fp8", 0, 24, 130)[0], b
    assert gk.qgemm(e, f).shape == (0, 24)
    za, zb = quantize(torch.zeros(5, 0), QuantSpec(E4M3)), quantize(torch.zeros(8, 0), QuantSpec(E4M3, (128, 128)))
    assert torch.equal(gk.qgemm(za, zb, bias=torch.ones(8), out_dtype=torch.float32), torch.ones(5, 8))


def test_nonfinite_input_propagates():
    x = torch.randn(8, 256)
    x[3, 200] = float("nan")
    r = recipe("fp8")
    y = gk.qgemm(quantize(x, r.act), quantize(torch.randn(16, 256), r.weight), out_dtype=torch.float32)
    assert torch.isnan(y[3]).all() and torch.isfinite(y[torch.arange(8) != 3]).all()


# ---- operand conversions -------------------------------------------------------------------------


def test_fp4_codes_as_e4m3_exhaustive():
    # Every byte (two E2M1 codes) re-encodes to the E4M3 codes of exactly the same values, signed
    # zero included: the bytes torch's own cast gives.
    codes = torch.arange(256, dtype=torch.uint8).reshape(16, 16)
    q = reference.QTensor(codes, torch.ones(16, 1), QuantSpec(E2M1), (16, 32))
    e4m3 = gk.fp4_codes_as_e4m3(q)
    assert e4m3.dtype == torch.float8_e4m3fn and e4m3.shape == (16, 32)
    nibbles = torch.stack((codes.long() & 0xF, codes.long() >> 4), dim=2).reshape(16, 32)
    assert torch.equal(e4m3.view(torch.uint8), decode(nibbles, E2M1).to(torch.float8_e4m3fn).view(torch.uint8))
    odd = reference.QTensor(codes[:, :8], torch.ones(16, 1), QuantSpec(E2M1), (16, 15))
    assert gk.fp4_codes_as_e4m3(odd).shape == (16, 15)


@pytest.mark.parametrize("rows, k, block", [(5, 300, (1, 128)), (130, 128, (1, 128)), (300, 257, (128, 128)), (1, 16, (128, 128))])
def test_hopper_scales(rows, k, block):
    q = quantize(torch.randn(rows, k), QuantSpec(E4M3, block))
    kb = -(-k // 128)
    sfa, br = gk.hopper_scales(q, "a")
    assert br == 1 and sfa.shape == (kb, -(-rows // 4) * 4) and sfa.dtype == torch.float32
    per_row = q.scales.repeat_interleave(block[0], dim=0)[:rows]
    assert torch.equal(sfa[:, :rows], per_row.t())
    assert (sfa[:, rows:] == 0).all()
    sfb, bb = gk.hopper_scales(q, "b", rows=rows + 3)
    assert bb == block[0]
    n_rows = -(-(rows + 3) // bb)
    assert sfb.shape == (kb, -(-n_rows // 4) * 4)
    assert torch.equal(sfb[:, : q.scales.shape[0]], q.scales.t())


@pytest.mark.parametrize("m, n, k", [(1, 8, 16), (37, 72, 300), (128, 256, 1040), (257, 9, 100), (64, 128, 1000)])
@pytest.mark.parametrize("name, gemm_kind", [("fp8", "fprop"), ("fp8", "dgrad"), ("fp8", "wgrad"), ("fp4", "fprop"), ("fp4", "wgrad")])
def test_prepare_sm90_layouts(m, n, k, name, gemm_kind):
    a, b = _operands(name, m, n, k, gemm_kind)
    for out_dtype, n_align in ((torch.bfloat16, 8), (torch.float32, 4)):
        ca, sfa, cb, sfb, b_block, n_pad = gk.prepare_sm90(a, b, out_dtype)
        k_pad = -(-k // 16) * 16
        assert n_pad == -(-n // n_align) * n_align
        assert ca.shape == (m, k_pad) and cb.shape == (n_pad, k_pad) and ca.dtype == cb.dtype == torch.float8_e4m3fn
        assert b_block == (128 if gemm_kind in ("fprop", "dgrad") else 1)
        # The prepared operands describe the same GEMM: code times scale rebuilds the dequantized
        # operands bit for bit (the same FP32 products), zero in the padding.
        kb = -(-k // 128)
        sa = sfa[:, :m].t().repeat_interleave(128, dim=1)[:, :k_pad]
        sb = sfb.t().repeat_interleave(b_block, dim=0)[:n_pad].repeat_interleave(128, dim=1)[:, :k_pad]
        assert sa.shape[1] == min(kb * 128, k_pad)
        assert torch.equal(ca.float() * sa, F.pad(dequantize(a), (0, k_pad - k)))
        assert torch.equal(cb.float() * sb, F.pad(dequantize(b), (0, k_pad - k, 0, n_pad - n)))


@needs_sm90_op
@pytest.mark.parametrize("m, n, k", [(1, 8, 16), (37, 72, 300), (257, 9, 100)])
@pytest.mark.parametrize("gemm_kind", ["fprop", "wgrad"])
def test_prepared_sm90_args_pass_the_op_checks(fake_arch, m, n, k, gemm_kind):
    # On CPU tensors the op runs every shape/alignment check, then refuses for lack of a GPU:
    # reaching that refusal proves the wrapper's conversions satisfy the kernel's contract.
    fake_arch((9, 0))
    a, b = _operands("fp8", m, n, k, gemm_kind)
    with pytest.raises(RuntimeError, match="must be on a CUDA device"):
        gk.qgemm(a, b)
    with pytest.raises(RuntimeError, match="must be on a CUDA device"):
        gk.qgemm(a, b, out=torch.zeros(m, n))
    with pytest.raises(RuntimeError, match="must be on a CUDA device"):
        gk.qgemm(a, b, bias=torch.randn(n), out_dtype=torch.float32)


@needs_sm90_op
@pytest.mark.parametrize("name, gemm_kind", [("fp8", "fprop"), ("fp8", "wgrad"), ("fp4", "dgrad")])
def test_sm90_path_traces_with_fake_tensors(fake_arch, name, gemm_kind):
    # What torch.compile sees on an H100: the wrapper's conversions plus one snip_C op (its Meta
    # function gives the shape), no data-dependent Python.
    from torch.fx.experimental.proxy_tensor import make_fx

    fake_arch((9, 0))
    a, b = _operands(name, 64, 40, 300, gemm_kind)

    def f(ca, sa, cb, sb, bias):
        qa = reference.QTensor(ca, sa, a.spec, a.shape)
        qb = reference.QTensor(cb, sb, b.spec, b.shape)
        return gk.qgemm(qa, qb, bias=bias)

    gm = make_fx(f, tracing_mode="fake")(a.codes, a.scales, b.codes, b.scales, torch.randn(40))
    ops = [str(n.target) for n in gm.graph.nodes if n.op == "call_function" and "snip_C" in str(n.target)]
    assert ops == ["snip_C.fp8_gemm_nt_blockwise.default"]
    (out,) = [n for n in gm.graph.nodes if n.op == "output"][0].args[0:1]
    assert out.meta["val"].shape == (64, 40) and out.meta["val"].dtype == torch.bfloat16


@needs_sm100_ops
@pytest.mark.parametrize("kind", ["nvfp4", "mxfp4", "mxfp8"])
@pytest.mark.parametrize("m, n, k", [(1, 8, 32), (37, 72, 300), (129, 9, 1000), (256, 256, 1056)])
def test_prepared_sm100_args_pass_the_op_checks(fake_arch, kind, m, n, k):
    fake_arch((10, 0))
    a, b = _operands(kind, m, n, k)
    ca, sfa, cb, sfb, alpha, n_pad = gk.prepare_sm100(kind, a, b)
    fp4 = kind != "mxfp8"
    k_pad = -(-k // (32 if fp4 else 16)) * (32 if fp4 else 16)
    assert ca.shape == (m, k_pad // 2 if fp4 else k_pad) and cb.shape[0] == n_pad == -(-n // 8) * 8
    vec = 16 if kind == "nvfp4" else 32
    assert sfa.numel() == -(-m // 128) * 128 * -(-(-(-k_pad // vec)) // 4) * 4
    assert (alpha is not None) == (kind == "nvfp4")
    with pytest.raises(RuntimeError, match="must be on a CUDA device"):
        gk.qgemm(a, b)


@pytest.mark.parametrize("kind", ["nvfp4", "mxfp4", "mxfp8"])
def test_prepared_sm100_scales_round_trip(kind):
    from snip_ops.scale_layout import from_blackwell

    a, b = _operands(kind, 37, 72, 300)
    _, sfa, _, sfb, alpha, _ = gk.prepare_sm100(kind, a, b)
    n_sf = a.scales.shape[1]
    back = from_blackwell(sfa, 37, -(-sfa.numel() // -(-37 // 128) // 128))[:, :n_sf]
    assert torch.equal(back.view(torch.uint8), a.scales.view(torch.uint8))
    if kind == "nvfp4":
        assert torch.equal(alpha, (a.tensor_scale * b.tensor_scale).reshape(1))


# ---- the C++ ops: argument checks, Meta functions, heuristic ------------------------------------


def _sm90_args(m=16, n=24, k=256, b_block=128):
    r = recipe("fp8")
    a = quantize(torch.randn(m, k), r.act)
    b = quantize(torch.randn(n, k), r.weight if b_block == 128 else r.act)
    ca, sfa, cb, sfb, bb, _ = gk.prepare_sm90(a, b)
    return dict(a=ca, sfa=sfa, b=cb, sfb=sfb, b_block=bb, out_dtype=torch.bfloat16, bias=None)


def _call_sm90(args):
    return torch.ops.snip_C.fp8_gemm_nt_blockwise(
        args["a"], args["sfa"], args["b"], args["sfb"], args["b_block"], args["out_dtype"], args["bias"]
    )


@needs_sm90_op
def test_sm90_op_schemas():
    ops = torch.ops.snip_C
    assert str(ops.fp8_gemm_nt_blockwise.default._schema) == (
        "snip_C::fp8_gemm_nt_blockwise(Tensor a, Tensor sfa, Tensor b, Tensor sfb, int b_block, "
        'ScalarType out_dtype, Tensor? bias=None, str config="") -> Tensor'
    )
    assert str(ops.fp8_gemm_nt_blockwise_acc.default._schema) == (
        "snip_C::fp8_gemm_nt_blockwise_acc(Tensor a, Tensor sfa, Tensor b, Tensor sfb, int b_block, "
        'Tensor(a!) out, str config="") -> ()'
    )
    assert _ext.kernels()[SM90_OP] == ["sm_90a"]


def _mut(**changes):
    def f(args):
        args = dict(args)
        for key, fn in changes.items():
            args[key] = fn(args)
        return args

    return f


@needs_sm90_op
@pytest.mark.parametrize(
    "mutate, match",
    [
        (_mut(a=lambda a: a["a"].float()), "float8_e4m3fn"),
        (_mut(a=lambda a: a["a"].view(torch.uint8).view(torch.float8_e5m2)), "float8_e4m3fn"),
        (_mut(a=lambda a: a["a"][None]), "2-D"),
        (_mut(b=lambda a: a["b"][:, :128]), "same K"),
        (_mut(a=lambda a: a["a"][:, :24], b=lambda a: a["b"][:, :24]), "multiple of 16"),
        (_mut(a=lambda a: a["a"].t().contiguous().t()), "K-major"),
        (_mut(b_block=lambda a: 64), "b_block must be"),
        (_mut(sfa=lambda a: a["sfa"][:1]), "ceil\\(K/128\\)"),
        (_mut(sfa=lambda a: a["sfa"][:, :12]), ">= M"),
        (_mut(sfa=lambda a: torch.ones(2, 18)), "multiple of 4"),
        (_mut(sfa=lambda a: a["sfa"].half()), "float32"),
        (_mut(sfa=lambda a: a["sfa"].t().contiguous().t()), "unit stride"),
        (_mut(sfb=lambda a: a["sfb"][:, :0]), ">= ceil\\(N/128\\)"),
        (_mut(b=lambda a: a["b"][:20]), "N must be a multiple of 8"),
        (_mut(out_dtype=lambda a: torch.float16), "bfloat16 or float32"),
        (_mut(bias=lambda a: torch.zeros(23)), "bias must be 1-D"),
        (_mut(bias=lambda a: torch.zeros(24, dtype=torch.int32)), "bias must be float32"),
        ({}, "must be on a CUDA device"),
    ],
)
def test_sm90_op_argument_errors(mutate, match):
    args = _sm90_args()
    if callable(mutate):
        args = mutate(args)
    with pytest.raises(RuntimeError, match=match):
        _call_sm90(args)


@needs_sm90_op
def test_sm90_acc_op_errors():
    args = _sm90_args()
    call = torch.ops.snip_C.fp8_gemm_nt_blockwise_acc
    with pytest.raises(RuntimeError, match="out must be \\[M, N\\]"):
        call(args["a"], args["sfa"], args["b"], args["sfb"], 128, torch.zeros(16, 16))
    with pytest.raises(RuntimeError, match="bfloat16 or float32"):
        call(args["a"], args["sfa"], args["b"], args["sfb"], 128, torch.zeros(16, 24, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="row stride"):
        call(args["a"], args["sfa"], args["b"], args["sfb"], 128, torch.zeros(16, 30)[:, :24])
    with pytest.raises(RuntimeError, match="must be on a CUDA device"):
        call(args["a"], args["sfa"], args["b"], args["sfb"], 128, torch.zeros(16, 24))


@needs_sm90_op
@pytest.mark.parametrize("m, n, k", [(0, 8, 16), (1, 8, 16), (300, 520, 4096), (8192, 28672, 8192)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_sm90_meta_shapes(m, n, k, out_dtype):
    meta = dict(device="meta")
    a = torch.empty(m, k, dtype=torch.float8_e4m3fn, **meta)
    b = torch.empty(n, k, dtype=torch.float8_e4m3fn, **meta)
    sfa = torch.empty(-(-k // 128), m + 3, **meta)
    sfb = torch.empty(-(-k // 128), n, **meta)
    y = torch.ops.snip_C.fp8_gemm_nt_blockwise(a, sfa, b, sfb, 1, out_dtype)
    assert y.shape == (m, n) and y.dtype == out_dtype and y.device.type == "meta"
    torch.ops.snip_C.fp8_gemm_nt_blockwise_acc(a, sfa, b, sfb, 1, torch.empty(m, n, dtype=out_dtype, **meta))


@needs_sm90_op
def test_sm90_traces_with_symbolic_shapes():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(a, sfa, b, sfb):
        return torch.ops.snip_C.fp8_gemm_nt_blockwise(a, sfa, b, sfb, 128, torch.bfloat16)

    args = _sm90_args(m=40, n=48, k=384)
    gm = make_fx(f, tracing_mode="symbolic")(args["a"], args["sfa"], args["b"], args["sfb"])
    vals = [n.meta["val"] for n in gm.graph.nodes if n.op == "call_function" and "fp8_gemm" in str(n.target)]
    assert len(vals) == 1 and vals[0].dtype == torch.bfloat16
    assert all(isinstance(d, torch.SymInt) for d in vals[0].shape)


@needs_sm90_op
@pytest.mark.parametrize(
    "m, n, k, b_block, out_dtype, tile",
    [
        (8192, 8192, 8192, 128, torch.bfloat16, "128x128"),
        (8192, 4096, 4096, 128, torch.bfloat16, "128x128"),
        (4096, 4096, 4096, 128, torch.bfloat16, "128x128"),
        (256, 4096, 4096, 128, torch.bfloat16, "64x128"),  # 64 tiles of 128x128 would fill half the SMs
        (64, 64, 4096, 128, torch.bfloat16, "64x128"),
        (256, 4096, 4096, 128, torch.float32, "128x128"),  # the only compiled FP32-output tile
        (4096, 4096, 8192, 1, torch.float32, "128x128"),
        (4096, 4096, 8192, 1, torch.bfloat16, "128x128"),
    ],
)
def test_sm90_tile_heuristic(m, n, k, b_block, out_dtype, tile):
    text = torch.ops.snip_C.fp8_gemm_nt_blockwise_config(m, n, k, b_block, out_dtype, 132)
    assert f"tile={tile}" in text and "raster=auto swizzle=1" in text


@needs_sm90_op
def test_sm90_config_overrides():
    cfg = torch.ops.snip_C.fp8_gemm_nt_blockwise_config
    assert "tile=64x128" in cfg(8192, 8192, 8192, 128, torch.bfloat16, 132, "tile=64x128")
    assert "tile=64x128" in cfg(8192, 8192, 8192, 128, torch.bfloat16, 132, "64x128")
    assert "raster=n swizzle=4" in cfg(8192, 8192, 8192, 128, torch.bfloat16, 132, "raster=n,swizzle=4")
    for bad, match in [("tile=64x128", "not compiled"), ("tile=abc", "bad tile"), ("swizzle=3", "bad swizzle"),
                       ("raster=x", "bad raster"), ("speed=max", "unknown config key")]:
        with pytest.raises(RuntimeError, match=match):
            cfg(4096, 4096, 4096, 1, torch.float32, 132, bad)


def _sm100_args(kind, m=16, n=24, k=256):
    a, b = _operands(kind, m, n, k)
    ca, sfa, cb, sfb, alpha, _ = gk.prepare_sm100(kind, a, b)
    return ca, sfa, cb, sfb, alpha


def _call_sm100(kind, ca, sfa, cb, sfb, alpha):
    op = getattr(torch.ops.snip_C, f"{kind}_gemm_nt")
    return op(ca, sfa, cb, sfb, alpha) if kind == "nvfp4" else op(ca, sfa, cb, sfb)


@needs_sm100_ops
def test_sm100_op_schemas():
    assert str(torch.ops.snip_C.nvfp4_gemm_nt.default._schema) == (
        "snip_C::nvfp4_gemm_nt(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor alpha) -> Tensor"
    )
    for kind in ("mxfp4", "mxfp8"):
        assert str(getattr(torch.ops.snip_C, f"{kind}_gemm_nt").default._schema) == (
            f"snip_C::{kind}_gemm_nt(Tensor a, Tensor sfa, Tensor b, Tensor sfb) -> Tensor"
        )
    assert all(_ext.kernels()[op] == ["sm_100a"] for op in SM100_OPS)


@needs_sm100_ops
@pytest.mark.parametrize("kind", ["nvfp4", "mxfp4", "mxfp8"])
def test_sm100_op_argument_errors(kind):
    ca, sfa, cb, sfb, alpha = _sm100_args(kind)
    fp4 = kind != "mxfp8"
    cases = [
        ((ca.float(), sfa, cb, sfb, alpha), "packed E2M1" if fp4 else "float8_e4m3fn"),
        ((ca[:, :8], sfa, cb[:, :8], sfb, alpha), "multiple of 32" if fp4 else "multiple of 16"),
        ((ca, sfa, cb[:20], sfb, alpha), "N must be a multiple of 8"),
        ((ca, sfa[:64], cb, sfb, alpha), "blocked layout"),
        ((ca, sfa.view(torch.uint8).view(torch.float8_e5m2), cb, sfb, alpha), "float8_e4m3fn" if kind == "nvfp4" else "e8m0"),
        ((ca, sfa, cb, sfb, alpha), "must be on a CUDA device"),
    ]
    if kind == "nvfp4":
        cases.append(((ca, sfa, cb, sfb, torch.ones(2)), "one-element float32"))
    for args, match in cases:
        with pytest.raises(RuntimeError, match=match):
            _call_sm100(kind, *args)


@needs_sm100_ops
@pytest.mark.parametrize("kind", ["nvfp4", "mxfp4", "mxfp8"])
def test_sm100_meta_shapes(kind):
    ca, sfa, cb, sfb, alpha = (None if t is None else t.to("meta") for t in _sm100_args(kind, 40, 64, 512))
    y = _call_sm100(kind, ca, sfa, cb, sfb, alpha)
    assert y.shape == (40, 64) and y.dtype == torch.bfloat16 and y.device.type == "meta"


# ---- the binary: tensor-core instructions in each arch's SASS ----------------------------------


def _cuobjdump():
    cands = [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump"), shutil.which("cuobjdump")]
    try:
        import triton

        cands.append(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump"))
    except ImportError:
        pass
    return next((c for c in cands if c and os.access(c, os.X_OK)), None)


def _sass_functions(arch: str) -> dict[str, str]:
    exe = _cuobjdump()
    if exe is None:
        pytest.skip("no cuobjdump (CUDA toolkit or triton)")
    so = Path(_ext._C.__file__)
    text = subprocess.run([exe, "-sass", "-arch", arch, str(so)], capture_output=True, text=True, check=True).stdout
    funcs = {}
    for chunk in text.split("Function : ")[1:]:
        name, _, body = chunk.partition("\n")
        funcs[name.strip()] = body
    return funcs


@needs_sm90_op
def test_sm90_sass_has_qgmma():
    funcs = {n: b for n, b in _sass_functions("sm_90a").items() if SM90_OP in n}
    assert len(funcs) == 5, sorted(funcs)  # one per compiled instantiation
    for name, body in funcs.items():
        assert re.search(r"\bQGMMA\.64x128x32\.F32\.E4M3\.E4M3\b", body), name
        assert not re.search(r"\b(STL|LDL)\b", body), f"register spills in {name}"


@needs_sm100_ops
def test_sm100_sass_has_tcgen05_mma():
    funcs = _sass_functions("sm_100a")
    for op in SM100_OPS:
        mine = {n: b for n, b in funcs.items() if op in n}
        assert len(mine) == 1, (op, sorted(mine))
        (body,) = mine.values()
        assert re.search(r"\bUTC\w*MMA\b", body), op
