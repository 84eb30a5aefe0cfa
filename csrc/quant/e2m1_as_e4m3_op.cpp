// Torch-facing side of snip_C::e2m1_as_e4m3: packed E2M1 codes [rows, >= ceil(cols / 2)] (any
// 1-byte dtype, unit inner stride; element 2j in the low nibble of byte j) -> float8_e4m3fn
// [rows_out, cols_out] with the same values, zeros past rows / cols: the FP4 operand of the FP8
// blockwise GEMMs, padded as they want it, in one pass. CUDA kernel e2m1_as_e4m3.cu; on the CPU the
// same byte map (quant_math.cuh, e2m1_as_e4m3_byte) in a host loop; Meta function.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#if SNIP_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "ops.h"
#include "quant/quant_math.cuh"
#include "quant/quantize.h"

namespace snip {
namespace {

constexpr const char* kOp = "snip_C::e2m1_as_e4m3: ";

void check_args(const at::Tensor& codes, int64_t cols, int64_t rows_out, int64_t cols_out) {
  TORCH_CHECK(codes.dim() == 2 && codes.element_size() == 1, kOp,
              "codes must be a 2-D tensor of packed 1-byte E2M1 codes, got ", codes.sizes(), " ", codes.scalar_type());
  TORCH_CHECK(codes.stride(1) == 1 || codes.size(1) <= 1, kOp, "codes must have unit stride along their last dimension");
  TORCH_CHECK(cols >= 0 && codes.size(1) >= (cols + 1) / 2, kOp, "codes hold ", codes.size(1), " bytes per row, ",
              cols, " elements need ", (cols + 1) / 2);
  TORCH_CHECK(rows_out >= codes.size(0) && cols_out >= cols, kOp, "the output [", rows_out, ", ", cols_out,
              "] must cover the codes [", codes.size(0), ", ", cols, "]");
}

}  // namespace

at::Tensor e2m1_as_e4m3(const at::Tensor& codes, int64_t cols, int64_t rows_out, int64_t cols_out) {
  check_args(codes, cols, rows_out, cols_out);
  TORCH_CHECK(codes.is_cuda() || codes.is_cpu(), kOp, "codes must be on a CUDA device or the CPU");
  at::Tensor out = at::empty({rows_out, cols_out}, codes.options().dtype(at::kFloat8_e4m3fn));
  const auto* src = static_cast<const uint8_t*>(codes.data_ptr());
  auto* dst = static_cast<uint8_t*>(out.data_ptr());
  const int64_t rows = codes.size(0), ld = codes.stride(0);
  if (codes.is_cpu()) {
    at::parallel_for(0, rows_out, 64, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        for (int64_t c = 0; c < cols_out; ++c) {
          const uint32_t code = r < rows && c < cols ? (src[r * ld + c / 2] >> (4 * (c % 2))) & 0xFu : 0u;
          dst[r * cols_out + c] = uint8_t(quant::e2m1_as_e4m3_byte(code));
        }
    });
    return out;
  }
#if SNIP_WITH_CUDA  // a build without CUDA registers no CUDA kernel: no CUDA tensor gets here
  const c10::cuda::CUDAGuard guard(codes.device());
  C10_CUDA_CHECK(quant::launch_e2m1_as_e4m3(src, ld, rows, cols, dst, cols_out, rows_out, cols_out,
                                            c10::cuda::getCurrentCUDAStream(codes.device().index()).stream()));
#endif
  return out;
}

at::Tensor e2m1_as_e4m3_meta(const at::Tensor& codes, int64_t cols, int64_t rows_out, int64_t cols_out) {
  check_args(codes, cols, rows_out, cols_out);
  return at::empty({rows_out, cols_out}, codes.options().dtype(at::kFloat8_e4m3fn));
}

}  // namespace snip
