// Hopper blockwise-FP8 mainloop whose scale promotion overlaps the tensor cores.
//
// CUTLASS's MainloopSm90TmaGmmaWarpSpecializedBlockwiseFP8 (the base here) runs each 128-wide K
// tile as: issue its wgmmas into a partial accumulator, wait until they have all retired, then
// promote (final += partial * scale). While a warpgroup promotes, its share of the tensor cores
// idles, and in the cooperative kernel both consumer warpgroups reach that point together. The
// promotion costs one FFMA per accumulator element and K tile (two operations with 1x128 scales on
// both operands) against a 64x128x128 wgmma per warpgroup, so it is a large fraction of the tile's
// time: the likely cause of the gap to FP8 GEMMs without per-block scales that
// bench/results/nvidia-h200-gemm.json shows (the gap is measured there, its cause is not).
//
// This mainloop keeps two partial accumulators: it issues K tile t+1 into one, waits only until K
// tile t's wgmmas have retired (wgmma.wait_group 1), and promotes tile t from the other while the
// tensor cores work on t+1. The arithmetic per output element is the base's, in the same order:
// each K tile's wgmmas start from zero (ScaleOut::Zero) and chain over the tile, and the final
// accumulator starts at +0 and takes one FFMA per tile in K order, with the same scale products
// (a scalar SFA[m] * SFB for 128x128 B blocks; (partial * SFA[m]) * SFB[n] for 1x128 ones), so the
// two mainloops give the same bits (snip_ops/autotune.py compares them before timing).
//
// Cost: a second partial accumulator, 64 more registers per thread for a 64x128 warpgroup tile
// (the consumer warpgroups run at 232 after setmaxnreg). Only the overridden mma() differs; the
// producer side, shared storage, arguments and mma_tail() are the base's.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/collective_builder.hpp"

#include "gemm/sm90/blockwise_consumer.cuh"

namespace snip::gemm::sm90 {

template <class Base>
struct OverlappedPromotionMainloop : Base {
  using typename Base::ElementBlockScale;
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::TensorStorage;
  using typename Base::TileShape;
  using typename Base::TiledMma;

  // One promotion per K tile: the K tile is one scale block (128) of four k32 wgmmas. Coarser
  // promotion intervals are not handled here.
  static_assert(Base::ScalePromotionInterval == 4, "the K tile must be one 128-wide scale block");
  static_assert(Base::ScaleMsPerTile == cute::size<0>(TileShape{}), "A has one scale per row (1x128 blocks)");
  static_assert(Base::ScaleNsPerTile == 1 || Base::ScaleNsPerTile == cute::size<1>(TileShape{}),
                "B has one scale per tile (128x128 blocks) or per row (1x128 blocks)");

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum,
                          int k_tile_count, int thread_idx, TensorStorage& shared_tensors, Params const&) {
    using namespace cute;
    static_assert(is_rmem<FrgTensorC>::value, "the accumulator must be in registers");

    // The scales broadcast along the operand they do not index, so that partitioning them like C gives each
    // thread the scales of its accumulator elements.
    using Consumer = BlockwiseConsumer<Base>;
    TiledMma tiled_mma;
    Tensor tCsSFA = tiled_mma.get_slice(thread_idx).partition_C(Consumer::scale_a(shared_tensors));
    Tensor tCsSFB = tiled_mma.get_slice(thread_idx).partition_C(Consumer::scale_b(shared_tensors));
    auto fragments = Consumer::operand_fragments(tiled_mma, shared_tensors, thread_idx);
    auto& tCrA = get<0>(fragments);  // (MMA,MMA_M,MMA_K,PIPE)
    auto& tCrB = get<1>(fragments);  // (MMA,MMA_N,MMA_K,PIPE)
    CUTE_STATIC_ASSERT_V(size<1>(tCrA) == size<1>(accum));
    CUTE_STATIC_ASSERT_V(size<1>(tCrB) == size<2>(accum));

    // The two partial accumulators; K tile t goes to partial[t % 2]. Each K tile's first wgmma ignores
    // what its partial holds (ScaleOut::Zero), but partial1 is cleared here, before any wgmma is in
    // flight: left undefined, the compiler materializes it after the first K tile is issued, and ptxas
    // then waits for that tile to finish before entering the loop (C7517), losing one overlap per tile.
    Tensor partial0 = make_fragment_like(accum);
    Tensor partial1 = make_fragment_like(accum);
    clear(accum);  // +0, as the base's first promotion adds to
    clear(partial1);
    warpgroup_fence_operand(partial1);
    warpgroup_fence_operand(accum);

    // Issue K tile `stage`'s wgmmas into `partial` (one commit group; it starts from zero).
    auto issue = [&](auto& partial, int stage) {
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
    };

    // accum += partial * scale, with K tile `stage`'s scales read from shared memory now (the
    // stage is released only after this), in the base's expression for each scale layout.
    auto promote = [&](auto& partial, int stage) {
      warpgroup_fence_operand(partial);
      Tensor tCrSFA = make_tensor_like<ElementBlockScale>(tCsSFA(_, _, _, _0{}));
      Tensor tCrSFB = make_tensor_like<ElementBlockScale>(tCsSFB(_, _, _, _0{}));
      copy(tCsSFA(_, _, _, make_coord(_0{}, stage)), tCrSFA);
      copy(tCsSFB(_, _, _, make_coord(_0{}, stage)), tCrSFB);
      if constexpr (Base::ScaleNsPerTile == 1) {
        const ElementBlockScale scale_b = tCrSFB(_0{});
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(filter_zeros(tCrSFA)); ++i) filter_zeros(tCrSFA)(i) = filter_zeros(tCrSFA)(i) * scale_b;
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(accum); ++i) accum(i) += partial(i) * tCrSFA(i);
      } else {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < size(accum); ++i) accum(i) += partial(i) * tCrSFA(i) * tCrSFB(i);
      }
    };

    // Issue K tile t+1 into `next`, wait for K tile t (in `prev`) only, promote it while t+1 runs,
    // and hand its stage back to the producer.
    PipelineState smem_pipe_promote = smem_pipe_read;
    auto barrier_token = pipeline.consumer_try_wait(smem_pipe_read);
    auto step = [&](auto& next, auto& prev) {
      pipeline.consumer_wait(smem_pipe_read, barrier_token);
      issue(next, smem_pipe_read.index());
      ++smem_pipe_read;
      barrier_token = pipeline.consumer_try_wait(smem_pipe_read);
      warpgroup_wait<1>();
      promote(prev, smem_pipe_promote.index());
      pipeline.consumer_release(smem_pipe_promote);
      ++smem_pipe_promote;
    };

    // K tile 0, then pairs of steps so that which partial is which stays static. The last K tile's
    // stage is not released here: the kernel's mma_tail() does it (as after the base's mma()).
    pipeline.consumer_wait(smem_pipe_read, barrier_token);
    issue(partial0, smem_pipe_read.index());
    ++smem_pipe_read;
    barrier_token = pipeline.consumer_try_wait(smem_pipe_read);
    int remaining = k_tile_count - 1;
    CUTLASS_PRAGMA_NO_UNROLL
    for (; remaining >= 2; remaining -= 2) {
      step(partial1, partial0);
      step(partial0, partial1);
    }
    if (remaining == 1) {
      step(partial1, partial0);
      warpgroup_wait<0>();
      promote(partial1, smem_pipe_promote.index());
    } else {
      warpgroup_wait<0>();
      promote(partial0, smem_pipe_promote.index());
    }
  }
};

}  // namespace snip::gemm::sm90
