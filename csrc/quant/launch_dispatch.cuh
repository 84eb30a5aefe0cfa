// Runtime (input dtype, element format, rounding) -> the kernel instantiation for them, shared by the
// quantize launchers. `launch` is a lambda templated on <typename T, Elem E, bool kSR>.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "quant/quantize.h"

namespace snip::quant {

template <typename T, typename Launch>
cudaError_t dispatch_elem_rounding(const Spec& spec, const Launch& launch) {
  const auto rounding = [&]<Elem E>() {
    return spec.sr ? launch.template operator()<T, E, true>() : launch.template operator()<T, E, false>();
  };
  switch (spec.elem) {
    case Elem::kE4M3: return rounding.template operator()<Elem::kE4M3>();
    case Elem::kE5M2: return rounding.template operator()<Elem::kE5M2>();
    case Elem::kE2M1: return rounding.template operator()<Elem::kE2M1>();
  }
  return cudaErrorInvalidValue;
}

template <typename Launch>
cudaError_t dispatch_quantize(const Args& a, const Launch& launch) {
  switch (a.dtype) {
    case InputDType::kFloat32: return dispatch_elem_rounding<float>(a.spec, launch);
    case InputDType::kFloat16: return dispatch_elem_rounding<__half>(a.spec, launch);
    case InputDType::kBFloat16: return dispatch_elem_rounding<__nv_bfloat16>(a.spec, launch);
  }
  return cudaErrorInvalidValue;
}

}  // namespace snip::quant
