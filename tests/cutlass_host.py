"""CUTLASS's host reference GEMM driven through snip's GEMM kernels' own argument types
(tests/native/cutlass_host_reference_<arch>.cu), compiled by nvcc as host code and loaded with ctypes.

One library per arch ("sm90", "sm100"), compiled with the flags the extension gives that arch's GEMM
sources (CMakeLists.txt: C++20, -O3 -DNDEBUG, --expt-relaxed-constexpr, the arch's -gencode, csrc/ and
CUTLASS's include and tools/util/include), plus OpenMP for the reference's loops. Cached under the temp
directory, keyed by a hash of the source, every project header it includes, the CUTLASS headers'
version, nvcc's version and the flags. `load()` skips the calling test where nvcc or CUTLASS is missing
and fails it where the build requires the extension (SNIP_REQUIRE_EXT=1); a compile error always fails.

The entry points take torch tensors exactly as the ops receive them (their data pointers, sizes and
strides), so a test hands over what snip_ops.gemm_kernels.prepare_* returns, untouched.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

from native_build import cached_library, skip_or_fail

ROOT = Path(__file__).resolve().parent.parent
NATIVE = Path(__file__).resolve().parent / "native"
ARCH_GENCODE = {"sm90": "90a", "sm100": "100a"}
CACHE = Path(tempfile.gettempdir()) / "snip-cutlass-host-reference"


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("size0", ctypes.c_int64), ("size1", ctypes.c_int64),
                ("stride0", ctypes.c_int64), ("stride1", ctypes.c_int64)]


class _Operands(ctypes.Structure):
    _fields_ = [("a", _Tensor), ("sfa", _Tensor), ("b", _Tensor), ("sfb", _Tensor)]


def source(arch: str) -> Path:
    return NATIVE / f"cutlass_host_reference_{arch}.cu"


def _nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    candidate = Path(home) / "bin" / "nvcc"
    return str(candidate) if candidate.exists() else shutil.which("nvcc")


def _cutlass_root() -> Path | None:
    """CUTLASS's source tree, found as CMakeLists.txt finds it: the nvidia-cutlass wheel, else $CUTLASS_DIR."""
    try:
        import cutlass_library

        root = Path(cutlass_library.__file__).parent / "source"
    except ImportError:
        root = Path(os.environ["CUTLASS_DIR"]) if os.environ.get("CUTLASS_DIR") else None
    return root if root is not None and (root / "include" / "cutlass" / "version.h").exists() else None


def _project_sources(src: Path) -> list[Path]:
    """`src` and every project file it includes, transitively (quoted includes found next to the
    including file, in tests/native or in csrc/)."""
    seen: list[Path] = []
    todo = [src]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.append(path)
        for name in re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(), re.M):
            for base in (path.parent, NATIVE, ROOT / "csrc"):
                if (base / name).exists():
                    todo.append((base / name).resolve())
                    break
    return seen


def _flags(arch: str, cutlass: Path) -> list[str]:
    gencode = ARCH_GENCODE[arch]
    return ["-std=c++20", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr", f"-gencode=arch=compute_{gencode},code=sm_{gencode}",
            "-Xcompiler", "-fPIC,-fopenmp", "-shared", f"-I{ROOT / 'csrc'}", f"-I{cutlass / 'include'}",
            f"-I{cutlass / 'tools' / 'util' / 'include'}"]


def _build(arch: str) -> Path:
    nvcc, cutlass = _nvcc(), _cutlass_root()
    if nvcc is None or cutlass is None:
        skip_or_fail("CUTLASS's host reference needs nvcc and the CUTLASS headers (pip install nvidia-cutlass)")
    flags = _flags(arch, cutlass)
    nvcc_version = subprocess.run([nvcc, "--version"], check=True, capture_output=True, text=True).stdout
    key = b"".join(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes()
                   for path in sorted(_project_sources(source(arch))))
    key += (cutlass / "include" / "cutlass" / "version.h").read_bytes()
    # the flags as they read in any clone of this tree: another clone's build is as good as one of this
    key += "\0".join([nvcc_version, *(f.replace(str(ROOT), "<tree>") for f in flags)]).encode()

    def compile_to(out: Path) -> None:
        done = subprocess.run([nvcc, *flags, str(source(arch)), "-o", str(out)], capture_output=True, text=True)
        if done.returncode != 0:  # the errors, not CUTLASS's warnings around them
            errors = [line for line in done.stderr.splitlines() if "error" in line]
            pytest.fail(f"nvcc failed on {source(arch).name}:\n" + "\n".join(errors[:30] or [done.stderr[-4000:]]))

    # One build at a time per arch (a build takes ~1 min and ~2.5 GB); others wait, then reuse it.
    return cached_library(f"cutlass_host_reference_{arch}", key, compile_to, CACHE)


class HostReference:
    """One arch's library: its kernel variants, their can_implement and the host reference GEMM."""

    def __init__(self, lib: ctypes.CDLL):
        self._lib = lib
        for name in ("snip_ref_variant_name", "snip_ref_variant_type", "snip_ref_variant_describe"):
            getattr(lib, name).restype = ctypes.c_char_p
            getattr(lib, name).argtypes = [ctypes.c_int]
        lib.snip_ref_can_implement.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                               ctypes.POINTER(_Operands)]
        lib.snip_ref_gemm.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                      ctypes.POINTER(_Operands), ctypes.c_void_p, ctypes.c_void_p]
        self.variants: dict[str, dict[str, str]] = {}
        self.types: dict[str, str] = {}
        for i in range(lib.snip_ref_variant_count()):
            name = lib.snip_ref_variant_name(i).decode()
            self.types[name] = lib.snip_ref_variant_type(i).decode()
            self.variants[name] = dict(kv.split("=") for kv in lib.snip_ref_variant_describe(i).decode().split())

    def _check(self, variant: str) -> bytes:
        if variant not in self.variants:
            raise KeyError(f"no host reference for kernel variant {variant!r}; add it to the table in its "
                           f"tests/native/cutlass_host_reference_<arch>.cu (known: {', '.join(self.variants)})")
        return variant.encode()

    def can_implement(self, variant: str, m: int, n: int, k: int, a, sfa, b, sfb) -> int:
        """cutlass::Status of GemmUniversalAdapter::can_implement (0: success) for the Arguments the op
        would build from these tensors (their data is not read)."""
        ops = _operands(a, sfa, b, sfb)
        return self._lib.snip_ref_can_implement(self._check(variant), m, n, k, ctypes.byref(ops))

    def gemm(self, variant: str, m: int, n: int, k: int, a, sfa, b, sfb, alpha=None) -> torch.Tensor:
        """FP32 [m, n]: the kernel's D (alpha * A.B^T with block scales, rounded to its output type),
        computed by CUTLASS's host reference from these CPU tensors read through the kernel's
        Arguments. Raises if can_implement refuses them."""
        ops = _operands(a, sfa, b, sfb)
        out = torch.empty(m, n, dtype=torch.float32)
        alpha_t = None if alpha is None else alpha.detach().to(torch.float32).reshape(1).contiguous()
        status = self._lib.snip_ref_gemm(self._check(variant), m, n, k, ctypes.byref(ops),
                                         None if alpha_t is None else alpha_t.data_ptr(), out.data_ptr())
        if status != 0:
            raise ValueError(f"{variant}: can_implement refused M={m} N={n} K={k} (cutlass::Status {status})")
        return out


def _tensor(t: torch.Tensor) -> _Tensor:
    if t.device.type != "cpu" or t.dim() != 2:
        raise ValueError(f"the host reference reads 2-D CPU tensors, got {t.dim()}-D on {t.device}")
    return _Tensor(t.data_ptr(), t.shape[0], t.shape[1], t.stride(0), t.stride(1))


def _operands(a, sfa, b, sfb) -> _Operands:
    return _Operands(_tensor(a), _tensor(sfa), _tensor(b), _tensor(sfb))


_LOADED: dict[str, HostReference] = {}


def load(arch: str) -> HostReference:
    if arch not in _LOADED:
        _LOADED[arch] = HostReference(ctypes.CDLL(str(_build(arch))))
    return _LOADED[arch]
