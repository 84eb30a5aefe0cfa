// Torch-facing side of snip_C::dequantize: checks, allocation, stream, the CUDA kernel or on the CPU
// its host implementation (quantize_host.cpp), Meta function.
// codes [rows, >= ceil(cols * bits / 8)] (FP8 dtypes or uint8; padded outputs of snip_C::quantize
// are fine), plain scales [>= ceil(rows / br), >= ceil(cols / bc)] with unit inner stride, the
// NVFP4 tensor scale; out: [rows, cols] float32 or bfloat16.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#if SNIP_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "ops.h"
#include "quant/quantize.h"
#include "quant/quantize_host.h"
#include "quant/spec.h"

namespace snip {
namespace {

constexpr const char* kOp = "snip_C::dequantize: ";

quant::Spec check_args(const at::Tensor& codes, const at::Tensor& scales, const std::optional<at::Tensor>& tensor_scale,
                       c10::string_view spec, int64_t cols, at::ScalarType dtype) {
  const quant::Spec s = quant::parse_spec(spec, kOp);
  TORCH_CHECK(codes.dim() == 2 && codes.element_size() == 1, kOp, "codes must be a 2-D tensor of 1-byte codes, got ",
              codes.sizes(), " ", codes.scalar_type());
  TORCH_CHECK(codes.stride(1) == 1 || codes.size(1) <= 1, kOp, "codes must have unit stride along their last dimension");
  TORCH_CHECK(cols >= 0, kOp, "cols must be >= 0, got ", cols);
  const int64_t rows = codes.size(0);
  const int64_t width = s.elem == quant::Elem::kE2M1 ? (cols + 1) / 2 : cols;
  TORCH_CHECK(codes.size(1) >= width, kOp, "codes hold ", codes.size(1), " bytes per row, ", cols,
              " elements need ", width);
  TORCH_CHECK(scales.dim() == 2 && scales.scalar_type() == quant::scales_dtype(s), kOp, "scales must be 2-D ",
              quant::scales_dtype(s), " for spec ", spec, ", got ", scales.sizes(), " ", scales.scalar_type());
  TORCH_CHECK(scales.stride(1) == 1 || scales.size(1) <= 1, kOp, "scales must have unit stride along their last dimension");
  const int64_t need_r = (rows + s.block_rows - 1) / s.block_rows, need_c = (cols + s.block_cols - 1) / s.block_cols;
  TORCH_CHECK(scales.size(0) >= need_r && scales.size(1) >= need_c, kOp, "scales ", scales.sizes(), " do not cover [",
              rows, ", ", cols, "] in blocks of ", s.block_rows, "x", s.block_cols);
  const bool nvfp4 = s.scale == quant::ScaleKind::kNVFP4;
  TORCH_CHECK(nvfp4 == tensor_scale.has_value(), kOp, nvfp4 ? "nvfp4 needs its tensor_scale" : "tensor_scale is only used by nvfp4");
  if (nvfp4) {
    TORCH_CHECK(tensor_scale->numel() == 1 && tensor_scale->scalar_type() == at::kFloat, kOp,
                "tensor_scale must be a one-element float32 tensor");
  }
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, kOp, "dtype must be float32 or bfloat16, got ", dtype);
  return s;
}

}  // namespace

at::Tensor dequantize(const at::Tensor& codes, const at::Tensor& scales, const std::optional<at::Tensor>& tensor_scale,
                      c10::string_view spec, int64_t cols, at::ScalarType dtype) {
  const quant::Spec s = check_args(codes, scales, tensor_scale, spec, cols, dtype);
  TORCH_CHECK((codes.is_cuda() || codes.is_cpu()) && scales.device() == codes.device() &&
                  (!tensor_scale.has_value() || tensor_scale->device() == codes.device()),
              kOp, "codes, scales and tensor_scale must be on one device, a CUDA device or the CPU");
  at::Tensor out = at::empty({codes.size(0), cols}, codes.options().dtype(dtype));
  if (codes.is_cpu()) {
    const float ts = tensor_scale.has_value() ? tensor_scale->item<float>() : 1.0f;
    quant::dequantize_host(codes.data_ptr(), codes.stride(0), scales.data_ptr(), scales.stride(0), ts, s,
                           codes.size(0), cols, out.data_ptr(), dtype == at::kBFloat16);
    return out;
  }
#if SNIP_WITH_CUDA  // a build without CUDA registers no CUDA kernel: no CUDA tensor gets here
  const c10::cuda::CUDAGuard guard(codes.device());
  const at::Tensor ts = tensor_scale.has_value() ? tensor_scale->contiguous() : at::Tensor();
  C10_CUDA_CHECK(quant::launch_dequantize(codes.data_ptr(), codes.stride(0), scales.data_ptr(), scales.stride(0),
                                          ts.defined() ? ts.data_ptr<float>() : nullptr, s, codes.size(0), cols,
                                          out.data_ptr(), dtype == at::kBFloat16,
                                          c10::cuda::getCurrentCUDAStream(codes.device().index()).stream()));
#endif
  return out;
}

at::Tensor dequantize_meta(const at::Tensor& codes, const at::Tensor& scales,
                           const std::optional<at::Tensor>& tensor_scale, c10::string_view spec, int64_t cols,
                           at::ScalarType dtype) {
  check_args(codes, scales, tensor_scale, spec, cols, dtype);
  return at::empty_symint({codes.sym_size(0), c10::SymInt(cols)}, codes.options().dtype(dtype));
}

}  // namespace snip
