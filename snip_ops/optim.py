"""AdamW for BF16 parameters without FP32 master weights (docs/design.md §6).

The parameters stay BF16. Each step computes the AdamW update in FP32 and writes the result back
to BF16 with stochastic rounding, so updates smaller than half a BF16 ulp survive in expectation
instead of being rounded away (the failure of plain BF16 training at small learning rates). The
moments `m`/`v` are FP32, or BF16 written back with SR as well (`state_dtype=torch.bfloat16`).

FP32 moments are the default, although the stochastic-rounding paper keeps `m` and `v` in BF16.
BF16 moments cut the persistent memory from 12 to 8 bytes per parameter (BF16 weights and gradients;
FP32-master mixed precision takes 16: bench/results/cpu-optim-memory.md). On the tiny Llama, over a
range of learning rates with betas (0.9, 0.95), they matched FP32 moments: no consistent sign in the
paired gap, the same best loss and the same largest stable learning rate
(bench/results/cpu-optim-lr-range.md). That parity was measured where `(1 - beta2) * g^2` is far above
half a BF16 ulp of `v`; at this class's
default beta2 = 0.999 the increment falls below it and `v` moves only through SR's random rounding,
a regime the measurement does not cover. So the default stays FP32; pass `state_dtype=torch.bfloat16`
for the paper's setting where memory is what limits the run.

Random bits: element `i` of parameter `k` (its position among all parameters of the optimizer,
group by group) at step `t` takes the 16 random bits of index `i` (philox.random_bits: one Philox
block per 8 consecutive indices) under key `seed` and offset `t * 2^32 + 4 * k + stream`, stream 0
for the parameter, 1 for `m`, 2 for `v`.
Every data-parallel rank with the same seed therefore rounds identically; an FSDP2 shard (a DTensor
sharded along dim 0) uses the global indices of its elements, so sharded and unsharded runs draw
the same bits.

Per element, in FP32 with one IEEE rounding per operation (the CUDA kernel csrc/optim/adamw.cu
performs exactly these operations, so the two agree bit for bit):

    p = p * (1 - lr * wd)
    m = m * b1 + g * (1 - b1)
    v = v * b2 + (g * g) * (1 - b2)
    p = p - (m / (sqrt(v) * (1 / sqrt(1 - b2^t)) + eps)) * (lr / (1 - b1^t))

with the scalars computed in double and rounded once to FP32. That is torch.optim.AdamW's
algorithm (decoupled weight decay, no amsgrad) in a different association order: FP32 parameters,
which are written back as they are, match torch.optim.AdamW to a few ulps. No division has a
scalar divisor, because PyTorch computes `tensor / scalar` as a multiplication by the rounded
reciprocal, which a kernel dividing by the scalar would not reproduce.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from . import _ext, philox
from .cast import round_to_format
from .formats import BF16, Rounding
from .philox import random_bits

__all__ = ["AdamW", "AdamWScalars", "adamw_scalars", "adamw_step_reference", "philox_offset", "STATE_DTYPES"]

STATE_DTYPES = (torch.float32, torch.bfloat16)
PARAM_DTYPES = (torch.float32, torch.bfloat16)
IMPLEMENTATIONS = ("auto", "reference", "kernel")
_STREAM_PARAM, _STREAM_EXP_AVG, _STREAM_EXP_AVG_SQ = 0, 1, 2
_MAX_PARAMS = 2**30  # 4 * index + stream must fit the low 32 bits of the offset


def philox_offset(step: int, param_index: int, stream: int) -> int:
    """The Philox offset of one parameter's (or moment's) write-back at `step`."""
    if not 0 <= param_index < _MAX_PARAMS:
        raise ValueError(f"parameter index {param_index} out of range [0, 2^30)")
    if not 0 < step < 2**32:
        raise ValueError(f"step {step} out of range [1, 2^32)")
    return (step << 32) | (param_index << 2) | stream


def _f32(x: float) -> float:
    """`x` rounded to the nearest float32, as a Python float (so it multiplies FP32 tensors exactly as
    the kernel's float operand does)."""
    return torch.tensor(x, dtype=torch.float64).to(torch.float32).item()


class AdamWScalars:
    """The FP32 scalars of one AdamW step (the kernel receives exactly these values)."""

    __slots__ = ("decay", "beta1", "one_minus_beta1", "beta2", "one_minus_beta2", "inv_bias_correction2_sqrt",
                 "step_size", "eps")

    def __init__(self, **values: float):
        for name in self.__slots__:
            setattr(self, name, _f32(values[name]))

    def as_tuple(self) -> tuple[float, ...]:
        return tuple(getattr(self, n) for n in self.__slots__)


def adamw_scalars(lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, step: int) -> AdamWScalars:
    """Step-dependent scalars, computed in double as torch.optim.AdamW computes them."""
    return AdamWScalars(
        decay=1.0 - lr * weight_decay,
        beta1=beta1,
        one_minus_beta1=1.0 - beta1,
        beta2=beta2,
        one_minus_beta2=1.0 - beta2,
        inv_bias_correction2_sqrt=1.0 / math.sqrt(1.0 - beta2**step),
        step_size=lr / (1.0 - beta1**step),
        eps=eps,
    )


def _sqrt_rn(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded float32 square root. PyTorch's float32 CPU sqrt is a vectorised
    approximation that is off by one ulp for ~1% of inputs; the double square root rounded once
    to float32 is exact (53 >= 2 * 24 + 2 bits make the double rounding innocuous)."""
    return x.double().sqrt().float()


def _refuse_capture(p: torch.Tensor) -> None:
    if philox.capturing(p):
        raise RuntimeError(
            "snip_ops.optim.AdamW.step() computes each step's scalars (bias corrections, learning rate) and the "
            "Philox offsets of its stochastic rounding on the host; a CUDA graph would replay the captured "
            "step's at every step. Call step() outside the graph.")


def _write_back(value: torch.Tensor, dest: torch.Tensor, sr: bool, seed: int, offset: int, index_base: int) -> None:
    """Store FP32 `value` into `dest` (FP32: as is; BF16: SR or round-to-nearest-even, saturating)."""
    if dest.dtype == torch.float32:
        dest.copy_(value)
        return
    if sr:
        index = torch.arange(index_base, index_base + value.numel(), device=value.device).view(value.shape)
        rounded = round_to_format(value, BF16, Rounding.SR, random_bits(index, seed, offset))
    else:
        rounded = round_to_format(value, BF16, Rounding.RNE)
    dest.copy_(rounded)  # exact: `rounded` is on the BF16 grid (NaN becomes BF16's quiet NaN)


def adamw_step_reference(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    param_indices: list[int],
    index_bases: list[int],
    scalars: AdamWScalars,
    step: int,
    seed: int,
    bf16_sr: bool,
) -> None:
    """One AdamW step in place, in PyTorch (any device); the definition the CUDA kernel reproduces.

    `params` are FP32 or BF16, `grads` of the same dtype, moments FP32 or BF16 (BF16 moments are
    always written back with SR). `index_bases[k]` is the global linear index of `params[k]`'s first
    element (0 unless it is a shard).
    """
    s = scalars
    for p, g, m, v, k, base in zip(params, grads, exp_avgs, exp_avg_sqs, param_indices, index_bases):
        g32 = g.float()
        p32 = p.float() * s.decay
        m32 = m.float() * s.beta1 + g32 * s.one_minus_beta1
        v32 = v.float() * s.beta2 + (g32 * g32) * s.one_minus_beta2
        denom = _sqrt_rn(v32) * s.inv_bias_correction2_sqrt + s.eps
        p32 = p32 - (m32 / denom) * s.step_size
        _write_back(m32, m, True, seed, philox_offset(step, k, _STREAM_EXP_AVG), base)
        _write_back(v32, v, True, seed, philox_offset(step, k, _STREAM_EXP_AVG_SQ), base)
        _write_back(p32, p, bf16_sr, seed, philox_offset(step, k, _STREAM_PARAM), base)


def _local(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(the tensor this rank updates, the global linear index of its first element).

    A DTensor contributes its local shard; only shards that are a contiguous range of the global
    tensor (Shard(0) or Replicate, as FSDP2 makes them) are supported, so that the element indices
    -- and hence the random bits -- are those of the unsharded tensor.
    """
    if not hasattr(t, "to_local"):
        return t, 0
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    local = t.to_local()
    shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    if tuple(shape[1:]) != tuple(t.shape[1:]):
        raise NotImplementedError(
            f"snip_ops.optim.AdamW: a DTensor sharded along a dimension other than 0 ({t.placements}) is not "
            "supported; FSDP2 shards along dim 0")
    base = offset[0] * math.prod(t.shape[1:]) if len(offset) else 0
    return local, int(base)


class AdamW(torch.optim.Optimizer):
    """AdamW whose BF16 parameters are updated in FP32 and written back with stochastic rounding.

    Args:
        params: parameters or parameter groups, as for torch.optim.AdamW. FP32 and BF16 parameters
            may be mixed; FP32 ones get plain AdamW.
        lr, betas, eps, weight_decay: as torch.optim.AdamW (decoupled weight decay).
        bf16_sr: write BF16 parameters back with stochastic rounding (False: round to nearest
            even, the "pure BF16" baseline).
        state_dtype: dtype of the moments m/v, torch.float32 or torch.bfloat16 (BF16 moments are
            written back with stochastic rounding; why FP32 is the default: the module docstring).
        seed: Philox key of the rounding; give every data-parallel rank the same seed.
        implementation: "auto" (the extension where it is built: the fused CUDA kernel on a GPU it
            was compiled for, its host loop on the CPU; the PyTorch reference otherwise; all three
            give the same bits), "reference", or "kernel" (error if unavailable).

    state_dict() has torch.optim.AdamW's keys and shapes (plus the `bf16_sr`, `state_dtype`,
    `seed` and `implementation` group entries); a torch.optim.AdamW state dict loads into it and
    vice versa.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        bf16_sr: bool = True,
        state_dtype: torch.dtype = torch.float32,
        seed: int = 0,
        implementation: str = "auto",
    ):
        if isinstance(lr, torch.Tensor):
            raise TypeError("snip_ops.optim.AdamW: lr must be a Python float, not a tensor")
        if not 0.0 <= lr:
            raise ValueError(f"invalid learning rate {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"invalid eps {eps}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"invalid betas {betas}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"invalid weight_decay {weight_decay}")
        if state_dtype not in STATE_DTYPES:
            raise ValueError(f"state_dtype must be torch.float32 or torch.bfloat16, got {state_dtype}")
        if not isinstance(seed, int) or not 0 <= seed < 2**64:
            raise ValueError(f"seed must be an int in [0, 2^64), got {seed!r}")
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, amsgrad=False, maximize=False,
                        foreach=None, capturable=False, differentiable=False, fused=None,
                        decoupled_weight_decay=True, bf16_sr=bf16_sr, state_dtype=state_dtype, seed=seed,
                        implementation=implementation)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if p.dtype not in PARAM_DTYPES:
                    raise TypeError(f"snip_ops.optim.AdamW updates float32 and bfloat16 parameters, got {p.dtype}")

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:  # groups loaded from torch.optim.AdamW lack snip's entries
            for key in ("bf16_sr", "state_dtype", "seed", "implementation"):
                group.setdefault(key, self.defaults[key])
            if group.get("amsgrad") or group.get("maximize"):
                raise ValueError("snip_ops.optim.AdamW supports neither amsgrad nor maximize")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # torch casts every state tensor to its parameter's dtype, which would turn FP32 moments of
        # BF16 parameters into BF16; reload them from the saved tensors at the group's state dtype.
        # Copies, so that the loaded optimizer never shares storage with `state_dict`.
        saved_state = state_dict["state"]
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        super().load_state_dict(state_dict)
        params = [p for g in self.param_groups for p in g["params"]]
        dtype_of = {p: g["state_dtype"] for g in self.param_groups for p in g["params"]}
        for pid, p in zip(saved_ids, params):
            if pid not in saved_state:
                continue
            st = self.state[p]
            for key in ("exp_avg", "exp_avg_sq"):
                st[key] = saved_state[pid][key].to(device=p.device, dtype=dtype_of[p], copy=True)
            st["step"] = saved_state[pid]["step"].detach().to(dtype=torch.float32, device="cpu", copy=True)

    def _init_state(self, p: torch.Tensor, state_dtype: torch.dtype) -> dict[str, torch.Tensor]:
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, dtype=state_dtype, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=state_dtype, memory_format=torch.preserve_format)
        return state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        param_index, checked_capture = -1, False
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            # (step, device, param dtype, state dtype) -> lists for one fused launch
            batches: dict[tuple, tuple[list, ...]] = {}
            for p in group["params"]:
                param_index += 1
                if p.grad is None:
                    continue
                if not checked_capture:
                    _refuse_capture(p)
                    checked_capture = True
                if p.grad.is_sparse:
                    raise RuntimeError("snip_ops.optim.AdamW does not support sparse gradients")
                if p.grad.dtype != p.dtype:
                    raise TypeError(f"gradient dtype {p.grad.dtype} differs from parameter dtype {p.dtype}")
                state = self._init_state(p, group["state_dtype"])
                state["step"] += 1
                step = int(state["step"].item())
                local_p, base = _local(p)
                local_g, _ = _local(p.grad)
                local_m, _ = _local(state["exp_avg"])
                local_v, _ = _local(state["exp_avg_sq"])
                key = (step, local_p.device, local_p.dtype, local_m.dtype, local_v.dtype)
                lists = batches.setdefault(key, ([], [], [], [], [], []))
                for lst, item in zip(lists, (local_p, local_g, local_m, local_v, param_index, base)):
                    lst.append(item)
            for (step, device, _, _, _), lists in batches.items():
                scalars = adamw_scalars(group["lr"], beta1, beta2, group["eps"], group["weight_decay"], step)
                if self._use_kernel(group["implementation"], device, lists):
                    seed = group["seed"] - 2**64 if group["seed"] >= 2**63 else group["seed"]  # the op's int is int64
                    torch.ops.snip_C.adamw_(*lists, *scalars.as_tuple(), step, seed, group["bf16_sr"])
                    # The op writes through pointers: advance the version counters an in-place torch op would,
                    # which autograd's saved-tensor checks and reuse_quantized_weights read.
                    torch.autograd.graph.increment_version(lists[0] + lists[2] + lists[3])
                else:
                    adamw_step_reference(*lists, scalars, step, group["seed"], group["bf16_sr"])
        return loss

    @staticmethod
    def _use_kernel(implementation: str, device: torch.device, lists: tuple[list, ...]) -> bool:
        if implementation == "reference":
            return False
        if device.type == "cpu":  # the extension's host loop: the kernel's arithmetic, any build
            available = _ext.HAS_KERNELS and "adamw" in _ext.kernels()
        else:
            available = _ext.kernel_available("adamw", device)
        contiguous = all(t.is_contiguous() for lst in lists[:4] for t in lst)
        if implementation == "kernel" and not (available and contiguous):
            why = ("tensors must be contiguous" if available else
                   f"no adamw kernel for {device} ({_ext.build_info().get('extension_error') or 'arch not compiled'})")
            raise RuntimeError(f"snip_ops.optim.AdamW(implementation='kernel'): {why}")
        return available and contiguous
