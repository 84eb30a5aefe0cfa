"""The random Hadamard transform (RHT) of NVIDIA's NVFP4 training recipe, on the wgrad operands.

wgrad computes dw = dy^T x, a sum over the M tokens. Gradients and activations have outlier tokens
that blow up a 1x16 block's scale and flush its other elements to zero. With T = blockdiag(H D, ...,
H D) on the token dimension -- H the 16x16 Sylvester Hadamard matrix divided by 4 (orthonormal), D a
diagonal of random signs -- (T dy)^T (T x) = dy^T D H^T H D x = dy^T x exactly, while every 16 tokens
are mixed so that an outlier is spread over its group: the quantized T dy and T x lose less.

Exact semantics (what any kernel must reproduce bit for bit):
  * the signs: element j of the 16 is -1 where the top bit of element j's 16 random bits under
    `(seed, gemm.operand_offset(offset, "rht"))` is set, else +1 (`rht_signs`); one draw per layer and
    step, shared by both operands and by every rank with the same seed;
  * the transform, in float32: M is zero-padded to a multiple of 16; each element is multiplied by
    its token's sign (exact); then the 4 butterfly stages of the fast Walsh-Hadamard transform, stage
    h = 1, 2, 4, 8 replacing each pair (a, b) = (v[j], v[j + h]) (j mod 2h < h) by (a + b, a - b),
    each an IEEE float32 add or subtract; finally times 0.25 (exact). The padded tokens stay in the
    result: the transform mixes them with real ones, and the product over all of them is the
    exact one.
"""

from __future__ import annotations

import torch

from . import philox

__all__ = ["HADAMARD_SIZE", "rht_signs", "sign_mask", "random_hadamard", "hadamard_matrix", "padded_tokens"]

HADAMARD_SIZE = 16


def _check_size(size: int) -> None:
    if not isinstance(size, int) or size < 2 or size & (size - 1):
        raise ValueError(f"the Hadamard size must be a power of two >= 2, got {size!r}")


def padded_tokens(m: int, size: int = HADAMARD_SIZE) -> int:
    """The number of tokens after padding `m` to whole transform groups."""
    _check_size(size)
    return -(-m // size) * size


def rht_signs(seed: int, offset: int, size: int = HADAMARD_SIZE, device=None) -> torch.Tensor:
    """The random signs D (float32 +1/-1, [size]) for stream (seed, offset)."""
    _check_size(size)
    bits = philox.element_bits(1, size, seed, offset, device=device).reshape(size)
    return 1.0 - 2.0 * (bits >> (philox.SR_BITS - 1)).to(torch.float32)


def sign_mask(signs: torch.Tensor) -> int:
    """The signs as the native quantizer takes them: bit j set where sign j is -1."""
    return sum(1 << j for j, s in enumerate(signs.tolist()) if s < 0)


def random_hadamard(t: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """float32 T t for t [M, N] (T acting on the M dimension, `signs` [size]): [padded_tokens(M), N]."""
    if not isinstance(t, torch.Tensor) or t.dim() != 2:
        raise ValueError(f"random_hadamard expects a 2-D tensor [tokens, features], got {getattr(t, 'shape', t)!r}")
    if t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"random_hadamard expects float32, bfloat16 or float16, got {t.dtype}")
    size = signs.numel()
    _check_size(size)
    m, n = t.shape
    v = t.float()
    rows = padded_tokens(m, size)
    if rows > m:
        v = torch.nn.functional.pad(v, (0, 0, 0, rows - m))
    groups = rows // size
    v = v.reshape(groups, size, n) * signs.to(device=t.device, dtype=torch.float32).reshape(1, size, 1)
    h = 1
    while h < size:
        pairs = v.reshape(groups, size // (2 * h), 2, h, n)
        a, b = pairs[:, :, 0], pairs[:, :, 1]
        v = torch.stack((a + b, a - b), dim=2).reshape(groups, size, n)
        h *= 2
    return (v * (1.0 / size**0.5)).reshape(rows, n)


def hadamard_matrix(size: int = HADAMARD_SIZE, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The orthonormal Sylvester Hadamard matrix H (H @ H.T = I), for tests and explanations."""
    _check_size(size)
    h = torch.ones(1, 1, dtype=dtype)
    while h.shape[0] < size:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h / size**0.5
