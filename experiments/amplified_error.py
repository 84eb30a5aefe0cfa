"""Every planned layer's GEMM error under a precision, amplified: the ground truth that LD and WD are checked against.

One layer's FP4 error is below the noise of the studies' runs; the same error in every layer at once, or multiplied
k times (its structure kept, its energy k^2), is not. The scale study prices the gap it makes against k^2 times LD or
WD; the forward-train study routes the forward error's gradient change through Adam's moments.
"""

from __future__ import annotations

import torch

from experiments.common import in_block
from snip_ops import SnipLinear, convert
from snip_ops import gemm as snip_gemm
from snip_ops.formats import GEMMS, recipe
from snip_ops.module import layer_seed


class AmplifiedError:
    """Hooks for `continue_from`: every planned linear layer (those `convert` swaps, kept in bf16) computes one of
    its GEMMs exactly and adds `amplify` times the error that GEMM makes under `precision` on the same operands (the
    layer's own stochastic-rounding bits, fresh every step; in evaluation too for fprop). `amplify` 1 is that GEMM in
    `precision` in every layer; larger factors keep the error's structure and multiply its energy by amplify^2: a
    ground truth of LD (fprop) or WD (dgrad, wgrad) that runs of a hundred steps resolve. With `in_evaluation`
    False the forward error is added in the training steps only (evaluation is exact): what it costs through the
    trajectory, the gradients it perturbs, which LD (the loss of the forward error itself) does not price."""

    def __init__(self, gemm: str, precision: str, amplify: float, in_evaluation: bool = True, block: int | None = None):
        if gemm not in GEMMS:
            raise ValueError(f"gemm must be one of {GEMMS}, got {gemm!r}")
        if not in_evaluation and gemm != "fprop":
            raise ValueError(f"only the forward GEMM runs in evaluation: in_evaluation=False is for fprop, not {gemm!r}")
        self.gemm, self.recipe, self.amplify, self.step = gemm, recipe(precision), amplify, 0
        self.in_evaluation, self.block = in_evaluation, block  # block: that transformer block's layers only
        self.enabled = True  # off: every GEMM exact (the exact gradient on the same weights, experiments.forward_train)

    def on_setup(self, model, opt) -> None:
        convert(model)  # bf16: the same numbers as the unconverted model (and the same layers as the planner's)
        add = {"fprop": self._fprop, "dgrad": self._dgrad, "wgrad": self._wgrad}[self.gemm]
        for name, module in model.named_modules():
            if isinstance(module, SnipLinear) and in_block(name, self.block):
                add(module, layer_seed(name))

    def on_step(self, step, model, batch) -> None:
        self.step = step

    def _fprop(self, module, seed: int) -> None:
        def hook(mod, args, out):
            if not self.enabled or not (self.in_evaluation or torch.is_grad_enabled()):  # evaluation: no autograd
                return out
            x = args[0].detach().reshape(-1, mod.in_features).float()
            w = mod.weight.detach().float()
            error = snip_gemm.fprop(x, w, self.recipe, seed=seed, offset=self.step, emulate=True) - snip_gemm.fp32_mm(x, w.t())
            return out + (self.amplify * error).reshape(out.shape).to(out.dtype)
        module.register_forward_hook(hook)

    def _dgrad(self, module, seed: int) -> None:
        def hook(mod, grad_input, grad_output):
            if not self.enabled:
                return grad_input
            dy = grad_output[0].detach().reshape(-1, mod.out_features).float()
            w = mod.weight.detach().float()
            error = snip_gemm.dgrad(dy, w, self.recipe, seed=seed, offset=self.step, emulate=True) - snip_gemm.fp32_mm(dy, w)
            dx = grad_input[0]
            return (dx + (self.amplify * error).reshape(dx.shape).to(dx.dtype),) + tuple(grad_input[1:])
        module.register_full_backward_hook(hook)

    def _wgrad(self, module, seed: int) -> None:
        operands = {}

        def keep(mod, args, out):
            if out.requires_grad:  # not in evaluation
                operands["x"] = args[0].detach().reshape(-1, mod.in_features).float()
                out.register_hook(lambda g: operands.update(dy=g.detach().reshape(-1, mod.out_features).float()))

        def add_error(grad):
            if not self.enabled:
                return grad
            dy, x = operands["dy"], operands["x"]
            error = snip_gemm.wgrad(dy, x, self.recipe, seed=seed, offset=self.step, emulate=True) - snip_gemm.fp32_mm(dy.t(), x)
            return grad + (self.amplify * error).to(grad.dtype)
        module.register_forward_hook(keep)
        module.weight.register_hook(add_error)
