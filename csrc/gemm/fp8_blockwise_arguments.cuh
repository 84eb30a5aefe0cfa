// CUTLASS arguments of the FP8 blockwise GEMMs from snip's launcher arguments (Fp8BlockwiseArgs),
// shared by the Hopper (sm90/fp8_gemm_nt_blockwise.cuh) and Blackwell
// (sm100/fp8_gemm_nt_blockwise_sm100.cuh) kernels: both take the same operands, the same MN-major
// FP32 scale layout and the same epilogue (D = acc (+ bias[n]) (+ D)), so one builder serves both.
// `Gemm` is the kernel's configuration struct: GemmKernel, LayoutSFA/LayoutSFB, ElementA/B/D,
// kBlockN and kScaleK.
#pragma once

#include "cute/tensor.hpp"

#include "gemm/gemm_args.h"

namespace snip::gemm {

// A scale tensor [ceil(K / kScaleK), rows] with row stride ld, MN-major, as a CuTe layout of shape
// ((kBlockRows, rows), (kScaleK, K blocks), L = 1): one scale per kBlockRows x kScaleK block.
template <class LayoutSF, int kBlockRows, int kScaleK>
LayoutSF mn_major_scale_layout(int rows, int64_t ld, int k) {
  using namespace cute;
  const int kb = (k + kScaleK - 1) / kScaleK;
  return LayoutSF{make_shape(make_shape(Int<kBlockRows>{}, int32_t(rows)), make_shape(Int<kScaleK>{}, int32_t(kb)),
                             int32_t(1)),
                  make_stride(make_stride(_0{}, _1{}), make_stride(_0{}, int32_t(ld)), int32_t(ld * kb))};
}

template <class Gemm>
typename Gemm::LayoutSFA fp8_blockwise_layout_sfa(const Fp8BlockwiseArgs& p) {
  return mn_major_scale_layout<typename Gemm::LayoutSFA, 1, Gemm::kScaleK>(p.sfa_rows, p.ld_sfa, p.k);
}

template <class Gemm>
typename Gemm::LayoutSFB fp8_blockwise_layout_sfb(const Fp8BlockwiseArgs& p) {
  return mn_major_scale_layout<typename Gemm::LayoutSFB, Gemm::kBlockN, Gemm::kScaleK>(p.sfb_rows, p.ld_sfb, p.k);
}

template <class Gemm>
typename Gemm::GemmKernel::Arguments fp8_blockwise_arguments(const Fp8BlockwiseArgs& p) {
  using namespace cute;
  using GemmKernel = typename Gemm::GemmKernel;
  using ElementA = typename Gemm::ElementA;
  using ElementB = typename Gemm::ElementB;
  using ElementD = typename Gemm::ElementD;
  const typename GemmKernel::StrideA stride_a = make_stride(int64_t(p.lda), _1{}, int64_t(0));
  const typename GemmKernel::StrideB stride_b = make_stride(int64_t(p.ldb), _1{}, int64_t(0));
  const typename GemmKernel::StrideD stride_d = make_stride(int64_t(p.ldd), _1{}, int64_t(0));
  auto* d = static_cast<ElementD*>(p.d);
  typename GemmKernel::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {p.m, p.n, p.k, 1},
      {static_cast<ElementA const*>(p.a), stride_a, static_cast<ElementB const*>(p.b), stride_b, p.sfa,
       fp8_blockwise_layout_sfa<Gemm>(p), p.sfb, fp8_blockwise_layout_sfb<Gemm>(p)},
      // C aliases D: read only when accumulating (beta = 1); with beta = 0 it is never loaded.
      {{}, d, stride_d, d, stride_d}};
  auto& fusion = args.epilogue.thread;
  fusion.alpha = 1.0f;
  fusion.beta = p.accumulate ? 1.0f : 0.0f;
  fusion.bias_ptr = p.bias;
  args.hw_info.device_id = p.device;
  args.hw_info.sm_count = p.sm_count;
  using RasterOptions = typename GemmKernel::TileScheduler::RasterOrderOptions;
  args.scheduler.raster_order = p.raster == Raster::kAlongM   ? RasterOptions::AlongM
                                : p.raster == Raster::kAlongN ? RasterOptions::AlongN
                                                              : RasterOptions::Heuristic;
  args.scheduler.max_swizzle_size = p.swizzle;
  return args;
}

}  // namespace snip::gemm
