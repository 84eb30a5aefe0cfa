// The 16-point random Hadamard transform of NVIDIA's NVFP4 training recipe, applied along the token
// dimension to both wgrad operands before quantization (snip_ops/hadamard.py defines it, bit for bit):
// each element times its group position's sign (exact), the Sylvester butterfly stages h = 1, 2, 4, 8
// (the pair (v[p], v[p + h]), p & h == 0, becomes (v[p] + v[p + h], v[p] - v[p + h]), IEEE float32),
// then times 0.25 (exact). The operations are spelled mul_rn / add_rn / sub_rn (quant_math.cuh) so that
// no FMA contraction can fold a sign or the final scale into an add.
#pragma once
#include <cstdint>

#include "quant/quant_math.cuh"
#include "quant/quantize.h"

namespace snip::quant {

// The sign of group position p: -1 where bit p of `signs` is set (hadamard.sign_mask).
SNIP_QM float hadamard_sign(uint32_t signs, int p) { return (signs >> p) & 1u ? -1.0f : 1.0f; }

// One group of 16 values, in place.
SNIP_QM void hadamard16(float (&v)[kHadamardSize], uint32_t signs) {
  for (int p = 0; p < kHadamardSize; ++p) v[p] = mul_rn(v[p], hadamard_sign(signs, p));
  for (int h = 1; h < kHadamardSize; h *= 2)
    for (int p = 0; p < kHadamardSize; ++p)
      if ((p & h) == 0) {
        const float a = v[p], b = v[p + h];
        v[p] = add_rn(a, b);
        v[p + h] = sub_rn(a, b);
      }
  for (int p = 0; p < kHadamardSize; ++p) v[p] = mul_rn(v[p], 0.25f);
}

}  // namespace snip::quant
