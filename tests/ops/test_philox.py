"""Philox4x32-10 against the Random123 known-answer vectors, and the (seed, offset) stream layout."""

import pytest
import torch

from snip_ops.philox import SR_BITS, element_bits, philox4x32, random_bits

KAT = [  # Random123 kat_vectors: counter, key, expected output
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter,key,expected", KAT)
def test_known_answers(counter, key, expected):
    out = philox4x32(tuple(torch.tensor([c]) for c in counter), key)
    assert tuple(int(o) for o in out) == expected


def _block(counter_block: int, seed: int, offset: int) -> list[int]:
    """The eight 16-bit values of one Philox block, straight from the generator: word j // 2, low
    half for even j."""
    words = philox4x32(tuple(torch.tensor([v]) for v in (counter_block & 0xFFFFFFFF, counter_block >> 32,
                                                         offset & 0xFFFFFFFF, offset >> 32)),
                       (seed & 0xFFFFFFFF, seed >> 32))
    return [(int(words[j // 2]) >> (16 * (j % 2))) & 0xFFFF for j in range(8)]


def test_element_bits_match_indexed_bits():
    bits = element_bits(7, 13, seed=123, offset=456)
    assert torch.equal(bits.reshape(-1), random_bits(torch.arange(91), 123, 456))
    # element i: half i % 2 of word (i // 2) % 4 of the block whose counter is (i // 8, 0, offset, 0)
    assert _block(5, 123, 456) == random_bits(torch.arange(40, 48), 123, 456).tolist()
    assert _block(0, 123, 456)[3] == int(bits[0, 3]) and _block(1, 123, 456)[5] == int(bits[1, 0])


def test_determinism_and_independence():
    a = element_bits(256, 256, seed=1, offset=0)
    assert torch.equal(a, element_bits(256, 256, seed=1, offset=0))
    for other in (element_bits(256, 256, seed=1, offset=1), element_bits(256, 256, seed=2, offset=0)):
        assert (a != other).float().mean() > 0.99  # independent values collide with probability 2^-16
    assert a.min() >= 0 and a.max() < 2**SR_BITS
    # uniform bits: each bit's mean over n values has standard error 0.5 / sqrt(n); 6 of them
    bits = torch.stack([(a >> k) & 1 for k in range(SR_BITS)]).double().mean(dim=(1, 2))
    assert ((bits - 0.5).abs() < 6 * 0.5 / a.numel() ** 0.5).all()
    # the two halves of a word and neighbouring elements are uncorrelated
    lo, hi = a.reshape(-1, 2).double().unbind(1)
    assert abs(torch.corrcoef(torch.stack([lo, hi]))[0, 1]) < 6 / lo.numel() ** 0.5


def test_large_seed_offset_and_index():
    idx = torch.tensor([2**40 + 3])
    got = random_bits(idx, 2**63 + 5, 2**50 + 7)
    assert int(got) == _block(2**37, 2**63 + 5, 2**50 + 7)[3]


def test_bad_seed_offset():
    with pytest.raises(ValueError, match="seed"):
        element_bits(2, 2, seed=-1, offset=0)
    with pytest.raises(TypeError, match="offset"):
        element_bits(2, 2, seed=0, offset=1.5)
