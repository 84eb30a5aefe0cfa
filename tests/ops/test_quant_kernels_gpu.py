"""snip_C::quantize / snip_C::dequantize against the PyTorch reference (run on the CPU, the oracle),
bit for bit: every kernel-backed spec, row-wise / column-wise / fused outputs, odd shapes, edge
values, SR determinism and offsets, padding, the Blackwell scale layout, and the dispatcher.

`expected(...)` states what the op promises in terms of the reference: each output is
`reference.quantize` of x (or x^T) zero-padded along its inner dimension to a multiple of `pad`
(padding codes 0, padding-only blocks scale 1; SR bits keyed by the unpadded index), scales
optionally permuted by `scale_layout.to_blackwell` (2-D blocks: one scale per row)."""

import pytest
import torch

from snip_ops import _ext, reference
from snip_ops import quantize as quantize_fn
from snip_ops.formats import E2M1, E4M3, E5M2, QuantSpec, Rounding, ScaleKind
from snip_ops.quantize import dequantize as dequantize_fn, quantize_rowcol
from snip_ops.scale_layout import to_blackwell

pytestmark = pytest.mark.gpu
DEV = "cuda"


@pytest.fixture(autouse=True)
def _needs_kernel():
    for op in ("quantize", "dequantize"):
        if not _ext.kernel_available(op, DEV):
            pytest.skip(f"{op} not compiled for this GPU: {_ext.build_info()}")


def op_quantize(*args):
    return torch.ops.snip_C.quantize(*args)


def op_dequantize(*args):
    return torch.ops.snip_C.dequantize(*args)


# ---- what the op promises, from the reference ----


def _round_up(v, m):
    return -(-v // m) * m


def _padded(q, spec, pad, blackwell):
    """(codes, scales) of QTensor q as the op lays them out."""
    rows, inner = q.shape
    inner_p = _round_up(inner, pad)
    width = -(-inner_p // 2) if spec.packed else inner_p
    codes = torch.zeros(rows, width, dtype=torch.uint8)
    c = q.codes.view(torch.uint8)
    codes[:, : c.shape[1]] = c
    br, bc = spec.block
    bits = torch.int32 if q.scales.element_size() == 4 else torch.uint8  # move bit patterns only
    s = torch.ones(q.scales.shape[0], -(-inner_p // bc)).to(q.scales.dtype).view(bits)
    s[:, : q.scales.shape[1]] = q.scales.view(bits)
    if blackwell:
        s = to_blackwell(s.repeat_interleave(br, dim=0)[:rows] if br > 1 else s)
    return codes.view(q.codes.dtype), s.view(q.scales.dtype)


def expected(x, spec, rowwise=True, colwise=False, seed=0, offset=0, offset_t=0, tensor_amax=None,
             blackwell=False, pad=1):
    xc = x.cpu()
    ta = tensor_amax.cpu() if isinstance(tensor_amax, torch.Tensor) else tensor_amax
    out, ts = [], None
    for on, transpose, off in ((rowwise, False, offset), (colwise, True, offset_t)):
        if not on:
            out += [None, None]
            continue
        q = reference.quantize(xc, spec, seed=seed, offset=off, transpose=transpose, tensor_amax=ta)
        out += list(_padded(q, spec, pad, blackwell))
        ts = q.tensor_scale
    return (*out, ts)


def kernel(x, spec, rowwise=True, colwise=False, seed=0, offset=0, offset_t=0, tensor_amax=None, blackwell=False,
           pad=1):
    i64 = lambda v: v - 2**64 if v >= 2**63 else v  # noqa: E731  (the op takes int64: same bits)
    return op_quantize(x, spec.describe(), rowwise, colwise, i64(seed), i64(offset), i64(offset_t), tensor_amax,
                       blackwell, pad)


def _bits(t):
    t = t.contiguous()
    return t.reshape(-1).view(torch.int32 if t.element_size() == 4 else torch.uint8).cpu()


def assert_same(got, want, what, x=None):
    if want is None:
        assert got.numel() == 0, f"{what}: not requested, yet {tuple(got.shape)}"
        return
    assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape), (
        f"{what}: {got.dtype} {tuple(got.shape)} != {want.dtype} {tuple(want.shape)}")
    g, w = _bits(got), _bits(want)
    bad = (g != w).nonzero()
    if bad.numel():
        i = int(bad[0])
        where = [int(v) for v in torch.unravel_index(torch.tensor(i), tuple(want.shape))] if want.dim() else []
        raise AssertionError(f"{what}: {len(bad)} of {w.numel()} differ, first at {where}: "
                             f"kernel {int(g[i]):#x} reference {int(w[i]):#x}")


def assert_same_values(got, want, what):
    """Equal float values, NaN matching NaN: NaN payloads differ between the CPU and CUDA."""
    assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape), what
    g, w = got.cpu(), want.cpu()
    nan_g, nan_w = torch.isnan(g), torch.isnan(w)
    assert torch.equal(nan_g, nan_w), f"{what}: NaN positions differ"
    assert_same(torch.where(nan_g, 0, g), torch.where(nan_w, 0, w), what)


def check(x, spec, **kw):
    """Runs the op and compares all five outputs with `expected`."""
    got = kernel(x, spec, **kw)
    want = expected(x, spec, **kw)
    for name, g, w in zip(("codes", "scales", "codes_t", "scales_t", "tensor_scale"), got, want):
        assert_same(g, w, f"{spec.describe()} {tuple(x.shape)} {x.dtype} {kw}: {name}")
    return got


def rand(shape, dtype=torch.bfloat16, seed=0):
    """Normal data with random magnitudes per row and per column: blocks in both directions see
    many exponent ranges."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(shape, generator=g, device=DEV)
    r = torch.randint(-8, 9, (shape[0], 1), generator=g, device=DEV).float()
    c = torch.randint(-4, 5, (1, shape[1]), generator=g, device=DEV).float()
    return (x * torch.exp2(r + c)).to(dtype)


# ---- the spec matrix ----

BLOCKS_1D = [(1, 16), (1, 32), (1, 128)]
BLOCKS_2D = [(16, 16), (128, 128)]


def _specs(blocks, roundings=(Rounding.RNE, Rounding.SR)):
    out = []
    for elem in (E4M3, E5M2, E2M1):
        for block in blocks:
            for scale in (ScaleKind.FP32, ScaleKind.POW2, ScaleKind.E8M0, ScaleKind.NVFP4):
                if scale == ScaleKind.NVFP4 and elem != E2M1:
                    continue
                for rounding in roundings:
                    out.append(QuantSpec(elem, block, scale, rounding))
    return out


SPECS_1D = _specs(BLOCKS_1D)
SPECS_2D = _specs(BLOCKS_2D)
# The recipes' own operands first (formats.RECIPES): fp8, fp8 e5m2 grads, mxfp8, nvfp4, mxfp4, fp4.
RECIPE_SPECS = [
    QuantSpec(E4M3, (1, 128)), QuantSpec(E4M3, (128, 128)), QuantSpec(E5M2, (1, 128)),
    QuantSpec(E4M3, (1, 32), ScaleKind.E8M0), QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4),
    QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, Rounding.SR), QuantSpec(E2M1, (1, 32), ScaleKind.E8M0),
    QuantSpec(E2M1, (1, 32), ScaleKind.E8M0, Rounding.SR), QuantSpec(E2M1, (1, 128)),
    QuantSpec(E2M1, (128, 128)), QuantSpec(E2M1, (1, 128), rounding=Rounding.SR),
]
ids = lambda s: s.describe()  # noqa: E731
# K % 16 == 0 takes the vector paths, odd K the scalar ones and per-element Philox (K % 4 != 0);
# M and K around tile (128) and block edges. Every spec runs on SHAPES, the recipes' specs also on
# BIG_SHAPES (the CPU reference, ~0.1-1 us per element, bounds the sizes).
SHAPES = [(1, 1), (3, 130), (7, 129), (5, 16), (33, 1000), (130, 257)]
BIG_SHAPES = [(64, 4096), (257, 384), (300, 1040)]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.mark.parametrize("spec", SPECS_1D, ids=ids)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rowwise(spec, shape):
    check(rand(shape, seed=shape[0] * 7919 + shape[1]), spec, seed=11, offset=5)


@pytest.mark.parametrize("spec", SPECS_1D + SPECS_2D, ids=ids)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_colwise(spec, shape):
    check(rand(shape, seed=shape[0] + shape[1]), spec, rowwise=False, colwise=True, seed=3, offset_t=77)


@pytest.mark.parametrize("spec", RECIPE_SPECS, ids=ids)
@pytest.mark.parametrize("shape", BIG_SHAPES, ids=str)
def test_recipe_specs_bigger_shapes(spec, shape):
    x = rand(shape, seed=shape[0] * 3 + shape[1])
    check(x, spec, seed=11, offset=5)
    check(x, spec, colwise=True, seed=11, offset=5, offset_t=6)


@pytest.mark.parametrize("spec", SPECS_1D + SPECS_2D, ids=ids)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rowwise_and_colwise_fused(spec, shape):
    # Different offsets (the GEMMs' operand ids): two Philox streams; equal offsets: one shared.
    x = rand(shape, seed=shape[0] * 31 + shape[1])
    check(x, spec, colwise=True, seed=2**40 + 3, offset=8, offset_t=13)
    if spec.rounding == Rounding.SR:
        check(x, spec, colwise=True, seed=9, offset=21, offset_t=21)


@pytest.mark.parametrize("spec", SPECS_2D, ids=ids)
@pytest.mark.parametrize("shape", [(7, 129), (130, 257), (256, 384)], ids=str)
def test_2d_blocks_rowwise_and_shared_scales(spec, shape):
    x = rand(shape, seed=5)
    codes, scales, codes_t, scales_t, _ = check(x, spec, colwise=True, offset=1, offset_t=1)
    assert torch.equal(scales_t.view(torch.uint8 if scales.element_size() == 1 else torch.int32),
                       scales.t().contiguous().view(torch.uint8 if scales.element_size() == 1 else torch.int32))
    if spec.rounding == Rounding.RNE:  # w^T's codes are w's codes transposed
        q = reference.QTensor(codes.cpu(), scales.cpu(), spec, tuple(shape))
        assert torch.equal(q.t().codes.view(torch.uint8), codes_t.cpu().view(torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("spec", RECIPE_SPECS, ids=ids)
def test_input_dtypes(dtype, spec):
    for shape in ((7, 129), (64, 256)):
        check(rand(shape, dtype, seed=1), spec, colwise=True, seed=4, offset=2, offset_t=3)
        check(rand(shape, dtype, seed=2), spec, seed=4, offset=2)


@pytest.mark.parametrize("spec", [QuantSpec(E4M3, (1, 128)), QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, Rounding.SR)],
                         ids=ids)
def test_large(spec):
    # Many CTAs, and a grid larger than one wave on every GPU.
    x = rand((2048, 2048), seed=1)
    check(x, spec, colwise=True, seed=1, offset=2, offset_t=5)


# ---- edge values ----


def edge_tensor(dtype):
    x = rand((130, 288), torch.float32, seed=9)
    specials = torch.tensor([0.0, -0.0, 1e-45, -1e-45, 1e-40, 1e-38, 2.0**-126, 3e38, -3e38, 448.0, 464.0, 6.0, 7.0,
                             5.0, 0.25, 0.75, 57344.0, 61440.0, 1e-30, -1e-30])
    x[0, : specials.numel()] = specials
    x[1, : specials.numel()] = -specials
    x[2] = 0.0                                  # zero blocks: scale 1
    x[3, ::2] = -0.0                            # signed zeros: code 0x80 / 0x8
    x[4] = 1e-44                                # amax / max_finite underflows: scale 2^-149
    x[5] = torch.arange(288).float() * 2.0**-140
    x[6:, 7] = 1e-38                            # a column of tiny values next to normal ones
    x[:, 40] = 0.0                              # a zero column: zero column blocks
    return x.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("spec", SPECS_1D + SPECS_2D, ids=ids)
def test_edge_values(dtype, spec):
    check(edge_tensor(dtype), spec, colwise=True, seed=1, offset=2, offset_t=3)
    check(edge_tensor(dtype), spec, seed=1, offset=2)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=str)
@pytest.mark.parametrize("spec", SPECS_1D + SPECS_2D, ids=ids)
def test_non_finite_blocks(bad, spec):
    # NaN/Inf blocks get a NaN scale and zero codes, in both directions; for nvfp4 the tensor amax
    # is non-finite too, so every block is NaN -- unless the caller passes a finite amax.
    x = rand((130, 300), seed=5)
    x[0, 3] = bad
    x[2, 299] = bad
    x[129, 130] = bad
    check(x, spec, colwise=True, seed=1, offset=4, offset_t=4)
    if spec.scale == ScaleKind.NVFP4:
        check(x, spec, colwise=True, tensor_amax=torch.tensor(1e3, device=DEV))


@pytest.mark.parametrize("elem", [E4M3, E5M2, E2M1], ids=lambda e: e.name)
def test_round_to_nearest_even_ties(elem):
    # A block whose amax is max_finite has scale exactly 1 (FP32 scale), so the midpoints between
    # neighbouring representable values are ties after the division: each must go to the even code.
    n = {"e4m3": 127, "e5m2": 124, "e2m1": 8}[elem.name]
    if elem == E2M1:
        vals = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    else:
        dt = torch.float8_e4m3fn if elem == E4M3 else torch.float8_e5m2
        vals = torch.arange(n, dtype=torch.uint8).view(dt).float()
    mids = (vals[:-1] + vals[1:]) / 2
    row = torch.cat([vals[-1:], mids])
    row = torch.nn.functional.pad(row, (0, -row.numel() % 128))
    x = torch.stack([row, -row]).to(DEV)
    for spec in (QuantSpec(elem, (1, 128)), QuantSpec(elem, (1, 16)), QuantSpec(elem, (1, 32))):
        check(x, spec, colwise=True)


# ---- NVFP4's tensor scale ----


@pytest.mark.parametrize("spec", [QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4), QuantSpec(E2M1, (16, 16), ScaleKind.NVFP4),
                                  QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, Rounding.SR)], ids=ids)
@pytest.mark.parametrize("amax", [None, 0.0, 1e-30, 1e-42, 2.0**-149, 3.0, 1e6, float("inf"), float("nan")], ids=str)
def test_nvfp4_tensor_amax(spec, amax):
    x = rand((70, 160), seed=8)
    ta = None if amax is None else torch.tensor(amax, device=DEV)
    check(x, spec, colwise=True, tensor_amax=ta, seed=3, offset=1, offset_t=2)
    if amax is not None:  # a Python float and a CPU tensor work as well (through the dispatcher)
        q = quantize_fn(x, spec, tensor_amax=amax)
        want = reference.quantize(x.cpu(), spec, tensor_amax=amax)
        assert_same(q.codes, want.codes, "codes")
        assert_same(q.tensor_scale, want.tensor_scale, "tensor_scale")


def test_nvfp4_element_scale_underflow():
    x = torch.zeros(1, 16, device=DEV)
    x[0, 0] = 2.0**-149
    check(x, QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4))


# ---- SR: determinism and offsets ----


@pytest.mark.parametrize("spec", RECIPE_SPECS + [QuantSpec(E5M2, (1, 128), rounding=Rounding.SR)], ids=ids)
def test_sr_determinism_and_offsets(spec):
    spec = spec.with_rounding(Rounding.SR)
    x = rand((96, 640), seed=12)
    a = kernel(x, spec, colwise=True, seed=5, offset=7, offset_t=9)
    b = kernel(x, spec, colwise=True, seed=5, offset=7, offset_t=9)
    for u, v in zip(a, b):
        assert torch.equal(_bits(u), _bits(v))
    c = kernel(x, spec, colwise=True, seed=5, offset=8, offset_t=9)
    assert not torch.equal(_bits(a[0]), _bits(c[0])) and torch.equal(_bits(a[2]), _bits(c[2]))
    d = kernel(x, spec, colwise=True, seed=6, offset=7, offset_t=9)
    assert not torch.equal(_bits(a[0]), _bits(d[0])) and not torch.equal(_bits(a[2]), _bits(d[2]))
    # 64-bit seeds and offsets: the high halves reach the Philox key and counter
    for seed, off in ((2**32 + 1, 3), (7, 2**32 + 3), (2**64 - 1, 2**63 + 11)):
        check(x, spec, colwise=True, seed=seed, offset=off, offset_t=off + 1)


def test_sr_transposed_output_uses_the_elements_own_words():
    # With the same offset, SR of x^T draws for element (r, c) the word of x's index r * K + c:
    # so with a 2-D block (same scale both ways), x^T's codes are x's codes transposed.
    spec = QuantSpec(E2M1, (128, 128), rounding=Rounding.SR)
    x = rand((256, 384), seed=13)
    codes, scales, codes_t, _, _ = kernel(x, spec, colwise=True, seed=1, offset=2, offset_t=2)
    q = reference.QTensor(codes.cpu(), scales.cpu(), spec, (256, 384))
    assert torch.equal(q.t().codes, codes_t.cpu())


# ---- layouts: padding, Blackwell scale factors ----


@pytest.mark.parametrize("spec", [QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, Rounding.SR),
                                  QuantSpec(E2M1, (16, 16), ScaleKind.NVFP4),
                                  QuantSpec(E2M1, (1, 32), ScaleKind.E8M0, Rounding.SR),
                                  QuantSpec(E4M3, (1, 32), ScaleKind.E8M0)], ids=ids)
@pytest.mark.parametrize("shape", [(1, 16), (100, 200), (128, 256), (300, 1000), (257, 64)], ids=str)
@pytest.mark.parametrize("pad", [1, 32, 128])
def test_blackwell_scale_layout(spec, shape, pad):
    check(rand(shape, seed=3), spec, colwise=True, blackwell=True, pad=pad, seed=1, offset=3, offset_t=4)
    if spec.block[0] == 1:
        check(rand(shape, seed=3), spec, blackwell=True, pad=pad, seed=1, offset=3)


@pytest.mark.parametrize("spec", RECIPE_SPECS + [QuantSpec(E5M2, (1, 16), ScaleKind.POW2, Rounding.SR)], ids=ids)
@pytest.mark.parametrize("pad", [16, 32, 128])
def test_padding(spec, pad):
    for shape in ((7, 129), (130, 250), (64, 256)):
        check(rand(shape, seed=4), spec, pad=pad, seed=2, offset=6)
        check(rand(shape, seed=4), spec, colwise=True, pad=pad, seed=2, offset=6, offset_t=7)


# ---- shapes and strides ----


@pytest.mark.parametrize("spec", RECIPE_SPECS, ids=ids)
def test_strided_rows_and_unaligned_views(spec):
    wide = rand((70, 1100), seed=6)
    check(wide[:, 3:1027], spec, colwise=True, seed=1, offset=1, offset_t=2)  # row stride 1100, odd start
    check(wide[:, :1024], spec, seed=1, offset=1)                              # aligned, row stride 1100
    flat = rand((1, 8 * 256 + 1), seed=7)[0]
    check(flat[1:].view(8, 256), spec, colwise=True)                           # contiguous, misaligned base


@pytest.mark.parametrize("spec", RECIPE_SPECS, ids=ids)
def test_non_unit_inner_stride(spec):
    x = rand((256, 96), seed=8).t()  # [96, 256] with stride (1, 96)
    with pytest.raises(RuntimeError, match="unit stride"):
        kernel(x, spec)
    q = quantize_fn(x, spec, seed=1, offset=2)  # the dispatcher copies
    want = reference.quantize(x.cpu(), spec, seed=1, offset=2)
    assert_same(q.codes, want.codes, "codes")
    assert_same(q.scales, want.scales, "scales")


@pytest.mark.parametrize("spec", RECIPE_SPECS, ids=ids)
@pytest.mark.parametrize("shape", [(0, 0), (0, 256), (5, 0)], ids=str)
def test_empty(spec, shape):
    x = torch.empty(shape, dtype=torch.bfloat16, device=DEV)
    check(x, spec, colwise=True)
    if spec.scale == ScaleKind.NVFP4:
        check(x, spec, colwise=True, tensor_amax=torch.tensor(5.0, device=DEV))


def test_runs_on_current_stream():
    x = rand((128, 1024), seed=7)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    spec = QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, Rounding.SR)
    with torch.cuda.stream(s):
        got = kernel(x, spec, colwise=True, seed=1, offset=2, offset_t=3)
    s.synchronize()
    want = expected(x, spec, colwise=True, seed=1, offset=2, offset_t=3)
    for g, w in zip(got, want):
        assert_same(g, w, "output")


# ---- dequantize ----


@pytest.mark.parametrize("spec", SPECS_1D[::2] + SPECS_2D[::2] + RECIPE_SPECS, ids=ids)
@pytest.mark.parametrize("out", [torch.float32, torch.bfloat16], ids=str)
def test_dequantize(spec, out):
    for shape in ((7, 129), (130, 256)):
        x = edge_tensor(torch.float32)[: shape[0], : shape[1]].to(DEV) if shape[1] <= 288 else rand(shape)
        x[1, 0] = float("nan")  # a NaN block dequantizes to NaN
        q = quantize_fn(x, spec, seed=1, offset=2)
        got = dequantize_fn(q, out)
        want = reference.dequantize(reference.QTensor(q.codes.cpu(), q.scales.cpu(), spec, q.shape,
                                                      None if q.tensor_scale is None else q.tensor_scale.cpu()))
        assert_same_values(got, want.to(out), f"dequantize {spec.describe()} {shape}")


def test_dequantize_padded_codes():
    spec = QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, Rounding.SR)
    x = rand((9, 70), seed=2)
    codes, scales, _, _, ts = kernel(x, spec, pad=128, seed=1, offset=1)
    got = op_dequantize(codes, scales, ts, spec.describe(), 70, torch.float32)
    q = reference.quantize(x.cpu(), spec, seed=1, offset=1)
    assert_same_values(got, reference.dequantize(q), "dequantize of padded codes")


# ---- the dispatcher on CUDA tensors ----


@pytest.mark.parametrize("spec", RECIPE_SPECS, ids=ids)
def test_dispatcher_uses_the_kernel_and_matches(spec):
    x = rand((65, 300), seed=10)
    for transpose in (False, True):
        q = quantize_fn(x, spec, seed=3, offset=4, transpose=transpose)
        want = reference.quantize(x.cpu(), spec, seed=3, offset=4, transpose=transpose)
        assert q.codes.device == x.device and q.shape == want.shape
        assert_same(q.codes, want.codes, "codes")
        assert_same(q.scales, want.scales, "scales")
    row, col = quantize_rowcol(x, spec, seed=3, offset=4, offset_t=5)
    assert_same(row.codes, reference.quantize(x.cpu(), spec, seed=3, offset=4).codes, "row codes")
    assert_same(col.codes, reference.quantize(x.cpu(), spec, seed=3, offset=5, transpose=True).codes, "col codes")
    with pytest.raises(ValueError, match="NaN or Inf"):
        quantize_fn(torch.full((4, 128), float("nan"), device=DEV), spec, checked=True)


def test_bandwidth_sanity():
    # Not a benchmark (bench/bench_quant.py is): catches a gross regression, e.g. the scalar path
    # on aligned input. H100/H200/B200 all move > 2 TB/s; the fp8 row-wise kernel must beat 1 TB/s.
    x = rand((8192, 8192), seed=1)
    spec = QuantSpec(E4M3, (1, 128))
    for _ in range(3):
        kernel(x, spec)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        kernel(x, spec)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / 20
    moved = x.numel() * (2 + 1) + x.numel() // 128 * 4
    assert moved / seconds > 1.0e12, f"{moved / seconds / 1e9:.0f} GB/s"
