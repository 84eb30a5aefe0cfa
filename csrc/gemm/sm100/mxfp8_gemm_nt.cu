// mxfp8_gemm_nt: mxfp8 x mxfp8 (E4M3, E8M0 scales per 32) -> BF16, sm_100a tcgen05, 2-SM 256x256x128 tile.
// One instantiation per file so that the (slow) CUTLASS translation units build in parallel.
// Compiled and disassembled only: never run (no Blackwell GPU available; csrc/gemm/README.md).
#include "gemm/sm100/blockscaled_gemm_nt.cuh"

namespace snip::gemm::sm100 {
extern const BlockScaledVariant kVariant_mxfp8;
const BlockScaledVariant kVariant_mxfp8 = {"mxfp8_256x256x128_2sm", BlockScaledKind::kMXFP8, OutDType::kBF16, 32, 256, 256, 128,
                                          &MxFp8Gemm<cutlass::bfloat16_t>::workspace_size, &MxFp8Gemm<cutlass::bfloat16_t>::run};
}  // namespace snip::gemm::sm100
