// FP8 E4M3 quantization with one FP32 scale per 1x128 block of a row (DeepSeek-V3 / SNIP recipe).
// Bit-identical to snip_ops.reference.quantize(x, QuantSpec(E4M3, block=(1, 128), FP32|POW2, RNE)).
//
// Work split: a "group" of 8 consecutive threads owns one 128-element block, each thread 16
// consecutive elements, so a warp covers 4 blocks and a 256-thread CTA 32 blocks (rows follow
// each other in the flat block index). Each thread moves 16-byte vectors (2 for bf16/fp16, 4 for
// fp32 in, 1 out); the block amax is reduced with 3 xor-shuffles inside the group.
// Memory-bound by design: per element one load, one IEEE divide, one cvt, one store.
#include "quant/fp8_quantize_1x128.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace snip {
namespace {

constexpr int kBlock = 128;
constexpr int kPerThread = 16;
constexpr int kGroup = kBlock / kPerThread;  // threads per 128-block
constexpr int kThreads = 256;
constexpr int kBlocksPerCta = kThreads / kGroup;
constexpr float kE4M3Max = 448.0f;
constexpr uint32_t kAbsMask = 0x7FFFFFFFu;
constexpr uint32_t kInfBits = 0x7F800000u;

template <typename T> struct Elem;
template <> struct Elem<float> {
  __device__ static float f32(float v) { return v; }
};
template <> struct Elem<__half> {
  __device__ static float f32(__half v) { return __half2float(v); }
};
template <> struct Elem<__nv_bfloat16> {
  __device__ static float f32(__nv_bfloat16 v) { return __bfloat162float(v); }
};

// kVec: rows are 16-element aligned (K % 16 == 0, 16-byte aligned base), so every thread's chunk
// is either fully inside the row or fully past its end and can be moved with 16-byte accesses.
template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads)
fp8_quantize_1x128_kernel(const T* __restrict__ x, uint8_t* __restrict__ codes,
                          float* __restrict__ scales, int64_t M, int64_t K, int64_t nblk,
                          bool pow2_scale) {
  const int64_t block = int64_t(blockIdx.x) * kBlocksPerCta + threadIdx.x / kGroup;
  const int sub = threadIdx.x % kGroup;
  const bool live = block < M * nblk;  // no early return: the whole warp must shuffle
  const int64_t row = live ? block / nblk : 0;
  const int64_t col0 = (live ? block % nblk : 0) * kBlock + sub * kPerThread;
  const int64_t base = row * K + col0;

  float v[kPerThread];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) v[i] = 0.0f;  // missing elements count as zeros
  if (live && col0 < K) {
    if constexpr (kVec) {
      constexpr int kPerVec = 16 / sizeof(T);
#pragma unroll
      for (int j = 0; j < kPerThread / kPerVec; ++j) {
        const uint4 raw = reinterpret_cast<const uint4*>(x + base)[j];
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int i = 0; i < kPerVec; ++i) v[j * kPerVec + i] = Elem<T>::f32(e[i]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kPerThread; ++i)
        if (col0 + i < K) v[i] = Elem<T>::f32(x[base + i]);
    }
  }

  // amax on |x| bit patterns: for non-negative floats integer order == float order, and clamping
  // NaN patterns to Inf makes "any NaN/Inf in the block" simply "amax >= Inf".
  uint32_t amax = 0;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) amax = max(amax, min(__float_as_uint(v[i]) & kAbsMask, kInfBits));
#pragma unroll
  for (int m = kGroup / 2; m > 0; m /= 2) amax = max(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, m));

  const bool finite = amax < kInfBits;
  float scale;
  if (!finite) {
    scale = __uint_as_float(0x7FC00000u);  // NaN scale, all codes 0: never silently finite
  } else if (amax == 0) {
    scale = 1.0f;
  } else {
    scale = __fdiv_rn(__uint_as_float(amax), kE4M3Max);
    // amax < 448 * 2^-150 underflows to a zero scale, which would turn the finite block into
    // Inf/NaN: use the smallest subnormal instead (the reference does the same).
    if (scale == 0.0f) scale = __uint_as_float(1u);
    if (pow2_scale) {  // round the scale up to a power of two on its bit pattern
      uint32_t bits = __float_as_uint(scale);
      if (bits & 0x7FFFFFu) bits = (bits + 0x7FFFFFu) & 0xFF800000u;
      scale = __uint_as_float(bits);
    }
  }
  if (live && sub == 0) scales[block] = scale;
  if (!live || col0 >= K) return;

  // True IEEE division (not x * (1/scale)), then RNE + saturating cast; the cast keeps -0.0 as 0x80.
  uint32_t packed[kPerThread / 4];
#pragma unroll
  for (int i = 0; i < kPerThread / 4; ++i) {
    uint32_t w = 0;
    if (finite) {
      const float2 lo = make_float2(__fdiv_rn(v[4 * i + 0], scale), __fdiv_rn(v[4 * i + 1], scale));
      const float2 hi = make_float2(__fdiv_rn(v[4 * i + 2], scale), __fdiv_rn(v[4 * i + 3], scale));
      w = uint32_t(__nv_cvt_float2_to_fp8x2(lo, __NV_SATFINITE, __NV_E4M3)) |
          (uint32_t(__nv_cvt_float2_to_fp8x2(hi, __NV_SATFINITE, __NV_E4M3)) << 16);
    }
    packed[i] = w;
  }
  if constexpr (kVec) {
    *reinterpret_cast<uint4*>(codes + base) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  } else {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i)
      if (col0 + i < K) codes[base + i] = uint8_t(packed[i / 4] >> (8 * (i % 4)));
  }
}

template <typename T>
cudaError_t launch(const void* x, uint8_t* codes, float* scales, int64_t M, int64_t K, bool pow2,
                   cudaStream_t stream) {
  const int64_t nblk = (K + kBlock - 1) / kBlock;
  const int64_t ctas = (M * nblk + kBlocksPerCta - 1) / kBlocksPerCta;
  if (ctas > 0x7FFFFFFF) return cudaErrorInvalidValue;
  const bool vec = K % kPerThread == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(codes) % 16 == 0;
  const T* xp = static_cast<const T*>(x);
  if (vec)
    fp8_quantize_1x128_kernel<T, true><<<unsigned(ctas), kThreads, 0, stream>>>(xp, codes, scales, M, K, nblk, pow2);
  else
    fp8_quantize_1x128_kernel<T, false><<<unsigned(ctas), kThreads, 0, stream>>>(xp, codes, scales, M, K, nblk, pow2);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_fp8_quantize_1x128(const void* x, InputDType dtype, uint8_t* codes, float* scales,
                                      int64_t M, int64_t K, bool pow2_scale, cudaStream_t stream) {
  switch (dtype) {
    case InputDType::kFloat32: return launch<float>(x, codes, scales, M, K, pow2_scale, stream);
    case InputDType::kFloat16: return launch<__half>(x, codes, scales, M, K, pow2_scale, stream);
    case InputDType::kBFloat16: return launch<__nv_bfloat16>(x, codes, scales, M, K, pow2_scale, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace snip
