"""snip_ops.scale_layout: the Blackwell block-scaled scale-factor layout (CUTLASS Sm1xxBlockScaledConfig)."""

import pytest
import torch

from snip_ops import scale_layout
from snip_ops.formats import E2M1, E4M3, QuantSpec, ScaleKind
from snip_ops.reference import quantize
from snip_ops.scale_layout import blackwell_offset, blackwell_shape, from_blackwell, to_blackwell, to_hopper, to_layout

# (SFVec, rows, K, cosize, [(row, scale index k, byte offset)]): offsets printed by CuTe itself,
# `Sm1xxBlockScaledConfig<SFVec>::tile_atom_to_shape_SFA(make_shape(rows, 1, K, 1))(row, k * SFVec, 0)`
# with CUTLASS 4.2.0 (cutlass/detail/sm100_blockscaled_layout.hpp), and `cosize` of that layout.
CUTE = [
    (16, 300, 144, 4608, [
        (18, 3, 291), (43, 1, 181), (44, 8, 1220), (63, 3, 503), (63, 5, 1013), (66, 7, 555), (99, 3, 63),
        (114, 0, 300), (117, 7, 863), (128, 2, 1538), (138, 0, 1696), (141, 1, 1745), (162, 8, 2596),
        (175, 2, 1782), (184, 2, 1926), (191, 3, 2039), (216, 8, 2952), (221, 1, 2009), (229, 6, 2142),
        (232, 6, 2190), (242, 3, 1839), (265, 4, 3728), (273, 8, 4368), (281, 3, 3475),
    ]),
    (32, 130, 160, 2048, [
        (0, 1, 1), (2, 4, 544), (12, 3, 195), (15, 0, 240), (19, 0, 304), (20, 3, 323), (41, 4, 660),
        (53, 1, 341), (64, 3, 11), (67, 3, 59), (72, 2, 138), (81, 3, 283), (88, 4, 904), (90, 3, 427),
        (96, 3, 15), (97, 3, 31), (101, 0, 92), (106, 3, 175), (112, 1, 269), (113, 0, 284), (114, 3, 303),
        (125, 0, 476), (125, 1, 477), (128, 0, 1024),
    ]),
]


@pytest.mark.parametrize("vec, rows, k, cosize, samples", CUTE, ids=["sfvec16", "sfvec32"])
def test_offsets_match_cute(vec, rows, k, cosize, samples):
    n = k // vec
    pr, pn = blackwell_shape(rows, n)
    assert pr * pn == cosize
    for r, kk, off in samples:
        assert blackwell_offset(r, kk, n) == off, (r, kk)


@pytest.mark.parametrize("rows, n", [(1, 1), (128, 4), (300, 9), (130, 5), (257, 13), (0, 3), (5, 0)])
def test_to_blackwell_places_every_scale_at_its_offset(rows, n):
    s = torch.randint(1, 255, (rows, n), dtype=torch.uint8)
    b = to_blackwell(s)
    assert b.shape == blackwell_shape(rows, n) and b.dtype == torch.uint8 and b.is_contiguous()
    flat = b.reshape(-1)
    r = torch.arange(rows)[:, None].expand(rows, n)
    k = torch.arange(n)[None, :].expand(rows, n)
    assert torch.equal(flat[blackwell_offset(r, k, n)], s)
    assert int((flat != 0).sum()) == rows * n  # every other byte is zero padding


def test_atom_structure():
    # One atom: 128 rows x 4 scales = 512 bytes, the 4 scales of a row contiguous (one 32-bit word),
    # rows r, r + 32, r + 64, r + 96 in consecutive words.
    s = torch.arange(512, dtype=torch.int32).reshape(128, 4)
    b = to_blackwell(s.to(torch.uint8).view(torch.float8_e4m3fn)).view(torch.uint8).to(torch.int32)
    words = b.reshape(32, 4, 4)  # [r % 32, r // 32, k]
    for r in range(128):
        assert torch.equal(words[r % 32, r // 32], s[r] % 256)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e8m0fnu, torch.uint8])
@pytest.mark.parametrize("rows, n", [(3, 2), (200, 7), (256, 8)])
def test_round_trip(dtype, rows, n):
    s = torch.randint(0, 255, (rows, n), dtype=torch.uint8).view(dtype)
    b = to_blackwell(s)
    assert b.dtype == dtype
    back = from_blackwell(b, rows, n)
    assert back.dtype == dtype and torch.equal(back.view(torch.uint8), s.view(torch.uint8))
    assert torch.equal(from_blackwell(b.reshape(-1), rows, n).view(torch.uint8), s.view(torch.uint8))


def test_quantizer_scales_round_trip():
    x = torch.randn(300, 200)
    for spec in (QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4), QuantSpec(E4M3, (1, 32), ScaleKind.E8M0)):
        q = quantize(x, spec)
        b = to_blackwell(q.scales)
        assert b.shape == (384, 16 if spec.block[1] == 16 else 8)
        assert torch.equal(from_blackwell(b, *q.scales.shape).view(torch.uint8), q.scales.view(torch.uint8))


def test_errors():
    with pytest.raises(TypeError, match="1-byte"):
        to_blackwell(torch.ones(4, 4))
    with pytest.raises(ValueError, match="2-D"):
        to_blackwell(torch.ones(4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="elements"):
        from_blackwell(torch.zeros(100, dtype=torch.uint8), 3, 2)
    assert scale_layout.ATOM_ROWS == 128 and scale_layout.ATOM_SCALES == 4


def test_to_layout_names_each_permutation():
    s = torch.arange(1, 7, dtype=torch.uint8).reshape(3, 2)
    assert to_layout(s, "plain") is s
    assert torch.equal(to_layout(s, "blackwell"), to_blackwell(s))
    assert torch.equal(to_layout(s.float(), "hopper"), to_hopper(s.float()))
    with pytest.raises(ValueError, match="scale_layout must be one of"):
        to_layout(s, "row-major")
