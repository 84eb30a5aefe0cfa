// fp8_gemm_nt_blockwise instantiation "sm100_e5m2_b128_bf16_256x128_2sm": E5M2 A (fp8_e5m2grad gradients), B 128x128 scale blocks (fprop, dgrad), BF16 out, 256x128 tile per SM pair (2-SM tcgen05 MMA, 128x128 per CTA), cluster 2x1.
// One instantiation per file so that the (slow) CUTLASS translation units build in parallel.
// Compiled and disassembled only: never run (no Blackwell GPU available; csrc/gemm/README.md).
#include "gemm/sm100/fp8_gemm_nt_blockwise_sm100.cuh"

namespace snip::gemm::sm100 {
using Cfg_sm100_e5m2_b128_bf16_256x128_2sm = Fp8Sm100TwoSm256x128<cutlass::float_e5m2_t, 128, cutlass::bfloat16_t>;
extern const Fp8BlockwiseVariant kFp8Variant_sm100_e5m2_b128_bf16_256x128_2sm;
const Fp8BlockwiseVariant kFp8Variant_sm100_e5m2_b128_bf16_256x128_2sm = {"sm100_e5m2_b128_bf16_256x128_2sm", 100, Fp8Element::kE5M2, 128, OutDType::kBF16, 128, 128,
    2, 1, "2sm", &Cfg_sm100_e5m2_b128_bf16_256x128_2sm::workspace_size, &Cfg_sm100_e5m2_b128_bf16_256x128_2sm::run};
}  // namespace snip::gemm::sm100
