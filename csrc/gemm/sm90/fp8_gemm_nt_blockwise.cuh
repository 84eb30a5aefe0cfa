// Hopper (sm_90a) FP8 block-scaled GEMM, E4M3 x E4M3 or E5M2 x E4M3, "NT" (both operands K-major):
// warp-specialized persistent kernel, TMA loads, wgmma (QGMMA) with FP32 accumulation and the
// per-128-K-block scale promotion of CUTLASS's MainloopSm90TmaGmmaWarpSpecializedBlockwiseFP8
// (example 67), epilogue D = acc (+ bias[n]) (+ D) through TMA.
//
// Included by one .cu per instantiation (sm90/fp8_gemm_nt_blockwise_<variant>.cu), so the
// instantiations compile in parallel. Template parameters:
//   ElementA    cutlass::float_e4m3_t, or cutlass::float_e5m2_t for the gradients of the
//               fp8_e5m2grad recipe (dgrad A = dy, wgrad A = dy^T); B is always E4M3. wgmma
//               multiplies the mixed pair natively (QGMMA...E5M2.E4M3).
//   kBlockN     B's scale granularity along N: 128 (128x128 weight blocks: fprop, dgrad) or
//               1 (1x128 rows: wgrad, where B = x^T is quantized along the token dimension).
//               A always has 1x128 blocks (one scale per row and 128-wide K block).
//   ElementD    cutlass::bfloat16_t or float (also the type of the accumulate source C = D).
//   TileShape / ClusterShape / KernelSchedule / EpilogueSchedule: the tile configuration.
//   MainloopOf  the consumer over CUTLASS's built mainloop (`MainloopOf<Built>`): CutlassMainloop, Built
//               itself (each K tile's scale promotion waits for its wgmmas);
//               OverlappedPromotionMainloop (overlapped_promotion_mainloop.cuh: promotes K tile t while
//               t+1 runs, the same arithmetic); WideTileMainloopOf<...>::Mainloop
//               (wide_tile_mainloop.cuh: 192-wide tiles, with kBlockN = 1 in either case).
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
#include "gemm/fp8_blockwise_arguments.cuh"
#include "gemm/gemm_args.h"
#include "gemm/sm90/overlapped_promotion_mainloop.cuh"
#include "gemm/sm90/wide_tile_mainloop.cuh"

namespace snip::gemm::sm90 {

// One entry per A element type, so that each has its own name in the SASS (scripts/check_sass.sh)
// and its own self-check (snip_ops/self_check.py): fp8_gemm_nt_blockwise_kernel (E4M3 A),
// fp8_gemm_nt_blockwise_e5m2_kernel (E5M2 A).
SNIP_DEFINE_GEMM_ENTRY(fp8_gemm_nt_blockwise)
SNIP_DEFINE_GEMM_ENTRY(fp8_gemm_nt_blockwise_e5m2)

using namespace cute;

template <class Built>
using CutlassMainloop = Built;

template <class ElementA_, int kBlockN_, class ElementD_, class TileShape_, class ClusterShape_,
          class KernelSchedule_, class EpilogueSchedule_, template <class> class MainloopOf = CutlassMainloop>
struct Fp8GemmNtBlockwise {
  using Self = Fp8GemmNtBlockwise;
  static constexpr int kBlockN = kBlockN_;
  static_assert(kBlockN == 1 || kBlockN == 128, "B scale blocks are 1x128 or 128x128");
  static_assert(cute::is_same_v<ElementA_, cutlass::float_e4m3_t> || cute::is_same_v<ElementA_, cutlass::float_e5m2_t>,
                "A is E4M3 or E5M2");
  using ElementA = ElementA_;
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

  using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, cute::tuple<LayoutA, LayoutSFA>, kAlignA,
      ElementB, cute::tuple<LayoutB, LayoutSFB>, kAlignB, ElementAccumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule_>::CollectiveOp;
  using CollectiveMainloop = MainloopOf<BuiltMainloop>;

  // Persistent tile scheduler (deterministic: no split/stream-K reduction).
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                          CollectiveEpilogue>;

  // The CUTLASS arguments (the same builder as the sm100 kernel's: fp8_blockwise_arguments.cuh).
  static LayoutSFA layout_sfa(const Fp8BlockwiseArgs& p) { return fp8_blockwise_layout_sfa<Self>(p); }
  static LayoutSFB layout_sfb(const Fp8BlockwiseArgs& p) { return fp8_blockwise_layout_sfb<Self>(p); }
  static typename GemmKernel::Arguments arguments(const Fp8BlockwiseArgs& p) { return fp8_blockwise_arguments<Self>(p); }

  static size_t workspace_size(const Fp8BlockwiseArgs& p) { return GemmKernel::get_workspace_size(arguments(p)); }

  static void const* entry() {
    if constexpr (cute::is_same_v<ElementA, cutlass::float_e5m2_t>)
      return reinterpret_cast<void const*>(&fp8_gemm_nt_blockwise_e5m2_kernel<GemmKernel>);
    else
      return reinterpret_cast<void const*>(&fp8_gemm_nt_blockwise_kernel<GemmKernel>);
  }

  static LaunchResult run(const Fp8BlockwiseArgs& p, void* workspace, cudaStream_t stream) {
    return run_gemm_kernel<GemmKernel>(arguments(p), entry(), workspace, stream);
  }
};

// The tile configurations (csrc/gemm/fp8_gemm_heuristic.cpp chooses among the compiled ones).
// 128x128x128, 2 consumer warpgroups (64 rows each), cluster 1x2 (A tile multicast to 2 CTAs).
template <class ElementA, int kBlockN, class ElementD>
using Fp8Cooperative128x128 =
    Fp8GemmNtBlockwise<ElementA, kBlockN, ElementD, Shape<_128, _128, _128>, Shape<_1, _2, _1>,
                       cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise,
                       cutlass::epilogue::TmaWarpSpecializedCooperative>;
// The same with the scale promotion of K tile t overlapping the wgmmas of t+1.
template <class ElementA, int kBlockN, class ElementD>
using Fp8Cooperative128x128Overlapped =
    Fp8GemmNtBlockwise<ElementA, kBlockN, ElementD, Shape<_128, _128, _128>, Shape<_1, _2, _1>,
                       cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise,
                       cutlass::epilogue::TmaWarpSpecializedCooperative, OverlappedPromotionMainloop>;
// The same with a 2x1 cluster: B's tile multicast to the 2 CTAs that share it along M.
template <class ElementA, int kBlockN, class ElementD>
using Fp8Cooperative128x128Cluster2x1Overlapped =
    Fp8GemmNtBlockwise<ElementA, kBlockN, ElementD, Shape<_128, _128, _128>, Shape<_2, _1, _1>,
                       cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise,
                       cutlass::epilogue::TmaWarpSpecializedCooperative, OverlappedPromotionMainloop>;
// 128x192x128, 2 consumer warpgroups (64x192 each), cluster 1x2, with the wide-tile mainloop over CUTLASS's
// producer for one B scale per row (kBlockN = 1; A's scales then load with cp.async, as in the 1x128-B
// kernels). kBlockPerThird: for 128x128-block B (fprop, dgrad), whose block scales the op repeats per row;
// kRow: for 1x128 B (wgrad).
template <class ElementA, class ElementD, BScales kBScales>
using Fp8Cooperative128x192 =
    Fp8GemmNtBlockwise<ElementA, 1, ElementD, Shape<_128, _192, _128>, Shape<_1, _2, _1>,
                       cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise,
                       cutlass::epilogue::TmaWarpSpecializedCooperative, WideTileMainloopOf<kBScales>::template Mainloop>;
// 64x128x128, ping-pong consumer warpgroups (each a whole tile), no cluster: more tiles for small
// problems, and one warpgroup's epilogue overlaps the other's mainloop.
template <class ElementA, int kBlockN, class ElementD>
using Fp8Pingpong64x128 =
    Fp8GemmNtBlockwise<ElementA, kBlockN, ElementD, Shape<_64, _128, _128>, Shape<_1, _1, _1>,
                       cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8Blockwise,
                       cutlass::epilogue::TmaWarpSpecialized>;

}  // namespace snip::gemm::sm90
