// Configuration choice for the Blackwell block-scaled GEMMs (plain C++). One configuration per
// format is compiled today (2-SM MMA, 256x256 tile, cluster 2x1: the large-GEMM configuration of
// CUTLASS example 72), so the choice is trivial; this is where a second instantiation (e.g. a
// 1-SM 128x128 tile for small M) would be selected -- untuned: no Blackwell GPU was available.
#pragma once
#include <vector>

#include "gemm/gemm_args.h"

namespace snip::gemm::sm100 {

inline const BlockScaledVariant* choose_blockscaled_variant(const std::vector<const BlockScaledVariant*>& compiled,
                                                            int m, int n, int k) {
  (void)m, (void)n, (void)k;
  return compiled.empty() ? nullptr : compiled.front();
}

}  // namespace snip::gemm::sm100
