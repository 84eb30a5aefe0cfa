// Blackwell (sm_100a) block-scaled GEMMs on tcgen05 (UTCQMMA / UTCOMMA), "NT" (both operands K-major):
//   nvfp4 x nvfp4 (E2M1, one E4M3 scale per 16 elements, FP32 alpha = product of tensor scales)
//   mxfp4 x mxfp4 (E2M1, one E8M0 scale per 32 elements)
//   mxfp8 x mxfp8 (E4M3, one E8M0 scale per 32 elements)
// -> D[M, N] in BF16, or in FP32 (wgrad: the weight gradient is accumulated in FP32), FP32
// accumulation in tensor memory. Built on CUTLASS's
// OpClassBlockScaledTensorOp collective builder (the kernels of example 72), warp-specialized,
// persistent (CLC tile scheduler), 2-SM MMA with a 2x1 cluster.
//
// NOT RUN: no Blackwell GPU was available while writing this; these kernels are compiled and
// disassembled only (csrc/gemm/README.md). Their host-side plumbing -- scale-factor layouts, shape
// and alignment checks -- is unit-tested on the CPU (tests/ops/test_gemm_dispatch.py).
//
// Included by one .cu per kernel (sm100/{nvfp4,mxfp4,mxfp8}_gemm_nt.cu).
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/sm100_blockscaled_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/numeric_types.h"

#include "gemm/cutlass_launch.cuh"
#include "gemm/gemm_args.h"

namespace snip::gemm::sm100 {

SNIP_DEFINE_GEMM_ENTRY(nvfp4_gemm_nt)
SNIP_DEFINE_GEMM_ENTRY(mxfp4_gemm_nt)
SNIP_DEFINE_GEMM_ENTRY(mxfp8_gemm_nt)

using namespace cute;

// Entry: a tag that picks the op-named kernel entry (for check_sass.sh). ElementD: cutlass::bfloat16_t
// or float.
template <class ElementPairA_, class ElementPairB_, int kAlign, class MmaTileShape_, class ClusterShape_,
          class KernelSchedule_, class EpilogueSchedule_, class Entry, class ElementD_>
struct BlockScaledGemmNt {
  using ElementPairA = ElementPairA_;
  using ElementPairB = ElementPairB_;
  using ElementD = ElementD_;
  using ElementAccumulator = float;
  using ElementCompute = float;
  using LayoutA = cutlass::layout::RowMajor;     // A[M, K], K contiguous
  using LayoutB = cutlass::layout::ColumnMajor;  // B[N, K], K contiguous
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;
  using MmaTileShape = MmaTileShape_;
  using ClusterShape = ClusterShape_;

  // D = alpha * acc; no source tensor (ElementC = void).
  using Fusion = cutlass::epilogue::fusion::LinearCombination<ElementD, ElementCompute, void, ElementCompute>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, MmaTileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAccumulator, ElementCompute, void, LayoutD, kAlignD,
      ElementD, LayoutD, kAlignD, EpilogueSchedule_, Fusion>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, ElementPairA, LayoutA, kAlign, ElementPairB,
      LayoutB, kAlign, ElementAccumulator, MmaTileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule_>::CollectiveOp;

  using GemmKernel =
      cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue, void>;

  using StrideA = typename GemmKernel::StrideA;
  using StrideB = typename GemmKernel::StrideB;
  using StrideD = typename GemmKernel::StrideD;
  using ScaleConfig = typename CollectiveMainloop::Sm1xxBlkScaledConfig;
  using ElementSF = typename CollectiveMainloop::ElementSF;
  using ArrayElementA = typename CollectiveMainloop::ArrayElementA;
  using ArrayElementB = typename CollectiveMainloop::ArrayElementB;
  static constexpr int kSfVec = ScaleConfig::SFVecSize;

  static typename GemmKernel::Arguments arguments(const BlockScaledArgs& p) {
    const auto problem = make_shape(p.m, p.n, p.k, 1);
    // lda/ldb are in elements (for FP4: 2 per byte).
    const StrideA stride_a = make_stride(int64_t(p.lda), _1{}, int64_t(0));
    const StrideB stride_b = make_stride(int64_t(p.ldb), _1{}, int64_t(0));
    const StrideD stride_d = make_stride(int64_t(p.ldd), _1{}, int64_t(0));
    typename GemmKernel::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {p.m, p.n, p.k, 1},
        {static_cast<ArrayElementA const*>(p.a), stride_a, static_cast<ArrayElementB const*>(p.b), stride_b,
         static_cast<ElementSF const*>(p.sfa), ScaleConfig::tile_atom_to_shape_SFA(problem),
         static_cast<ElementSF const*>(p.sfb), ScaleConfig::tile_atom_to_shape_SFB(problem)},
        {{}, nullptr, stride_d, static_cast<ElementD*>(p.d), stride_d}};
    auto& fusion = args.epilogue.thread;
    fusion.alpha = 1.0f;
    fusion.alpha_ptr = p.alpha;  // when set, read on the device (no host sync for nvfp4's tensor scales)
    fusion.beta = 0.0f;
    args.hw_info.device_id = p.device;
    args.hw_info.sm_count = p.sm_count;
    return args;
  }

  static size_t workspace_size(const BlockScaledArgs& p) { return GemmKernel::get_workspace_size(arguments(p)); }

  static LaunchResult run(const BlockScaledArgs& p, void* workspace, cudaStream_t stream) {
    return run_gemm_kernel<GemmKernel>(arguments(p), Entry::template entry<GemmKernel>(), workspace, stream);
  }
};

struct NvFp4Entry {
  template <class K> static void const* entry() { return reinterpret_cast<void const*>(&nvfp4_gemm_nt_kernel<K>); }
};
struct MxFp4Entry {
  template <class K> static void const* entry() { return reinterpret_cast<void const*>(&mxfp4_gemm_nt_kernel<K>); }
};
struct MxFp8Entry {
  template <class K> static void const* entry() { return reinterpret_cast<void const*>(&mxfp8_gemm_nt_kernel<K>); }
};

// The configurations (one per format and output dtype; csrc/gemm/sm100/blockscaled_gemm_heuristic.h):
// 2-SM MMA, 256x256 output tile per SM pair, cluster 2x1, K tile = 128 bytes of codes per row.
template <class ElementD>
using NvFp4Gemm = BlockScaledGemmNt<cutlass::nv_float4_t<cutlass::float_e2m1_t>,
                                    cutlass::nv_float4_t<cutlass::float_e2m1_t>, 32, Shape<_256, _256, _256>,
                                    Shape<_2, _1, _1>, cutlass::gemm::KernelTmaWarpSpecialized2SmNvf4Sm100,
                                    cutlass::epilogue::TmaWarpSpecialized2Sm, NvFp4Entry, ElementD>;
template <class ElementD>
using MxFp4Gemm = BlockScaledGemmNt<cutlass::mx_float4_t<cutlass::float_e2m1_t>,
                                    cutlass::mx_float4_t<cutlass::float_e2m1_t>, 32, Shape<_256, _256, _256>,
                                    Shape<_2, _1, _1>, cutlass::gemm::KernelTmaWarpSpecialized2SmMxf4Sm100,
                                    cutlass::epilogue::TmaWarpSpecialized2Sm, MxFp4Entry, ElementD>;
template <class ElementD>
using MxFp8Gemm = BlockScaledGemmNt<cutlass::mx_float8_t<cutlass::float_e4m3_t>,
                                    cutlass::mx_float8_t<cutlass::float_e4m3_t>, 16, Shape<_256, _256, _128>,
                                    Shape<_2, _1, _1>, cutlass::gemm::KernelTmaWarpSpecialized2SmMxf8f6f4Sm100,
                                    cutlass::epilogue::TmaWarpSpecialized2Sm, MxFp8Entry, ElementD>;

}  // namespace snip::gemm::sm100
