"""Philox4x32-10, the counter-based generator behind stochastic rounding.

The random word of element `i` (its linear index in the logical, unpadded input tensor) under
`(seed, offset)` is lane `i % 4` of

    philox4x32_10(counter = (i // 4 mod 2^32, i // 2^34, offset mod 2^32, offset // 2^32),
                  key     = (seed mod 2^32, seed // 2^32))

so a CUDA thread that handles four consecutive elements computes one Philox block. The CPU
reference, the CUDA kernels and every data-parallel rank that shares `(seed, offset)` draw the same
bits. Written with int64 tensors so it runs anywhere torch does.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
ROUNDS = 10


def philox4x32(counter: tuple[torch.Tensor, ...], key: tuple[int, int], rounds: int = ROUNDS):
    """Philox4x32 on int64 tensors holding uint32 values; returns the four output words.

    The 32x32 -> 64-bit products use int64 multiplication, which wraps modulo 2^64 and so keeps all
    64 bits even past 2^63 (the known-answer tests pin this); the high word is `(p >> 32) & mask`.
    In-place updates keep the number of fresh allocations at four per round.
    """
    c0, c1, c2, c3 = (c.clone() for c in counter)
    k0, k1 = key[0] & _MASK32, key[1] & _MASK32
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + _W0) & _MASK32, (k1 + _W1) & _MASK32
        p0 = c0.mul_(_M0)
        p1 = c2.mul_(_M1)
        hi1 = (p1 >> 32).bitwise_and_(_MASK32).bitwise_xor_(c1).bitwise_xor_(k0)
        hi0 = (p0 >> 32).bitwise_and_(_MASK32).bitwise_xor_(c3).bitwise_xor_(k1)
        c0, c1, c2, c3 = hi1, p1.bitwise_and_(_MASK32), hi0, p0.bitwise_and_(_MASK32)
    return c0, c1, c2, c3


def _check_seed_offset(seed: int, offset: int) -> None:
    for name, v in (("seed", seed), ("offset", offset)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
        if not 0 <= v < 2**64:
            raise ValueError(f"{name} must be in [0, 2^64), got {v}")


def random_words(index: torch.Tensor, seed: int, offset: int) -> torch.Tensor:
    """The 32-bit random word (as int64 in [0, 2^32)) of each element linear index in `index`."""
    _check_seed_offset(seed, offset)
    index = index.to(torch.int64)
    group = index >> 2
    zeros = torch.zeros_like(group)
    out = philox4x32(
        (group & _MASK32, group >> 32, zeros + (offset & _MASK32), zeros + (offset >> 32)),
        (seed & _MASK32, seed >> 32),
    )
    lane = index & 3
    return torch.where(lane == 0, out[0], torch.where(lane == 1, out[1], torch.where(lane == 2, out[2], out[3])))


def element_words(rows: int, cols: int, seed: int, offset: int, device=None) -> torch.Tensor:
    """Random words for a row-major [rows, cols] tensor, element (r, c) having index r * cols + c."""
    _check_seed_offset(seed, offset)
    n = rows * cols
    groups = torch.arange((n + 3) // 4, dtype=torch.int64, device=device)
    zeros = torch.zeros_like(groups)
    out = philox4x32(
        (groups & _MASK32, groups >> 32, zeros + (offset & _MASK32), zeros + (offset >> 32)),
        (seed & _MASK32, seed >> 32),
    )
    return torch.stack(out, dim=1).reshape(-1)[:n].reshape(rows, cols)
