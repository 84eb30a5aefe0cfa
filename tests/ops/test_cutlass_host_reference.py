"""CUTLASS reads the operands and scales the way snip writes them, checked on the CPU.

For every compiled GEMM kernel (csrc/gemm/sm90/*.cu, csrc/gemm/sm100/*.cu), operands quantized by
snip_ops.quantize with the recipes' formats and prepared by the real snip_ops.gemm_kernels.prepare_sm90 /
prepare_sm100 are handed, untouched, to CUTLASS's host reference GEMM (gett.hpp, as CUTLASS examples 67
and 72 verify their kernels) through that kernel's own Arguments -- built by its `arguments()` from the
fields the op file derives from the tensors -- so the reference reads A, B, SFA, SFB, alpha and D
through the kernel's StrideA/B, LayoutSFA/SFB (Sm90 blockwise or Sm1xx block-scaled) and StrideD. Its
result must equal the FP64 GEMM of the dequantized operands (snip_ops.reference.dequantize) within an
elementwise error bound; odd M, N, K and K tails included. A deliberately mis-laid-out scale tensor must
fail that comparison. And each kernel's GemmUniversalAdapter::can_implement accepts every problem shape
class snip_ops.gemm_kernels sends it, and agrees with the op's own checks where they refuse.

What this proves and what it does not: csrc/gemm/README.md, Tests ("CPU check against CUTLASS's host reference").
"""

import re
from pathlib import Path

import pytest
import torch

import cutlass_host
from bounds import abs_product, assert_within, gamma, gemm_error_bound, then_rounded
from snip_ops import _ext, gemm_kernels as gk, quantize
from snip_ops.formats import E2M1, QuantSpec, ScaleKind, recipe
from snip_ops.reference import QTensor, block_shape, dequantize
from snip_ops.scale_layout import from_blackwell

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[2]
GEMMS = ("fprop", "dgrad", "wgrad")
# Recipes whose operands a kernel may take, by its scale type: FP32 blockwise scales
# (snip_C::fp8_gemm_nt_blockwise, sm90 and sm100) or Blackwell block scales ({nvfp4,mxfp4,mxfp8}_gemm_nt).
# The tests pick those matching each kernel.
RECIPES = {"f32": ("fp8", "fp8_e5m2grad", "fp4"), "ue4m3": ("nvfp4", "nvfp4_train"), "ue8m0": ("mxfp4", "mxfp8")}
BLACKWELL_KIND = {"nvfp4_train": "nvfp4"}  # the block-scaled kernel a recipe's operands go to, where not its name
D_DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}
SF_KINDS = {"f32": ScaleKind.FP32, "ue4m3": ScaleKind.NVFP4, "ue8m0": ScaleKind.E8M0}
# Roundings per product term between the host reference and the dequantized operands, besides the
# accumulation: FP32 scales, code * scale rounded once per operand on each side (4); nvfp4, the tensor
# scales folded into each dequantized operand (2 per operand) and the kernel's alpha = ta * tb and
# alpha * acc (2), the codes times E4M3 scales being exact (6); E8M0 scales are powers of two (0).
SCALE_ROUNDINGS = {"f32": 4, "ue4m3": 6, "ue8m0": 0}
# (M, N, K): M = 1, odd M and N (N padded by prepare_*), K below, across and not a multiple of the
# 128-wide scale blocks, the FP4 byte pairs and the 128-row / 4-scale atoms of the Blackwell layout.
SHAPES = [(1, 24, 256), (7, 13, 200), (129, 200, 300), (200, 129, 100)]


def compiled_variants(arch: str) -> dict[str, str]:
    """{variant name: kernel type} of every instantiation in csrc/gemm/<arch>/*.cu: the type its variant
    object points into, through the file's `using` alias if it has one, whitespace removed."""
    found = {}
    for cu in sorted((ROOT / "csrc" / "gemm" / arch).glob("*.cu")):
        text = cu.read_text()
        aliases = dict(re.findall(r"using\s+(\w+)\s*=\s*([^;]+);", text))
        for name, cls in re.findall(r'Variant\s+\w+\s*=\s*\{\s*"([^"]+)".*?&([\w:<>,\s]+?)::workspace_size', text, re.S):
            found[name] = re.sub(r"\s+", "", aliases.get(cls.strip(), cls))
    return found


VARIANTS = [(arch, name) for arch in ("sm90", "sm100") for name in compiled_variants(arch)]


def _host(arch: str, name: str) -> tuple[cutlass_host.HostReference, dict[str, str]]:
    lib = cutlass_host.load(arch)
    if name not in lib.variants:
        pytest.fail(f"kernel {name} has no host reference: add it to tests/native/cutlass_host_reference_{arch}.cu")
    return lib, lib.variants[name]


# ---- operands ------------------------------------------------------------------------------------


def _operand_specs(r, gemm: str) -> tuple[QuantSpec, QuantSpec]:
    """(a, b) specs of one GEMM of a linear layer (docs/design.md §3)."""
    return {"fprop": (r.act, r.weight), "dgrad": (r.grad, r.weight), "wgrad": (r.grad, r.act)}[gemm]


def _blockwise(info: dict[str, str]) -> bool:
    """An fp8_gemm_nt_blockwise kernel (FP32 scales, prepare_sm90), else a block-scaled one (prepare_sm100)."""
    return info["sf"] == "f32"


def _kernel_element(spec: QuantSpec, info: dict[str, str]) -> str:
    # prepare_sm90 re-encodes E2M1 as E4M3 (gemm_kernels.fp4_codes_as_e4m3, exact).
    return "e4m3" if _blockwise(info) and spec.element == E2M1 else spec.element.name


def _takes(info: dict[str, str], a: QuantSpec, b: QuantSpec) -> bool:
    """Whether the kernel described by `info` computes a . b^T for operands of these specs."""
    def block(text):
        return tuple(int(v) for v in text.split("x"))

    def kernel_block(s):
        # nvfp4_train's 16x16 weight blocks reach the kernel as 1x16 blocks, each scale repeated per row.
        return (1, 16) if s.scale == ScaleKind.NVFP4 and s.block == (16, 16) else s.block

    return all(
        _kernel_element(s, info) == info[role] and kernel_block(s) == block(info[f"sf{role}_block"])
        and s.scale in ((ScaleKind.FP32, ScaleKind.POW2) if _blockwise(info) else (SF_KINDS[info["sf"]],))
        for role, s in (("a", a), ("b", b))
    )


def _cases(info: dict[str, str]) -> list[tuple[str, str]]:
    """(recipe, gemm) of each of a linear layer's GEMMs under snip's recipes that this kernel takes,
    once per distinct (operand specs, gemm)."""
    cases, seen = [], set()
    for name in RECIPES[info["sf"]]:
        for gemm in GEMMS:
            specs = _operand_specs(recipe(name), gemm)
            if _takes(info, *specs) and (specs, gemm) not in seen:
                seen.add((specs, gemm))
                cases.append((name, gemm))
    if not cases:
        pytest.fail(f"no recipe of {RECIPES[info['sf']]} gives operands for a kernel with {info}")
    return cases


def _randn(rows: int, cols: int, g: torch.Generator) -> torch.Tensor:
    """Normal values times powers of two from 2^-6 to 2^6 per row and per column, so that the block
    scales differ widely and a scale read from the wrong block shows."""
    def octaves(*shape):
        return torch.exp2(torch.randint(-6, 7, shape, generator=g).float())

    return torch.randn(rows, cols, generator=g) * octaves(rows, 1) * octaves(1, cols)


def _gemm_layout(spec: QuantSpec, arch: str) -> str:
    """The scale layout snip_ops.linear quantizes an operand of `spec` in for a GEMM on `arch`
    (gemm_kernels.scale_layout_for where that arch's kernels are usable)."""
    if gk._blockwise_spec(spec):
        return "hopper"
    if arch == "sm100" and gk._blackwell_format(spec) is not None and spec.block[0] == 1:
        return "blackwell"
    return "plain"


def _linear_operands(name: str, gemm: str, m: int, n: int, k: int, seed: int = 0,
                     arch: str | None = None) -> tuple[QTensor, QTensor]:
    """(a [m, k], b [n, k]) of one GEMM of a linear layer under recipe `name`, by snip_ops.quantize: with
    plain scales, or with `arch` in the scale layout the layer writes for that arch's GEMMs."""
    g = torch.Generator().manual_seed(seed)
    r = recipe(name)

    def q(x, spec, transpose=False):
        return quantize(x, spec, transpose=transpose, scale_layout="plain" if arch is None else _gemm_layout(spec, arch))
    if gemm == "fprop":  # x [m, k], w [n, k]
        return q(_randn(m, k, g), r.act), q(_randn(n, k, g), r.weight)
    if gemm == "dgrad":  # dy [m, k], w [k, n] -> b = w^T, square weight blocks shared with fprop
        dy, w = _randn(m, k, g), _randn(k, n, g)
        square = r.weight.block[0] == r.weight.block[1]
        b = quantize(w, r.weight).t() if square and arch is None else q(w, r.weight, transpose=True)
        return q(dy, r.grad), b
    dy, x = _randn(k, m, g), _randn(k, n, g)  # wgrad: a = dy^T, b = x^T
    return q(dy, r.grad, transpose=True), q(x, r.act, transpose=True)


def _prepare(info: dict[str, str], name: str, a: QTensor, b: QTensor):
    """(ca, sfa, cb, sfb, alpha, (M, N padded, K)) exactly as gemm_kernels hands them to the op."""
    if _blockwise(info):
        ca, sfa, cb, sfb, _, n_pad = gk.prepare_sm90(a, b, D_DTYPES[info["d"]])
        alpha = None
    else:
        ca, sfa, cb, sfb, alpha, n_pad = gk.prepare_sm100(BLACKWELL_KIND.get(name, name), a, b)
    k = ca.shape[1] * (2 if info["a"] == "e2m1" else 1)  # packed FP4: two per byte (as the op reads K)
    return ca, sfa, cb, sfb, alpha, (ca.shape[0], n_pad, k)


def _bound(xa: torch.Tensor, xb: torch.Tensor, info: dict[str, str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(FP64 reference, elementwise bound on |host reference - reference|): FP32 accumulation in any
    order (Higham's gamma_K |a| |b|^T plus underflow), the FP64 product's own error, the scale
    roundings of SCALE_ROUNDINGS, then the kernel's output rounding (BF16)."""
    ref = xa.double() @ xb.double().t()
    bound = (gemm_error_bound(xa, xb) + gemm_error_bound(xa, xb, torch.float64)
             + gamma(SCALE_ROUNDINGS[info["sf"]]) * abs_product(xa, xb))
    return ref, then_rounded(bound, ref, *([torch.bfloat16] if info["d"] == "bf16" else []))


def _check_gemm(lib, variant, info, a, b, operands, what):
    """The host reference over `operands` (a prepared (ca, sfa, cb, sfb, alpha, mnk)) equals
    dequantize(a) . dequantize(b)^T within the bound; the padded columns are exactly 0."""
    ca, sfa, cb, sfb, alpha, (m, n_pad, k) = operands
    got = lib.gemm(variant, m, n_pad, k, ca, sfa, cb, sfb, alpha)
    n = b.shape[0]
    ref, bound = _bound(dequantize(a), dequantize(b), info)
    assert_within(got[:, :n], ref, bound, what)
    assert torch.equal(got[:, n:], torch.zeros(m, n_pad - n)), f"{what}: padded columns are not 0"


# ---- the kernels' table --------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_every_kernel_has_a_host_reference_of_its_type(arch):
    """The host reference's table names every compiled kernel with the type its instantiation file
    uses, so the reference reads operands through that kernel's own layouts."""
    lib = cutlass_host.load(arch)
    assert {name: re.sub(r"\s+", "", t) for name, t in lib.types.items()} == compiled_variants(arch)


# ---- numerics ------------------------------------------------------------------------------------


@pytest.mark.parametrize("m, n, k", SHAPES)
@pytest.mark.parametrize("arch, variant", VARIANTS)
def test_host_reference_matches_dequantized_gemm(arch, variant, m, n, k):
    lib, info = _host(arch, variant)
    for name, gemm in _cases(info):
        a, b = _linear_operands(name, gemm, m, n, k)
        what = f"{variant} {name} {gemm} M={m} N={n} K={k}"
        _check_gemm(lib, variant, info, a, b, _prepare(info, name, a, b), what)


@pytest.mark.parametrize("arch, variant", VARIANTS)
def test_host_reference_reads_the_quantizers_gemm_layout(arch, variant):
    """Operands whose scales the quantizer wrote in the layout of their GEMM (scale_layout "hopper" /
    "blackwell", which the preparation hands over without a relayout) give the GEMM of the dequantized
    operands too: the layout the quantizer writes is the one the kernel reads."""
    lib, info = _host(arch, variant)
    m, n, k = 129, 203, 300  # block rows not a multiple of 4, N padded past the scale pitch for BF16 output
    for name, gemm in _cases(info):
        a, b = _linear_operands(name, gemm, m, n, k, arch=arch)
        _check_gemm(lib, variant, info, a, b, _prepare(info, name, a, b), f"{variant} {name} {gemm} ({a.scale_layout})")


@pytest.mark.parametrize("arch, variant", VARIANTS)
def test_mislaid_scales_fail_the_comparison(arch, variant):
    """Negative control: the same scales in a layout the kernel does not read -- Hopper's A scales
    K-major (the QTensor's own [M, K/128], i.e. hopper_scales without its transpose), Blackwell's B
    scales in the plain row-major grid (to_blackwell forgotten) -- pass every shape check of the op but
    fail the comparison, so the test sees a layout mismatch."""
    lib, info = _host(arch, variant)
    m, n, k = 129, 200, 300
    name, gemm = _cases(info)[0]
    a, b = _linear_operands(name, gemm, m, n, k)
    ca, sfa, cb, sfb, alpha, mnk = operands = _prepare(info, name, a, b)
    what = f"{variant} {name} {gemm}"
    _check_gemm(lib, variant, info, a, b, operands, what)  # the right layout passes
    if _blockwise(info):
        s = gk.hopper_scales(a, "a")[0].t()  # [M padded, K/128]: K-major, as QTensor.scales
        mislaid = (ca, s.contiguous().reshape(sfa.shape), cb, sfb, alpha, mnk)
    else:
        mislaid = (ca, sfa, cb, from_blackwell(sfb, *sfb.shape).contiguous(), alpha, mnk)
    assert _op_verdict(info, name, *mislaid[:5]) in (True, None)  # the op cannot tell
    with pytest.raises(AssertionError, match="exceed the bound"):
        _check_gemm(lib, variant, info, a, b, mislaid, what)


# ---- can_implement -------------------------------------------------------------------------------


def _zero_operand(spec: QuantSpec, rows: int, cols: int) -> QTensor:
    """A QTensor with the dtypes and shapes of quantize(x [rows, cols], spec), zero codes and scales,
    built directly: can_implement reads no data, and quantizing a large x on the CPU is slow."""
    probe = quantize(torch.zeros(2, 2), spec)
    br, bc = block_shape(spec, (rows, cols))
    codes = torch.zeros(rows, -(-cols // 2) if spec.packed else cols, dtype=torch.uint8).view(probe.codes.dtype)
    scales = torch.zeros(-(-rows // br), -(-cols // bc), dtype=probe.scales.dtype)
    return QTensor(codes, scales, spec, (rows, cols), probe.tensor_scale)


# (shape class, M, N, K, padding cut off again, can_implement's verdict): what gemm_kernels sends the
# kernels, prepared by prepare_*; then the same operands without prepare's K padding (16-byte rows: the
# op refuses, and TMA could not load them) and without its N padding (16-byte output rows: refused for
# BF16 output, fine for FP32), where can_implement must agree with the op.
SHAPE_CLASSES = [
    ("aligned", 256, 256, 512, None, True),
    ("odd M", 129, 256, 512, None, True),
    ("odd N", 256, 100, 512, None, True),
    ("K tail", 256, 256, 200, None, True),
    ("M = 1", 1, 256, 512, None, True),
    ("large", 8192, 8192, 8192, None, True),
    ("K tail, K not padded", 256, 256, 200, "k", False),
    ("odd N, N not padded", 256, 100, 512, "n", None),
]


def _op_verdict(info: dict[str, str], name: str, ca, sfa, cb, sfb, alpha) -> bool | None:
    """Whether the op's own checks accept these operands (on the CPU it then refuses only for want of
    a GPU); None when the extension was built without the op. Arguments are passed by name, as the
    op's schema lists them."""
    op_name = "fp8_gemm_nt_blockwise" if _blockwise(info) else f"{name}_gemm_nt"
    if not (_ext.HAS_KERNELS and op_name in _ext.kernels()):
        return None
    op = getattr(torch.ops.snip_C, op_name).default
    takes = {arg.name for arg in op._schema.arguments}
    given = dict(a=ca, sfa=sfa, b=cb, sfb=sfb, alpha=alpha, b_block=int(info["sfb_block"].split("x")[0]),
                 out_dtype=D_DTYPES[info["d"]], bias=None, config="")
    try:
        op(**{key: value for key, value in given.items() if key in takes})
    except RuntimeError as e:
        return "must be on a CUDA device" in str(e)
    raise AssertionError(f"{op_name} ran on the CPU")


@pytest.mark.parametrize("arch, variant", VARIANTS)
def test_can_implement_every_shape_class(arch, variant):
    """GemmUniversalAdapter::can_implement of the Arguments the op would build accepts every shape class
    gemm_kernels sends the kernel, refuses unpadded K, and agrees with the op's checks throughout."""
    lib, info = _host(arch, variant)
    name, gemm = _cases(info)[0]
    a_spec, b_spec = _operand_specs(recipe(name), gemm)
    for what, m, n, k, cut, expected in SHAPE_CLASSES:
        a, b = _zero_operand(a_spec, m, k), _zero_operand(b_spec, n, k)
        ca, sfa, cb, sfb, alpha, (m, n_pad, k_pad) = _prepare(info, name, a, b)
        if cut == "k":
            k_bytes = a.codes.shape[1]
            ca, cb, k_pad = ca[:, :k_bytes].contiguous(), cb[:, :k_bytes].contiguous(), k
        elif cut == "n":
            cb, n_pad = cb[:n].contiguous(), n
        implementable = lib.can_implement(variant, m, n_pad, k_pad, ca, sfa, cb, sfb) == 0
        where = f"{variant}, {what} (M={m} N={n_pad} K={k_pad})"
        if expected is not None:
            assert implementable == expected, f"{where}: can_implement says {implementable}"
        op_accepts = _op_verdict(info, name, ca, sfa, cb, sfb, alpha)
        if op_accepts is not None:
            assert op_accepts == implementable, f"{where}: the op accepts: {op_accepts}, can_implement: {implementable}"
