"""Quantizing each weight once per optimizer step instead of once per micro-batch.

Under gradient accumulation every micro-batch's forward quantizes every weight again, although the
weights only change at the optimizer step. Inside `reuse_quantized_weights(model)` each `SnipLinear` of
`model` quantizes its weight at its first forward and hands the same GEMM operands -- w for fprop and w^T
for dgrad, in the layout their GEMMs read -- to its later forwards (activation-checkpointing recomputes
included); leaving the context drops them. Only weight quantizations that draw no random bits are reused
(`snip_ops.linear.weight_operands_reusable`: round-to-nearest, as in the fp8 and fp4 recipes), so every
result is bit for bit the one without the context; a layer whose weight is stochastically rounded (or whose
fprop is bf16) quantizes per call as before.

    for step in range(steps):
        with snip_ops.reuse_quantized_weights(model):
            for micro_batch in micro_batches:
                loss_fn(model(micro_batch)).backward()
        optimizer.step()
        optimizer.zero_grad()

The weights must not change inside the context. A layer checks its weight's version counter, which every
in-place operation advances (an optimizer step, `copy_`, `load_state_dict`), at each forward, and raises if
it moved; a write through `.data`, which torch hides from the version counter as from autograd, is not
seen. A layer given another weight tensor, dtype, device or precision quantizes anew. Memory: the kept
operands live from a layer's first forward to the context's exit (about 2 bytes per weight element for
fp8's w and w^T codes, 1 for fp4, plus block scales; emulated layers keep float32 values); backward keeps
w^T in any case while a micro-batch's graph lives.

Eager only: under torch.compile the layer raises (a compiled graph would bake the first call's decision
in). Not for weights that are DTensors (FSDP2, tensor parallelism): FSDP2 gathers the weight anew for
every forward (`snip_ops.fsdp` quantizes before that gather instead), and tensor-parallel layers quantize
their shards per call.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

import torch
from torch import nn

from .formats import LinearPrecision
from .linear import weight_operands
from .module import SnipLinear

__all__ = ["reuse_quantized_weights", "WeightReuse"]


class WeightReuse:
    """One layer's kept weight operands: made at its first forward inside the context, given to the later
    ones while the weight, its dtype and device, and the layer's precision and mode are those they were
    made from."""

    def __init__(self, name: str):
        self.name = name
        self._param: torch.Tensor | None = None
        self._version = -1
        self._key: tuple | None = None
        self._operands: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None

    def operands(self, param: torch.Tensor, w: torch.Tensor, precision: LinearPrecision,
                 emulate: bool) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(w's fprop operand, w^T's dgrad operand) for `snip_ops.linear`: `param` is the layer's weight, `w` the
        tensor its GEMMs quantize (`param` cast to the autocast dtype under autocast)."""
        if torch.compiler.is_compiling():
            raise RuntimeError(f"SnipLinear {self.name!r}: reuse_quantized_weights is eager only; leave the "
                               "context around compiled code")
        key = (precision.fprop.key(), precision.dgrad.key(), emulate, w.dtype, w.device, tuple(w.shape))
        if self._operands is not None and param is self._param and key == self._key:
            if param._version != self._version:
                raise RuntimeError(
                    f"SnipLinear {self.name!r}: its weight changed inside reuse_quantized_weights (an in-place "
                    "update, such as optimizer.step()); the context keeps each weight's quantization for the "
                    "micro-batches of one step: step the optimizer outside it")
            return self._operands
        self._operands = weight_operands(w, precision, emulate)
        self._param, self._version, self._key = param, param._version, key
        return self._operands


def _is_dtensor(t: torch.Tensor) -> bool:
    """Without importing DTensor: where its module is not loaded, no tensor is one."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and isinstance(t, dtensor.DTensor)


@contextlib.contextmanager
def reuse_quantized_weights(model: nn.Module) -> Iterator[nn.Module]:
    """Within the context, each `SnipLinear` of `model` quantizes its weight once and reuses that quantization
    in its later forwards (module docstring); yields `model`."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"reuse_quantized_weights expects an nn.Module, got {type(model).__name__}")
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, SnipLinear)]
    for name, m in layers:
        if _is_dtensor(m.weight):
            raise ValueError(f"reuse_quantized_weights: the weight of SnipLinear {name!r} is a DTensor (FSDP2 or "
                             "tensor parallelism), whose layers quantize per call; use the context on a model "
                             "whose weights are plain tensors")
        if m.weight_reuse is not None:
            raise RuntimeError(f"reuse_quantized_weights: SnipLinear {name!r} is already inside the context")
    for name, m in layers:
        m.weight_reuse = WeightReuse(m.name or name)
    try:
        yield model
    finally:
        for _, m in layers:
            m.weight_reuse = None
