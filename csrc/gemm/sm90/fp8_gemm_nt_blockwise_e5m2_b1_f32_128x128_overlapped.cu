// fp8_gemm_nt_blockwise instantiation "e5m2_b1_f32_128x128_overlapped": E5M2 A (fp8_e5m2grad gradients), B 1x128 scale blocks (wgrad), FP32 out, 128x128 cooperative tile, scale promotion overlapped with the next K tile's wgmmas.
// One instantiation per file so that the (slow) CUTLASS translation units build in parallel.
#include "gemm/sm90/fp8_gemm_nt_blockwise.cuh"

namespace snip::gemm::sm90 {
using Cfg_e5m2_b1_f32_128x128_overlapped = Fp8Cooperative128x128Overlapped<cutlass::float_e5m2_t, 1, float>;
extern const Fp8BlockwiseVariant kFp8Variant_e5m2_b1_f32_128x128_overlapped;
const Fp8BlockwiseVariant kFp8Variant_e5m2_b1_f32_128x128_overlapped = {"e5m2_b1_f32_128x128_overlapped", 90, Fp8Element::kE5M2, 1, OutDType::kF32, 128, 128,
    1, 2, "cooperative", &Cfg_e5m2_b1_f32_128x128_overlapped::workspace_size, &Cfg_e5m2_b1_f32_128x128_overlapped::run, true};
}  // namespace snip::gemm::sm90
