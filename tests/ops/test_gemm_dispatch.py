"""The low-precision GEMMs' host side, on the CPU (no GPU needed): path selection by device
capability, operand conversions (E2M1 -> E4M3 re-encoding, MN-major Hopper scales, Blackwell blocked
scales, padding), the C++ ops' argument checks and Meta functions, the tile heuristic, the fallback
paths' numerics, and the SASS of the built kernels (QGMMA on sm_90a, UTC*MMA on sm_100a)."""

import functools
import itertools
import math
import importlib
import os
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bounds import assert_within, assert_within_gemm_bound, gemm_error_bound, qgemm_error_bound, then_rounded
from snip_ops import _ext, gemm, gemm_kernels as gk, reference
from snip_ops.cast import decode
from snip_ops.formats import E2M1, E4M3, E5M2, GEMMS, RECIPES, QuantSpec, ScaleKind, element_format, recipe
from snip_ops.reference import dequantize, quantize

SM90_OP = "fp8_gemm_nt_blockwise"
SM100_OPS = ("nvfp4_gemm_nt", "mxfp4_gemm_nt", "mxfp8_gemm_nt")
# Kernels of the FP8 blockwise op (its _ext.kernels() names) per arch, E4M3 and E5M2 A.
SM90_KERNELS = ("fp8_gemm_nt_blockwise", "fp8_gemm_nt_blockwise_e5m2")
SM100_FP8_KERNELS = ("fp8_gemm_nt_blockwise_sm100", "fp8_gemm_nt_blockwise_e5m2_sm100")


def _has(op: str) -> bool:
    return _ext.HAS_KERNELS and op in _ext.kernels()


needs_sm90_op = pytest.mark.skipif(not all(_has(k) for k in SM90_KERNELS),
                                   reason="extension built without the sm_90a GEMMs")
needs_sm100_ops = pytest.mark.skipif(not all(_has(o) for o in SM100_OPS + SM100_FP8_KERNELS),
                                     reason="extension built without the sm_100a GEMMs")


def _operands(name: str, m: int, n: int, k: int, gemm_kind: str = "fprop", seed: int = 0):
    """(a, b) QTensors of one of a linear layer's GEMMs under recipe `name` (docs/design.md §3)."""
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


# The path of every GEMM of every recipe per device (the table in snip_ops.gemm_kernels' docstring):
# the same for fprop, dgrad and wgrad. CPU: the FP32 GEMM; GPUs without a kernel for the recipe: BF16
# tensor cores (exact BF16 values, or blockwise with FP32 scales); sm_90 and sm_100: a kernel, or
# BF16 where Hopper has no MX/NV FP4 hardware -- never FP64.
ARCHS = (None, (8, 0), (8, 9), (9, 0), (10, 0), (12, 0))
PATH_TABLE = {
    "fp8": ("fp32", "blockwise_bf16", "blockwise_bf16", "sm90_fp8", "sm100_fp8", "blockwise_bf16"),
    "fp8_e5m2grad": ("fp32", "blockwise_bf16", "blockwise_bf16", "sm90_fp8", "sm100_fp8", "blockwise_bf16"),
    "fp4": ("fp32", "blockwise_bf16", "blockwise_bf16", "sm90_fp4", "sm100_fp4", "blockwise_bf16"),
    "mxfp8": ("fp32", "bf16_exact", "bf16_exact", "bf16_exact", "sm100_mxfp8", "bf16_exact"),
    "nvfp4": ("fp32", "bf16_exact", "bf16_exact", "bf16_exact", "sm100_nvfp4", "bf16_exact"),
    "nvfp4_train": ("fp32", "bf16_exact", "bf16_exact", "bf16_exact", "sm100_nvfp4", "bf16_exact"),
    "mxfp4": ("fp32", "bf16_exact", "bf16_exact", "bf16_exact", "sm100_mxfp4", "bf16_exact"),
}
TENSOR_CORE_PATHS = {"sm90_fp8", "sm90_fp4", "sm100_fp8", "sm100_fp4", "sm100_nvfp4", "sm100_mxfp4", "sm100_mxfp8",
                     "bf16_exact"}


def test_path_table_covers_every_recipe():
    assert set(PATH_TABLE) == set(RECIPES) - {"bf16"}
    for row in PATH_TABLE.values():
        assert all(row[ARCHS.index(arch)] in TENSOR_CORE_PATHS for arch in ((9, 0), (10, 0)))


@pytest.mark.parametrize("name", sorted(PATH_TABLE))
@pytest.mark.parametrize("gemm_kind", GEMMS)
@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: "cpu" if a is None else f"sm_{a[0]}{a[1]}")
def test_path_table(fake_arch, name, gemm_kind, arch):
    # The operands snip_ops.gemm quantizes for this GEMM, with every kernel built and self-checked;
    # wgrad writes FP32, fprop and dgrad BF16.
    fake_arch(arch)
    a, b = _operands(name, 16, 24, 256, gemm_kind)
    out_dtype = torch.float32 if gemm_kind == "wgrad" else torch.bfloat16
    want = PATH_TABLE[name][ARCHS.index(arch)]
    choice = gk.select_path(a, b, out_dtype=out_dtype, accumulate=gemm_kind == "wgrad")
    assert choice.path == want, choice.refused
    assert gk.gemm_path(name, gemm_kind, arch).path == want  # the same rules without tensors
    if arch == (9, 0) and name == "fp8_e5m2grad" and gemm_kind != "fprop":
        assert a.spec.element == E5M2 and gk._fp8_kernel(arch, a) == "fp8_gemm_nt_blockwise_e5m2"


def test_missing_kernels_fall_back_to_bf16_tensor_cores(monkeypatch):
    # A kernel that is not built or failed its self-check: the next exact path, still tensor cores.
    monkeypatch.setattr(gk, "device_arch", lambda device: (9, 0))
    monkeypatch.setattr(gk._ext, "kernel_available", lambda name, device: name == "fp8_gemm_nt_blockwise")
    a, b = _operands("fp8_e5m2grad", 16, 24, 256, "dgrad")
    choice = gk.select_path(a, b)
    assert choice.path == "blockwise_bf16" and "fp8_gemm_nt_blockwise_e5m2" in choice.refused["sm90_fp8"]
    assert gk.select_path(*_operands("fp8_e5m2grad", 16, 24, 256, "fprop")).path == "sm90_fp8"
    only_e4m3 = {"fp8_gemm_nt_blockwise"}.__contains__
    assert gk.gemm_path("fp8_e5m2grad", "wgrad", (9, 0), only_e4m3).path == "blockwise_bf16"
    assert gk.gemm_path("mxfp8", "wgrad", (10, 0), lambda kernel: False).path == "bf16_exact"
    with pytest.raises(ValueError, match="does not run through qgemm"):
        gk.gemm_path("bf16", "fprop", (9, 0))


def test_select_path_reasons(fake_arch):
    fake_arch((9, 0))
    a, b = _operands("mxfp8", 16, 24, 256)
    assert "e8m0" in gk.select_path(a, b).refused["sm90_fp8"]
    a, b = _operands("nvfp4", 16, 24, 256)
    assert "sm_100" in gk.select_path(a, b).refused["sm100_nvfp4"]
    # E5M2 only as a (the kernels' B is E4M3): the swapped product takes the BF16 tensor cores
    e5 = quantize(torch.randn(24, 256), QuantSpec(E5M2, (1, 128)))
    e4 = quantize(torch.randn(16, 256), QuantSpec(E4M3, (1, 128)))
    choice = gk.select_path(e4, e5)
    assert choice.path == "blockwise_bf16" and "b: element e5m2" in choice.refused["sm90_fp8"]
    fake_arch((10, 0))
    a, b = _operands("nvfp4", 16, 24, 256)
    for out_dtype, accumulate in ((torch.float32, False), (torch.bfloat16, True)):  # FP32 output compiled
        assert gk.select_path(a, b, out_dtype=out_dtype, accumulate=accumulate).path == "sm100_nvfp4"
    # wider than BF16: only FP64 is exact on a GPU
    wide = QuantSpec(element_format("e5m10"), (1, 128))
    a, b = quantize(torch.randn(16, 256), wide), quantize(torch.randn(24, 256), wide)
    choice = gk.select_path(a, b)
    assert choice.path == "fp32" and "more precision" in choice.refused["blockwise_bf16"]


def test_fp64_fallback_on_a_gpu_is_not_silent(fake_arch):
    wide = QuantSpec(element_format("e5m10"), (1, 128))
    a, b = quantize(torch.randn(16, 256), wide), quantize(torch.randn(24, 256), wide)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gk.qgemm(a, b)  # the CPU's own path: no warning
    fake_arch((9, 0))
    with pytest.warns(RuntimeWarning, match="no tensor-core path for fp16/1x128/fp32/rne .*FP64 GEMM"):
        gk.qgemm(a, b)


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


def _blockwise_bound(a, b, ref, *rounded_to):
    """blockwise_bf16's bound (tests/bounds.py) plus the FP64 reference's own error, then the roundings."""
    da, db = dequantize(a), dequantize(b)
    bound = qgemm_error_bound("blockwise_bf16", da, db) + gemm_error_bound(da, db, torch.float64)
    return then_rounded(bound, ref, *rounded_to)


@pytest.mark.parametrize("name", sorted(PATH_TABLE))
@pytest.mark.parametrize("gemm_kind", GEMMS)
@pytest.mark.parametrize("m, n, k", [(37, 72, 300), (1, 8, 16)])
def test_blockwise_bf16_against_fp64(name, gemm_kind, m, n, k):
    # Forced on CPU tensors (FP32 products of the element values per K chunk there, BF16 tensor cores
    # on a GPU): every recipe's operands, odd shapes, K tails.
    a, b = _operands(name, m, n, k, gemm_kind, seed=m + k)
    ref = dequantize(a).double() @ dequantize(b).double().t()
    y = gk.qgemm(a, b, out_dtype=torch.float32, path="blockwise_bf16")
    assert_within(y, ref, _blockwise_bound(a, b, ref), f"{name} {gemm_kind}")
    # tight enough to see a relative error of 2^-6 (a wrong scale is off by far more)
    with pytest.raises(AssertionError, match="exceed the bound"):
        assert_within(y * (1 + 2.0**-6), ref, _blockwise_bound(a, b, ref))


@pytest.mark.parametrize(
    "a_spec, b_spec, chunk",
    [
        (QuantSpec(E4M3, (1, 128)), QuantSpec(E4M3, (128, 128)), 128),
        (QuantSpec(E4M3, (16, 16)), QuantSpec(E5M2, (1, 32)), 16),     # chunks of the smaller block
        (QuantSpec(E4M3, (1, 0)), QuantSpec(E4M3, (0, 0)), 300),       # row-wise x tensor-wise: one chunk
        (QuantSpec(E2M1, (1, 0)), QuantSpec(E4M3, (1, 64)), 64),
        (QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4), QuantSpec(E4M3, (1, 32), ScaleKind.E8M0), 16),
        (QuantSpec(E4M3, (1, 48)), QuantSpec(E4M3, (1, 128)), None),   # no common chunk
    ],
)
def test_blockwise_bf16_chunks(a_spec, b_spec, chunk):
    g = torch.Generator().manual_seed(5)
    a = quantize(torch.randn(33, 300, generator=g), a_spec)
    b = quantize(torch.randn(40, 300, generator=g) * 1e-3, b_spec)
    assert gk._k_chunk(a, b) == chunk
    if chunk is None:
        with pytest.raises(ValueError, match="no common K chunk"):
            gk.qgemm(a, b, path="blockwise_bf16")
        return
    ref = dequantize(a).double() @ dequantize(b).double().t()
    assert_within(gk.qgemm(a, b, out_dtype=torch.float32, path="blockwise_bf16"), ref, _blockwise_bound(a, b, ref))


def test_blockwise_bf16_memory_steps_bias_out_and_nan(monkeypatch):
    a, b = _operands("fp8", 40, 24, 1000)
    ref = dequantize(a).double() @ dequantize(b).double().t()
    whole = gk.qgemm(a, b, out_dtype=torch.float32, path="blockwise_bf16")
    monkeypatch.setattr(gk, "_BLOCKWISE_STEP_BYTES", 3 * 8 * 40 * 24)  # 3 of the 8 chunks per step
    stepped = gk.qgemm(a, b, out_dtype=torch.float32, path="blockwise_bf16")
    for y in (whole, stepped):
        assert_within(y, ref, _blockwise_bound(a, b, ref))
    bias = torch.randn(24)
    y = gk.qgemm(a, b, bias=bias, out_dtype=torch.bfloat16, path="blockwise_bf16")
    with_bias = ref + bias.double()
    assert_within(y, with_bias, _blockwise_bound(a, b, with_bias, torch.float32, torch.bfloat16))
    out0 = torch.randn(40, 24)
    out = out0.clone()
    assert gk.qgemm(a, b, out=out, path="blockwise_bf16") is out
    assert_within(out, out0.double() + ref, _blockwise_bound(a, b, out0.double() + ref, torch.float32))
    x = torch.randn(8, 256)
    x[3, 200] = float("nan")
    r = recipe("fp8")
    y = gk.qgemm(quantize(x, r.act), quantize(torch.randn(16, 256), r.weight), out_dtype=torch.float32,
                 path="blockwise_bf16")
    assert torch.isnan(y[3]).all() and torch.isfinite(y[torch.arange(8) != 3]).all()


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
@pytest.mark.parametrize("name, gemm_kind", [("fp8", "fprop"), ("fp8", "dgrad"), ("fp8", "wgrad"), ("fp4", "fprop"),
                                             ("fp4", "wgrad"), ("fp8_e5m2grad", "dgrad"), ("fp8_e5m2grad", "wgrad")])
def test_prepare_sm90_layouts(m, n, k, name, gemm_kind):
    a, b = _operands(name, m, n, k, gemm_kind)
    a_dtype = torch.float8_e5m2 if a.spec.element == E5M2 else torch.float8_e4m3fn  # E5M2 codes stay E5M2
    for out_dtype, n_align in ((torch.bfloat16, 8), (torch.float32, 4)):
        ca, sfa, cb, sfb, b_block, n_pad = gk.prepare_sm90(a, b, out_dtype)
        k_pad = -(-k // 16) * 16
        assert n_pad == -(-n // n_align) * n_align
        assert ca.shape == (m, k_pad) and cb.shape == (n_pad, k_pad)
        assert ca.dtype == a_dtype and cb.dtype == torch.float8_e4m3fn
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
@pytest.mark.parametrize("name, gemm_kind", [("fp8", "fprop"), ("fp8", "wgrad"), ("fp8_e5m2grad", "dgrad"),
                                             ("fp8_e5m2grad", "wgrad"), ("fp4", "dgrad")])
@pytest.mark.parametrize("arch", [(9, 0), (10, 0)])
def test_prepared_sm90_args_pass_the_op_checks(fake_arch, m, n, k, name, gemm_kind, arch):
    # On CPU tensors the op runs every shape/alignment check, then refuses for lack of a GPU:
    # reaching that refusal proves the wrapper's conversions satisfy the kernel's contract (one op
    # and one contract for the sm90_* and sm100_fp8/fp4 paths).
    fake_arch(arch)
    a, b = _operands(name, m, n, k, gemm_kind)
    assert gk.select_path(a, b).path.startswith(f"sm{arch[0]}{arch[1]}_")
    with pytest.raises(RuntimeError, match="must be on a CUDA device"):
        gk.qgemm(a, b)
    with pytest.raises(RuntimeError, match="must be on a CUDA device"):
        gk.qgemm(a, b, out=torch.zeros(m, n))
    with pytest.raises(RuntimeError, match="must be on a CUDA device"):
        gk.qgemm(a, b, bias=torch.randn(n), out_dtype=torch.float32)


@needs_sm90_op
@pytest.mark.parametrize("name, gemm_kind", [("fp8", "fprop"), ("fp8", "wgrad"), ("fp4", "dgrad"),
                                             ("fp8_e5m2grad", "dgrad")])
def test_sm90_path_traces_with_fake_tensors(fake_arch, name, gemm_kind):
    # What torch.compile sees on an H100: the wrapper's conversions plus one snip_C GEMM op (its Meta
    # function gives the shape; FP4 operands are re-encoded by one snip_C op each), no data-dependent
    # Python.
    from torch.fx.experimental.proxy_tensor import make_fx

    fake_arch((9, 0))
    a, b = _operands(name, 64, 40, 300, gemm_kind)

    def f(ca, sa, cb, sb, bias):
        qa = reference.QTensor(ca, sa, a.spec, a.shape)
        qb = reference.QTensor(cb, sb, b.spec, b.shape)
        return gk.qgemm(qa, qb, bias=bias)

    gm = make_fx(f, tracing_mode="fake")(a.codes, a.scales, b.codes, b.scales, torch.randn(40))
    ops = [str(n.target) for n in gm.graph.nodes if n.op == "call_function" and "snip_C" in str(n.target)]
    recode = ["snip_C.e2m1_as_e4m3.default"] * 2 if name == "fp4" else []
    assert ops == recode + ["snip_C.fp8_gemm_nt_blockwise.default"]
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
    with pytest.raises(RuntimeError, match="must be on a CUDA device"):
        gk.qgemm(a, b, out_dtype=torch.float32)  # the FP32-output instantiation's checks
    with pytest.raises(RuntimeError, match="must be on a CUDA device"):
        gk.qgemm(a, b, out=torch.zeros(m, n))


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
    assert all(_ext.kernels()[k] == ["sm_90a"] for k in SM90_KERNELS)
    assert str(ops.fp8_gemm_nt_blockwise_config.default._schema) == (
        "snip_C::fp8_gemm_nt_blockwise_config(int m, int n, int k, int b_block, ScalarType out_dtype, int num_sms, "
        'str config="", int arch=90, ScalarType a_dtype=24) -> str'
    )


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
        (_mut(a=lambda a: a["a"].float()), "a must be float8_e4m3fn or float8_e5m2"),
        (_mut(b=lambda a: a["b"].view(torch.uint8).view(torch.float8_e5m2)), "b must be float8_e4m3fn"),
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
@pytest.mark.parametrize("a_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_sm90_meta_shapes(m, n, k, out_dtype, a_dtype):
    meta = dict(device="meta")
    a = torch.empty(m, k, dtype=a_dtype, **meta)
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
        # 22 waves of 128x192 against 32 of 128x128, each a little fuller: the wider tile's full-tile
        # efficiency (kWide192Efficiency, from bench/results/nvidia-h200-gemm-configs.json) decides
        (8192, 8192, 8192, 128, torch.bfloat16, "128x192"),
        (8192, 28672, 8192, 128, torch.bfloat16, "128x192"),
        (4096, 4096, 4096, 128, torch.bfloat16, "128x128"),  # 6 waves of 192-wide tiles, 1/8 of the last idle
        (256, 4096, 4096, 128, torch.bfloat16, "64x128"),  # 64 tiles of 128x128 would fill half the SMs
        (768, 4096, 4096, 128, torch.bfloat16, "128x192"),  # one full wave against two of 128x128
        (64, 64, 4096, 128, torch.bfloat16, "64x128"),
        (256, 4096, 4096, 128, torch.float32, "128x128"),  # the only compiled FP32-output tile over 128x128 B
        (4096, 4096, 8192, 1, torch.float32, "128x128"),
        (4096, 4096, 8192, 1, torch.bfloat16, "128x128"),
        (28672, 8192, 8192, 1, torch.float32, "128x192"),
        (8192, 1024, 4096, 128, torch.bfloat16, "128x128"),
    ],
)
def test_sm90_tile_heuristic(m, n, k, b_block, out_dtype, tile):
    text = torch.ops.snip_C.fp8_gemm_nt_blockwise_config(m, n, k, b_block, out_dtype, 132)
    assert f"tile={tile}" in text and "raster=auto swizzle=1" in text


# The rule of csrc/gemm/fp8_gemm_heuristic.cpp, restated: each compiled tile's share of useful work in
# its launched waves (CTA tiles rounded up to the cluster), times its full tile's relative throughput;
# ties go to the earlier (bigger) tile.
_SM90_E4M3_TILES = {  # (b_block, out dtype): [(tile_m, tile_n, cluster_m, cluster_n, efficiency)]
    (128, torch.bfloat16): [(128, 128, 1, 2, 1.0), (64, 128, 1, 1, 0.67), (128, 192, 1, 2, 1.05)],
    (128, torch.float32): [(128, 128, 1, 2, 1.0)],
    (1, torch.bfloat16): [(128, 128, 1, 2, 1.0), (128, 192, 1, 2, 1.05)],
    (1, torch.float32): [(128, 128, 1, 2, 1.0), (128, 192, 1, 2, 1.05)],
}


def _expected_tile(m: int, n: int, tiles, sms: int = 132) -> str:
    def score(tm, tn, cm, cn, eff):
        tiles_m, tiles_n = math.ceil(m / tm / cm) * cm, math.ceil(n / tn / cn) * cn  # CTA tiles, whole clusters
        waves = math.ceil(tiles_m * tiles_n / sms)
        return m * n / (waves * sms * tm * tn) * eff

    best = max(tiles, key=lambda t: (round(score(*t), 9), -tiles.index(t)))
    return f"{best[0]}x{best[1]}"


@needs_sm90_op
@pytest.mark.parametrize("b_block, out_dtype", list(_SM90_E4M3_TILES))
def test_sm90_tile_heuristic_follows_its_rule(b_block, out_dtype):
    cfg = torch.ops.snip_C.fp8_gemm_nt_blockwise_config
    tiles = _SM90_E4M3_TILES[(b_block, out_dtype)]
    sizes = (1, 64, 192, 256, 768, 1000, 1024, 4096, 6144, 8192, 11008, 14336, 28672)
    for m, n in itertools.product(sizes, sizes):
        assert f"tile={_expected_tile(m, n, tiles)} " in cfg(m, n, 4096, b_block, out_dtype, 132, ""), (m, n)


@needs_sm90_op
@pytest.mark.parametrize(
    "arch, a_dtype, b_block, out_dtype, want",
    [
        (90, torch.float8_e5m2, 128, torch.bfloat16, "e5m2_b128_bf16_128x128 tile=128x128 schedule=cooperative"),
        (90, torch.float8_e5m2, 128, torch.float32, "e5m2_b128_f32_128x128 tile=128x128"),
        (90, torch.float8_e5m2, 1, torch.float32, "e5m2_b1_f32_128x128 tile=128x128"),
        # no E5M2 x 1x128 BF16 instantiation: the FP32 one, cast (the same single rounding)
        (90, torch.float8_e5m2, 1, torch.bfloat16, "e5m2_b1_f32_128x128 tile=128x128"),
        (100, torch.float8_e4m3fn, 128, torch.bfloat16, "sm100_b128_bf16_256x128_2sm tile=128x128 schedule=2sm"),
        (100, torch.float8_e4m3fn, 1, torch.float32, "sm100_b1_f32_256x128_2sm tile=128x128"),
        (100, torch.float8_e5m2, 128, torch.float32, "sm100_e5m2_b128_f32_256x128_2sm"),
        (100, torch.float8_e5m2, 1, torch.bfloat16, "sm100_e5m2_b1_f32_256x128_2sm"),
    ],
)
def test_fp8_blockwise_instantiation_choice(arch, a_dtype, b_block, out_dtype, want):
    if arch == 100 and not all(_has(k) for k in SM100_FP8_KERNELS):
        pytest.skip("extension built without the sm_100a FP8 blockwise GEMMs (SNIP_CUDA_ARCHS=90a)")
    text = torch.ops.snip_C.fp8_gemm_nt_blockwise_config(4096, 4096, 4096, b_block, out_dtype, 132, "", arch, a_dtype)
    assert text.startswith(want)
    assert text.endswith("(FP32 output, cast)") == ("f32" in want and out_dtype == torch.bfloat16)


@needs_sm90_op
def test_sm90_config_overrides():
    cfg = torch.ops.snip_C.fp8_gemm_nt_blockwise_config
    assert "tile=64x128" in cfg(8192, 8192, 8192, 128, torch.bfloat16, 132, "tile=64x128")
    assert "tile=64x128" in cfg(8192, 8192, 8192, 128, torch.bfloat16, 132, "64x128")
    assert "raster=n swizzle=4" in cfg(8192, 8192, 8192, 128, torch.bfloat16, 132, "raster=n,swizzle=4")
    # the overlapped-promotion mainloop: only by config, for E4M3 with 128x128 B blocks and BF16 out, and wgrad's
    # 1x128 B blocks with FP32 out
    for m in (256, 8192):
        assert "promotion" not in cfg(m, 8192, 8192, 128, torch.bfloat16, 132)
        assert "promotion" not in cfg(m, 8192, 8192, 128, torch.bfloat16, 132, "promotion=serial")
    got = cfg(256, 4096, 4096, 128, torch.bfloat16, 132, "promotion=overlapped,raster=m")
    assert got.startswith("b128_bf16_128x128_overlapped tile=128x128") and got.endswith("raster=m swizzle=1 promotion=overlapped")
    assert cfg(4096, 4096, 8192, 1, torch.float32, 132, "tile=128x128,promotion=overlapped").startswith(
        "b1_f32_128x128_overlapped")
    for args, match in [((128, torch.bfloat16, 132, "tile=64x128,promotion=overlapped"), "64x128 with promotion=overlapped"),
                        ((128, torch.float32, 132, "promotion=overlapped"), "promotion=overlapped is not compiled"),
                        ((1, torch.bfloat16, 132, "promotion=overlapped"), "promotion=overlapped is not compiled"),
                        ((128, torch.bfloat16, 132, "promotion=fast"), "bad promotion")]:
        with pytest.raises(RuntimeError, match=match):
            cfg(4096, 4096, 4096, *args)
    assert cfg(4096, 4096, 4096, 128, torch.bfloat16, 132, "promotion=overlapped", 90, torch.float8_e5m2).startswith(
        "e5m2_b128_bf16_128x128_overlapped")
    with pytest.raises(RuntimeError, match="promotion=overlapped is not compiled"):
        cfg(4096, 4096, 4096, 128, torch.float32, 132, "promotion=overlapped", 90, torch.float8_e5m2)
    # a 2x1 cluster (B multicast): E4M3 fprop/dgrad with the overlapped mainloop, by config only
    got = cfg(8192, 8192, 8192, 128, torch.bfloat16, 132, "promotion=overlapped,cluster=2x1")
    assert got.startswith("b128_bf16_128x128_c2x1_overlapped") and "cluster=2x1 promotion=overlapped" in got
    assert "cluster" not in cfg(8192, 8192, 8192, 128, torch.bfloat16, 132, "promotion=overlapped,cluster=1x2")
    for config, match in [("cluster=2x1", "cluster=2x1 is not compiled"), ("cluster=3x1", "bad cluster"),
                          ("cluster=2x", "bad cluster")]:
        with pytest.raises(RuntimeError, match=match):
            cfg(4096, 4096, 4096, 128, torch.bfloat16, 132, config)
    with pytest.raises(RuntimeError, match="cluster=2x1 with promotion=overlapped is not compiled"):
        cfg(4096, 4096, 8192, 1, torch.float32, 132, "promotion=overlapped,cluster=2x1")
    for bad, match in [("tile=64x128", "not compiled"), ("tile=abc", "bad tile"), ("swizzle=3", "bad swizzle"),
                       ("raster=x", "bad raster"), ("speed=max", "unknown config key")]:
        with pytest.raises(RuntimeError, match=match):
            cfg(4096, 4096, 4096, 1, torch.float32, 132, bad)
    with pytest.raises(RuntimeError, match="not compiled"):
        cfg(256, 4096, 4096, 128, torch.bfloat16, 132, "tile=64x128", 90, torch.float8_e5m2)
    with pytest.raises(RuntimeError, match="arch must be 90"):
        cfg(256, 4096, 4096, 128, torch.bfloat16, 132, "", 89)
    with pytest.raises(RuntimeError, match="a must be float8_e4m3fn or float8_e5m2"):
        cfg(256, 4096, 4096, 128, torch.bfloat16, 132, "", 90, torch.bfloat16)


@needs_sm90_op
def test_sm90_128x192_tile_by_name():
    """The 128x192 tiles (csrc/gemm/sm90/wide_tile_mainloop.cuh) run where a config names them (and where the
    heuristic picks them), for E4M3: B in 128x128 blocks (fprop, dgrad) with BF16 output, 1x128 (wgrad) with BF16
    or FP32; nowhere else."""
    cfg = torch.ops.snip_C.fp8_gemm_nt_blockwise_config
    for config in ("tile=128x192", "128x192", "tile=128x192,raster=n,swizzle=2"):
        got = cfg(8192, 14336, 4096, 128, torch.bfloat16, 132, config)
        assert got.startswith("b128_bf16_128x192 tile=128x192 schedule=cooperative") and "promotion" not in got
        assert cfg(4096, 14336, 8192, 1, torch.bfloat16, 132, config).startswith("b1_bf16_128x192 tile=128x192")
        assert cfg(4096, 14336, 8192, 1, torch.float32, 132, config).startswith("b1_f32_128x192 tile=128x192")
    for m, n, k in itertools.product((1, 256, 1000, 8192), (192, 384, 4096, 6144, 14336), (128, 4096)):
        for config in ("", "tile=128x128", "promotion=overlapped"):  # never with another A type or mainloop
            assert "128x192" not in cfg(m, n, k, 128, torch.bfloat16, 132, config, 90, torch.float8_e5m2)
        assert "128x192" not in cfg(m, n, k, 128, torch.bfloat16, 132, "promotion=overlapped")
    for args, match in [((1, torch.float32, 132, "tile=128x192,promotion=overlapped"),
                         "tile 128x192 with promotion=overlapped is not compiled for b_block=1"),
                        ((128, torch.float32, 132, "tile=128x192"), "tile 128x192 is not compiled for b_block=128"),
                        ((128, torch.bfloat16, 132, "tile=128x192,promotion=overlapped"),
                         "128x192 with promotion=overlapped is not compiled")]:
        with pytest.raises(RuntimeError, match=match):
            cfg(4096, 4096, 4096, *args)
    with pytest.raises(RuntimeError, match="not compiled"):
        cfg(4096, 4096, 4096, 128, torch.bfloat16, 132, "tile=128x192", 90, torch.float8_e5m2)


@pytest.mark.parametrize("n", [1, 64, 127, 128, 129, 191, 192, 200, 384, 4096, 6143, 14336])
def test_192_wide_tiles_meet_128_blocks_in_whole_thirds(n):
    """The wide-tile mainloop over 128x128 blocks scales each 64-column third of a 192-wide tile with the per-row scale of the
    third's first row. Checked here for every tile of N: each column the third covers (inside N) has that row's
    128-row block, i.e. the scale per_row_b_scales gives it, so the product is the 128x128-block kernels'."""
    block_of = torch.arange(-(-n // 128) * 128) // 128  # per_row_b_scales: row r takes block r // 128's scale
    for n0 in range(0, n, 192):
        for col in range(n0, min(n0 + 192, n)):
            first = n0 + 64 * ((col - n0) // 64)
            assert block_of[col] == block_of[first], (n, n0, col)


def _sm100_args(kind, m=16, n=24, k=256):
    a, b = _operands(kind, m, n, k)
    ca, sfa, cb, sfb, alpha, _ = gk.prepare_sm100(kind, a, b)
    return ca, sfa, cb, sfb, alpha


def _call_sm100(kind, ca, sfa, cb, sfb, alpha, out_dtype=torch.bfloat16):
    op = getattr(torch.ops.snip_C, f"{kind}_gemm_nt")
    return op(ca, sfa, cb, sfb, alpha, out_dtype) if kind == "nvfp4" else op(ca, sfa, cb, sfb, out_dtype)


@needs_sm100_ops
def test_sm100_op_schemas():
    # out_dtype (BF16 by default; FP32 for wgrad) is a ScalarType, printed as its number (15: bfloat16)
    assert str(torch.ops.snip_C.nvfp4_gemm_nt.default._schema) == (
        "snip_C::nvfp4_gemm_nt(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor alpha, ScalarType out_dtype=15) "
        "-> Tensor"
    )
    for kind in ("mxfp4", "mxfp8"):
        assert str(getattr(torch.ops.snip_C, f"{kind}_gemm_nt").default._schema) == (
            f"snip_C::{kind}_gemm_nt(Tensor a, Tensor sfa, Tensor b, Tensor sfb, ScalarType out_dtype=15) -> Tensor"
        )
    assert all(_ext.kernels()[op] == ["sm_100a"] for op in SM100_OPS + SM100_FP8_KERNELS)


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
    with pytest.raises(RuntimeError, match="out_dtype must be bfloat16 or float32"):
        _call_sm100(kind, ca, sfa, cb, sfb, alpha, torch.float16)
    # FP32 output rows are 16 bytes at N % 4 (BF16: N % 8)
    ca, sfa, cb, sfb, alpha = _sm100_args(kind, n=20)
    cb = cb[:20]
    with pytest.raises(RuntimeError, match="N must be a multiple of 8 for BFloat16"):
        _call_sm100(kind, ca, sfa, cb, sfb, alpha)
    with pytest.raises(RuntimeError, match="must be on a CUDA device"):
        _call_sm100(kind, ca, sfa, cb, sfb, alpha, torch.float32)


@needs_sm100_ops
@pytest.mark.parametrize("kind", ["nvfp4", "mxfp4", "mxfp8"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_sm100_meta_shapes(kind, out_dtype):
    ca, sfa, cb, sfb, alpha = (None if t is None else t.to("meta") for t in _sm100_args(kind, 40, 64, 512))
    y = _call_sm100(kind, ca, sfa, cb, sfb, alpha, out_dtype)
    assert y.shape == (40, 64) and y.dtype == out_dtype and y.device.type == "meta"


# ---- the binary: tensor-core instructions in each arch's SASS ----------------------------------


def _cuobjdump():
    cands = [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump"), shutil.which("cuobjdump")]
    try:
        import triton

        cands.append(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump"))
    except ImportError:
        pass
    return next((c for c in cands if c and os.access(c, os.X_OK)), None)


@functools.lru_cache(maxsize=None)  # one disassembly of the extension per arch and process (seconds each)
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
@pytest.mark.parametrize("kernel, count, mma", [("fp8_gemm_nt_blockwise", 11, "E4M3.E4M3"),
                                                ("fp8_gemm_nt_blockwise_e5m2", 5, "E5M2.E4M3")])
def test_sm90_sass_has_qgmma(kernel, count, mma):
    funcs = {n: b for n, b in _sass_functions("sm_90a").items() if f"{kernel}_kernel" in n}
    assert len(funcs) == count, sorted(funcs)  # one per compiled instantiation
    for name, body in funcs.items():
        width = 192 if "WideTileMainloop" in name else 128
        assert re.search(rf"\bQGMMA\.64x{width}x32\.F32\.{mma}\b", body), name
        assert not re.search(r"\b(STL|LDL)\b", body), f"register spills in {name}"


@needs_sm90_op
def test_sm90_sass_wide_tile_promotion():
    """The 128x192 kernels' K-tile loop (csrc/gemm/sm90/wide_tile_mainloop.cuh), in the binary, from the wgmmas'
    issue to the stage's release: four m64n192k32 wgmmas per warpgroup and one FFMA per accumulator element of a
    64x192 warpgroup tile (96 per thread). Over 128x128 weight blocks: five scale loads (the thread's two rows
    of A, the tile's three thirds of B) and six products (2 rows x 3 thirds). Over 1x128 B blocks: two loads of
    A's scales and 24 paired loads of the thread's 48 columns of B, read where used (CUTLASS's consumer holds
    them in registers and spills at this width), and CUTLASS's (partial * SFA) * SFB: 96 FMULs."""
    funcs = {n: b for n, b in _sass_functions("sm_90a").items() if "WideTileMainloop" in n}
    assert len(funcs) == 3, sorted(funcs)
    counts = []
    for body in funcs.values():
        loop = body.split("WARPGROUP.ARRIVE", 1)[1].split("SYNCS.ARRIVE", 1)[0]
        counts.append({op: len(re.findall(rf"\b{op}(\.\w+)?\b", loop)) for op in ("QGMMA", "LDS", "FMUL", "FFMA")})
        counts[-1]["LDS.64"] = len(re.findall(r"\bLDS\.64\b", loop))
    rows = {"QGMMA": 4, "LDS": 26, "FMUL": 96, "FFMA": 96, "LDS.64": 24}  # BF16 and FP32 output alike
    assert sorted(counts, key=lambda c: c["FMUL"]) == [
        {"QGMMA": 4, "LDS": 5, "FMUL": 6, "FFMA": 96, "LDS.64": 0}, rows, rows], counts


@needs_sm90_op
def test_sm90_sass_overlaps_the_promotion():
    # The overlapped-promotion mainloop (csrc/gemm/sm90/overlapped_promotion_mainloop.cuh), in the binary: its
    # loop waits for all wgmma groups but the newest (`WARPGROUP.DEPBAR.LE gsb0, 0x1`) and then promotes with
    # FFMAs while that group runs; CUTLASS's mainloop always waits for every group (`0x0`).
    funcs = {n: b for n, b in _sass_functions("sm_90a").items() if "fp8_gemm_nt_blockwise" in n}
    overlapped = {n: b for n, b in funcs.items() if "OverlappedPromotionMainloop" in n}
    assert len(overlapped) == 5, sorted(overlapped)  # E4M3 and E5M2: b128 BF16 out, b1 FP32 out; E4M3 2x1 cluster
    for name, body in funcs.items():
        waits = re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[01])", body)
        if name in overlapped:
            # the first wait is the loop's: none before it (an undefined partial accumulator made ptxas wait
            # for the first K tile there, C7517); a full wait only on the two ways out of the loop
            assert waits[0] == "0x1" and waits.count("0x0") == 2, (name, waits)
            after = body.split("WARPGROUP.DEPBAR.LE gsb0, 0x1", 1)[1].split("QGMMA", 1)[0]
            assert len(re.findall(r"\bFFMA\b", after)) >= 64, name  # a 64x128 warpgroup tile's partial sums
        else:
            assert waits and set(waits) == {"0x0"}, name


@needs_sm100_ops
@pytest.mark.parametrize("kernel, count", [("nvfp4_gemm_nt", 2), ("mxfp4_gemm_nt", 2), ("mxfp8_gemm_nt", 2),
                                           ("fp8_gemm_nt_blockwise_sm100", 3), ("fp8_gemm_nt_blockwise_e5m2_sm100", 3)])
def test_sm100_sass_has_tcgen05_mma(kernel, count):
    # one function per instantiation (BF16 and FP32 output; the FP8 blockwise ones per B block and output)
    mine = {n: b for n, b in _sass_functions("sm_100a").items() if f"{kernel}_kernel" in n}
    assert len(mine) == count, sorted(mine)
    for name, body in mine.items():
        assert re.search(r"\bUTC\w*MMA\b", body), name


@pytest.mark.skipif(not _ext.kernel_available("dequantize", "cpu"), reason="snip_ops._C's CPU dequantize not built")
@pytest.mark.parametrize("name", ["nvfp4", "nvfp4_train", "mxfp4", "mxfp8"])
def test_bf16_exact_operands_come_from_the_dequantize_op(name, monkeypatch):
    """The bf16_exact path's operand values: NVFP4's without their tensor scale (applied after the GEMM), by the
    dequantize op with a tensor scale of one, bit for bit the reference's, which is not called."""
    native = importlib.import_module("snip_ops.quantize")  # the package's `quantize` is the function
    q = native.quantize(torch.randn(77, 160) * 3, recipe(name).act)
    bare = reference.QTensor(q.codes, q.scales, q.spec, q.shape, None, q.scale_layout)
    want = reference.dequantize(bare).to(torch.bfloat16)
    monkeypatch.setattr(native.reference, "dequantize", lambda *a, **k: pytest.fail("the reference dequantized"))
    values, factor = gk._dequant_bf16(q)
    assert values.dtype == torch.bfloat16 and torch.equal(values, want)
    assert (factor is None) == (q.tensor_scale is None)
    assert factor is None or torch.equal(factor, q.tensor_scale.float())
