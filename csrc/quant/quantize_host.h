// Host implementations of snip_C::quantize / snip_C::dequantize (quantize_host.cpp): the launchers'
// contract (quantize.h) on host memory, with the kernels' own arithmetic (quant_math.cuh), so their
// outputs are bit-identical to the kernels' and to snip_ops.reference. No CUDA needed.
#pragma once
#include <cstdint>

#include "quant/quantize.h"

namespace snip::quant {

// max |x| of the whole tensor; NaN/Inf give a non-finite result (launch_quantize_tensor_amax).
float quantize_tensor_amax_host(const void* x, InputDType dtype, int64_t rows, int64_t cols, int64_t ld);

// T x (hadamard.cuh) into `out`, float32 [round_up(rows, 16), cols] contiguous: x's rows zero-padded
// to whole groups of 16, then transformed.
void hadamard_rows_host(const void* x, InputDType dtype, int64_t rows, int64_t cols, int64_t ld, uint32_t signs,
                        float* out);

// Every requested output of `a` (launch_quantize_rows / launch_quantize_tile); a.tensor_amax and
// a.tensor_scale point to host memory.
void quantize_host(const Args& a);

// launch_dequantize on host memory; tensor_scale: the NVFP4 tensor scale (ignored otherwise).
void dequantize_host(const void* codes, int64_t ld, const void* scales, int64_t lds, float tensor_scale,
                     const Spec& spec, int64_t rows, int64_t cols, void* out, bool out_bf16);

}  // namespace snip::quant
