// Torch-level entry points of the snip_C ops, implemented next to their kernels and registered in
// bindings.cpp. Arch-specific ops (csrc/**/sm90, csrc/**/sm100) are declared under
// SNIP_HAS_SM90 / SNIP_HAS_SM100, which CMake sets to match what is compiled.
#pragma once
#include <tuple>

#include <ATen/core/Tensor.h>

namespace snip {

// FP8 E4M3, one FP32 scale per 1x128 block along K. Returns (codes [M, K] float8_e4m3fn,
// scales [M, ceil(K/128)] float32).
std::tuple<at::Tensor, at::Tensor> fp8_quantize_1x128(const at::Tensor& x, bool pow2_scale);
std::tuple<at::Tensor, at::Tensor> fp8_quantize_1x128_meta(const at::Tensor& x, bool pow2_scale);

}  // namespace snip
