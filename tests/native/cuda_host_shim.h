// CUDA's device-side language for g++: enough of it that the project's elementwise kernels
// (csrc/quant/*.cu, csrc/optim/adamw.cu) compile unchanged as C++ and run on the CPU in tests.
//
// Force-included (g++ -include) ahead of a kernel source compiled with -x c++ -DSNIP_CUDA_HOST_SHIM;
// csrc/kernel_launch.cuh then hands each launch to snip_cuda_host::launch (cuda_host_shim.cpp),
// which runs the grid block after block, the threads of a block as cooperative fibers on one OS
// thread: a thread runs until it waits at __syncthreads or a warp shuffle or exits, then the next
// one runs. Only what these kernels use is here: a kernel using anything else fails to compile.
#pragma once

// Shared memory: one instance per OS thread, so every fiber of a block sees the same array; the
// runtime fills this module's thread-local storage with 0xFF bytes before each block, as CUDA
// leaves shared memory uninitialised (a read of an unwritten byte gives NaN-like garbage).
// Defined before the CUDA headers, which then keep it.
#define __shared__ static thread_local
#define __launch_bounds__(...)

#include <cstdint>
#include <cstring>
#include <source_location>
#include <type_traits>

#include <cuda_runtime_api.h>
#include <vector_functions.h>

namespace snip_cuda_host {

// Runs `body(closure)` as every thread of every block of the grid; errors are reported by
// cudaGetLastError (and snip_cuda_host_error()).
void launch(dim3 grid, dim3 block, size_t dynamic_smem_bytes, void (*body)(const void*), const void* closure);
void barrier(const char* file, unsigned line);
// The block's dynamic shared memory (`extern __shared__` on a GPU): the launch's bytes, 16-byte
// aligned, filled like static shared memory before each block.
void* dynamic_shared();
uint64_t shuffle_xor(uint32_t mask, uint64_t value, int lane_mask, const char* file, unsigned line);

}  // namespace snip_cuda_host

// The running thread's indices and the launch geometry (set by the scheduler at every switch).
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;

inline void __syncthreads(std::source_location where = std::source_location::current()) {
  snip_cuda_host::barrier(where.file_name(), where.line());
}

// Full-width xor shuffle (no `width` argument: the kernels do not use one).
template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, std::source_location where = std::source_location::current()) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffles move at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = snip_cuda_host::shuffle_xor(mask, bits, lane_mask, where.file_name(), where.line());
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}

inline int __ffs(int x) { return __builtin_ffs(x); }

// A read-only-cache load is a plain load; the alignment check of the build (-fsanitize=alignment)
// still sees the vector type, so a misaligned 16-byte load is reported as the GPU would fault.
template <typename T>
T __ldg(const T* p) {
  return *p;
}

// No other thread runs between two fiber switches, so read-modify-write is atomic here.
inline unsigned atomicMax(unsigned* address, unsigned value) {
  const unsigned old = *address;
  if (value > old) *address = value;
  return old;
}

// CUDA's integer min / max (device overloads). Same-type arguments only: a mixed call that CUDA
// would promote fails to compile here rather than silently picking a different overload.
template <typename T>
  requires std::is_integral_v<T>
constexpr T max(T a, T b) {
  return a < b ? b : a;
}
template <typename T>
  requires std::is_integral_v<T>
constexpr T min(T a, T b) {
  return b < a ? b : a;
}
