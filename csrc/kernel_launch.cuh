// The one spelling of a launch of csrc's own kernels (CUTLASS launches the GEMMs itself):
// `kernel<<<grid, block, smem_bytes, stream>>>(args...)` under nvcc. The tests also compile the
// elementwise kernels as plain C++ against a host shim (SNIP_CUDA_HOST_SHIM:
// tests/native/cuda_host_shim.h declares snip_cuda_host::launch), which g++'s lack of `<<<>>>`
// would otherwise stop; there the same kernel runs on the CPU with the same arguments and geometry.
#pragma once
#include <cstddef>
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

}  // namespace snip
