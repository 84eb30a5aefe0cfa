// Packed E2M1 codes -> E4M3 bytes of the same values, the FP4 operands of the FP8 blockwise GEMMs
// (Hopper has no FP4 tensor cores; every E2M1 value is an E4M3 value, so the FP8 kernel computes the
// very same products). One pass: a thread reads 8 codes (4 bytes) and writes their 8 E4M3 bytes,
// zeros in the GEMM's padding rows and columns, so the operand needs no other copy.
#include "kernel_launch.cuh"
#include "quant/quant_math.cuh"
#include "quant/quantize.h"

namespace snip::quant {
namespace {

constexpr int kGroup = 8;                   // output columns per thread
constexpr int kGroupsX = 32, kRowsY = 8;    // a CTA: 32 groups (256 columns) x 8 rows

__global__ void __launch_bounds__(kGroupsX * kRowsY)
e2m1_as_e4m3_kernel(const uint8_t* __restrict__ codes, int64_t ld, int64_t rows, int64_t cols,
                    uint8_t* __restrict__ out, int64_t ld_out, int64_t rows_out, int64_t cols_out, bool vec_in,
                    bool vec_out) {
  const int64_t r = int64_t(blockIdx.x) * kRowsY + threadIdx.y;
  const int64_t c0 = (int64_t(blockIdx.y) * kGroupsX + threadIdx.x) * kGroup;
  if (r >= rows_out || c0 >= cols_out) return;
  uint32_t packed = 0;  // the 8 codes, code i in bits 4i .. 4i+3 (zero: padding)
  if (r < rows && c0 < cols) {
    const uint8_t* src = codes + r * ld + c0 / 2;
    if (vec_in && c0 + kGroup <= cols) {
      packed = *reinterpret_cast<const uint32_t*>(src);
    } else {
      for (int b = 0; b < kGroup / 2 && c0 + 2 * b < cols; ++b) {
        const uint32_t byte = src[b];
        packed |= (c0 + 2 * b + 1 < cols ? byte : byte & 0xFu) << (8 * b);
      }
    }
  }
  uint32_t lo = 0, hi = 0;
#pragma unroll
  for (int i = 0; i < kGroup / 2; ++i) {
    lo |= e2m1_as_e4m3_byte((packed >> (4 * i)) & 0xFu) << (8 * i);
    hi |= e2m1_as_e4m3_byte((packed >> (4 * i + 16)) & 0xFu) << (8 * i);
  }
  uint8_t* dst = out + r * ld_out + c0;
  if (vec_out && c0 + kGroup <= cols_out) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(lo, hi);
  } else {
    for (int i = 0; i < kGroup && c0 + i < cols_out; ++i) dst[i] = uint8_t((i < 4 ? lo : hi) >> (8 * (i % 4)));
  }
}

}  // namespace

cudaError_t launch_e2m1_as_e4m3(const uint8_t* codes, int64_t ld, int64_t rows, int64_t cols, uint8_t* out,
                                int64_t ld_out, int64_t rows_out, int64_t cols_out, cudaStream_t stream) {
  if (rows_out <= 0 || cols_out <= 0) return cudaSuccess;
  const int64_t groups = (cols_out + kGroup - 1) / kGroup;
  const int64_t grid_x = (rows_out + kRowsY - 1) / kRowsY, grid_y = (groups + kGroupsX - 1) / kGroupsX;
  if (grid_x > 0x7FFFFFFF || grid_y > 65535) return cudaErrorInvalidValue;
  const bool vec_in = reinterpret_cast<uintptr_t>(codes) % 4 == 0 && ld % 4 == 0;
  const bool vec_out = reinterpret_cast<uintptr_t>(out) % 8 == 0 && ld_out % 8 == 0;
  launch_kernel(e2m1_as_e4m3_kernel, dim3(unsigned(grid_x), unsigned(grid_y)), dim3(kGroupsX, kRowsY), 0, stream,
                codes, ld, rows, cols, out, ld_out, rows_out, cols_out, vec_in, vec_out);
  return cudaGetLastError();
}

}  // namespace snip::quant
