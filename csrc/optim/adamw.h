// Launcher of the fused multi-tensor AdamW kernel (snip_C::adamw_). Plain CUDA types only, so the
// .cu file never includes torch headers. Semantics: snip_ops.optim.adamw_step_reference, bit for bit.
#pragma once
#include <cstdint>
#if SNIP_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace snip::optim {

// One parameter's tensors (all contiguous, `numel` elements each).
struct TensorSlot {
  void* param;
  const void* grad;
  void* exp_avg;
  void* exp_avg_sq;
  int64_t numel;
  int64_t index_base;    // global linear index of element 0 (an FSDP shard's offset; else 0)
  uint64_t offset;       // Philox offset of the parameter's write-back; m and v use offset + 1, + 2
  int64_t vector_ok;     // index_base % 8 == 0 and every pointer 16-byte aligned (8-element accesses)
};

// The FP32 scalars of one step (snip_ops.optim.AdamWScalars).
struct Scalars {
  float decay, beta1, one_minus_beta1, beta2, one_minus_beta2, inv_bias_correction2_sqrt, step_size, eps;
};

#if SNIP_WITH_CUDA
// CUDA blocks a tensor needs, so that the caller can lay out `block_start` (see launch_adamw).
int64_t adamw_blocks(const TensorSlot& t);

// One launch over all `num_slots` tensors. `slots` and `block_start` (num_slots + 1 prefix sums of
// adamw_blocks) are device arrays; `block_start[num_slots]` is the grid size.
// param_bf16 / state_bf16: element types (else float32); params in BF16 are written back with SR
// when `sr`, else round-to-nearest-even; BF16 moments always with SR.
cudaError_t launch_adamw(const TensorSlot* slots, const int64_t* block_start, int num_slots, int64_t num_blocks,
                         const Scalars& s, uint64_t seed, bool param_bf16, bool state_bf16, bool sr,
                         cudaStream_t stream);
#endif  // SNIP_WITH_CUDA

// The same update on host memory (adamw_cpu.cpp): the kernel's arithmetic, Philox block by Philox block.
void adamw_cpu(const TensorSlot* slots, int num_slots, const Scalars& s, uint64_t seed, bool param_bf16,
               bool state_bf16, bool sr);

}  // namespace snip::optim
