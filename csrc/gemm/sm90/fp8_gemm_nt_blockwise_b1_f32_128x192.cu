// fp8_gemm_nt_blockwise instantiation "b1_f32_128x192": E4M3 A, B 1x128 scale blocks (wgrad), FP32 out, 128x192 cooperative tile (wide-tile mainloop).
// One instantiation per file so that the (slow) CUTLASS translation units build in parallel.
#include "gemm/sm90/fp8_gemm_nt_blockwise.cuh"

namespace snip::gemm::sm90 {
using Cfg_b1_f32_128x192 = Fp8Cooperative128x192<cutlass::float_e4m3_t, float, BScales::kRow>;
extern const Fp8BlockwiseVariant kFp8Variant_b1_f32_128x192;
const Fp8BlockwiseVariant kFp8Variant_b1_f32_128x192 = {"b1_f32_128x192", 90, Fp8Element::kE4M3, 1, OutDType::kF32, 128, 192,
    1, 2, "cooperative", &Cfg_b1_f32_128x192::workspace_size, &Cfg_b1_f32_128x192::run};
}  // namespace snip::gemm::sm90
