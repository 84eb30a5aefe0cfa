// Hopper blockwise-FP8 mainloop for 192-wide output tiles.
//
// A 128x192 output tile feeds the tensor cores more multiplies per byte of shared memory read than
// 128x128 (one m64n192k32 wgmma per warpgroup and k32 step instead of m64n128k32), and 192 is the
// widest N whose two accumulator sets (the per-K-tile partial and the promoted sum, 96 + 96 registers
// per thread) fit the 232 registers a consumer warpgroup gets. CUTLASS's own consumer cannot run it:
//   - with 128x128 weight blocks (fprop, dgrad) the tiles straddle the blocks, and CUTLASS 4.2's
//     mainloop takes one B scale per tile or one per row;
//   - with 1x128 B blocks (wgrad) it holds one B scale per accumulator column in registers, 48 more
//     per thread, and spills.
// This consumer runs over CUTLASS's producer for one B scale per row (192 per K tile into shared
// memory) in both cases, and reads B's scales in one of two ways (BScales):
//
//   kBlockPerThird  B's 128x128-block scales, handed over repeated to one per row of B (the op's
//                   per_row_b_scales). A tile starts at a multiple of 192 = 3 x 64 columns and blocks at
//                   multiples of 128, so each 64-column third of a tile lies inside one block: the
//                   consumer reads only the scales of rows 0, 64 and 128 of the tile and promotes with
//                       accum += partial * (SFA[m] * SFB[third of n])
//                   one FMUL per distinct (row, third) pair and one FFMA per element: the expression of
//                   CUTLASS's 128x128-block promotion (SFA[m] * SFB[block], then one FFMA), hence the bits
//                   of the 128x128 kernels. (CUTLASS's per-row promotion would round differently.)
//   kRow            B's own 1x128 scales: the promotion is CUTLASS's per-row expression,
//                       partial *= SFA[m];  accum += partial * SFB[n]
//                   (one FMUL and one FFMA per element, the bits of the 128x128 1x128-B kernels), with
//                   SFB[n] read from shared memory where it is used instead of held for the whole K tile.
//
// Serial promotion, as CUTLASS's: a K tile's wgmmas are issued, its A scales read while they run, then
// the warpgroup waits for them and promotes (the overlapped mainloop's second partial does not fit at
// this width). The producer side, shared storage, arguments and mma_tail() are the base's.
//
// Its tile configuration, Fp8Cooperative128x192, is in fp8_gemm_nt_blockwise.cuh with the others.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/collective_builder.hpp"

#include "gemm/sm90/blockwise_consumer.cuh"

namespace snip::gemm::sm90 {

enum class BScales { kBlockPerThird, kRow };

template <class Base, BScales kBScales>
struct WideTileMainloop : Base {
  using typename Base::DispatchPolicy;
  using typename Base::ElementBlockScale;
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutSFB;
  using typename Base::TensorStorage;
  using typename Base::TileShape;
  using typename Base::TiledMma;

  static constexpr int kThird = 64;  // the column granularity at which a 192-wide tile meets 128-row blocks
  static constexpr int kBlockRows = 128;
  static_assert(kBScales == BScales::kRow ||
                    (cute::size<1>(TileShape{}) % kThird == 0 && kBlockRows % kThird == 0),
                "every 64-column group of a tile must lie inside one 128-row block of B");
  static constexpr int kThirds = cute::size<1>(TileShape{}) / kThird;
  static_assert(Base::ScalePromotionInterval == 4, "the K tile must be one 128-wide scale block");
  static_assert(Base::ScaleMsPerTile == cute::size<0>(TileShape{}), "A has one scale per row (1x128 blocks)");
  static_assert(Base::ScaleNsPerTile == cute::size<1>(TileShape{}), "B's scales reach shared memory one per row");
  static_assert(cute::size(cute::filter_zeros(typename Base::SmemLayoutAtomSFB{})) == cute::size<1>(TileShape{}),
                "one K tile's B scales are the tile's rows, contiguous");

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& shared_tensors, Params const&) {
    using namespace cute;
    static_assert(is_rmem<FrgTensorC>::value, "the accumulator must be in registers");
    constexpr int kStages = DispatchPolicy::Stages;

    // A's scales broadcast along N (CUTLASS's view); B's broadcast along M: kRow, CUTLASS's per-row view;
    // kBlockPerThird, reading for every column the scale of the first row of its 64-column third (stride 0
    // within a third, 64 between thirds, one tile's rows per stage).
    using Consumer = BlockwiseConsumer<Base>;
    auto scale_b = [&] {
      if constexpr (kBScales == BScales::kBlockPerThird)
        return make_tensor(make_smem_ptr(shared_tensors.smem_SFB.data()),
                           make_layout(make_shape(get<0>(TileShape{}), make_shape(Int<kThird>{}, Int<kThirds>{}),
                                                  make_shape(_1{}, Int<kStages>{})),
                                       make_stride(_0{}, make_stride(_0{}, Int<kThird>{}),
                                                   make_stride(_0{}, get<2>(stride(SmemLayoutSFB{}))))));
      else
        return Consumer::scale_b(shared_tensors);
    };
    TiledMma tiled_mma;
    Tensor tCsSFA = tiled_mma.get_slice(thread_idx).partition_C(Consumer::scale_a(shared_tensors));
    Tensor tCsSFB = tiled_mma.get_slice(thread_idx).partition_C(scale_b());  // (MMA,MMA_M,MMA_N,(MMA_K,PIPE))
    auto fragments = Consumer::operand_fragments(tiled_mma, shared_tensors, thread_idx);
    auto& tCrA = get<0>(fragments);  // (MMA,MMA_M,MMA_K,PIPE)
    auto& tCrB = get<1>(fragments);  // (MMA,MMA_N,MMA_K,PIPE)
    CUTE_STATIC_ASSERT_V(size<1>(tCrA) == size<1>(accum));
    CUTE_STATIC_ASSERT_V(size<1>(tCrB) == size<2>(accum));

    Tensor partial = make_fragment_like(accum);
    clear(accum);  // +0, as CUTLASS's first promotion adds to
    warpgroup_fence_operand(accum);
    // The register copies keep the views' stride-0 modes: a thread holds its rows' A scales (and, per
    // third, its columns' B scales) once each.
    Tensor tCrSFA = make_tensor_like<ElementBlockScale>(tCsSFA(_, _, _, _0{}));
    Tensor tCrSFB = make_tensor_like<ElementBlockScale>(tCsSFB(_, _, _, _0{}));

    auto barrier_token = pipeline.consumer_try_wait(smem_pipe_read);
    PipelineState smem_pipe_release = smem_pipe_read;
    CUTLASS_PRAGMA_NO_UNROLL
    for (int k_tile = 0; k_tile < k_tile_count; ++k_tile) {
      pipeline.consumer_wait(smem_pipe_read, barrier_token);
      const int stage = smem_pipe_read.index();

      // K tile `stage`'s wgmmas into `partial`, from zero.
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      warpgroup_fence_operand(partial);
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
        cute::gemm(tiled_mma, tCrA(_, _, k_block, stage), tCrB(_, _, k_block, stage), partial);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(partial);

      // The stage's scales, read while the wgmmas run (kRow: B's where they are used, below).
      copy(tCsSFA(_, _, _, make_coord(_0{}, stage)), tCrSFA);
      if constexpr (kBScales == BScales::kBlockPerThird) copy(tCsSFB(_, _, _, make_coord(_0{}, stage)), tCrSFB);

      warpgroup_wait<0>();
      ++smem_pipe_read;
      barrier_token = pipeline.consumer_try_wait(smem_pipe_read);
      warpgroup_fence_operand(partial);
      if constexpr (kBScales == BScales::kBlockPerThird) {
        // The product is formed first and rounded, as CUTLASS's 128x128-block promotion forms it; identical
        // products of a (row, third) pair are one FMUL after unrolling.
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(accum); ++i) accum(i) += partial(i) * (tCrSFA(i) * tCrSFB(i));
      } else {
        Tensor sfb = tCsSFB(_, _, _, make_coord(_0{}, stage));
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(accum); ++i) partial(i) = partial(i) * tCrSFA(i);
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(accum); ++i) accum(i) += partial(i) * sfb(i);
      }
      warpgroup_fence_operand(accum);

      // Every stage but the last goes back to the producer here; the kernel's mma_tail() releases the last.
      if (k_tile + 1 < k_tile_count) {
        pipeline.consumer_release(smem_pipe_release);
        ++smem_pipe_release;
      }
    }
  }
};

// The mainloop for one way of reading B's scales, as a one-parameter template (fp8_gemm_nt_blockwise.cuh's
// Fp8GemmNtBlockwise takes the mainloop that way).
template <BScales kBScales>
struct WideTileMainloopOf {
  template <class Base>
  using Mainloop = WideTileMainloop<Base, kBScales>;
};

}  // namespace snip::gemm::sm90
