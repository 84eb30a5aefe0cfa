// Torch-level entry points of the snip_C ops, implemented next to their kernels and registered in
// bindings.cpp. Arch-specific ops (csrc/**/sm90, csrc/**/sm100) are declared under
// SNIP_HAS_SM90 / SNIP_HAS_SM100, which CMake sets to match what is compiled.
#pragma once
#include <optional>
#include <tuple>

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

namespace snip {

// ---- quantization (csrc/quant; outputs and padding documented in quant/quantize_op.cpp) ----
// x [M, K] -> (codes, scales, codes_t, scales_t, tensor_scale) under `spec`
// (formats.QuantSpec.describe(), e.g. "e4m3/1x128/fp32/sr"), row-wise and/or column-wise;
// scale_layout "plain", "blackwell" or "hopper" (snip_ops.scale_layout): where the scales go;
// hadamard_signs >= 0: the column output is (T x)^T, T nvfp4_train's random Hadamard transform.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize(
    const at::Tensor& x, c10::string_view spec, bool rowwise, bool colwise, int64_t seed, int64_t offset,
    int64_t offset_t, const std::optional<at::Tensor>& tensor_amax, c10::string_view scale_layout, int64_t pad,
    int64_t hadamard_signs);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_meta(
    const at::Tensor& x, c10::string_view spec, bool rowwise, bool colwise, int64_t seed, int64_t offset,
    int64_t offset_t, const std::optional<at::Tensor>& tensor_amax, c10::string_view scale_layout, int64_t pad,
    int64_t hadamard_signs);
// codes + plain scales (+ NVFP4 tensor scale) -> [rows, cols] float32 / bfloat16.
at::Tensor dequantize(const at::Tensor& codes, const at::Tensor& scales, const std::optional<at::Tensor>& tensor_scale,
                      c10::string_view spec, int64_t cols, at::ScalarType dtype);
at::Tensor dequantize_meta(const at::Tensor& codes, const at::Tensor& scales,
                           const std::optional<at::Tensor>& tensor_scale, c10::string_view spec, int64_t cols,
                           at::ScalarType dtype);
// Packed E2M1 codes [rows, >= ceil(cols / 2)] -> float8_e4m3fn [rows_out, cols_out] of the same values,
// zeros past rows / cols (the FP4 operands of the FP8 blockwise GEMMs; quant/e2m1_as_e4m3_op.cpp).
at::Tensor e2m1_as_e4m3(const at::Tensor& codes, int64_t cols, int64_t rows_out, int64_t cols_out);
at::Tensor e2m1_as_e4m3_meta(const at::Tensor& codes, int64_t cols, int64_t rows_out, int64_t cols_out);

}  // namespace snip

// ---- GEMMs (csrc/gemm; semantics and scale layouts: csrc/gemm/README.md) ----
#include <optional>
#include <string>

#include <c10/util/string_view.h>

namespace snip {

#if SNIP_HAS_SM90 || SNIP_HAS_SM100
// FP8 block-scaled GEMM with FP32 scales (Hopper wgmma or Blackwell tcgen05 kernels, by the device's
// arch), out = A[M, K] . B[N, K]^T (+ bias): A E4M3 or E5M2, B E4M3; sfa [ceil(K/128), >=M] and
// sfb [ceil(K/128), >=ceil(N/b_block)] FP32, MN-major; b_block 128 (128x128) or 1 (1x128).
at::Tensor fp8_gemm_nt_blockwise(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                                 const at::Tensor& sfb, int64_t b_block, c10::ScalarType out_dtype,
                                 const std::optional<at::Tensor>& bias, c10::string_view config);
at::Tensor fp8_gemm_nt_blockwise_meta(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                                      const at::Tensor& sfb, int64_t b_block, c10::ScalarType out_dtype,
                                      const std::optional<at::Tensor>& bias, c10::string_view config);
// out += A . B^T in place (out BF16 or FP32 [M, N]).
void fp8_gemm_nt_blockwise_acc(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                               const at::Tensor& sfb, int64_t b_block, const at::Tensor& out,
                               c10::string_view config);
void fp8_gemm_nt_blockwise_acc_meta(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                                    const at::Tensor& sfb, int64_t b_block, const at::Tensor& out,
                                    c10::string_view config);
// The instantiation and tile configuration the heuristic picks for an sm_<arch>a device with
// num_sms SMs and A of a_dtype (no device needed).
std::string fp8_gemm_nt_blockwise_config(int64_t m, int64_t n, int64_t k, int64_t b_block,
                                         c10::ScalarType out_dtype, int64_t num_sms, c10::string_view config,
                                         int64_t arch, c10::ScalarType a_dtype);
#endif

#if SNIP_HAS_SM100
// Blackwell block-scaled GEMMs -> [M, N] of out_dtype (BF16, or FP32 for wgrad); scales in
// CUTLASS's blocked layout (snip_ops.scale_layout.to_blackwell); alpha: one FP32 (nvfp4's product
// of tensor scales).
at::Tensor nvfp4_gemm_nt(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b, const at::Tensor& sfb,
                         const at::Tensor& alpha, c10::ScalarType out_dtype);
at::Tensor nvfp4_gemm_nt_meta(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                              const at::Tensor& sfb, const at::Tensor& alpha, c10::ScalarType out_dtype);
at::Tensor mxfp4_gemm_nt(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b, const at::Tensor& sfb,
                         c10::ScalarType out_dtype);
at::Tensor mxfp4_gemm_nt_meta(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                              const at::Tensor& sfb, c10::ScalarType out_dtype);
at::Tensor mxfp8_gemm_nt(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b, const at::Tensor& sfb,
                         c10::ScalarType out_dtype);
at::Tensor mxfp8_gemm_nt_meta(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                              const at::Tensor& sfb, c10::ScalarType out_dtype);
#endif

}  // namespace snip

// ---- optimizer (csrc/optim; semantics: snip_ops.optim.adamw_step_reference) ----
#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

namespace snip {

// One fused AdamW step over lists of contiguous CUDA tensors of one dtype each (params and grads
// float32 or bfloat16; moments float32 or bfloat16), updated in place.
void adamw_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
            at::IntArrayRef param_indices, at::IntArrayRef index_bases, double decay, double beta1,
            double one_minus_beta1, double beta2, double one_minus_beta2, double inv_bias_correction2_sqrt,
            double step_size, double eps, int64_t step, int64_t seed, bool bf16_sr);

}  // namespace snip
