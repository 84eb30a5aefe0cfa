// fp8_gemm_nt_blockwise instantiation "b128_bf16_128x192": E4M3 A, B 128x128 scale blocks (fprop, dgrad), BF16 out, 128x192 cooperative tile over B's block scales repeated per row (wide-tile mainloop).
// One instantiation per file so that the (slow) CUTLASS translation units build in parallel.
#include "gemm/sm90/fp8_gemm_nt_blockwise.cuh"

namespace snip::gemm::sm90 {
using Cfg_b128_bf16_128x192 = Fp8Cooperative128x192<cutlass::float_e4m3_t, cutlass::bfloat16_t, BScales::kBlockPerThird>;
extern const Fp8BlockwiseVariant kFp8Variant_b128_bf16_128x192;
const Fp8BlockwiseVariant kFp8Variant_b128_bf16_128x192 = {"b128_bf16_128x192", 90, Fp8Element::kE4M3, 128, OutDType::kBF16, 128, 192,
    1, 2, "cooperative", &Cfg_b128_bf16_128x192::workspace_size, &Cfg_b128_bf16_128x192::run};
}  // namespace snip::gemm::sm90
