// Device facts for the GEMM ops' checks and tile heuristics, read with the CUDA runtime directly:
// ATen/cuda/CUDAContext.h would drag cuSPARSE/cuBLAS headers into every op file.
#pragma once
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime_api.h>

namespace snip::gemm {

struct DeviceInfo {
  int major = 0, minor = 0, sms = 0;
};

inline DeviceInfo device_info(int device) {
  DeviceInfo d;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&d.minor, cudaDevAttrComputeCapabilityMinor, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, device));
  return d;
}

}  // namespace snip::gemm
