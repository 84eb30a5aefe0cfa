"""Token data: a byte-level default corpus, custom text / token files, and a batch sampler.

Default corpus: the Python standard library's own ``*.py`` sources (present on every
machine, no download), walked in sorted order, read as bytes and capped at
``max_bytes``. Tokens are bytes 0..255.

Other sources (``TokenData.from_path``):

* ``*.npy``            -- a 1-D integer token array, memory-mapped.
* ``*.bin``            -- raw little-endian tokens, ``uint16`` by default (nanoGPT convention),
                          or ``uint8`` with ``token_dtype="uint8"``; memory-mapped.
* a directory          -- every regular file below it, sorted, read as bytes (capped).
* any other file       -- read as bytes (UTF-8 text -> byte tokens).

Train / validation split: the token stream is cut into ``block_size`` blocks and an
evenly spread ``val_fraction`` of the blocks is held out. Training windows never touch
a validation block and vice versa (windows are sampled *within* one block), so the
splits are disjoint, deterministic and follow the same distribution.
"""

from __future__ import annotations

import math
import os
import sysconfig
from pathlib import Path

import numpy as np
import torch

__all__ = ["TokenData", "stdlib_corpus_bytes", "load_corpus", "DEFAULT_MAX_BYTES"]

DEFAULT_MAX_BYTES = 8 * 1024 * 1024
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"}


def stdlib_corpus_bytes(max_bytes: int | None = DEFAULT_MAX_BYTES) -> bytes:
    """The concatenated ``*.py`` files of the stdlib, sorted by relative path, capped.

    Third-party (``site-packages``) and test directories are skipped, so the result depends
    only on the Python version.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    return _read_tree(root, max_bytes, suffix=".py", skip_dirs=_SKIP_DIRS)


def _read_tree(root: Path, max_bytes: int | None, suffix: str | None = None,
               skip_dirs: set[str] = frozenset()) -> bytes:
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skip_dirs]
        for f in filenames:
            if suffix is None or f.endswith(suffix):
                p = Path(dirpath, f)
                if p.is_file():
                    files.append(p)
    files.sort(key=lambda p: p.relative_to(root).as_posix())
    chunks, total = [], 0
    for p in files:
        if max_bytes is not None and total >= max_bytes:
            break
        try:
            b = p.read_bytes()
        except OSError:
            continue
        if not b:
            continue
        b = b if b.endswith(b"\n") else b + b"\n"
        chunks.append(b)
        total += len(b)
    data = b"".join(chunks)
    return data[:max_bytes] if max_bytes is not None else data


def load_corpus(path: str | os.PathLike | None = None, max_bytes: int | None = DEFAULT_MAX_BYTES,
                token_dtype: str | None = None) -> np.ndarray:
    """A 1-D numpy token array (possibly a read-only memmap) for ``path`` (None: stdlib)."""
    if path is None:
        return np.frombuffer(stdlib_corpus_bytes(max_bytes), dtype=np.uint8)
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"corpus not found: {p}")
    if p.is_dir():
        return np.frombuffer(_read_tree(p, max_bytes, skip_dirs={"__pycache__", ".git"}), dtype=np.uint8)
    if p.suffix == ".npy":
        arr = np.load(p, mmap_mode="r")
        if arr.ndim != 1 or arr.dtype.kind not in "ui":
            raise ValueError(f"{p}: expected a 1-D integer token array, got {arr.dtype} {arr.shape}")
        return arr
    if p.suffix == ".bin":
        dt = np.dtype(token_dtype or "uint16")
        if dt.kind != "u":
            raise ValueError(f"token_dtype must be unsigned (uint8/uint16/uint32), got {dt}")
        if p.stat().st_size % dt.itemsize:
            raise ValueError(f"{p}: size {p.stat().st_size} is not a multiple of {dt} ({dt.itemsize} bytes)")
        return np.memmap(p, dtype=dt, mode="r")
    with open(p, "rb") as f:
        data = f.read() if max_bytes is None else f.read(max_bytes)
    return np.frombuffer(data, dtype=np.uint8)


class TokenData:
    """A token stream with a deterministic block-wise train/validation split.

    ``get_batch(split, batch_size, seq_len, generator)`` returns an int64 tensor of
    ``batch_size`` random windows of ``seq_len + 1`` tokens (inputs are ``[:, :-1]``,
    targets ``[:, 1:]``); ``get_xy`` returns the pair directly.
    """

    def __init__(self, tokens: np.ndarray, val_fraction: float = 0.05, block_size: int = 65536,
                 vocab_size: int | None = None, name: str = "tokens"):
        if tokens.ndim != 1:
            raise ValueError("tokens must be 1-D")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError("val_fraction must be in (0, 1)")
        self.tokens = tokens
        self.name = name
        self.val_fraction = float(val_fraction)
        n = len(tokens)
        if n < 2:
            raise ValueError("corpus is empty")
        if vocab_size is None:
            vocab_size = 256 if tokens.dtype == np.uint8 else max(256, int(tokens.max()) + 1)
        self.vocab_size = int(vocab_size)
        # At least ceil(1/val_fraction) blocks so the held-out part is ~val_fraction.
        min_blocks = math.ceil(1.0 / self.val_fraction)
        self.block_size = int(max(1, min(block_size, n // min_blocks)))
        n_blocks = math.ceil(n / self.block_size)
        n_val = max(1, round(n_blocks * self.val_fraction))
        val_ids = {int((j + 0.5) * n_blocks / n_val) for j in range(n_val)}
        bounds = [(i * self.block_size, min(n, (i + 1) * self.block_size)) for i in range(n_blocks)]
        self._segments = {
            "train": np.array([b for i, b in enumerate(bounds) if i not in val_ids], dtype=np.int64).reshape(-1, 2),
            "val": np.array([b for i, b in enumerate(bounds) if i in val_ids], dtype=np.int64).reshape(-1, 2),
        }
        self._cache: dict[tuple[str, int], tuple[np.ndarray, np.ndarray, int]] = {}

    # -- construction -------------------------------------------------------------------
    @classmethod
    def from_path(cls, path: str | os.PathLike | None = None, max_bytes: int | None = DEFAULT_MAX_BYTES,
                  token_dtype: str | None = None, **kw) -> "TokenData":
        tokens = load_corpus(path, max_bytes=max_bytes, token_dtype=token_dtype)
        name = "python-stdlib" if path is None else str(path)
        return cls(tokens, name=name, **kw)

    @classmethod
    def from_bytes(cls, data: bytes, **kw) -> "TokenData":
        return cls(np.frombuffer(data, dtype=np.uint8), **kw)

    # -- info ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.tokens)

    def num_tokens(self, split: str) -> int:
        seg = self._segs(split)
        return int((seg[:, 1] - seg[:, 0]).sum())

    def segments(self, split: str) -> np.ndarray:
        """[n, 2] array of (start, end) token offsets that make up ``split``."""
        return self._segs(split).copy()

    def _segs(self, split: str) -> np.ndarray:
        try:
            return self._segments[split]
        except KeyError:
            raise ValueError(f"split must be 'train' or 'val', got {split!r}") from None

    def _window_index(self, split: str, window: int):
        key = (split, window)
        if key not in self._cache:
            seg = self._segs(split)
            counts = np.maximum(0, (seg[:, 1] - seg[:, 0]) - window + 1)
            cum = np.cumsum(counts)
            total = int(cum[-1]) if len(cum) else 0
            if total == 0:
                raise ValueError(
                    f"{self.name}: the {split!r} split ({self.num_tokens(split)} tokens in blocks of "
                    f"{self.block_size}) holds no window of {window} tokens; use a larger corpus or a "
                    f"shorter sequence length")
            self._cache[key] = (seg[:, 0], cum, total)
        return self._cache[key]

    # -- sampling -----------------------------------------------------------------------
    def get_batch(self, split: str, batch_size: int, seq_len: int,
                  generator: torch.Generator | None = None) -> torch.Tensor:
        """``batch_size`` random windows of ``seq_len + 1`` tokens from ``split``: int64 [B, T+1]."""
        window = seq_len + 1
        starts = self.window_starts(split, batch_size, seq_len, generator)
        out = np.stack([np.asarray(self.tokens[s:s + window]) for s in starts]).astype(np.int64)
        return torch.from_numpy(out)

    def get_xy(self, split: str, batch_size: int, seq_len: int,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.get_batch(split, batch_size, seq_len, generator)
        return w[:, :-1], w[:, 1:]

    def window_starts(self, split: str, batch_size: int, seq_len: int,
                      generator: torch.Generator | None = None) -> np.ndarray:
        """The start offsets ``get_batch`` would use with an identically seeded generator."""
        starts_of_seg, cum, total = self._window_index(split, seq_len + 1)
        r = torch.randint(total, (batch_size,), generator=generator).numpy()
        seg_idx = np.searchsorted(cum, r, side="right")
        prev = np.where(seg_idx > 0, cum[seg_idx - 1], 0)
        return starts_of_seg[seg_idx] + (r - prev)
