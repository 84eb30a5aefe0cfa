// nvfp4_gemm_nt: nvfp4 x nvfp4 (E2M1, E4M3 scales per 16, FP32 alpha) -> BF16, sm_100a tcgen05, 2-SM 256x256x256 tile.
// One instantiation per file so that the (slow) CUTLASS translation units build in parallel.
// Compiled and disassembled only: never run (no Blackwell GPU available; csrc/gemm/README.md).
#include "gemm/sm100/blockscaled_gemm_nt.cuh"

namespace snip::gemm::sm100 {
extern const BlockScaledVariant kVariant_nvfp4;
const BlockScaledVariant kVariant_nvfp4 = {"nvfp4_256x256x256_2sm", BlockScaledKind::kNVFP4, OutDType::kBF16, 16, 256, 256, 256,
                                          &NvFp4Gemm<cutlass::bfloat16_t>::workspace_size, &NvFp4Gemm<cutlass::bfloat16_t>::run};
}  // namespace snip::gemm::sm100
