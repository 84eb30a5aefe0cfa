"""The native quantizer with nvfp4_train's random Hadamard transform fused in (snip_C::quantize with
hadamard_signs: the column output is (T x)^T) against the reference -- `random_hadamard`, then the
reference quantization of T x transposed -- bit for bit: the CUDA kernels from their own source on the
host shim (tests/cuda_host.py: the transform inside the tile kernel's column pass and the NVFP4 amax
pass), and the op's CPU implementation."""

import pytest
import torch

import cuda_host
from quant_cases import OUTPUTS, assert_same, expected, rand
from snip_ops import _ext
from snip_ops.formats import E2M1, E4M3, E5M2, QuantSpec, Rounding, ScaleKind, recipe
from snip_ops.hadamard import padded_tokens, random_hadamard, rht_signs, sign_mask
from snip_ops.quantize import quantize_hadamard_t
from snip_ops.reference import quantize as reference_quantize

pytestmark = pytest.mark.usefixtures("one_thread")

# The fused transform covers FP4 elements; other elements are refused by the op (quantize_hadamard_t
# transforms first for them).
SPECS = [recipe("nvfp4_train").act, recipe("nvfp4_train").grad, QuantSpec(E2M1, (1, 16), ScaleKind.FP32, Rounding.SR),
         QuantSpec(E2M1, (1, 16), ScaleKind.POW2), QuantSpec(E2M1, (1, 16), ScaleKind.E8M0, Rounding.SR)]
UNFUSED_SPECS = [QuantSpec(E4M3, (1, 16), ScaleKind.FP32, Rounding.SR), QuantSpec(E5M2, (1, 16), ScaleKind.POW2)]
# M: one token, a partial group, whole groups, several tiles with a partial last group; K: odd (scalar
# loads, per-element Philox), vector-friendly, past a tile.
SHAPES = [(1, 1), (5, 16), (37, 24), (130, 257), (300, 40)]
SIGNS = rht_signs(3, 17)


def _want(x, spec, seed, offset, **kw):
    return expected(random_hadamard(x, SIGNS), spec, rowwise=False, colwise=True, seed=seed, offset_t=offset, **kw)


def _check(got, x, spec, seed=5, offset=9, **kw):
    want = _want(x, spec, seed, offset, **kw)
    for name, g, w in zip(OUTPUTS, got, want):
        assert_same(g, w, f"{spec.describe()} {tuple(x.shape)} {x.dtype} {kw}: {name}")


def _shim(x, spec, seed=5, offset=9, **kw):
    return cuda_host.quantize(x, spec, rowwise=False, colwise=True, seed=seed, offset_t=offset,
                              hadamard_signs=sign_mask(SIGNS), **kw)


def _cpu_op(x, spec, seed=5, offset=9, tensor_amax=None, scale_layout="plain", pad=1):
    return torch.ops.snip_C.quantize(x, spec.describe(), False, True, seed, 0, offset, tensor_amax, scale_layout, pad,
                                     sign_mask(SIGNS))


needs_cpu_op = pytest.mark.skipif(not _ext.kernel_available("quantize", "cpu"),
                                  reason="the extension's CPU quantizer is not built")


@pytest.fixture(scope="module")
def shim():
    cuda_host.load()


def test_sign_mask():
    assert sign_mask(torch.ones(16)) == 0 and sign_mask(-torch.ones(16)) == 0xFFFF
    assert sign_mask(torch.tensor([1.0, -1.0] * 8)) == 0xAAAA


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.describe())
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_kernels_on_the_host_shim(shim, spec, shape):
    x = rand(shape, seed=shape[0])
    _check(_shim(x, spec), x, spec)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_kernels_input_dtypes_strides_padding_and_layouts(shim, dtype):
    spec = recipe("nvfp4_train").grad
    x = rand((70, 48), dtype=dtype, seed=1)
    _check(_shim(x, spec), x, spec)
    strided = rand((70, 64), dtype=dtype, seed=2)[:, 3:51]  # row stride 64, misaligned start
    _check(_shim(strided, spec), strided, spec)
    _check(_shim(x, spec, pad=32), x, spec, pad=32)
    _check(_shim(x, spec, scale_layout="blackwell"), x, spec, scale_layout="blackwell")
    _check(_shim(x, spec, tensor_amax=torch.tensor(100.0)), x, spec, tensor_amax=torch.tensor(100.0))


@pytest.mark.parametrize("spec", UNFUSED_SPECS, ids=lambda s: s.describe())
def test_kernels_refuse_other_elements(shim, spec):
    with pytest.raises(cuda_host.LaunchError):
        _shim(rand((37, 24), seed=1), spec)


def test_kernels_non_finite_input_poisons_its_groups_blocks(shim):
    spec = recipe("nvfp4_train").act
    x = rand((40, 24), seed=3)
    x[5, 7] = float("nan")  # T mixes it into every token of its group: that group's blocks are NaN
    got = _shim(x, spec, tensor_amax=torch.tensor(8.0))
    _check(got, x, spec, tensor_amax=torch.tensor(8.0))
    scales_t = got[3].float()
    assert torch.isnan(scales_t[7, 0]) and not torch.isnan(scales_t[6, 0]) and not torch.isnan(scales_t[7, 1])


@needs_cpu_op
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.describe())
@pytest.mark.parametrize("shape", SHAPES + [(0, 8), (3, 0)], ids=str)
def test_cpu_op(spec, shape):
    x = rand(shape, seed=shape[0])
    _check(_cpu_op(x, spec), x, spec)


@needs_cpu_op
def test_cpu_op_padding_layouts_and_dtypes():
    spec = recipe("nvfp4_train").grad
    for dtype in (torch.float32, torch.float16):
        x = rand((70, 48), dtype=dtype, seed=4)
        _check(_cpu_op(x, spec, pad=32, scale_layout="blackwell"), x, spec, pad=32, scale_layout="blackwell")


@needs_cpu_op
def test_cpu_op_refuses_what_the_transform_does_not_cover():
    x = rand((32, 16))
    with pytest.raises(RuntimeError, match="column output only"):
        torch.ops.snip_C.quantize(x, recipe("nvfp4_train").act.describe(), True, True, 0, 0, 0, None, "plain", 1, 5)
    with pytest.raises(RuntimeError, match="1x16 blocks"):
        torch.ops.snip_C.quantize(x, "e2m1/1x32/e8m0/rne", False, True, 0, 0, 0, None, "plain", 1, 5)
    with pytest.raises(RuntimeError, match="e2m1 elements only"):
        torch.ops.snip_C.quantize(x, "e4m3/1x16/fp32/sr", False, True, 0, 0, 0, None, "plain", 1, 5)
    with pytest.raises(RuntimeError, match="16-bit sign mask"):
        torch.ops.snip_C.quantize(x, recipe("nvfp4_train").act.describe(), False, True, 0, 0, 0, None, "plain", 1,
                                  1 << 16)


@pytest.mark.parametrize("spec", [recipe("nvfp4_train").grad, QuantSpec(E4M3, (1, 128))] + UNFUSED_SPECS,
                         ids=lambda s: s.describe())
def test_quantize_hadamard_t_is_the_reference(spec):
    """Fused where the native quantizer covers the spec (FP4, 1x16 blocks), composed otherwise: the same
    QTensor as the reference quantization of T x transposed, shape (K, padded tokens)."""
    x = rand((37, 24), seed=6)
    got = quantize_hadamard_t(x, spec, SIGNS, seed=2, offset=3)
    want = reference_quantize(random_hadamard(x, SIGNS), spec, seed=2, offset=3, transpose=True)
    assert got.shape == want.shape == (24, padded_tokens(37))
    assert_same(got.codes, want.codes, "codes")
    assert_same(got.scales, want.scales, "scales")
    if want.tensor_scale is not None:
        assert_same(got.tensor_scale, want.tensor_scale, "tensor scale")


@pytest.mark.gpu
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.describe())
@pytest.mark.parametrize("shape", SHAPES + [(4100, 1000)], ids=str)
def test_cuda_op(spec, shape):
    """The same on a GPU: the real kernels, compiled for it, against the reference computed on the CPU.
    Skipped only where no GPU or no build for its arch exists: the op is called directly, so a kernel
    that failed its self-check (snip_ops.self_check) is tested, and fails here, rather than skipped."""
    if not _ext.kernel_compiled("quantize", "cuda"):
        pytest.skip(f"quantize not compiled for this GPU (or no GPU): {_ext.build_info()}")
    x = rand(shape, seed=shape[0])
    got = torch.ops.snip_C.quantize(x.cuda(), spec.describe(), False, True, 5, 0, 9, None, "plain", 1, sign_mask(SIGNS))
    _check([t.cpu() for t in got], x, spec)
