// C entry points into csrc/quant/quant_math.cuh compiled for the host (tests/host_twin.py loads them
// with ctypes): the quantizer kernels' own scale arithmetic, checked against snip_ops.reference.
#include <cstdint>

#include "quant/quant_math.cuh"

using snip::quant::Elem;
using snip::quant::ScaleKind;

extern "C" void snip_block_scales(const uint32_t* amax_bits, int64_t n, int kind, int elem, float tensor_scale,
                                  float* scale, uint32_t* stored) {
  for (int64_t i = 0; i < n; ++i) {
    const auto b = snip::quant::block_scale(amax_bits[i], ScaleKind(kind), Elem(elem), tensor_scale);
    scale[i] = b.s;
    stored[i] = b.stored;
  }
}
