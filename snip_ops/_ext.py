"""The native extension snip_ops._C, if it was built, and what it can run.

Importing this module never fails: without the extension HAS_KERNELS is False and the import
error is kept for build_info(). Ops live in torch.ops.snip_C once _C is imported.

The extension is built with its CUDA kernels (for the archs in `compiled_archs()`) or without CUDA;
either way the ops that have a CPU implementation (quantize, dequantize, adamw: host loops of the
kernels' arithmetic) list the target "cpu" in `kernels()`.

This module imports no other module of snip_ops (every module that runs kernels imports it): whether a compiled
kernel may run is asked of the gate the package installs (`set_kernel_gate`; snip_ops/__init__.py installs the
self-check, snip_ops.self_check.passed), before its first use on each device.
"""

from __future__ import annotations

import json
import warnings
from functools import lru_cache
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import Callable

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
            "snip_ops._C was not built: a pure-Python install (SNIP_NO_EXT=1 at install time, or an install "
            "from before it was required)"
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


def _constant(fn):
    """`torch.compiler.assume_constant_result`, which marks `fn` so that a torch.compile trace takes its
    result as a constant, without what that function does first: import torch._dynamo, seconds that every
    process importing snip would otherwise pay (tests/ops/test_compile.py checks the mark is torch's)."""
    fn._dynamo_marked_constant = True
    return fn


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
    elif not isinstance(device, torch.device):
        device = torch.device(device)
    if device.type == "cpu":
        return "cpu"
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return _cuda_arch(torch.cuda.current_device() if device.index is None else device.index)


@lru_cache(maxsize=None)
def _cuda_arch(index: int) -> str:
    # Every GEMM and quantization asks, several times per layer call: the device query is made once.
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}a"


@_constant  # fixed per process and device: torch.compile takes it as a constant
def kernel_compiled(name: str, device) -> bool:
    """True when the extension has kernel `name` compiled for the arch of `device` (a torch.device, a
    device string, or a tensor; "cpu": the op's CPU implementation), whether or not it passed its
    self-check there."""
    if not HAS_KERNELS:
        return False
    arch = _device_arch(device)
    return arch is not None and arch in _native_info().get("kernels", {}).get(name, ())


# (kernel name, device) -> whether that compiled kernel may run there; None until the package installs its gate
KernelGate = Callable[[str, torch.device], bool]
_gate: KernelGate | None = None
_gate_epoch = 0  # counts the times the gate's answers may have changed (`gate_changed`)


def set_kernel_gate(gate: KernelGate) -> None:
    """Install the check every compiled kernel passes before it runs on a device (`kernel_available`)."""
    global _gate
    _gate = gate
    gate_changed()


def gate_changed() -> None:
    """Say that the gate's answers may differ from now on (a self-check finished, the checks were switched on
    or off, another gate was installed): every decision kept by a `GateMemo` is dropped."""
    global _gate_epoch
    _gate_epoch += 1


class GateMemo(dict):
    """Decisions that follow from which kernels may run (a kernel's use, an operand's scale layout, a GEMM's
    path and tile), kept per argument tuple so that a layer does not re-derive them on every call, and
    dropped whenever the gate's answers may have changed. `get_or(key, compute)` returns the kept decision or
    computes it; one computed while the gate changed (a self-check that ran and finished inside `compute`)
    is returned but not kept. `lookup` and item assignment serve a caller that keeps only some decisions."""

    def __init__(self):
        super().__init__()
        self._epoch = _gate_epoch

    def lookup(self, key):
        """The decision kept for `key`, None if there is none (decisions are never None)."""
        if self._epoch != _gate_epoch:
            self.clear()
            self._epoch = _gate_epoch
        return self.get(key)

    def get_or(self, key, compute: Callable[[], object]):
        value = self.lookup(key)
        if value is None:
            epoch = _gate_epoch
            value = compute()
            if epoch == _gate_epoch:
                self[key] = value
        return value


def kernel_available(name: str, device) -> bool:
    """True when kernel `name` is compiled for `device` (`kernel_compiled`) and the kernel gate lets it run
    there (the self-check, snip_ops.self_check). On a CUDA device without it, the first such call of the
    process warns (`missing_kernel_warning`)."""
    if isinstance(device, torch.Tensor):
        device = device.device
    elif not isinstance(device, torch.device):
        device = torch.device(device)
    if _available(name, str(device)):
        return True
    if not kernel_compiled(name, device):
        arch = _device_arch(device)
        if arch is not None and arch != "cpu":
            _warn_missing_kernel(name, arch)
    return False


_answers = GateMemo()  # (kernel name, device) -> kernel_available's answer


@_constant  # asked first from a torch.compile trace, the check still runs eagerly
def _available(name: str, device: str) -> bool:
    # asked several times per GEMM and quantization: the answer is kept until the gate changes
    return _answers.get_or((name, device), lambda: kernel_compiled(name, device) and _gate_allows(name, device))


def _gate_allows(name: str, device: str) -> bool:
    if _gate is None:  # never after `import snip_ops`, which every import of one of its modules runs first
        raise RuntimeError("snip_ops' kernel gate is not installed: kernels are used only after their self-check")
    return _gate(name, torch.device(device))


# Archs snip compiles kernels for (CMakeLists.txt's SNIP_CUDA_ARCHS), with what runs on them.
SUPPORTED_ARCHS = {"sm_90a": "Hopper: H100, H200", "sm_100a": "Blackwell: B200, GB200"}
_REINSTALL = ("reinstall where nvcc (CUDA 12.8 or later) and this torch are present: pip install "
              "--no-build-isolation . (scripts/install.sh does it)")
_warned: set[str] = set()


def missing_kernel_warning(name: str, arch: str) -> str:
    """What the first use of kernel `name` on a CUDA device of `arch` (e.g. "sm_90a") says when the
    kernel is not compiled for it: why, what runs instead, and how to get the kernel."""
    if not HAS_KERNELS:
        why, fix = _IMPORT_ERROR, _REINSTALL
    elif arch not in SUPPORTED_ARCHS:
        why = f"snip compiles its kernels for {', '.join(f'{a} ({d})' for a, d in SUPPORTED_ARCHS.items())} only"
        fix = "nothing to build for this GPU; on one of those, the kernels run"
    elif not compiled_archs():
        why, fix = "snip_ops._C was built without CUDA (SNIP_NO_CUDA=1, or a CPU-only torch)", _REINSTALL
    elif arch not in compiled_archs():
        why = f"snip_ops._C was built for {', '.join(compiled_archs())} only"
        fix = f"{_REINSTALL}, with SNIP_CUDA_ARCHS unset or including {arch.removeprefix('sm_')}"
    else:
        why = f"snip_ops._C for {arch} lacks the {name} kernel (built without the CUTLASS headers?)"
        fix = f"{_REINSTALL}, after pip install --no-deps nvidia-cutlass==4.2.0.0"
    # Where the quantizer exists, only the GEMM falls back (to BF16 tensor cores); without it, snip_ops.linear
    # takes the fully emulated path, whose exact GEMMs run in FP64 on a GPU.
    instead = ("GEMMs on BF16 tensor cores (blockwise_bf16 or bf16_exact): the same results, but slower than BF16 "
               "training" if HAS_KERNELS and arch in kernels().get("quantize", []) else
               "the reference quantizer and optimizer, exact GEMMs in FP64: the same results, many times slower than "
               "BF16 training")
    return (f"snip: no {name} kernel for this {arch} GPU: {why}. Its work runs on the emulated PyTorch paths "
            f"instead ({instead}). Fix: {fix}; snip_ops.build_info() tells what this install has.")


@_constant  # runs once, eagerly, when traced: never a graph break
def _warn_missing_kernel(name: str, arch: str) -> bool:
    """One RuntimeWarning per process and device arch, at the first kernel found missing there."""
    if arch in _warned:
        return False
    _warned.add(arch)
    warnings.warn(missing_kernel_warning(name, arch), RuntimeWarning, stacklevel=4)
    return True


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
