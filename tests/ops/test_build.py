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

from snip_ops import _ext

OP = "quantize"  # a common kernel: compiled for every arch


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
def test_extension_of_another_torch_is_not_used(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "0.0.0+other")
    try:
        importlib.reload(_ext)
        assert not _ext.HAS_KERNELS and _ext.kernels() == {} and not _ext.kernel_available(OP, "cuda")
        assert "built against torch" in _ext.build_info()["extension_error"]
    finally:
        monkeypatch.undo()
        importlib.reload(_ext)
    assert _ext.HAS_KERNELS
