"""`snip_ops.linear`: y = x w^T + b with each of its three GEMMs in its own precision (docs/design.md §3).

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
operand is quantized with its scales already in the layout its GEMM reads (`gemm_kernels.scale_layout_for`:
Blackwell's block-scaled atoms, or the blockwise FP8 kernels' MN-major FP32 scales), so no GEMM call relays
scales out. Emulated mode (elsewhere, or
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

import contextlib
import functools
import sys
from dataclasses import dataclass
from typing import NamedTuple

import torch

from . import _ext, philox
from .formats import GemmRecipe, LinearPrecision, QuantSpec, Rounding
from .gemm import (emulated_operand, fp32_mm, hadamard_wgrad_operand, operand_offset,
                   transpose_shares_quantization)
from .gemm_kernels import qgemm, scale_layout_for
from .hadamard import padded_tokens
from .qparts import from_parts, meta_parts, num_parts, to_parts
from .quantize import dequantize, quantize, quantize_rowcol
from .reference import QTensor

__all__ = ["linear", "weight_operands", "weight_operands_reusable"]


@functools.lru_cache(maxsize=None)
def _recipe(key: str) -> GemmRecipe:
    return GemmRecipe.from_key(key)


def _no_autocast(t: torch.Tensor):
    """The GEMMs define their own numerics (FP32 accumulation of dequantized operands): an
    enclosing autocast region must not turn those into BF16 matmuls. (Outside one there is nothing
    to switch off, and the context manager's own cost is saved.)"""
    if not torch.is_autocast_enabled(t.device.type):
        return contextlib.nullcontext()
    return torch.autocast(t.device.type, enabled=False)


# An operand as a GEMM consumes it: a QTensor (kernel mode: CUDA quantizer codes + scales), or float32
# values (emulated mode: the dequantized values `reference.fake_quantize` gives, with no codes to
# build; or the unquantized operand where its spec is None).
Operand = QTensor | torch.Tensor


def _kernel_mode(t: torch.Tensor, emulate: bool) -> bool:
    return not emulate and _ext.kernel_available("quantize", t.device)


@dataclass(frozen=True)
class _Quantizer:
    """How one op call quantizes its operands: the SR key (`seed`, and the step's `offset`, at which operand `o`
    draws its bits from `gemm.operand_offset(offset, o)`) and the mode (`kernels`: the native quantizer, the
    scales in the layout their GEMM reads; else the emulated operand's float32 values)."""

    seed: int
    offset: int
    kernels: bool

    def operand(self, t: torch.Tensor, spec: QuantSpec | None, operand: str, transpose: bool = False) -> Operand:
        if self.kernels and spec is not None:
            return quantize(t, spec, seed=self.seed, offset=operand_offset(self.offset, operand), transpose=transpose,
                            scale_layout=scale_layout_for(spec, t.device))
        return emulated_operand(t, spec, self.seed, self.offset, operand, transpose)

    def hadamard_t(self, t: torch.Tensor, wr: GemmRecipe, spec: QuantSpec | None, operand: str) -> Operand:
        """t's wgrad operand under a recipe with a Hadamard transform (`gemm.hadamard_wgrad_operand`)."""
        return hadamard_wgrad_operand(t, wr, spec, self.seed, self.offset, operand, self.kernels,
                                      scale_layout_for(spec, t.device) if self.kernels else "plain")

    def row_and_col(self, t: torch.Tensor, row: QuantSpec | None, col: QuantSpec | None, need_row: bool,
                    need_col: bool, row_operand: str, col_operand: str) -> tuple[Operand | None, Operand | None]:
        """(t as its row-wise operand, t^T as its column-wise operand); None where not needed. On the
        kernels both come from one pass over t where their specs agree."""
        if self.kernels and need_row and need_col and row is not None and row == col:
            return quantize_rowcol(t, row, seed=self.seed, offset=operand_offset(self.offset, row_operand),
                                   offset_t=operand_offset(self.offset, col_operand),
                                   scale_layout=scale_layout_for(row, t.device))
        return (self.operand(t, row, row_operand) if need_row else None,
                self.operand(t, col, col_operand, transpose=True) if need_col else None)


def _gemm(a: Operand, b: Operand, out_dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """a . b^T with FP32 accumulation, rounded once to `out_dtype`; with `out` (FP32), added into it: on the
    kernels by the GEMM's epilogue (beta = 1, one rounding), else the FP32 product added."""
    if out is not None and out.dtype != out_dtype:  # the emulated sum would be rounded to out_dtype first
        raise ValueError(f"linear: a GEMM into a {out.dtype} tensor must be asked for {out.dtype}, not {out_dtype}")
    if isinstance(a, QTensor) and isinstance(b, QTensor) and a.codes.is_cuda:
        return qgemm(a, b, out_dtype=out_dtype, out=out)
    av = dequantize(a) if isinstance(a, QTensor) else a
    bv = dequantize(b) if isinstance(b, QTensor) else b
    y = fp32_mm(av, bv.t()).to(out_dtype)
    return y if out is None else out.add_(y)


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


def _weight_operands(w: torch.Tensor | None, parts: list[torch.Tensor] | None, in_features: int, fr: GemmRecipe,
                     dr: GemmRecipe, keep_wt: bool, q: _Quantizer) -> tuple[Operand | None, Operand | None]:
    """(w for fprop or None where fprop is bf16, w^T for dgrad or None): from the pre-quantized `parts` where
    given (`_prequantized_weight`), else quantized here."""
    w_spec, wt_spec = fr.weight, dr.weight
    if parts is not None:
        return _prequantized_weight(parts, w_spec, wt_spec, (parts[0].shape[0], in_features), keep_wt, q.kernels)
    shared = w_spec is not None and w_spec == wt_spec and transpose_shares_quantization(w_spec)
    if not fr.is_bf16 and keep_wt and shared and not q.kernels:
        wq = q.operand(w, w_spec, "w")
        return wq, wq.t()  # the emulated weight, quantized once for both of its GEMMs
    # on the kernels, w and w^T come from one fused row + column pass
    return q.row_and_col(w, w_spec, wt_spec, not fr.is_bf16, keep_wt, "w", "wt")


class _Call(NamedTuple):
    """The arguments both ops take after their operands, in their schemas' order: the backward GEMMs' recipe
    keys, the SR seed and offset (0-d int64 CPU tensors: torch.compile guards on an int's value, and would
    compile a block once per layer seed), emulated or kernel mode, and which gradients backward computes."""

    dgrad: str
    wgrad: str
    seed: torch.Tensor
    offset: torch.Tensor
    emulate: bool
    need_dx: bool
    need_dw: bool

    @classmethod
    def with_tail(cls, args: tuple) -> tuple["_Call", object, object]:
        """The call's arguments and the two that follow them (linear_fwd's `wq` and `w_operand`), None where
        omitted: the dispatcher leaves out trailing arguments that have their default value."""
        n = len(cls._fields)
        tail = tuple(args[n:]) + (None, None)
        return cls(*args[:n]), tail[0], tail[1]

    def quantizer(self, like: torch.Tensor) -> _Quantizer:
        return _Quantizer(int(self.seed), int(self.offset), _kernel_mode(like, self.emulate))


_LIB = torch.library.Library("snip", "DEF")


def _outside_dynamo(impl):
    """`impl` with torch.compile's frame hook off while it runs. Only compiled code can have set that hook, and
    there is none before torch._dynamo is loaded: until then `impl` runs as it is, so that a process that never
    compiles does not import dynamo (seconds) at its first layer call, as `torch._disable_dynamo` would."""
    disabled = None

    @functools.wraps(impl)
    def kernel(*args, **kwargs):
        nonlocal disabled
        if "torch._dynamo" not in sys.modules:
            return impl(*args, **kwargs)
        if disabled is None:
            disabled = sys.modules["torch._dynamo"].disable(impl)
        return disabled(*args, **kwargs)

    return kernel


def _register(name: str, impl, fake, schema: str) -> None:
    """Register `impl` (with `fake`, its shape function) as two ops: snip::<name>, and snip::<name>_seeded
    tagged cudagraph_unsafe, which a layer calls where the op's quantizations draw random bits (stochastic
    rounding, the Hadamard signs). Those bits' offset is read on the host and passed to the kernels at launch;
    a CUDA graph would replay it, every step drawing the first step's bits. With the tag, torch.compile's
    CUDA-graph mode runs the seeded ops outside its graphs, while the round-to-nearest ops may be captured. A
    graph captured by hand around a seeded op is refused with an error (`philox.refuse_capture`).

    `torch.library.custom_op` would wrap `impl` in Python layers of its own on every call (an autograd kernel
    that redispatches, an aliasing check of the outputs), most of an op call's overhead: the ops
    are defined with their schema and `impl` is their one kernel, for every device (CompositeExplicitAutograd).
    They have no derivative (`_Linear` is theirs) and are called with gradients off. `impl` runs with
    torch.compile's frame hook off (`_outside_dynamo`), as custom_op's kernels do: compiled code that calls the
    op must not trace its Python."""
    kernel = _outside_dynamo(impl)

    def seeded_kernel(first, *args, **kwargs):  # the first argument is the op's activation or gradient
        philox.refuse_capture(first, f"snip::{name} (a layer whose quantizations draw random bits)")
        return kernel(first, *args, **kwargs)

    for op_name, op_kernel, tags in ((name, kernel, ()),
                                     (f"{name}_seeded", seeded_kernel, (torch.Tag.cudagraph_unsafe,))):
        _LIB.define(op_name + schema, tags=tags)
        _LIB.impl(op_name, op_kernel, "CompositeExplicitAutograd")
        torch.library.register_fake(f"snip::{op_name}", fake, lib=_LIB)


def _draws_bits(*specs: QuantSpec | None, hadamard: int = 0) -> bool:
    """Whether quantizing with these specs (and a Hadamard transform's signs) draws random bits."""
    return bool(hadamard) or any(s is not None and s.rounding == Rounding.SR for s in specs)


def weight_operands_reusable(precision: LinearPrecision) -> bool:
    """Whether a layer of `precision` may reuse its weight's GEMM operands while the weight is unchanged:
    fprop quantizes the weight, and neither fprop's nor dgrad's weight quantization draws random bits, so
    quantizing the same weight again gives the same bits."""
    fr, dr = precision.fprop, precision.dgrad
    return not fr.is_bf16 and not _draws_bits(fr.weight, None if dr.is_bf16 else dr.weight)


def weight_operands(w: torch.Tensor, precision: LinearPrecision,
                    emulate: bool = False) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The weight's GEMM operands exactly as `snip::linear_fwd` makes them when it quantizes `w` itself: (w for
    fprop, w^T for dgrad, or [] where dgrad is bf16), each as kernel mode's `qparts` in its GEMM's scale
    layout, or emulated mode's float32 values. `precision` must be `weight_operands_reusable`. The first is
    linear_fwd's `w_operand`; the second is what it would have saved for backward."""
    if not weight_operands_reusable(precision):
        raise ValueError(f"linear: a layer of precision {precision} quantizes its weight with random bits or not "
                         "at all; its weight operands cannot be reused")
    fr, dr = precision.fprop, precision.dgrad
    q = _Quantizer(0, 0, _kernel_mode(w, emulate))  # no bits are drawn: the seed and offset are unused
    with torch.no_grad(), _no_autocast(w):
        wq, wtq = _weight_operands(w, None, w.shape[1], fr, dr, not dr.is_bf16, q)
    return _saved(wq), (_saved(wtq) if wtq is not None else [])


def _reused_weight_operand(parts: list[torch.Tensor], in_features: int, fr: GemmRecipe, kernels: bool) -> Operand:
    """fprop's weight operand from the first list `weight_operands` gives."""
    if len(parts) != _n_saved(fr.weight, kernels):
        raise ValueError(f"linear: w_operand has {len(parts)} tensors; the {fr.key()} weight operand takes "
                         f"{_n_saved(fr.weight, kernels)}")
    return _restored(parts, fr.weight, (parts[0].shape[0], in_features), kernels)


# The schemas are spelled out: linear_fwd's for the `Tensor[]? = None` of `wq` and `w_operand`, which the
# annotations cannot express, and all because the Python functions take the arguments they share as one `_Call`.
def _fwd(x: torch.Tensor, w: torch.Tensor | None, fprop: str, *call_and_wq) -> list[torch.Tensor]:
    """[y, *x^T (for wgrad), *w^T (for dgrad)]: each saved operand only where backward needs its
    quantized form (not for a bf16-recipe GEMM, which uses the unquantized tensor), as `_n_saved`
    tensors. No placeholders: zero-size tensors confuse the compiler's handling of saved tensors.
    `call_and_wq`: the `_Call` arguments, then `wq` (with w None): the weight already quantized, see
    `_prequantized_weight`; then `w_operand` (with w None): fprop's weight operand as this op would make it
    (`weight_operands`), reused while the weight is unchanged (snip_ops.weight_reuse); w^T is then the
    caller's to save, not returned."""
    call, wq, w_operand = _Call.with_tail(call_and_wq)
    fr, dr, wr = _recipe(fprop), _recipe(call.dgrad), _recipe(call.wgrad)
    q = call.quantizer(x)
    keep_xt = call.need_dw and not wr.is_bf16
    keep_wt = call.need_dx and not dr.is_bf16 and w_operand is None  # the caller keeps a reused w^T
    with _no_autocast(x):
        rht = keep_xt and wr.wgrad_hadamard  # x^T is then quantized from T x, not from x
        xq, xtq = q.row_and_col(x, fr.act, wr.act, not fr.is_bf16, keep_xt and not rht, "x", "xt")
        if rht:
            xtq = q.hadamard_t(x, wr, wr.act, "xt")
        if w_operand is not None:
            wq, wtq = _reused_weight_operand(w_operand, x.shape[1], fr, q.kernels), None
        else:
            wq, wtq = _weight_operands(w, wq, x.shape[1], fr, dr, keep_wt, q)
        y = (x @ w.t()).to(x.dtype) if fr.is_bf16 else _gemm(xq, wq, x.dtype)
    return [y, *(_saved(xtq) if keep_xt else []), *(_saved(wtq) if keep_wt else [])]


def _fwd_fake(x, w, fprop, *call_and_wq):
    call, wq, w_operand = _Call.with_tail(call_and_wq)
    dr, wr = _recipe(call.dgrad), _recipe(call.wgrad)
    (m, k), n = x.shape, (w if w is not None else wq[0] if wq is not None else w_operand[0]).shape[0]
    kernels = _kernel_mode(x, call.emulate)
    xt = _saved_meta(wr.act, (k, _wgrad_tokens(m, wr)), kernels, x) if call.need_dw and not wr.is_bf16 else []
    wt = _saved_meta(dr.weight, (k, n), kernels, x) if call.need_dx and not dr.is_bf16 and w_operand is None else []
    return [x.new_empty(m, n), *xt, *wt]


_register("linear_fwd", _fwd, _fwd_fake, (
    "(Tensor x, Tensor? w, str fprop, str dgrad, str wgrad, Tensor seed, Tensor offset, bool emulate, bool need_dx, "
    "bool need_dw, Tensor[]? wq=None, Tensor[]? w_operand=None) -> Tensor[]"))


def _backward(dy: torch.Tensor, x: torch.Tensor | None, xt: list[torch.Tensor], w: torch.Tensor | None,
              wt: list[torch.Tensor], in_features: int, call: _Call,
              wgrad_into: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Both backward ops: [dx if need_dx] + [dw if need_dw; with `wgrad_into`, dw is added into it and the
    list holds `wgrad_into`]."""
    dr, wr = _recipe(call.dgrad), _recipe(call.wgrad)
    q = call.quantizer(dy)
    m, n = dy.shape
    out = []
    with _no_autocast(dy):
        rht = call.need_dw and wr.wgrad_hadamard  # dy^T is then quantized from T dy, not from dy
        dyq, dytq = q.row_and_col(dy, dr.grad, wr.grad, call.need_dx and not dr.is_bf16,
                                  call.need_dw and not wr.is_bf16 and not rht, "dy", "dyt")
        if rht:
            dytq = q.hadamard_t(dy, wr, wr.grad, "dyt")
        if call.need_dx:
            out.append((dy @ w).to(dy.dtype) if dr.is_bf16
                       else _gemm(dyq, _restored(wt, dr.weight, (in_features, n), q.kernels), dy.dtype))
        if call.need_dw and wr.is_bf16:
            dw = dy.t() @ x
            out.append(dw if wgrad_into is None else wgrad_into.add_(dw))
        elif call.need_dw:  # dw in the weight's dtype straight from the GEMM (`_bwd`), or added into wgrad_into
            out.append(_gemm(dytq, _restored(xt, wr.act, (in_features, _wgrad_tokens(m, wr)), q.kernels),
                             torch.float32 if wgrad_into is not None else dy.dtype, out=wgrad_into))
    return out


def _bwd(dy: torch.Tensor, x: torch.Tensor | None, xt: list[torch.Tensor], w: torch.Tensor | None,
         wt: list[torch.Tensor], in_features: int, *call) -> list[torch.Tensor]:
    """[dx [M, K] if need_dx] + [dw [N, K] if need_dw], both in dy's dtype, which is the weight's (`linear`
    takes x and w of one dtype, and y is in it): the wgrad GEMM rounds its FP32 sum once, to that dtype, in its
    epilogue, the same bits as an FP32 output cast afterwards without writing and reading that output. `x` /
    `w`: the unquantized operands of a bf16-recipe wgrad / dgrad (else None); `xt` / `wt`: the operands the
    forward op saved (else empty lists); `call`: the `_Call` arguments."""
    return _backward(dy, x, xt, w, wt, in_features, _Call(*call))


def _bwd_fake(dy, x, xt, w, wt, in_features, *call):
    call = _Call(*call)
    m, n = dy.shape
    return ([dy.new_empty(m, in_features)] if call.need_dx else []) + (
        [dy.new_empty(n, in_features)] if call.need_dw else [])


_register("linear_bwd", _bwd, _bwd_fake, (
    "(Tensor dy, Tensor? x, Tensor[] xt, Tensor? w, Tensor[] wt, SymInt in_features, str dgrad, str wgrad, "
    "Tensor seed, Tensor offset, bool emulate, bool need_dx, bool need_dw) -> Tensor[]"))


# A separate op because functionalization (torch.compile) takes no in-place argument next to a
# Tensor[] result; need_dw is implied.
def _bwd_accumulate(dy: torch.Tensor, x: torch.Tensor | None, xt: list[torch.Tensor], w: torch.Tensor | None,
                    wt: list[torch.Tensor], in_features: int, dgrad: str, wgrad: str, seed: torch.Tensor,
                    offset: torch.Tensor, emulate: bool, need_dx: bool, wgrad_into: torch.Tensor) -> torch.Tensor:
    """dx (an empty tensor without need_dx); the weight gradient is added into `wgrad_into` [N, K] FP32."""
    call = _Call(dgrad, wgrad, seed, offset, emulate, need_dx, True)
    out = _backward(dy, x, xt, w, wt, in_features, call, wgrad_into)
    return out[0] if need_dx else dy.new_empty(0)


def _bwd_accumulate_fake(dy, x, xt, w, wt, in_features, dgrad, wgrad, seed, offset, emulate, need_dx, wgrad_into):
    return dy.new_empty(dy.shape[0], in_features) if need_dx else dy.new_empty(0)


_register("linear_bwd_accumulate", _bwd_accumulate, _bwd_accumulate_fake, (
    "(Tensor dy, Tensor? x, Tensor[] xt, Tensor? w, Tensor[] wt, SymInt in_features, str dgrad, str wgrad, "
    "Tensor seed, Tensor offset, bool emulate, bool need_dx, Tensor(a!) wgrad_into) -> Tensor"))


class _Layer(NamedTuple):
    """What `linear` passes its autograd function besides the tensors: constants of the call."""

    fprop: str           # the GEMMs' recipe keys
    dgrad: str
    wgrad: str
    emulate: bool
    dgrad_bf16: bool     # the backward GEMMs that run on the unquantized operands
    wgrad_bf16: bool
    n_xt: int            # the tensors that carry x^T for wgrad when it is quantized (`_n_saved`)
    fwd_seeded: bool     # forward's / backward's quantizations draw random bits: the `_seeded` ops (`_register`)
    bwd_seeded: bool


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, w, b, seed, offset, layer: _Layer, wgrad_into, reused):
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        # kept as an attribute, not saved: it is written in backward, and a saved tensor's version check
        # would refuse a layer called twice before its backward
        ctx.wgrad_into = wgrad_into
        fwd = torch.ops.snip.linear_fwd_seeded if layer.fwd_seeded else torch.ops.snip.linear_fwd
        if reused is None:
            y, *saved = fwd(x2, w, layer.fprop, layer.dgrad, layer.wgrad, seed, offset, layer.emulate,
                            need_dx, need_dw)
        else:  # the weight's operands, reused (`weight_operands`): the op does not read w, w^T is saved from here
            w_parts, wt_parts = reused
            y, *saved = fwd(x2, None, layer.fprop, layer.dgrad, layer.wgrad, seed, offset, layer.emulate,
                            need_dx, need_dw, w_operand=w_parts)
            if need_dx and not layer.dgrad_bf16:
                saved += wt_parts
        # The unquantized operands are kept only for a bf16-recipe GEMM that needs them.
        x_keep = x2 if need_dw and layer.wgrad_bf16 else None
        w_keep = w if need_dx and layer.dgrad_bf16 else None
        ctx.save_for_backward(x_keep, w_keep, seed, offset, *saved)
        ctx.layer, ctx.in_features = layer, w.shape[1]
        ctx.n_xt = layer.n_xt if need_dw and not layer.wgrad_bf16 else 0
        ctx.bias_dtype = None if b is None else b.dtype
        return y if b is None else y + b.to(y.dtype)

    @staticmethod
    def backward(ctx, dy):
        x_keep, w_keep, seed, offset, *saved = ctx.saved_tensors
        layer, in_features, n_xt = ctx.layer, ctx.in_features, ctx.n_xt
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        args = (dy.contiguous(), x_keep, saved[:n_xt], w_keep, saved[n_xt:], in_features, layer.dgrad, layer.wgrad,
                seed, offset, layer.emulate, need_dx)
        ops = torch.ops.snip
        if ctx.wgrad_into is not None and need_dw:  # the weight gradient goes into wgrad_into, not to autograd
            acc = ops.linear_bwd_accumulate_seeded if layer.bwd_seeded else ops.linear_bwd_accumulate
            dx = acc(*args, ctx.wgrad_into)
            dx, dw = (dx if need_dx else None), None
        else:
            grads = (ops.linear_bwd_seeded if layer.bwd_seeded else ops.linear_bwd)(*args, need_dw)
            dx = grads[0] if need_dx else None
            dw = grads[-1] if need_dw else None
        db = None
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            db = dy.sum(0, dtype=torch.float32).to(ctx.bias_dtype)  # FP32 sums, no FP32 copy of dy
        return dx, dw, db, None, None, None, None, None


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


def _check_wgrad_into(t, w: torch.Tensor, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"linear: wgrad_into must be a tensor, got {type(t).__name__}")
    if t.dtype != torch.float32 or tuple(t.shape) != tuple(w.shape) or t.device != device:
        raise ValueError(f"linear: wgrad_into must be a float32 tensor of w's shape {tuple(w.shape)} on {device}, "
                         f"got {t.dtype} {tuple(t.shape)} on {t.device}")
    if t.requires_grad:
        raise ValueError("linear: wgrad_into must not require grad (backward writes into it)")


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None = None,
    precision: LinearPrecision | GemmRecipe | str | None = None,
    *,
    seed: int | torch.Tensor = 0,
    offset: int | torch.Tensor = 0,
    emulate: bool = False,
    wgrad_into: torch.Tensor | None = None,
    weight_reuse=None,
) -> torch.Tensor:
    """`torch.nn.functional.linear` with low-precision GEMMs.

    x: [..., K]; w: [N, K]; b: [N] or None; precision: a `LinearPrecision`, a recipe, a recipe name
    ("fp8", "fp4", ...) or None for BF16 (plain `F.linear`). `(seed, offset)` key stochastic
    rounding; pass a new offset each step. Under torch.compile pass both as 0-d int64 CPU tensors (as
    `SnipLinear` does): an int is a constant of the compiled code, and each new value recompiles it. On a GPU the
    quantization and GEMM kernels run where they exist; `emulate=True` keeps the reference
    quantizer and the FP32 GEMM of the dequantized operands there too (the same quantized values).
    Under `torch.autocast` the layer computes in the autocast dtype, like `F.linear`.
    `wgrad_into`: a float32 tensor of w's shape (Megatron's `main_grad`) into which backward adds the
    weight gradient instead of handing it to autograd (w.grad is then left alone): on the GPU kernels
    the wgrad GEMM's epilogue adds it (beta = 1), in FP32 with one rounding, with no gradient tensor
    written and read again; elsewhere the FP32 gradient is added.
    `weight_reuse`: a `snip_ops.weight_reuse.WeightReuse` that keeps this weight's GEMM operands for later calls
    while the weight is unchanged (`SnipLinear` passes its own inside `snip_ops.reuse_quantized_weights`).
    """
    w_param = w
    if isinstance(x, torch.Tensor) and torch.is_autocast_enabled(x.device.type):
        # What F.linear does under autocast: compute in the autocast dtype; the casts are
        # differentiable, so FP32 master weights receive FP32 gradients.
        dtype = torch.get_autocast_dtype(x.device.type)
        x, w, b = (None if t is None else t.to(dtype) for t in (x, w, b))
    _check(x, w, b)
    if wgrad_into is not None:
        _check_wgrad_into(wgrad_into, w, x.device)
    precision = LinearPrecision.of(precision)
    if precision.is_bf16 and wgrad_into is None:
        return torch.nn.functional.linear(x, w, b)
    if not torch.is_tensor(offset):
        offset = torch.tensor(offset, dtype=torch.int64)
    if not torch.is_tensor(seed):
        seed = torch.tensor(seed, dtype=torch.int64)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    fr, dr, wr = precision.fprop, precision.dgrad, precision.wgrad
    layer = _Layer(fr.key(), dr.key(), wr.key(), bool(emulate), dr.is_bf16, wr.is_bf16,
                   _n_saved(wr.act, _kernel_mode(x2, emulate)),
                   _draws_bits(fr.act, fr.weight, dr.weight, wr.act, hadamard=wr.wgrad_hadamard),
                   _draws_bits(dr.grad, wr.grad, hadamard=wr.wgrad_hadamard))
    reused = None
    if weight_reuse is not None and weight_operands_reusable(precision):
        reused = weight_reuse.operands(w_param, w, precision, bool(emulate))
    y = _Linear.apply(x2, w, b, seed.detach().cpu(), offset.detach().cpu(), layer, wgrad_into, reused)
    return y.reshape(*lead, w.shape[0])
