// mxfp8_gemm_nt: mxfp8 x mxfp8 (E4M3, E8M0 scales per 32) -> FP32 (wgrad), sm_100a tcgen05, 2-SM 256x256x128 tile.
// One instantiation per file so that the (slow) CUTLASS translation units build in parallel.
// Compiled and disassembled only: never run (no Blackwell GPU available; csrc/gemm/README.md).
#include "gemm/sm100/blockscaled_gemm_nt.cuh"

namespace snip::gemm::sm100 {
extern const BlockScaledVariant kVariant_mxfp8_f32;
const BlockScaledVariant kVariant_mxfp8_f32 = {"mxfp8_256x256x128_2sm_f32", BlockScaledKind::kMXFP8, OutDType::kF32, 32, 256, 256, 128,
                                          &MxFp8Gemm<float>::workspace_size, &MxFp8Gemm<float>::run};
}  // namespace snip::gemm::sm100
