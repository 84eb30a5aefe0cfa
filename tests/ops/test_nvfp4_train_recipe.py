"""NVIDIA's NVFP4 training recipe (`nvfp4_train`): the random Hadamard transform on the wgrad operands,
16x16 weight blocks, SR gradients -- exact semantics, orthogonality, unbiasedness, the linear op."""

import pytest
import torch

from snip_ops import gemm, linear
from snip_ops.formats import E2M1, GemmRecipe, LinearPrecision, QuantSpec, Rounding, ScaleKind, recipe
from snip_ops.hadamard import HADAMARD_SIZE, hadamard_matrix, padded_tokens, random_hadamard, rht_signs
from snip_ops.reference import fake_quantize, quantize

U32 = 2.0**-24  # float32 unit roundoff


def _transform_fp64(t: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """blockdiag(H D, ...) @ t in float64, tokens zero-padded to whole groups."""
    m, n = t.shape
    size = signs.numel()
    tp = torch.nn.functional.pad(t.double(), (0, 0, 0, padded_tokens(m, size) - m))
    hd = hadamard_matrix(size) @ torch.diag(signs.double())
    return torch.einsum("ij,gjn->gin", hd, tp.reshape(-1, size, n)).reshape(-1, n)


def test_hadamard_matrix_is_orthonormal():
    h = hadamard_matrix(16)
    assert torch.equal(h @ h.t(), torch.eye(16, dtype=torch.float64))
    assert set(h.abs().unique().tolist()) == {0.25}


def test_butterfly_is_the_sylvester_matrix():
    """T applied to the identity (signs +1) is exactly H: the butterfly order is Sylvester's."""
    got = random_hadamard(torch.eye(16), torch.ones(16))
    assert torch.equal(got.double(), hadamard_matrix(16))


@pytest.mark.parametrize("m, n, dtype", [(16, 8, torch.float32), (37, 24, torch.bfloat16), (1, 5, torch.float16),
                                         (200, 3, torch.float32)])
def test_transform_matches_the_matrix_product(m, n, dtype):
    g = torch.Generator().manual_seed(m * n)
    t = (torch.randn(m, n, generator=g) * torch.exp2(torch.randint(-8, 9, (m, 1), generator=g).float())).to(dtype)
    signs = rht_signs(7, 11)
    got = random_hadamard(t, signs)
    assert got.dtype == torch.float32 and got.shape == (padded_tokens(m), n)
    ref = _transform_fp64(t, signs)
    # 4 butterfly stages of float32 adds: each output's error is at most gamma_4 times the sum of
    # the magnitudes of its 16 inputs, times 1/4 (exact scaling).
    tp = torch.nn.functional.pad(t.double().abs(), (0, 0, 0, padded_tokens(m) - m)).reshape(-1, 16, n)
    mag = (tp.sum(1, keepdim=True) / 4).expand(-1, 16, -1).reshape(-1, n)  # (1/4) sum |t| of each group
    assert ((got.double() - ref).abs() <= 4 * U32 / (1 - 4 * U32) * mag).all()


def test_transform_is_orthogonal_so_the_wgrad_product_is_exact():
    """With small-integer operands every float32 operation is exact: (T dy)^T (T x) == dy^T x exactly,
    padding included (37 tokens -> 48)."""
    g = torch.Generator().manual_seed(0)
    dy = torch.randint(-8, 9, (37, 12), generator=g).float()
    x = torch.randint(-8, 9, (37, 20), generator=g).float()
    signs = rht_signs(3, 9)
    tdy, tx = random_hadamard(dy, signs), random_hadamard(x, signs)
    assert torch.equal(tdy.double().t() @ tx.double(), dy.double().t() @ x.double())
    assert torch.equal(tdy.double().pow(2).sum(), dy.double().pow(2).sum())  # norm kept


def test_signs_are_random_shared_and_keyed():
    s = rht_signs(5, 1)
    assert s.dtype == torch.float32 and s.shape == (HADAMARD_SIZE,) and set(s.unique().tolist()) <= {-1.0, 1.0}
    assert torch.equal(s, rht_signs(5, 1))  # what every rank with the same seed draws
    draws = torch.stack([rht_signs(5, o) for o in range(400)])
    assert len({tuple(d.tolist()) for d in draws}) > 390
    # Each sign is +1 with probability 1/2: the mean of 400 draws is within 5 sd (sd = 1/20).
    assert (draws.mean(0).abs() < 5 / 20).all()
    assert not torch.equal(rht_signs(6, 1), s)


def test_bad_transform_arguments():
    with pytest.raises(ValueError, match="power of two"):
        rht_signs(0, 0, size=12)
    with pytest.raises(ValueError, match="2-D"):
        random_hadamard(torch.zeros(16), torch.ones(16))
    with pytest.raises(TypeError, match="float32"):
        random_hadamard(torch.zeros(16, 2, dtype=torch.int32), torch.ones(16))


def test_recipe_shape():
    r = recipe("nvfp4_train")
    assert r.act == QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, Rounding.RNE)
    assert r.weight == QuantSpec(E2M1, (16, 16), ScaleKind.NVFP4, Rounding.RNE)
    assert r.grad == QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, Rounding.SR)
    assert r.wgrad_hadamard == 16 and r.speedup == 4.0
    assert gemm.transpose_shares_quantization(r.weight)  # w and w^T share the 16x16 scales
    assert GemmRecipe.from_key(r.key()) == r
    assert GemmRecipe.from_key(recipe("nvfp4").key()) == recipe("nvfp4")
    assert str(LinearPrecision("nvfp4_train")) == "nvfp4_train"


@pytest.mark.parametrize("h", [1, 3, 24, -16])
def test_bad_hadamard_sizes_are_refused(h):
    with pytest.raises(ValueError, match="wgrad_hadamard"):
        GemmRecipe("x", QuantSpec(E2M1), QuantSpec(E2M1), QuantSpec(E2M1), 4.0, h)


def test_hadamard_needs_quantized_wgrad_operands():
    with pytest.raises(ValueError, match="quantized activations and gradients"):
        GemmRecipe("x", None, QuantSpec(E2M1), QuantSpec(E2M1), 4.0, 16)


def test_weight_blocks_are_16x16_and_shared_by_the_transpose():
    w = torch.randn(40, 72, generator=torch.Generator().manual_seed(2))
    spec = recipe("nvfp4_train").weight
    assert torch.equal(fake_quantize(w, spec).t(), fake_quantize(w, spec, transpose=True))
    # One block's scale serves 16 rows: a large element lowers the resolution of its whole 16x16
    # block and of no other (the per-tensor scale held fixed).
    w2 = w.clone()
    w2[3, 5] = 100.0
    changed = (fake_quantize(w2, spec, tensor_amax=100.0) != fake_quantize(w, spec, tensor_amax=100.0)).nonzero()
    assert changed[:, 0].max() < 16 and changed[:, 1].max() < 16


@pytest.mark.parametrize("emulate", [True, False])
@pytest.mark.parametrize("m", [37, 64])
def test_linear_runs_the_recipe_gemms(emulate, m):
    """snip_ops.linear's three GEMMs under nvfp4_train are snip_ops.gemm's, bit for bit (its wgrad
    transforms both operands with the same signs; the emulated and the native-quantizer paths agree)."""
    g = torch.Generator().manual_seed(m)
    x, w, dy = torch.randn(m, 48, generator=g), torch.randn(40, 48, generator=g), torch.randn(m, 40, generator=g)
    r = recipe("nvfp4_train")
    xx, ww = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = linear(xx, ww, None, "nvfp4_train", seed=9, offset=4, emulate=emulate)
    y.backward(dy)
    assert torch.equal(y, gemm.fprop(x, w, r, seed=9, offset=4, emulate=True))
    assert torch.equal(xx.grad, gemm.dgrad(dy, w, r, seed=9, offset=4, emulate=True))
    assert torch.equal(ww.grad, gemm.wgrad(dy, x, r, seed=9, offset=4, emulate=True))


def test_wgrad_uses_the_transformed_operands():
    g = torch.Generator().manual_seed(1)
    x, dy = torch.randn(21, 32, generator=g), torch.randn(21, 16, generator=g)
    r = recipe("nvfp4_train")
    signs = rht_signs(4, gemm.operand_offset(2, "rht"))
    tdy, tx = random_hadamard(dy, signs), random_hadamard(x, signs)
    want = (fake_quantize(tdy, r.grad, seed=4, offset=gemm.operand_offset(2, "dyt"), transpose=True)
            @ fake_quantize(tx, r.act, seed=4, offset=gemm.operand_offset(2, "xt"), transpose=True).t())
    assert torch.equal(gemm.wgrad(dy, x, r, seed=4, offset=2, emulate=True), want)


def test_wgrad_is_unbiased_over_stochastic_rounding():
    """E over SR of the transformed, stochastically rounded gradient is T dy, so E[dw] =
    (T dy)^T Q(T x): the transform adds no bias (T x is rounded to nearest, as in the recipe). The one
    exception is nvfp4's own: a block scale rounded down to E4M3 makes the block's largest elements
    saturate at 6 * scale, with or without the transform. Mean of 512 SR draws vs T dy clipped there,
    within 6 standard errors of SR's own spread."""
    g = torch.Generator().manual_seed(3)
    dy = torch.randn(32, 4, generator=g) * torch.exp2(torch.randint(-3, 4, (32, 1), generator=g).float())
    tdy = random_hadamard(dy, rht_signs(1, 2))
    spec = recipe("nvfp4_train").grad
    q = quantize(tdy, spec, transpose=True)
    scale = (q.scales.float() * q.tensor_scale).repeat_interleave(16, dim=1)
    want = torch.minimum(torch.maximum(tdy.t(), -6 * scale), 6 * scale).double()
    assert (want != tdy.t()).any()  # some elements do saturate: the case is exercised
    # SR between the neighbouring E2M1 levels lo <= v <= hi of v = |value| / scale has variance
    # (v - lo) (hi - v) scale^2.
    levels = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
    v = (want.abs() / scale).clamp(max=6.0).contiguous()
    hi = levels[torch.searchsorted(levels, v)]
    lo = levels[torch.searchsorted(levels, v, right=True) - 1]
    sd = ((v - lo) * (hi - v)).sqrt() * scale
    draws = torch.stack([fake_quantize(tdy, spec, seed=s, offset=0, transpose=True) for s in range(512)]).double()
    assert ((draws.mean(0) - want).abs() <= 6 * sd / 512**0.5 + 1e-6 * scale).all()


def test_planner_measures_the_recipe_with_its_transform():
    from types import SimpleNamespace

    from planner.qerror import gemm_errors, relative_error

    g = torch.Generator().manual_seed(5)
    x, dy, w = torch.randn(40, 32, generator=g), torch.randn(40, 24, generator=g), torch.randn(24, 32, generator=g)
    # the fields of a planner.stats.LayerRecording it reads; every row sampled, so e_wgrad is the sample's
    rec = SimpleNamespace(x=x, dy=dy, weight=w, rows=torch.arange(40), shape=SimpleNamespace(tokens=40),
                          weight_grad=gemm.fp32_mm(dy.t(), x))
    errs = gemm_errors(rec, ["nvfp4_train", "nvfp4"], seed=3)
    r = recipe("nvfp4_train")
    want = relative_error(gemm.wgrad(dy, x, r, seed=3, emulate=True), gemm.fp32_mm(dy.t(), x))
    assert errs["nvfp4_train"]["wgrad"] == want
    assert errs["nvfp4_train"]["wgrad"] != errs["nvfp4"]["wgrad"]
