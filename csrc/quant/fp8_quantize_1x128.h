// Launcher of the FP8 E4M3 1x128 row-wise quantizer. Plain CUDA types only, so the .cu file never
// includes torch headers (faster nvcc, no host-compiler/torch-header friction in device code).
#pragma once
#include <cstdint>
#include <cuda_runtime_api.h>

namespace snip {

enum class InputDType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// x: [M, K] row-major; codes: [M, K] e4m3 bytes; scales: [M, ceil(K/128)] float32 row-major.
// Requires M > 0 and K > 0. Returns the launch error (cudaSuccess if launched).
cudaError_t launch_fp8_quantize_1x128(const void* x, InputDType dtype, uint8_t* codes, float* scales,
                                      int64_t M, int64_t K, bool pow2_scale, cudaStream_t stream);

}  // namespace snip
