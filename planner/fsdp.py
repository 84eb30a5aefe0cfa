"""`unsharded_for_planning`: the planner's passes on a model under FSDP2, with whole parameters.

Under FSDP2 (`fully_shard`) the parameters a model holds between steps are sharded DTensors; the
forward all-gathers them into separate unsharded tensors and the gradients reach the sharded ones
through FSDP's hooks, not through autograd. The planner takes `torch.autograd.grad` of its passes
with respect to the parameters and reads the weights after its forward, so inside this context every
FSDP module is unsharded (the module attributes are the whole parameters) and stays so through the
planner's forwards and backwards; its Adam state is viewed through an optimizer whose parameters are
those whole tensors (each moment gathered whole). On exit the modules are resharded and their
reshard settings restored. `SnipPlanner.measure` enters it whenever the model holds FSDP modules
(torchtitan, for one, always applies FSDP2, also on one rank).

Collective: every rank of the FSDP mesh enters the context at the same step (the planner re-plans
at the same steps everywhere). The cost is one unsharded copy of the model and of its Adam moments.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

import torch
from torch import nn

__all__ = ["OptimizerView", "unsharded_for_planning"]


# Looked up in sys.modules, not imported: loading torch's FSDP and DTensor costs most of a second, and
# where their modules were never loaded no tensor is a DTensor and no module was sharded by FSDP2.
def is_dtensor(t) -> bool:
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and isinstance(t, dtensor.DTensor)


def is_fsdp_module(m: nn.Module) -> bool:
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(m, fsdp.FSDPModule)


class OptimizerView:
    """The learning rates, hyperparameters and Adam state of `optimizer`, keyed by other tensors:
    `params[p]` stands for `p` (what the planner reads: `param_groups` and `state`)."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: dict[nn.Parameter, torch.Tensor]):
        self.param_groups = [{**group, "params": [params.get(p, p) for p in group["params"]]}
                             for group in optimizer.param_groups]
        self.state = {params.get(p, p): {k: _whole(v) for k, v in s.items()} for p, s in optimizer.state.items()}


@contextlib.contextmanager
def unsharded_for_planning(model: nn.Module, optimizer: torch.optim.Optimizer | None
                           ) -> Iterator[torch.optim.Optimizer | None]:
    """Within: `model`'s FSDP modules unsharded and kept so; yields the optimizer to plan with (an
    `OptimizerView` of `optimizer` for the whole parameters, or `optimizer` itself without FSDP)."""
    fsdp_modules = [m for m in model.modules() if is_fsdp_module(m)]
    if not fsdp_modules:
        yield optimizer
        return
    sharded = _parameters_by_name(model)
    # FSDP2 has public setters but no getters for when it reshards: the settings are saved from its
    # parameter groups (torch 2.14's private attributes) and put back on exit.
    saved = [(state, state._auto_reshard_after_forward,
              [(g, g.post_forward_mesh_info, g.reshard_after_backward) for g in state._fsdp_param_groups])
             for state in (m._get_fsdp_state() for m in fsdp_modules)]
    try:
        for module in fsdp_modules:
            module.set_reshard_after_forward(False, recurse=False)
            module.set_reshard_after_backward(False, recurse=False)
            module.unshard()
        whole = _parameters_by_name(model)
        yield None if optimizer is None else OptimizerView(optimizer, {p: whole[name] for name, p in sharded.items()})
    finally:
        for state, auto, groups in saved:
            state._auto_reshard_after_forward = auto
            for group, post_forward_mesh_info, reshard_after_backward in groups:
                group.post_forward_mesh_info = post_forward_mesh_info
                group.reshard_after_backward = reshard_after_backward
        for module in fsdp_modules:
            module.reshard()


def _parameters_by_name(model: nn.Module) -> dict[str, nn.Parameter]:
    return dict(model.named_parameters(remove_duplicate=False))


def _whole(value):
    return value.full_tensor() if is_dtensor(value) else value
