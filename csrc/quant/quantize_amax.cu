// max |x| over a whole tensor: the first of NVFP4's two passes (its FP32 tensor scale needs the
// tensor amax before any block can be scaled), skipped when the caller passes an amax.
// A thread per 8 consecutive elements of a row (one 16-byte vector for 16-bit inputs), a warp
// reduction, one atomicMax per warp on the float bits (integer order is float order for |x|).
#include <algorithm>

#include "kernel_launch.cuh"
#include "quant/hadamard.cuh"
#include "quant/quant_io.cuh"

namespace snip::quant {
namespace {

constexpr int kThreads = 256;
constexpr int kRun = 8;

template <typename T>
__global__ void __launch_bounds__(kThreads)
quantize_tensor_amax_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t ld, bool vec,
                            uint32_t* __restrict__ amax) {
  const int64_t runs_per_row = (cols + kRun - 1) / kRun;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  uint32_t m = 0;
  for (int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x; t < rows * runs_per_row; t += stride) {
    Run<T, kRun> v;
    load_run(v, x + (t / runs_per_row) * ld, (t % runs_per_row) * kRun, cols, vec);
#pragma unroll
    for (int i = 0; i < kRun; ++i) m = max(m, abs_bits(v[i]));
  }
#pragma unroll
  for (int s = 16; s > 0; s /= 2) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, s));
  if (threadIdx.x % 32 == 0 && m != 0) atomicMax(amax, m);
}

// The same for T x (hadamard.cuh): a thread per column of a 16-row group (adjacent threads take adjacent
// columns, so each of the 16 loads is coalesced), the group transformed in registers; rows past
// `rows` are the zero padding the transform mixes in.
template <typename T>
__global__ void __launch_bounds__(kThreads)
quantize_tensor_amax_hadamard_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t ld, uint32_t signs,
                                     uint32_t* __restrict__ amax) {
  const int64_t groups = (rows + kHadamardSize - 1) / kHadamardSize;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  uint32_t m = 0;
  for (int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x; t < groups * cols; t += stride) {
    const int64_t r0 = t / cols * kHadamardSize, c = t % cols;
    float v[kHadamardSize];
#pragma unroll
    for (int p = 0; p < kHadamardSize; ++p) v[p] = r0 + p < rows ? widen(x[(r0 + p) * ld + c]) : 0.0f;
    hadamard16(v, signs);
#pragma unroll
    for (int p = 0; p < kHadamardSize; ++p) m = max(m, abs_bits(v[p]));
  }
#pragma unroll
  for (int s = 16; s > 0; s /= 2) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, s));
  if (threadIdx.x % 32 == 0 && m != 0) atomicMax(amax, m);
}

template <typename T>
cudaError_t launch(const void* x, int64_t rows, int64_t cols, int64_t ld, float* amax, cudaStream_t stream) {
  const int64_t runs = rows * ((cols + kRun - 1) / kRun);
  // Enough CTAs to fill any current GPU several times over; the grid-stride loop does the rest.
  const int64_t ctas = std::min<int64_t>((runs + kThreads - 1) / kThreads, 8192);
  const bool vec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && (ld * int64_t(sizeof(T))) % 16 == 0;
  launch_kernel(quantize_tensor_amax_kernel<T>, unsigned(ctas), kThreads, 0, stream, static_cast<const T*>(x), rows,
                cols, ld, vec, reinterpret_cast<uint32_t*>(amax));
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_hadamard(const void* x, int64_t rows, int64_t cols, int64_t ld, uint32_t signs, float* amax,
                            cudaStream_t stream) {
  const int64_t threads = (rows + kHadamardSize - 1) / kHadamardSize * cols;
  const int64_t ctas = std::min<int64_t>((threads + kThreads - 1) / kThreads, 8192);
  launch_kernel(quantize_tensor_amax_hadamard_kernel<T>, unsigned(ctas), kThreads, 0, stream, static_cast<const T*>(x),
                rows, cols, ld, signs, reinterpret_cast<uint32_t*>(amax));
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_quantize_tensor_amax_hadamard(const void* x, InputDType dtype, int64_t rows, int64_t cols,
                                                 int64_t ld, uint32_t signs, float* amax, cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  switch (dtype) {
    case InputDType::kFloat32: return launch_hadamard<float>(x, rows, cols, ld, signs, amax, stream);
    case InputDType::kFloat16: return launch_hadamard<__half>(x, rows, cols, ld, signs, amax, stream);
    case InputDType::kBFloat16: return launch_hadamard<__nv_bfloat16>(x, rows, cols, ld, signs, amax, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_quantize_tensor_amax(const void* x, InputDType dtype, int64_t rows, int64_t cols, int64_t ld,
                                        float* amax, cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  switch (dtype) {
    case InputDType::kFloat32: return launch<float>(x, rows, cols, ld, amax, stream);
    case InputDType::kFloat16: return launch<__half>(x, rows, cols, ld, amax, stream);
    case InputDType::kBFloat16: return launch<__nv_bfloat16>(x, rows, cols, ld, amax, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace snip::quant
