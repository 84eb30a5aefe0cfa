// The one spelling of a launch of csrc's own kernels (CUTLASS launches the GEMMs itself):
// `kernel<<<grid, block, smem_bytes, stream>>>(args...)` under nvcc. The tests also compile the
// elementwise kernels as plain C++ against a host shim (SNIP_CUDA_HOST_SHIM:
// tests/native/cuda_host_shim.h declares snip_cuda_host::launch), which g++'s lack of `<<<>>>`
// would otherwise stop; there the same kernel runs on the CPU with the same arguments and geometry.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

#include <cuda_runtime_api.h>

#if defined(SNIP_CUDA_HOST_SHIM)
#include <tuple>
#endif

namespace snip {

template <typename... Params, typename... Args>
inline void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                          Args&&... args) {
#if defined(SNIP_CUDA_HOST_SHIM)
  (void)stream;  // the shim runs each launch to completion before returning
  // Arguments are converted to the kernel's parameter types once, as a launch copies them; every
  // thread then gets its own copies, as every CUDA thread does.
  struct Closure {
    void (*kernel)(Params...);
    std::tuple<Params...> params;
  };
  const Closure closure{kernel, std::tuple<Params...>(std::forward<Args>(args)...)};
  snip_cuda_host::launch(grid, block, smem_bytes, [](const void* c) {
    const Closure& k = *static_cast<const Closure*>(c);
    std::apply(k.kernel, k.params);
  }, &closure);
#else
  kernel<<<grid, block, smem_bytes, stream>>>(std::forward<Args>(args)...);
#endif
}

// The block's dynamic shared memory (`extern __shared__`: the launch's smem_bytes), 16-byte aligned.
template <typename V>
__device__ __forceinline__ V* dynamic_shared() {
#if defined(SNIP_CUDA_HOST_SHIM)
  return static_cast<V*>(snip_cuda_host::dynamic_shared());
#else
  extern __shared__ __align__(16) unsigned char snip_dynamic_shared[];
  return reinterpret_cast<V*>(snip_dynamic_shared);
#endif
}

// CTAs for a grid-stride kernel over `work` items: as many as are resident at once on the current
// device (CTAs per SM x SMs, queried once per device; the kernel's dynamic shared memory opted into
// on the way), never more than the items. Under the host shim a few, so that the tests run CTAs
// over several items each.
template <auto kKernel>
inline cudaError_t resident_ctas(int threads, size_t smem_bytes, int64_t work, int64_t& ctas) {
#if defined(SNIP_CUDA_HOST_SHIM)
  (void)threads;
  (void)smem_bytes;
  ctas = std::min<int64_t>(work, 3);
  return cudaSuccess;
#else
  constexpr int kMaxDevices = 64;
  static std::atomic<int> resident_on[kMaxDevices];  // 0 until queried
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  int resident = device < kMaxDevices ? resident_on[device].load(std::memory_order_relaxed) : 0;
  if (resident == 0) {
    int per_sm = 0, sms = 0;
    e = cudaFuncSetAttribute(reinterpret_cast<const void*>(kKernel), cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes));
    if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, reinterpret_cast<const void*>(kKernel), threads, smem_bytes);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (e != cudaSuccess) return e;
    if (per_sm < 1) return cudaErrorInvalidConfiguration;  // the block does not fit on an SM
    resident = per_sm * sms;
    if (device < kMaxDevices) resident_on[device].store(resident, std::memory_order_relaxed);
  }
  ctas = std::min<int64_t>(work, resident);
  return cudaSuccess;
#endif
}

}  // namespace snip
