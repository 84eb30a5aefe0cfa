// C entry points into csrc/quant/quant_math.cuh compiled for the host (tests/host_twin.py loads them
// with ctypes): the quantizer kernels' own scale arithmetic, checked against snip_ops.reference.
#include <cstdint>

#include "optim/adamw_math.cuh"
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

// round_to_code of each float32 bit pattern (stochastic when `rand` is not null: 16 random bits each),
// with its code and decoded value.
extern "C" void snip_round_to_codes(const uint32_t* bits, int64_t n, int elem, const uint32_t* rand, uint32_t* codes,
                                    float* values) {
  const snip::quant::Format f = snip::quant::format_of(Elem(elem));
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) {
    codes[i] = snip::quant::round_to_code(snip::quant::u2f(bits[i]), f, rand != nullptr, rand ? rand[i] : 0u);
    values[i] = snip::quant::decode(codes[i], f);
  }
}

// add_rz of each pair (a[i], b[i]).
extern "C" void snip_add_rz(const float* a, const float* b, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = snip::quant::add_rz(a[i], b[i]);
}

// AdamW's BF16 write-back of each float32 bit pattern: bf16_sr with rand[i] (16 bits), or bf16_rne
// where `rand` is null.
extern "C" void snip_bf16_round(const uint32_t* bits, int64_t n, const uint32_t* rand, uint16_t* out) {
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) {
    const float x = snip::quant::u2f(bits[i]);
    out[i] = rand ? snip::optim::bf16_sr(x, rand[i]) : snip::optim::bf16_rne(x);
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

// quotient(x, divisor_of(s)) against IEEE x / s for every x in [1, 2) with `sig_bits` significand
// bits (8: BF16, 11: FP16) and every float32 s in [1, 2); returns the number of mismatches and the
// first one's (x, s). Without underflow or overflow the rounding depends on the significands only.
extern "C" int64_t snip_check_quotients(int sig_bits, uint32_t* first_x, uint32_t* first_s) {
  const uint32_t xs = 1u << (sig_bits - 1);
  int64_t bad = 0;
  *first_x = *first_s = 0;
#pragma omp parallel for reduction(+ : bad) schedule(dynamic, 1024)
  for (int64_t m = 0; m < (int64_t(1) << 23); ++m) {
    const float s = snip::quant::u2f(0x3F800000u | uint32_t(m));
    const snip::quant::Divisor d = snip::quant::divisor_of(s, true);
    int64_t local = 0;
    uint32_t lx = 0;
    for (uint32_t j = 0; j < xs; ++j) {
      const float x = snip::quant::u2f(0x3F800000u | (j << (24 - sig_bits)));
      if (snip::quant::quotient(x, d) != x / s) {
        if (!local) lx = snip::quant::f2u(x);
        ++local;
      }
    }
    if (local) {
#pragma omp critical
      if (*first_s == 0 || snip::quant::f2u(s) < *first_s) {
        *first_x = lx;
        *first_s = snip::quant::f2u(s);
      }
      bad += local;
    }
  }
  return bad;
}

// quotient(x, divisor_of(s, true)): one element, for the edge cases.
extern "C" float snip_quotient(float x, float s) {
  return snip::quant::quotient(x, snip::quant::divisor_of(s, true));
}
