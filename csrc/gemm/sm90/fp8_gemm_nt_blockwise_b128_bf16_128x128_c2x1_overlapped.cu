// fp8_gemm_nt_blockwise instantiation "b128_bf16_128x128_c2x1_overlapped": E4M3 A, B 128x128 scale blocks (fprop, dgrad), BF16 out, 128x128 cooperative tile, cluster 2x1 (B multicast), scale promotion overlapped with the next K tile's wgmmas.
// One instantiation per file so that the (slow) CUTLASS translation units build in parallel.
#include "gemm/sm90/fp8_gemm_nt_blockwise.cuh"

namespace snip::gemm::sm90 {
using Cfg_b128_bf16_128x128_c2x1_overlapped = Fp8Cooperative128x128Cluster2x1Overlapped<cutlass::float_e4m3_t, 128, cutlass::bfloat16_t>;
extern const Fp8BlockwiseVariant kFp8Variant_b128_bf16_128x128_c2x1_overlapped;
const Fp8BlockwiseVariant kFp8Variant_b128_bf16_128x128_c2x1_overlapped = {"b128_bf16_128x128_c2x1_overlapped", 90, Fp8Element::kE4M3, 128, OutDType::kBF16, 128, 128,
    2, 1, "cooperative", &Cfg_b128_bf16_128x128_c2x1_overlapped::workspace_size, &Cfg_b128_bf16_128x128_c2x1_overlapped::run, true};
}  // namespace snip::gemm::sm90
