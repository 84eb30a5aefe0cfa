"""The elementwise CUDA kernels (csrc/quant/quantize_rows.cu, quantize_tile.cu, quantize_amax.cu,
dequantize.cu, csrc/optim/adamw.cu) compiled from their own source as C++ against the host shim
(tests/native/cuda_host_shim.h) and run on the CPU through their real launchers, so that CPU tests
check the kernels' indexing, bounds, padding, vector-load choices and block / warp cooperation
against the PyTorch reference bit for bit.

`quantize`, `dequantize` and `adamw_` take CPU tensors and do what the ops' torch side does
(csrc/quant/quantize_op.cpp, dequantize_op.cpp, csrc/optim/adamw_op.cpp: output shapes and
allocation, kernel choice, the NVFP4 amax pass), then launch. Every buffer a kernel sees lies inside
a larger one (`Guarded`): around inputs, and between the rows of a strided input, 0xFF bytes (NaN),
so that a read outside the tensor brings NaN into the results; around outputs a fill pattern that
must survive the launch. Outputs start as garbage (torch.empty on a GPU) and shared memory as 0xFF
bytes, so nothing unwritten can pass for a result.

Needs a C++20 compiler and the CUDA headers; `load()` skips the calling test where either is
missing, and fails it where the build requires the extension (SNIP_REQUIRE_EXT=1, set by CI when
nvcc exists). Built once per source version into a cache directory, with -ffp-contract=off (no
fused a*b+c that the reference lacks) and -fno-strict-aliasing (the kernels reinterpret vectors as
nvcc allows).

With SNIP_HOST_SHIM_ASAN=1 the kernels are built with AddressSanitizer instead (a library of its
own), so that a kernel's read or write outside any buffer, or past the end of a tensor's allocation,
stops the test with a report: what a GPU would do silently, or not at all. The Python process must
then preload the sanitizer's runtime; scripts/asan_kernels.sh does it.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from native_build import cached_library, host_toolchain
from snip_ops.formats import QuantSpec, Rounding, ScaleKind

ROOT = Path(__file__).resolve().parent.parent
NATIVE = Path(__file__).parent / "native"
CSRC = ROOT / "csrc"
QUANT, OPTIM = CSRC / "quant", CSRC / "optim"
KERNELS = [QUANT / "quantize_rows.cu", QUANT / "quantize_tile.cu", QUANT / "quantize_amax.cu", QUANT / "dequantize.cu",
           QUANT / "e2m1_as_e4m3.cu", OPTIM / "adamw.cu"]
SHIM_HEADER = NATIVE / "cuda_host_shim.h"
HOST_SOURCES = [NATIVE / "cuda_host_shim.cpp", NATIVE / "kernels_capi.cpp"]
SELF_TEST = NATIVE / "cuda_host_shim_selftest.cu"
SOURCES = sorted({*KERNELS, *HOST_SOURCES, SELF_TEST, SHIM_HEADER, CSRC / "kernel_launch.cuh", *QUANT.glob("*.cuh"),
                  *QUANT.glob("*.h"), *OPTIM.glob("*.cuh"), *OPTIM.glob("*.h")})
COMMON_FLAGS = ["-std=c++20", "-O2", "-ffp-contract=off", "-fno-strict-aliasing", "-fPIC", "-Wall",
                "-DSNIP_WITH_CUDA=1", "-DSNIP_CUDA_HOST_SHIM"]
# Kernel sources: the shim ahead of everything, and the checks that stand in for GPU faults.
KERNEL_FLAGS = ["-include", str(SHIM_HEADER), "-fsanitize=alignment,null,bounds", "-Wno-unknown-pragmas", "-x", "c++"]
ASAN = os.environ.get("SNIP_HOST_SHIM_ASAN") == "1"
if ASAN:  # compile and link flags alike
    # _GLIBCXX_SANITIZE_VECTOR: a std::vector's capacity past its size (the shim's dynamic shared memory,
    # reused across launches) counts as outside it
    COMMON_FLAGS = [*COMMON_FLAGS, "-fsanitize=address", "-fno-omit-frame-pointer", "-D_GLIBCXX_SANITIZE_VECTOR"]

DTYPE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
ELEM = {"e4m3": 0, "e5m2": 1, "e2m1": 2}
SCALE_KIND = {ScaleKind.FP32: 0, ScaleKind.POW2: 1, ScaleKind.E8M0: 2, ScaleKind.NVFP4: 3}
CODES_DTYPE = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e2m1": torch.uint8}
SCALES_DTYPE = {ScaleKind.FP32: torch.float32, ScaleKind.POW2: torch.float32, ScaleKind.E8M0: torch.float8_e8m0fnu,
                ScaleKind.NVFP4: torch.float8_e4m3fn}


def _build(cxx: str, include: Path, lib: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="snip_cuda_host_"))
    try:
        flags = [cxx, *COMMON_FLAGS, f"-I{CSRC}", f"-I{include}"]
        jobs = [[*flags, "-c", *KERNEL_FLAGS, str(src), "-o", str(work / f"{src.stem}.o")]
                for src in [*KERNELS, SELF_TEST]]
        jobs += [[*flags, "-c", str(src), "-o", str(work / f"{src.stem}.o")] for src in HOST_SOURCES]
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            for r in pool.map(lambda cmd: subprocess.run(cmd, capture_output=True, text=True), jobs):
                if r.returncode != 0:
                    raise RuntimeError(f"building the host shim failed:\n{' '.join(r.args)}\n{r.stderr[-6000:]}")
        # -Bsymbolic: the kernels' cudaGetLastError is the shim's, even where torch has loaded libcudart.
        objects = sorted(str(o) for o in work.glob("*.o"))
        link = [cxx, "-shared", "-Wl,-z,defs", "-Wl,-Bsymbolic", *(COMMON_FLAGS if ASAN else []), *objects, "-o",
                str(lib)]
        r = subprocess.run(link, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"linking the host shim failed:\n{r.stderr[-6000:]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


_LIB: ctypes.CDLL | None = None


def load() -> ctypes.CDLL:
    global _LIB
    if _LIB is not None:
        return _LIB
    cxx, include = host_toolchain("the kernels' host shim needs a C++20 compiler and the CUDA headers")
    key = b"".join(p.read_bytes() for p in SOURCES) + f"{include} {COMMON_FLAGS}".encode()
    lib = cached_library("snip_cuda_host", key, lambda out: _build(cxx, include, out))
    _LIB = _declare(ctypes.CDLL(str(lib)))
    return _LIB


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    i32, i64, u64, ptr = ctypes.c_int, ctypes.c_int64, ctypes.c_uint64, ctypes.c_void_p
    output = [ptr, i64, i64, ptr, i64, i64, u64]  # codes, ld, inner_store, scales, nblk, mn_pitch, offset
    lib.snip_quantize.argtypes = [i32, ptr, i32, i64, i64, i64, i32, i32, i32, i32, i32, u64, *output, *output, i32,
                                  ptr, ptr, i64]
    lib.snip_quantize_tensor_amax.argtypes = [ptr, i32, i64, i64, i64, ptr]
    lib.snip_quantize_tensor_amax_hadamard.argtypes = [ptr, i32, i64, i64, i64, ctypes.c_uint32, ptr]
    lib.snip_dequantize.argtypes = [ptr, i64, ptr, i64, ptr, i32, i32, i32, i32, i64, i64, ptr, i32]
    lib.snip_e2m1_as_e4m3.argtypes = [ptr, i64, i64, i64, ptr, i64, i64, i64]
    lib.snip_adamw_blocks.argtypes = [i64, i64]
    lib.snip_adamw_blocks.restype = i64
    lib.snip_adamw.argtypes = [ptr, ptr, i32, i64, ptr, u64, i32, i32, i32]
    lib.snip_cuda_host_error.restype = ctypes.c_char_p
    lib.snip_cuda_host_skip_barriers.argtypes = [i32]
    lib.snip_cuda_host_selftest.argtypes = [ctypes.c_char_p, i32, ptr]
    return lib


class LaunchError(RuntimeError):
    """A launch the shim failed (what would fault or hang on a GPU), or a launcher's error."""


def check_launch(lib: ctypes.CDLL, rc: int) -> None:
    if rc != 0:
        raise LaunchError(f"cudaError {rc}: {lib.snip_cuda_host_error().decode()}")


# ---- guarded buffers ----

_MARGIN = 512     # bytes of poison on each side
_ALIGN = 256      # the CUDA caching allocator's alignment: fresh outputs start there
_POISON = 0xFF    # NaN in every floating input type
_GARBAGE = 0xA5   # what fresh outputs hold (torch.empty on a GPU holds anything)


class Guarded:
    """A non-empty tensor of at most 2 dimensions, unit inner stride, placed at byte `phase` modulo
    256 inside a byte buffer whose other bytes (margins, gaps between rows) hold `fill`."""

    def __init__(self, shape, row_stride, dtype, phase, fill):
        self.es = torch.empty((), dtype=dtype).element_size()
        self.rows, self.cols = (shape[0], shape[1]) if len(shape) == 2 else (1, shape[0] if shape else 1)
        self.ld = row_stride if len(shape) == 2 else self.cols
        assert self.rows and self.cols, "an empty tensor has no buffer to guard"
        span = ((self.rows - 1) * self.ld + self.cols) * self.es
        self.buf = torch.full((span + 2 * _MARGIN + _ALIGN,), fill, dtype=torch.uint8)
        self.start = _MARGIN + (phase - self.buf.data_ptr() - _MARGIN) % _ALIGN
        self.end, self.fill = self.start + span, fill
        flat = self.buf[self.start:self.end].view(dtype)
        strides = (row_stride, 1)[2 - len(shape):]
        self.tensor = flat.as_strided(shape, strides)

    @classmethod
    def copy_of(cls, t: torch.Tensor) -> "Guarded":
        """`t` with its row stride and address phase; the elements between its rows are poison too."""
        assert t.dim() <= 2 and (t.dim() == 0 or t.stride(-1) == 1 or t.shape[-1] <= 1)
        g = cls(tuple(t.shape), t.stride(0) if t.dim() == 2 else 1, t.dtype, t.data_ptr() % _ALIGN, _POISON)
        g.tensor.copy_(t)
        return g

    @classmethod
    def output(cls, shape, dtype, zero=False) -> "Guarded":
        g = cls(tuple(shape), shape[1] if len(shape) == 2 else 1, dtype, 0, _GARBAGE)
        if zero:
            g.buf[g.start:g.end] = 0
        return g

    def check(self, what: str) -> None:
        gaps = [self.buf[:self.start], self.buf[self.end:]]
        if self.rows > 1 and self.ld > self.cols:
            rows = self.buf[self.start:self.start + (self.rows - 1) * self.ld * self.es]
            gaps.append(rows.view(self.rows - 1, self.ld * self.es)[:, self.cols * self.es:])
        if not all(bool((g == self.fill).all()) for g in gaps):
            raise AssertionError(f"{what}: the kernel wrote outside the tensor")


# ---- the ops' torch side (csrc/quant/quantize_op.cpp, dequantize_op.cpp, csrc/optim/adamw_op.cpp) ----


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


SCALE_LAYOUT = {"plain": 0, "blackwell": 1, "hopper": 2}  # quant::ScaleLayout


def _shapes(spec: QuantSpec, outer: int, inner: int, pad: int, scale_layout: str):
    bo, bi = spec.block
    inner_store = _ceil_div(inner, pad) * pad
    width = _ceil_div(inner_store, 2) if spec.element.name == "e2m1" else inner_store
    nblk = _ceil_div(inner_store, bi)
    scales = {"plain": (_ceil_div(outer, bo), nblk),
              "blackwell": (_ceil_div(outer, 128) * 128, _ceil_div(nblk, 4) * 4),
              "hopper": (nblk, _ceil_div(_ceil_div(outer, bo), 4) * 4)}[scale_layout]
    return (outer, width), scales, inner_store, nblk


def quantize(x: torch.Tensor, spec: QuantSpec, rowwise=True, colwise=False, seed=0, offset=0, offset_t=0,
             tensor_amax=None, scale_layout="plain", pad=1, hadamard_signs=-1):
    """snip_C::quantize on the CPU: (codes, scales, codes_t, scales_t, tensor_scale), each the op's
    shape and dtype; unrequested outputs are empty. hadamard_signs >= 0: the column output of T x,
    transformed inside the CUDA kernels (the op's CUDA path)."""
    lib = load()
    rows, cols = x.shape
    hadamard = hadamard_signs >= 0
    rows_t = _ceil_div(rows, 16) * 16 if hadamard else rows  # T x's rows: x's padded to whole groups
    assert x.stride(1) == 1 and (rowwise or colwise)  # empty inputs launch nothing: the op's torch side
    nvfp4 = spec.scale == ScaleKind.NVFP4
    xg = Guarded.copy_of(x)
    outputs = [(on, *_shapes(spec, outer, inner, pad, scale_layout), off)
               for on, outer, inner, off in ((rowwise, rows, cols, offset), (colwise, cols, rows_t, offset_t))]
    # Padded scale layouts start as zeros (finite padding) where an output's real blocks leave some uncovered.
    zero_sf = any(on and (scale_layout == "blackwell" and (shape[0] % 128 != 0 or nblk % 4 != 0)
                          or scale_layout == "hopper" and _ceil_div(shape[0], spec.block[0]) % 4 != 0)
                  for on, shape, _, _, nblk, _ in outputs)
    guarded, args = [], []
    for on, codes_shape, scales_shape, inner_store, nblk, off in outputs:
        if not on:
            guarded.append(None)
            args += [None, 0, 0, None, 0, 0, 0]
            continue
        codes = Guarded.output(codes_shape, CODES_DTYPE[spec.element.name])
        scales = Guarded.output(scales_shape, SCALES_DTYPE[spec.scale], zero=zero_sf)
        guarded.append((codes, scales))
        args += [codes.tensor.data_ptr(), codes.tensor.stride(0), inner_store, scales.tensor.data_ptr(), nblk,
                 scales_shape[1] if scale_layout == "hopper" else 0, off % 2**64]
    amax = ts = None
    if nvfp4:
        ts = Guarded.output((), torch.float32)
        if tensor_amax is not None:
            amax = Guarded.copy_of(torch.as_tensor(tensor_amax, dtype=torch.float32).reshape(()))
        else:
            amax = Guarded.output((), torch.float32, zero=True)
            if hadamard:
                check_launch(lib, lib.snip_quantize_tensor_amax_hadamard(
                    xg.tensor.data_ptr(), DTYPE[x.dtype], rows, cols, x.stride(0), hadamard_signs,
                    amax.tensor.data_ptr()))
            else:
                check_launch(lib, lib.snip_quantize_tensor_amax(xg.tensor.data_ptr(), DTYPE[x.dtype], rows, cols,
                                                                x.stride(0), amax.tensor.data_ptr()))
    tile = colwise or spec.block[0] != 1
    check_launch(lib, lib.snip_quantize(
        tile, xg.tensor.data_ptr(), DTYPE[x.dtype], rows, cols, x.stride(0), ELEM[spec.element.name], spec.block[0],
        spec.block[1], SCALE_KIND[spec.scale], spec.rounding == Rounding.SR, seed % 2**64, *args, SCALE_LAYOUT[scale_layout],
        amax.tensor.data_ptr() if nvfp4 else None, ts.tensor.data_ptr() if nvfp4 else None, hadamard_signs))
    out = []
    for name, g in zip(("codes", "codes_t"), guarded):
        if g is None:
            out += [torch.empty(0, dtype=CODES_DTYPE[spec.element.name]),
                    torch.empty(0, dtype=SCALES_DTYPE[spec.scale])]
            continue
        for part, what in zip(g, (name, f"scales of {name}")):
            part.check(what)
        out += [g[0].tensor, g[1].tensor]
    for g in (xg, amax, ts):
        if g is not None:
            g.check("input or tensor scale")
    out.append(ts.tensor if nvfp4 else torch.empty(0, dtype=torch.float32))
    return tuple(out)


def tensor_amax(x: torch.Tensor) -> float:
    """NVFP4's amax pass alone (quantize_amax.cu) on x in place (its row stride and address phase):
    max |x| with NaN as Inf, 0.0 for an all-zero x."""
    lib = load()
    xg = Guarded.copy_of(x)
    amax = Guarded.output((), torch.float32, zero=True)
    check_launch(lib, lib.snip_quantize_tensor_amax(xg.tensor.data_ptr(), DTYPE[x.dtype], x.shape[0], x.shape[1],
                                                    x.stride(0), amax.tensor.data_ptr()))
    xg.check("input")
    amax.check("amax")
    return float(amax.tensor)


def e2m1_as_e4m3(codes: torch.Tensor, cols: int, rows_out: int, cols_out: int, out_phase: int = 0) -> torch.Tensor:
    """snip_C::e2m1_as_e4m3 on the CPU: [rows_out, cols_out] E4M3 bytes (uint8); `out_phase` places the
    output off the allocator's alignment (the kernel's byte-store path)."""
    lib = load()
    cg = Guarded.copy_of(codes)
    out = Guarded((rows_out, cols_out), cols_out, torch.uint8, out_phase, _GARBAGE)
    check_launch(lib, lib.snip_e2m1_as_e4m3(cg.tensor.data_ptr(), codes.stride(0), codes.shape[0], cols,
                                            out.tensor.data_ptr(), cols_out, rows_out, cols_out))
    out.check("E4M3 codes")
    cg.check("input")
    return out.tensor


def dequantize(codes: torch.Tensor, scales: torch.Tensor, tensor_scale, spec: QuantSpec, cols: int,
               dtype: torch.dtype) -> torch.Tensor:
    """snip_C::dequantize on the CPU."""
    lib = load()
    cg, sg = Guarded.copy_of(codes), Guarded.copy_of(scales)
    tg = Guarded.copy_of(tensor_scale.reshape(())) if tensor_scale is not None else None
    out = Guarded.output((codes.shape[0], cols), dtype)
    check_launch(lib, lib.snip_dequantize(
        cg.tensor.data_ptr(), codes.stride(0), sg.tensor.data_ptr(), scales.stride(0),
        tg.tensor.data_ptr() if tg is not None else None, ELEM[spec.element.name], spec.block[0], spec.block[1],
        SCALE_KIND[spec.scale], codes.shape[0], cols, out.tensor.data_ptr(), dtype == torch.bfloat16))
    out.check("dequantized output")
    for g in (cg, sg, tg):
        if g is not None:
            g.check("input")
    return out.tensor


def adamw_(params, grads, exp_avgs, exp_avg_sqs, param_indices, index_bases, decay, beta1, one_minus_beta1, beta2,
           one_minus_beta2, inv_bias_correction2_sqrt, step_size, eps, step, seed, bf16_sr) -> None:
    """snip_C::adamw_ on the CPU through the CUDA kernel (not the op's own host loop), in place."""
    lib = load()
    n = len(params)
    tensors = list(zip(params, grads, exp_avgs, exp_avg_sqs))
    guarded = [[Guarded.copy_of(t) for t in group] for group in tensors]
    slots = torch.zeros(n, 8, dtype=torch.int64)  # TensorSlot: 8 fields of 8 bytes
    block_start = torch.zeros(n + 1, dtype=torch.int64)
    for i, g in enumerate(guarded):
        ptrs = [t.tensor.data_ptr() for t in g]
        vector_ok = index_bases[i] % 8 == 0 and all(p % 16 == 0 for p in ptrs)  # as adamw_op.cpp
        offset = (step << 32) | (param_indices[i] << 2)
        slots[i] = torch.tensor([*ptrs, params[i].numel(), index_bases[i], offset - (offset >> 63 << 64),
                                 int(vector_ok)])
        block_start[i + 1] = block_start[i] + lib.snip_adamw_blocks(params[i].numel(), index_bases[i])
    scalars = torch.tensor([decay, beta1, one_minus_beta1, beta2, one_minus_beta2, inv_bias_correction2_sqrt,
                            step_size, eps], dtype=torch.float32)
    num_blocks = int(block_start[n])
    check_launch(lib, lib.snip_adamw(slots.data_ptr(), block_start.data_ptr(), n, num_blocks, scalars.data_ptr(),
                                     seed % 2**64, params[0].dtype == torch.bfloat16,
                                     exp_avgs[0].dtype == torch.bfloat16, bf16_sr))
    for group, g in zip(tensors, guarded):
        for name, t, copy in zip(("param", "grad", "exp_avg", "exp_avg_sq"), group, g):
            copy.check(name)
            if name != "grad":
                t.copy_(copy.tensor)
