// Torch-facing side of snip_C::adamw_: argument checks, the per-tensor metadata and, on a GPU, one
// host-to-device copy of it and a single launch; on the CPU, the host loop. The Python optimizer
// (snip_ops/optim.py) groups tensors by device and dtype so that each group is one call.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#if SNIP_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <cstring>
#include <vector>

#include "ops.h"
#include "optim/adamw.h"

namespace snip {
namespace {

constexpr const char* kOp = "snip_C::adamw_: ";

bool aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

void adamw_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
            at::IntArrayRef param_indices, at::IntArrayRef index_bases, double decay, double beta1,
            double one_minus_beta1, double beta2, double one_minus_beta2, double inv_bias_correction2_sqrt,
            double step_size, double eps, int64_t step, int64_t seed, bool bf16_sr) {
  const size_t n = params.size();
  TORCH_CHECK(grads.size() == n && exp_avgs.size() == n && exp_avg_sqs.size() == n && param_indices.size() == n &&
                  index_bases.size() == n,
              kOp, "params, grads, exp_avgs, exp_avg_sqs, param_indices and index_bases must have one entry each");
  if (n == 0) return;
  TORCH_CHECK(step >= 1 && step < (int64_t(1) << 32), kOp, "step must be in [1, 2^32), got ", step);
  const at::Tensor& p0 = params[0];
  TORCH_CHECK(p0.is_cuda() || p0.is_cpu(), kOp, "tensors must be on a CUDA device or the CPU, got ", p0.device());
  const auto param_dtype = p0.scalar_type(), state_dtype = exp_avgs[0].scalar_type();
  TORCH_CHECK(param_dtype == at::kFloat || param_dtype == at::kBFloat16, kOp,
              "parameters must be float32 or bfloat16, got ", param_dtype);
  TORCH_CHECK(state_dtype == at::kFloat || state_dtype == at::kBFloat16, kOp,
              "exp_avg / exp_avg_sq must be float32 or bfloat16, got ", state_dtype);

  std::vector<optim::TensorSlot> slots(n);
  std::vector<int64_t> block_start(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor* ts[4] = {&params[i], &grads[i], &exp_avgs[i], &exp_avg_sqs[i]};
    const char* names[4] = {"params", "grads", "exp_avgs", "exp_avg_sqs"};
    for (int k = 0; k < 4; ++k) {
      const at::Tensor& t = *ts[k];
      TORCH_CHECK(t.device() == p0.device(), kOp, names[k], "[", i, "] is on ", t.device(), ", params[0] on ",
                  p0.device());
      TORCH_CHECK(t.is_contiguous(), kOp, names[k], "[", i, "] must be contiguous");
      TORCH_CHECK(t.scalar_type() == (k < 2 ? param_dtype : state_dtype), kOp, names[k], "[", i, "] is ",
                  t.scalar_type(), ", expected ", k < 2 ? param_dtype : state_dtype, " like the first entry");
      TORCH_CHECK(t.numel() == params[i].numel(), kOp, names[k], "[", i, "] has ", t.numel(),
                  " elements, params[", i, "] ", params[i].numel());
    }
    TORCH_CHECK(param_indices[i] >= 0 && param_indices[i] < (int64_t(1) << 30), kOp,
                "param_indices must be in [0, 2^30), got ", param_indices[i]);
    TORCH_CHECK(index_bases[i] >= 0, kOp, "index_bases must be >= 0, got ", index_bases[i]);
    // The kernel's 8-element accesses: one uint4 (BF16) or two float4 (FP32) per Philox block.
    const bool vector_ok = index_bases[i] % 8 == 0 && aligned(params[i].data_ptr(), 16) &&
                           aligned(grads[i].data_ptr(), 16) && aligned(exp_avgs[i].data_ptr(), 16) &&
                           aligned(exp_avg_sqs[i].data_ptr(), 16);
    slots[i] = optim::TensorSlot{params[i].data_ptr(),
                                 grads[i].data_ptr(),
                                 exp_avgs[i].data_ptr(),
                                 exp_avg_sqs[i].data_ptr(),
                                 params[i].numel(),
                                 index_bases[i],
                                 (uint64_t(step) << 32) | (uint64_t(param_indices[i]) << 2),
                                 vector_ok ? 1 : 0};
#if SNIP_WITH_CUDA
    block_start[i + 1] = block_start[i] + optim::adamw_blocks(slots[i]);
#endif
  }
  const optim::Scalars s{float(decay), float(beta1), float(one_minus_beta1), float(beta2), float(one_minus_beta2),
                         float(inv_bias_correction2_sqrt), float(step_size), float(eps)};
  const bool param_bf16 = param_dtype == at::kBFloat16, state_bf16 = state_dtype == at::kBFloat16;
  if (p0.is_cpu()) {
    optim::adamw_cpu(slots.data(), int(n), s, uint64_t(seed), param_bf16, state_bf16, bf16_sr);
    return;
  }
#if SNIP_WITH_CUDA  // a build without CUDA registers no CUDA kernel: no CUDA tensor gets here
  const int64_t num_blocks = block_start[n];
  if (num_blocks == 0) return;

  // Slots and block starts travel in one pinned buffer and one asynchronous copy; the caching
  // host allocator keeps the buffer alive until the copy has run.
  const int64_t slot_bytes = int64_t(n * sizeof(optim::TensorSlot)), start_bytes = int64_t((n + 1) * sizeof(int64_t));
  at::Tensor host = at::empty({slot_bytes + start_bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  std::memcpy(host.data_ptr(), slots.data(), slot_bytes);
  std::memcpy(static_cast<uint8_t*>(host.data_ptr()) + slot_bytes, block_start.data(), start_bytes);
  const c10::cuda::CUDAGuard guard(p0.device());
  const at::Tensor dev = host.to(p0.device(), /*non_blocking=*/true);
  const auto* dev_slots = reinterpret_cast<const optim::TensorSlot*>(dev.data_ptr());
  const auto* dev_starts = reinterpret_cast<const int64_t*>(static_cast<const uint8_t*>(dev.data_ptr()) + slot_bytes);

  C10_CUDA_CHECK(optim::launch_adamw(dev_slots, dev_starts, int(n), num_blocks, s, uint64_t(seed), param_bf16,
                                     state_bf16, bf16_sr, c10::cuda::getCurrentCUDAStream()));
#endif
}

}  // namespace snip
