// Blackwell (sm_100a) FP8 block-scaled GEMM with FP32 scales, E4M3 x E4M3 or E5M2 x E4M3, "NT"
// (both operands K-major): CUTLASS's tcgen05 blockwise mainloop (example 81,
// KernelTmaWarpSpecializedBlockwise2SmSm100): the MMA accumulates each 128-wide K block in tensor
// memory, transform warps scale the block's sum by SFA[kb, m] * SFB[kb, n / b_block] and add it to
// an FP32 accumulator -- the Hopper kernel's arithmetic (sm90/fp8_gemm_nt_blockwise.cuh) on
// Blackwell's tensor cores. Epilogue D = acc (+ bias[n]) (+ D) through TMA.
//
// The same op, arguments and scale layout as on Hopper (snip_C::fp8_gemm_nt_blockwise, dispatched by
// the device's arch in fp8_gemm_nt_blockwise_op.cpp): scales MN-major FP32 [ceil(K/128), rows],
// which CUTLASS's Sm100BlockwiseScaleConfig supports (UMMA::Major::MN, its default). The scale
// loads are cp.async copies predicated on the scale layout's extent; 128 scales of A per tile
// load 16 bytes at a time, hence rows and row strides that are multiples of 4 (as on Hopper).
//
// Template parameters:
//   ElementA  cutlass::float_e4m3_t, or cutlass::float_e5m2_t (fp8_e5m2grad gradients); B is E4M3.
//   kBlockN   B's scale granularity along N: 128 (128x128 weight blocks) or 1 (1x128, wgrad).
//   ElementD  cutlass::bfloat16_t or float (also the accumulate source C = D).
// One configuration: 2-SM MMA with a 256x128x128 tile per SM pair (128x128 per CTA), cluster 2x1,
// persistent CLC tile scheduler (the configuration of example 81's groupwise GEMM).
//
// Included by one .cu per instantiation (sm100/fp8_gemm_nt_blockwise_sm100_<variant>.cu).
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

namespace snip::gemm::sm100 {

// One entry per A element type (own names in the SASS and own self-checks, as on Hopper):
// fp8_gemm_nt_blockwise_sm100_kernel (E4M3 A), fp8_gemm_nt_blockwise_e5m2_sm100_kernel (E5M2 A).
SNIP_DEFINE_GEMM_ENTRY(fp8_gemm_nt_blockwise_sm100)
SNIP_DEFINE_GEMM_ENTRY(fp8_gemm_nt_blockwise_e5m2_sm100)

using namespace cute;

template <class ElementA_, int kBlockN_, class ElementD_, class MmaTileShape_, class ClusterShape_,
          class KernelSchedule_, class EpilogueSchedule_>
struct Fp8GemmNtBlockwiseSm100 {
  using Self = Fp8GemmNtBlockwiseSm100;
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
  using LayoutB = cutlass::layout::ColumnMajor;  // B[N, K], K contiguous
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignA = 16;  // elements: 16 bytes for TMA
  static constexpr int kAlignB = 16;
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;
  using MmaTileShape = MmaTileShape_;
  using ClusterShape = ClusterShape_;

  // One scale per 1 (M) x 128 (K) block of A and kBlockN (N) x 128 (K) block of B, both MN-major.
  static constexpr int kScaleK = 128;
  using ScaleConfig = cutlass::detail::Sm100BlockwiseScaleConfig<1, kBlockN, kScaleK, UMMA::Major::MN, UMMA::Major::MN>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  // D = alpha * acc + beta * C + bias[n]; a null bias pointer reads as 0, beta = 0 skips C.
  using Fusion = cutlass::epilogue::fusion::LinCombPerColBias<ElementD, ElementCompute, ElementBias, ElementC,
                                                              ElementCompute>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp, MmaTileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementCompute, ElementC, LayoutD,
      kAlignD, ElementD, LayoutD, kAlignD, EpilogueSchedule_, Fusion>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassTensorOp, ElementA, cute::tuple<LayoutA, LayoutSFA>, kAlignA,
      ElementB, cute::tuple<LayoutB, LayoutSFB>, kAlignB, ElementAccumulator, MmaTileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule_>::CollectiveOp;

  // Persistent CLC tile scheduler (deterministic: no split/stream-K reduction).
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                          CollectiveEpilogue, void>;

  // The scale tensors as the op passes them: [ceil(K/128), rows] with row stride ld (>= rows),
  // rows = sfa_rows (>= M) or sfb_rows (>= ceil(N / kBlockN)) (fp8_blockwise_arguments.cuh).
  static LayoutSFA layout_sfa(const Fp8BlockwiseArgs& p) { return fp8_blockwise_layout_sfa<Self>(p); }
  static LayoutSFB layout_sfb(const Fp8BlockwiseArgs& p) { return fp8_blockwise_layout_sfb<Self>(p); }
  static typename GemmKernel::Arguments arguments(const Fp8BlockwiseArgs& p) { return fp8_blockwise_arguments<Self>(p); }

  static size_t workspace_size(const Fp8BlockwiseArgs& p) { return GemmKernel::get_workspace_size(arguments(p)); }

  static void const* entry() {
    if constexpr (cute::is_same_v<ElementA, cutlass::float_e5m2_t>)
      return reinterpret_cast<void const*>(&fp8_gemm_nt_blockwise_e5m2_sm100_kernel<GemmKernel>);
    else
      return reinterpret_cast<void const*>(&fp8_gemm_nt_blockwise_sm100_kernel<GemmKernel>);
  }

  static LaunchResult run(const Fp8BlockwiseArgs& p, void* workspace, cudaStream_t stream) {
    return run_gemm_kernel<GemmKernel>(arguments(p), entry(), workspace, stream);
  }
};

// The configuration (csrc/gemm/fp8_gemm_heuristic.cpp sees one candidate per problem kind):
// 2-SM MMA, 256x128x128 tile per SM pair, cluster 2x1.
template <class ElementA, int kBlockN, class ElementD>
using Fp8Sm100TwoSm256x128 =
    Fp8GemmNtBlockwiseSm100<ElementA, kBlockN, ElementD, Shape<_256, _128, _128>, Shape<_2, _1, _1>,
                            cutlass::gemm::KernelTmaWarpSpecializedBlockwise2SmSm100,
                            cutlass::epilogue::TmaWarpSpecialized2Sm>;

}  // namespace snip::gemm::sm100
