// Tile-configuration choice for the FP8 block-scaled GEMM (Hopper and Blackwell variants; plain C++,
// no CUDA/torch): kept apart from the launchers so it can be read, tested
// (snip_C::fp8_gemm_nt_blockwise_config) and tuned without touching kernel code.
#pragma once
#include <string>
#include <vector>

#include "gemm/gemm_args.h"

namespace snip::gemm {

struct TileCandidate {
  int tile_m, tile_n;           // output tile of one CTA
  int cluster_m, cluster_n;     // CTAs per cluster (the persistent grid is rounded to it)
  double efficiency;            // relative throughput of a full tile (1.0: the 128x128 kernels)
};

struct Fp8GemmChoice {
  int candidate = 0;  // index into the candidate list
  Raster raster = Raster::kHeuristic;
  int swizzle = 1;
};

// Which mainloop promotes the per-K-tile partial sums: CUTLASS's (waits for the tile's wgmmas) or
// the overlapped one (sm90/overlapped_promotion_mainloop.cuh). The heuristic picks among the
// serial variants only until GPU timings choose otherwise (snip_ops/autotune.py).
enum class Promotion : int { kHeuristic = 0, kSerial = 1, kOverlapped = 2 };

// Overrides parsed from a config string
// "tile=64x128,raster=m|n|auto,swizzle=1|2|4|8,promotion=serial|overlapped,cluster=1x2|2x1" (any
// subset, in any order; a bare "64x128" means tile=64x128). Empty string: no override. Without
// cluster=, each tile runs with its cluster of the fewest CTAs along M.
struct Fp8GemmOverride {
  int tile_m = 0, tile_n = 0;  // 0: heuristic
  int cluster_m = 0, cluster_n = 0;  // 0: the variant's own (with no 2-CTA cluster along M)
  bool has_raster = false;
  Raster raster = Raster::kHeuristic;
  int swizzle = 0;  // 0: heuristic
  Promotion promotion = Promotion::kHeuristic;
};
// Returns false and sets *error on a malformed string.
bool parse_fp8_gemm_config(const std::string& text, Fp8GemmOverride* out, std::string* error);

// The heuristic: for each candidate, the fraction of the launched SM-waves that does useful work,
// (M*N) / (waves * num_sms * tile_m * tile_n) (CTA tiles along M and N rounded up to the cluster),
// times the candidate's full-tile efficiency; the best
// wins (ties: the earlier candidate). K does not enter: every tile walks all of K. Raster order
// and swizzle stay CUTLASS's defaults (heuristic raster, no swizzle) unless overridden.
Fp8GemmChoice choose_fp8_gemm_config(int m, int n, int k, const std::vector<TileCandidate>& candidates,
                                     int num_sms);

}  // namespace snip::gemm
