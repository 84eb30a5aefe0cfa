// CUTLASS's host reference GEMM and can_implement for snip's Hopper blockwise FP8 GEMMs
// (csrc/gemm/sm90/fp8_gemm_nt_blockwise.cuh), over operands as snip_C::fp8_gemm_nt_blockwise receives
// them (tests/native/cutlass_host_reference.cuh says how; tests/ops/test_cutlass_host_reference.py
// uses it). Compiled by nvcc for sm_90a with the extension's flags, as host code only.
#include "cutlass_host_reference.cuh"

#include "gemm/sm90/fp8_gemm_nt_blockwise.cuh"

using namespace snip::gemm::sm90;

// One line per instantiation in csrc/gemm/sm90/fp8_gemm_nt_blockwise_<name>.cu.
const snip_ref::Variant kSnipRefVariants[] = {
    SNIP_REF_FP8_BLOCKWISE("b128_bf16_128x128", Fp8Cooperative128x128<cutlass::float_e4m3_t, 128, cutlass::bfloat16_t>),
    SNIP_REF_FP8_BLOCKWISE("b128_bf16_64x128", Fp8Pingpong64x128<cutlass::float_e4m3_t, 128, cutlass::bfloat16_t>),
    SNIP_REF_FP8_BLOCKWISE("b128_f32_128x128", Fp8Cooperative128x128<cutlass::float_e4m3_t, 128, float>),
    SNIP_REF_FP8_BLOCKWISE("b1_bf16_128x128", Fp8Cooperative128x128<cutlass::float_e4m3_t, 1, cutlass::bfloat16_t>),
    SNIP_REF_FP8_BLOCKWISE("b1_f32_128x128", Fp8Cooperative128x128<cutlass::float_e4m3_t, 1, float>),
    SNIP_REF_FP8_BLOCKWISE("e5m2_b128_bf16_128x128", Fp8Cooperative128x128<cutlass::float_e5m2_t, 128, cutlass::bfloat16_t>),
    SNIP_REF_FP8_BLOCKWISE("e5m2_b128_f32_128x128", Fp8Cooperative128x128<cutlass::float_e5m2_t, 128, float>),
    SNIP_REF_FP8_BLOCKWISE("e5m2_b1_f32_128x128", Fp8Cooperative128x128<cutlass::float_e5m2_t, 1, float>),
    SNIP_REF_FP8_BLOCKWISE("b128_bf16_128x128_overlapped",
                           Fp8Cooperative128x128Overlapped<cutlass::float_e4m3_t, 128, cutlass::bfloat16_t>),
    SNIP_REF_FP8_BLOCKWISE("b1_f32_128x128_overlapped", Fp8Cooperative128x128Overlapped<cutlass::float_e4m3_t, 1, float>),
    SNIP_REF_FP8_BLOCKWISE("b128_bf16_128x128_c2x1_overlapped",
                           Fp8Cooperative128x128Cluster2x1Overlapped<cutlass::float_e4m3_t, 128, cutlass::bfloat16_t>),
    SNIP_REF_FP8_BLOCKWISE("e5m2_b128_bf16_128x128_overlapped",
                           Fp8Cooperative128x128Overlapped<cutlass::float_e5m2_t, 128, cutlass::bfloat16_t>),
    SNIP_REF_FP8_BLOCKWISE("e5m2_b1_f32_128x128_overlapped", Fp8Cooperative128x128Overlapped<cutlass::float_e5m2_t, 1, float>),
    SNIP_REF_FP8_BLOCKWISE_PER_ROW_B(
        "b128_bf16_128x192", Fp8Cooperative128x192<cutlass::float_e4m3_t, cutlass::bfloat16_t, BScales::kBlockPerThird>),
    SNIP_REF_FP8_BLOCKWISE("b1_bf16_128x192",
                           Fp8Cooperative128x192<cutlass::float_e4m3_t, cutlass::bfloat16_t, BScales::kRow>),
    SNIP_REF_FP8_BLOCKWISE("b1_f32_128x192", Fp8Cooperative128x192<cutlass::float_e4m3_t, float, BScales::kRow>),
};
const int kSnipRefVariantCount = int(sizeof(kSnipRefVariants) / sizeof(kSnipRefVariants[0]));
