"""The CUTLASS GEMMs on a GPU: first the quantized operands, from the CUDA quantizer, bit for bit
against the reference quantizer (the CPU oracle); then the GEMM against the FP64 GEMM of those
dequantized operands, elementwise within the path's error bound (tests/bounds.py, qgemm_error_bound:
the Hopper FP8 wgmma's reduced-precision accumulator inside each 128-wide K block, the assumptions
stated there), with each rounding after the GEMM (bias add, BF16/FP16 output, accumulation into
`out`) on top.
Every scale layout (1x128 x 128x128 for fprop/dgrad, 1x128 x 1x128 for wgrad, 128x128-blocked A),
odd M/N/K, every compiled tile configuration, bias, accumulation into FP32 and BF16, FP4 on
Hopper (E2M1 re-encoded as E4M3) and E5M2 x E4M3 (the fp8_e5m2grad recipe's gradients) are covered.
The sm_100 tests (the FP8 blockwise kernel with FP32 scales, the block-scaled nvfp4/mxfp4/mxfp8
kernels with BF16 and FP32 output) need a B200-class GPU; the BF16 tensor-core fallbacks run on any.
"""

import pytest
import torch

from bounds import assert_within, gemm_error_bound, qgemm_error_bound, then_rounded
from snip_ops import _ext, gemm, gemm_kernels as gk, quantize, reference
from snip_ops.formats import E2M1, E4M3, E5M2, GEMMS, RECIPES, QuantSpec, ScaleKind, element_format, recipe
from snip_ops.reference import dequantize

# A named config whose output differs from the heuristic's is replaced by it with a warning
# (gemm_kernels.checked_config), which would hide the kernel bug a bit-for-bit test here looks for: an error.
pytestmark = [pytest.mark.gpu,
              pytest.mark.filterwarnings("error:snip_ops.gemm_kernels.qgemm. the FP8 GEMM with config:RuntimeWarning")]


def _arch():
    return torch.cuda.get_device_capability() if torch.cuda.is_available() else None


needs_sm90 = pytest.mark.skipif(
    _arch() != (9, 0) or not _ext.kernel_available("fp8_gemm_nt_blockwise", "cuda"),
    reason="needs an sm_90 GPU and the sm_90a GEMM in snip_ops._C",
)
needs_sm90_e5m2 = pytest.mark.skipif(
    _arch() != (9, 0) or not _ext.kernel_available("fp8_gemm_nt_blockwise_e5m2", "cuda"),
    reason="needs an sm_90 GPU and the sm_90a E5M2 x E4M3 GEMM in snip_ops._C",
)
needs_sm100 = pytest.mark.skipif(
    _arch() != (10, 0) or not _ext.kernel_available("nvfp4_gemm_nt", "cuda"),
    reason="needs an sm_100 GPU and the sm_100a GEMMs in snip_ops._C",
)
needs_sm100_fp8 = pytest.mark.skipif(
    _arch() != (10, 0) or not all(_ext.kernel_available(k, "cuda") for k in
                                  ("fp8_gemm_nt_blockwise_sm100", "fp8_gemm_nt_blockwise_e5m2_sm100")),
    reason="needs an sm_100 GPU and the sm_100a FP8 blockwise GEMMs in snip_ops._C",
)


def _bits(t):
    return None if t is None else t.contiguous().cpu().reshape(-1).view(torch.uint8)


def quantized(x, spec, **kw):
    """snip_ops.quantize(x) (the CUDA quantizer), checked bit for bit against the reference on the CPU."""
    q = quantize(x, spec, **kw)
    want = reference.quantize(x.cpu(), spec, **kw)
    for part in ("codes", "scales", "tensor_scale"):
        got_bits, want_bits = _bits(getattr(q, part)), _bits(getattr(want, part))
        assert (got_bits is None) == (want_bits is None) and (got_bits is None or torch.equal(got_bits, want_bits)), (
            f"{spec.describe()} {part}: the CUDA quantizer differs from the reference")
    return q


def ref_gemm(a, b) -> torch.Tensor:
    return dequantize(a).double() @ dequantize(b).double().t()


def kernel_bound(path, a, b) -> torch.Tensor:
    """The path's bound against the exact product, plus the FP64 reference's own error."""
    da, db = dequantize(a), dequantize(b)
    return qgemm_error_bound(path, da, db) + gemm_error_bound(da, db, torch.float64)


def check(y, a, b, path, out_dtype=torch.float32, bias=None, what=""):
    """y = qgemm(a, b, bias=bias) in `out_dtype` within the path's bound: the FP32 product, the bias
    added in FP32, one rounding to the output dtype (in the kernel's epilogue or after it alike)."""
    ref = ref_gemm(a, b)
    bound = kernel_bound(path, a, b)
    if bias is not None:
        ref = ref + bias.double()
        bound = then_rounded(bound, ref, torch.float32)
    assert y.dtype == out_dtype and y.shape == ref.shape
    assert_within(y, ref, then_rounded(bound, ref, out_dtype), what)


def check_bias(a, b, path, out_dtype):
    """qgemm(a, b, bias=bias) on `path` with a random FP32 bias, within the path's bound (`check`)."""
    bias = torch.randn(b.shape[0], device="cuda")
    check(gk.qgemm(a, b, bias=bias, out_dtype=out_dtype, path=path), a, b, path, out_dtype, bias=bias)


def check_accumulate(a, b, path, out_dtype, times):
    """qgemm(a, b, out=out) on `path`, `times` times into a random `out` of `out_dtype` (wgrad
    accumulation over micro-batches): after each, out within the bound of out0 + times * (a @ b^T)."""
    out0 = torch.randn(a.shape[0], b.shape[0], device="cuda").to(out_dtype)
    out = out0.clone()
    product, gemm_bound = ref_gemm(a, b), kernel_bound(path, a, b)
    bound = torch.zeros_like(product)
    for i in range(1, times + 1):
        assert gk.qgemm(a, b, out=out, path=path) is out
        ref = out0.double() + i * product
        # out + the GEMM, in FP32, stored in out's dtype: the error so far plus this GEMM's, rounded twice
        bound = then_rounded(bound + gemm_bound, ref, torch.float32, out_dtype)
        assert_within(out, ref, bound, f"accumulation {i}")


def operands(name, m, n, k, gemm_kind="fprop", seed=0, spread=True):
    """(a, b) of one GEMM of a linear layer, quantized on the GPU. `spread`: rows and columns with
    magnitudes over several binades, so that every block gets its own scale."""
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(r, c):
        t = torch.randn(r, c, device="cuda", generator=g)
        if spread:
            t = t * torch.exp2(torch.randint(-4, 5, (r, 1), device="cuda", generator=g).float())
            t = t * torch.exp2(torch.randint(-3, 4, (1, c), device="cuda", generator=g).float())
        return t

    r = recipe(name)
    if gemm_kind == "fprop":
        return quantized(rnd(m, k), r.act), quantized(rnd(n, k), r.weight)
    if gemm_kind == "dgrad":
        w = rnd(k, n)
        wq = quantized(w, r.weight)
        b = wq.t() if r.weight.block == (128, 128) else quantized(w, r.weight, transpose=True)
        return quantized(rnd(m, k), r.grad), b
    return quantized(rnd(k, m), r.grad, transpose=True), quantized(rnd(k, n), r.act, transpose=True)


SHAPES = [(128, 128, 128), (1, 8, 16), (33, 72, 144), (257, 264, 1040), (1000, 520, 4112), (64, 4096, 4096)]


def configs(b_block, out_dtype, e5m2=False):
    tiles = ["", "tile=128x128"]
    if b_block == 128 and out_dtype == torch.bfloat16 and not e5m2:
        tiles.append("tile=64x128")
    if (b_block, out_dtype) in ((128, torch.bfloat16), (1, torch.float32)):
        tiles.append(OVERLAPPED)
    if b_block == 128 and out_dtype == torch.bfloat16 and not e5m2:
        tiles.append(OVERLAPPED + ",cluster=2x1")
    if (out_dtype == torch.bfloat16 or b_block == 1) and not e5m2:
        tiles.append(WIDE)
    return tiles


OVERLAPPED = "tile=128x128,promotion=overlapped"
WIDE = "tile=128x192"  # csrc/gemm/sm90/wide_tile_mainloop.cuh


# ---- Hopper FP8 ---------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", sorted(set(RECIPES) - {"bf16"}))
def test_path_table_on_this_gpu(name):
    # select_path on real operands agrees with gemm_path's table for this GPU and its kernels; on sm_90
    # and sm_100 every GEMM of every recipe is on tensor cores.
    arch = _arch()
    for gemm_kind in GEMMS:
        a, b = operands(name, 64, 72, 256, gemm_kind)
        got = gk.select_path(a, b).path
        assert got == gk.gemm_path(name, gemm_kind, arch, lambda k: _ext.kernel_available(k, "cuda")).path
        if arch in ((9, 0), (10, 0)):
            assert got not in ("blockwise_bf16", "fp32"), (name, gemm_kind, got)


@needs_sm90
def test_dispatch_picks_the_kernel():
    a, b = operands("fp8", 256, 256, 256)
    assert gk.select_path(a, b).path == "sm90_fp8"
    a, b = operands("fp4", 256, 256, 256)
    assert gk.select_path(a, b).path == "sm90_fp4"
    a, b = operands("fp8_e5m2grad", 256, 256, 256, "dgrad")
    assert gk.select_path(a, b).path == ("sm90_fp8" if _ext.kernel_available("fp8_gemm_nt_blockwise_e5m2", "cuda")
                                         else "blockwise_bf16")


@needs_sm90
@pytest.mark.parametrize("m, n, k", SHAPES)
@pytest.mark.parametrize("gemm_kind", ["fprop", "dgrad", "wgrad"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_sm90_fp8_against_fp64(m, n, k, gemm_kind, out_dtype):
    a, b = operands("fp8", m, n, k, gemm_kind)
    b_block = 1 if gemm_kind == "wgrad" else 128
    for config in configs(b_block, out_dtype):
        y = gk.qgemm(a, b, out_dtype=out_dtype, path="sm90_fp8", config=config)
        check(y, a, b, "sm90_fp8", out_dtype, what=config)


@needs_sm90_e5m2
@pytest.mark.parametrize("m, n, k", SHAPES)
@pytest.mark.parametrize("gemm_kind", ["dgrad", "wgrad"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_sm90_e5m2_against_fp64(m, n, k, gemm_kind, out_dtype):
    # The fp8_e5m2grad recipe's gradient GEMMs: E5M2 dy (dy^T) times E4M3 w^T (x^T), on wgmma's mixed
    # QGMMA.E5M2.E4M3; wgrad with BF16 output runs the FP32 instantiation and casts.
    a, b = operands("fp8_e5m2grad", m, n, k, gemm_kind)
    assert a.spec.element == E5M2 and gk.select_path(a, b, out_dtype=out_dtype).path == "sm90_fp8"
    b_block = 1 if gemm_kind == "wgrad" else 128
    for config in configs(b_block, out_dtype, e5m2=True):
        y = gk.qgemm(a, b, out_dtype=out_dtype, path="sm90_fp8", config=config)
        check(y, a, b, "sm90_fp8", out_dtype, what=config)


@needs_sm90_e5m2
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_sm90_e5m2_accumulate_and_bias(out_dtype):
    check_accumulate(*operands("fp8_e5m2grad", 200, 264, 1040, "wgrad"), "sm90_fp8", out_dtype, 1)
    check_bias(*operands("fp8_e5m2grad", 200, 264, 512, "dgrad"), "sm90_fp8", out_dtype)


@needs_sm90
@pytest.mark.parametrize("a_block, b_block", [((1, 128), (128, 128)), ((128, 128), (128, 128)), ((1, 128), (1, 128)), ((128, 128), (1, 128))])
@pytest.mark.parametrize("scale", [ScaleKind.FP32, ScaleKind.POW2])
def test_sm90_every_scale_layout(a_block, b_block, scale):
    g = torch.Generator(device="cuda").manual_seed(1)
    x, w = torch.randn(300, 640, device="cuda", generator=g), torch.randn(264, 640, device="cuda", generator=g)
    a, b = quantized(x, QuantSpec(E4M3, a_block, scale)), quantized(w, QuantSpec(E4M3, b_block, scale))
    check(gk.qgemm(a, b, out_dtype=torch.float32, path="sm90_fp8"), a, b, "sm90_fp8")


@needs_sm90
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_sm90_bias(out_dtype):
    a, b = operands("fp8", 200, 264, 512, spread=out_dtype != torch.float16)  # FP16: stay below 65504
    bias = torch.randn(264, device="cuda", dtype=torch.bfloat16)
    y = gk.qgemm(a, b, out_dtype=out_dtype, bias=bias, path="sm90_fp8")
    check(y, a, b, "sm90_fp8", out_dtype, bias=bias)
    # N that needs padding inside the wrapper (the bias is padded with it)
    a, b = operands("fp8", 200, 13, 512)
    bias = torch.randn(13, device="cuda")
    check(gk.qgemm(a, b, out_dtype=torch.float32, bias=bias, path="sm90_fp8"), a, b, "sm90_fp8", bias=bias)


@needs_sm90
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [264, 13])  # 13: not a multiple of the 16-byte rows -> FP32 result + add_
@pytest.mark.parametrize("gemm_kind", ["wgrad", "fprop"])
def test_sm90_accumulate(out_dtype, n, gemm_kind):
    a, b = operands("fp8", 200, n, 1040, gemm_kind)
    check_accumulate(a, b, "sm90_fp8", out_dtype, 2)


@needs_sm90
def test_sm90_accumulate_op_directly_into_fp32():
    a, b = operands("fp8", 256, 256, 4096, "wgrad")
    ca, sfa, cb, sfb, b_block, _ = gk.prepare_sm90(a, b, torch.float32)
    out = torch.zeros(256, 256, device="cuda")
    product, gemm_bound = ref_gemm(a, b), kernel_bound("sm90_fp8", a, b)
    bound = torch.zeros_like(product)
    for times in (1, 2, 3):
        torch.ops.snip_C.fp8_gemm_nt_blockwise_acc(ca, sfa, cb, sfb, b_block, out)
        bound = then_rounded(bound + gemm_bound, times * product, torch.float32)
        assert_within(out, times * product, bound, f"accumulation {times}")


@needs_sm90
@pytest.mark.parametrize("gemm_kind", ["fprop", "dgrad", "wgrad"])
def test_sm90_fp4_exact_emulation(gemm_kind):
    a, b = operands("fp4", 257, 264, 1040, gemm_kind)
    y = gk.qgemm(a, b, out_dtype=torch.float32)
    assert gk.select_path(a, b, out_dtype=torch.float32).path == "sm90_fp4"
    check(y, a, b, "sm90_fp4")
    # mixed E4M3 x E2M1 operands also ride the FP8 kernel
    a8 = quantized(torch.randn(64, 512, device="cuda"), QuantSpec(E4M3))
    b4 = quantized(torch.randn(72, 512, device="cuda"), recipe("fp4").weight)
    assert gk.select_path(a8, b4).path == "sm90_fp4"
    check(gk.qgemm(a8, b4, out_dtype=torch.float32), a8, b4, "sm90_fp4")


@needs_sm90
@pytest.mark.parametrize("name", ["fp8", "fp4"])
def test_sm90_linear_layer_gemms_match_emulation(name):
    # The three GEMMs of a linear layer, RNE recipes: same operands as snip_ops.gemm (seed 0/offset 0
    # SR words for FP4 gradients are reproduced through gemm.operand_offset).
    r = recipe(name)
    g = torch.Generator(device="cuda").manual_seed(7)
    M, N, K = 512, 384, 640
    x, w, dy = (torch.randn(*s, device="cuda", generator=g) for s in ((M, K), (N, K), (M, N)))
    off = gemm.operand_offset
    pairs = {
        "fprop": (quantized(x, r.act, offset=off(0, "x")), quantized(w, r.weight, offset=off(0, "w")),
                  gemm.fprop(x, w, r, emulate=True)),
        "dgrad": (quantized(dy, r.grad, offset=off(0, "dy")),
                  quantized(w, r.weight, offset=off(0, "wt"), transpose=True), gemm.dgrad(dy, w, r, emulate=True)),
        "wgrad": (quantized(dy, r.grad, offset=off(0, "dyt"), transpose=True),
                  quantized(x, r.act, offset=off(0, "xt"), transpose=True), gemm.wgrad(dy, x, r, emulate=True)),
    }
    for kind, (a, b, emulated) in pairs.items():
        # the emulation is the fp32 path's GEMM of the same dequantized operands
        da, db = dequantize(a), dequantize(b)
        assert torch.equal(emulated, gemm.fp32_mm(da, db.t())), kind
        check(gk.qgemm(a, b, out_dtype=torch.float32), a, b, f"sm90_{name}", what=kind)


@needs_sm90
def test_sm90_nonfinite_propagates():
    x = torch.randn(256, 512, device="cuda")
    x[3, 300] = float("inf")
    x[100, 5] = float("nan")
    a, b = quantize(x, QuantSpec(E4M3)), quantize(torch.randn(128, 512, device="cuda"), QuantSpec(E4M3, (128, 128)))
    y = gk.qgemm(a, b, out_dtype=torch.float32, path="sm90_fp8")
    bad = torch.zeros(256, dtype=torch.bool, device="cuda")
    bad[[3, 100]] = True
    assert torch.isnan(y[bad]).all() and torch.isfinite(y[~bad]).all()


@needs_sm90
@pytest.mark.parametrize("name, gemm_kind, out_dtype", [("fp8", "fprop", torch.bfloat16), ("fp8", "wgrad", torch.float32),
                                                   ("fp8_e5m2grad", "dgrad", torch.bfloat16),
                                                   ("fp8_e5m2grad", "wgrad", torch.float32)])
@pytest.mark.parametrize("m, n, k", [(200, 264, 16), (200, 264, 128), (200, 264, 256), (200, 264, 384),
                                     (200, 264, 1040), (33, 72, 4096), (2048, 2176, 640)])
def test_sm90_overlapped_promotion_gives_the_serial_bits(name, gemm_kind, out_dtype, m, n, k):
    # The overlapped mainloop (csrc/gemm/sm90/overlapped_promotion_mainloop.cuh) against CUTLASS's, bit for
    # bit: 1, 2, 3 and 9 K tiles and a K tail (each branch of its loop: no step, one step after the pairs,
    # whole pairs), more output tiles than SMs (a CTA's second tile starts from a cleared accumulator),
    # the 2x1 cluster, bias, and accumulation into `out`.
    if name == "fp8_e5m2grad" and not _ext.kernel_available("fp8_gemm_nt_blockwise_e5m2", "cuda"):
        pytest.skip("the E5M2 kernel is not compiled, or failed its self-check, on this GPU")
    a, b = operands(name, m, n, k, gemm_kind)
    serial = gk.qgemm(a, b, out_dtype=out_dtype, path="sm90_fp8", config="tile=128x128,promotion=serial")
    multicast = (OVERLAPPED + ",cluster=2x1",) if (name, gemm_kind) == ("fp8", "fprop") else ()
    for config in (OVERLAPPED, OVERLAPPED + ",raster=n") + multicast:
        got = gk.qgemm(a, b, out_dtype=out_dtype, path="sm90_fp8", config=config)
        assert torch.equal(got.view(torch.uint8), serial.view(torch.uint8)), config
    if gemm_kind != "wgrad":
        bias = torch.randn(n, device="cuda")
        want = gk.qgemm(a, b, out_dtype=out_dtype, bias=bias, path="sm90_fp8", config="promotion=serial")
        got = gk.qgemm(a, b, out_dtype=out_dtype, bias=bias, path="sm90_fp8", config=OVERLAPPED)
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    else:
        want, got = (torch.randn(m, n, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
                     for _ in range(2))
        got.copy_(want)
        gk.qgemm(a, b, out=want, path="sm90_fp8", config="promotion=serial")
        gk.qgemm(a, b, out=got, path="sm90_fp8", config=OVERLAPPED)
        assert torch.equal(got, want)


@needs_sm90
@pytest.mark.parametrize("name, gemm_kind", [("fp8", "fprop"), ("fp8", "dgrad"), ("fp4", "fprop"), ("fp8", "wgrad")])
@pytest.mark.parametrize("m, n, k", [(200, 264, 1040), (33, 72, 4096), (2048, 2176, 640), (129, 448, 128),
                                     (1000, 384, 256), (4096, 4096, 512), (300, 14336, 384)])
def test_sm90_128x192_gives_the_128x128_bits(name, gemm_kind, m, n, k):
    # The 128x192 tiles against the 128x128 kernels, bit for bit, BF16 out: over weight blocks (their scales
    # repeated per row by the op, one read per 64-column third) and over wgrad's 1x128 blocks; N below, at and
    # between multiples of 192 and 128 (a tile starting inside a weight block, a last tile cut by N), one and
    # many K tiles, more tiles than SMs, bias, and accumulation into `out`.
    a, b = operands(name, m, n, k, gemm_kind)
    want = gk.qgemm(a, b, path=f"sm90_{name}", config="tile=128x128")
    for config in (WIDE, WIDE + ",raster=n", WIDE + ",raster=m,swizzle=2"):
        got = gk.qgemm(a, b, path=f"sm90_{name}", config=config)
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), config
    bias = torch.randn(n, device="cuda")
    want = gk.qgemm(a, b, bias=bias, path=f"sm90_{name}", config="tile=128x128")
    got = gk.qgemm(a, b, bias=bias, path=f"sm90_{name}", config=WIDE)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    for dtype in (torch.bfloat16, torch.float32) if gemm_kind == "wgrad" else (torch.bfloat16,):
        want = torch.randn(m, n, device="cuda").to(dtype)
        got = want.clone()
        gk.qgemm(a, b, out=want, path=f"sm90_{name}", config="tile=128x128")
        gk.qgemm(a, b, out=got, path=f"sm90_{name}", config=WIDE)
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), dtype
    if gemm_kind == "wgrad":  # FP32 output: the weight gradient of FP32 weights
        want = gk.qgemm(a, b, out_dtype=torch.float32, path=f"sm90_{name}", config="tile=128x128")
        got = gk.qgemm(a, b, out_dtype=torch.float32, path=f"sm90_{name}", config=WIDE)
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@needs_sm90
def test_sm90_deterministic_and_stream_safe():
    a, b = operands("fp8", 2048, 2048, 2048)
    y1 = gk.qgemm(a, b, path="sm90_fp8")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y2 = gk.qgemm(a, b, path="sm90_fp8")
    torch.cuda.current_stream().wait_stream(s)
    assert torch.equal(y1, y2)


@needs_sm90
def test_sm90_large():
    a, b = operands("fp8", 4096, 4096, 4096, spread=False)
    check(gk.qgemm(a, b, path="sm90_fp8"), a, b, "sm90_fp8", torch.bfloat16)


@needs_sm90
def test_sm90_op_refuses_misaligned_input_on_device():
    a, b = operands("fp8", 64, 64, 256)
    ca, sfa, cb, sfb, b_block, _ = gk.prepare_sm90(a, b)
    buf = torch.zeros(64 * 256 + 8, dtype=torch.uint8, device="cuda")
    shifted = buf[8:].view(64, 256).view(torch.float8_e4m3fn)  # starts 8 bytes past a 16-byte boundary
    shifted.copy_(ca)
    with pytest.raises(RuntimeError, match="16-byte aligned"):
        torch.ops.snip_C.fp8_gemm_nt_blockwise(shifted, sfa, cb, sfb, b_block, torch.bfloat16)


@pytest.mark.skipif(
    not torch.cuda.is_available() or _arch() == (9, 0)
    or not (_ext.HAS_KERNELS and "fp8_gemm_nt_blockwise" in _ext.kernels()),
    reason="needs a non-sm_90 GPU and the sm_90a GEMM compiled",
)
def test_sm90_op_refuses_other_archs():
    a, b = operands("fp8", 64, 64, 256)
    ca, sfa, cb, sfb, b_block, _ = gk.prepare_sm90(a, b)
    with pytest.raises(RuntimeError, match="compiled for sm_90a"):
        torch.ops.snip_C.fp8_gemm_nt_blockwise(ca, sfa, cb, sfb, b_block, torch.bfloat16)


# ---- Blackwell ----------------------------------------------------------------------------------


@needs_sm100
@pytest.mark.parametrize("kind", ["nvfp4", "mxfp4", "mxfp8"])
@pytest.mark.parametrize("m, n, k", [(128, 128, 256), (1, 8, 32), (33, 72, 160), (257, 264, 1056), (1000, 520, 4128)])
@pytest.mark.parametrize("gemm_kind", ["fprop", "dgrad", "wgrad"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_sm100_against_fp64(kind, m, n, k, gemm_kind, out_dtype):
    a, b = operands(kind, m, n, k, gemm_kind)
    assert gk.select_path(a, b, out_dtype=out_dtype).path == f"sm100_{kind}"
    check(gk.qgemm(a, b, out_dtype=out_dtype), a, b, f"sm100_{kind}", out_dtype)


@needs_sm100
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_sm100_bias_and_accumulate(out_dtype):
    check_bias(*operands("nvfp4", 200, 264, 512), "sm100_nvfp4", out_dtype)
    check_accumulate(*operands("mxfp8", 200, 264, 1056, "wgrad"), "sm100_mxfp8", out_dtype, 1)


@needs_sm100_fp8
@pytest.mark.parametrize("name", ["fp8", "fp8_e5m2grad", "fp4"])
@pytest.mark.parametrize("m, n, k", SHAPES)
@pytest.mark.parametrize("gemm_kind", ["fprop", "dgrad", "wgrad"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_sm100_fp8_blockwise_against_fp64(name, m, n, k, gemm_kind, out_dtype):
    # The FP8 blockwise op's tcgen05 kernels: FP32 scales per 1x128 (A) and 128x128 / 1x128 (B) block,
    # E4M3 or E5M2 A, E2M1 re-encoded as E4M3 for the fp4 recipe.
    a, b = operands(name, m, n, k, gemm_kind)
    path = "sm100_fp4" if name == "fp4" else "sm100_fp8"
    assert gk.select_path(a, b, out_dtype=out_dtype).path == path
    check(gk.qgemm(a, b, out_dtype=out_dtype), a, b, path, out_dtype)


@needs_sm100_fp8
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_sm100_fp8_blockwise_bias_and_accumulate(out_dtype):
    check_bias(*operands("fp8", 200, 264, 512), "sm100_fp8", out_dtype)
    check_accumulate(*operands("fp8_e5m2grad", 200, 264, 1040, "wgrad"), "sm100_fp8", out_dtype, 2)


# ---- the pure-PyTorch GPU paths ------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["mxfp8", "mxfp4", "nvfp4"])
def test_bf16_exact_path(name):
    a, b = operands(name, 257, 264, 1056)
    check(gk.qgemm(a, b, out_dtype=torch.float32, path="bf16_exact"), a, b, "bf16_exact")
    pow2 = QuantSpec(E2M1, (1, 128), ScaleKind.POW2)
    a, b = quantized(torch.randn(64, 384, device="cuda"), pow2), quantized(torch.randn(72, 384, device="cuda"), pow2)
    assert gk.select_path(a, b).path in ("bf16_exact", "sm90_fp4")
    check(gk.qgemm(a, b, out_dtype=torch.float32, path="bf16_exact"), a, b, "bf16_exact")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["fp8", "fp8_e5m2grad", "fp4", "mxfp8"])
@pytest.mark.parametrize("gemm_kind", ["fprop", "dgrad", "wgrad"])
def test_blockwise_bf16_path(name, gemm_kind):
    # The fallback where no kernel exists: BF16 tensor cores per K chunk, FP32 partial sums, never TF32.
    a, b = operands(name, 257, 264, 1040, gemm_kind)
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # TF32 allowed globally: the path must not care
    try:
        y = gk.qgemm(a, b, out_dtype=torch.float32, path="blockwise_bf16")
    finally:
        torch.set_float32_matmul_precision(prev)
    check(y, a, b, "blockwise_bf16")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fp64_fallback_warns_on_a_gpu():
    wide = QuantSpec(element_format("e5m10"), (1, 128))
    a = quantized(torch.randn(64, 256, device="cuda"), wide)
    b = quantized(torch.randn(72, 256, device="cuda"), wide)
    with pytest.warns(RuntimeWarning, match="no tensor-core path"):
        y = gk.qgemm(a, b, out_dtype=torch.float32)
    check(y, a, b, "fp32")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fp32_path_ignores_tf32_setting():
    a, b = operands("fp8", 257, 264, 1040)
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # TF32 allowed globally
    try:
        y = gk.qgemm(a, b, out_dtype=torch.float32, path="fp32")
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(prev)
    check(y, a, b, "fp32")
