"""`snip_ops.linear`: y = x w^T + b with each of its three GEMMs in its own precision (DESIGN.md §3).

Two `torch.library` custom ops with fake implementations (so `torch.compile(fullgraph=True)` traces
through them) under a thin `autograd.Function`:

* `snip::linear_fwd(x, w)` quantizes each operand once for all its uses and runs fprop. Besides y
  it returns the operands backward needs in quantized form: x^T (wgrad) and w^T (dgrad). On the
  kernels x's row-wise and column-wise codes come from one pass (`quantize_rowcol`) when fprop and
  wgrad quantize it alike, and backward keeps those FP8/FP4 codes instead of the activations.
  With square (128x128) blocks and round-to-nearest, w^T is w's quantization transposed: the
  weight is quantized once per step.
* `snip::linear_bwd(dy, ...)` quantizes dy once for dgrad (row-wise) and wgrad (column-wise), fused
  in the same way, and runs both GEMMs.

Kernel mode (the native quantizer exists for the tensor's device -- a GPU it is compiled for, or the
CPU with its host implementation -- and `emulate=False`): `snip_ops.quantize` and, on a GPU,
`gemm_kernels.qgemm` (on the CPU, whose exact GEMM is the FP32 one, the operands are dequantized by
the native op and multiplied as in emulated mode); operands cross the op boundary as `qparts`. An
operand bound for a Blackwell block-scaled GEMM is quantized with its scales already in that GEMM's layout
(`gemm_kernels.scale_layout_for`), so no GEMM call relays scales out. Emulated mode (elsewhere, or
`emulate=True`): `reference.fake_quantize` gives the dequantized values directly (no codes to build),
multiplied with FP32 accumulation; those float32 values are what backward keeps. Both modes see the
same quantized values. A GEMM whose recipe is bf16 runs on the unquantized operands in their dtype
(autograd then keeps those). A recipe crosses the op boundary as its string key, the SR offset as a
0-d int64 tensor (so a new offset each step does not recompile); operand `o` of a call draws its SR
bits at offset `gemm.operand_offset(offset, o)`. Under a recipe with `wgrad_hadamard` (nvfp4_train)
x^T and dy^T are quantized from their random Hadamard transforms T x and T dy (tokens padded to the
transform size, `gemm.wgrad_operand`), so those two are quantized apart from x and dy; the native
quantizer applies the transform itself (`quantize.quantize_hadamard_t`).
"""

from __future__ import annotations

import functools

import torch

from . import _ext
from .formats import GemmRecipe, LinearPrecision, QuantSpec
from .gemm import (emulated_operand, fp32_mm, hadamard_wgrad_operand, operand_offset,
                   transpose_shares_quantization)
from .gemm_kernels import qgemm, scale_layout_for
from .hadamard import padded_tokens
from .qparts import from_parts, meta_parts, num_parts, to_parts
from .quantize import dequantize, quantize, quantize_rowcol
from .reference import QTensor

__all__ = ["linear"]


@functools.lru_cache(maxsize=None)
def _recipe(key: str) -> GemmRecipe:
    return GemmRecipe.from_key(key)


def _no_autocast(t: torch.Tensor):
    """The GEMMs define their own numerics (FP32 accumulation of dequantized operands): an
    enclosing autocast region must not turn those into BF16 matmuls."""
    return torch.autocast(t.device.type, enabled=False)


# An operand as a GEMM consumes it: a QTensor (kernel mode: CUDA quantizer codes + scales), or float32
# values (emulated mode: the dequantized values `reference.fake_quantize` gives, with no codes to
# build; or the unquantized operand where its spec is None).
Operand = QTensor | torch.Tensor


def _kernel_mode(t: torch.Tensor, emulate: bool) -> bool:
    return not emulate and _ext.kernel_available("quantize", t.device)


def _quantize(t, spec, seed, offset, operand, transpose, kernels) -> Operand:
    if kernels and spec is not None:
        return quantize(t, spec, seed=seed, offset=operand_offset(offset, operand), transpose=transpose,
                        scale_layout=scale_layout_for(spec, t.device))
    return emulated_operand(t, spec, seed, offset, operand, transpose)


def _quantize_hadamard_t(t, wr: GemmRecipe, spec, seed, offset, operand, kernels) -> Operand:
    """t's wgrad operand under a recipe with a Hadamard transform (`gemm.hadamard_wgrad_operand`),
    its scales in the layout its GEMM reads."""
    return hadamard_wgrad_operand(t, wr, spec, seed, offset, operand, kernels,
                                  scale_layout_for(spec, t.device) if kernels else "plain")


def _quantize_both(t: torch.Tensor, row: QuantSpec | None, col: QuantSpec | None, need_row: bool, need_col: bool,
                   seed: int, offset: int, row_operand: str, col_operand: str, kernels: bool):
    """(t as its row-wise operand, t^T as its column-wise operand); None where not needed. On the
    kernels both come from one pass over t where their specs agree."""
    if kernels and need_row and need_col and row is not None and row == col:
        return quantize_rowcol(t, row, seed=seed, offset=operand_offset(offset, row_operand),
                               offset_t=operand_offset(offset, col_operand),
                               scale_layout=scale_layout_for(row, t.device))
    return (_quantize(t, row, seed, offset, row_operand, False, kernels) if need_row else None,
            _quantize(t, col, seed, offset, col_operand, True, kernels) if need_col else None)


def _gemm(a: Operand, b: Operand, out_dtype: torch.dtype) -> torch.Tensor:
    """a . b^T with FP32 accumulation, rounded once to `out_dtype`."""
    if isinstance(a, QTensor) and isinstance(b, QTensor) and a.codes.is_cuda:
        return qgemm(a, b, out_dtype=out_dtype)
    av = dequantize(a) if isinstance(a, QTensor) else a
    bv = dequantize(b) if isinstance(b, QTensor) else b
    return fp32_mm(av, bv.t()).to(out_dtype)


def _wgrad_tokens(m: int, wr: GemmRecipe) -> int:
    """The token count of wgrad's operands: M, padded to whole groups under a Hadamard transform."""
    return padded_tokens(m, wr.wgrad_hadamard) if wr.wgrad_hadamard else m


def _n_saved(spec: QuantSpec | None, kernels: bool) -> int:
    """How many tensors carry a saved operand: QTensor parts on the kernels, else float32 values."""
    return num_parts(spec) if kernels and spec is not None else 1


def _saved(q: Operand) -> list[torch.Tensor]:
    return to_parts(q) if isinstance(q, QTensor) else [q.contiguous()]


def _saved_meta(spec: QuantSpec | None, shape: tuple[int, int], kernels: bool, like: torch.Tensor) -> list[torch.Tensor]:
    if kernels and spec is not None:
        return meta_parts(spec, shape, like, scale_layout_for(spec, like.device))
    return [like.new_empty(*shape, dtype=torch.float32)]


def _restored(parts: list[torch.Tensor], spec: QuantSpec | None, shape: tuple[int, int], kernels: bool) -> Operand:
    if kernels and spec is not None:
        return from_parts(parts, spec, shape, scale_layout_for(spec, parts[0].device))
    return parts[0]


def _prequantized_weight(parts: list[torch.Tensor], w_spec: QuantSpec | None, wt_spec: QuantSpec | None,
                         shape: tuple[int, int], keep_wt: bool, kernels: bool) -> tuple[Operand, Operand | None]:
    """(w for fprop, w^T for dgrad or None) from the weight's quantization made before the op (an
    FSDP2 low-precision all-gather, snip_ops/fsdp.py): the `qparts` of w quantized with `w_spec`,
    then, where dgrad's spec differs, those of w quantized with `wt_spec`. Both specs must be square
    round-to-nearest blocks, for which w^T's quantization is w's transposed (the same bits as
    quantizing w here)."""
    specs = [w_spec] if wt_spec == w_spec else [w_spec, wt_spec]
    if None in specs or not all(transpose_shares_quantization(s) and s.block[0] > 0 for s in specs):
        raise ValueError(f"linear: a pre-quantized weight needs square round-to-nearest weight blocks in fprop "
                         f"and dgrad, got {[None if s is None else s.describe() for s in specs]}")
    n_w = num_parts(w_spec)
    if len(parts) != sum(num_parts(s) for s in specs):
        raise ValueError(f"linear: the pre-quantized weight has {len(parts)} parts; "
                         f"{' + '.join(s.describe() for s in specs)} take {sum(num_parts(s) for s in specs)}")
    wq = from_parts(parts[:n_w], w_spec, shape)
    wtq = (wq if wt_spec == w_spec else from_parts(parts[n_w:], wt_spec, shape)).t() if keep_wt else None
    if kernels:
        return wq, wtq
    return dequantize(wq), None if wtq is None else dequantize(wtq)


# The schema is spelled out for `wq`'s `Tensor[]? = None`, which the annotations cannot express.
@torch.library.custom_op("snip::linear_fwd", mutates_args=(), schema=(
    "(Tensor x, Tensor? w, str fprop, str dgrad, str wgrad, int seed, Tensor offset, bool emulate, bool need_dx, "
    "bool need_dw, Tensor[]? wq=None) -> Tensor[]"))
def _fwd(x: torch.Tensor, w: torch.Tensor | None, fprop: str, dgrad: str, wgrad: str, seed: int,
         offset: torch.Tensor, emulate: bool, need_dx: bool, need_dw: bool,
         wq: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """[y, *x^T (for wgrad), *w^T (for dgrad)]: each saved operand only where backward needs its
    quantized form (not for a bf16-recipe GEMM, which uses the unquantized tensor), as `_n_saved`
    tensors. No placeholders: zero-size tensors confuse the compiler's handling of saved tensors.
    `wq` (with w None): the weight already quantized, see `_prequantized_weight`."""
    fr, dr, wr = _recipe(fprop), _recipe(dgrad), _recipe(wgrad)
    off, kernels = int(offset), _kernel_mode(x, emulate)
    keep_xt = need_dw and not wr.is_bf16
    keep_wt = need_dx and not dr.is_bf16
    with _no_autocast(x):
        rht = keep_xt and wr.wgrad_hadamard  # x^T is then quantized from T x, not from x
        xq, xtq = _quantize_both(x, fr.act, wr.act, not fr.is_bf16, keep_xt and not rht, seed, off, "x", "xt", kernels)
        if rht:
            xtq = _quantize_hadamard_t(x, wr, wr.act, seed, off, "xt", kernels)
        w_spec, wt_spec = fr.weight, dr.weight
        shared = w_spec is not None and w_spec == wt_spec and transpose_shares_quantization(w_spec)
        if wq is not None:
            wq, wtq = _prequantized_weight(wq, w_spec, wt_spec, (wq[0].shape[0], x.shape[1]), keep_wt, kernels)
        elif not fr.is_bf16 and keep_wt and shared and not kernels:
            wq = _quantize(w, w_spec, seed, off, "w", False, kernels)
            wtq = wq.t()  # the emulated weight, quantized once for both of its GEMMs
        else:  # on the kernels, w and w^T come from one fused row + column pass
            wq, wtq = _quantize_both(w, w_spec, wt_spec, not fr.is_bf16, keep_wt, seed, off, "w", "wt", kernels)
        y = (x @ w.t()).to(x.dtype) if fr.is_bf16 else _gemm(xq, wq, x.dtype)
    return [y, *(_saved(xtq) if keep_xt else []), *(_saved(wtq) if keep_wt else [])]


@_fwd.register_fake
def _(x, w, fprop, dgrad, wgrad, seed, offset, emulate, need_dx, need_dw, wq=None):
    dr, wr = _recipe(dgrad), _recipe(wgrad)
    (m, k), n = x.shape, (w if wq is None else wq[0]).shape[0]
    kernels = _kernel_mode(x, emulate)
    xt = _saved_meta(wr.act, (k, _wgrad_tokens(m, wr)), kernels, x) if need_dw and not wr.is_bf16 else []
    wt = _saved_meta(dr.weight, (k, n), kernels, x) if need_dx and not dr.is_bf16 else []
    return [x.new_empty(m, n), *xt, *wt]


@torch.library.custom_op("snip::linear_bwd", mutates_args=())
def _bwd(dy: torch.Tensor, x: torch.Tensor | None, xt: list[torch.Tensor], w: torch.Tensor | None,
         wt: list[torch.Tensor], in_features: int, dgrad: str, wgrad: str, seed: int, offset: torch.Tensor,
         emulate: bool, need_dx: bool, need_dw: bool) -> list[torch.Tensor]:
    """[dx [M, K] in dy's dtype if need_dx] + [dw [N, K] float32 if need_dw]. `x` / `w`: the
    unquantized operands of a bf16-recipe wgrad / dgrad (else None); `xt` / `wt`: the operands
    the forward op saved (else empty lists)."""
    dr, wr = _recipe(dgrad), _recipe(wgrad)
    off, kernels = int(offset), _kernel_mode(dy, emulate)
    m, n = dy.shape
    out = []
    with _no_autocast(dy):
        rht = need_dw and wr.wgrad_hadamard  # dy^T is then quantized from T dy, not from dy
        dyq, dytq = _quantize_both(dy, dr.grad, wr.grad, need_dx and not dr.is_bf16,
                                   need_dw and not wr.is_bf16 and not rht, seed, off, "dy", "dyt", kernels)
        if rht:
            dytq = _quantize_hadamard_t(dy, wr, wr.grad, seed, off, "dyt", kernels)
        if need_dx:
            out.append((dy @ w).to(dy.dtype) if dr.is_bf16
                       else _gemm(dyq, _restored(wt, dr.weight, (in_features, n), kernels), dy.dtype))
        if need_dw:
            out.append((dy.t() @ x).float() if wr.is_bf16
                       else _gemm(dytq, _restored(xt, wr.act, (in_features, _wgrad_tokens(m, wr)), kernels),
                                  torch.float32))
    return out


@_bwd.register_fake
def _(dy, x, xt, w, wt, in_features, dgrad, wgrad, seed, offset, emulate, need_dx, need_dw):
    m, n = dy.shape
    return ([dy.new_empty(m, in_features)] if need_dx else []) + (
        [dy.new_empty(n, in_features, dtype=torch.float32)] if need_dw else [])


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, w, b, fprop, dgrad, wgrad, seed, offset, emulate, dgrad_bf16, wgrad_bf16, n_xt):
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        y, *saved = torch.ops.snip.linear_fwd(x2, w, fprop, dgrad, wgrad, seed, offset, emulate, need_dx, need_dw)
        # The unquantized operands are kept only for a bf16-recipe GEMM that needs them.
        x_keep = x2 if need_dw and wgrad_bf16 else None
        w_keep = w if need_dx and dgrad_bf16 else None
        ctx.save_for_backward(x_keep, w_keep, offset, *saved)
        ctx.args = (w.shape[1], w.dtype, dgrad, wgrad, seed, emulate, need_dx, need_dw,
                    n_xt if need_dw and not wgrad_bf16 else 0)
        ctx.bias_dtype = None if b is None else b.dtype
        return y if b is None else y + b.to(y.dtype)

    @staticmethod
    def backward(ctx, dy):
        x_keep, w_keep, offset, *saved = ctx.saved_tensors
        in_features, w_dtype, dgrad, wgrad, seed, emulate, need_dx, need_dw, n_xt = ctx.args
        grads = torch.ops.snip.linear_bwd(dy.contiguous(), x_keep, saved[:n_xt], w_keep, saved[n_xt:], in_features,
                                          dgrad, wgrad, seed, offset, emulate, need_dx, need_dw)
        dx = grads[0] if need_dx else None
        dw = grads[-1].to(w_dtype) if need_dw else None
        db = None
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            db = dy.float().sum(0).to(ctx.bias_dtype)
        return dx, dw, db, *([None] * 9)


def _check(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    for name, t in (("x", x), ("w", w), ("b", b)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"linear: {name} must be a tensor, got {type(t).__name__}")
        if t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise TypeError(f"linear: {name} must be float32, bfloat16 or float16, got {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"linear: {name} is on {t.device} but x is on {x.device}")
    if w.dim() != 2:
        raise ValueError(f"linear: w must be 2-D [out_features, in_features], got shape {tuple(w.shape)}")
    if x.dim() < 1 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"linear: x's last dimension ({tuple(x.shape)}) must equal w.shape[1] ({w.shape[1]})")
    if x.dtype != w.dtype:
        raise TypeError(f"linear: x ({x.dtype}) and w ({w.dtype}) must have the same dtype")
    if b is not None and tuple(b.shape) != (w.shape[0],):
        raise ValueError(f"linear: b must have shape ({w.shape[0]},), got {tuple(b.shape)}")


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None = None,
    precision: LinearPrecision | GemmRecipe | str | None = None,
    *,
    seed: int = 0,
    offset: int | torch.Tensor = 0,
    emulate: bool = False,
) -> torch.Tensor:
    """`torch.nn.functional.linear` with low-precision GEMMs.

    x: [..., K]; w: [N, K]; b: [N] or None; precision: a `LinearPrecision`, a recipe, a recipe name
    ("fp8", "fp4", ...) or None for BF16 (plain `F.linear`). `(seed, offset)` key stochastic
    rounding; pass a new offset each step (0-d int64 tensor under torch.compile). On a GPU the
    quantization and GEMM kernels run where they exist; `emulate=True` keeps the reference
    quantizer and the FP32 GEMM of the dequantized operands there too (the same quantized values).
    Under `torch.autocast` the layer computes in the autocast dtype, like `F.linear`.
    """
    if isinstance(x, torch.Tensor) and torch.is_autocast_enabled(x.device.type):
        # What F.linear does under autocast: compute in the autocast dtype; the casts are
        # differentiable, so FP32 master weights receive FP32 gradients.
        dtype = torch.get_autocast_dtype(x.device.type)
        x, w, b = (None if t is None else t.to(dtype) for t in (x, w, b))
    _check(x, w, b)
    precision = LinearPrecision.of(precision)
    if precision.is_bf16:
        return torch.nn.functional.linear(x, w, b)
    if not torch.is_tensor(offset):
        offset = torch.tensor(offset, dtype=torch.int64)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    y = _Linear.apply(
        x2, w, b, precision.fprop.key(), precision.dgrad.key(), precision.wgrad.key(), seed, offset.detach().cpu(),
        bool(emulate), precision.dgrad.is_bf16, precision.wgrad.is_bf16,
        _n_saved(precision.wgrad.act, _kernel_mode(x2, emulate)),
    )
    return y.reshape(*lead, w.shape[0])
