"""snip_C::e2m1_as_e4m3 (packed E2M1 codes -> E4M3 bytes of the same values, zero-padded: the FP4
operands of the FP8 blockwise GEMMs) against an oracle built from `cast.decode` and torch's own
float8_e4m3fn cast, bit for bit: the CUDA kernel from its own source on the host shim
(tests/cuda_host.py), the op's CPU implementation, its Meta function and argument errors, and the GEMM
operand preparation that uses it."""

import pytest
import torch

import cuda_host
from native_build import skip_or_fail
from snip_ops import _ext, reference
from snip_ops import gemm_kernels as gk
from snip_ops.cast import decode
from snip_ops.formats import E2M1, QuantSpec

pytestmark = pytest.mark.usefixtures("one_thread")


def oracle(codes: torch.Tensor, cols: int, rows_out: int, cols_out: int) -> torch.Tensor:
    """[rows_out, cols_out] uint8: torch's E4M3 byte of each decoded code, zeros past the codes."""
    nibbles = torch.stack((codes.long() & 0xF, codes.long() >> 4), dim=2).reshape(codes.shape[0], 2 * codes.shape[1])
    nibbles = nibbles[:, :cols]
    out = torch.zeros(rows_out, cols_out, dtype=torch.uint8)
    out[: codes.shape[0], :cols] = decode(nibbles, E2M1).to(torch.float8_e4m3fn).view(torch.uint8)
    return out


def packed(rows: int, width: int, ld: int | None = None, phase: int = 0, seed: int = 0) -> torch.Tensor:
    """[rows, width] random bytes (every byte value among them once rows * width >= 256 or so), row
    stride `ld`, starting `phase` bytes into its buffer."""
    ld = width if ld is None else ld
    g = torch.Generator().manual_seed(seed)
    buf = torch.randint(0, 256, (phase + rows * ld,), generator=g, dtype=torch.uint8)
    buf[phase: phase + 256] = torch.arange(256, dtype=torch.uint8)[: max(0, min(256, buf.numel() - phase))]
    return buf[phase:].as_strided((rows, width), (ld, 1))


# (rows, cols, ld, phase, rows_out, cols_out): every byte, exact fit; odd cols and a tail nibble;
# padding rows and columns (cols_out not a multiple of 8); a misaligned input (byte loads); rows wider
# than a CTA's 256 columns and more rows than its 8; an empty input with padding only.
CASES = [(16, 32, None, 0, 16, 32), (16, 31, None, 0, 21, 45), (9, 29, 17, 3, 12, 40), (37, 600, 304, 0, 40, 616),
         (3, 8, 4, 1, 3, 8), (1, 1, None, 0, 1, 1), (0, 0, None, 0, 5, 16)]


def _codes(rows, cols, ld, phase):
    width = (cols + 1) // 2
    if rows == 0:
        return torch.empty(0, max(width, 1), dtype=torch.uint8)
    return packed(rows, width, ld, phase, seed=rows + cols)


# The shim launches the kernel on its buffers; the empty input is the CPU op's case below.
@pytest.mark.parametrize("rows, cols, ld, phase, rows_out, cols_out", [c for c in CASES if c[0] > 0])
@pytest.mark.parametrize("out_phase", [0, 3])
def test_kernel_on_the_host_shim(rows, cols, ld, phase, rows_out, cols_out, out_phase):
    codes = _codes(rows, cols, ld, phase)
    got = cuda_host.e2m1_as_e4m3(codes, cols, rows_out, cols_out, out_phase)
    assert torch.equal(got, oracle(codes, cols, rows_out, cols_out))


@pytest.fixture
def cpu_op():
    if not _ext.kernel_available("e2m1_as_e4m3", "cpu"):
        skip_or_fail(f"snip_C::e2m1_as_e4m3 has no CPU implementation in this install: {_ext.build_info()}")


@pytest.mark.parametrize("rows, cols, ld, phase, rows_out, cols_out", CASES)
def test_cpu_op(cpu_op, rows, cols, ld, phase, rows_out, cols_out):
    codes = _codes(rows, cols, ld, phase)
    got = torch.ops.snip_C.e2m1_as_e4m3(codes, cols, rows_out, cols_out)
    assert got.dtype == torch.float8_e4m3fn and got.shape == (rows_out, cols_out)
    assert torch.equal(got.view(torch.uint8), oracle(codes, cols, rows_out, cols_out))


def test_meta_and_bad_arguments(cpu_op):
    codes = packed(4, 8)
    meta = torch.ops.snip_C.e2m1_as_e4m3(codes.to("meta"), 15, 8, 32)
    assert meta.shape == (8, 32) and meta.dtype == torch.float8_e4m3fn
    bad = [((codes.view(torch.int16), 8, 4, 8), "1-byte"), ((codes.reshape(-1), 8, 4, 8), "2-D"),
           ((codes, 17, 4, 17), "elements need 9"), ((codes, 16, 3, 16), "must cover"),
           ((codes, 16, 4, 15), "must cover"), ((codes.t(), 2, 8, 8), "unit stride")]
    for args, match in bad:
        with pytest.raises(RuntimeError, match=match):
            torch.ops.snip_C.e2m1_as_e4m3(*args)


def test_gemm_operands_use_it(cpu_op):
    # prepare_sm90's FP4 operands: the op's one pass equals the table gather plus its padding copy.
    codes = packed(37, 150, seed=5)
    q = reference.QTensor(codes, torch.ones(37, 3), QuantSpec(E2M1), (37, 300))
    got = gk._fp8_codes(q, 40, 304)
    want = gk._pad_2d(gk.fp4_codes_as_e4m3(q), 40, 304)
    assert got.dtype == want.dtype == torch.float8_e4m3fn
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("rows, cols, ld, phase, rows_out, cols_out", CASES + [(4096, 8192, None, 0, 4096, 8192)])
def test_cuda_op(rows, cols, ld, phase, rows_out, cols_out):
    if not _ext.kernel_compiled("e2m1_as_e4m3", "cuda"):
        pytest.skip(f"e2m1_as_e4m3 not compiled for this GPU (or no GPU): {_ext.build_info()}")
    codes = _codes(rows, cols, ld, phase)
    got = torch.ops.snip_C.e2m1_as_e4m3(codes.cuda(), cols, rows_out, cols_out)
    assert torch.equal(got.cpu().view(torch.uint8), oracle(codes, cols, rows_out, cols_out))
