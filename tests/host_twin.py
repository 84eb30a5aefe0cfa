"""The quantizer kernels' arithmetic (csrc/quant/quant_math.cuh) compiled for the host and loaded with
ctypes, so that CPU tests run the kernels' own source against the PyTorch reference.

Needs a C++ compiler and the CUDA headers (cuda_fp8.h, cuda_fp4.h): `load()` skips the calling test
where either is missing (a machine without the CUDA toolkit), and fails it where the build requires the
extension (SNIP_REQUIRE_EXT=1, set by CI when nvcc exists). Compiled once per source version into a cache directory, with
`-ffp-contract=off` as the extension's host code is (no fused a*b+c that the reference lacks), and
OpenMP over the elements (exhaustive checks run 2^32 of them).
"""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import numpy as np

from native_build import cached_library, host_toolchain

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [Path(__file__).parent / "native" / "quant_math_capi.cpp", ROOT / "csrc" / "quant" / "quant_math.cuh",
           ROOT / "csrc" / "quant" / "quantize.h", ROOT / "csrc" / "optim" / "adamw_math.cuh",
           ROOT / "csrc" / "optim" / "adamw.h"]
ELEM = {"e4m3": 0, "e5m2": 1, "e2m1": 2}
SCALE_KIND = {"fp32": 0, "pow2": 1, "e8m0": 2, "nvfp4": 3}


def load() -> ctypes.CDLL:
    cxx, include = host_toolchain("the host twin needs a C++ compiler and the CUDA headers (cuda_fp8.h)")

    def build(out: Path) -> None:
        cmd = [cxx, "-O2", "-march=native", "-std=c++17", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC", f"-I{ROOT / 'csrc'}",
               f"-I{include}", str(SOURCES[0]), "-o", str(out)]
        subprocess.run(cmd, check=True, capture_output=True)

    key = b"".join(p.read_bytes() for p in SOURCES) + str(include).encode()
    return ctypes.CDLL(str(cached_library("snip_quant_math", key, build)))


def block_scales(lib: ctypes.CDLL, amax_bits: np.ndarray, kind: str, elem: str, tensor_scale: float = 1.0):
    """(float32 element scales, stored bits as uint32) of `block_scale` for each amax bit pattern."""
    amax_bits = np.ascontiguousarray(amax_bits, dtype=np.uint32)
    scale = np.empty(amax_bits.shape, np.float32)
    stored = np.empty(amax_bits.shape, np.uint32)
    ptr = np.ctypeslib.ndpointer
    lib.snip_block_scales.argtypes = [ptr(np.uint32), ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_float,
                                      ptr(np.float32), ptr(np.uint32)]
    lib.snip_block_scales(amax_bits, amax_bits.size, SCALE_KIND[kind], ELEM[elem], tensor_scale, scale, stored)
    return scale, stored


def round_to_codes(lib: ctypes.CDLL, bits: np.ndarray, elem: str, rand: np.ndarray | None = None):
    """(codes as uint32, decoded float32 values) of `round_to_code` for each float32 bit pattern;
    stochastic rounding with one 16-bit random value per element when `rand` is given."""
    bits = np.ascontiguousarray(bits, dtype=np.uint32)
    codes = np.empty(bits.shape, np.uint32)
    values = np.empty(bits.shape, np.float32)
    ptr = np.ctypeslib.ndpointer
    lib.snip_round_to_codes.argtypes = [ptr(np.uint32), ctypes.c_int64, ctypes.c_int, ctypes.c_void_p,
                                        ptr(np.uint32), ptr(np.float32)]
    w = None if rand is None else np.ascontiguousarray(rand, dtype=np.uint32)
    lib.snip_round_to_codes(bits, bits.size, ELEM[elem], None if w is None else w.ctypes.data, codes, values)
    return codes, values


def add_rz(lib: ctypes.CDLL, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float32 `add_rz(a, b)` (the sum rounded toward zero) of each pair."""
    a, b = (np.ascontiguousarray(t, dtype=np.float32) for t in (a, b))
    out = np.empty(a.shape, np.float32)
    ptr = np.ctypeslib.ndpointer
    lib.snip_add_rz.argtypes = [ptr(np.float32), ptr(np.float32), ctypes.c_int64, ptr(np.float32)]
    lib.snip_add_rz(a, b, a.size, out)
    return out


def bf16_round(lib: ctypes.CDLL, bits: np.ndarray, rand: np.ndarray | None = None) -> np.ndarray:
    """uint16 BF16 bits of AdamW's write-back of each float32 bit pattern: `bf16_sr` with one 16-bit random
    value per element when `rand` is given, else `bf16_rne`."""
    bits = np.ascontiguousarray(bits, dtype=np.uint32)
    out = np.empty(bits.shape, np.uint16)
    ptr = np.ctypeslib.ndpointer
    lib.snip_bf16_round.argtypes = [ptr(np.uint32), ctypes.c_int64, ctypes.c_void_p, ptr(np.uint16)]
    w = None if rand is None else np.ascontiguousarray(rand, dtype=np.uint32)
    lib.snip_bf16_round(bits, bits.size, None if w is None else w.ctypes.data, out)
    return out


def nvfp4_tensor_scales(lib: ctypes.CDLL, amax_bits: np.ndarray) -> np.ndarray:
    """float32 `nvfp4_tensor_scale` of each tensor amax bit pattern."""
    amax_bits = np.ascontiguousarray(amax_bits, dtype=np.uint32)
    out = np.empty(amax_bits.shape, np.float32)
    ptr = np.ctypeslib.ndpointer
    lib.snip_nvfp4_tensor_scales.argtypes = [ptr(np.uint32), ctypes.c_int64, ptr(np.float32)]
    lib.snip_nvfp4_tensor_scales(amax_bits, amax_bits.size, out)
    return out


def decode(lib: ctypes.CDLL, codes: np.ndarray, elem: str) -> np.ndarray:
    """float32 values of `decode` for each code."""
    codes = np.ascontiguousarray(codes, dtype=np.uint32)
    out = np.empty(codes.shape, np.float32)
    ptr = np.ctypeslib.ndpointer
    lib.snip_decode.argtypes = [ptr(np.uint32), ctypes.c_int64, ctypes.c_int, ptr(np.float32)]
    lib.snip_decode(codes, codes.size, ELEM[elem], out)
    return out


def check_quotients(lib: ctypes.CDLL, sig_bits: int) -> tuple[int, float, float]:
    """(mismatches, first x, first s) of the kernels' per-block `quotient` against IEEE division over
    every x in [1, 2) with `sig_bits` significand bits and every float32 s in [1, 2)."""
    fx, fs = ctypes.c_uint32(), ctypes.c_uint32()
    lib.snip_check_quotients.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32)]
    lib.snip_check_quotients.restype = ctypes.c_int64
    bad = lib.snip_check_quotients(sig_bits, ctypes.byref(fx), ctypes.byref(fs))
    as_float = lambda u: float(np.array([u.value], np.uint32).view(np.float32)[0])
    return int(bad), as_float(fx), as_float(fs)


def quotient(lib: ctypes.CDLL, x: float, s: float) -> np.float32:
    """The kernels' `quotient(x, divisor_of(s))` of one element."""
    lib.snip_quotient.argtypes = [ctypes.c_float, ctypes.c_float]
    lib.snip_quotient.restype = ctypes.c_float
    return np.float32(lib.snip_quotient(x, s))
