// Tiny kernels that show what the host shim (cuda_host_shim.h) executes and what it reports, built
// like the project's kernels: tests/ops/test_cuda_host_shim.py launches them by name and checks the
// output or the launch error.
#include <cstdint>
#include <cstring>
#include <string_view>

#include "kernel_launch.cuh"

namespace {

constexpr int kThreads = 64;

// out[t] = the value thread t + 1 stored before the barrier: needs __syncthreads.
__global__ void neighbour_through_shared_memory(uint32_t* out) {
  __shared__ uint32_t slot[kThreads];
  slot[threadIdx.x] = 1000 + threadIdx.x;
  __syncthreads();
  out[blockIdx.x * kThreads + threadIdx.x] = slot[(threadIdx.x + 1) % kThreads];
}

// The same through dynamic shared memory (the launch's smem_bytes).
__global__ void neighbour_through_dynamic_shared_memory(uint32_t* out) {
  uint32_t* slot = snip::dynamic_shared<uint32_t>();
  slot[threadIdx.x] = 2000 + threadIdx.x;
  __syncthreads();
  out[blockIdx.x * kThreads + threadIdx.x] = slot[(threadIdx.x + 1) % kThreads];
}

// Each thread reads its dynamic slot before writing it: every block, not just the first, reads the
// fill pattern.
__global__ void dynamic_shared_memory_per_block(uint32_t* out) {
  uint32_t* slot = snip::dynamic_shared<uint32_t>();
  out[blockIdx.x * kThreads + threadIdx.x] = slot[threadIdx.x];
  slot[threadIdx.x] = threadIdx.x;
}

// The last thread writes one slot past the launch's dynamic shared memory: what only the AddressSanitizer
// build of the shim (tests/cuda_host.py) stops; a GPU would corrupt or fault unseen.
__global__ void dynamic_shared_memory_overrun(uint32_t* out) {
  uint32_t* slot = snip::dynamic_shared<uint32_t>();
  slot[threadIdx.x + (threadIdx.x == kThreads - 1)] = threadIdx.x;
  out[threadIdx.x] = 0;
}

// out[t] = t ^ 5 from lane t ^ 5.
__global__ void xor_shuffle(uint32_t* out) {
  out[threadIdx.x] = __shfl_xor_sync(0xFFFFFFFFu, uint32_t(threadIdx.x), 5);
}

// Threads that exit early no longer count at the barrier.
__global__ void barrier_after_early_exit(uint32_t* out) {
  if (threadIdx.x >= kThreads / 2) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

// The first half of the block fills its slots; the second half reads slots nobody wrote.
__global__ void unwritten_shared_memory(uint32_t* out) {
  __shared__ uint32_t slot[kThreads];
  if (threadIdx.x < kThreads / 2) slot[threadIdx.x] = threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = slot[threadIdx.x];
}

// Half the block waits at one barrier, half at another.
__global__ void divergent_barrier(uint32_t* out) {
  if (threadIdx.x < kThreads / 2) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

// Lanes 0-15 shuffle with a full mask while lanes 16-31 wait at a barrier.
__global__ void shuffle_deadlock(uint32_t* out) {
  if (threadIdx.x % 32 < 16) {
    out[threadIdx.x] = __shfl_xor_sync(0xFFFFFFFFu, uint32_t(threadIdx.x), 1);
  } else {
    __syncthreads();
  }
}

// Lane 0 exits; the others shuffle with a mask that still names it.
__global__ void shuffle_with_exited_lane(uint32_t* out) {
  if (threadIdx.x == 0) return;
  out[threadIdx.x] = __shfl_xor_sync(0xFFFFFFFFu, uint32_t(threadIdx.x), 2);
}

// A 16-byte vector load from an address that is only 4-byte aligned.
__global__ void misaligned_vector_load(uint32_t* out) {
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(out + 1));
  out[threadIdx.x + 8] = v.x;
}

// Writes one word past a fixed-size local array.
__global__ void local_array_overrun(uint32_t* out) {
  uint32_t a[4] = {};
  const int i = int(threadIdx.x) + 4;
  a[i % 8] = 1;
  out[threadIdx.x] = a[0];
}

}  // namespace

// Launches self-test kernel `name` on `blocks` blocks of 64 threads writing `out`; returns the
// launch's cudaError_t, -1 for an unknown name.
extern "C" int snip_cuda_host_selftest(const char* name, int blocks, uint32_t* out) {
  using Kernel = void (*)(uint32_t*);
  constexpr size_t kSlots = kThreads * sizeof(uint32_t);
  const struct {
    std::string_view name;
    Kernel kernel;
    size_t smem_bytes;  // dynamic shared memory
  } kernels[] = {
      {"neighbour_through_shared_memory", neighbour_through_shared_memory, 0},
      {"neighbour_through_dynamic_shared_memory", neighbour_through_dynamic_shared_memory, kSlots},
      {"dynamic_shared_memory_per_block", dynamic_shared_memory_per_block, kSlots},
      {"too_much_dynamic_shared_memory", neighbour_through_dynamic_shared_memory, size_t(228) << 10},
      {"dynamic_shared_memory_overrun", dynamic_shared_memory_overrun, kSlots},
      {"xor_shuffle", xor_shuffle, 0},
      {"barrier_after_early_exit", barrier_after_early_exit, 0},
      {"unwritten_shared_memory", unwritten_shared_memory, 0},
      {"divergent_barrier", divergent_barrier, 0},
      {"shuffle_deadlock", shuffle_deadlock, 0},
      {"shuffle_with_exited_lane", shuffle_with_exited_lane, 0},
      {"misaligned_vector_load", misaligned_vector_load, 0},
      {"local_array_overrun", local_array_overrun, 0},
  };
  for (const auto& k : kernels) {
    if (k.name != name) continue;
    snip::launch_kernel(k.kernel, unsigned(blocks), kThreads, k.smem_bytes, nullptr, out);
    return cudaGetLastError();
  }
  return -1;
}
