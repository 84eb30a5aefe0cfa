"""The native extension snip_ops._C, if it was built, and what it can run.

Importing this module never fails: without the extension HAS_KERNELS is False and the import
error is kept for build_info(). Ops live in torch.ops.snip_C once _C is imported.

The extension is built with its CUDA kernels (for the archs in `compiled_archs()`) or without CUDA;
either way the ops that have a CPU implementation (quantize, dequantize, adamw: host loops of the
kernels' arithmetic) list the target "cpu" in `kernels()`.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import torch

try:
    from snip_ops import _C  # noqa: F401  (importing registers torch.ops.snip_C)

    HAS_KERNELS = True
    _IMPORT_ERROR: str | None = None
except ImportError as e:  # pure-Python install, or an extension built against another torch
    _C = None
    HAS_KERNELS = False
    if any((Path(__file__).parent / f"_C{suffix}").exists() for suffix in EXTENSION_SUFFIXES):
        _IMPORT_ERROR = f"snip_ops._C is there but does not load (rebuild it): {type(e).__name__}: {e}"
    else:
        _IMPORT_ERROR = (
            "snip_ops._C was not built: pure-Python install (no C++ compiler, or SNIP_NO_EXT=1 at "
            "install time); build it with pip install --no-build-isolation -e ."
        )

if HAS_KERNELS:
    # An extension built against another torch can load (one source tree, two environments) yet
    # disagree with this torch's C++ ABI: it is not used, and says why.
    _built_torch = json.loads(torch.ops.snip_C.build_info()).get("torch")
    if _built_torch != torch.__version__:
        _C = None
        HAS_KERNELS = False
        _IMPORT_ERROR = (f"snip_ops._C is there but was built against torch {_built_torch}, not this torch "
                         f"{torch.__version__} (rebuild it)")


@lru_cache(maxsize=1)
def _native_info() -> dict:
    if not HAS_KERNELS:
        return {}
    return json.loads(torch.ops.snip_C.build_info())


def compiled_archs() -> list[str]:
    """CUDA archs compiled into the extension, e.g. ["sm_90a", "sm_100a"]; [] without it."""
    return list(_native_info().get("archs", []))


def kernels() -> dict[str, list[str]]:
    """Kernel name -> targets it was compiled for: CUDA archs, and "cpu" for an op with a CPU
    implementation; {} without the extension."""
    return {k: list(v) for k, v in _native_info().get("kernels", {}).items()}


def _device_arch(device) -> str | None:
    """The target that runs on `device`: "cpu", or the CUDA arch (sm_90a on H100/H200, sm_100a on
    B200); None for any other device."""
    if isinstance(device, torch.Tensor):
        device = device.device
    device = torch.device(device)
    if device.type == "cpu":
        return "cpu"
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}a"


@torch.compiler.assume_constant_result  # fixed per process and device: torch.compile takes it as a constant
def kernel_compiled(name: str, device) -> bool:
    """True when the extension has kernel `name` compiled for the arch of `device` (a torch.device, a
    device string, or a tensor; "cpu": the op's CPU implementation), whether or not it passed its
    self-check there."""
    if not HAS_KERNELS:
        return False
    arch = _device_arch(device)
    return arch is not None and arch in kernels().get(name, [])


def kernel_available(name: str, device) -> bool:
    """True when kernel `name` is compiled for `device` (`kernel_compiled`) and passed its self-check
    there (snip_ops.self_check)."""
    if not kernel_compiled(name, device):
        return False
    if isinstance(device, torch.Tensor):
        device = device.device
    from . import self_check  # the checks import the ops, which import this module

    return self_check.passed(name, device)


def build_info() -> dict:
    """What this install can run: versions, whether the extension is present (or why not),
    compiled archs and kernels."""
    native = _native_info()
    info = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "extension": HAS_KERNELS,
        "extension_error": _IMPORT_ERROR,
        "compiled_archs": compiled_archs(),
        "kernels": kernels(),
        "built_with": {k: native.get(k) for k in ("torch", "cuda", "cutlass")} if native else None,
    }
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name()
        info["device_arch"] = _device_arch("cuda")
    return info
