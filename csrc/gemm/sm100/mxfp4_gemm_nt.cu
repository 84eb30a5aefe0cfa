// mxfp4_gemm_nt: mxfp4 x mxfp4 (E2M1, E8M0 scales per 32) -> BF16, sm_100a tcgen05, 2-SM 256x256x256 tile.
// One instantiation per file so that the (slow) CUTLASS translation units build in parallel.
// Compiled and disassembled only: never run (no Blackwell GPU available; csrc/gemm/README.md).
#include "gemm/sm100/blockscaled_gemm_nt.cuh"

namespace snip::gemm::sm100 {
extern const BlockScaledVariant kVariant_mxfp4;
const BlockScaledVariant kVariant_mxfp4 = {"mxfp4_256x256x256_2sm", BlockScaledKind::kMXFP4, OutDType::kBF16, 32, 256, 256, 256,
                                          &MxFp4Gemm<cutlass::bfloat16_t>::workspace_size, &MxFp4Gemm<cutlass::bfloat16_t>::run};
}  // namespace snip::gemm::sm100
