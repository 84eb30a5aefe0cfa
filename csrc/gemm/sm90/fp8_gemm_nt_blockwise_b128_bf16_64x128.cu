// fp8_gemm_nt_blockwise instantiation "b128_bf16_64x128": E4M3 A, B 128x128 scale blocks (fprop, dgrad), BF16 out, 64x128 pingpong tile.
// One instantiation per file so that the (slow) CUTLASS translation units build in parallel.
#include "gemm/sm90/fp8_gemm_nt_blockwise.cuh"

namespace snip::gemm::sm90 {
using Cfg_b128_bf16_64x128 = Fp8Pingpong64x128<cutlass::float_e4m3_t, 128, cutlass::bfloat16_t>;
extern const Fp8BlockwiseVariant kFp8Variant_b128_bf16_64x128;
const Fp8BlockwiseVariant kFp8Variant_b128_bf16_64x128 = {"b128_bf16_64x128", 90, Fp8Element::kE4M3, 128, OutDType::kBF16, 64, 128,
    1, 1, "pingpong", &Cfg_b128_bf16_64x128::workspace_size, &Cfg_b128_bf16_64x128::run};
}  // namespace snip::gemm::sm90
