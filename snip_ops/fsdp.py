"""Low-precision FSDP2 all-gather of `SnipLinear` weights.

Under `torch.distributed.fsdp.fully_shard` every rank holds rows [r*S, (r+1)*S) of each weight
[N, K] (S = N / world) and FSDP2 all-gathers the whole weight before the layer runs. A layer whose
fprop and dgrad quantize the weight with square round-to-nearest blocks (`fp8`, `fp4`: 128x128;
`nvfp4_train`: 16x16) only ever reads that quantization, and such blocks never straddle a shard
boundary when S is a multiple of the block rows: each rank can quantize its own rows, and the ranks
all-gather codes + block scales instead of BF16/FP32 values (about 2x fewer bytes than BF16 for
FP8, 4x for FP4). The gathered quantization is bit for bit the one the layer computes after a
full-precision gather, and `snip::linear_fwd` (or its `_seeded` twin) consumes it directly (w^T for dgrad is
its transpose).

    model = snip_ops.convert(model, plan)
    snip_ops.fsdp.enable_low_precision_all_gather(model)   # before fully_shard and the optimizer
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)

How it plugs into FSDP2: each SnipLinear weight becomes a `ShardedWeight` (a wrapper tensor
subclass that behaves as its data everywhere, the optimizer included) implementing FSDP2's
all-gather extension `fsdp_pre_all_gather` / `fsdp_post_all_gather`. Before every all-gather it
reads the layer's CURRENT precision (`convert(model, new_plan)` / `set_precision` between steps keep
working) and gathers either

* the shard's quantization with fprop's weight spec, and with dgrad's where that differs (codes and
  block scales; nvfp4's FP32 tensor scale needs the global amax: one all-reduce (MAX) of the shards'
  amax over the FSDP group before quantizing, the scale itself then being equal on all ranks and not
  gathered); or
* the full-precision shard (in FSDP's `MixedPrecisionPolicy.param_dtype`), exactly what FSDP2
  gathers by itself: for a layer whose plan keeps fprop or dgrad in bf16, whose weight blocks are
  1-D (mxfp8, nvfp4, mxfp4: dgrad's w^T blocks run along N, across shards) or stochastically
  rounded, and -- with one warning naming the layer -- for a weight whose shards would split a
  block (N not a multiple of world * block rows). FSDP2 requires every all-gather input of an
  unevenly sharded weight (N not a multiple of the world size) to have the padded shard's shape,
  which codes and scales cannot have, so such weights are always gathered in full precision; a
  quantized gather therefore never carries padding rows.

The unsharded weight FSDP2 gives the layer is a `GatheredWeight`: the full-precision weight (used
as itself by every op), or its quantization(s), which only `snip::linear_fwd` can read (any other
op on it raises, e.g. a planner measurement hook reading the weight of a sharded model); the weight
gradient is an ordinary dense tensor that FSDP2 reduce-scatters as usual.

When a layer's gathered layout changes (a plan change), FSDP2's all-gather buffers for that weight,
which it sizes once at the first all-gather, are dropped so that it sizes them anew (FSDP2 has no
public way to do this: `_forget_all_gather_buffers` resets `FSDPParam.all_gather_outputs`, found
through the model passed to `enable_low_precision_all_gather`, which must therefore be the model
that is -- or contains every module that is -- `fully_shard`-ed). torch.compile of a model whose
weights are these subclasses is not supported.
"""

from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_leaves, tree_map_only

from .formats import GemmRecipe, LinearPrecision, QuantSpec, ScaleKind
from .gemm import transpose_shares_quantization
from .module import SnipLinear
from .qparts import to_parts
from .quantize import quantize
from .reference import QTensor
from .tensor_parallel import global_amax

__all__ = ["enable_low_precision_all_gather", "ShardedWeight", "GatheredWeight", "gathered_specs"]

aten = torch.ops.aten


def gathered_specs(precision: LinearPrecision) -> tuple[QuantSpec, ...] | None:
    """The weight quantizations an all-gather carries for a layer of `precision`, in the order
    `snip::linear_fwd` takes them (fprop's, then dgrad's where it differs); None where a GEMM needs
    the full-precision weight or a quantization is not shard-local for any shard size (1-D or
    whole-dimension blocks, stochastic rounding)."""
    w_spec, wt_spec = precision.fprop.weight, precision.dgrad.weight
    specs = (w_spec,) if wt_spec == w_spec else (w_spec, wt_spec)
    if any(s is None or s.block[0] == 0 or not transpose_shares_quantization(s) for s in specs):
        return None
    return specs


@dataclass
class _Layer:
    """What every wrapper of one layer's weight shares: its name (for messages), the model that holds
    its FSDP state, the layout of its last all-gather and the fallbacks already reported."""

    name: str
    root: weakref.ref
    layout: tuple | None = None
    warned: set = field(default_factory=set)

    def specs_for(self, precision: LinearPrecision, rows: int, world: int) -> tuple[QuantSpec, ...] | None:
        specs = gathered_specs(precision)
        if specs is None:
            return None
        block_rows = max(s.block[0] for s in specs)
        if rows % world == 0 and all((rows // world) % s.block[0] == 0 for s in specs):
            return specs
        if block_rows not in self.warned:
            self.warned.add(block_rows)
            warnings.warn(f"snip_ops.fsdp: layer {self.name!r}: its {rows} weight rows do not split into {world} "
                          f"shards of whole {block_rows}-row blocks; its weight is all-gathered in full precision",
                          stacklevel=2)
        return None


@dataclass(frozen=True)
class _GatherMeta:
    """What `fsdp_post_all_gather` needs besides the gathered tensors: the weight's shape, the specs
    (None: full precision) and the nvfp4 tensor scales, equal on every rank and so not gathered."""

    shape: tuple[int, int]
    specs: tuple[QuantSpec, ...] | None
    tensor_scales: tuple[torch.Tensor | None, ...]


def _forget_all_gather_buffers(root: nn.Module | None, module: nn.Module) -> None:
    """Make FSDP2 size `module.weight`'s all-gather output buffers anew at the next copy-out (it
    allocates them once, at the first all-gather, for that gather's tensors)."""
    for m in () if root is None else root.modules():
        if not isinstance(m, FSDPModule):
            continue
        group = m._get_fsdp_state()._fsdp_param_group
        for fsdp_param in () if group is None else group.fsdp_params:
            if fsdp_param._module_info.module is module and fsdp_param._module_info.param_name == "weight":
                fsdp_param.all_gather_outputs = []
                return
    raise RuntimeError("snip_ops.fsdp: the weight's FSDP2 state is not under the model passed to "
                       "enable_low_precision_all_gather; pass the model that is fully_shard-ed")


def _first_arg_written(func) -> bool:
    args = func._schema.arguments
    return bool(args) and args[0].alias_info is not None and args[0].alias_info.is_write


class ShardedWeight(torch.Tensor):
    """A SnipLinear weight (before `fully_shard`) or its local shard (after): a wrapper around plain
    `data` that computes as `data` does and adds FSDP2's all-gather hooks. The ops by which FSDP2
    builds, pads and moves the shard keep the wrapper; all others return plain tensors."""

    _KEEP = {aten.detach, aten.alias, aten.view, aten.as_strided, aten.slice, aten.split, aten.split_with_sizes,
             aten.new_zeros, aten.new_empty, aten.empty_like, aten.clone, aten._to_copy, aten._pin_memory}

    @staticmethod
    def __new__(cls, data: torch.Tensor, layer: _Layer):
        return torch.Tensor._make_wrapper_subclass(
            cls, data.shape, strides=data.stride(), storage_offset=data.storage_offset(), dtype=data.dtype,
            layout=data.layout, device=data.device, requires_grad=data.requires_grad)

    def __init__(self, data: torch.Tensor, layer: _Layer):
        self._data = data
        self._layer = layer

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self) -> str:
        return f"ShardedWeight({self._data!r}, layer={self._layer.name!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        layer = next((a._layer for a in tree_leaves((args, kwargs)) if isinstance(a, ShardedWeight)), None)
        out = func(*tree_map_only(ShardedWeight, lambda t: t._data, args),
                   **tree_map_only(ShardedWeight, lambda t: t._data, kwargs))
        if _first_arg_written(func) and isinstance(args[0], ShardedWeight):
            return args[0]
        if func.overloadpacket in cls._KEEP and layer is not None:
            return tree_map_only(torch.Tensor, lambda t: ShardedWeight(t, layer), out)
        return out

    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        rows, cols = outer_size
        world = mesh.size()
        dtype = mp_policy.param_dtype or self.dtype
        specs = self._layer.specs_for(module.precision, rows, world)
        layout = (dtype, specs)
        if self._layer.layout not in (None, layout):
            _forget_all_gather_buffers(self._layer.root(), module)
        self._layer.layout = layout
        shard = self._data.to(dtype)
        shard_rows = -(-rows // world)
        if shard.shape[0] != shard_rows:  # the short last shard of an uneven split, padded as FSDP2 pads it
            shard = nn.functional.pad(shard, (0, 0, 0, shard_rows - shard.shape[0]))
        if specs is None:
            return (shard,), _GatherMeta((rows, cols), None, ())
        quantized = [quantize(shard, s, tensor_amax=global_amax(shard, mesh.get_group()) if s.scale == ScaleKind.NVFP4 else None)
                     for s in specs]
        gathered = tuple(t for q in quantized for t in (q.codes, q.scales) if t is not None)
        return gathered, _GatherMeta((rows, cols), specs, tuple(q.tensor_scale for q in quantized))

    def fsdp_post_all_gather(self, all_gather_outputs, metadata: _GatherMeta, param_dtype, *, out=None):
        rows, cols = metadata.shape
        outputs = iter(all_gather_outputs)
        if metadata.specs is None:
            payload = next(outputs).narrow(0, 0, rows)  # rows past the weight's are FSDP2's padding
        else:
            payload = []
            for spec, tensor_scale in zip(metadata.specs, metadata.tensor_scales):
                codes = next(outputs)
                scales = None if spec.scale == ScaleKind.NONE else next(outputs)
                payload.append(QTensor(codes, scales, spec, (rows, cols), tensor_scale))
            payload = tuple(payload)
        if out is not None:  # FSDP2 reuses the unsharded parameter of the first all-gather
            out._payload = payload
            return None
        return GatheredWeight(payload, (rows, cols), param_dtype, self.device), ()


class GatheredWeight(torch.Tensor):
    """The unsharded weight [N, K] of one all-gather: `_payload` is the full-precision weight (every
    op computes on it) or a tuple of its quantizations (`gathered_specs`), which `snip::linear_fwd`
    reads as its pre-quantized weight; other ops on those raise."""

    _METADATA = {aten.detach, aten.alias, aten.view, aten.as_strided}
    _NO_DATA = {aten.empty_like, aten.zeros_like, aten.new_empty, aten.new_zeros}

    @staticmethod
    def __new__(cls, payload, shape: tuple[int, int], dtype: torch.dtype, device: torch.device,
                requires_grad: bool = False):
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=device,
                                                   requires_grad=requires_grad)

    def __init__(self, payload, shape, dtype, device, requires_grad=False):
        self._payload = payload

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def quantized(self) -> tuple[QTensor, ...] | None:
        return self._payload if isinstance(self._payload, tuple) else None

    def __repr__(self) -> str:
        what = "full precision" if self.quantized is None else "+".join(q.spec.describe() for q in self.quantized)
        return f"GatheredWeight(shape={tuple(self.shape)}, dtype={self.dtype}, {what})"

    def _rewrapped(self) -> "GatheredWeight":
        return GatheredWeight(self._payload, tuple(self.shape), self.dtype, self.device)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.ops.snip.linear_fwd.default, torch.ops.snip.linear_fwd_seeded.default) \
                and isinstance(args[1], GatheredWeight) and args[1].quantized is not None:
            return func(args[0], None, *args[2:], **kwargs, wq=args[1]._linear_parts(args[2], args[3]))
        w = args[0]
        whole = len(args) < 2 or args[1] == list(w.shape)
        if isinstance(w, GatheredWeight) and func.overloadpacket in cls._METADATA and whole:
            return w._rewrapped()  # nn.Parameter's detach, FSDP2's as_strided: the whole weight
        quantized = [a for a in tree_leaves((args, kwargs))
                     if isinstance(a, GatheredWeight) and a.quantized is not None]
        if quantized and func.overloadpacket in cls._NO_DATA and w is quantized[0]:
            return func(torch.empty(w.shape, dtype=w.dtype, device=w.device), *args[1:], **kwargs)
        if quantized:
            raise RuntimeError(f"{func} reads a weight that FSDP2 all-gathered quantized ({quantized[0]!r}); only "
                               "snip_ops.linear can use it (snip_ops.fsdp)")
        unwrap = lambda t: t._payload  # noqa: E731
        return func(*tree_map_only(GatheredWeight, unwrap, args), **tree_map_only(GatheredWeight, unwrap, kwargs))

    def _linear_parts(self, fprop: str, dgrad: str) -> list[torch.Tensor]:
        """The `wq` argument of `snip::linear_fwd` for these recipes; raises if the layer's precision
        changed since the all-gather."""
        w_spec, wt_spec = GemmRecipe.from_key(fprop).weight, GemmRecipe.from_key(dgrad).weight
        wanted = (w_spec,) if wt_spec == w_spec else (w_spec, wt_spec)
        have = tuple(q.spec for q in self.quantized)
        if have != wanted:
            raise RuntimeError(f"snip_ops.fsdp: the weight was all-gathered as {[s.describe() for s in have]} but the "
                               f"layer now quantizes it as {[None if s is None else s.describe() for s in wanted]}; "
                               "change a layer's precision between steps, not between its all-gather and forward")
        return [t for q in self.quantized for t in to_parts(q)]


def enable_low_precision_all_gather(model: nn.Module) -> nn.Module:
    """Make FSDP2 all-gather the weights of `model`'s SnipLinear layers quantized where their
    precision allows (module docstring). Call after `convert` and before `fully_shard` and before
    building the optimizer (the weights become new `nn.Parameter`s of `ShardedWeight`); `model`
    must be the `fully_shard`-ed model or contain every `fully_shard`-ed module. Returns `model`."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"enable_low_precision_all_gather expects an nn.Module, got {type(model).__name__}")
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, SnipLinear)]
    sharded = [name for name, m in layers if isinstance(m.weight, DTensor)]
    if sharded:
        raise ValueError(f"the weight of SnipLinear {sharded[0]!r} is already a DTensor: call "
                         "enable_low_precision_all_gather before fully_shard. Under tensor parallelism "
                         "(parallelize_module) the weights are DTensors from the start: quantized all-gathers "
                         "do not support tensor parallelism yet (FSDP2 + TP gathers in full precision)")
    root = weakref.ref(model)
    for name, mod in layers:
        if isinstance(mod.weight, ShardedWeight):
            continue
        weight = ShardedWeight(mod.weight.detach(), _Layer(name or type(mod).__name__, root))
        mod.weight = nn.Parameter(weight, requires_grad=mod.weight.requires_grad)
    return model
