"""Low-precision GEMMs on quantized operands: `qgemm(a, b)` = dequantize(a) @ dequantize(b)^T.

`a` ([M, K]) and `b` ([N, K]) are `reference.QTensor`s whose blocks run along K (the GEMM's
reduction dimension), as docs/design.md §3 lays out the three GEMMs of a linear layer:

    fprop  a = quantize(x)                      b = quantize(w)             (w: 128x128 blocks)
    dgrad  a = quantize(dy)                     b = quantize(w).t()         (same 128x128 blocks)
    wgrad  a = quantize(dy, transpose=True)     b = quantize(x, transpose=True)

Paths, fastest first; `select_path` takes the first one whose conditions hold and says why the
others were refused (`qgemm(..., path=...)` forces one and raises with that reason instead):

    "sm90_fp8"       Hopper (sm_90) CUTLASS kernel snip_C::fp8_gemm_nt_blockwise (wgmma): E4M3 or E5M2
                     codes for a, E4M3 for b, FP32 (or power-of-two) scales per 1x128 block of a
                     (128x128 blocks are expanded to rows), per 128x128 or 1x128 block of b; BF16 or
                     FP32 output, in-place accumulation.
    "sm90_fp4"       the paper's FP4 (E2M1 with the same blocks and FP32 scales) on Hopper, which has
                     no FP4 tensor cores: every E2M1 value is exactly an E4M3 value, so the packed
                     nibbles are re-encoded as E4M3 bytes and the FP8 kernel computes the very same
                     products and sums -- exact emulation at FP8 speed.
    "sm100_fp8" / "sm100_fp4"
                     the same op, operands and scale layout on Blackwell (sm_100): its tcgen05
                     blockwise kernel (CUTLASS example 81), E2M1 again re-encoded as E4M3.
    "sm100_nvfp4" / "sm100_mxfp4" / "sm100_mxfp8"
                     Blackwell CUTLASS tcgen05 block-scaled kernels, BF16 or FP32 output.
                     The sm100 kernels have NOT RUN YET (no Blackwell GPU was available): only their
                     host-side plumbing is tested.
    "bf16_exact"     any CUDA device: when every dequantized element is exactly a BF16 value
                     (power-of-two or E8M0 scales; nvfp4 with its FP32 tensor scale factored out
                     into an FP32 alpha), dequantize to BF16 and run a BF16 tensor-core GEMM with
                     FP32 accumulation and FP32 output.
    "blockwise_bf16" any CUDA device, FP32 (or any) scales: the element values (codes; exact in BF16)
                     of each K chunk over which both operands' scales are constant (128 for the fp8
                     and fp4 recipes) multiplied by a BF16 tensor-core GEMM with FP32 accumulation and
                     output (never TF32), each chunk's partial sums times SFA[m] * SFB[n] and summed
                     in FP32 -- the blockwise kernels' arithmetic, a few chunks at a time.
                     Memory-bound (every chunk's [M, N] partial sums pass through memory), so slower
                     than a BF16 GEMM, yet far faster than FP64 where FP64 is slow. On the CPU only
                     when forced (there the FP32 GEMM is exact and faster).
    "fp32"           dequantize to FP32 and multiply in FP32: the reference numerics
                     (snip_ops.gemm), the CPU's path. On a GPU it runs in FP64 (so that a global TF32
                     setting cannot apply) and only when forced or when no other path is exact
                     (elements wider than BF16, incompatible block shapes): then qgemm warns.

All paths compute the same mathematical result -- the FP32 GEMM of the dequantized operands -- and
differ only in summation order (and, for BF16 output, in one final rounding). Nothing is ever
silently dropped: NaN scales (non-finite input blocks) propagate to the output.

The path of every GEMM of every recipe, as `gemm_path(recipe, gemm, arch)` gives it (all kernels
built and self-checked; operands as snip_ops.gemm quantizes them: fprop act x weight, dgrad grad x
weight^T (the 128x128 blocks transposed), wgrad grad^T x act^T with blocks along M; BF16 output,
FP32 for wgrad), tested in tests/ops/test_gemm_dispatch.py:

    recipe        GEMM         CPU    sm_80 / sm_89 / sm_120   sm_90       sm_100
    fp8           all three    fp32   blockwise_bf16           sm90_fp8    sm100_fp8
    fp8_e5m2grad  all three    fp32   blockwise_bf16           sm90_fp8    sm100_fp8
    fp4           all three    fp32   blockwise_bf16           sm90_fp4    sm100_fp4
    mxfp8         all three    fp32   bf16_exact               bf16_exact  sm100_mxfp8
    nvfp4         all three    fp32   bf16_exact               bf16_exact  sm100_nvfp4
    nvfp4_train   all three    fp32   bf16_exact               bf16_exact  sm100_nvfp4
    mxfp4         all three    fp32   bf16_exact               bf16_exact  sm100_mxfp4

(fp8_e5m2grad's dgrad and wgrad multiply E5M2 gradients by E4M3 operands; Hopper has no MX/NV FP4
hardware, and those recipes' dequantized values are exactly BF16 values.) An sm_100a cubin does not
run on sm_120 (consumer Blackwell), hence the BF16 paths there.

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

import hashlib
import json
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import torch
from torch.utils._python_dispatch import _disable_current_modes

from . import _ext, autotune
from .cast import decode
from .formats import E2M1, E4M3, E5M2, GEMMS, ElementFormat, GemmRecipe, QuantSpec, ScaleKind, recipe
from .quantize import dequantize
from .reference import QTensor, block_shape, plain_scales, unpack_codes
from .scale_layout import blackwell_shape

__all__ = [
    "PATHS", "PathChoice", "select_path", "qgemm", "hopper_scales", "fp4_codes_as_e4m3",
    "to_blocked_scales", "prepare_sm90", "prepare_sm100", "device_arch", "scale_layout_for", "gemm_path",
    "gemm_operand_specs",
]

PATHS = ("sm90_fp8", "sm90_fp4", "sm100_fp8", "sm100_fp4", "sm100_nvfp4", "sm100_mxfp4", "sm100_mxfp8",
         "bf16_exact", "blockwise_bf16", "fp32")
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


# The rules below read only an operand's `spec` and `shape` (a QTensor, or `_Operand` where
# `gemm_path` asks about a recipe without tensors): one set of rules for both.


@dataclass(frozen=True)
class _Operand:
    spec: QuantSpec
    shape: tuple[int, int]


def _fp8_kernel_operand(q, role: str) -> str | None:
    """Why q cannot feed the FP8 blockwise kernels (None: it can). role 'a' or 'b'."""
    s = q.spec
    elements = (E4M3, E5M2, E2M1) if role == "a" else (E4M3, E2M1)
    if s.element not in elements:
        return (f"{role}: element {s.element.name} (the kernels take E4M3 or E5M2 a, E4M3 b; E2M1 re-encoded "
                f"as E4M3)")
    if s.scale not in (ScaleKind.FP32, ScaleKind.POW2):
        return f"{role}: scale {s.scale.value} (the kernels take FP32 scales)"
    br, bc = block_shape(s, q.shape)
    if bc != _SCALE_K or s.block[1] == 0:
        return f"{role}: blocks of {s.block[1]} along K (the kernels need 128)"
    if br not in (1, 128) or s.block[0] == 0:
        return f"{role}: blocks of {s.block[0]} rows (the kernels take 1x128 or 128x128 blocks)"
    return None


def _fp8_kernel(arch, a) -> str:
    """The kernel (snip_ops._ext.kernels() name) the FP8 blockwise op runs for operand a on `arch`:
    one per arch and A element type, each self-checked on its own."""
    e5m2 = "_e5m2" if a.spec.element == E5M2 else ""
    return f"fp8_gemm_nt_blockwise{e5m2}" + ("_sm100" if arch == (10, 0) else "")


def _bf16_element(e: ElementFormat) -> bool:
    """Every value of the element format is exactly a BF16 value."""
    return e.man_bits <= 7 and e.emax <= 127 and e.emin - e.man_bits >= -133


def _bf16_exact_operand(q) -> str | None:
    """Why dequantize(q) may not be exactly representable in BF16 (None: it is)."""
    e = q.spec.element
    if not _bf16_element(e):
        return f"element {e.name} has more precision or range than BF16"
    if q.spec.scale in (ScaleKind.NONE, ScaleKind.POW2, ScaleKind.E8M0):
        return None
    if q.spec.scale == ScaleKind.NVFP4:
        return None if e.man_bits + E4M3.man_bits <= 7 else "nvfp4 element times E4M3 scale exceeds BF16"
    return f"{q.spec.scale.value} scales are not powers of two"


def _k_chunk(a, b) -> int | None:
    """The widest K chunk over which both operands' scales are constant: the smaller of their K
    blocks when it divides the larger (a block spanning all of K never constrains); None if none."""
    k = a.shape[1]
    blocks = [bc for q in (a, b) for bc in [block_shape(q.spec, q.shape)[1]] if bc < k]
    if not blocks:
        return max(k, 1)
    c = min(blocks)
    return c if all(bc % c == 0 for bc in blocks) else None


def _blackwell_format(spec: QuantSpec) -> str | None:
    """The Blackwell block-scaled format ("nvfp4", "mxfp4", "mxfp8") whose operands look like `spec`.
    nvfp4's 16x16 weight blocks (nvfp4_train) are 1x16 blocks whose 16 rows share one scale: the
    kernel reads them with each scale repeated per row (`_blocked_scales`)."""
    if spec.element == E2M1 and spec.block in ((1, 16), (16, 16)) and spec.scale == ScaleKind.NVFP4:
        return "nvfp4"
    if spec.element == E2M1 and spec.block == (1, 32) and spec.scale == ScaleKind.E8M0:
        return "mxfp4"
    if spec.element == E4M3 and spec.block == (1, 32) and spec.scale == ScaleKind.E8M0:
        return "mxfp8"
    return None


def _blackwell_kind(a: QTensor, b: QTensor) -> str | None:
    kind = _blackwell_format(a.spec)
    return kind if kind is not None and _blackwell_format(b.spec) == kind else None


def scale_layout_for(spec: QuantSpec, device) -> str:
    """The scale layout (`reference.QTensor.scale_layout`) in which to quantize an operand of `spec`
    bound for a GEMM on `device`: the layout that GEMM reads, so that the quantizer writes it and no
    GEMM call relays scales out. "blackwell" where a Blackwell block-scaled kernel for its format is
    usable; "hopper" (MN-major FP32 scales) where the blockwise FP8 kernel of the device (sm_90a, or
    sm_100a's, which takes the same arguments) is usable and the spec is one it reads; else "plain"
    (also for 2-D Blackwell blocks, whose scales the GEMM call expands to rows)."""
    arch = device_arch(device)
    return _scale_layouts.get_or((spec, device, arch), lambda: _scale_layout(spec, device, arch))


_scale_layouts = _ext.GateMemo()  # (spec, device, arch) -> scale_layout_for's answer


def _scale_layout(spec: QuantSpec, device, arch) -> str:
    kind = _blackwell_format(spec)
    if kind is not None and spec.block[0] == 1 and arch == (10, 0) and _ext.kernel_available(f"{kind}_gemm_nt", device):
        return "blackwell"
    blockwise = {(9, 0): "fp8_gemm_nt_blockwise", (10, 0): "fp8_gemm_nt_blockwise_sm100"}.get(arch)
    if blockwise is not None and _blockwise_spec(spec) and _ext.kernel_available(blockwise, device):
        return "hopper"
    return "plain"


def _blockwise_spec(spec: QuantSpec) -> bool:
    """An operand of `spec` can feed the blockwise FP8 kernels in some role (`_fp8_kernel_operand`)."""
    return (spec.element in (E4M3, E5M2, E2M1) and spec.scale in (ScaleKind.FP32, ScaleKind.POW2)
            and spec.block in ((1, _SCALE_K), (_SCALE_K, _SCALE_K)))


def _why_not(path: str, a, b, arch, available: Callable[[str], bool]) -> str | None:
    """None if `path` can compute a . b^T exactly on a device of compute capability `arch` (None: not a
    CUDA device) with the kernels `available` says it has, else the reason."""
    if path in ("sm90_fp8", "sm90_fp4", "sm100_fp8", "sm100_fp4"):
        want = (9, 0) if path.startswith("sm90_") else (10, 0)
        if arch != want:
            return f"needs an sm_{want[0]}{want[1]} GPU (this device is {_arch_str(arch)})"
        for q, role in ((a, "a"), (b, "b")):
            why = _fp8_kernel_operand(q, role)
            if why:
                return why
        kernel = _fp8_kernel(arch, a)
        if not available(kernel):
            return f"no usable {kernel} kernel (not built, or failed its self-check)"
        fp4 = E2M1 in (a.spec.element, b.spec.element)
        if path.endswith("_fp4") != fp4:
            return "E2M1 operands go through the _fp4 path" if fp4 else "no E2M1 operand (the _fp8 path)"
        return None
    if path in ("sm100_nvfp4", "sm100_mxfp4", "sm100_mxfp8"):
        if arch != (10, 0):
            return f"needs an sm_100 GPU (this device is {_arch_str(arch)})"
        kind = path.removeprefix("sm100_")
        if _blackwell_kind(a, b) != kind:
            return f"operands are not both {kind} ({a.spec.describe()} x {b.spec.describe()})"
        if not available(f"{kind}_gemm_nt"):
            return f"no usable {kind}_gemm_nt kernel (not built, or failed its self-check)"
        return None
    if path == "bf16_exact":
        if arch is None:
            return "a CPU GEMM gains nothing from BF16 (fp32 is exact)"
        for q, role in ((a, "a"), (b, "b")):
            why = _bf16_exact_operand(q)
            if why:
                return f"{role}: {why}"
        return None
    if path == "blockwise_bf16":
        for q, role in ((a, "a"), (b, "b")):
            if not _bf16_element(q.spec.element):
                return f"{role}: element {q.spec.element.name} has more precision or range than BF16"
        if _k_chunk(a, b) is None:
            return f"no common K chunk of constant scales ({a.spec.describe()} x {b.spec.describe()})"
        return None
    if path == "fp32":
        return None
    raise ValueError(f"unknown GEMM path {path!r}; known: {', '.join(PATHS)}")


def _not_preferred(path: str, arch) -> str | None:
    """Why select_path passes over a path that could run (it still runs when forced)."""
    if path == "blockwise_bf16" and arch is None:
        return "on the CPU the FP32 GEMM is exact (no TF32) and faster"
    return None


def _arch_str(arch) -> str:
    return "not a CUDA device" if arch is None else f"sm_{arch[0]}{arch[1]}"


def _choose(a, b, arch, available: Callable[[str], bool]) -> PathChoice:
    refused = {}
    for path in PATHS:
        why = _why_not(path, a, b, arch, available) or _not_preferred(path, arch)
        if why is None:
            return PathChoice(path, refused)
        refused[path] = why
    raise AssertionError("the fp32 path accepts everything")  # pragma: no cover


def select_path(a: QTensor, b: QTensor, *, out_dtype: torch.dtype = torch.bfloat16, accumulate: bool = False) -> PathChoice:
    """The path `qgemm` takes for these operands on their device, and why faster ones were refused.
    Every path writes BF16 or FP32 and accumulates into `out`, so `out_dtype` and `accumulate` (qgemm's
    arguments, accepted here alike) do not change the choice."""
    _check_pair(a, b)
    device = a.codes.device
    arch = device_arch(device)
    # the choice reads the operands' specs and shapes only (see _Operand): kept per those, like the gate's answers
    key = (a.spec, tuple(a.shape), b.spec, tuple(b.shape), device, arch)
    return _paths.get_or(key, lambda: _choose(a, b, arch, lambda kernel: _ext.kernel_available(kernel, device)))


_paths = _ext.GateMemo()  # (a spec, a shape, b spec, b shape, device, arch) -> select_path's choice


def gemm_operand_specs(r: GemmRecipe, gemm: str) -> tuple[QuantSpec | None, QuantSpec | None]:
    """(a, b) specs of one of a linear layer's GEMMs under recipe `r`, as snip_ops.gemm quantizes
    them (blocks along each GEMM's K): fprop act x weight, dgrad grad x weight^T, wgrad grad^T x
    act^T. None: that operand is not quantized (BF16)."""
    specs = {"fprop": (r.act, r.weight), "dgrad": (r.grad, r.weight), "wgrad": (r.grad, r.act)}
    if gemm not in specs:
        raise ValueError(f"unknown GEMM {gemm!r}; expected one of {GEMMS}")
    return specs[gemm]


def gemm_path(r: GemmRecipe | str, gemm: str, arch: tuple[int, int] | None,
              available: Callable[[str], bool] | None = None,
              mnk: tuple[int, int, int] = (128, 128, 128)) -> PathChoice:
    """The path qgemm takes for GEMM `gemm` ("fprop", "dgrad", "wgrad") of a linear layer under
    recipe `r` on a device of compute capability `arch` (None: the CPU) -- `select_path`'s rules,
    without tensors. `available(kernel)` says which kernels the device has (default: every kernel of
    this library for that arch, built and self-checked); `mnk` (output rows, output columns, K) only
    matters for blocks spanning a whole dimension. A bf16 recipe's GEMMs are plain BF16 matmuls,
    not qgemm: ValueError."""
    r = recipe(r)
    a_spec, b_spec = gemm_operand_specs(r, gemm)
    if a_spec is None or b_spec is None:
        raise ValueError(f"GEMM {gemm} of recipe {r.name} has an unquantized operand: it does not run through qgemm")
    m, n, k = mnk
    a, b = _Operand(a_spec, (m, k)), _Operand(b_spec, (n, k))
    return _choose(a, b, arch, available or (lambda kernel: arch is not None))


# ---- operand conversions ---------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _e2m1_to_e4m3_bytes() -> tuple[int, ...]:
    """E4M3 byte of each of the 16 E2M1 codes (every E2M1 value is exactly an E4M3 value). Computed
    on real tensors even when first asked from inside a trace (fake tensors have no values)."""
    with _disable_current_modes():
        values = decode(torch.arange(16, dtype=torch.int64), E2M1)
        return tuple(values.to(torch.float8_e4m3fn).view(torch.uint8).tolist())


@lru_cache(maxsize=1)
def _packed_e2m1_to_e4m3_bytes() -> tuple[tuple[int, int], ...]:
    """The two E4M3 bytes of each packed byte of E2M1 codes (its low nibble first, as in memory)."""
    one = _e2m1_to_e4m3_bytes()
    return tuple((one[c & 0xF], one[c >> 4]) for c in range(256))


def fp4_codes_as_e4m3(q: QTensor) -> torch.Tensor:
    """[rows, cols] float8_e4m3fn codes with the same values as q's packed E2M1 codes: one gather
    from a [256, 2] table, 32-bit indices (a byte in, two out; the table is built per call from
    Python ints, so no cached tensor can be real under a fake tracing mode or fake outside it)."""
    if q.spec.element != E2M1:
        raise ValueError(f"expected E2M1 codes, got {q.spec.element.name}")
    c = q.codes.view(torch.uint8)
    lut = torch.tensor(_packed_e2m1_to_e4m3_bytes(), dtype=torch.uint8, device=c.device)
    both = torch.index_select(lut, 0, c.reshape(-1).to(torch.int32)).reshape(c.shape[0], 2 * c.shape[1])
    return both[:, : q.shape[1]].contiguous().view(torch.float8_e4m3fn)


def _fp8_codes(q: QTensor, rows: int, cols: int) -> torch.Tensor:
    """q's codes as the FP8 blockwise op takes them, zero-padded to [rows, cols]: float8_e5m2 for E5M2,
    float8_e4m3fn for E4M3 and for E2M1 (re-encoded: by snip_C::e2m1_as_e4m3 where the extension has
    it, one pass that also pads; else `fp4_codes_as_e4m3`, then a padding copy)."""
    if q.spec.element == E2M1:
        if _ext.kernel_available("e2m1_as_e4m3", q.codes.device):
            return torch.ops.snip_C.e2m1_as_e4m3(q.codes, q.shape[1], rows, cols)
        return _pad_2d(fp4_codes_as_e4m3(q), rows, cols)
    dtype = torch.float8_e5m2 if q.spec.element == E5M2 else torch.float8_e4m3fn
    codes = q.codes.contiguous()
    return _pad_2d(codes if codes.dtype == dtype else codes.view(dtype), rows, cols)


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
    Padding entries are 0 (they only ever meet zero codes or rows that are cut off). Scales the
    quantizer wrote in this layout (scale_layout "hopper") are q's own tensor; others are copied.
    """
    if role not in ("a", "b"):
        raise ValueError(f"role must be 'a' or 'b', got {role!r}")
    rows = q.shape[0] if rows is None else rows
    br, _ = block_shape(q.spec, q.shape)
    if q.scale_layout == "hopper" and (role == "b" or br == 1) \
            and q.scales.shape[1] == _round_up(-(-rows // br), 4) and q.scales.is_contiguous():
        return q.scales, br
    s = plain_scales(q).float()
    if role == "a" and br != 1:
        s = s.repeat_interleave(br, dim=0)[: q.shape[0]]
        br = 1
    n_rows = -(-rows // br)
    # one copy (a kernel launch, which is most of this call's time at GEMM sizes) that transposes and pads
    return torch.nn.functional.pad(s.t(), (0, _round_up(n_rows, 4) - s.shape[0])).contiguous(), br


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
    """The arguments of snip_C::fp8_gemm_nt_blockwise for a . b^T (the sm90_* and sm100_fp8/fp4
    paths: one op, one layout): (a codes, sfa, b codes, sfb, b_block, padded N). Codes become
    [rows, K padded to 16] FP8 (E5M2 stays float8_e5m2, E2M1 is re-encoded as E4M3), b gets zero
    rows up to the output's 16-byte row alignment, scales become MN-major (`hopper_scales`)."""
    m, k = a.shape
    n = b.shape[0]
    k_pad = _round_up(k, 16)
    n_pad = _round_up(n, 8 if out_dtype == torch.bfloat16 else 4)
    ca = _fp8_codes(a, m, k_pad)
    cb = _fp8_codes(b, n_pad, k_pad)
    sfa, _ = hopper_scales(a, "a")
    sfb, b_block = hopper_scales(b, "b", rows=n_pad)
    return ca, sfa, cb, sfb, b_block, n_pad


@lru_cache(maxsize=None)
def _tuning_version() -> str:
    """snip's version and the extension's kernel set: a tuning cache written by another build (other tiles
    compiled) is never read."""
    digest = hashlib.sha256(json.dumps(_ext.kernels(), sort_keys=True).encode()).hexdigest()[:12]
    return f"{autotune.SNIP_VERSION}+{digest}"


def _run_fp8_blockwise(a: QTensor, b: QTensor, out_dtype, bias, out, config: str) -> torch.Tensor:
    n = b.shape[0]
    # In-place accumulation when `out` fits the kernel's alignment rules; otherwise an FP32 result
    # that is added to `out` (one rounding either way). FP16 output: FP32, then cast.
    direct_acc = out is not None and n % (8 if out.dtype == torch.bfloat16 else 4) == 0 and _acc_ok(out)
    if direct_acc:
        kernel_dtype = out.dtype
    else:
        kernel_dtype = torch.bfloat16 if out is None and out_dtype == torch.bfloat16 else torch.float32
    ca, sfa, cb, sfb, b_block, n_pad = prepare_sm90(a, b, kernel_dtype)
    fused_bias = None
    if bias is not None and out is None:
        fused_bias = _pad_2d(bias.float().reshape(1, -1), 1, n_pad).reshape(-1)

    def run(cfg: str, target: torch.Tensor | None = None) -> torch.Tensor:
        if not direct_acc:
            return torch.ops.snip_C.fp8_gemm_nt_blockwise(ca, sfa, cb, sfb, b_block, kernel_dtype, fused_bias, cfg)
        target = out.clone() if target is None else target  # tuning runs accumulate into copies
        torch.ops.snip_C.fp8_gemm_nt_blockwise_acc(ca, sfa, cb, sfb, b_block, target, cfg)
        return target

    if not config:
        config = _tile_config(a, ca, b_block, kernel_dtype, direct_acc, n_pad, run)
    else:
        config = checked_config((ca.device, a.spec.element, b_block, kernel_dtype, direct_acc, a.shape[0], n_pad,
                                 ca.shape[1]), config, run)
    if direct_acc:
        return run(config, out)
    return _finish(run(config), n, out_dtype, None, out)


_tile_configs = _ext.GateMemo()  # the autotuner's settled answers, per tuning setting and call signature
_config_agrees: dict[tuple, bool] = {}  # (call signature, config) -> it gave the heuristic's bits


def checked_config(signature: tuple, config: str, run) -> str:
    """A config the caller named for a GEMM of this call signature (device, A element, B blocks, output dtype,
    accumulation, M, padded N, K): `config`, once its output on these operands was the heuristic's bit for bit
    (every config of a kind computes each output with the same arithmetic), else "" with a warning. The
    configs the autotuner and its table give were compared so on a GPU; a named one, perhaps of a mainloop
    no GPU has run, is compared here at its first use per signature in the process. Not inside a CUDA graph
    capture or a trace, which cannot compare outputs: there it runs as named."""
    key = (signature, config)
    if key not in _config_agrees:
        if autotune._no_tuning_now():
            return config
        agrees = autotune.same_bits(run(config), run(""))
        _config_agrees[key] = agrees
        if not agrees:
            warnings.warn(f"snip_ops.gemm_kernels.qgemm: the FP8 GEMM with config {config!r} gives another result "
                          f"than with its heuristic's (M, N, K = {signature[-3:]}, {signature[3]} output on "
                          f"{signature[0]}); the heuristic's config runs instead. Please report this with "
                          f"snip_ops.build_info().", RuntimeWarning, stacklevel=4)
    return config if _config_agrees[key] else ""


def _tile_config(a: QTensor, ca: torch.Tensor, b_block: int, kernel_dtype: torch.dtype, direct_acc: bool,
                 n_pad: int, run) -> str:
    """The autotuner's config for this FP8 GEMM (`autotune.choose`). Once the answer is settled for its key
    (`autotune.settled`) it is kept per call signature, without building the key again."""
    tuning, device = autotune.current(), ca.device
    memo = (tuning, device, a.spec.element, b_block, kernel_dtype, direct_acc, a.shape[0], n_pad, ca.shape[1])
    config = _tile_configs.lookup(memo)
    if config is None:
        kind = autotune.GemmKind(_fp8_kernel(device_arch(device), a), b_block,
                                 str(kernel_dtype).removeprefix("torch."), direct_acc)
        key = autotune.key_for(autotune.device_name(device), kind, a.shape[0], n_pad, ca.shape[1],
                               version=_tuning_version())
        config = autotune.choose(key, run)
        if autotune.settled(key, tuning):
            _tile_configs[memo] = config
    return config


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
    sfa, sfb = _blocked_scales(a, m, n_sf), _blocked_scales(b, n_pad, n_sf)
    alpha = None
    if kind == "nvfp4":
        alpha = (a.tensor_scale.float() * b.tensor_scale.float()).reshape(1)
    return ca, sfa, cb, sfb, alpha, n_pad


def _blocked_scales(q: QTensor, rows: int, n_sf: int) -> torch.Tensor:
    """q's scales in the Blackwell layout for a [rows, n_sf] scale grid: as the quantizer wrote them
    (scale_layout "blackwell": its atoms already pad rows to 128 and scales per row to 4, with zero
    bytes, which is what padding the plain grid gives), else relaid out here: 2-D blocks (nvfp4's
    16x16 weights) become 1-D ones with each block scale repeated for each of its rows."""
    if q.scale_layout == "blackwell" and tuple(q.scales.shape) == blackwell_shape(rows, n_sf):
        return q.scales
    scales = plain_scales(q)
    br = block_shape(q.spec, q.shape)[0]
    if br > 1:
        scales = scales.view(torch.uint8).repeat_interleave(br, dim=0)[: q.shape[0]].view(scales.dtype)
    return to_blocked_scales(_pad_2d(scales, rows, n_sf))


def _run_sm100(kind: str, a: QTensor, b: QTensor, out_dtype, bias, out) -> torch.Tensor:
    # BF16 straight from the kernel only when that is the result; a bias, an FP32/FP16 result or
    # accumulation into `out` take the FP32 output (one rounding after the GEMM's FP32 sum).
    bf16 = out is None and bias is None and out_dtype == torch.bfloat16
    kernel_dtype = torch.bfloat16 if bf16 else torch.float32
    ca, sfa, cb, sfb, alpha, _ = prepare_sm100(kind, a, b)
    if kind == "nvfp4":
        y = torch.ops.snip_C.nvfp4_gemm_nt(ca, sfa, cb, sfb, alpha, kernel_dtype)
    else:
        y = getattr(torch.ops.snip_C, f"{kind}_gemm_nt")(ca, sfa, cb, sfb, kernel_dtype)
    return _finish(y, b.shape[0], out_dtype, bias, out)


def _dequant_bf16(q: QTensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(BF16 values, FP32 factor to apply after the GEMM) -- exact for `_bf16_exact_operand`. NVFP4's values
    without their tensor scale (q * b, exact in BF16) are dequantized with a tensor scale of 1, so that the
    dequantize kernel does it rather than the reference's int64 code tensors."""
    if q.spec.scale == ScaleKind.NVFP4:
        one = torch.ones((), dtype=torch.float32, device=q.codes.device)
        bare = QTensor(q.codes, q.scales, q.spec, q.shape, one, q.scale_layout)
        return dequantize(bare, torch.bfloat16), q.tensor_scale.float()
    return dequantize(q, torch.bfloat16), None


def _run_bf16(a: QTensor, b: QTensor, out_dtype, bias, out) -> torch.Tensor:
    xa, ta = _dequant_bf16(a)
    xb, tb = _dequant_bf16(b)
    y = torch.mm(xa, xb.t(), out_dtype=torch.float32)
    for t in (ta, tb):
        if t is not None:
            y = y * t
    return _finish(y, b.shape[0], out_dtype, bias, out)


# Bound on what one step of the blockwise_bf16 path holds: its chunks' FP32 partial sums and their
# scale products, [chunks, M, N] each.
_BLOCKWISE_STEP_BYTES = 1 << 28


def _chunked_operand(q: QTensor, c: int, chunks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(element values [chunks, rows, c], FP32 scales [chunks, rows]) of q for the blockwise_bf16 path:
    K zero-padded to chunks * c; values in BF16 on a GPU (exact: `_bf16_element`), FP32 on the CPU
    (exact products, and a CPU BLAS has no BF16 GEMM with FP32 output); the scale of each row and
    chunk (times nvfp4's tensor scale, as `dequantize` applies it)."""
    rows = q.shape[0]
    values = decode(unpack_codes(q), q.spec.element)
    values = _pad_2d(values, rows, chunks * c).reshape(rows, chunks, c).transpose(0, 1)
    values = values.to(torch.bfloat16 if values.is_cuda else torch.float32).contiguous()
    br, bc = block_shape(q.spec, q.shape)
    s = plain_scales(q)
    if s is None:
        return values, torch.ones(chunks, rows, device=values.device)
    s = s.float()
    if q.tensor_scale is not None:
        s = s * q.tensor_scale
    s = s.repeat_interleave(br, dim=0)[:rows]
    col = torch.arange(chunks, device=s.device) * c // bc  # the scale column of each chunk
    return values, s[:, col].t().contiguous()


def _run_blockwise(a: QTensor, b: QTensor, out_dtype, bias, out) -> torch.Tensor:
    """Per K chunk of constant scales: the element values' GEMM (BF16 tensor cores, FP32 accumulation
    and output; FP32 on the CPU), times the chunk's SFA[m] * SFB[n], summed in FP32."""
    m, k = a.shape
    n = b.shape[0]
    c = _k_chunk(a, b)
    chunks = -(-k // c)
    va, sa = _chunked_operand(a, c, chunks)
    vb, sb = _chunked_operand(b, c, chunks)
    y = torch.zeros(m, n, dtype=torch.float32, device=va.device)
    step = max(1, min(chunks, _BLOCKWISE_STEP_BYTES // (8 * m * n)))
    for j in range(0, chunks, step):
        part = slice(j, j + step)
        if va.is_cuda:
            p = torch.bmm(va[part], vb[part].transpose(1, 2), out_dtype=torch.float32)
        else:
            p = torch.bmm(va[part], vb[part].transpose(1, 2))
        p.mul_(sa[part, :, None] * sb[part, None, :])  # the scale product, then the partial sums times it
        y += p.sum(dim=0)
    return _finish(y, n, out_dtype, bias, out)


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
    exactly); by default the fastest exact one is taken (`select_path`), and a GPU GEMM that finds
    no faster exact path than FP64 ("fp32") says so with a RuntimeWarning. `config` is passed to
    the FP8 blockwise kernels ("tile=64x128,raster=n,swizzle=2"); empty: the one snip_ops.autotune
    chooses (by default its committed per-device table, else the kernels' own heuristic). A named config
    runs once its first output per call signature equals the heuristic's bit for bit (`checked_config`).
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
    device = a.codes.device
    if path is None:
        choice = select_path(a, b, out_dtype=out_dtype, accumulate=out is not None)
        path = choice.path
        if path == "fp32" and device_arch(device) is not None:
            warnings.warn(f"qgemm: no tensor-core path for {a.spec.describe()} x {b.spec.describe()} on {device} "
                          f"(blockwise_bf16: {choice.refused['blockwise_bf16']}); running an FP64 GEMM",
                          RuntimeWarning, stacklevel=2)
    else:
        why = _why_not(path, a, b, device_arch(device), lambda kernel: _ext.kernel_available(kernel, device))
        if why is not None:
            raise ValueError(f"qgemm: path {path!r} cannot run this GEMM: {why}")
    if m == 0 or n == 0 or a.shape[1] == 0:  # empty output, or an empty sum: 0 (+ bias)
        zero = torch.zeros(m, n, dtype=torch.float32, device=a.codes.device)
        return _finish(zero, n, out_dtype, bias, out)
    if path in ("sm90_fp8", "sm90_fp4", "sm100_fp8", "sm100_fp4"):
        return _run_fp8_blockwise(a, b, out_dtype, bias, out, config)
    if path.startswith("sm100_"):
        return _run_sm100(path.removeprefix("sm100_"), a, b, out_dtype, bias, out)
    if path == "bf16_exact":
        return _run_bf16(a, b, out_dtype, bias, out)
    if path == "blockwise_bf16":
        return _run_blockwise(a, b, out_dtype, bias, out)
    return _run_fp32(a, b, out_dtype, bias, out)

