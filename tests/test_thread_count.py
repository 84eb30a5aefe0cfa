"""The library's bit-exact code gives the same bits at any intra-op thread count, which is why CI runs
the tests that check only such code once, and again at another thread count only the tests marked
`threads` (tests/conftest.py, tests/thread_free.py: float reductions and GEMMs, whose summation order
BLAS and torch's parallel reductions choose per thread count).

Each case runs at 1, 2 and 3 threads on tensors large enough that torch splits its loops among the
threads (over 32768 elements per op, torch's grain size) and the results compare bit for bit: the
quantizers (the PyTorch reference and the compiled CPU op, every recipe's specs, SR, transposed),
dequantization, casts, the Philox bits and the AdamW step (reference and op).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

from native_build import skip_or_fail

from snip_ops import _ext, reference
from snip_ops.cast import decode, encode, round_to_format
from snip_ops.formats import E2M1, E4M3, E5M2, RECIPES, Rounding
from snip_ops.optim import adamw_scalars, adamw_step_reference
from snip_ops.philox import element_bits
from snip_ops.quantize import dequantize, quantize

THREADS = (1, 2, 3)
ROWS, COLS = 384, 1024  # 393,216 elements: a dozen grains


@contextlib.contextmanager
def _threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous()
    if t.dtype.is_floating_point and t.element_size() in (2, 4, 8):
        return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]).clone()
    return t.view(torch.uint8).clone() if t.element_size() == 1 else t.clone()


def _same_at_every_thread_count(compute) -> None:
    """`compute()` -> a list of tensors; equal bit for bit at every count of THREADS."""
    results = []
    for n in THREADS:
        with _threads(n):
            results.append([_bits(t) for t in compute()])
    for n, got in zip(THREADS[1:], results[1:]):
        assert len(got) == len(results[0])
        for i, (a, b) in enumerate(zip(got, results[0])):
            assert a.shape == b.shape and torch.equal(a, b), f"result {i} at {n} threads differs from 1 thread"


def _data(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(ROWS, COLS, generator=g) * torch.logspace(-6, 6, COLS)
    x[3] = 0.0
    return x


SPECS = sorted({s for r in RECIPES.values() for s in (r.act, r.weight, r.grad) if s is not None}, key=str)


@pytest.mark.parametrize("spec", SPECS, ids=str)
@pytest.mark.parametrize("implementation", ["reference", "cpu_op"])
def test_quantize_and_dequantize(spec, implementation):
    if implementation == "cpu_op" and not _ext.kernel_available("quantize", "cpu"):
        skip_or_fail("no compiled CPU quantizer (pure-Python install)")
    quant = reference.quantize if implementation == "reference" else quantize
    dequant = reference.dequantize if implementation == "reference" else dequantize
    x = _data()

    def compute():
        out = []
        for transpose in (False, True):
            q = quant(x, spec, seed=7, offset=3, transpose=transpose)
            out += [q.codes, q.scales, dequant(q)]
        return out

    _same_at_every_thread_count(compute)


def test_casts_and_philox_bits():
    x = _data(1)

    def compute():
        out = [element_bits(ROWS, COLS, seed=5, offset=9)]
        for fmt in (E4M3, E5M2, E2M1):
            y = round_to_format(x, fmt, Rounding.RNE)
            out += [y, encode(y, fmt), decode(encode(y, fmt), fmt)]
        return out

    _same_at_every_thread_count(compute)


@pytest.mark.parametrize("bf16_sr", [False, True])
@pytest.mark.parametrize("implementation", ["reference", "cpu_op"])
def test_adamw_step(implementation, bf16_sr):
    if implementation == "cpu_op" and not _ext.kernel_available("adamw", "cpu"):
        skip_or_fail("no compiled CPU AdamW (pure-Python install)")
    dtype = torch.bfloat16 if bf16_sr else torch.float32
    s = adamw_scalars(1e-3, 0.9, 0.95, 1e-8, 0.1, 3)

    def compute():
        p = _data(2).to(dtype)
        g = (_data(3) * 1e-2).to(dtype)
        m, v = _data(4) * 1e-3, _data(5).abs() * 1e-6
        if implementation == "reference":
            adamw_step_reference([p], [g], [m], [v], [0], [0], s, 11, 13, bf16_sr)
        else:
            torch.ops.snip_C.adamw_([p], [g], [m], [v], [0], [0], *s.as_tuple(), 11, 13, bf16_sr)
        return [p, m, v]

    _same_at_every_thread_count(compute)


def test_every_thread_free_entry_names_a_test_module():
    from thread_free import THREAD_FREE

    root = Path(__file__).resolve().parents[1]
    for key, why in THREAD_FREE.items():
        path, _, name = key.partition("::")
        assert (root / path).is_file() and why, key
        assert not name or f"def {name}" in (root / path).read_text(), key
