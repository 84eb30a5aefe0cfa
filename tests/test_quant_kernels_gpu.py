"""CUDA quantization kernels against the PyTorch reference (run on the CPU, the oracle): bit for bit."""

import pytest
import torch

from snip_ops import _ext
from snip_ops.formats import E4M3, QuantSpec, Rounding, ScaleKind
from snip_ops.reference import quantize

pytestmark = pytest.mark.gpu

OP = "fp8_quantize_1x128"
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
SCALES = [ScaleKind.FP32, ScaleKind.POW2]


@pytest.fixture(autouse=True)
def _needs_kernel():
    if not _ext.kernel_available(OP, "cuda"):
        pytest.skip(f"{OP} not compiled for this GPU: {_ext.build_info()}")


def kernel(x, scale_kind):
    return torch.ops.snip_C.fp8_quantize_1x128(x, scale_kind == ScaleKind.POW2)


def assert_matches_reference(x, scale_kind):
    codes, scales = kernel(x, scale_kind)
    torch.cuda.synchronize()
    ref = quantize(x.cpu(), QuantSpec(element=E4M3, block=(1, 128), scale=scale_kind, rounding=Rounding.RNE))
    M, K = x.shape
    assert codes.shape == (M, K) and codes.dtype == torch.float8_e4m3fn and codes.is_contiguous()
    assert scales.shape == (M, -(-K // 128)) and scales.dtype == torch.float32 and scales.is_contiguous()
    got_s, ref_s = scales.cpu().view(torch.int32), ref.scales.view(torch.int32)
    bad = (got_s != ref_s).nonzero()
    assert bad.numel() == 0, (
        f"{len(bad)} scales differ, first at {bad[0].tolist()}: "
        f"kernel {got_s[tuple(bad[0])].item():#010x} reference {ref_s[tuple(bad[0])].item():#010x}"
    )
    got_c, ref_c = codes.cpu().view(torch.uint8), ref.codes.view(torch.uint8)
    bad = (got_c != ref_c).nonzero()
    assert bad.numel() == 0, (
        f"{len(bad)} codes differ, first at {bad[0].tolist()} (x={x[tuple(bad[0])].item()!r}): "
        f"kernel {got_c[tuple(bad[0])].item():#04x} reference {ref_c[tuple(bad[0])].item():#04x}"
    )


def rand(shape, dtype, seed=0):
    """Normal data with a random magnitude per row, so blocks use many exponent ranges."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape, generator=g, device="cuda")
    rows = torch.randint(-8, 9, (shape[0], 1), generator=g, device="cuda").float()
    return (x * torch.exp2(rows)).to(dtype)


# Odd K exercises the scalar path and partial last blocks; K % 16 == 0 the 16-byte vector path.
SHAPES = [(1, 1), (1, 127), (2, 128), (3, 130), (7, 129), (4, 24), (5, 16), (9, 1040), (33, 1000), (64, 4096), (257, 384)]


@pytest.mark.parametrize("scale_kind", SCALES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_random(shape, dtype, scale_kind):
    assert_matches_reference(rand(shape, dtype, seed=shape[0] * 7919 + shape[1]), scale_kind)


@pytest.mark.parametrize("scale_kind", SCALES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_large(dtype, scale_kind):
    assert_matches_reference(rand((4096, 4096), dtype, seed=1), scale_kind)


@pytest.mark.parametrize("scale_kind", SCALES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_zeros_and_signed_zeros(dtype, scale_kind):
    x = torch.zeros(3, 300, dtype=dtype, device="cuda")
    x[1, ::2] = -0.0  # codes 0x80, scale 1
    x[2, 200:] = rand((1, 100), dtype)[0]  # zero block next to a non-zero one in the same row
    x[2, 5] = -0.0
    assert_matches_reference(x, scale_kind)
    codes, scales = kernel(x, scale_kind)
    assert (scales[0] == 1).all() and (codes.view(torch.uint8)[1, ::2] == 0x80).all()


@pytest.mark.parametrize("scale_kind", SCALES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("magnitude", [1e30, 1e4, 1e-3, 1e-6, 1e-30, 1e-40, 1e-44], ids=str)
def test_magnitudes(magnitude, dtype, scale_kind):
    # Out-of-range magnitudes become Inf (non-finite block) or zeros/subnormals in the input dtype;
    # 1e-40 and 1e-44 are float32/bfloat16 subnormals, the latter small enough that amax / 448
    # underflows to 0 in float32.
    x = (rand((6, 256), torch.float32, seed=3) * magnitude).to(dtype)
    assert_matches_reference(x, scale_kind)


@pytest.mark.parametrize("scale_kind", SCALES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_input_subnormals(dtype, scale_kind):
    tiny = torch.finfo(dtype).smallest_normal
    x = rand((4, 512), torch.float32, seed=4) * tiny  # mostly subnormal in the input dtype
    x[:, 128:256] *= 1e6 if dtype != torch.float16 else 100  # a normal block beside them
    assert_matches_reference(x.to(dtype), scale_kind)


@pytest.mark.parametrize("scale_kind", SCALES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=str)
def test_non_finite_blocks(bad, dtype, scale_kind):
    x = rand((4, 300), dtype, seed=5)
    x[0, 3] = bad  # first block of row 0
    x[2, 299] = bad  # the partial last block of row 2
    x[3, 130] = bad
    assert_matches_reference(x, scale_kind)
    codes, scales = kernel(x, scale_kind)
    for r, b in [(0, 0), (2, 2), (3, 1)]:
        assert scales[r, b].view(torch.int32).item() == 0x7FC00000
        assert (codes.view(torch.uint8)[r, b * 128 : (b + 1) * 128] == 0).all()
    assert torch.isfinite(scales[1]).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_to_nearest_even_ties(dtype):
    # A block whose amax is 448 has scale exactly 1, so the midpoints between neighbouring E4M3
    # values (subnormals included) are ties after the division: each must go to the even code.
    vals = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (vals[:-1] + vals[1:]) / 2  # 126 ties, one row = one block with 448 in front
    x = torch.stack([torch.cat([torch.tensor([448.0]), mids]), -torch.cat([torch.tensor([448.0]), mids])])
    x = x.to(dtype)  # bfloat16 keeps only the ties it can represent exactly
    assert_matches_reference(x.cuda(), ScaleKind.FP32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_unaligned_contiguous_view(dtype):
    # A contiguous view at an odd storage offset cannot use 16-byte loads: the scalar path runs.
    base = rand((1, 8 * 256 + 1), dtype, seed=6)[0]
    x = base[1:].view(8, 256)
    assert x.is_contiguous() and x.data_ptr() % 16 != 0
    assert_matches_reference(x, ScaleKind.FP32)


@pytest.mark.parametrize("shape", [(0, 0), (0, 256), (5, 0)])
def test_empty(shape):
    codes, scales = kernel(torch.empty(shape, dtype=torch.bfloat16, device="cuda"), ScaleKind.FP32)
    assert codes.shape == shape and scales.shape == (shape[0], -(-shape[1] // 128))


def test_runs_on_current_stream():
    x = rand((128, 1024), torch.bfloat16, seed=7)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())  # x was written on the default stream
    with torch.cuda.stream(s):
        codes, scales = kernel(x, ScaleKind.FP32)
    s.synchronize()
    ref = quantize(x.cpu(), QuantSpec(element=E4M3, block=(1, 128), scale=ScaleKind.FP32, rounding=Rounding.RNE))
    assert torch.equal(codes.cpu().view(torch.uint8), ref.codes.view(torch.uint8))


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: torch.zeros(4, 256, dtype=torch.float64, device="cuda"), "bfloat16, float16 or float32"),
        (lambda: torch.zeros(4, 256, dtype=torch.int8, device="cuda"), "bfloat16, float16 or float32"),
        (lambda: torch.zeros(256, 4, dtype=torch.bfloat16, device="cuda").t(), "contiguous"),
        (lambda: torch.zeros(4, 512, dtype=torch.bfloat16, device="cuda")[:, ::2], "contiguous"),
        (lambda: torch.zeros(2, 4, 128, dtype=torch.bfloat16, device="cuda"), "2-D"),
        (lambda: torch.zeros(4, 256, dtype=torch.bfloat16), "CUDA tensor"),
    ],
)
def test_argument_errors(make, match):
    with pytest.raises(RuntimeError, match=match):
        torch.ops.snip_C.fp8_quantize_1x128(make(), False)


def test_bandwidth_sanity():
    # Not a benchmark: catches a gross regression (e.g. the scalar path on aligned input).
    # H100/H200/B200 all have >= 2 TB/s; the kernel should reach well over half of that.
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        kernel(x, ScaleKind.FP32)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        kernel(x, ScaleKind.FP32)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / 20
    moved = x.numel() * (2 + 1) + x.numel() // 128 * 4  # bf16 in, e4m3 out, fp32 scales
    assert moved / seconds > 1.0e12, f"{moved / seconds / 1e9:.0f} GB/s"
