// Torch-facing side of snip_C::fp8_quantize_1x128: argument checks, output allocation, stream,
// and the Meta (fake) implementation that lets torch.compile trace the op.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "ops.h"
#include "quant/fp8_quantize_1x128.h"

namespace snip {
namespace {

constexpr const char* kOp = "snip_C::fp8_quantize_1x128: ";

InputDType check_input(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2, kOp, "x must be 2-D [M, K], got ", x.dim(), "-D");
  InputDType dt;
  switch (x.scalar_type()) {
    case at::kFloat: dt = InputDType::kFloat32; break;
    case at::kHalf: dt = InputDType::kFloat16; break;
    case at::kBFloat16: dt = InputDType::kBFloat16; break;
    default: TORCH_CHECK(false, kOp, "x must be bfloat16, float16 or float32, got ", x.scalar_type());
  }
  TORCH_CHECK(x.is_contiguous(), kOp, "x must be contiguous (call .contiguous())");
  return dt;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> fp8_quantize_1x128(const at::Tensor& x, bool pow2_scale) {
  const InputDType dt = check_input(x);
  TORCH_CHECK(x.is_cuda(), kOp, "x must be a CUDA tensor, got device ", x.device(),
              " (on the CPU use snip_ops.reference.quantize)");
  const int64_t M = x.size(0), K = x.size(1);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor codes = at::empty({M, K}, x.options().dtype(at::kFloat8_e4m3fn));
  at::Tensor scales = at::empty({M, (K + 127) / 128}, x.options().dtype(at::kFloat));
  if (M == 0 || K == 0) return {codes, scales};
  C10_CUDA_CHECK(launch_fp8_quantize_1x128(
      x.data_ptr(), dt, static_cast<uint8_t*>(codes.data_ptr()), scales.data_ptr<float>(), M, K,
      pow2_scale, c10::cuda::getCurrentCUDAStream(x.device().index()).stream()));
  return {codes, scales};
}

std::tuple<at::Tensor, at::Tensor> fp8_quantize_1x128_meta(const at::Tensor& x, bool pow2_scale) {
  (void)pow2_scale;
  check_input(x);
  // Sym sizes so that dynamic-shape tracing works.
  const c10::SymInt M = x.sym_size(0), K = x.sym_size(1);
  return {at::empty_symint({M, K}, x.options().dtype(at::kFloat8_e4m3fn)),
          at::empty_symint({M, (K + 127) / 128}, x.options().dtype(at::kFloat))};
}

}  // namespace snip
