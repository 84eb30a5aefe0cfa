// Launcher interface of snip's CUTLASS GEMMs: plain C++ (no torch, no CUTLASS headers), shared by
// the instantiation translation units (*.cu, which see CUTLASS) and the torch-side op files
// (*_op.cpp, which see torch). One `*Variant` object per compiled kernel instantiation.
//
// Conventions (all GEMMs are "NT": both operands K-major, i.e. row-major A[M, K] and B[N, K]):
//   D[M, N] = A . B^T (row-major D with row stride ldd), FP32 accumulation.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_runtime_api.h>

namespace snip::gemm {

enum class OutDType : int { kBF16 = 0, kF32 = 1 };

// What a launcher reports. kCannotImplement means CUTLASS's can_implement() refused the problem
// (alignment): the torch side checks everything first, so reaching it is a bug, reported as such.
enum class LaunchStatus : int { kOk = 0, kCannotImplement = 1, kWorkspaceInit = 2, kCudaError = 3 };

struct LaunchResult {
  LaunchStatus status = LaunchStatus::kOk;
  cudaError_t cuda = cudaSuccess;
};

// Tile-scheduler knobs that are runtime arguments (no recompilation): raster order and swizzle.
enum class Raster : int { kHeuristic = 0, kAlongM = 1, kAlongN = 2 };

// ---- FP8 block-scaled GEMM with FP32 scales (csrc/gemm/sm90, csrc/gemm/sm100) -------------------
//
//   D = sum_kb (SFA[kb, m] * SFB[kb, n / b_block]) * (A[m, kb*128 : ...] . B[n, kb*128 : ...])
//       (+ bias[n]) (+ D when accumulate)
//
// A: E4M3 or E5M2 codes (the variant's Fp8Element), B: E4M3 codes. SFA: one FP32 scale per 1x128 block of A (per row m and K-block kb), stored
// MN-major: element (kb, m) at sfa[kb * ld_sfa + m], m < sfa_rows. SFB: one FP32 scale per
// b_block x 128 block of B (b_block = 128: the 128x128 weight blocks; b_block = 1: 1x128 rows),
// element (kb, j) at sfb[kb * ld_sfb + j], j < sfb_rows. sfa_rows >= M and sfb_rows >=
// ceil(N / b_block) (extra entries are never used for valid outputs).
struct Fp8BlockwiseArgs {
  int m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  const float* sfa = nullptr;
  int sfa_rows = 0;
  int64_t ld_sfa = 0;
  const float* sfb = nullptr;
  int sfb_rows = 0;
  int64_t ld_sfb = 0;
  const float* bias = nullptr;  // [N] FP32 or nullptr
  void* d = nullptr;            // [M, N] BF16 or FP32 (the variant's OutDType)
  int64_t ldd = 0;
  bool accumulate = false;      // D += A.B^T (D is also the source C, beta = 1)
  int device = 0;
  int sm_count = 0;
  Raster raster = Raster::kHeuristic;
  int swizzle = 1;  // 1, 2, 4 or 8
};

// The element type of A (B is always E4M3): E5M2 is the fp8_e5m2grad recipe's gradient.
enum class Fp8Element : int { kE4M3 = 0, kE5M2 = 1 };

struct Fp8BlockwiseVariant {
  const char* name;  // e.g. "b128_bf16_128x128", "sm100_e5m2_b1_f32_256x128_2sm"
  int arch;          // 90 (sm_90a, wgmma) or 100 (sm_100a, tcgen05)
  Fp8Element a;
  int b_block;       // 1 or 128
  OutDType out;
  int tile_m, tile_n;        // output tile of one CTA
  int cluster_m, cluster_n;  // CTAs per cluster (the persistent grid is rounded to it)
  const char* schedule;      // "cooperative" | "pingpong" | "2sm"
  size_t (*workspace_size)(const Fp8BlockwiseArgs&);
  LaunchResult (*run)(const Fp8BlockwiseArgs&, void* workspace, cudaStream_t stream);
  // sm_90a: the scale promotion of K tile t runs while K tile t+1's wgmmas do
  // (sm90/overlapped_promotion_mainloop.cuh); false: CUTLASS's, which waits for them. Same bits.
  bool overlapped_promotion = false;
};

// ---- Blackwell block-scaled GEMMs (csrc/gemm/sm100) ---------------------------------------------
//
//   D[M, N] (BF16 or FP32: the variant's OutDType) = alpha * sum_k (A[m, k] * SFA(m, k / vec)) * (B[n, k] * SFB(n, k / vec))
//
// A, B: K-major codes (FP4 packed two per byte, element 2j in the low nibble; or E4M3 bytes).
// SFA/SFB: CUTLASS's Sm1xxBlockScaledConfig layout ("128x4" atoms: 128 rows x 4 scale columns,
// 512 bytes each, atoms K-fastest; see snip_ops/gemm_kernels.py::to_blocked_scales).
// alpha: device pointer to one FP32 (nvfp4: product of the two per-tensor scales) or nullptr (1).
enum class BlockScaledKind : int { kNVFP4 = 0, kMXFP4 = 1, kMXFP8 = 2 };

struct BlockScaledArgs {
  int m = 0, n = 0, k = 0;  // k in elements
  const void* a = nullptr;
  int64_t lda = 0;  // row stride in elements
  const void* b = nullptr;
  int64_t ldb = 0;
  const void* sfa = nullptr;
  const void* sfb = nullptr;
  const float* alpha = nullptr;
  void* d = nullptr;  // [M, N], BF16 or FP32 (the variant's OutDType)
  int64_t ldd = 0;
  int device = 0;
  int sm_count = 0;
};

struct BlockScaledVariant {
  const char* name;  // e.g. "nvfp4_256x256x256_2sm"
  BlockScaledKind kind;
  OutDType out;
  int sf_vec;  // 16 (nvfp4) or 32 (mx)
  int tile_m, tile_n, tile_k;
  size_t (*workspace_size)(const BlockScaledArgs&);
  LaunchResult (*run)(const BlockScaledArgs&, void* workspace, cudaStream_t stream);
};

}  // namespace snip::gemm
