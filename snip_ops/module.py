"""`SnipLinear` and `convert`: swap `nn.Linear` modules for low-precision ones.

A `SnipLinear` has exactly `nn.Linear`'s parameters (so its state dict is an `nn.Linear` state
dict) plus a `precision` attribute that can be changed between steps, a fixed SR `seed`, and a step
counter that gives every forward a fresh SR offset. Seeds derive from the module's name, so every
data-parallel rank rounds identically.

Under tensor parallelism (torch's `ColwiseParallel` / `RowwiseParallel` make the weight a sharded
DTensor) the forward runs on the local shards with the single-process layer's quantized values
(`snip_ops.tensor_parallel`); a precision whose scaling blocks would straddle shards is refused when
it is set and on every forward.
"""

from __future__ import annotations

import fnmatch
import zlib
from typing import Callable, Mapping

import torch
from torch import nn

from .formats import LinearPrecision
from .linear import linear

__all__ = ["SnipLinear", "convert", "plan_for", "layer_seed", "DEFAULT_EXCLUDE"]

# Embedding and output head stay high precision by default (docs/design.md §4).
DEFAULT_EXCLUDE = ("lm_head", "*.lm_head", "embed_tokens", "*.embed_tokens", "output", "*.output")

PrecisionLike = LinearPrecision | str | Mapping[str, str] | None
PlanLike = PrecisionLike | Mapping[str, PrecisionLike]


def _tp_style(weight: torch.Tensor):
    """`tensor_parallel.tp_style(weight)`. A weight without DTensor's `placements` answers None without importing
    the tensor-parallel module, and with it DTensor (about half a second of every `import snip_ops`)."""
    if not hasattr(weight, "placements"):
        return None
    from .tensor_parallel import tp_style

    return tp_style(weight)


class SnipLinear(nn.Linear):
    """An `nn.Linear` whose three GEMMs run in `self.precision`.

    `fuse_wgrad_accumulation=True`: backward adds the weight gradient into `self.weight.main_grad` (an FP32
    tensor of the weight's shape that the caller allocates and zeroes, as Megatron's distributed optimizer
    does) instead of `weight.grad`; on the GPU kernels the wgrad GEMM's epilogue does the addition
    (`snip_ops.linear`'s `wgrad_into`).

    `weight_reuse`: set by `snip_ops.reuse_quantized_weights` inside that context (the weight's quantization
    kept across micro-batches), else None."""

    weight_reuse = None

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, *, precision=None, seed=0,
                 emulate=False, name="", fuse_wgrad_accumulation=False):
        super().__init__(in_features, out_features, bias, device, dtype)
        self.name = str(name)  # the layer's FQN, for error messages (set by `convert`)
        self.precision = LinearPrecision.of(precision)
        self.seed = int(seed)
        self.emulate = bool(emulate)  # True: emulated GEMMs even where kernels exist
        self.fuse_wgrad_accumulation = bool(fuse_wgrad_accumulation)
        # Not a buffer: it must neither enter the state dict nor move to the GPU (it is read on the host).
        self.sr_step = torch.zeros((), dtype=torch.int64)

    @property
    def seed(self) -> int:
        """The layer's stochastic-rounding seed. Kept as a 0-d CPU tensor (`sr_seed`, like `sr_step` not a
        buffer) that forward passes on: torch.compile would take an int attribute for a constant and compile a
        block again for every layer's seed."""
        return int(self.sr_seed)

    @seed.setter
    def seed(self, value: int) -> None:
        self.sr_seed = torch.tensor(int(value), dtype=torch.int64, device="cpu")

    @classmethod
    def from_linear(cls, lin: nn.Linear, precision=None, seed: int = 0, emulate: bool = False,
                    name: str = "", fuse_wgrad_accumulation: bool = False) -> "SnipLinear":
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = lin.in_features, lin.out_features
        new.weight, new.bias = lin.weight, lin.bias  # shared: no copy, same Parameters
        new.name = str(name)
        new.precision = LinearPrecision.of(precision)
        new._check_shards(new.precision)
        new.seed = int(seed)
        new.emulate = bool(emulate)
        new.fuse_wgrad_accumulation = bool(fuse_wgrad_accumulation)
        new.sr_step = torch.zeros((), dtype=torch.int64)
        return new

    def set_precision(self, precision) -> None:
        precision = LinearPrecision.of(precision)
        self._check_shards(precision)
        self.precision = precision

    def _check_shards(self, precision: LinearPrecision) -> None:
        """Refuse a precision whose scaling blocks a tensor-parallel weight's shards would split. A module
        that torch's parallel styles sharded carries their `distribute_module` mark; FSDP2's sharded
        parameters are DTensors too, but are gathered whole before every forward, so they are left alone."""
        style = _tp_style(self.weight) if getattr(self, "_distribute_module_applied", False) else None
        if style is not None:
            from .tensor_parallel import check_shard_blocks, tp_size

            check_shard_blocks(self.name, style, precision, tuple(self.weight.shape), tp_size(self.weight))

    def _main_grad(self) -> torch.Tensor | None:
        """Where backward adds the weight gradient: weight.main_grad under fuse_wgrad_accumulation, else None."""
        if not self.fuse_wgrad_accumulation:
            return None
        main_grad = getattr(self.weight, "main_grad", None)
        if main_grad is None:
            raise RuntimeError(f"SnipLinear {self.name or ''}: fuse_wgrad_accumulation adds the weight gradient into "
                               "weight.main_grad, which is not set; allocate it (a float32 tensor of the weight's "
                               "shape, e.g. torch.zeros_like(weight, dtype=torch.float32)) and zero it where .grad "
                               "would be zeroed")
        if _tp_style(self.weight) is not None:
            raise NotImplementedError(f"SnipLinear {self.name or ''}: fuse_wgrad_accumulation is not supported on "
                                      "tensor-parallel shards")
        return main_grad

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        main_grad = self._main_grad()
        if self.precision.is_bf16:
            return (nn.functional.linear(x, self.weight, self.bias) if main_grad is None
                    else linear(x, self.weight, self.bias, self.precision, wgrad_into=main_grad))
        # `+ 0` rather than `.clone()`: under torch.compile a clone of a tensor mutated right after
        # was seen to read the mutated value (tests/ops/test_compile.py pins the eager semantics).
        offset = self.sr_step + 0
        self.sr_step.add_(1)
        if _tp_style(self.weight) is not None:
            from .tensor_parallel import sharded_linear

            return sharded_linear(x, self.weight, self.bias, self.precision, seed=self.sr_seed, offset=offset,
                                  emulate=self.emulate, name=self.name)
        return linear(x, self.weight, self.bias, self.precision, seed=self.sr_seed, offset=offset, emulate=self.emulate,
                      wgrad_into=main_grad, weight_reuse=self.weight_reuse)

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, precision={self.precision}" + (", emulate=True" if self.emulate else "")
                + (", fuse_wgrad_accumulation=True" if self.fuse_wgrad_accumulation else ""))


def _matches(name: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def plan_for(name: str, plan: PlanLike) -> LinearPrecision:
    """The precision a plan gives to module `name`: a single precision, or the first matching key of a
    mapping {FQN or fnmatch pattern: precision} (exact names win over patterns); unmatched -> bf16."""
    if plan is None or isinstance(plan, (str, LinearPrecision)):
        return LinearPrecision.of(plan)
    if isinstance(plan, Mapping) and set(plan) <= {"fprop", "dgrad", "wgrad"} and plan:
        return LinearPrecision.of(plan)
    if name in plan:
        return LinearPrecision.of(plan[name])
    for pattern, value in plan.items():
        if fnmatch.fnmatchcase(name, pattern):
            return LinearPrecision.of(value)
    return LinearPrecision.of(None)


def layer_seed(name: str) -> int:
    """A layer's stochastic-rounding seed, from its FQN: every rank (and every framework that converts
    the same model) gives the same layer the same seed."""
    return zlib.crc32(name.encode())


def convert(
    model: nn.Module,
    plan: PlanLike = None,
    filter_fn: Callable[[nn.Module, str], bool] | None = None,
    *,
    emulate: bool | None = None,
    fuse_wgrad_accumulation: bool | None = None,
) -> nn.Module:
    """Replace `nn.Linear` submodules by `SnipLinear` in place and return `model` (a new module when
    `model` itself is an `nn.Linear`).

    `plan`: None (bf16, switchable later), one precision for all, or {FQN or pattern: precision}.
    `filter_fn(module, fqn)` chooses the modules to convert; by default every `nn.Linear` except the
    embedding and the output head (`DEFAULT_EXCLUDE`). Already converted modules get the new plan.
    Parameters are shared, not copied: optimizers built before the call keep working.
    `emulate=True` makes the converted layers emulate their GEMMs even where kernels exist (None:
    False for new layers, unchanged for already converted ones). `fuse_wgrad_accumulation=True`: the
    layers add their weight gradients into `weight.main_grad` (see `SnipLinear`; None as for `emulate`).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"convert expects an nn.Module, got {type(model).__name__}")
    if filter_fn is None:
        filter_fn = lambda mod, name: not _matches(name, DEFAULT_EXCLUDE)  # noqa: E731
    if isinstance(plan, Mapping) and not set(plan) <= {"fprop", "dgrad", "wgrad"}:
        names = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
        for key in plan:
            if key not in names and not any(fnmatch.fnmatchcase(n, key) for n in names):
                raise ValueError(f"plan entry {key!r} matches no linear layer of the model")
    for name, mod in list(model.named_modules()):
        if not isinstance(mod, nn.Linear) or not filter_fn(mod, name):
            continue
        precision = plan_for(name, plan)
        if isinstance(mod, SnipLinear):
            mod.set_precision(precision)
            if emulate is not None:
                mod.emulate = bool(emulate)
            if fuse_wgrad_accumulation is not None:
                mod.fuse_wgrad_accumulation = bool(fuse_wgrad_accumulation)
            continue
        if getattr(mod, "_distribute_module_applied", False):
            # The parallel styles' hooks and the sharded parameters belong to that module object.
            raise ValueError(f"linear layer {name!r} was parallelized (parallelize_module) before its conversion; "
                             "convert the model first (snip_ops.convert, or build the SnipPlanner), then parallelize")
        new = SnipLinear.from_linear(mod, precision, seed=layer_seed(name), emulate=bool(emulate), name=name,
                                     fuse_wgrad_accumulation=bool(fuse_wgrad_accumulation))
        if not name:  # the model itself is a linear layer
            return new
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, new)
    return model
