// Launchers of the quantization kernels (snip_C::quantize). Plain CUDA types only, so the .cu files
// never include torch headers. Semantics: snip_ops.reference.quantize, bit for bit; the layouts of
// the optional GEMM-ready outputs: snip_ops.scale_layout.
#pragma once
#include <cstdint>
#if SNIP_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace snip::quant {

enum class InputDType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };
enum class Elem : int { kE4M3 = 0, kE5M2 = 1, kE2M1 = 2 };
enum class ScaleKind : int { kFP32 = 0, kPow2 = 1, kE8M0 = 2, kNVFP4 = 3 };

// Points of nvfp4_train's random Hadamard transform (hadamard.cuh): one group per 1x16 block.
constexpr int kHadamardSize = 16;

// The kernel-backed subset of formats.QuantSpec: blocks (1, 16|32|128) or (16|128, same).
struct Spec {
  Elem elem;
  int block_rows;
  int block_cols;
  ScaleKind scale;
  bool sr;
};

// Where an output's block scales go (snip_ops/scale_layout.py). kPlain: [outer blocks, nblk]
// row-major. kBlackwell: CUTLASS's Sm1xxBlockScaledConfig atoms (1-byte scales, 1-D blocks).
// kHopper: the plain grid transposed, [nblk, mn_pitch] with mn_pitch = round_up(outer blocks, 4): the
// MN-major float32 scales the sm_90a blockwise GEMM reads, so no GEMM call relays them out.
enum class ScaleLayout : int { kPlain = 0, kBlackwell = 1, kHopper = 2 };

// One output direction: codes of x (row) or of x^T (col), blocks running along its rows.
// `codes == nullptr`: not requested.
struct Output {
  void* codes = nullptr;     // [outer, inner_store] codes (FP4: packed, ceil(inner_store / 2) bytes per row)
  int64_t ld = 0;            // row stride of `codes`, bytes
  int64_t inner_store = 0;   // elements per row written: the inner extent plus zero padding
  void* scales = nullptr;    // in `layout`
  int64_t nblk = 0;          // scales per row = ceil(inner_store / block along the inner dim)
  ScaleLayout layout = ScaleLayout::kPlain;
  int64_t mn_pitch = 0;      // kHopper: elements between the scales of consecutive blocks along a row
  uint64_t offset = 0;       // Philox offset of this output's SR bits
};

// Philox4x32-10's ten round keys under one seed (quant_math.cuh, philox_key).
struct PhiloxKey {
  uint32_t k[10][2];
};

struct Args {
  const void* x;             // [rows, cols], unit stride along cols
  InputDType dtype;
  int64_t rows, cols, ld;    // ld: row stride of x, elements
  Spec spec;
  uint64_t seed;
  PhiloxKey key{};           // philox_key(seed), for the kernels that read it: their launchers fill it
                             // (quant_io.cuh, `keyed`)
  Output row, col;
  const float* tensor_amax;  // NVFP4: device float32 tensor amax (read by the kernels, no host sync)
  float* tensor_scale;       // NVFP4: device float32 written with the tensor scale
  // The column output quantizes (T x)^T, T the 16-point random Hadamard transform on x's rows with
  // these signs (hadamard.cuh): column-only, 1x16 blocks; rows of x past `rows` up to col.inner_store
  // are zeros that the transform mixes in (the caller pads that to a multiple of 16).
  bool hadamard = false;
  uint32_t hadamard_signs = 0;
};

#if SNIP_WITH_CUDA
// Row-wise only with 1-D blocks: one pass, a thread per 32 consecutive elements (16 for 1x16 blocks;
// quantize_rows.cu).
cudaError_t launch_quantize_rows(const Args& a, cudaStream_t stream);
// Column-wise, row+column fused, and 2-D blocks: 128x128 tiles through shared memory (quantize_tile.cu).
cudaError_t launch_quantize_tile(const Args& a, cudaStream_t stream);
// max |x| of the whole tensor into *amax (which must hold +0.0 before the launch); NaN/Inf give a
// non-finite result (quantize_amax.cu).
cudaError_t launch_quantize_tensor_amax(const void* x, InputDType dtype, int64_t rows, int64_t cols, int64_t ld,
                                        float* amax, cudaStream_t stream);
// The same for T x, x's rows zero-padded to a multiple of 16 (quantize_amax.cu).
cudaError_t launch_quantize_tensor_amax_hadamard(const void* x, InputDType dtype, int64_t rows, int64_t cols,
                                                 int64_t ld, uint32_t signs, float* amax, cudaStream_t stream);

// Codes + plain scales -> float32 or bfloat16 values [rows, cols] contiguous (dequantize.cu).
// `codes` [rows, >= cols] with row stride ld bytes; scales [>= ceil(rows / block_rows),
// >= ceil(cols / block_cols)] with row stride lds elements, float32 or one byte (E8M0 / E4M3);
// tensor_scale: NVFP4 device float32, else nullptr.
cudaError_t launch_dequantize(const void* codes, int64_t ld, const void* scales, int64_t lds, const float* tensor_scale,
                              const Spec& spec, int64_t rows, int64_t cols, void* out, bool out_bf16,
                              cudaStream_t stream);
// Packed E2M1 codes [rows, cols] (row stride ld bytes, element 2j in the low nibble of byte j) ->
// E4M3 bytes of the same values [rows_out, cols_out] (row stride ld_out), zeros past rows / cols
// (e2m1_as_e4m3.cu).
cudaError_t launch_e2m1_as_e4m3(const uint8_t* codes, int64_t ld, int64_t rows, int64_t cols, uint8_t* out,
                                int64_t ld_out, int64_t rows_out, int64_t cols_out, cudaStream_t stream);
#endif  // SNIP_WITH_CUDA

}  // namespace snip::quant
