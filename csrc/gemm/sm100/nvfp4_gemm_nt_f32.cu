// nvfp4_gemm_nt: nvfp4 x nvfp4 (E2M1, E4M3 scales per 16, FP32 alpha) -> FP32 (wgrad), sm_100a tcgen05, 2-SM 256x256x256 tile.
// One instantiation per file so that the (slow) CUTLASS translation units build in parallel.
// Compiled and disassembled only: never run (no Blackwell GPU available; csrc/gemm/README.md).
#include "gemm/sm100/blockscaled_gemm_nt.cuh"

namespace snip::gemm::sm100 {
extern const BlockScaledVariant kVariant_nvfp4_f32;
const BlockScaledVariant kVariant_nvfp4_f32 = {"nvfp4_256x256x256_2sm_f32", BlockScaledKind::kNVFP4, OutDType::kF32, 16, 256, 256, 256,
                                          &NvFp4Gemm<float>::workspace_size, &NvFp4Gemm<float>::run};
}  // namespace snip::gemm::sm100
