"""`CudaScalarDivision`: the CPU computes `tensor / python_number` as CUDA does, and says where.

CUDA computes `tensor / python_number` as `tensor * float32(1 / number)`, one ulp off the true quotient
for some inputs: a reference that divided by a Python number would, on a GPU, disagree with the kernels
(and with itself on the CPU). Under this mode such divisions take CUDA's bits and are recorded, so a
test can require that a computation has none and that its bits do not change.
"""

import math
import traceback

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

_DIVISIONS = {"__truediv__", "__itruediv__", "div", "div_", "divide", "divide_", "true_divide", "true_divide_"}


def _exact_reciprocal(b: float) -> bool:
    """Division by a power of two equals multiplication by its (exact) reciprocal."""
    return b != 0 and math.frexp(abs(b))[0] == 0.5 and 2.0**-126 <= abs(b) <= 2.0**126


class CudaScalarDivision(TorchFunctionMode):
    """`tensor / number` computed as CUDA computes it (times the float32 reciprocal); `calls` lists
    the source lines of those whose divisor is not a power of two."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        divisor = args[1] if len(args) > 1 else kwargs.get("other")
        if (getattr(func, "__name__", "") in _DIVISIONS and isinstance(args[0], torch.Tensor)
                and args[0].is_floating_point() and isinstance(divisor, (int, float, np.number))
                and not isinstance(divisor, bool) and kwargs.get("rounding_mode") is None):
            a = args[0]
            if not _exact_reciprocal(float(divisor)):
                frame = traceback.extract_stack(limit=2)[0]
                self.calls.append(f"{frame.filename}:{frame.lineno}: {frame.line}")
            inv = np.float32(1.0) / np.float32(divisor)  # CUDA: opmath_t(1) / b, in float32
            out = (a.float() * torch.tensor(float(inv), dtype=torch.float32)).to(a.dtype)
            return a.copy_(out) if func.__name__.endswith("_") or func.__name__ == "__itruediv__" else out
        return func(*args, **kwargs)


def bits(t: torch.Tensor) -> torch.Tensor:
    """Bit patterns of floats (NaN payloads included), so that torch.equal compares them exactly."""
    if t.dtype in (torch.float32, torch.float64):
        return t.view(torch.int32 if t.dtype == torch.float32 else torch.int64)
    return t.view(torch.uint8) if t.element_size() == 1 else t
