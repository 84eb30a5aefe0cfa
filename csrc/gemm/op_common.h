// What the GEMM op files (torch side, *_op.cpp) share: the checks of the two K-major operands, of the
// device and of TMA alignment, and the launch of a compiled variant with its workspace.
#pragma once
#include <cstdint>
#include <initializer_list>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAStream.h>

#include "gemm/device_info.h"
#include "gemm/gemm_args.h"

namespace snip::gemm {

inline bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// a [M, K'] and b [N, K'] (K' = K, or K / 2 bytes of packed FP4): 2-D, the same K', K-major, row
// strides of whole 16-byte TMA rows, and M, N, K within int32. Dtypes are the caller's to check.
inline void check_nt_operands(const char* op, const at::Tensor& a, const at::Tensor& b, int64_t elems_per_byte) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2, op, "a and b must be 2-D (a [M, K], b [N, K] codes), got ", a.dim(),
              "-D and ", b.dim(), "-D");
  TORCH_CHECK(a.size(1) == b.size(1), op, "a and b must have the same K (dim 1): ", a.size(1), " vs ", b.size(1),
              elems_per_byte > 1 ? " bytes" : "");
  for (const auto* t : {&a, &b}) {
    TORCH_CHECK(t->size(1) <= 1 || t->stride(1) == 1, op,
                "a and b must be K-major (unit stride along K, dim 1); call .contiguous()");
    TORCH_CHECK(t->size(0) <= 1 || t->stride(0) % 16 == 0, op,
                "the row stride of a and b must be a multiple of 16 bytes, got ", t->stride(0));
  }
  TORCH_CHECK(a.size(0) <= INT32_MAX && b.size(0) <= INT32_MAX && elems_per_byte * a.size(1) <= INT32_MAX, op,
              "M, N, K must fit in int32");
}

// Every tensor on one CUDA device, at a 16-byte aligned address (TMA); returns that device's facts.
inline DeviceInfo check_cuda_tensors(const char* op, std::initializer_list<const at::Tensor*> ts) {
  const at::Tensor& a = **ts.begin();
  TORCH_CHECK(a.is_cuda(), op, "tensors must be on a CUDA device, got ", a.device(),
              " (on the CPU use snip_ops.gemm_kernels.qgemm, which falls back to the reference)");
  for (const auto* t : ts) {
    TORCH_CHECK(t->device() == a.device(), op, "all tensors must be on ", a.device(), ", got one on ", t->device());
    TORCH_CHECK(aligned16(*t), op, "every tensor must start at a 16-byte aligned address (TMA)");
  }
  return device_info(a.device().index());
}

// check_cuda_tensors, and the device is of the kernel's arch (arch_major.0).
inline void check_device(const char* op, std::initializer_list<const at::Tensor*> ts, int arch_major,
                         const char* arch) {
  const at::Tensor& a = **ts.begin();
  const DeviceInfo prop = check_cuda_tensors(op, ts);
  TORCH_CHECK(prop.major == arch_major && prop.minor == 0, op, "this kernel is compiled for ", arch,
              " only; device ", a.device(), " is sm_", prop.major, prop.minor,
              "; snip_ops.gemm_kernels.qgemm picks the right path per device");
}

// Runs a compiled variant (Fp8BlockwiseVariant or BlockScaledVariant) on the current stream of
// `like`'s device, with a workspace of the size it asks for.
template <typename Variant, typename Args>
void launch(const char* op, const Variant& v, const Args& args, const at::Tensor& like) {
  const auto stream = c10::cuda::getCurrentCUDAStream(like.device().index());
  const size_t ws = v.workspace_size(args);
  at::Tensor workspace;
  if (ws) workspace = at::empty({int64_t(ws)}, like.options().dtype(at::kByte));
  const LaunchResult r = v.run(args, ws ? workspace.data_ptr() : nullptr, stream.stream());
  TORCH_CHECK(r.status != LaunchStatus::kCannotImplement, op, "CUTLASS can_implement() refused ", v.name,
              " for M=", args.m, " N=", args.n, " K=", args.k, " (a bug: the checks above should catch it)");
  TORCH_CHECK(r.status == LaunchStatus::kOk, op, "launch of ", v.name, " failed: ", cudaGetErrorString(r.cuda));
}

}  // namespace snip::gemm
