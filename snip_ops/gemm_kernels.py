"""Low-precision GEMMs on quantized operands: `qgemm(a, b)` = dequantize(a) @ dequantize(b)^T.

`a` ([M, K]) and `b` ([N, K]) are `reference.QTensor`s whose blocks run along K (the GEMM's
reduction dimension), as DESIGN.md §3 lays out the three GEMMs of a linear layer:

    fprop  a = quantize(x)                      b = quantize(w)             (w: 128x128 blocks)
    dgrad  a = quantize(dy)                     b = quantize(w).t()         (same 128x128 blocks)
    wgrad  a = quantize(dy, transpose=True)     b = quantize(x, transpose=True)

Paths, fastest first; `select_path` takes the first one whose conditions hold and says why the
others were refused (`qgemm(..., path=...)` forces one and raises with that reason instead):

    "sm90_fp8"       Hopper (sm_90) CUTLASS kernel snip_C::fp8_gemm_nt_blockwise: E4M3 codes, FP32
                     (or power-of-two) scales per 1x128 block of a, per 128x128 or 1x128 block of b.
    "sm90_fp4"       the paper's FP4 (E2M1 with the same blocks and FP32 scales) on Hopper, which has
                     no FP4 tensor cores: every E2M1 value is exactly an E4M3 value, so the packed
                     nibbles are re-encoded as E4M3 bytes and the FP8 kernel computes the very same
                     products and sums -- exact emulation at FP8 speed.
    "sm100_nvfp4" / "sm100_mxfp4" / "sm100_mxfp8"
                     Blackwell (sm_100) CUTLASS tcgen05 kernels, BF16 output. NOT RUN YET (no
                     Blackwell GPU was available): only their host-side plumbing is tested.
    "bf16_exact"     any CUDA device: when every dequantized element is exactly a BF16 value
                     (power-of-two or E8M0 scales; nvfp4 with its FP32 tensor scale factored out
                     into an FP32 alpha), dequantize to BF16 and run a BF16 tensor-core GEMM with
                     FP32 accumulation and FP32 output.
    "fp32"           dequantize to FP32 and multiply in FP32 (on a GPU in FP64, so that a global
                     TF32 setting cannot apply): the reference numerics (snip_ops.gemm), any device.

All paths compute the same mathematical result -- the FP32 GEMM of the dequantized operands -- and
differ only in summation order (and, for BF16 output, in one final rounding). Nothing is ever
silently dropped: NaN scales (non-finite input blocks) propagate to the output.

Scale layouts the kernels read (conversions done here, documented in csrc/gemm/README.md):
  * Hopper: MN-major FP32 scales, `sfa[kb, m]` ([ceil(K/128), round_up(M, 4)]) and
    `sfb[kb, j]` ([ceil(K/128), round_up(ceil(N/b_block), 4)]) -- the transpose of the QTensor's
    [rows, ceil(K/128)] scales (CUTLASS's Hopper blockwise mainloop reads MN-major scales, and A's
    are then loaded by TMA, which wants 16-byte rows, hence the padding to 4).
  * Blackwell: `snip_ops.scale_layout.to_blackwell` (CUTLASS's Sm1xxBlockScaledConfig atoms).
K is padded with zero codes to the kernels' 16-byte TMA rows (16 FP8 / 32 FP4 elements), N to
16-byte output rows; M tails are handled inside the kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from . import _ext
from .cast import decode
from .formats import E2M1, E4M3, ScaleKind
from .reference import QTensor, block_shape, dequantize

__all__ = [
    "PATHS", "PathChoice", "select_path", "qgemm", "hopper_scales", "fp4_codes_as_e4m3",
    "to_blocked_scales", "prepare_sm90", "prepare_sm100", "device_arch",
]

PATHS = ("sm90_fp8", "sm90_fp4", "sm100_nvfp4", "sm100_mxfp4", "sm100_mxfp8", "bf16_exact", "fp32")
_OUT_DTYPES = (torch.bfloat16, torch.float32, torch.float16)
_SCALE_K = 128


def _round_up(v: int, m: int) -> int:
    return -(-v // m) * m


def device_arch(device) -> tuple[int, int] | None:
    """(major, minor) compute capability of a CUDA device, None for any other device."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(device)


@dataclass(frozen=True)
class PathChoice:
    path: str
    refused: dict[str, str]  # path -> why it could not be used (paths before the chosen one)


# ---- operand classification ----------------------------------------------------------------------


def _check_pair(a: QTensor, b: QTensor) -> None:
    for name, q in (("a", a), ("b", b)):
        if not isinstance(q, QTensor):
            raise TypeError(f"qgemm: {name} must be a QTensor (snip_ops.quantize), got {type(q).__name__}")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"qgemm: a {tuple(a.shape)} and b {tuple(b.shape)} must have the same K (dim 1)")
    if a.codes.device != b.codes.device:
        raise ValueError(f"qgemm: a is on {a.codes.device} but b is on {b.codes.device}")


def _fp8_kernel_operand(q: QTensor, role: str) -> str | None:
    """Why q cannot feed the Hopper FP8 kernel (None: it can). role 'a' or 'b'."""
    s = q.spec
    if s.element not in (E4M3, E2M1):
        return f"{role}: element {s.element.name} (the kernel takes E4M3, or E2M1 re-encoded as E4M3)"
    if s.scale not in (ScaleKind.FP32, ScaleKind.POW2):
        return f"{role}: scale {s.scale.value} (the kernel takes FP32 scales)"
    br, bc = block_shape(s, q.shape)
    if bc != _SCALE_K or s.block[1] == 0:
        return f"{role}: blocks of {s.block[1]} along K (the kernel needs 128)"
    if br not in (1, 128) or s.block[0] == 0:
        return f"{role}: blocks of {s.block[0]} rows (the kernel takes 1x128 or 128x128 blocks)"
    return None


def _bf16_exact_operand(q: QTensor) -> str | None:
    """Why dequantize(q) may not be exactly representable in BF16 (None: it is)."""
    e = q.spec.element
    if e.man_bits > 7 or e.emax > 127 or e.emin - e.man_bits < -133:
        return f"element {e.name} has more precision or range than BF16"
    if q.spec.scale in (ScaleKind.NONE, ScaleKind.POW2, ScaleKind.E8M0):
        return None
    if q.spec.scale == ScaleKind.NVFP4:
        return None if e.man_bits + E4M3.man_bits <= 7 else "nvfp4 element times E4M3 scale exceeds BF16"
    return f"{q.spec.scale.value} scales are not powers of two"


def _blackwell_kind(a: QTensor, b: QTensor) -> str | None:
    sa, sb = a.spec, b.spec
    if (sa.element, sa.block, sa.scale) != (sb.element, sb.block, sb.scale):
        return None
    if sa.element == E2M1 and sa.block == (1, 16) and sa.scale == ScaleKind.NVFP4:
        return "nvfp4"
    if sa.element == E2M1 and sa.block == (1, 32) and sa.scale == ScaleKind.E8M0:
        return "mxfp4"
    if sa.element == E4M3 and sa.block == (1, 32) and sa.scale == ScaleKind.E8M0:
        return "mxfp8"
    return None


def _why_not(path: str, a: QTensor, b: QTensor, arch, out_dtype, accumulate: bool) -> str | None:
    """None if `path` can compute this GEMM exactly on this device, else the reason."""
    device = a.codes.device
    if path in ("sm90_fp8", "sm90_fp4"):
        if arch != (9, 0):
            return f"needs an sm_90 GPU (device {device} is {_arch_str(arch)})"
        if not _ext.kernel_available("fp8_gemm_nt_blockwise", device):
            return "no usable fp8_gemm_nt_blockwise kernel for sm_90a (not built, or failed its self-check)"
        for q, role in ((a, "a"), (b, "b")):
            why = _fp8_kernel_operand(q, role)
            if why:
                return why
            if q.tensor_scale is not None:
                return f"{role} has a tensor scale"
        fp4 = E2M1 in (a.spec.element, b.spec.element)
        if (path == "sm90_fp4") != fp4:
            return "E2M1 operands go through sm90_fp4" if fp4 else "no E2M1 operand (use sm90_fp8)"
        return None
    if path.startswith("sm100_"):
        if arch != (10, 0):
            return f"needs an sm_100 GPU (device {device} is {_arch_str(arch)})"
        kind = path.removeprefix("sm100_")
        if _blackwell_kind(a, b) != kind:
            return f"operands are not both {kind} ({a.spec.describe()} x {b.spec.describe()})"
        if not _ext.kernel_available(f"{kind}_gemm_nt", device):
            return f"no usable {kind}_gemm_nt kernel for sm_100a (not built, or failed its self-check)"
        if out_dtype != torch.bfloat16 or accumulate:
            return "the Blackwell kernels write BF16 only (no FP32 output or accumulation)"
        return None
    if path == "bf16_exact":
        if device.type != "cuda":
            return "a CPU GEMM gains nothing from BF16 (fp32 is exact)"
        for q, role in ((a, "a"), (b, "b")):
            why = _bf16_exact_operand(q)
            if why:
                return f"{role}: {why}"
        return None
    if path == "fp32":
        return None
    raise ValueError(f"unknown GEMM path {path!r}; known: {', '.join(PATHS)}")


def _arch_str(arch) -> str:
    return "not a CUDA device" if arch is None else f"sm_{arch[0]}{arch[1]}"


def select_path(a: QTensor, b: QTensor, *, out_dtype: torch.dtype = torch.bfloat16, accumulate: bool = False) -> PathChoice:
    """The path `qgemm` takes for these operands on their device, and why faster ones were refused."""
    _check_pair(a, b)
    arch = device_arch(a.codes.device)
    refused = {}
    for path in PATHS:
        why = _why_not(path, a, b, arch, out_dtype, accumulate)
        if why is None:
            return PathChoice(path, refused)
        refused[path] = why
    raise AssertionError("the fp32 path accepts everything")  # pragma: no cover


# ---- operand conversions ---------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _e2m1_to_e4m3_bytes() -> tuple[int, ...]:
    """E4M3 byte of each of the 16 E2M1 codes (every E2M1 value is exactly an E4M3 value)."""
    values = decode(torch.arange(16, dtype=torch.int64), E2M1)
    return tuple(values.to(torch.float8_e4m3fn).view(torch.uint8).tolist())


def _e2m1_to_e4m3_lut(device: torch.device) -> torch.Tensor:
    # Built per call from Python ints (16 bytes): no cached tensor that could be real under a fake
    # tracing mode or fake outside it.
    return torch.tensor(_e2m1_to_e4m3_bytes(), dtype=torch.uint8, device=device)


def fp4_codes_as_e4m3(q: QTensor) -> torch.Tensor:
    """[rows, cols] float8_e4m3fn codes with the same values as q's packed E2M1 codes."""
    if q.spec.element != E2M1:
        raise ValueError(f"expected E2M1 codes, got {q.spec.element.name}")
    lut = _e2m1_to_e4m3_lut(q.codes.device)
    c = q.codes.view(torch.uint8).long()
    both = torch.stack((lut[c & 0xF], lut[c >> 4]), dim=2).reshape(c.shape[0], 2 * c.shape[1])
    return both[:, : q.shape[1]].contiguous().view(torch.float8_e4m3fn)


def _e4m3_codes(q: QTensor) -> torch.Tensor:
    if q.spec.element == E2M1:
        return fp4_codes_as_e4m3(q)
    codes = q.codes.contiguous()
    return codes if codes.dtype == torch.float8_e4m3fn else codes.view(torch.float8_e4m3fn)


def _pad_2d(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Zero-pad a 2-D tensor (any dtype, through its bytes for 1-byte types) to [rows, cols]."""
    r, c = t.shape
    if (r, c) == (rows, cols):
        return t
    if t.element_size() == 1 and t.dtype != torch.uint8:
        return _pad_2d(t.view(torch.uint8), rows, cols).view(t.dtype)
    return torch.nn.functional.pad(t, (0, cols - c, 0, rows - r))


def hopper_scales(q: QTensor, role: str, rows: int | None = None) -> tuple[torch.Tensor, int]:
    """(MN-major FP32 scales for snip_C::fp8_gemm_nt_blockwise, block rows) of operand q.

    role "a": one scale per row and 128-wide K block, [ceil(K/128), round_up(rows, 4)] (a 128x128
    blocked `a` is expanded to its rows). role "b": [ceil(K/128), round_up(ceil(rows/br), 4)] with
    br = 128 (128x128 blocks) or 1 (1x128). `rows` defaults to q's rows (the kernel pads M/N).
    Padding entries are 0 (they only ever meet zero codes or rows that are cut off).
    """
    rows = q.shape[0] if rows is None else rows
    br, _ = block_shape(q.spec, q.shape)
    s = q.scales.float()
    if role == "a" and br != 1:
        s = s.repeat_interleave(br, dim=0)[: q.shape[0]]
        br = 1
    if role not in ("a", "b"):
        raise ValueError(f"role must be 'a' or 'b', got {role!r}")
    n_rows = -(-rows // br)
    st = s.t()
    out = st.new_zeros(st.shape[0], _round_up(n_rows, 4))
    out[:, : st.shape[1]] = st
    return out, br


def to_blocked_scales(scales: torch.Tensor) -> torch.Tensor:
    """QTensor [rows, ceil(K/vec)] scales -> CUTLASS's Sm1xxBlockScaledConfig layout (Blackwell)."""
    from .scale_layout import to_blackwell

    return to_blackwell(scales)


# ---- the paths -------------------------------------------------------------------------------------


def _finish(y: torch.Tensor, n: int, out_dtype, bias, out) -> torch.Tensor:
    """Cut the N padding, add what is left to add, write or accumulate into `out`."""
    if y.shape[1] != n:
        y = y[:, :n]
    if out is not None:
        out.add_(y)
        return out
    if bias is not None:
        y = y.float() + bias.float()
    return y.to(out_dtype).contiguous()


def prepare_sm90(a: QTensor, b: QTensor, out_dtype: torch.dtype = torch.bfloat16):
    """The arguments of snip_C::fp8_gemm_nt_blockwise for a . b^T:
    (a codes, sfa, b codes, sfb, b_block, padded N). Codes become E4M3 [rows, K padded to 16]
    (E2M1 re-encoded), b gets zero rows up to the output's 16-byte row alignment, scales become
    MN-major (`hopper_scales`)."""
    m, k = a.shape
    n = b.shape[0]
    k_pad = _round_up(k, 16)
    n_pad = _round_up(n, 8 if out_dtype == torch.bfloat16 else 4)
    ca = _pad_2d(_e4m3_codes(a), m, k_pad)
    cb = _pad_2d(_e4m3_codes(b), n_pad, k_pad)
    sfa, _ = hopper_scales(a, "a")
    sfb, b_block = hopper_scales(b, "b", rows=n_pad)
    return ca, sfa, cb, sfb, b_block, n_pad


def _run_sm90(a: QTensor, b: QTensor, out_dtype, bias, out, config: str) -> torch.Tensor:
    n = b.shape[0]
    # In-place accumulation when `out` fits the kernel's alignment rules; otherwise an FP32 result
    # that is added to `out` (one rounding either way). FP16 output: FP32, then cast.
    direct_acc = out is not None and n % (8 if out.dtype == torch.bfloat16 else 4) == 0 and _acc_ok(out)
    if direct_acc:
        kernel_dtype = out.dtype
    else:
        kernel_dtype = torch.bfloat16 if out is None and out_dtype == torch.bfloat16 else torch.float32
    ca, sfa, cb, sfb, b_block, n_pad = prepare_sm90(a, b, kernel_dtype)
    if direct_acc:
        torch.ops.snip_C.fp8_gemm_nt_blockwise_acc(ca, sfa, cb, sfb, b_block, out, config)
        return out
    fused_bias = None
    if bias is not None and out is None:
        fused_bias = _pad_2d(bias.float().reshape(1, -1), 1, n_pad).reshape(-1)
    y = torch.ops.snip_C.fp8_gemm_nt_blockwise(ca, sfa, cb, sfb, b_block, kernel_dtype, fused_bias, config)
    return _finish(y, n, out_dtype, None, out)


def _acc_ok(out: torch.Tensor) -> bool:
    """`out` meets the in-place kernel's layout rules (storage offset instead of data_ptr() so that
    fake tensors can answer too; the op itself checks the real address)."""
    align = 8 if out.dtype == torch.bfloat16 else 4
    return (
        out.dim() == 2 and (out.shape[1] <= 1 or out.stride(1) == 1)
        and (out.shape[0] <= 1 or out.stride(0) % align == 0) and out.storage_offset() % align == 0
    )


def prepare_sm100(kind: str, a: QTensor, b: QTensor):
    """The arguments of snip_C::{kind}_gemm_nt for a . b^T: (a codes, sfa, b codes, sfb, alpha or
    None, padded N). K is padded with zero codes to 32 (FP4) / 16 (FP8) elements, N to 8 rows,
    scales go to CUTLASS's blocked layout; alpha (nvfp4) = product of the tensor scales, on the
    device (no host sync)."""
    if kind not in ("nvfp4", "mxfp4", "mxfp8"):
        raise ValueError(f"kind must be nvfp4, mxfp4 or mxfp8, got {kind!r}")
    m, k = a.shape
    n = b.shape[0]
    fp4 = kind != "mxfp8"
    k_pad = _round_up(k, 32 if fp4 else 16)
    n_pad = _round_up(n, 8)
    # Packed FP4: [rows, K/2] bytes; padding whole bytes keeps the nibble order.
    ca = _pad_2d(a.codes.contiguous(), m, k_pad // 2 if fp4 else k_pad)
    cb = _pad_2d(b.codes.contiguous(), n_pad, k_pad // 2 if fp4 else k_pad)
    n_sf = -(-k_pad // (16 if kind == "nvfp4" else 32))
    sfa = to_blocked_scales(_pad_2d(a.scales, m, n_sf))
    sfb = to_blocked_scales(_pad_2d(b.scales, n_pad, n_sf))
    alpha = None
    if kind == "nvfp4":
        alpha = (a.tensor_scale.float() * b.tensor_scale.float()).reshape(1)
    return ca, sfa, cb, sfb, alpha, n_pad


def _run_sm100(kind: str, a: QTensor, b: QTensor, out_dtype, bias, out) -> torch.Tensor:
    ca, sfa, cb, sfb, alpha, _ = prepare_sm100(kind, a, b)
    if kind == "nvfp4":
        y = torch.ops.snip_C.nvfp4_gemm_nt(ca, sfa, cb, sfb, alpha)
    else:
        y = getattr(torch.ops.snip_C, f"{kind}_gemm_nt")(ca, sfa, cb, sfb)
    return _finish(y, b.shape[0], out_dtype, bias, out)


def _dequant_bf16(q: QTensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(BF16 values, FP32 factor to apply after the GEMM) -- exact for `_bf16_exact_operand`."""
    if q.spec.scale == ScaleKind.NVFP4:
        bare = QTensor(q.codes, q.scales, q.spec, q.shape, None)  # q * b, exact in BF16
        return dequantize(bare).to(torch.bfloat16), q.tensor_scale.float()
    return dequantize(q).to(torch.bfloat16), None


def _run_bf16(a: QTensor, b: QTensor, out_dtype, bias, out) -> torch.Tensor:
    xa, ta = _dequant_bf16(a)
    xb, tb = _dequant_bf16(b)
    y = torch.mm(xa, xb.t(), out_dtype=torch.float32)
    for t in (ta, tb):
        if t is not None:
            y = y * t
    return _finish(y, b.shape[0], out_dtype, bias, out)


def _run_fp32(a: QTensor, b: QTensor, out_dtype, bias, out) -> torch.Tensor:
    xa, xb = dequantize(a), dequantize(b)
    if xa.is_cuda:
        # A float32 GEMM on a GPU may run in TF32 (torch.set_float32_matmul_precision), which would
        # drop operand bits; FP64 never does, so this fallback stays exact without touching that
        # process-wide setting. Products of dequantized operands are exact in FP64.
        y = (xa.double() @ xb.double().t()).float()
    else:
        y = xa @ xb.t()
    return _finish(y, b.shape[0], out_dtype, bias, out)


def qgemm(
    a: QTensor,
    b: QTensor,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    path: str | None = None,
    config: str = "",
) -> torch.Tensor:
    """dequantize(a) @ dequantize(b)^T (+ bias) as a new [M, N] tensor of `out_dtype`, or, when
    `out` ([M, N] float32/bfloat16) is given, accumulated into it (`out += ...`) and returned.

    `path` forces one of PATHS (ValueError with the reason when it cannot compute this GEMM
    exactly); by default the fastest exact one is taken (`select_path`). `config` is passed to the
    Hopper kernel ("tile=64x128,raster=n,swizzle=2"; empty: its heuristic).
    """
    _check_pair(a, b)
    m, n = a.shape[0], b.shape[0]
    if out is not None:
        if bias is not None:
            raise ValueError("qgemm: bias is not supported together with out= (accumulation)")
        if tuple(out.shape) != (m, n) or out.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"qgemm: out must be a float32 or bfloat16 [{m}, {n}] tensor, got {out.dtype} {tuple(out.shape)}")
        if out.device != a.codes.device:
            raise ValueError(f"qgemm: out is on {out.device} but the operands are on {a.codes.device}")
        out_dtype = out.dtype
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(f"qgemm: out_dtype must be one of {_OUT_DTYPES}, got {out_dtype}")
    if bias is not None:
        if bias.dim() != 1 or bias.shape[0] != n:
            raise ValueError(f"qgemm: bias must be 1-D [{n}], got shape {tuple(bias.shape)}")
        if bias.device != a.codes.device:
            raise ValueError(f"qgemm: bias is on {bias.device} but the operands are on {a.codes.device}")
    accumulate = out is not None
    if path is None:
        path = select_path(a, b, out_dtype=out_dtype, accumulate=accumulate).path
    else:
        why = _why_not(path, a, b, device_arch(a.codes.device), out_dtype, accumulate)
        if why is not None:
            raise ValueError(f"qgemm: path {path!r} cannot run this GEMM: {why}")
    if m == 0 or n == 0 or a.shape[1] == 0:  # empty output, or an empty sum: 0 (+ bias)
        zero = torch.zeros(m, n, dtype=torch.float32, device=a.codes.device)
        return _finish(zero, n, out_dtype, bias, out)
    if path in ("sm90_fp8", "sm90_fp4"):
        return _run_sm90(a, b, out_dtype, bias, out, config)
    if path.startswith("sm100_"):
        return _run_sm100(path.removeprefix("sm100_"), a, b, out_dtype, bias, out)
    if path == "bf16_exact":
        return _run_bf16(a, b, out_dtype, bias, out)
    return _run_fp32(a, b, out_dtype, bias, out)

