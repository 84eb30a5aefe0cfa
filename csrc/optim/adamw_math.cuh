// The per-element arithmetic of snip_ops.optim.adamw_step_reference, shared by the CUDA kernel
// (adamw.cu) and the CPU loop (adamw_cpu.cpp): each float operation is one correctly rounded IEEE
// operation in the reference's order (intrinsics on the device, no FMA contraction on the host), and
// the BF16 write-backs are cast.round_to_format's rules on the FP32 bit pattern.
#pragma once
#include <cmath>
#include <cstdint>

#include "optim/adamw.h"
#include "quant/quant_math.cuh"

namespace snip::optim {

SNIP_QM float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

constexpr uint16_t kBF16NaN = 0x7FFF;  // what the GPU's float -> bf16 conversion writes for NaN

// cast.round_to_format(x, BF16, SR, rand) as BF16 bits: add the element's 16 random bits
// (quant::element_bits) to the 16 bits below the kept mantissa and truncate (FP32 subnormals too:
// BF16 shares FP32's emin); saturate at the largest finite BF16; Inf stays Inf. NaN and Inf take the
// one branch and saturation is a select: the compiler then predicates the whole rounding; selecting
// NaN and Inf too kept more values live than the AdamW kernel's register cap allows (check_sass.sh).
SNIP_QM uint16_t bf16_sr(float x, uint32_t rand) {
  const uint32_t u = quant::f2u(x), a = u & quant::kAbsMask;
  if (a >= quant::kInfBits) return a == quant::kInfBits ? uint16_t(u >> 16) : kBF16NaN;
  const uint32_t r = (a + rand) & 0xFFFF0000u;
  return uint16_t(((u & 0x80000000u) | (r < quant::kInfBits ? r : 0x7F7F0000u)) >> 16);
}

// cast.round_to_format(x, BF16, RNE) as BF16 bits, saturating as above.
SNIP_QM uint16_t bf16_rne(float x) {
  const uint32_t u = quant::f2u(x), a = u & quant::kAbsMask;
  if (a >= quant::kInfBits) return a == quant::kInfBits ? uint16_t(u >> 16) : kBF16NaN;
  const uint32_t r = (a + 0x7FFFu + ((a >> 16) & 1u)) & 0xFFFF0000u;
  return uint16_t(((u & 0x80000000u) | (r < quant::kInfBits ? r : 0x7F7F0000u)) >> 16);
}

SNIP_QM float bf16_to_float(uint16_t h) { return quant::u2f(uint32_t(h) << 16); }

// One element's update; p, m, v in place.
SNIP_QM void adamw_element(float& p, float g, float& m, float& v, const Scalars& s) {
  using quant::add_rn;
  using quant::div_rn;
  using quant::mul_rn;
  using quant::sub_rn;
  p = mul_rn(p, s.decay);
  m = add_rn(mul_rn(m, s.beta1), mul_rn(g, s.one_minus_beta1));
  v = add_rn(mul_rn(v, s.beta2), mul_rn(mul_rn(g, g), s.one_minus_beta2));
  const float denom = add_rn(mul_rn(sqrt_rn(v), s.inv_bias_correction2_sqrt), s.eps);
  p = sub_rn(p, mul_rn(div_rn(m, denom), s.step_size));
}

// The Philox blocks (quant::kElemsPerBlock consecutive global indices each) a tensor's elements
// span, and the first of them. The first and last are partial where the tensor (an FSDP shard)
// starts or ends off a multiple of 8: the neighbouring shard draws the rest of their bits.
SNIP_QM int64_t first_philox_block(const TensorSlot& t) { return t.index_base / quant::kElemsPerBlock; }
SNIP_QM int64_t num_philox_blocks(const TensorSlot& t) {
  return t.numel <= 0 ? 0 : (t.index_base + t.numel - 1) / quant::kElemsPerBlock - first_philox_block(t) + 1;
}

}  // namespace snip::optim
