// mxfp4_gemm_nt: mxfp4 x mxfp4 (E2M1, E8M0 scales per 32) -> FP32 (wgrad), sm_100a tcgen05, 2-SM 256x256x256 tile.
// One instantiation per file so that the (slow) CUTLASS translation units build in parallel.
// Compiled and disassembled only: never run (no Blackwell GPU available; csrc/gemm/README.md).
#include "gemm/sm100/blockscaled_gemm_nt.cuh"

namespace snip::gemm::sm100 {
extern const BlockScaledVariant kVariant_mxfp4_f32;
const BlockScaledVariant kVariant_mxfp4_f32 = {"mxfp4_256x256x256_2sm_f32", BlockScaledKind::kMXFP4, OutDType::kF32, 32, 256, 256, 256,
                                          &MxFp4Gemm<float>::workspace_size, &MxFp4Gemm<float>::run};
}  // namespace snip::gemm::sm100
