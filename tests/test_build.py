"""The native build, checked on the CPU: the extension was built when it could be, says what it
holds, and its ops exist with their argument checks and shape (Meta) functions."""

import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from snip_ops import _ext

OP = "fp8_quantize_1x128"


def _extension_expected():
    """Mirror setup.py: a CUDA torch plus nvcc and no SNIP_NO_CUDA means it must have been built."""
    if os.environ.get("SNIP_NO_CUDA", "").lower() in ("1", "true", "yes", "on"):
        return False
    if torch.version.cuda is None:
        return False
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    return any(h and (Path(h) / "bin" / "nvcc").exists() for h in homes) or bool(shutil.which("nvcc"))


needs_ext = pytest.mark.skipif(not _ext.HAS_KERNELS, reason="pure-Python install (no snip_ops._C)")


def test_extension_built_when_possible():
    if _extension_expected():
        assert _ext.HAS_KERNELS, f"nvcc and a CUDA torch are present but _C is missing: {_ext.build_info()}"
    else:
        info = _ext.build_info()
        if not _ext.HAS_KERNELS:
            assert info["extension"] is False and info["extension_error"], info


def test_build_info_without_extension_says_why():
    info = _ext.build_info()
    assert info["torch"] == torch.__version__
    assert isinstance(info["extension"], bool)
    if not info["extension"]:
        assert "_C" in info["extension_error"]
        assert info["compiled_archs"] == [] and info["kernels"] == {}
        assert _ext.kernel_available(OP, "cuda") is False


@needs_ext
def test_build_info_content():
    info = _ext.build_info()
    assert info["extension"] is True and info["extension_error"] is None
    archs = _ext.compiled_archs()
    assert archs and set(archs) <= {"sm_90a", "sm_100a"}
    wanted = os.environ.get("SNIP_CUDA_ARCHS")
    if wanted:
        assert sorted(archs) == sorted("sm_" + a.strip().removeprefix("sm_") for a in wanted.replace(",", ";").split(";") if a.strip())
    assert info["kernels"][OP] == archs  # a common kernel runs on every compiled arch
    built = info["built_with"]
    assert built["torch"] == torch.__version__, "extension built against another torch: rebuild it"
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?", built["cuda"]), built
    assert re.fullmatch(r"\d+\.\d+\.\d+", built["cutlass"]), f"built without CUTLASS headers: {built}"


@needs_ext
def test_kernel_available_on_cpu_is_false():
    assert not _ext.kernel_available(OP, "cpu")
    assert not _ext.kernel_available(OP, torch.zeros(2, 128))
    assert not _ext.kernel_available("no_such_kernel", "cuda")


@needs_ext
def test_op_schema():
    schema = str(getattr(torch.ops.snip_C, OP).default._schema)
    assert schema == "snip_C::fp8_quantize_1x128(Tensor x, bool pow2_scale) -> (Tensor codes, Tensor scales)"


@needs_ext
@pytest.mark.parametrize(
    "x, match",
    [
        (torch.zeros(4, 256, dtype=torch.bfloat16), "CUDA tensor"),
        (torch.zeros(4, 256, dtype=torch.float64), "bfloat16, float16 or float32"),
        (torch.zeros(4, 256, dtype=torch.int32), "bfloat16, float16 or float32"),
        (torch.zeros(2, 4, 256), "2-D"),
        (torch.zeros(256), "2-D"),
        (torch.zeros(256, 4).t(), "contiguous"),
    ],
)
def test_op_argument_errors_on_cpu(x, match):
    with pytest.raises(RuntimeError, match=match):
        torch.ops.snip_C.fp8_quantize_1x128(x, False)


@needs_ext
@pytest.mark.parametrize("shape", [(0, 0), (0, 128), (3, 0), (1, 1), (7, 129), (5, 256), (33, 1000)])
def test_meta_shapes(shape):
    x = torch.empty(shape, dtype=torch.bfloat16, device="meta")
    codes, scales = torch.ops.snip_C.fp8_quantize_1x128(x, True)
    assert codes.shape == shape and codes.dtype == torch.float8_e4m3fn
    assert scales.shape == (shape[0], -(-shape[1] // 128)) and scales.dtype == torch.float32


@needs_ext
def test_traces_with_symbolic_shapes():
    # What torch.compile does: run the op on fake tensors with symbolic sizes, no device needed.
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x: torch.ops.snip_C.fp8_quantize_1x128(x, False), tracing_mode="symbolic")(
        torch.empty(6, 300, dtype=torch.float16)
    )
    metas = [n.meta["val"] for n in gm.graph.nodes if n.op == "call_function" and "fp8_quantize" in str(n.target)]
    codes, scales = metas[0]
    assert codes.dtype == torch.float8_e4m3fn and scales.dtype == torch.float32
    x_size = next(iter(gm.graph.nodes)).meta["val"].shape
    assert all(isinstance(d, torch.SymInt) for d in (*codes.shape, *scales.shape))  # stayed symbolic
    assert codes.shape == x_size and scales.shape[0] == x_size[0]
    assert "128" in str(scales.shape[1])  # ceil(K / 128), as an expression of K
