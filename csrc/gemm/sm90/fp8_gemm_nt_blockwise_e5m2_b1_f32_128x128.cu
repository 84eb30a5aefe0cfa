// fp8_gemm_nt_blockwise instantiation "e5m2_b1_f32_128x128": E5M2 A (fp8_e5m2grad gradients), B 1x128 scale blocks (wgrad), FP32 out (wgrad, accumulation), 128x128 cooperative tile.
// One instantiation per file so that the (slow) CUTLASS translation units build in parallel.
#include "gemm/sm90/fp8_gemm_nt_blockwise.cuh"

namespace snip::gemm::sm90 {
using Cfg_e5m2_b1_f32_128x128 = Fp8Cooperative128x128<cutlass::float_e5m2_t, 1, float>;
extern const Fp8BlockwiseVariant kFp8Variant_e5m2_b1_f32_128x128;
const Fp8BlockwiseVariant kFp8Variant_e5m2_b1_f32_128x128 = {"e5m2_b1_f32_128x128", 90, Fp8Element::kE5M2, 1, OutDType::kF32, 128, 128,
    1, 2, "cooperative", &Cfg_e5m2_b1_f32_128x128::workspace_size, &Cfg_e5m2_b1_f32_128x128::run};
}  // namespace snip::gemm::sm90
