"""Pure-PyTorch quantization: the exact semantics every CUDA kernel reproduces.

`quantize(x, spec)` turns a 2-D tensor [rows, cols] (cols = the GEMM's reduction dimension) into
codes plus block scales; `dequantize(q)` maps them back to float32; `fake_quantize` returns the same
values as `dequantize(quantize(...))` without materialising codes (used by GEMM emulation).

Scale choice (docs/design.md §1), with amax the block's max |x| in float32:
  * FP32:  s = amax / max_finite (IEEE float32 division, by a tensor: see `divide_by`);
  * POW2:  the smallest power of two >= that s, over float32's whole range (2^-149..2^127);
  * E8M0:  the POW2 value, at least 2^-127 (E8M0's smallest, code 0), stored as a biased exponent
           byte (no saturation of the block's amax, unlike the OCP floor(log2(amax)) - emax rule);
  * NVFP4: tensor scale t = tensor_amax / (448 * 6); block scale b = e4m3_rne(amax / (t * 6)), at
           least the smallest E4M3 subnormal; the element scale is s = b * t (float32 product). When
           that product underflows to 0 (a tensor scale near 2^-149) s is +Inf instead, so the block's
           codes are 0 and it dequantizes to 0 = code * b * t, never to NaN.
An all-zero block gets scale 1; a scale that underflows to 0 (subnormal amax) becomes the
smallest positive float32, 2^-149 (E8M0: 2^-127). A block whose amax is NaN or Inf gets a NaN scale and all-zero codes,
so it dequantizes to NaN: non-finite input never turns into finite numbers. Elements are
`round_to_format(x / s)` (true division, saturating). SR bits come from `philox.element_bits`, the
index of an element being its linear index in the (unpadded, untransposed) input.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import philox
from .cast import decode, encode, round_to_format
from .formats import E4M3, ElementFormat, QuantSpec, Rounding, ScaleKind
from .scale_layout import from_blackwell, from_hopper

__all__ = ["QTensor", "quantize", "dequantize", "fake_quantize", "check_input", "block_shape", "block_scales", "divide_by",
           "SCALE_LAYOUTS", "plain_scales", "check_scale_layout"]

SCALE_LAYOUTS = ("plain", "blackwell", "hopper")

NVFP4_TENSOR_DIVISOR = 448.0 * 6.0
_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_TORCH_CODE_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


@dataclass
class QTensor:
    """A quantized 2-D tensor.

    codes: [rows, cols] as torch.float8_e4m3fn / float8_e5m2 for those formats, uint8 for other
           formats of at most 8 bits, packed two per byte ([rows, ceil(cols / 2)] uint8, element 2j in
           the low nibble) for 4-bit formats, int32 bit patterns for wider simulated formats.
    scales: [ceil(rows / br), ceil(cols / bc)] float32 (FP32, POW2), float8_e8m0fnu (E8M0) or
           float8_e4m3fn (NVFP4); None for ScaleKind.NONE. With scale_layout "blackwell" (1-byte
           scales of 1-D blocks only) the same scales in the layout the Blackwell block-scaled GEMMs
           read (`scale_layout.to_blackwell`: padded, not row-major), written so by the quantizer
           for an operand bound for those GEMMs; with "hopper" (FP32 / POW2 scales of 128-long blocks) the
           plain grid transposed and padded as the Hopper blockwise GEMM reads it (`scale_layout.to_hopper`);
           `plain_scales` gives the plain grid back.
    tensor_scale: 0-d float32 (NVFP4 only).
    """

    codes: torch.Tensor
    scales: torch.Tensor | None
    spec: QuantSpec
    shape: tuple[int, int]
    tensor_scale: torch.Tensor | None = None
    scale_layout: str = "plain"

    def __post_init__(self):
        if self.scale_layout not in SCALE_LAYOUTS:
            raise ValueError(f"scale_layout must be one of {SCALE_LAYOUTS}, got {self.scale_layout!r}")

    def dequantize(self) -> torch.Tensor:
        return dequantize(self)

    def t(self) -> "QTensor":
        """The quantized transpose, sharing scales: valid for square 2-D blocks (128x128 weights)."""
        br, bc = block_shape(self.spec, self.shape)
        if br != bc or self.spec.block[0] == 0 or self.scale_layout != "plain":
            raise ValueError(f"only square 2-D blocks can be transposed in place, got block {self.spec.block}")
        return QTensor(
            _transposed_codes(self), None if self.scales is None else self.scales.t().contiguous(),
            self.spec, (self.shape[1], self.shape[0]), self.tensor_scale,
        )


def _transposed_codes(q: QTensor) -> torch.Tensor:
    """The codes of q's transpose in q's storage dtype, moved as bytes: one transposing copy for 8-bit (and
    wider) codes; for packed 4-bit ones the nibbles split, transposed and re-paired in uint8. (An FSDP2-gathered
    weight is transposed so for dgrad at every forward: int64 codes would move 8 bytes per element each way.)"""
    rows, cols = q.shape
    if not q.spec.packed:
        return q.codes[:, :cols].t().contiguous()
    c = q.codes.view(torch.uint8)
    nibbles = torch.stack((c & 0xF, c >> 4), dim=2).reshape(rows, 2 * c.shape[1])[:, :cols].t().contiguous()
    return pack_codes(nibbles, q.spec.element).view(q.codes.dtype)  # uint8 in: no widening there either


def check_input(x: torch.Tensor, what: str = "x") -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{what} must be float32, bfloat16 or float16, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{what} must be 2-D [rows, cols], got shape {tuple(x.shape)}")


def block_shape(spec: QuantSpec, shape: tuple[int, int]) -> tuple[int, int]:
    """The block (rows, cols) with 0 ("whole dimension") resolved against `shape`."""
    br, bc = spec.block
    return (br or max(shape[0], 1), bc or max(shape[1], 1))


def _pad(xf: torch.Tensor, br: int, bc: int) -> torch.Tensor:
    rows, cols = xf.shape
    pr, pc = (-rows) % br, (-cols) % bc
    return torch.nn.functional.pad(xf, (0, pc, 0, pr)) if pr or pc else xf


def _block_amax(xp: torch.Tensor, br: int, bc: int) -> torch.Tensor:
    rows, cols = xp.shape
    # amax propagates NaN, and |Inf| = Inf, so non-finite blocks show up as non-finite amax.
    return xp.abs().reshape(rows // br, br, cols // bc, bc).amax(dim=(1, 3))


def divide_by(t: torch.Tensor, divisor: float) -> torch.Tensor:
    """IEEE `t / divisor` on every device.

    On CUDA, PyTorch computes `tensor / python_float` as `tensor * (1 / divisor)`, which is one ulp off
    the true quotient for some inputs; a divisor tensor on `t`'s own device gets true division
    everywhere. tests/ops/test_reference_division.py fails if a scalar divisor comes back.
    """
    return t / torch.full((), divisor, dtype=t.dtype, device=t.device)


def _round_up_pow2(s: torch.Tensor) -> torch.Tensor:
    """The smallest power of two >= each positive float32 `s`, subnormal `s` included.

    Normal s: the bit pattern rounded up to the next exponent. Subnormal s = m * 2^-149 (m < 2^23):
    the answer is next_pow2(m) * 2^-149, whose bit pattern is the integer next_pow2(m) (2^23 being
    the bits of 2^-126), so m is rounded up the same way as a float and its value is the bit pattern.
    """

    def up_bits(bits: torch.Tensor) -> torch.Tensor:
        return torch.where((bits & 0x7FFFFF) != 0, (bits + 0x7FFFFF) & -0x800000, bits)

    bits = s.view(torch.int32)
    m_up = up_bits((bits & 0x7FFFFF).to(torch.float32).view(torch.int32)).view(torch.float32).to(torch.int32)
    return torch.where((bits & 0x7F800000) == 0, m_up, up_bits(bits)).view(torch.float32)


def _nvfp4_tensor_scale(tensor_amax: torch.Tensor) -> torch.Tensor:
    t = divide_by(tensor_amax.float(), NVFP4_TENSOR_DIVISOR)
    t = torch.where((t == 0) & (tensor_amax > 0), torch.full_like(t, 2.0**-149), t)
    return torch.where(tensor_amax == 0, torch.ones_like(t), torch.where(torch.isfinite(tensor_amax), t, torch.full_like(t, float("nan"))))


def block_scales(amax: torch.Tensor, spec: QuantSpec, tensor_scale: torch.Tensor | None):
    """(stored scales, float32 element scales) for the block amax grid."""
    finite = torch.isfinite(amax)
    nan = torch.full_like(amax, float("nan"))
    if spec.scale == ScaleKind.NVFP4:
        b = amax / (tensor_scale * 6.0)
        b = round_to_format(b, E4M3, Rounding.RNE)
        b = torch.where(b == 0, torch.full_like(b, E4M3.min_subnormal), b)
        b = torch.where(amax == 0, torch.ones_like(b), b)
        b = torch.where(finite, b, nan)
        b = torch.where(torch.isfinite(tensor_scale), b, nan)
        s = b * tensor_scale
        return b.to(torch.float8_e4m3fn), torch.where(s == 0, torch.full_like(s, float("inf")), s)
    s = divide_by(amax, spec.element.max_finite)
    # A subnormal amax can make amax / max_finite underflow to 0: keep the smallest positive scale.
    s = torch.where((s == 0) & (amax > 0), torch.full_like(s, 2.0**-149), s)
    if spec.scale in (ScaleKind.POW2, ScaleKind.E8M0):
        s = _round_up_pow2(s)
    if spec.scale == ScaleKind.E8M0:  # E8M0's smallest value is 2^-127
        s = s.clamp(min=2.0**-127)
    s = torch.where(amax == 0, torch.ones_like(s), s)
    s = torch.where(finite, s, nan)
    if spec.scale == ScaleKind.E8M0:
        return s.to(torch.float8_e8m0fnu), s
    return s, s


def _expand(s: torch.Tensor, br: int, bc: int, rows: int, cols: int) -> torch.Tensor:
    """Per-block values broadcast to every element of a [rows, cols] tensor."""
    nbr, nbc = s.shape
    full = s[:, None, :, None].expand(nbr, br, nbc, bc).reshape(nbr * br, nbc * bc)
    return full[:rows, :cols]


def _quantize_values(x, spec, seed, offset, transpose, tensor_amax, checked):
    """Shared core: (rounded element values [r, c], stored scales, element scales [r, c], tensor scale)."""
    check_input(x)
    if not isinstance(spec, QuantSpec):
        raise TypeError(f"spec must be a QuantSpec, got {type(spec).__name__}")
    if checked and not bool(torch.isfinite(x).all()):
        raise ValueError("quantize: input contains NaN or Inf (checked mode)")
    in_rows, in_cols = x.shape
    xf = x.float()
    rand = None
    if spec.rounding == Rounding.SR:
        rand = philox.element_bits(in_rows, in_cols, seed, offset, device=x.device)
    if transpose:  # contiguous: every later elementwise op and the block reshape run ~1.5x faster on it
        xf = xf.t().contiguous()
        rand = None if rand is None else rand.t().contiguous()
    rows, cols = xf.shape
    tensor_scale = None
    if spec.scale == ScaleKind.NONE:
        y = round_to_format(xf.contiguous(), spec.element, spec.rounding, rand)
        return y, None, None, None
    br, bc = block_shape(spec, (rows, cols))
    xp = _pad(xf, br, bc)
    amax = _block_amax(xp, br, bc)
    if spec.scale == ScaleKind.NVFP4:
        if tensor_amax is None:
            tensor_amax = xf.abs().amax() if xf.numel() else torch.zeros((), device=x.device)
        tensor_scale = _nvfp4_tensor_scale(torch.as_tensor(tensor_amax, dtype=torch.float32, device=x.device))
    elif tensor_amax is not None:
        raise ValueError("tensor_amax is only used by nvfp4 scaling")
    stored, s = block_scales(amax, spec, tensor_scale)
    s_el = _expand(s, br, bc, rows, cols)
    y = round_to_format(xf / s_el, spec.element, spec.rounding, rand)
    if not bool(torch.isfinite(s).all()):
        y = torch.where(torch.isfinite(s_el), y, torch.zeros_like(y))
    return y, stored, s_el, tensor_scale


def quantize(
    x: torch.Tensor,
    spec: QuantSpec,
    *,
    seed: int = 0,
    offset: int = 0,
    transpose: bool = False,
    tensor_amax: torch.Tensor | float | None = None,
    checked: bool = False,
) -> QTensor:
    """Quantize 2-D `x` (or `x.T` when `transpose`, blocks then running along x's rows).

    `seed`/`offset` key the SR random bits; `tensor_amax` overrides nvfp4's per-tensor amax;
    `checked` raises on NaN/Inf instead of propagating them as NaN blocks.
    """
    y, stored, _, tensor_scale = _quantize_values(x, spec, seed, offset, transpose, tensor_amax, checked)
    codes = encode(y, spec.element)
    return QTensor(pack_codes(codes, spec.element), stored, spec, tuple(y.shape), tensor_scale)


def fake_quantize(
    x: torch.Tensor,
    spec: QuantSpec,
    *,
    seed: int = 0,
    offset: int = 0,
    transpose: bool = False,
    tensor_amax: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """float32 `dequantize(quantize(x, spec, ...))`, computed without building codes."""
    y, _, s_el, _ = _quantize_values(x, spec, seed, offset, transpose, tensor_amax, False)
    if s_el is None:
        return y
    if spec.scale == ScaleKind.NVFP4:  # an infinite element scale stands for an underflowed b * t: 0
        s_el = torch.where(torch.isinf(s_el), torch.zeros_like(s_el), s_el)
    return y * s_el


def check_scale_layout(spec: QuantSpec, scale_layout: str) -> None:
    """Refuses a scale layout the spec cannot have: "blackwell" holds 1-byte scales of 1-D blocks, "hopper"
    float32 scales of 128-long blocks."""
    if scale_layout not in SCALE_LAYOUTS:
        raise ValueError(f"scale_layout must be one of {SCALE_LAYOUTS}, got {scale_layout!r}")
    if scale_layout == "blackwell" and not (spec.scale in (ScaleKind.E8M0, ScaleKind.NVFP4) and spec.block[0] == 1
                                            and spec.block[1] in (16, 32)):
        raise ValueError(f"the blackwell scale layout holds E8M0 / NVFP4 scales of 1x16 or 1x32 blocks, not {spec.describe()}")
    if scale_layout == "hopper" and not (spec.scale in (ScaleKind.FP32, ScaleKind.POW2) and spec.block[1] == 128):
        raise ValueError(f"the hopper scale layout holds FP32 / POW2 scales of 128-long blocks, not {spec.describe()}")


def plain_scales(q: QTensor) -> torch.Tensor | None:
    """q's scales as the plain [ceil(rows / br), ceil(cols / bc)] grid, whatever q's scale layout."""
    if q.scale_layout == "plain" or q.scales is None:
        return q.scales
    n = -(-q.shape[1] // q.spec.block[1])
    if q.scale_layout == "hopper":
        return from_hopper(q.scales, -(-q.shape[0] // block_shape(q.spec, q.shape)[0]), n)
    return from_blackwell(q.scales, q.shape[0], n)


def dequantize(q: QTensor) -> torch.Tensor:
    """float32 values of a QTensor: element value times its block's scale (times the tensor scale)."""
    fmt = q.spec.element
    y = decode(unpack_codes(q), fmt)
    if q.scales is None:
        return y
    rows, cols = q.shape
    br, bc = block_shape(q.spec, q.shape)
    s = plain_scales(q).float()
    if q.tensor_scale is not None:
        s = s * q.tensor_scale
    return y * _expand(s, br, bc, rows, cols)


def pack_codes(codes: torch.Tensor, fmt: ElementFormat, like: torch.dtype | None = None) -> torch.Tensor:
    """Store int64 codes in their compact dtype (see QTensor.codes)."""
    if fmt.bits == 4:
        c = codes.to(torch.uint8)
        if c.shape[1] % 2:
            c = torch.nn.functional.pad(c, (0, 1))
        return c[:, 0::2] | (c[:, 1::2] << 4)
    if fmt.bits <= 8:
        c = codes.to(torch.uint8)
        dtype = like if like is not None else _TORCH_CODE_DTYPES.get(fmt.name)
        return c.view(dtype) if dtype is not None and dtype != torch.uint8 else c
    return codes.to(torch.int32)


def unpack_codes(q: QTensor) -> torch.Tensor:
    """int64 codes [rows, cols] of a QTensor."""
    if q.spec.packed:
        c = q.codes.to(torch.int64)
        both = torch.stack((c & 0xF, c >> 4), dim=2).reshape(c.shape[0], 2 * c.shape[1])
        return both[:, : q.shape[1]]
    if q.codes.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return q.codes.view(torch.uint8).to(torch.int64)
    return q.codes.to(torch.int64)
