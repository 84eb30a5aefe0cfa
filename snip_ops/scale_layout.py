"""Scale-factor layouts the GEMMs read, as pure-PyTorch reference functions.

* Plain ("row-major"): `scales[i, j]` is the scale of block (i, j), as `reference.quantize` returns
  it; the Hopper FP8 GEMM reads this.
* Blackwell block-scaled ("blackwell"): the layout of CUTLASS's `Sm1xxBlockScaledConfig<SFVec>`
  (cutlass/detail/sm100_blockscaled_layout.hpp), which the sm_100a block-scaled tcgen05 GEMMs read for
  nvfp4 / mxfp4 / mxfp8 operands. For an operand with `rows` rows (M or N) and `n` = K / SFVec scales
  per row, the scales are cut into atoms of 128 rows x 4 scales (`SfKMajorAtom`, shape
  ((32, 4), (SFVec, 4)), stride ((16, 4), (0, 1))); inside an atom, the scale of (row r, scale k) is
  byte `(r % 32) * 16 + (r // 32 % 4) * 4 + k % 4`; atoms are 512 bytes, K-atoms contiguous
  (`tile_to_shape(..., Step<_2, _1, _3>)`), so the byte offset is

      ((r // 128) * ceil(n / 4) + k // 4) * 512 + (r % 32) * 16 + (r // 32 % 4) * 4 + k % 4.

  Rows are padded to a multiple of 128 and scales per row to a multiple of 4; padding holds zero
  bytes (E4M3 0.0, E8M0 2^-127: finite, so zero-padded K codes contribute exactly 0 to the GEMM).
  The result is returned as a [ceil(rows/128)*128, ceil(n/4)*4] tensor of the scale dtype whose
  memory is in that order (not row-major!): its `numel()` is what CUTLASS's
  `size(filter_zeros(layout_SF))` allocates. tests/ops/test_scale_layout.py checks the formula against
  offsets printed by CuTe itself.

* Hopper ("hopper"): the plain grid transposed, MN-major: for an operand with `outer` block rows (its rows
  for 1x128 blocks, ceil(rows / 128) for 128x128 ones) and `n` scales per row, a [n, round_up(outer, 4)]
  tensor whose element [k, r] is the scale of block (r, k); the padding columns hold zeros (FP32 scales
  only). This is what the sm_90a blockwise FP8 GEMM reads (`gemm_kernels.hopper_scales`: each K block's
  scales contiguous along M or N, 16-byte aligned), so an operand quantized in it goes to the GEMM as is.

Both directions are exact permutations (bit patterns are moved, never converted).
"""

from __future__ import annotations

import torch

__all__ = ["ATOM_ROWS", "ATOM_SCALES", "blackwell_shape", "blackwell_offset", "to_blackwell", "from_blackwell",
           "hopper_shape", "to_hopper", "from_hopper", "to_layout"]

ATOM_ROWS = 128
ATOM_SCALES = 4


def _round_up(v: int, m: int) -> int:
    return -(-v // m) * m


def blackwell_shape(rows: int, n: int) -> tuple[int, int]:
    """Padded [rows, scales-per-row] of the Blackwell layout of a [rows, n] scale grid."""
    return _round_up(rows, ATOM_ROWS), _round_up(n, ATOM_SCALES)


def blackwell_offset(r, k, n: int):
    """Flat byte offset of the scale of (row r, scale k) for `n` scales per row (ints or int tensors)."""
    k_atoms = -(-n // ATOM_SCALES)
    return ((r // 128) * k_atoms + k // 4) * 512 + (r % 32) * 16 + (r // 32 % 4) * 4 + k % 4


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    if t.element_size() != 1:
        raise TypeError(f"block-scaled scale factors are 1-byte types (E4M3, E8M0), got {t.dtype}")
    return t.view(torch.uint8)


def to_blackwell(scales: torch.Tensor) -> torch.Tensor:
    """Plain [rows, n] scales -> the Blackwell layout (see the module docstring), same dtype."""
    if scales.dim() != 2:
        raise ValueError(f"scales must be 2-D [rows, n], got shape {tuple(scales.shape)}")
    rows, n = scales.shape
    pr, pn = blackwell_shape(rows, n)
    b = torch.nn.functional.pad(_as_bytes(scales), (0, pn - n, 0, pr - rows))
    # [row atom, r // 32 % 4, r % 32, k atom, k % 4] -> [row atom, k atom, r % 32, r // 32 % 4, k % 4]
    b = b.reshape(pr // 128, 4, 32, pn // 4, 4).permute(0, 3, 2, 1, 4).contiguous()
    return b.reshape(pr, pn).view(scales.dtype)


def from_blackwell(sf: torch.Tensor, rows: int, n: int) -> torch.Tensor:
    """The inverse of `to_blackwell`: the plain [rows, n] scales (padding dropped)."""
    pr, pn = blackwell_shape(rows, n)
    if sf.numel() != pr * pn:
        raise ValueError(f"a Blackwell scale tensor for [{rows}, {n}] has {pr * pn} elements, got {sf.numel()}")
    b = _as_bytes(sf.contiguous()).reshape(pr // 128, pn // 4, 32, 4, 4).permute(0, 3, 2, 1, 4)
    return b.reshape(pr, pn)[:rows, :n].contiguous().view(sf.dtype)


def hopper_shape(outer: int, n: int) -> tuple[int, int]:
    """[scales per row, padded block rows] of the Hopper layout of an [outer, n] scale grid."""
    return n, _round_up(outer, 4)


def to_hopper(scales: torch.Tensor) -> torch.Tensor:
    """Plain [outer, n] scales -> the Hopper layout (see the module docstring), same dtype."""
    if scales.dim() != 2:
        raise ValueError(f"scales must be 2-D [outer, n], got shape {tuple(scales.shape)}")
    outer, n = scales.shape
    _, pitch = hopper_shape(outer, n)
    return torch.nn.functional.pad(scales.t(), (0, pitch - outer)).contiguous()


def from_hopper(sf: torch.Tensor, outer: int, n: int) -> torch.Tensor:
    """The inverse of `to_hopper`: the plain [outer, n] scales (padding dropped)."""
    if tuple(sf.shape) != hopper_shape(outer, n):
        raise ValueError(f"a Hopper scale tensor for [{outer}, {n}] has shape {hopper_shape(outer, n)}, "
                         f"got {tuple(sf.shape)}")
    # copied into a fresh tensor: `.contiguous()` keeps a size-1 dimension's odd stride, which byte views refuse
    return sf.new_empty((outer, n)).copy_(sf[:, :outer].t())


def to_layout(scales: torch.Tensor, scale_layout: str) -> torch.Tensor:
    """Plain scales -> `scale_layout` ("plain", "blackwell" or "hopper"); `reference.plain_scales` goes back."""
    moves = {"plain": lambda s: s, "blackwell": to_blackwell, "hopper": to_hopper}
    if scale_layout not in moves:
        raise ValueError(f"scale_layout must be one of {tuple(moves)}, got {scale_layout!r}")
    return moves[scale_layout](scales)
