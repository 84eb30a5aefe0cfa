// Device entry points and the launch sequence of snip's CUTLASS 3.x/4.x GEMM kernels.
//
// CUTLASS's own entry, cutlass::device_kernel<GemmKernel>, has no snip op name in its mangled name;
// scripts/check_sass.sh finds each op's kernels in the SASS by name (csrc/README.md), so every op
// defines its own entry with SNIP_DEFINE_GEMM_ENTRY(op) -- the same body as device_kernel -- and
// launches it with run_gemm_kernel() below (what GemmUniversalAdapter::initialize()+run() do,
// without the adapter's state).
#pragma once
#include <cstddef>

#include <cuda_runtime_api.h>

#include "cutlass/cluster_launch.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/device_kernel.h"

#include "gemm/gemm_args.h"

// Defines `template <class Op> __global__ void <op>_kernel(Op::Params)`.
#define SNIP_DEFINE_GEMM_ENTRY(op)                                                                  \
  template <class Operator>                                                                         \
  __global__ __launch_bounds__(Operator::MaxThreadsPerBlock, Operator::MinBlocksPerMultiprocessor) \
  void op##_kernel(CUTLASS_GRID_CONSTANT typename Operator::Params const params) {                 \
    extern __shared__ char smem[];                                                                  \
    Operator kernel;                                                                                \
    kernel(params, smem);                                                                           \
  }

namespace snip::gemm {

// Build Params from Arguments, initialise the workspace, and launch `entry` (a
// SNIP_DEFINE_GEMM_ENTRY instantiation for GemmKernel) as a cluster launch on `stream`.
template <class GemmKernel>
LaunchResult run_gemm_kernel(typename GemmKernel::Arguments const& args, void const* entry,
                             void* workspace, cudaStream_t stream) {
  LaunchResult r;
  if (!GemmKernel::can_implement(args)) {
    r.status = LaunchStatus::kCannotImplement;
    return r;
  }
  if (GemmKernel::initialize_workspace(args, workspace, stream, nullptr) != cutlass::Status::kSuccess) {
    r.status = LaunchStatus::kWorkspaceInit;
    r.cuda = cudaGetLastError();
    return r;
  }
  typename GemmKernel::Params params = GemmKernel::to_underlying_arguments(args, workspace);
  const dim3 grid = GemmKernel::get_grid_shape(params);
  const dim3 block = GemmKernel::get_block_shape();
  const int smem = GemmKernel::SharedStorageSize;
  using Cluster = typename GemmKernel::DispatchPolicy::ClusterShape;
  const dim3 cluster(cute::size<0>(Cluster{}), cute::size<1>(Cluster{}), cute::size<2>(Cluster{}));
  // Per device and cheap: set on every call rather than caching per device.
  cudaError_t err = cudaFuncSetAttribute(entry, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) {
    r.status = LaunchStatus::kCudaError;
    r.cuda = err;
    return r;
  }
  void* kernel_params[] = {&params};
  const cutlass::Status s =
      cutlass::ClusterLauncher::launch(grid, cluster, block, smem, stream, entry, kernel_params);
  err = cudaGetLastError();
  if (s != cutlass::Status::kSuccess || err != cudaSuccess) {
    r.status = LaunchStatus::kCudaError;
    r.cuda = err != cudaSuccess ? err : cudaErrorLaunchFailure;
  }
  return r;
}

}  // namespace snip::gemm
