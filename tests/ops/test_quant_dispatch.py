"""snip_ops.quantize dispatch, checked on the CPU: which specs the kernels cover, the reference
fallback (identical results by construction), and the native ops' schemas, argument checks and
Meta (shape) functions, which need the extension but no GPU."""

from importlib import import_module

import pytest
import torch

from snip_ops import _ext, reference
from snip_ops.formats import E2M1, E3M2, E4M3, E5M2, RECIPES, QuantSpec, Rounding, ScaleKind, exmy
from snip_ops.scale_layout import blackwell_shape, hopper_shape

qmod = import_module("snip_ops.quantize")  # the module; snip_ops.quantize is the function
needs_op = pytest.mark.skipif(
    "quantize" not in _ext.kernels(),
    reason="snip_ops._C absent, or built before snip_C::quantize existed (rebuild it)",
)


def _same(a, b):
    """Same dtype, shape and bits (None matches None)."""
    if a is None or b is None:
        return a is None and b is None
    flat = lambda t: t.contiguous().reshape(-1).view(torch.uint8)  # noqa: E731
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(flat(a), flat(b))


def _same_q(a, b):
    assert a.shape == b.shape and a.spec == b.spec
    assert _same(a.codes, b.codes) and _same(a.scales, b.scales) and _same(a.tensor_scale, b.tensor_scale)


# ---- which specs have kernels ----


def test_every_recipe_operand_has_a_kernel():
    for name, r in RECIPES.items():
        for spec in (r.act, r.weight, r.grad):
            if spec is not None:
                assert qmod.kernel_supports(spec), (name, spec.describe())
                assert qmod.kernel_supports(spec.with_rounding(Rounding.SR))


@pytest.mark.parametrize(
    "spec",
    [
        QuantSpec(E4M3, (1, 128), rounding=Rounding.TRUNC),
        QuantSpec(E3M2, (1, 32), ScaleKind.E8M0),
        QuantSpec(exmy(8, 3), (1, 1), ScaleKind.NONE),
        QuantSpec(E4M3, (1, 0)),
        QuantSpec(E4M3, (0, 0)),
        QuantSpec(E4M3, (1, 64)),
        QuantSpec(E4M3, (32, 32)),
        QuantSpec(E2M1, (16, 32), ScaleKind.NVFP4),
    ],
    ids=lambda s: s.describe(),
)
def test_specs_without_kernel(spec):
    assert not qmod.kernel_supports(spec)
    x = torch.randn(5, 70)
    _same_q(qmod.quantize(x, spec), reference.quantize(x, spec))


def test_int64_carries_the_same_bits():
    for v in (0, 1, 2**63 - 1, 2**63, 2**64 - 1, 12345678901234567):
        assert qmod._int64(v) & (2**64 - 1) == v and -(2**63) <= qmod._int64(v) < 2**63


# ---- CPU tensors: the reference's results (from the op's CPU implementation where it is built) ----

SPECS = [
    QuantSpec(E4M3, (1, 128)),
    QuantSpec(E5M2, (1, 128), ScaleKind.POW2, Rounding.SR),
    QuantSpec(E4M3, (128, 128), rounding=Rounding.SR),
    QuantSpec(E4M3, (1, 32), ScaleKind.E8M0),
    QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, Rounding.SR),
    QuantSpec(E2M1, (16, 16), ScaleKind.NVFP4),
    QuantSpec(E2M1, (1, 32), ScaleKind.E8M0, Rounding.SR),
    QuantSpec(E2M1, (1, 128), ScaleKind.FP32, Rounding.SR),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.describe())
def test_cpu_dispatch_is_the_reference(spec):
    x = torch.randn(37, 150, dtype=torch.bfloat16)
    for transpose in (False, True):
        got = qmod.quantize(x, spec, seed=3, offset=9, transpose=transpose)
        _same_q(got, reference.quantize(x, spec, seed=3, offset=9, transpose=transpose))


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.describe())
def test_rowcol_is_row_and_transposed_quantization(spec):
    x = torch.randn(40, 130)
    row, col = qmod.quantize_rowcol(x, spec, seed=5, offset=1, offset_t=6)
    _same_q(row, reference.quantize(x, spec, seed=5, offset=1))
    _same_q(col, reference.quantize(x, spec, seed=5, offset=6, transpose=True))
    row_only, none = qmod.quantize_rowcol(x, spec, seed=5, offset=1, colwise=False)
    assert none is None
    _same_q(row_only, row)
    none, col_same = qmod.quantize_rowcol(x, spec, seed=5, offset=1, rowwise=False)  # offset_t defaults to offset
    assert none is None
    _same_q(col_same, reference.quantize(x, spec, seed=5, offset=1, transpose=True))


def test_rowcol_needs_an_output():
    with pytest.raises(ValueError, match="rowwise and/or colwise"):
        qmod.quantize_rowcol(torch.randn(4, 4), SPECS[0], rowwise=False, colwise=False)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.describe())
def test_cpu_dequantize_is_the_reference(spec):
    q = reference.quantize(torch.randn(33, 70) * 5, spec, seed=1)
    ref = reference.dequantize(q)
    assert torch.equal(qmod.dequantize(q), ref)
    assert torch.equal(qmod.dequantize(q, torch.bfloat16), ref.to(torch.bfloat16))
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        qmod.dequantize(q, torch.float16)


# ---- the native ops without a GPU: schemas, checks, shapes ----


@needs_op
def test_schemas():
    q = str(torch.ops.snip_C.quantize.default._schema)
    assert q == (
        "snip_C::quantize(Tensor x, str spec, bool rowwise=True, bool colwise=False, int seed=0, int offset=0, "
        "int offset_t=0, Tensor? tensor_amax=None, str scale_layout=\"plain\", int pad=1, int hadamard_signs=-1) -> "
        "(Tensor codes, Tensor scales, Tensor codes_t, Tensor scales_t, Tensor tensor_scale)"
    )
    d = str(torch.ops.snip_C.dequantize.default._schema)
    assert d == (
        "snip_C::dequantize(Tensor codes, Tensor scales, Tensor? tensor_scale, str spec, int cols, "
        "ScalarType dtype) -> Tensor"
    )


def _meta(shape, spec, **kw):
    x = torch.empty(shape, dtype=torch.bfloat16, device="meta")
    args = dict(rowwise=True, colwise=True, seed=0, offset=0, offset_t=0, tensor_amax=None, scale_layout="plain", pad=1,
                hadamard_signs=-1)
    args.update(kw)
    return torch.ops.snip_C.quantize(x, spec.describe(), *args.values())


META_SPECS = SPECS + [QuantSpec(E4M3, (1, 16), ScaleKind.POW2), QuantSpec(E5M2, (128, 128), ScaleKind.E8M0)]


@needs_op
@pytest.mark.parametrize("spec", META_SPECS, ids=lambda s: s.describe())
@pytest.mark.parametrize("shape", [(1, 1), (7, 129), (300, 1000), (0, 5), (4, 0), (128, 256)], ids=str)
def test_meta_shapes_match_the_reference(spec, shape):
    codes, scales, codes_t, scales_t, ts = _meta(shape, spec)
    x = torch.randn(shape)
    for (c, s), ref in (((codes, scales), reference.quantize(x, spec)),
                        ((codes_t, scales_t), reference.quantize(x, spec, transpose=True))):
        assert c.shape == ref.codes.shape and c.dtype == ref.codes.dtype
        assert s.shape == ref.scales.shape and s.dtype == ref.scales.dtype
    if spec.scale == ScaleKind.NVFP4:
        assert ts.shape == () and ts.dtype == torch.float32
    else:
        assert ts.numel() == 0
    codes, scales, codes_t, scales_t, _ = _meta(shape, spec, colwise=False)
    assert codes_t.numel() == 0 and scales_t.numel() == 0 and codes_t.dtype == codes.dtype


@needs_op
@pytest.mark.parametrize("shape", [(1, 1), (37, 129), (0, 5), (32, 0)], ids=str)
def test_meta_shapes_under_the_hadamard_transform(shape):
    """The column output of T x: x's rows padded to whole groups of 16."""
    from snip_ops.hadamard import padded_tokens, random_hadamard

    spec = QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, Rounding.SR)
    codes, scales, codes_t, scales_t, ts = _meta(shape, spec, rowwise=False, hadamard_signs=5)
    ref = reference.quantize(random_hadamard(torch.randn(shape), torch.ones(16)), spec, transpose=True)
    assert codes.numel() == 0 and codes_t.shape == ref.codes.shape and scales_t.shape == ref.scales.shape
    assert ref.shape == (shape[1], padded_tokens(shape[0])) and ts.shape == ()


@needs_op
@pytest.mark.parametrize("pad", [1, 16, 32, 128])
def test_meta_padding_and_scale_layouts(pad):
    rows, cols = 300, 1000
    up = lambda v: -(-v // pad) * pad  # noqa: E731
    spec = QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, Rounding.SR)
    codes, scales, codes_t, scales_t, _ = _meta((rows, cols), spec, scale_layout="blackwell", pad=pad)
    assert codes.shape == (rows, -(-up(cols) // 2)) and codes_t.shape == (cols, -(-up(rows) // 2))
    assert scales.shape == blackwell_shape(rows, -(-up(cols) // 16)) and scales.dtype == torch.float8_e4m3fn
    assert scales_t.shape == blackwell_shape(cols, -(-up(rows) // 16))
    spec = QuantSpec(E4M3, (128, 128))
    codes, scales, codes_t, scales_t, _ = _meta((rows, cols), spec, pad=pad)
    assert codes.shape == (rows, up(cols)) and scales.shape == (3, -(-up(cols) // 128))
    assert codes_t.shape == (cols, up(rows)) and scales_t.shape == (8, -(-up(rows) // 128))
    _, scales, _, scales_t, _ = _meta((rows, cols), spec, scale_layout="hopper", pad=pad)
    assert scales.shape == hopper_shape(3, -(-up(cols) // 128)) and scales.dtype == torch.float32
    assert scales_t.shape == hopper_shape(8, -(-up(rows) // 128))
    spec = QuantSpec(E4M3, (1, 128), ScaleKind.POW2)
    _, scales, _, scales_t, _ = _meta((rows, cols), spec, scale_layout="hopper", pad=pad)
    assert scales.shape == hopper_shape(rows, -(-up(cols) // 128))
    assert scales_t.shape == hopper_shape(cols, -(-up(rows) // 128))


@needs_op
def test_traces_with_symbolic_shapes():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        return torch.ops.snip_C.quantize(x, "e2m1/1x16/nvfp4/sr", True, True, 1, 2, 3, None, "plain", 1)

    gm = make_fx(f, tracing_mode="symbolic")(torch.empty(6, 300, dtype=torch.bfloat16))
    node = next(n for n in gm.graph.nodes if n.op == "call_function" and "quantize" in str(n.target))
    codes, scales, codes_t, scales_t, ts = node.meta["val"]
    assert all(isinstance(d, torch.SymInt) for d in (*codes.shape, *scales.shape, *codes_t.shape, *scales_t.shape))
    assert codes.dtype == torch.uint8 and scales.dtype == torch.float8_e4m3fn and ts.shape == ()


@needs_op
def test_dequantize_meta():
    codes = torch.empty(7, 65, dtype=torch.uint8, device="meta")
    scales = torch.empty(7, 9, dtype=torch.float8_e4m3fn, device="meta")
    ts = torch.empty((), dtype=torch.float32, device="meta")
    out = torch.ops.snip_C.dequantize(codes, scales, ts, "e2m1/1x16/nvfp4/rne", 129, torch.bfloat16)
    assert out.shape == (7, 129) and out.dtype == torch.bfloat16


X = torch.zeros(4, 256, dtype=torch.bfloat16)


@needs_op
@pytest.mark.parametrize(
    "args, match",
    [
        ((X.double(), "e4m3/1x128/fp32/rne"), "bfloat16, float16 or float32"),
        ((X[None], "e4m3/1x128/fp32/rne"), "2-D"),
        ((X.t(), "e4m3/1x128/fp32/rne"), "unit stride"),
        ((X, "e4m3/1x64/fp32/rne"), "no kernel for block 1x64"),
        ((X, "e3m2/1x32/e8m0/rne"), "no kernel for element"),
        ((X, "e4m3/1x128/none/rne"), "no kernel for scale"),
        ((X, "e4m3/1x128/fp32/trunc"), "no kernel for rounding"),
        ((X, "e4m3/1x16/nvfp4/rne"), "e2m1 elements only"),
        ((X, "e4m3-1x128"), "is not"),
        ((X, "e4m3/1x128/fp32/rne", False, False), "rowwise and/or colwise"),
        ((X, "e4m3/1x128/fp32/rne", True, False, 0, 0, 0, None, "plain", 0), "pad must be >= 1"),
        ((X, "e4m3/1x32/fp32/rne", True, False, 0, 0, 0, None, "blackwell"), "blackwell scale layout needs 1-byte"),
        ((X, "e4m3/1x128/e8m0/rne", True, False, 0, 0, 0, None, "blackwell"), "blackwell scale layout needs"),
        ((X, "e4m3/1x128/e8m0/rne", True, False, 0, 0, 0, None, "hopper"), "hopper scale layout needs fp32 or pow2"),
        ((X, "e4m3/1x32/fp32/rne", True, False, 0, 0, 0, None, "hopper"), "on 128-element blocks"),
        ((X, "e4m3/1x128/fp32/rne", True, False, 0, 0, 0, None, "row-major"), "plain, blackwell or hopper"),
        ((X, "e4m3/1x32/e8m0/rne", True, False, 0, 0, 0, torch.ones(())), "only used by nvfp4"),
        ((X, "e2m1/1x16/nvfp4/rne", True, False, 0, 0, 0, torch.ones(2)), "one-element floating"),
    ],
)
def test_quantize_argument_errors(args, match):
    # Each bad argument is reported for what it is (the CPU implementation's results:
    # tests/ops/test_quantize_cpu_op.py).
    with pytest.raises(RuntimeError, match=match):
        torch.ops.snip_C.quantize(*args)


@needs_op
def test_dequantize_argument_errors():
    codes = torch.zeros(4, 64, dtype=torch.uint8)
    sc = torch.ones(4, 8, dtype=torch.float8_e4m3fn)
    with pytest.raises(RuntimeError, match="needs its tensor_scale"):
        torch.ops.snip_C.dequantize(codes, sc, None, "e2m1/1x16/nvfp4/rne", 128, torch.float32)
    with pytest.raises(RuntimeError, match="bytes per row"):
        torch.ops.snip_C.dequantize(codes, sc, torch.ones(()), "e2m1/1x16/nvfp4/rne", 130, torch.float32)
    with pytest.raises(RuntimeError, match="do not cover"):
        torch.ops.snip_C.dequantize(codes, sc[:, :4], torch.ones(()), "e2m1/1x16/nvfp4/rne", 128, torch.float32)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        torch.ops.snip_C.dequantize(codes, sc, torch.ones(()), "e2m1/1x16/nvfp4/rne", 128, torch.float16)
