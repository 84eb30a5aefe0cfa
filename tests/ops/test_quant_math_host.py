"""The quantizer kernels' element rounding (csrc/quant/quant_math.cuh: round_to_code, decode),
compiled for the host, against the PyTorch reference (snip_ops.cast.round_to_format / encode):

* round to nearest even on every float32 bit pattern (all 2^32), for each element format, the scale
  being 1 (the kernels divide by the block scale first, exactly as the reference does);
* decoding of every code;
* stochastic rounding on sampled inputs (every binade of each format, subnormal targets, ties, the
  saturation edge) x every 16-bit random value, and on random float32 patterns;
* the per-block division (`quotient`) against IEEE division on every 16-bit-float significand;
* AdamW's BF16 write-back (csrc/optim/adamw_math.cuh: bf16_rne, bf16_sr) on every upper half of a float32
  pattern with the lower halves where rounding turns.
"""

import numpy as np
import pytest
import torch

import host_twin
from snip_ops.cast import decode, encode, round_to_format
from snip_ops.formats import BF16, E2M1, E4M3, E5M2, Rounding
from snip_ops.philox import SR_BITS

FORMATS = {"e4m3": E4M3, "e5m2": E5M2, "e2m1": E2M1}
CHUNK = 1 << 20  # 4 MiB arrays: reused by the allocator, where 64 MiB ones would be mapped afresh each time


def _floats(bits: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(bits.view(np.int32)).view(torch.float32)


def _codes(values: torch.Tensor, fmt) -> np.ndarray:
    """The reference's codes, sign bit at the format's width (as the kernels store them)."""
    return encode(values, fmt).numpy().astype(np.uint32)


@pytest.fixture(scope="module")
def lib():
    return host_twin.load()


@pytest.mark.exhaustive
@pytest.mark.parametrize("sign", [0, 1], ids=["positive", "negative"])  # two halves: two workers share them
@pytest.mark.parametrize("elem", FORMATS)
def test_round_to_nearest_on_every_float32(lib, elem, sign):
    fmt = FORMATS[elem]
    low = np.arange(CHUNK, dtype=np.uint32)
    for top in range(sign << 11, (sign + 1) << 11):  # the top 12 bits of the pattern; CHUNK covers the other 20
        bits = (np.uint32(top) << np.uint32(20)) | low
        hi = top >> 4
        codes, values = host_twin.round_to_codes(lib, bits, elem)
        ref = round_to_format(_floats(bits), fmt, Rounding.RNE).numpy()
        if hi & 0x7F != 0x7F:  # every pattern finite: compare whole arrays (no masked copies)
            assert np.array_equal(values.view(np.uint32), ref.view(np.uint32)), hex(top)
            continue
        finite = (bits & 0x7F800000) != 0x7F800000
        # finite inputs: the same value, sign of zero included (decode is one-to-one on finite codes)
        assert np.array_equal(values.view(np.uint32)[finite], ref.view(np.uint32)[finite]), hex(top)
        # Inf / NaN: the same code (NaN, or Inf where the format has it)
        assert np.array_equal(codes[~finite], _codes(torch.from_numpy(ref[~finite]), fmt)), hex(top)


@pytest.mark.parametrize("elem", FORMATS)
def test_decode_of_every_code(lib, elem):
    codes = np.arange(1 << FORMATS[elem].bits, dtype=np.uint32)
    got = host_twin.decode(lib, codes, elem)
    want = decode(torch.from_numpy(codes.astype(np.int64)), FORMATS[elem]).numpy()
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan) and np.array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])


def _sr_inputs(fmt) -> np.ndarray:
    """Finite float32 values across the format: each binade's ends and middle with random low bits,
    subnormal targets, values just below and above max_finite, zeros, both signs."""
    rng = np.random.default_rng(11)
    points = [0.0, fmt.min_subnormal / 3, fmt.min_subnormal * 1.5, fmt.min_normal * 0.75, fmt.max_finite * 0.99,
              fmt.max_finite * 1.01, fmt.max_finite * 4]
    for e in range(fmt.emin - fmt.man_bits, fmt.emax + 1):
        points += [2.0**e * (1 + rng.random()), 2.0**e * 1.5, 2.0**e * (2 - 2.0**-20)]
    x = np.array(points, np.float32)
    return np.concatenate([x, -x])


@pytest.mark.parametrize("elem", FORMATS)
def test_stochastic_rounding_on_every_random_value(lib, elem):
    fmt = FORMATS[elem]
    rand = np.arange(1 << SR_BITS, dtype=np.uint32)
    for v in _sr_inputs(fmt):
        bits = np.full(rand.size, np.float32(v).view(np.uint32), np.uint32)
        codes, values = host_twin.round_to_codes(lib, bits, elem, rand)
        ref = round_to_format(_floats(bits), fmt, Rounding.SR, torch.from_numpy(rand.astype(np.int64)))
        assert np.array_equal(values.view(np.uint32), ref.numpy().view(np.uint32)), (elem, float(v))


@pytest.mark.parametrize("elem", FORMATS)
def test_stochastic_rounding_on_random_float32(lib, elem):
    """Every exponent field, random significands (the dropped bits below the 16 that SR reads vary)."""
    fmt = FORMATS[elem]
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 0x7F800000, size=1 << 20, dtype=np.uint32)  # finite
    bits |= rng.integers(0, 2, size=bits.size, dtype=np.uint32) << np.uint32(31)
    rand = rng.integers(0, 1 << SR_BITS, size=bits.size, dtype=np.uint32)
    codes, values = host_twin.round_to_codes(lib, bits, elem, rand)
    ref = round_to_format(_floats(bits), fmt, Rounding.SR, torch.from_numpy(rand.astype(np.int64)))
    assert np.array_equal(values.view(np.uint32), ref.numpy().view(np.uint32))


def _sum_toward_zero(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a + b rounded toward zero in float32, from the float64 sum: for float32 a >= b >= 0 it differs from
    the exact sum only below 29 bits under the float32 LSB, which cannot carry into it (b's significand spans 24
    bits), so the nearest float32 of it, stepped down where it lies above, is the truncated exact sum."""
    s = a.astype(np.float64) + b.astype(np.float64)
    near = s.astype(np.float32)
    above = near.astype(np.float64) > s
    near[above] = np.nextafter(near[above], np.float32(0))
    return near


def test_sum_toward_zero(lib):
    """add_rz, which SR uses below 2^emin on the host (the GPU has the instruction): every pair SR forms (each
    format's 2^emin plus values below it, FP32 subnormals included) and random pairs of every magnitude."""
    rng = np.random.default_rng(5)
    a, b = [], []
    for fmt in FORMATS.values():
        below = rng.integers(0, np.float32(fmt.min_normal).view(np.uint32), size=1 << 16, dtype=np.uint32)
        below[:4] = [0, 1, 0x7FFFFF, np.float32(fmt.min_normal).view(np.uint32) - 1]  # zero, subnormals, 2^emin-
        a.append(below.view(np.float32))
        b.append(np.full(below.size, fmt.min_normal, np.float32))
    pairs = rng.integers(0, 0x7F000000, size=(2, 1 << 16), dtype=np.uint32).view(np.float32)
    a.append(pairs.max(axis=0))
    b.append(pairs.min(axis=0))
    a, b = np.concatenate(a), np.concatenate(b)
    got = host_twin.add_rz(lib, a, b)
    assert np.array_equal(got.view(np.uint32), _sum_toward_zero(a, b).view(np.uint32))
    assert np.array_equal(host_twin.add_rz(lib, b, a).view(np.uint32), got.view(np.uint32))  # either order


def test_block_quotient_equals_division_for_bf16(lib):
    """quant_math.cuh's `quotient` (one reciprocal per block, a corrected product per element) is
    IEEE x / s for every BF16 significand x every float32 scale significand."""
    assert host_twin.check_quotients(lib, 8) == (0, 0.0, 0.0)


@pytest.mark.exhaustive
def test_block_quotient_equals_division_for_fp16(lib):
    assert host_twin.check_quotients(lib, 11) == (0, 0.0, 0.0)


def test_block_quotient_edges(lib):
    """Outside the enumerated domain the quotient is exact, or it and the true quotient are both below
    2^-33 with x's sign, so that every format and rounding gives the same signed zero code."""
    cases = [(0.0, 3.0), (-0.0, 3.0), (2.0**-120, 3.0), (-(2.0**-133), 0.7), (2.0**-101, 2.0**-60),
             (-(2.0**-110), 2.0**-59), (1.0, 2.0**-127), (5.0, 2.0**127), (3.0, 2.0**-61), (1e-30, 1e10)]
    for x, s in cases:
        got, want = host_twin.quotient(lib, x, s), np.float32(x) / np.float32(s)
        assert np.signbit(got) == np.signbit(want), (x, s)
        assert got == want or (abs(got) < 2.0**-33 and abs(want) < 2.0**-33), (x, s, got, want)
    for elem, fmt in FORMATS.items():  # such a tiny quotient gives the zero code under RNE and SR
        tiny = np.array([np.float32(2.0**-33).view(np.uint32), np.float32(-(2.0**-33)).view(np.uint32)], np.uint32)
        for rand in (None, np.full(2, (1 << SR_BITS) - 1, np.uint32)):
            codes, _ = host_twin.round_to_codes(lib, tiny, elem, rand)
            assert codes.tolist() == [0, 1 << (fmt.bits - 1)], (elem, rand)


@pytest.mark.parametrize("rounding", [Rounding.RNE, Rounding.SR])
def test_bf16_write_back(lib, rounding):
    """bf16_rne / bf16_sr against cast.round_to_format(BF16): every upper 16 bits (both signs, subnormals,
    the saturation edge, Inf, NaN) with lower halves at and around the rounding points and random ones; SR
    with random bits and the extreme ones. NaN: the kernel's own quiet NaN, as the AdamW tests accept."""
    rng = np.random.default_rng(3)
    lows = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)
    lows = np.concatenate([lows, rng.integers(0, 1 << 16, size=10, dtype=np.uint32)])
    bits = ((np.arange(1 << 16, dtype=np.uint32)[:, None] << np.uint32(16)) | lows[None, :]).reshape(-1)
    rand = None
    if rounding == Rounding.SR:
        rand = rng.integers(0, 1 << SR_BITS, size=bits.size, dtype=np.uint32)
        rand[::7], rand[1::7] = 0, (1 << SR_BITS) - 1
    got = host_twin.bf16_round(lib, bits, rand)
    bits_tensor = None if rand is None else torch.from_numpy(rand.astype(np.int64))
    ref = round_to_format(_floats(bits), BF16, rounding, bits_tensor)
    want = ref.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(ref.numpy())
    assert np.all(got[nan] == 0x7FFF)
    assert np.array_equal(got[~nan], want[~nan])
