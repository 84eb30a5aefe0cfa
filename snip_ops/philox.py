"""Philox4x32-10, the counter-based generator behind stochastic rounding.

Stochastic rounding reads SR_BITS = 16 random bits per element. Those of element `i` (its linear
index in the logical, unpadded input tensor) under `(seed, offset)` are half `i % 2` (the low half
for even `i`) of word `(i // 2) % 4` of

    philox4x32_10(counter = (i // 8 mod 2^32, i // 2^35, offset mod 2^32, offset // 2^32),
                  key     = (seed mod 2^32, seed // 2^32))

so one Philox block (128 bits) serves eight consecutive elements, as a CUDA thread handling eight
or more consecutive elements computes it. The CPU reference, the CUDA kernels and every
data-parallel rank that shares `(seed, offset)` draw the same bits. Written with int64 tensors so it
runs anywhere torch does.
"""

from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
SR_BITS = 16
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


def _block_bits(blocks: torch.Tensor, seed: int, offset: int) -> torch.Tensor:
    """[n, 8]: the eight 16-bit values (int64) of each Philox block in `blocks`, element order."""
    zeros = torch.zeros_like(blocks)
    out = philox4x32(
        (blocks & _MASK32, blocks >> 32, zeros + (offset & _MASK32), zeros + (offset >> 32)),
        (seed & _MASK32, seed >> 32),
    )
    words = torch.stack(out, dim=-1)
    return torch.stack((words & 0xFFFF, words >> 16), dim=-1).reshape(*blocks.shape, 8)


def stream_capturing() -> bool:
    """Whether a CUDA graph is being captured on the current CUDA stream (False without a usable GPU)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def capturing(t: torch.Tensor) -> bool:
    """Whether `t` is a CUDA tensor and a CUDA graph is being captured on the current stream."""
    return t.is_cuda and stream_capturing()


def refuse_capture(t: torch.Tensor, what: str) -> None:
    """Raise if a CUDA graph is being captured around `what`, work on `t` that draws random bits. The
    offset (and the seed) reach the kernels as host integers, and torch's reference computes its bits
    from them on the host's word: a graph would bake in the capture's offset and replay the same bits
    at every step, silently losing what makes stochastic rounding unbiased over steps."""
    if capturing(t):
        raise RuntimeError(
            f"{what} draws random bits whose Philox offset is a host integer, and a CUDA graph is being "
            "captured: every replay would draw the captured step's bits again. Run it outside the graph "
            "(torch.compile's CUDA-graph mode keeps snip's layers that draw bits outside its graphs by "
            "itself), or use round-to-nearest there.")


def random_bits(index: torch.Tensor, seed: int, offset: int) -> torch.Tensor:
    """The SR_BITS-bit random value (int64 in [0, 2^16)) of each element linear index in `index`."""
    _check_seed_offset(seed, offset)
    index = index.to(torch.int64)
    bits = _block_bits(index >> 3, seed, offset)
    return torch.gather(bits, -1, (index & 7).unsqueeze(-1)).squeeze(-1)


def element_bits(rows: int, cols: int, seed: int, offset: int, device=None) -> torch.Tensor:
    """Random values for a row-major [rows, cols] tensor, element (r, c) having index r * cols + c."""
    _check_seed_offset(seed, offset)
    n = rows * cols
    blocks = torch.arange((n + 7) // 8, dtype=torch.int64, device=device)
    return _block_bits(blocks, seed, offset).reshape(-1)[:n].reshape(rows, cols)
