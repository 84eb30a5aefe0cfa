// What snip's own Hopper blockwise-FP8 consumers (overlapped_promotion_mainloop.cuh,
// wide_tile_mainloop.cuh) read, set up as CUTLASS's MainloopSm90TmaGmmaWarpSpecializedBlockwiseFP8
// sets it up in its mma(): the scale tensors in shared memory, and the operand fragments of the
// calling thread's warpgroup. `Mainloop` is CUTLASS's mainloop the consumer derives from.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"

namespace snip::gemm::sm90 {

template <class Mainloop>
struct BlockwiseConsumer {
  using TileShape = typename Mainloop::TileShape;
  using TiledMma = typename Mainloop::TiledMma;
  using SmemLayoutSFA = typename Mainloop::SmemLayoutSFA;
  using SmemLayoutSFB = typename Mainloop::SmemLayoutSFB;

  // A's scales of every stage as a (BLK_M, BLK_N, (BLK_K, PIPE)) tensor broadcast (stride 0) along N, so
  // that partitioning it like C gives each thread the scales of its accumulator elements.
  template <class Storage>
  static CUTLASS_DEVICE auto scale_a(Storage& shared_tensors) {
    using namespace cute;
    return make_tensor(make_smem_ptr(shared_tensors.smem_SFA.data()),
                       make_layout(make_shape(get<0>(shape(SmemLayoutSFA{})), get<1>(TileShape{}),
                                              make_shape(get<1>(shape(SmemLayoutSFA{})), get<2>(shape(SmemLayoutSFA{})))),
                                   make_stride(get<0>(stride(SmemLayoutSFA{})), _0{},
                                               make_stride(get<1>(stride(SmemLayoutSFA{})),
                                                           get<2>(stride(SmemLayoutSFA{}))))));
  }

  // B's the same way, broadcast along M (one scale per tile, or one per row of B).
  template <class Storage>
  static CUTLASS_DEVICE auto scale_b(Storage& shared_tensors) {
    using namespace cute;
    return make_tensor(make_smem_ptr(shared_tensors.smem_SFB.data()),
                       make_layout(make_shape(get<0>(TileShape{}), get<0>(shape(SmemLayoutSFB{})),
                                              make_shape(get<1>(shape(SmemLayoutSFB{})), get<2>(shape(SmemLayoutSFB{})))),
                                   make_stride(_0{}, get<0>(stride(SmemLayoutSFB{})),
                                               make_stride(get<1>(stride(SmemLayoutSFB{})),
                                                           get<2>(stride(SmemLayoutSFB{}))))));
  }

  // (tCrA, tCrB): the A and B descriptors of every K block and stage, (MMA, MMA_M|N, MMA_K, PIPE), for
  // the warpgroup of `thread_idx`.
  template <class Storage>
  static CUTLASS_DEVICE auto operand_fragments(TiledMma const& tiled_mma, Storage& shared_tensors, int thread_idx) {
    using namespace cute;
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), typename Mainloop::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), typename Mainloop::SmemLayoutB{});
    CUTE_STATIC_ASSERT_V(Int<Mainloop::DispatchPolicy::Stages>{} == size<2>(sA));
    constexpr int kMmaWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    const Layout warp_group_thread_layout = make_layout(Int<kMmaWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
    const int warp_group_idx = __shfl_sync(0xFFFFFFFF, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    auto thread_mma = tiled_mma.get_slice(warp_group_thread_layout(warp_group_idx));
    return make_tuple(thread_mma.make_fragment_A(thread_mma.partition_A(sA)),
                      thread_mma.make_fragment_B(thread_mma.partition_B(sB)));
  }
};

}  // namespace snip::gemm::sm90
