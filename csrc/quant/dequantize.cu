// Dequantization: codes x block scale (x NVFP4 tensor scale) -> float32 or bfloat16, exactly
// snip_ops.reference.dequantize (then .to(bfloat16) for bf16 output). The FP4-on-Hopper GEMMs run
// as dequantize + BF16/FP32 GEMM; tests use it too. A thread per 8 consecutive elements of a row
// (8 FP8 bytes or 4 FP4 bytes in, one scale, 32 / 16 bytes out).
#include "kernel_launch.cuh"
#include "quant/quant_io.cuh"

namespace snip::quant {
namespace {

constexpr int kThreads = 256;
constexpr int kRun = 8;

template <Elem E, bool kBF16>
__global__ void __launch_bounds__(kThreads)
dequantize_kernel(const uint8_t* __restrict__ codes, int64_t ld, const void* __restrict__ scales, int64_t lds,
                  const float* __restrict__ tensor_scale, Spec spec, int64_t rows, int64_t cols,
                  void* __restrict__ out, bool vec_out) {
  constexpr Format F = format_of(E);
  constexpr int kBits = kCodeBits<E>;
  const int64_t runs_per_row = (cols + kRun - 1) / kRun;
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= rows * runs_per_row) return;
  const int64_t r = t / runs_per_row, c0 = t % runs_per_row * kRun;
  const float ts = spec.scale == ScaleKind::kNVFP4 ? *tensor_scale : 1.0f;
  // A run of 8 never crosses a block: blocks along a row are multiples of 16 elements.
  const float s = scale_value(scales, r / spec.block_rows * lds + c0 / spec.block_cols, spec.scale, ts);

  const uint8_t* src = codes + r * ld + c0 * kBits / 8;
  float y[kRun];
#pragma unroll
  for (int i = 0; i < kRun; ++i) {
    uint32_t c = 0;
    if (c0 + i < cols) c = kBits == 8 ? src[i] : (src[i / 2] >> (4 * (i % 2))) & 0xF;
    y[i] = mul_rn(decode(c, F), s);
  }
  if constexpr (kBF16) {
    __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(out) + r * cols + c0;
    if (vec_out && c0 + kRun <= cols) {
      uint4 pack;
      __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(&pack);
#pragma unroll
      for (int i = 0; i < kRun / 2; ++i) p[i] = __floats2bfloat162_rn(y[2 * i], y[2 * i + 1]);
      *reinterpret_cast<uint4*>(dst) = pack;
    } else {
      for (int i = 0; i < kRun && c0 + i < cols; ++i) dst[i] = __float2bfloat16_rn(y[i]);
    }
  } else {
    float* dst = static_cast<float*>(out) + r * cols + c0;
    if (vec_out && c0 + kRun <= cols) {
      reinterpret_cast<float4*>(dst)[0] = make_float4(y[0], y[1], y[2], y[3]);
      reinterpret_cast<float4*>(dst)[1] = make_float4(y[4], y[5], y[6], y[7]);
    } else {
      for (int i = 0; i < kRun && c0 + i < cols; ++i) dst[i] = y[i];
    }
  }
}

template <Elem E>
cudaError_t launch(const void* codes, int64_t ld, const void* scales, int64_t lds, const float* ts, const Spec& spec,
                   int64_t rows, int64_t cols, void* out, bool bf16, cudaStream_t stream) {
  const int64_t threads = rows * ((cols + kRun - 1) / kRun);
  const int64_t ctas = (threads + kThreads - 1) / kThreads;
  if (ctas > 0x7FFFFFFF) return cudaErrorInvalidValue;
  // Output rows are contiguous: vector stores when every row starts 16-byte aligned.
  const bool vec = reinterpret_cast<uintptr_t>(out) % 16 == 0 && (cols * (bf16 ? 2 : 4)) % 16 == 0;
  const uint8_t* c = static_cast<const uint8_t*>(codes);
  if (bf16)
    launch_kernel(dequantize_kernel<E, true>, unsigned(ctas), kThreads, 0, stream, c, ld, scales, lds, ts, spec, rows,
                  cols, out, vec);
  else
    launch_kernel(dequantize_kernel<E, false>, unsigned(ctas), kThreads, 0, stream, c, ld, scales, lds, ts, spec, rows,
                  cols, out, vec);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_dequantize(const void* codes, int64_t ld, const void* scales, int64_t lds, const float* tensor_scale,
                              const Spec& spec, int64_t rows, int64_t cols, void* out, bool out_bf16,
                              cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  if (spec.block_cols % kRun != 0 || spec.block_rows < 1) return cudaErrorInvalidValue;
  switch (spec.elem) {
    case Elem::kE4M3: return launch<Elem::kE4M3>(codes, ld, scales, lds, tensor_scale, spec, rows, cols, out, out_bf16, stream);
    case Elem::kE5M2: return launch<Elem::kE5M2>(codes, ld, scales, lds, tensor_scale, spec, rows, cols, out, out_bf16, stream);
    case Elem::kE2M1: return launch<Elem::kE2M1>(codes, ld, scales, lds, tensor_scale, spec, rows, cols, out, out_bf16, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace snip::quant
