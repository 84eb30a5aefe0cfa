// max |x| over a whole tensor: the first of NVFP4's two passes (its FP32 tensor scale needs the
// tensor amax before any block can be scaled), skipped when the caller passes an amax.
// A thread takes 8 consecutive elements of a row at a time (one 16-byte vector for 16-bit inputs),
// two runs a grid stride apart per step so that both loads are in flight together; 16-bit inputs
// take their maxima two at a time on the packed words (quant_io.cuh). A thread finds its first run's
// row and column with one division and steps on by the grid stride split the same way once on the
// host (a 64-bit division per run costs more than the run's own work). Then a warp reduction and one
// atomicMax per warp on the float bits (integer order is float order for |x|).
#include <algorithm>

#include "kernel_launch.cuh"
#include "quant/hadamard.cuh"
#include "quant/quant_io.cuh"

namespace snip::quant {
namespace {

constexpr int kThreads = 256;
constexpr int kRun = 8;

// A count of runs as whole rows and runs within a row.
struct RunStep {
  int64_t rows, runs;
};

template <typename T>
__global__ void __launch_bounds__(kThreads)
quantize_tensor_amax_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, int64_t ld, bool vec, RunStep step,
                            uint32_t* __restrict__ amax) {
  const int64_t runs_per_row = (cols + kRun - 1) / kRun;
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  int64_t r = t / runs_per_row, c = t % runs_per_row;
  const auto advance = [&](int64_t& row, int64_t& run) {
    row += step.rows;
    run += step.runs;
    if (run >= runs_per_row) run -= runs_per_row, ++row;
  };
  uint32_t m = 0;
  while (r < rows) {
    int64_t r1 = r, c1 = c;
    advance(r1, c1);
    const bool second = r1 < rows;
    Run<T, kRun> v0, v1;  // a missing second run loads as zeros
    load_run(v0, x + r * ld, c * kRun, cols, vec);
    load_run(v1, x + (second ? r1 : 0) * ld, c1 * kRun, second ? cols : 0, vec);
    m = max(m, max(run_max_bits(v0), run_max_bits(v1)));
    r = r1, c = c1;
    advance(r, c);
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
  const int64_t runs_per_row = (cols + kRun - 1) / kRun, runs = rows * runs_per_row;
  // Two runs per thread at least; enough CTAs to fill any current GPU several times over, the
  // grid-stride loop does the rest.
  const int64_t ctas = std::min<int64_t>((runs + 2 * kThreads - 1) / (2 * kThreads), 8192);
  const int64_t stride = ctas * kThreads;
  const RunStep step{stride / runs_per_row, stride % runs_per_row};
  const bool vec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && (ld * int64_t(sizeof(T))) % 16 == 0;
  launch_kernel(quantize_tensor_amax_kernel<T>, unsigned(ctas), kThreads, 0, stream, static_cast<const T*>(x), rows,
                cols, ld, vec, step, reinterpret_cast<uint32_t*>(amax));
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
