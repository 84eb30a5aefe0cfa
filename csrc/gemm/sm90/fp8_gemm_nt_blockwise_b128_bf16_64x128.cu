// fp8_gemm_nt_blockwise instantiation "b128_bf16_64x128": B 128x128 scale blocks (fprop, dgrad), BF16 out, 64x128 ping-pong tile (small problems).
// One instantiation per file so that the (slow) CUTLASS translation units build in parallel.
#include "gemm/sm90/fp8_gemm_nt_blockwise.cuh"

namespace snip::gemm::sm90 {
using Cfg_b128_bf16_64x128 = Fp8Pingpong64x128<128, cutlass::bfloat16_t>;
extern const Fp8BlockwiseVariant kFp8Variant_b128_bf16_64x128;
const Fp8BlockwiseVariant kFp8Variant_b128_bf16_64x128 = {"b128_bf16_64x128", 128, OutDType::kBF16, 64, 128, "pingpong",
                                                &Cfg_b128_bf16_64x128::workspace_size, &Cfg_b128_bf16_64x128::run};
}  // namespace snip::gemm::sm90
