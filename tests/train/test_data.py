"""snip_train.data: default corpus, token files, deterministic disjoint split, batches."""

import numpy as np
import pytest
import torch

from snip_train.data import TokenData, load_corpus, stdlib_corpus_bytes

CAP = 512 * 1024


@pytest.fixture(scope="module")
def stdlib():
    return TokenData.from_path(None, max_bytes=CAP)


def test_stdlib_corpus_deterministic():
    a = stdlib_corpus_bytes(CAP)
    b = stdlib_corpus_bytes(CAP)
    assert a == b and len(a) == CAP
    assert b"def " in a and b"import " in a
    assert stdlib_corpus_bytes(1000) == a[:1000]


def test_split_disjoint_and_covering(stdlib):
    tr, va = stdlib.segments("train"), stdlib.segments("val")
    assert len(tr) and len(va)
    allseg = sorted(map(tuple, np.concatenate([tr, va]).tolist()))
    assert allseg[0][0] == 0 and allseg[-1][1] == len(stdlib)
    for (s0, e0), (s1, e1) in zip(allseg, allseg[1:]):
        assert e0 == s1  # contiguous, no overlap, no gap
    frac = stdlib.num_tokens("val") / len(stdlib)
    assert 0.02 < frac < 0.1
    # sampled windows stay inside their split's blocks
    T = 64
    for split, segs in (("train", tr), ("val", va)):
        g = torch.Generator().manual_seed(1)
        for s in stdlib.window_starts(split, 256, T, g):
            assert any(a <= s and s + T + 1 <= b for a, b in segs), (split, s)


def test_get_batch_deterministic(stdlib):
    g1, g2, g3 = (torch.Generator().manual_seed(s) for s in (5, 5, 6))
    a = stdlib.get_batch("train", 8, 32, g1)
    b = stdlib.get_batch("train", 8, 32, g2)
    c = stdlib.get_batch("train", 8, 32, g3)
    assert a.shape == (8, 33) and a.dtype == torch.int64
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert 0 <= int(a.min()) and int(a.max()) < 256
    starts = stdlib.window_starts("train", 8, 32, torch.Generator().manual_seed(5))
    toks = np.asarray(stdlib.tokens)
    for row, s in zip(a, starts):
        assert row.tolist() == toks[s:s + 33].tolist()
    x, y = stdlib.get_xy("val", 4, 16, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_custom_text_file(tmp_path):
    text = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(2000))
    p = tmp_path / "corpus.txt"
    p.write_text(text)
    d = TokenData.from_path(p, max_bytes=None)
    assert len(d) == len(text.encode()) and d.vocab_size == 256
    w = d.get_batch("train", 4, 40, torch.Generator().manual_seed(0))
    for row in w:
        assert bytes(row.tolist()).decode() in text
    # cap
    assert len(load_corpus(p, max_bytes=1000)) == 1000


def test_token_files(tmp_path):
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 1000, size=50_000).astype(np.uint16)
    np.save(tmp_path / "t.npy", toks)
    toks.tofile(tmp_path / "t.bin")
    d_npy = TokenData.from_path(tmp_path / "t.npy")
    d_bin = TokenData.from_path(tmp_path / "t.bin")  # uint16 by default
    assert d_npy.vocab_size == d_bin.vocab_size == int(toks.max()) + 1
    a = d_npy.get_batch("train", 4, 16, torch.Generator().manual_seed(3))
    b = d_bin.get_batch("train", 4, 16, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    u8 = rng.integers(0, 256, size=20_000).astype(np.uint8)
    u8.tofile(tmp_path / "b.bin")
    d8 = TokenData.from_path(tmp_path / "b.bin", token_dtype="uint8")
    assert len(d8) == 20_000 and d8.vocab_size == 256


def test_too_small_corpus_errors():
    d = TokenData.from_bytes(b"x" * 500)
    with pytest.raises(ValueError, match="window"):
        d.get_batch("val", 2, 128)
    with pytest.raises(ValueError):
        d.get_batch("test", 2, 4)
