"""The native build, checked on the CPU: the extension was built when it could be and says what it
holds. The ops' schemas, argument checks and Meta functions are tested with their Python dispatchers
(tests/ops/test_quant_dispatch.py, tests/ops/test_gemm_dispatch.py)."""

import importlib
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from snip_ops import _ext, self_check

OP = "quantize"  # a common kernel: compiled for every arch


def _truthy(name):
    return os.environ.get(name, "").lower() in ("1", "true", "yes", "on")


def _extension_expected():
    """Mirror setup.py: without SNIP_NO_EXT it is built wherever a C++ compiler exists (the CPU
    implementations at least)."""
    if _truthy("SNIP_NO_EXT"):
        return False
    return any(exe and shutil.which(exe.split()[0]) for exe in (os.environ.get("CXX"), "c++", "g++", "clang++"))


def _cuda_expected():
    """Mirror setup.py: a CUDA torch plus nvcc and no SNIP_NO_CUDA means the CUDA kernels are built."""
    if _truthy("SNIP_NO_CUDA") or torch.version.cuda is None:
        return False
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    return any(h and (Path(h) / "bin" / "nvcc").exists() for h in homes) or bool(shutil.which("nvcc"))


needs_ext = pytest.mark.skipif(not _ext.HAS_KERNELS, reason="pure-Python install (no snip_ops._C)")


def test_extension_built_when_possible():
    if _extension_expected():
        assert _ext.HAS_KERNELS, f"a C++ compiler is present but _C is missing: {_ext.build_info()}"
        if _cuda_expected():
            assert _ext.compiled_archs(), f"nvcc and a CUDA torch are present but no CUDA kernel: {_ext.build_info()}"
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
    assert set(archs) <= {"sm_90a", "sm_100a"}
    # a common kernel runs on every compiled arch, and has a CPU implementation
    assert info["kernels"][OP] == archs + ["cpu"]
    built = info["built_with"]
    assert built["torch"] == torch.__version__, "extension built against another torch: rebuild it"
    if not built["cuda"]:  # built without CUDA: the ops with a CPU implementation only
        assert archs == [] and built["cutlass"] == ""
        assert info["kernels"] == {"quantize": ["cpu"], "dequantize": ["cpu"], "adamw": ["cpu"]}
        return
    assert archs
    wanted = os.environ.get("SNIP_CUDA_ARCHS")
    if wanted:
        assert sorted(archs) == sorted("sm_" + a.strip().removeprefix("sm_") for a in wanted.replace(",", ";").split(";") if a.strip())
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?", built["cuda"]), built
    assert re.fullmatch(r"\d+\.\d+\.\d+", built["cutlass"]), f"built without CUTLASS headers: {built}"


@needs_ext
def test_kernel_available_on_cpu_means_a_cpu_implementation():
    assert _ext.kernel_available(OP, "cpu") and _ext.kernel_available(OP, torch.zeros(2, 128))
    assert not _ext.kernel_available("fp8_gemm_nt_blockwise", "cpu")  # the GEMMs run on GPUs only
    assert not _ext.kernel_available("no_such_kernel", "cuda")
    assert not _ext.kernel_available(OP, "meta")


@needs_ext
def test_extension_of_another_torch_is_not_used(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "0.0.0+other")
    try:
        importlib.reload(_ext)
        assert not _ext.HAS_KERNELS and _ext.kernels() == {} and not _ext.kernel_available(OP, "cuda")
        assert "built against torch" in _ext.build_info()["extension_error"]
    finally:
        monkeypatch.undo()
        importlib.reload(_ext)
        _ext.set_kernel_gate(self_check.passed)  # a reload clears the gate `import snip_ops` installed
    assert _ext.HAS_KERNELS
