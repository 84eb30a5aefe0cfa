// C entry points into csrc/quant/quant_math.cuh compiled for the host (tests/host_twin.py loads them
// with ctypes): the quantizer kernels' own scale arithmetic, checked against snip_ops.reference.
#include <cstdint>

#include "quant/quant_math.cuh"

using snip::quant::Elem;
using snip::quant::ScaleKind;

extern "C" void snip_block_scales(const uint32_t* amax_bits, int64_t n, int kind, int elem, float tensor_scale,
                                  float* scale, uint32_t* stored) {
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) {
    const auto b = snip::quant::block_scale(amax_bits[i], ScaleKind(kind), Elem(elem), tensor_scale);
    scale[i] = b.s;
    stored[i] = b.stored;
  }
}

// round_to_code of each float32 bit pattern (stochastic when `words` is not null: one word each),
// with its code and decoded value.
extern "C" void snip_round_to_codes(const uint32_t* bits, int64_t n, int elem, const uint32_t* words, uint32_t* codes,
                                    float* values) {
  const snip::quant::Format f = snip::quant::format_of(Elem(elem));
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) {
    codes[i] = snip::quant::round_to_code(snip::quant::u2f(bits[i]), f, words != nullptr, words ? words[i] : 0u);
    values[i] = snip::quant::decode(codes[i], f);
  }
}

// nvfp4_tensor_scale of each tensor amax (float32 bit patterns).
extern "C" void snip_nvfp4_tensor_scales(const uint32_t* amax_bits, int64_t n, float* out) {
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) out[i] = snip::quant::nvfp4_tensor_scale(snip::quant::u2f(amax_bits[i]));
}

// decode of each code (sign bit at the format's width).
extern "C" void snip_decode(const uint32_t* codes, int64_t n, int elem, float* out) {
  const snip::quant::Format f = snip::quant::format_of(Elem(elem));
  for (int64_t i = 0; i < n; ++i) out[i] = snip::quant::decode(codes[i], f);
}
