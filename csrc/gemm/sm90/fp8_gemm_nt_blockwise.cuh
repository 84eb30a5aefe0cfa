// Hopper (sm_90a) FP8 E4M3 x E4M3 block-scaled GEMM, "NT" (both operands K-major):
// warp-specialized persistent kernel, TMA loads, wgmma (QGMMA) with FP32 accumulation and the
// per-128-K-block scale promotion of CUTLASS's MainloopSm90TmaGmmaWarpSpecializedBlockwiseFP8
// (example 67), epilogue D = acc (+ bias[n]) (+ D) through TMA.
//
// Included by one .cu per instantiation (sm90/fp8_gemm_nt_blockwise_<variant>.cu), so the
// instantiations compile in parallel. Template parameters:
//   kBlockN     B's scale granularity along N: 128 (128x128 weight blocks: fprop, dgrad) or
//               1 (1x128 rows: wgrad, where B = x^T is quantized along the token dimension).
//               A always has 1x128 blocks (one scale per row and 128-wide K block).
//   ElementD    cutlass::bfloat16_t or float (also the type of the accumulate source C = D).
//   TileShape / ClusterShape / KernelSchedule / EpilogueSchedule: the tile configuration.
//
// M, N, K tails: TMA zero-fills out-of-bounds loads of A, B and SFA, scale loads done with
// cp.async are predicated, and the epilogue's TMA store clips, so any M, N and any K that is a
// multiple of 16 (TMA's 16-byte row alignment for 1-byte elements) is computed exactly; the
// torch side checks the alignments first (fp8_gemm_nt_blockwise_op.cpp).
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/numeric_types.h"

#include "gemm/cutlass_launch.cuh"
#include "gemm/gemm_args.h"

namespace snip::gemm::sm90 {

SNIP_DEFINE_GEMM_ENTRY(fp8_gemm_nt_blockwise)

using namespace cute;

template <int kBlockN, class ElementD_, class TileShape_, class ClusterShape_, class KernelSchedule_,
          class EpilogueSchedule_>
struct Fp8GemmNtBlockwise {
  static_assert(kBlockN == 1 || kBlockN == 128, "B scale blocks are 1x128 or 128x128");
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = cutlass::float_e4m3_t;
  using ElementD = ElementD_;
  using ElementC = ElementD_;  // accumulate-into-output reads D as C
  using ElementAccumulator = float;
  using ElementCompute = float;
  using ElementBias = float;
  using LayoutA = cutlass::layout::RowMajor;     // A[M, K], K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // B^T[K, N] column-major == B[N, K], K contiguous
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignA = 16;  // elements: 16 bytes for TMA
  static constexpr int kAlignB = 16;
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;
  using TileShape = TileShape_;
  using ClusterShape = ClusterShape_;

  // One scale per 1 (M) x 128 (K) block of A and kBlockN (N) x 128 (K) block of B, both stored
  // MN-major (the layout Hopper's blockwise mainloop supports; A's scales then load with TMA).
  static constexpr int kScaleK = 128;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, kBlockN, kScaleK, cute::GMMA::Major::MN,
                                                                cute::GMMA::Major::MN>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  // D = alpha * acc + beta * C + bias[n]; a null bias pointer reads as 0, beta = 0 skips C.
  using Fusion = cutlass::epilogue::fusion::LinCombPerColBias<ElementD, ElementCompute, ElementBias, ElementC,
                                                              ElementCompute>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementCompute, ElementC, LayoutD,
      kAlignD, ElementD, LayoutD, kAlignD, EpilogueSchedule_, Fusion>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, cute::tuple<LayoutA, LayoutSFA>, kAlignA,
      ElementB, cute::tuple<LayoutB, LayoutSFB>, kAlignB, ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule_>::CollectiveOp;

  // Persistent tile scheduler (deterministic: no split/stream-K reduction).
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                          CollectiveEpilogue>;

  using StrideA = typename GemmKernel::StrideA;
  using StrideB = typename GemmKernel::StrideB;
  using StrideC = typename GemmKernel::StrideC;
  using StrideD = typename GemmKernel::StrideD;

  static LayoutSFA layout_sfa(const Fp8BlockwiseArgs& p) {
    const int kb = (p.k + kScaleK - 1) / kScaleK;
    return LayoutSFA{
        make_shape(make_shape(Int<1>{}, int32_t(p.sfa_rows)), make_shape(Int<kScaleK>{}, int32_t(kb)), int32_t(1)),
        make_stride(make_stride(_0{}, _1{}), make_stride(_0{}, int32_t(p.ld_sfa)), int32_t(p.ld_sfa * kb))};
  }
  static LayoutSFB layout_sfb(const Fp8BlockwiseArgs& p) {
    const int kb = (p.k + kScaleK - 1) / kScaleK;
    return LayoutSFB{make_shape(make_shape(Int<kBlockN>{}, int32_t(p.sfb_rows)),
                                make_shape(Int<kScaleK>{}, int32_t(kb)), int32_t(1)),
                     make_stride(make_stride(_0{}, _1{}), make_stride(_0{}, int32_t(p.ld_sfb)),
                                 int32_t(p.ld_sfb * kb))};
  }

  static typename GemmKernel::Arguments arguments(const Fp8BlockwiseArgs& p) {
    const StrideA stride_a = make_stride(int64_t(p.lda), _1{}, int64_t(0));
    const StrideB stride_b = make_stride(int64_t(p.ldb), _1{}, int64_t(0));
    const StrideD stride_d = make_stride(int64_t(p.ldd), _1{}, int64_t(0));
    auto* d = static_cast<ElementD*>(p.d);
    typename GemmKernel::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {p.m, p.n, p.k, 1},
        {static_cast<ElementA const*>(p.a), stride_a, static_cast<ElementB const*>(p.b), stride_b, p.sfa,
         layout_sfa(p), p.sfb, layout_sfb(p)},
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

  static size_t workspace_size(const Fp8BlockwiseArgs& p) { return GemmKernel::get_workspace_size(arguments(p)); }

  static LaunchResult run(const Fp8BlockwiseArgs& p, void* workspace, cudaStream_t stream) {
    return run_gemm_kernel<GemmKernel>(arguments(p),
                                       reinterpret_cast<void const*>(&fp8_gemm_nt_blockwise_kernel<GemmKernel>),
                                       workspace, stream);
  }
};

// The tile configurations (csrc/gemm/sm90/fp8_gemm_heuristic.cpp chooses among the compiled ones).
// 128x128x128, 2 consumer warpgroups (64 rows each), cluster 1x2 (A tile multicast to 2 CTAs).
template <int kBlockN, class ElementD>
using Fp8Cooperative128x128 =
    Fp8GemmNtBlockwise<kBlockN, ElementD, Shape<_128, _128, _128>, Shape<_1, _2, _1>,
                       cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise,
                       cutlass::epilogue::TmaWarpSpecializedCooperative>;
// 64x128x128, ping-pong consumer warpgroups (each a whole tile), no cluster: more tiles for small
// problems, and one warpgroup's epilogue overlaps the other's mainloop.
template <int kBlockN, class ElementD>
using Fp8Pingpong64x128 =
    Fp8GemmNtBlockwise<kBlockN, ElementD, Shape<_64, _128, _128>, Shape<_1, _1, _1>,
                       cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8Blockwise,
                       cutlass::epilogue::TmaWarpSpecialized>;

}  // namespace snip::gemm::sm90
