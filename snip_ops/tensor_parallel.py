"""Tensor parallelism for `SnipLinear`: its three GEMMs on DTensor shards.

Users parallelize with torch's own styles (`parallelize_module` with `ColwiseParallel`,
`RowwiseParallel`, and `SequenceParallel` for the norms between them, as torchtitan's Llama plan does):
`SnipLinear` is an `nn.Linear`, so the styles shard its weight (colwise: `Shard(0)`, rowwise:
`Shard(1)`) and redistribute its input and output around it. `SnipLinear.forward` sees the DTensor
weight and calls `sharded_linear`, which runs the layer on the local shards:

    colwise  y_r  = x w_r^T          x replicated, y sharded on its last dimension (N)
             dx   = sum_r dy_r w_r   (partial sums: x's gradient leaves as Partial)
             dw_r = dy_r^T x
    rowwise  y    = sum_r x_r w_r^T  (the output leaves as Partial; the style all-reduces it, or
                                      reduce-scatters it onto the sequence under sequence parallel)
             dx_r = dy w_r,  dw_r = dy^T x_r      dy replicated

Every rank quantizes exactly the values the single-process layer quantizes, restricted to its shard:
  * block boundaries never straddle shards (`check_shard_blocks`: an error naming the layer, the shard
    size and the block, at every plan change and every forward);
  * NVFP4's per-tensor scale comes from the whole tensor's amax (an all-reduce MAX over the group);
  * stochastic rounding draws the bits of the element's linear index in the whole tensor. A shard
    of the columns (colwise dy) has no constant index offset (its rows are N apart in the whole
    tensor, N / world in the shard), and the quantizer keys its bits by the local index only; so such
    an operand is quantized embedded in a zero tensor of the whole shape, at its place, and sliced back:
    the zeros fill blocks of their own (the boundaries are aligned) and never touch this shard's scales.
    That costs `world` times the quantization work of that operand (the GEMMs stay local); a quantizer
    that took the shard's index origin and row pitch would remove it.
Where no sharded operand needs the whole tensor (round-to-nearest, no NVFP4: fp8, mxfp8, and the
rowwise layers of fp4 / mxfp4) the local shards go through `snip_ops.linear` unchanged (kernels,
saved codes); otherwise through `_ShardedLinear`, the emulated GEMMs of the same quantized values.

Exactness. A GEMM whose reduction dimension is not split (colwise fprop and wgrad, rowwise dgrad and
wgrad) computes every output element from the same quantized values as the single-process layer:
bit-identical results (tests/ops/test_tensor_parallel.py). A GEMM whose reduction is split (rowwise
fprop over K, colwise dgrad over N) sums bit-identical quantized operands in two stages, one partial
sum of length K / world per rank, then the sum of the partials (the all-reduce), so its FP32 summation
order differs from the one GEMM. With u = 2^-24 and gamma_n = n u / (1 - n u), the one GEMM's sum is
within gamma_K sum_k |a_k b_k| of the exact dot product and the two-stage sum within
gamma_(K/world + world - 1) sum_k |a_k b_k| (Higham, Accuracy and Stability, §3.1: a sum whose terms
pass through at most n additions), so the two differ elementwise by at most
    (gamma_K + gamma_(K/world + world - 1)) sum_k |a_k b_k|  <=  2 K u sum_k |a_k b_k|   (K >= world^2)
(`split_reduction_bound`); in a bfloat16 / float16 layer each partial is also rounded to that dtype
before the sum, as in any tensor-parallel linear layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from .formats import GEMMS, LinearPrecision, QuantSpec, Rounding, ScaleKind
from .gemm import emulated_operand, fp32_mm, operand_offset, transpose_shares_quantization, wgrad_operand
from .linear import linear
from .quantize import dequantize, quantize

__all__ = ["COLWISE", "ROWWISE", "tp_style", "tp_size", "check_shard_blocks", "global_amax", "sharded_linear", "split_reduction_bound"]

COLWISE, ROWWISE = "colwise", "rowwise"

# The operands of each GEMM, as `snip_ops.linear` quantizes them: (operand id of gemm.OPERAND_IDS,
# the tensor it is made from, the recipe field of its spec, whether t^T is quantized).
_OPERANDS = {
    "fprop": (("x", "x", "act", False), ("w", "w", "weight", False)),
    "dgrad": (("dy", "dy", "grad", False), ("wt", "w", "weight", True)),
    "wgrad": (("dyt", "dy", "grad", True), ("xt", "x", "act", True)),
}
# The dimension of the 2-D tensor ([M, K] x, [N, K] w, [M, N] dy) that a style splits across ranks.
_SHARDED_DIM = {COLWISE: {"w": 0, "dy": 1}, ROWWISE: {"w": 1, "x": 1}}
_DIM_NAMES = {("w", 0): "out_features", ("w", 1): "in_features", ("dy", 1): "out_features",
              ("x", 1): "in_features"}


def tp_style(weight: torch.Tensor) -> str | None:
    """COLWISE or ROWWISE for a weight DTensor sharded on dim 0 / 1 of a 1-D mesh; None for a plain
    tensor or a replicated DTensor (nothing to do: the layer runs on the local copy). Under FSDP2 + TP
    the weight rests on a 2-D mesh, FSDP's dimension first and TP's last; FSDP gathers its dimension
    before every forward, so the layer computes with the TP placement, the one returned."""
    if not isinstance(weight, DTensor):
        return None
    placements = weight.placements
    if weight.device_mesh.ndim not in (1, 2):
        raise NotImplementedError(f"SnipLinear: a weight on a {weight.device_mesh.ndim}-D device mesh "
                                  f"({placements}) is not supported; tensor parallelism takes a 1-D mesh "
                                  "(2-D with FSDP2 outside it)")
    p = placements[-1]
    if isinstance(p, Replicate):
        return None
    if isinstance(p, Shard) and p.dim in (0, 1):
        return COLWISE if p.dim == 0 else ROWWISE
    raise NotImplementedError(f"SnipLinear: weight placement {p} is not supported (Shard(0): colwise, "
                              "Shard(1): rowwise, Replicate())")


def tp_size(weight: DTensor) -> int:
    """The number of tensor-parallel ranks a weight's shards span (its mesh's last dimension)."""
    return weight.device_mesh.size(weight.device_mesh.ndim - 1)


def _boundaries(size: int, world: int) -> list[int]:
    """The interior shard boundaries of a dimension of `size` split over `world` ranks (torch.chunk's
    split, which DTensor's Shard uses: chunks of ceil(size / world), the last one shorter or empty)."""
    chunk = -(-size // world)
    return [r * chunk for r in range(1, world) if r * chunk < size]


def _whole_size(weight_shape: tuple[int, int], tensor: str, dim: int) -> int:
    """The whole extent of dimension `dim` of `tensor` in a layer whose weight is [N, K]: N for w's dim 0
    and dy's dim 1, K for w's and x's dim 1."""
    n, k = weight_shape
    return n if (tensor, dim) in (("w", 0), ("dy", 1)) else k


def _block_along(spec: QuantSpec, dim: int, transpose: bool) -> int:
    """The block extent of `spec` along dimension `dim` of the untransposed tensor (0: the whole dimension)."""
    return spec.block[1 - dim] if transpose else spec.block[dim]


def check_shard_blocks(name: str, style: str, precision: LinearPrecision, weight_shape: tuple[int, int],
                       world: int) -> None:
    """Raise ValueError if `style` sharding over `world` ranks would split a scaling block of an
    operand that `precision` quantizes: every shard boundary must be a multiple of the block along
    the split dimension (a whole-dimension block cannot be split at all)."""
    for gemm in GEMMS:
        recipe = precision.gemm(gemm)
        for operand, tensor, field, transpose in _OPERANDS[gemm]:
            spec = getattr(recipe, field)
            dim = _SHARDED_DIM[style].get(tensor)
            if spec is None or dim is None:
                continue
            size = _whole_size(weight_shape, tensor, dim)
            cuts = _boundaries(size, world)
            block = _block_along(spec, dim, transpose)
            bad = [c for c in cuts if block == 0 or c % block]
            if bad:
                extent = "the whole dimension" if block == 0 else f"{block}"
                raise ValueError(
                    f"SnipLinear {name or '<unnamed>'}: {style} sharding over {world} ranks cuts "
                    f"{_DIM_NAMES[tensor, dim]}={size} into shards of {cuts[0]}, which splits the "
                    f"{spec.describe()} blocks ({extent} along that dimension) of operand {operand!r} of its "
                    f"{gemm} GEMM ({recipe.name}); shard sizes must be multiples of the block")


def split_reduction_bound(k: int, world: int) -> float:
    """c such that a GEMM whose reduction of length `k` is split over `world` ranks differs from the
    one GEMM by at most c * sum_k |a_k b_k| per output element (the module docstring derives it)."""
    u = 2.0 ** -24

    def gamma(m: int) -> float:
        return m * u / (1 - m * u)

    return gamma(k) + gamma(-(-k // world) + world - 1)


@dataclass(frozen=True)
class _Shards:
    """Where this rank's shards lie: the style, the process group, the whole [N, K] weight shape, and
    the offset of this rank's weight shard along the sharded dimension."""

    style: str
    group: dist.ProcessGroup
    weight_shape: tuple[int, int]
    start: int

    def sharded_dim(self, tensor: str) -> int | None:
        return _SHARDED_DIM[self.style].get(tensor)

    def needs_whole_tensor(self, spec: QuantSpec | None, tensor: str) -> bool:
        """Whether quantizing this shard of `tensor` alone would differ from the single-process layer."""
        return (spec is not None and self.sharded_dim(tensor) is not None
                and (spec.rounding == Rounding.SR or spec.scale == ScaleKind.NVFP4))


def _needs_sharded_path(precision: LinearPrecision, shards: _Shards) -> bool:
    return any(shards.needs_whole_tensor(getattr(precision.gemm(g), field), tensor)
               for g in GEMMS for _, tensor, field, _ in _OPERANDS[g])


def global_amax(t: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """max |x| of the whole tensor from this rank's part of it: one all-reduce (MAX) over `group`. A NaN
    becomes +Inf first (a MAX reduction may drop NaN); both give the same NaN nvfp4 tensor scale."""
    amax = t.detach().float().abs().amax() if t.numel() else torch.zeros((), dtype=torch.float32, device=t.device)
    amax = torch.nan_to_num(amax, nan=math.inf)
    dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
    return amax


def _operand(t: torch.Tensor, tensor: str, spec: QuantSpec | None, operand: str, transpose: bool, seed: int,
             offset: int, shards: _Shards) -> torch.Tensor:
    """float32 values of this rank's part of operand `operand` (t^T when `transpose`), exactly as the
    single-process layer quantizes the whole tensor."""
    if not shards.needs_whole_tensor(spec, tensor):
        return emulated_operand(t, spec, seed, offset, operand, transpose)
    off = operand_offset(offset, operand)
    dim = shards.sharded_dim(tensor)
    amax = global_amax(t, shards.group) if spec.scale == ScaleKind.NVFP4 else None
    if spec.rounding != Rounding.SR:
        return dequantize(quantize(t, spec, seed=seed, offset=off, transpose=transpose, tensor_amax=amax))
    # Stochastic rounding keys its bits by the element's index in the whole tensor: quantize this shard
    # at its place in a zero tensor of the whole shape (module docstring) and take it back out.
    whole = list(t.shape)
    whole[dim] = _whole_size(shards.weight_shape, tensor, dim)
    embedded = t.new_zeros(whole)
    embedded.narrow(dim, shards.start, t.shape[dim]).copy_(t)
    q = dequantize(quantize(embedded, spec, seed=seed, offset=off, transpose=transpose, tensor_amax=amax))
    return q.narrow(1 - dim if transpose else dim, shards.start, t.shape[dim])


class _ShardedLinear(torch.autograd.Function):
    """The local GEMMs of one shard on the emulated path (the quantized values of `_operand`, FP32
    products), for the precisions whose sharded operands need the whole tensor."""

    @staticmethod
    def forward(ctx, x2, w, b, precision: LinearPrecision, seed: int, offset: int, shards: _Shards):
        fr, dr, wr = precision.fprop, precision.dgrad, precision.wgrad
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        with torch.autocast(x2.device.type, enabled=False):
            if fr.is_bf16:
                y = x2 @ w.t()
            else:
                xq = _operand(x2, "x", fr.act, "x", False, seed, offset, shards)
                wq = _operand(w, "w", fr.weight, "w", False, seed, offset, shards)
                y = fp32_mm(xq, wq.t()).to(x2.dtype)
            # wgrad's operands after the recipe's Hadamard transform along the tokens, which are never
            # sharded: it commutes with this rank's slice of the columns.
            xt = x2 if wr.is_bf16 else _operand(wgrad_operand(x2, wr, seed, offset), "x", wr.act, "xt", True, seed,
                                                offset, shards)
            if dr.is_bf16:
                wt = w.t()
            elif not fr.is_bf16 and fr.weight == dr.weight and transpose_shares_quantization(fr.weight):
                wt = wq.t()
            else:
                wt = _operand(w, "w", dr.weight, "wt", True, seed, offset, shards)
        ctx.save_for_backward(xt if need_dw else None, wt if need_dx else None)
        ctx.args = (precision, seed, offset, shards, w.dtype, None if b is None else b.dtype)
        return y if b is None else y + b.to(y.dtype)

    @staticmethod
    def backward(ctx, dy):
        xt, wt = ctx.saved_tensors
        precision, seed, offset, shards, w_dtype, b_dtype = ctx.args
        dr, wr = precision.dgrad, precision.wgrad
        dx = dw = db = None
        with torch.autocast(dy.device.type, enabled=False):
            if ctx.needs_input_grad[0]:
                if dr.is_bf16:
                    dx = dy @ wt.t()
                else:
                    dyq = _operand(dy, "dy", dr.grad, "dy", False, seed, offset, shards)
                    dx = fp32_mm(dyq, wt.t()).to(dy.dtype)
            if ctx.needs_input_grad[1]:
                if wr.is_bf16:
                    dw = (dy.t() @ xt).float()
                else:
                    dytq = _operand(wgrad_operand(dy, wr, seed, offset), "dy", wr.grad, "dyt", True, seed, offset,
                                    shards)
                    dw = fp32_mm(dytq, xt.t())
                dw = dw.to(w_dtype)
        if b_dtype is not None and ctx.needs_input_grad[2]:
            db = dy.sum(0, dtype=torch.float32).to(b_dtype)
        return dx, dw, db, None, None, None, None


def sharded_linear(x, weight: DTensor, bias, precision: LinearPrecision, *, seed: torch.Tensor | int,
                   offset: torch.Tensor, emulate: bool, name: str = "") -> DTensor:
    """`snip_ops.linear` of a tensor-parallel layer (see the module docstring). `x`: a DTensor in the
    layout the style gives the layer's input (colwise: replicated; rowwise: sharded on its last
    dimension); returns y as a DTensor (colwise: sharded on its last dimension; rowwise: Partial, or
    replicated with the bias added once)."""
    style = tp_style(weight)
    mesh = weight.device_mesh
    if not isinstance(x, DTensor):
        raise TypeError(f"SnipLinear {name or '<unnamed>'}: the weight is a {style}-sharded DTensor but the input is "
                        "a plain tensor; parallelize the layer with ColwiseParallel / RowwiseParallel, whose input "
                        "hooks make it a DTensor")
    n, k = weight.shape
    world = mesh.size()
    check_shard_blocks(name, style, precision, (n, k), world)
    placement = x.placements[0] if x.device_mesh == mesh and len(x.placements) == 1 else None
    if isinstance(placement, Shard) and placement.dim < 0:
        placement = Shard(placement.dim + x.dim())
    expected = Replicate() if style == COLWISE else Shard(x.dim() - 1)
    if placement != expected:
        raise ValueError(f"SnipLinear {name or '<unnamed>'}: a {style} layer takes its input as {expected} on the "
                         f"weight's mesh, got {x.placements}")
    # Colwise: x's gradient is this rank's partial sum over N (dgrad's split reduction).
    x_local = x.to_local(grad_placements=[Partial()]) if style == COLWISE else x.to_local()
    w_local = weight.to_local()
    b_local = bias.to_local() if bias is not None and style == COLWISE else None
    if torch.is_autocast_enabled(x_local.device.type):  # what snip_ops.linear does under autocast
        dtype = torch.get_autocast_dtype(x_local.device.type)
        x_local, w_local = x_local.to(dtype), w_local.to(dtype)
        b_local = None if b_local is None else b_local.to(dtype)
    split = n if style == COLWISE else k
    start = min(mesh.get_local_rank() * -(-split // world), split)  # torch.chunk's split (_boundaries)
    shards = _Shards(style, mesh.get_group(), (n, k), start)
    if _needs_sharded_path(precision, shards):
        lead = x_local.shape[:-1]
        y2 = _ShardedLinear.apply(x_local.reshape(-1, x_local.shape[-1]), w_local, b_local, precision, int(seed),
                                  int(offset), shards)
        y_local = y2.reshape(*lead, w_local.shape[0])
    else:
        y_local = linear(x_local, w_local, b_local, precision, seed=seed, offset=offset, emulate=emulate)
    out_shape = (*x.shape[:-1], n)
    stride = torch.empty(out_shape, device="meta").stride()
    if style == COLWISE:
        return DTensor.from_local(y_local, mesh, [Shard(y_local.dim() - 1)], run_check=False, shape=out_shape,
                                  stride=stride)
    y = DTensor.from_local(y_local, mesh, [Partial()], run_check=False, shape=out_shape, stride=stride)
    # The replicated bias is added once, to the sum: DTensor all-reduces the Partial output first.
    return y if bias is None else y + bias
