"""Philox4x32-10 against the Random123 known-answer vectors, and the (seed, offset) stream layout."""

import pytest
import torch

from snip_ops.philox import element_words, philox4x32, random_words

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


def test_element_words_match_indexed_words():
    words = element_words(7, 13, seed=123, offset=456)
    assert torch.equal(words.reshape(-1), random_words(torch.arange(91), 123, 456))
    # lane i % 4 of block i // 4, the block's counter being (i // 4, 0, offset, 0)
    block = philox4x32(tuple(torch.tensor([v]) for v in (5, 0, 456, 0)), (123, 0))
    assert [int(b) for b in block] == random_words(torch.arange(20, 24), 123, 456).tolist()


def test_determinism_and_independence():
    a = element_words(256, 256, seed=1, offset=0)
    assert torch.equal(a, element_words(256, 256, seed=1, offset=0))
    for other in (element_words(256, 256, seed=1, offset=1), element_words(256, 256, seed=2, offset=0)):
        assert (a != other).float().mean() > 0.99  # independent words collide with probability 2^-32
    assert a.min() >= 0 and a.max() < 2**32
    # uniform bits: each bit's mean over n words has standard error 0.5 / sqrt(n); 6 of them
    bits = torch.stack([(a >> k) & 1 for k in range(32)]).double().mean(dim=(1, 2))
    assert ((bits - 0.5).abs() < 6 * 0.5 / a.numel() ** 0.5).all()


def test_large_seed_offset_and_index():
    idx = torch.tensor([2**40 + 3])
    w = random_words(idx, 2**63 + 5, 2**50 + 7)
    counter = ((2**38) & 0xFFFFFFFF, 2**38 >> 32, (2**50 + 7) & 0xFFFFFFFF, (2**50 + 7) >> 32)
    out = philox4x32(tuple(torch.tensor([c]) for c in counter), ((2**63 + 5) & 0xFFFFFFFF, (2**63 + 5) >> 32))
    assert int(w) == int(out[3])


def test_bad_seed_offset():
    with pytest.raises(ValueError, match="seed"):
        element_words(2, 2, seed=-1, offset=0)
    with pytest.raises(TypeError, match="offset"):
        element_words(2, 2, seed=0, offset=1.5)
