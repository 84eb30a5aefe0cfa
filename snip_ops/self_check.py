"""Kernels earn their use: a compiled kernel runs on a device only after it reproduced the PyTorch
reference there, in this process, on a few small and odd cases (once per kernel and device, a few
milliseconds). A kernel that gives another answer, or raises, is reported by a RuntimeWarning that
names it and its case, and `_ext.kernel_available` says no from then on, so its work goes to the exact
emulated path: never a silently wrong result.

    snip_ops.self_check.configure(enabled=False)   # use compiled kernels unchecked (opt-out)

What is checked: quantization and dequantization bit for bit against `snip_ops.reference` (several
element formats, block shapes, scale kinds and SR; odd shapes, a zero row, float32 and bfloat16
input), the GEMMs against the FP64 product of their dequantized operands within 2^-7 of |a| |b|^T
(tensor-core accumulation stays far inside; a wrong scale, transpose or layout lands far outside),
AdamW bit for bit against `optim.adamw_step_reference`.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Callable

import torch
from torch.utils._python_dispatch import _disable_current_modes

from . import _ext, philox

__all__ = ["configure", "passed", "CHECKS", "GEMM_KERNELS", "quantize_case", "gemm_case"]

_enabled = True
_results: dict[tuple[str, str], bool | None] = {}  # None: being checked (the kernel is used meanwhile)


def configure(*, enabled: bool) -> None:
    """enabled=False: every compiled kernel is used without a self-check (already failed ones too)."""
    global _enabled
    _enabled = bool(enabled)
    _ext.gate_changed()


def passed(kernel: str, device: torch.device | str) -> bool:
    """Whether `kernel` may run on `device`: its check is run the first time this is asked."""
    if not _enabled or kernel not in CHECKS:
        return True
    key = (kernel, str(device if isinstance(device, torch.device) else torch.device(device)))
    if key not in _results:
        if torch.device(key[1]).type == "cuda" and philox.stream_capturing():
            # the check copies its results to the host, which a capture forbids: refused, not failed
            raise RuntimeError(f"snip checks the {kernel} kernel against its reference at its first use on "
                               f"{key[1]}, which cannot happen while a CUDA graph is captured: run the work once "
                               "before capturing it (the warm-up torch.cuda.graph asks for)")
        _results[key] = None
        try:
            # Real tensors and real kernel launches even when asked from inside a trace (a fake impl
            # under torch.compile): no tracing mode may see or record the check.
            with _disable_current_modes():
                CHECKS[kernel](torch.device(device))
            _results[key] = True
        except Exception as e:  # a wrong answer (AssertionError) or a failing launch alike
            _results[key] = False
            warnings.warn(f"snip: the {kernel} kernel failed its self-check on {device} ({type(e).__name__}: {e}); "
                          f"its work runs on the exact emulated path instead. Please report this with "
                          f"snip_ops.build_info().", RuntimeWarning, stacklevel=3)
        finally:
            _ext.gate_changed()  # while it ran, the kernel counted as usable (by the check itself)
    return _results[key] is not False


def _data(rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(rows * 1000 + cols)
    x = torch.randn(rows, cols, generator=g) * torch.logspace(-3, 3, cols)
    x[1] = 0.0  # an all-zero block
    return x.to(dtype)


def _same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    got = got.cpu()
    if got.dtype.is_floating_point and got.element_size() == 4:
        got, want = got.view(torch.int32), want.view(torch.int32)
    elif got.element_size() == 1:
        got, want = got.view(torch.uint8), want.view(torch.uint8)
    if got.shape != want.shape or not torch.equal(got, want):
        raise AssertionError(f"{what}: differs from the reference")


_QUANT_SPECS = ("e4m3/1x128/fp32/rne", "e4m3/128x128/fp32/rne", "e5m2/1x128/pow2/sr", "e2m1/1x16/nvfp4/sr",
                "e2m1/1x32/e8m0/sr", "e4m3/1x32/e8m0/rne", "e2m1/16x16/fp32/rne")
_LAYOUT_CASES = (("e4m3/1x128/fp32/rne", "hopper"), ("e4m3/128x128/fp32/rne", "hopper"), ("e5m2/1x128/pow2/sr", "hopper"),
                 ("e2m1/1x16/nvfp4/sr", "blackwell"))

# GEMM kernel -> (the qgemm path that runs it, the recipe whose GEMMs' operands it takes; E5M2 x E4M3
# is the fp8_e5m2grad recipe's dgrad and wgrad)
GEMM_KERNELS = {"fp8_gemm_nt_blockwise": ("sm90_fp8", "fp8"),
                "fp8_gemm_nt_blockwise_e5m2": ("sm90_fp8", "fp8_e5m2grad"),
                "fp8_gemm_nt_blockwise_sm100": ("sm100_fp8", "fp8"),
                "fp8_gemm_nt_blockwise_e5m2_sm100": ("sm100_fp8", "fp8_e5m2grad"),
                "nvfp4_gemm_nt": ("sm100_nvfp4", "nvfp4"),
                "mxfp4_gemm_nt": ("sm100_mxfp4", "mxfp4"), "mxfp8_gemm_nt": ("sm100_mxfp8", "mxfp8")}


def quantize_case(device: torch.device, spec_text: str, dtype: torch.dtype, rows: int, cols: int,
                  transpose: bool = False, scale_layout: str = "plain") -> None:
    """snip_ops.quantize on `device` against the reference on the CPU, codes and scales (moved to
    `scale_layout`, padding included) bit for bit."""
    from .formats import QuantSpec
    from .quantize import quantize
    from .reference import quantize as reference_quantize
    from .scale_layout import to_layout

    x, spec = _data(rows, cols, dtype), QuantSpec.parse(spec_text)
    case = f"{spec_text} {dtype} [{rows}, {cols}] transpose={transpose} {scale_layout} scales"
    got = quantize(x.to(device), spec, seed=3, offset=5, transpose=transpose, scale_layout=scale_layout)
    want = reference_quantize(x, spec, seed=3, offset=5, transpose=transpose)
    _same(got.codes, want.codes, f"codes of {case}")
    _same(got.scales, to_layout(want.scales, scale_layout), f"scales of {case}")


def gemm_case(device: torch.device, kernel: str, m: int, n: int, k: int) -> None:
    """The GEMM `kernel` (through gemm_kernels.qgemm) on the operands of its recipe's fprop, dgrad and
    wgrad (a [m, k], b [n, k], blocks along k as each GEMM quantizes them), writing BF16 and FP32,
    against the FP64 product of the dequantized operands: within 2^-7 |a| |b|^T elementwise (which
    also covers a BF16 output's 2^-9)."""
    from . import gemm_kernels
    from .formats import GEMMS, recipe
    from .quantize import quantize

    path, recipe_name = GEMM_KERNELS[kernel]
    r = recipe(recipe_name)
    for gemm in GEMMS:
        a_spec, b_spec = gemm_kernels.gemm_operand_specs(r, gemm)
        # fprop quantizes x and w as they are; dgrad w^T, wgrad dy^T and x^T from their transposes.
        a_t, b_t = gemm == "wgrad", gemm != "fprop"
        x = _data(k, m, torch.float32) if a_t else _data(m, k, torch.float32)
        w = (_data(k, n, torch.float32) if b_t else _data(n, k, torch.float32)) * 1e-2
        a = quantize(x.to(device), a_spec, transpose=a_t)
        b = quantize(w.to(device), b_spec, transpose=b_t)
        da, db = a.dequantize().cpu().double(), b.dequantize().cpu().double()
        ref, mag = da @ db.t(), da.abs() @ db.abs().t()
        for out_dtype in (torch.bfloat16, torch.float32):
            y = gemm_kernels.qgemm(a, b, out_dtype=out_dtype, path=path).cpu().double()
            err = (y - ref).abs()
            if not bool((err <= 2.0**-7 * mag + 1e-30).all()):
                raise AssertionError(f"{path} on {recipe_name} {gemm} [{m}, {n}, {k}] -> {out_dtype}: error "
                                     f"{float(err.max()):.3g} beyond 2^-7 |a| |b|^T")


def _check_quantize(device: torch.device) -> None:
    cases = [(torch.float32, text) for text in _QUANT_SPECS] + [(torch.bfloat16, _QUANT_SPECS[0])]
    for (dtype, text), transpose in itertools.product(cases, (False, True)):
        quantize_case(device, text, dtype, 37, 300, transpose)
    # the layouts the layer writes for its GEMMs (gemm_kernels.scale_layout_for); 37 rows pad the Hopper pitch
    for (text, layout), transpose in itertools.product(_LAYOUT_CASES, (False, True)):
        quantize_case(device, text, torch.bfloat16, 37, 300, transpose, layout)


def _check_dequantize(device: torch.device) -> None:
    from .formats import QuantSpec
    from .quantize import dequantize
    from .reference import dequantize as reference_dequantize, quantize as reference_quantize

    x = _data(37, 300, torch.float32)
    for text in _QUANT_SPECS:
        want = reference_quantize(x, QuantSpec.parse(text), seed=3)
        on_device = type(want)(want.codes.to(device), want.scales.to(device), want.spec, want.shape,
                               None if want.tensor_scale is None else want.tensor_scale.to(device))
        _same(dequantize(on_device), reference_dequantize(want), f"dequantize of {text} [37, 300]")


def _check_e2m1_as_e4m3(device: torch.device) -> None:
    from .formats import E2M1, QuantSpec
    from .gemm_kernels import _pad_2d, fp4_codes_as_e4m3
    from .reference import QTensor

    # every byte value, 31 of the 32 codes of each row (an odd tail), rows and columns of padding
    codes = torch.arange(320, dtype=torch.int64).remainder(256).to(torch.uint8).reshape(16, 20)[:, 2:18]
    want = _pad_2d(fp4_codes_as_e4m3(QTensor(codes, torch.ones(16, 1), QuantSpec(E2M1), (16, 31))), 21, 40)
    _same(torch.ops.snip_C.e2m1_as_e4m3(codes.to(device), 31, 21, 40), want, "e2m1_as_e4m3 [16, 31] -> [21, 40]")


def _gemm_check(kernel: str) -> Callable[[torch.device], None]:
    def check(device: torch.device) -> None:
        for m, n, k in ((37, 24, 300), (128, 136, 512)):
            gemm_case(device, kernel, m, n, k)
    return check


def _check_adamw(device: torch.device) -> None:
    from .optim import adamw_scalars, adamw_step_reference

    for dtype, bf16_sr in ((torch.float32, False), (torch.bfloat16, True)):
        p = _data(7, 33, torch.float32).to(dtype)
        g = _data(7, 33, torch.float32).to(dtype) * 1e-2
        m, v = torch.zeros(7, 33), torch.zeros(7, 33)
        s = adamw_scalars(1e-3, 0.9, 0.95, 1e-8, 0.1, 1)
        want = [t.clone() for t in (p, m, v)]
        adamw_step_reference([want[0]], [g], [want[1]], [want[2]], [0], [0], s, 1, 7, bf16_sr)
        got = [t.to(device) for t in (p, m, v)]
        torch.ops.snip_C.adamw_([got[0]], [g.to(device)], [got[1]], [got[2]], [0], [0], *s.as_tuple(), 1, 7, bf16_sr)
        for name, a, b in zip(("param", "exp_avg", "exp_avg_sq"), got, want):
            _same(a, b, f"adamw {name} ({dtype}, bf16_sr={bf16_sr})")


# kernel name (as in snip_ops._ext.kernels()) -> its check on a device
CHECKS: dict[str, Callable[[torch.device], None]] = {
    "quantize": _check_quantize,
    "dequantize": _check_dequantize,
    "e2m1_as_e4m3": _check_e2m1_as_e4m3,
    "adamw": _check_adamw,
    **{kernel: _gemm_check(kernel) for kernel in GEMM_KERNELS},
}
