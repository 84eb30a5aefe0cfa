// CUTLASS's host reference GEMM and can_implement for snip's Blackwell GEMMs: the block-scaled ones
// (csrc/gemm/sm100/blockscaled_gemm_nt.cuh), over operands as snip_C::{nvfp4,mxfp4,mxfp8}_gemm_nt
// receive them, and the FP8 ones with FP32 blockwise scales (fp8_gemm_nt_blockwise_sm100.cuh), as
// snip_C::fp8_gemm_nt_blockwise receives them (tests/native/cutlass_host_reference.cuh says how;
// tests/ops/test_cutlass_host_reference.py uses it). Compiled by nvcc for sm_100a with the
// extension's flags, as host code only.
#include "cutlass_host_reference.cuh"

#include "gemm/sm100/blockscaled_gemm_nt.cuh"
#include "gemm/sm100/fp8_gemm_nt_blockwise_sm100.cuh"

namespace {

using snip::gemm::BlockScaledArgs;
using namespace snip::gemm::sm100;

// The arguments blockscaled_gemm_nt_op.cpp's run() builds, without torch (which host-only code
// cannot include): the same fields from the same tensor sizes and strides. Row strides are in
// elements: packed FP4 bytes hold two.
template <class Gemm>
BlockScaledArgs make_args(int m, int n, int k, const SnipRefOperands& t, const float* alpha, void* d) {
  constexpr int64_t per_byte = 8 / cute::sizeof_bits_v<typename Gemm::ArrayElementA>;
  BlockScaledArgs args;
  args.m = m;
  args.n = n;
  args.k = k;
  args.a = t.a.data;
  args.lda = m > 1 ? per_byte * t.a.stride0 : k;
  args.b = t.b.data;
  args.ldb = n > 1 ? per_byte * t.b.stride0 : k;
  args.sfa = t.sfa.data;
  args.sfb = t.sfb.data;
  args.alpha = alpha;
  args.d = d;
  args.ldd = n;
  return args;
}

template <class Gemm>
std::string describe() {
  return std::string("a=") + snip_ref::element_name<typename Gemm::ArrayElementA>() +
         " b=" + snip_ref::element_name<typename Gemm::ArrayElementB>() +
         " sf=" + snip_ref::element_name<typename Gemm::ElementSF>() + " sfa_block=1x" + std::to_string(Gemm::kSfVec) +
         " sfb_block=1x" + std::to_string(Gemm::kSfVec) + " d=" + snip_ref::element_name<typename Gemm::ElementD>();
}

}  // namespace

// A table line for a block-scaled kernel: its variant name and its type (as its instantiation file
// spells it; the test compares the two).
#define SNIP_REF_BLOCK_SCALED(name, ...)                                                                           \
  snip_ref::Variant {                                                                                              \
    name, #__VA_ARGS__, &describe<__VA_ARGS__>, &snip_ref::can_implement<__VA_ARGS__, &make_args<__VA_ARGS__>>, \
        &snip_ref::gemm<__VA_ARGS__, &make_args<__VA_ARGS__>>                                                      \
  }

// One line per instantiation in csrc/gemm/sm100/*.cu.
const snip_ref::Variant kSnipRefVariants[] = {
    SNIP_REF_BLOCK_SCALED("nvfp4_256x256x256_2sm", NvFp4Gemm<cutlass::bfloat16_t>),
    SNIP_REF_BLOCK_SCALED("mxfp4_256x256x256_2sm", MxFp4Gemm<cutlass::bfloat16_t>),
    SNIP_REF_BLOCK_SCALED("mxfp8_256x256x128_2sm", MxFp8Gemm<cutlass::bfloat16_t>),
    SNIP_REF_BLOCK_SCALED("nvfp4_256x256x256_2sm_f32", NvFp4Gemm<float>),
    SNIP_REF_BLOCK_SCALED("mxfp4_256x256x256_2sm_f32", MxFp4Gemm<float>),
    SNIP_REF_BLOCK_SCALED("mxfp8_256x256x128_2sm_f32", MxFp8Gemm<float>),
    SNIP_REF_FP8_BLOCKWISE("sm100_b128_bf16_256x128_2sm", Fp8Sm100TwoSm256x128<cutlass::float_e4m3_t, 128, cutlass::bfloat16_t>),
    SNIP_REF_FP8_BLOCKWISE("sm100_b128_f32_256x128_2sm", Fp8Sm100TwoSm256x128<cutlass::float_e4m3_t, 128, float>),
    SNIP_REF_FP8_BLOCKWISE("sm100_b1_f32_256x128_2sm", Fp8Sm100TwoSm256x128<cutlass::float_e4m3_t, 1, float>),
    SNIP_REF_FP8_BLOCKWISE("sm100_e5m2_b128_bf16_256x128_2sm", Fp8Sm100TwoSm256x128<cutlass::float_e5m2_t, 128, cutlass::bfloat16_t>),
    SNIP_REF_FP8_BLOCKWISE("sm100_e5m2_b128_f32_256x128_2sm", Fp8Sm100TwoSm256x128<cutlass::float_e5m2_t, 128, float>),
    SNIP_REF_FP8_BLOCKWISE("sm100_e5m2_b1_f32_256x128_2sm", Fp8Sm100TwoSm256x128<cutlass::float_e5m2_t, 1, float>),
};
const int kSnipRefVariantCount = int(sizeof(kSnipRefVariants) / sizeof(kSnipRefVariants[0]));
