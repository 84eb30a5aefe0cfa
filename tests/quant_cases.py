"""What the quantize kernels promise, in terms of the PyTorch reference, and the cases they are
checked on: shared by the GPU test (tests/ops/test_quant_kernels_gpu.py, snip_C::quantize on a
device), the host test (tests/ops/test_quant_kernels_host.py, the same kernels run on the CPU
through the host shim) and the CPU op's test (tests/ops/test_quantize_cpu_op.py, the op's host
implementation), so that all three hold the implementations to one statement of the expected
results and run the same cases; each test file picks the specs and sizes it runs them on.

`expected(...)`: each output is `reference.quantize` of x (or x^T) zero-padded along its inner
dimension to a multiple of `pad` (padding codes 0, padding-only blocks scale 1; SR bits keyed by
the unpadded index), scales optionally moved by `scale_layout.to_blackwell` (2-D blocks: one
scale per row) or `scale_layout.to_hopper`.

`QuantizeCases`: the cases, run on one implementation against `expected`."""

from __future__ import annotations

import pytest
import torch

from snip_ops import reference
from snip_ops import quantize as quantize_fn
from snip_ops.formats import E2M1, E4M3, E5M2, QuantSpec, Rounding, ScaleKind
from snip_ops.scale_layout import to_layout

OUTPUTS = ("codes", "scales", "codes_t", "scales_t", "tensor_scale")


def round_up(v, m):
    return -(-v // m) * m


def padded(q, spec, pad, scale_layout):
    """(codes, scales) of QTensor q as the op lays them out."""
    rows, inner = q.shape
    inner_p = round_up(inner, pad)
    width = -(-inner_p // 2) if spec.packed else inner_p
    codes = torch.zeros(rows, width, dtype=torch.uint8)
    c = q.codes.view(torch.uint8)
    codes[:, : c.shape[1]] = c
    br, bc = spec.block
    bits = torch.int32 if q.scales.element_size() == 4 else torch.uint8  # move bit patterns only
    s = torch.ones(q.scales.shape[0], -(-inner_p // bc)).to(q.scales.dtype).view(bits)
    s[:, : q.scales.shape[1]] = q.scales.view(bits)
    if scale_layout == "blackwell" and br > 1:  # the Blackwell layout holds a 2-D block's scale on each row
        s = s.repeat_interleave(br, dim=0)[:rows]
    return codes.view(q.codes.dtype), to_layout(s, scale_layout).view(q.scales.dtype)


def expected(x, spec, rowwise=True, colwise=False, seed=0, offset=0, offset_t=0, tensor_amax=None,
             scale_layout="plain", pad=1):
    """The five outputs of snip_C::quantize (None where the op returns an empty tensor)."""
    xc = x.cpu()
    ta = tensor_amax.cpu() if isinstance(tensor_amax, torch.Tensor) else tensor_amax
    out, ts = [], None
    for on, transpose, off in ((rowwise, False, offset), (colwise, True, offset_t)):
        if not on:
            out += [None, None]
            continue
        q = reference.quantize(xc, spec, seed=seed, offset=off, transpose=transpose, tensor_amax=ta)
        out += list(padded(q, spec, pad, scale_layout))
        ts = q.tensor_scale
    return (*out, ts)


def bits(t):
    t = t.contiguous()
    return t.reshape(-1).view(torch.int32 if t.element_size() == 4 else torch.uint8).cpu()


def assert_same(got, want, what):
    if want is None:
        assert got.numel() == 0, f"{what}: not requested, yet {tuple(got.shape)}"
        return
    assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape), (
        f"{what}: {got.dtype} {tuple(got.shape)} != {want.dtype} {tuple(want.shape)}")
    g, w = bits(got), bits(want)
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


def assert_outputs(got, x, spec, **kw):
    """The five outputs of a quantize kernel run against `expected(x, spec, **kw)`."""
    want = expected(x, spec, **kw)
    for name, g, w in zip(OUTPUTS, got, want):
        assert_same(g, w, f"{spec.describe()} {tuple(x.shape)} {x.dtype} {kw}: {name}")


def rand(shape, dtype=torch.bfloat16, seed=0, device="cpu"):
    """Normal data with random magnitudes per row and per column: blocks in both directions see
    many exponent ranges."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(shape, generator=g, device=device)
    r = torch.randint(-8, 9, (shape[0], 1), generator=g, device=device).float()
    c = torch.randint(-4, 5, (1, shape[1]), generator=g, device=device).float()
    return (x * torch.exp2(r + c)).to(dtype)


def edge_tensor(dtype, device="cpu"):
    x = rand((130, 288), torch.float32, seed=9, device=device)
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


# ---- the spec matrix ----

BLOCKS_1D = [(1, 16), (1, 32), (1, 128)]
BLOCKS_2D = [(16, 16), (128, 128)]


def specs(blocks, roundings=(Rounding.RNE, Rounding.SR)):
    out = []
    for elem in (E4M3, E5M2, E2M1):
        for block in blocks:
            for scale in (ScaleKind.FP32, ScaleKind.POW2, ScaleKind.E8M0, ScaleKind.NVFP4):
                if scale == ScaleKind.NVFP4 and elem != E2M1:
                    continue
                for rounding in roundings:
                    out.append(QuantSpec(elem, block, scale, rounding))
    return out


SPECS_1D = specs(BLOCKS_1D)
SPECS_2D = specs(BLOCKS_2D)
# The recipes' own operands first (formats.RECIPES): fp8, fp8 e5m2 grads, mxfp8, nvfp4, mxfp4, fp4.
RECIPE_SPECS = [
    QuantSpec(E4M3, (1, 128)), QuantSpec(E4M3, (128, 128)), QuantSpec(E5M2, (1, 128)),
    QuantSpec(E4M3, (1, 32), ScaleKind.E8M0), QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4),
    QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, Rounding.SR), QuantSpec(E2M1, (1, 32), ScaleKind.E8M0),
    QuantSpec(E2M1, (1, 32), ScaleKind.E8M0, Rounding.SR), QuantSpec(E2M1, (1, 128)),
    QuantSpec(E2M1, (128, 128)), QuantSpec(E2M1, (1, 128), rounding=Rounding.SR),
]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# The values and specs of single cases, the same on every implementation.
NON_FINITE = [float("nan"), float("inf"), float("-inf")]
NVFP4_SPECS = [QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4), QuantSpec(E2M1, (16, 16), ScaleKind.NVFP4),
               QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, Rounding.SR)]
TENSOR_AMAXES = [None, 0.0, 1e-30, 1e-42, 2.0**-149, 3.0, 1e6, float("inf"), float("nan")]
SR_SPECS = RECIPE_SPECS + [QuantSpec(E5M2, (1, 128), rounding=Rounding.SR)]
# The block-scaled operands of the Blackwell GEMMs: nvfp4, mxfp4, mxfp8.
BLACKWELL_SPECS = [QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, Rounding.SR), QuantSpec(E2M1, (16, 16), ScaleKind.NVFP4),
                   QuantSpec(E2M1, (1, 32), ScaleKind.E8M0, Rounding.SR), QuantSpec(E4M3, (1, 32), ScaleKind.E8M0)]
# The operands of the blockwise FP8 GEMMs, whose scales the quantizer can write MN-major ("hopper"): fp8's
# activations, 128x128 weights and E5M2 gradients, fp4's E2M1 on Hopper, power-of-two scales.
HOPPER_SPECS = [QuantSpec(E4M3, (1, 128)), QuantSpec(E4M3, (128, 128)), QuantSpec(E5M2, (1, 128), rounding=Rounding.SR),
                QuantSpec(E2M1, (1, 128), rounding=Rounding.SR), QuantSpec(E4M3, (1, 128), ScaleKind.POW2)]
PADDING_SPECS = RECIPE_SPECS + [QuantSpec(E5M2, (1, 16), ScaleKind.POW2, Rounding.SR)]
DEQUANTIZE_SPECS = SPECS_1D[::2] + SPECS_2D[::2] + RECIPE_SPECS


def ids(spec):
    return spec.describe()


# ---- the op's entry points ----


def snip_quantize(x, spec, rowwise=True, colwise=False, seed=0, offset=0, offset_t=0, tensor_amax=None,
                  scale_layout="plain", pad=1):
    """The five outputs of snip_C::quantize, called with the keywords of `expected`."""
    i64 = lambda v: v - 2**64 if v >= 2**63 else v  # noqa: E731  (the op takes int64: same bits)
    return torch.ops.snip_C.quantize(x, spec.describe(), rowwise, colwise, i64(seed), i64(offset), i64(offset_t),
                                     tensor_amax, scale_layout, pad)


def snip_dequantize(codes, scales, tensor_scale, spec, cols, out_dtype):
    return torch.ops.snip_C.dequantize(codes, scales, tensor_scale, spec.describe(), cols, out_dtype)


def dispatched(x, spec, parts=("codes", "scales"), **kw):
    """(snip_ops.quantize(x, spec, **kw), reference.quantize of the same), its `parts` the same bit for bit."""
    q = quantize_fn(x, spec, **kw)
    want = reference.quantize(x.cpu(), spec, **kw)
    for part in parts:
        assert_same(getattr(q, part), getattr(want, part), part)
    return q, want


def assert_2d_blocks_shared(spec, shape, codes, scales, codes_t, scales_t):
    """2-D blocks: one scale per block serves x and x^T, and with round to nearest even x^T's codes
    are x's codes transposed."""
    assert torch.equal(bits(scales_t), bits(scales.t()))
    if spec.rounding == Rounding.RNE:
        q = reference.QTensor(codes.cpu(), scales.cpu(), spec, tuple(shape))
        assert torch.equal(q.t().codes.view(torch.uint8), codes_t.cpu().view(torch.uint8))


# ---- the cases, on one implementation ----


class QuantizeCases:
    """The cases of the quantizer tests, on one implementation: `quantize(x, spec, **kw)` (the
    keywords of `expected`) returns its five outputs, `dequantize(codes, scales, tensor_scale, spec,
    cols, out_dtype)` its dequantized values; inputs are made on `device`. Where a case takes
    `rowwise_alone`, it also quantizes x row-wise without x^T, which with 1-D blocks takes the row
    kernel rather than the tile kernel."""

    def __init__(self, quantize, dequantize, device="cpu"):
        self.quantize, self.dequantize, self.device = quantize, dequantize, device

    def rand(self, shape, dtype=torch.bfloat16, seed=0):
        return rand(shape, dtype, seed, self.device)

    def check(self, x, spec, **kw):
        """Runs the implementation and compares all five outputs with `expected`."""
        got = self.quantize(x, spec, **kw)
        assert_outputs(got, x, spec, **kw)
        return got

    def rowwise(self, spec, shape):
        self.check(self.rand(shape, seed=shape[0] * 7919 + shape[1]), spec, seed=11, offset=5)

    def colwise(self, spec, shape):
        self.check(self.rand(shape, seed=shape[0] + shape[1]), spec, rowwise=False, colwise=True, seed=3, offset_t=77)

    def rowwise_then_fused(self, x, spec):
        self.check(x, spec, seed=11, offset=5)
        self.check(x, spec, colwise=True, seed=11, offset=5, offset_t=6)

    def fused(self, spec, shape):
        """The outputs of the first fused call."""
        # Different offsets: two Philox streams; equal offsets (a linear layer's t and t^T): one shared.
        x = self.rand(shape, seed=shape[0] * 31 + shape[1])
        got = self.check(x, spec, colwise=True, seed=2**40 + 3, offset=8, offset_t=13)
        if spec.rounding == Rounding.SR:
            self.check(x, spec, colwise=True, seed=9, offset=21, offset_t=21)
        return got

    def two_d_blocks_shared(self, spec, shape):
        codes, scales, codes_t, scales_t, _ = self.check(self.rand(shape, seed=5), spec, colwise=True, offset=1,
                                                         offset_t=1)
        assert_2d_blocks_shared(spec, shape, codes, scales, codes_t, scales_t)

    def input_dtypes(self, spec, dtype):
        for shape in ((7, 129), (64, 256)):
            self.check(self.rand(shape, dtype, seed=1), spec, colwise=True, seed=4, offset=2, offset_t=3)
            self.check(self.rand(shape, dtype, seed=2), spec, seed=4, offset=2)

    def edge_values(self, spec, dtype, rowwise_alone=True):
        self.check(edge_tensor(dtype, self.device), spec, colwise=True, seed=1, offset=2, offset_t=3)
        if rowwise_alone:
            self.check(edge_tensor(dtype, self.device), spec, seed=1, offset=2)

    def non_finite_blocks(self, spec, bad, rowwise_alone=False):
        # NaN/Inf blocks get a NaN scale and zero codes, in both directions; for nvfp4 the tensor amax
        # is non-finite too, so every block is NaN -- unless the caller passes a finite amax.
        x = self.rand((130, 300), seed=5)
        x[0, 3] = bad
        x[2, 299] = bad
        x[129, 130] = bad
        self.check(x, spec, colwise=True, seed=1, offset=4, offset_t=4)
        if rowwise_alone:
            self.check(x, spec, seed=1, offset=4)
        if spec.scale == ScaleKind.NVFP4:
            self.check(x, spec, colwise=True, tensor_amax=torch.tensor(1e3, device=self.device))

    def round_to_nearest_even_ties(self, elem, rowwise_alone=False):
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
        x = torch.stack([row, -row]).to(self.device)
        for spec in (QuantSpec(elem, (1, 128)), QuantSpec(elem, (1, 16)), QuantSpec(elem, (1, 32))):
            self.check(x, spec, colwise=True)
            if rowwise_alone:
                self.check(x, spec)

    def nvfp4_tensor_amax(self, spec, amax, rowwise_alone=False):
        """The input, for the caller's checks of the dispatcher."""
        x = self.rand((70, 160), seed=8)
        ta = None if amax is None else torch.tensor(amax, device=self.device)
        self.check(x, spec, colwise=True, tensor_amax=ta, seed=3, offset=1, offset_t=2)
        if rowwise_alone:
            self.check(x, spec, tensor_amax=ta, seed=3, offset=1)
        return x

    def nvfp4_element_scale_underflow(self):
        x = torch.zeros(1, 16, device=self.device)
        x[0, 0] = 2.0**-149
        self.check(x, QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4))

    def sr_determinism_and_offsets(self, spec):
        spec = spec.with_rounding(Rounding.SR)
        x = self.rand((96, 640), seed=12)
        a = self.quantize(x, spec, colwise=True, seed=5, offset=7, offset_t=9)
        b = self.quantize(x, spec, colwise=True, seed=5, offset=7, offset_t=9)
        for u, v in zip(a, b):
            assert torch.equal(bits(u), bits(v))
        c = self.quantize(x, spec, colwise=True, seed=5, offset=8, offset_t=9)
        assert not torch.equal(bits(a[0]), bits(c[0])) and torch.equal(bits(a[2]), bits(c[2]))
        d = self.quantize(x, spec, colwise=True, seed=6, offset=7, offset_t=9)
        assert not torch.equal(bits(a[0]), bits(d[0])) and not torch.equal(bits(a[2]), bits(d[2]))
        self.sr_64_bit_offsets(x, spec)

    def sr_64_bit_offsets(self, x, spec, rowwise_alone=False):
        # 64-bit seeds and offsets: the high halves reach the Philox key and counter
        for seed, off in ((2**32 + 1, 3), (7, 2**32 + 3), (2**64 - 1, 2**63 + 11)):
            self.check(x, spec, colwise=True, seed=seed, offset=off, offset_t=off + 1)
            if rowwise_alone:
                self.check(x, spec, seed=seed, offset=off)

    def sr_transposed_output_uses_the_elements_own_words(self):
        # With the same offset, SR of x^T draws for element (r, c) the word of x's index r * K + c:
        # so with a 2-D block (same scale both ways), x^T's codes are x's codes transposed.
        spec = QuantSpec(E2M1, (128, 128), rounding=Rounding.SR)
        x = self.rand((256, 384), seed=13)
        codes, scales, codes_t, _, _ = self.quantize(x, spec, colwise=True, seed=1, offset=2, offset_t=2)
        q = reference.QTensor(codes.cpu(), scales.cpu(), spec, (256, 384))
        assert torch.equal(q.t().codes, codes_t.cpu())

    def scale_layout(self, spec, shape, pad, layout):
        """Both outputs, and the row output alone where the row-wise kernel takes it (1-D blocks)."""
        x = self.rand(shape, seed=3)
        self.check(x, spec, colwise=True, scale_layout=layout, pad=pad, seed=1, offset=3, offset_t=4)
        if spec.block[0] == 1:
            self.check(x, spec, scale_layout=layout, pad=pad, seed=1, offset=3)

    def padding(self, spec, pad, shapes):
        for shape in shapes:
            self.check(self.rand(shape, seed=4), spec, pad=pad, seed=2, offset=6)
            self.check(self.rand(shape, seed=4), spec, colwise=True, pad=pad, seed=2, offset=6, offset_t=7)

    def strided_rows_and_unaligned_views(self, spec, rowwise_alone=False):
        wide = self.rand((70, 1100), seed=6)
        self.check(wide[:, 3:1027], spec, colwise=True, seed=1, offset=1, offset_t=2)  # row stride 1100, odd start
        if rowwise_alone:
            self.check(wide[:, 3:1027], spec, seed=1, offset=1)
        self.check(wide[:, :1024], spec, seed=1, offset=1)                              # aligned, row stride 1100
        flat = self.rand((1, 8 * 256 + 1), seed=7)[0]
        self.check(flat[1:].view(8, 256), spec, colwise=True)                           # contiguous, misaligned base
        if rowwise_alone:
            self.check(flat[1:].view(8, 256), spec)

    def non_unit_inner_stride(self, spec):
        x = self.rand((256, 96), seed=8).t()  # [96, 256] with stride (1, 96)
        with pytest.raises(RuntimeError, match="unit stride"):
            self.quantize(x, spec)
        dispatched(x, spec, seed=1, offset=2)  # the dispatcher copies

    def empty(self, spec, shape):
        x = torch.empty(shape, dtype=torch.bfloat16, device=self.device)
        self.check(x, spec, colwise=True)
        if spec.scale == ScaleKind.NVFP4:
            self.check(x, spec, colwise=True, tensor_amax=torch.tensor(5.0, device=self.device))

    def dequantize_padded_codes(self):
        spec = QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, Rounding.SR)
        x = self.rand((9, 70), seed=2)
        codes, scales, _, _, ts = self.quantize(x, spec, pad=128, seed=1, offset=1)
        got = self.dequantize(codes, scales, ts, spec, 70, torch.float32)
        q = reference.quantize(x.cpu(), spec, seed=1, offset=1)
        assert_same_values(got, reference.dequantize(q), "dequantize of padded codes")
