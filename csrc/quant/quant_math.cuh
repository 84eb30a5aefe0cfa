// The numerics of snip's quantizers, shared by the quantize and dequantize kernels and their host
// implementations (quantize_host.cpp): Philox4x32-10, element rounding to codes (RNE and
// stochastic), block scales, decoding, the Blackwell scale layout. Every function is
// __host__ __device__ and reproduces snip_ops/{philox,cast,reference}.py bit for bit; each comment
// names the Python line it mirrors. Compiled without fast-math: every float operation here is either
// exact or a single correctly rounded IEEE operation, exactly as in the float32 PyTorch reference.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#if SNIP_WITH_CUDA
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#endif

#include "quant/quantize.h"

#if defined(__CUDACC__)
#define SNIP_QM __host__ __device__ __forceinline__
#define SNIP_QM_CONSTEXPR __host__ __device__ constexpr
#else
#define SNIP_QM inline
#define SNIP_QM_CONSTEXPR constexpr
#endif

namespace snip::quant {

SNIP_QM uint32_t f2u(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

SNIP_QM float u2f(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// IEEE division, spelled out so that no compiler flag can turn it into a reciprocal multiply.
SNIP_QM float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

SNIP_QM float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

SNIP_QM float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

SNIP_QM float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// a + b rounded toward zero, for finite a, b >= 0 with a finite sum. The host corrects the
// round-to-nearest sum by its exact error (Knuth's TwoSum, exact under round to nearest): where
// the nearest float lies above a + b, the next float down is the truncated one.
SNIP_QM float add_rz(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rz(a, b);
#else
  const float s = a + b, bv = s - a, err = (a - (s - bv)) + (b - bv);
  return err < 0.0f ? u2f(f2u(s) - 1u) : s;
#endif
}

constexpr uint32_t kAbsMask = 0x7FFFFFFFu;
constexpr uint32_t kInfBits = 0x7F800000u;
constexpr uint32_t kNaNBits = 0x7FC00000u;  // torch's float('nan')

// ---- Philox4x32-10 (snip_ops/philox.py) ---------------------------------------------------------

struct Words {
  uint32_t w[4];
};

SNIP_QM void mulhilo(uint32_t a, uint32_t m, uint32_t& hi, uint32_t& lo) {
#if defined(__CUDA_ARCH__)
  hi = __umulhi(a, m);
  lo = a * m;
#else
  const uint64_t p = uint64_t(a) * m;
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
#endif
}

// Round r's key pair (i = 0, 1) under `seed`: (lo32(seed) + r 0x9E3779B9, hi32(seed) + r 0xBB67AE85),
// or read from the precomputed PhiloxKey. With r a compile-time constant (the rounds are unrolled) the
// seed form is one addition per key.
SNIP_QM uint32_t round_key(uint64_t seed, int r, int i) {
  return i ? uint32_t(seed >> 32) + uint32_t(r) * 0xBB67AE85u : uint32_t(seed) + uint32_t(r) * 0x9E3779B9u;
}
SNIP_QM uint32_t round_key(const PhiloxKey& key, int r, int i) { return key.k[r][i]; }

// All ten round keys under `seed`, computed once (on the host) for kernels that read them from their
// launch arguments (constant memory) rather than add them up again for each Philox block they draw.
SNIP_QM PhiloxKey philox_key(uint64_t seed) {
  PhiloxKey key{};
  for (int r = 0; r < 10; ++r)
    for (int i = 0; i < 2; ++i) key.k[r][i] = round_key(seed, r, i);
  return key;
}

// The four words of counter block `block` (= element index / 8) under (key, offset); `key`: the seed
// or its PhiloxKey. The row quantizer takes the latter; the other kernels and the host the seed (with
// the keys in the arguments nvcc scheduled the tile quantizer's registers worse).
template <typename Key>
SNIP_QM Words philox(uint64_t block, const Key& key, uint64_t offset) {
  uint32_t c0 = uint32_t(block), c1 = uint32_t(block >> 32), c2 = uint32_t(offset), c3 = uint32_t(offset >> 32);
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(c0, 0xD2511F53u, hi0, lo0);
    mulhilo(c2, 0xCD9E8D57u, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ round_key(key, r, 0), n2 = hi0 ^ c3 ^ round_key(key, r, 1);
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  return Words{{c0, c1, c2, c3}};
}

// Random bits per element that stochastic rounding reads (philox.SR_BITS), and elements per block.
constexpr int kSRBits = 16;
constexpr int kElemsPerBlock = 128 / kSRBits;

// The SR bits of element j (0..7) of a block: the low half of word j / 2 for even j, the high half for
// odd j. Selects, not an index: j may be a runtime value, and an indexed register array would go
// to local memory.
SNIP_QM uint32_t block_bits(const Words& w, int j) {
  const uint32_t word = (j >> 1) == 0 ? w.w[0] : (j >> 1) == 1 ? w.w[1] : (j >> 1) == 2 ? w.w[2] : w.w[3];
  return (j & 1) ? word >> 16 : word & 0xFFFFu;
}

// The SR bits of element `index` (its linear index in the unpadded, untransposed input); `key` as in philox.
template <typename Key>
SNIP_QM uint32_t element_bits(uint64_t index, const Key& key, uint64_t offset) {
  return block_bits(philox(index >> 3, key, offset), int(index & 7));
}

// ---- element formats (snip_ops/formats.py) ------------------------------------------------------

// The numbers of one element format that the rounding and coding below need.
struct Format {
  int man_bits;        // m
  int bias;
  int emin_field;      // biased float32 exponent field of 2^emin (smallest normal)
  uint32_t max_code;   // code of max_finite (sign excluded)
  uint32_t nan_code;   // what cast.encode writes for NaN (sign excluded)
  uint32_t inf_code;   // code of Inf, 0 when the format has none
  bool has_nan;        // E2M1 has none: its nan_code is cast.encode's choice for NaN input only
  int sign_shift;      // bits - 1
};

SNIP_QM_CONSTEXPR Format format_of(Elem e) {
  switch (e) {
    case Elem::kE4M3: return Format{3, 7, 127 - 6, 0x7E, 0x7F, 0, true, 7};
    case Elem::kE5M2: return Format{2, 15, 127 - 14, 0x7B, 0x7E, 0x7C, true, 7};
    case Elem::kE2M1: return Format{1, 1, 127 + 0, 0x7, 0x7, 0, false, 3};
  }
  return Format{};
}

SNIP_QM_CONSTEXPR float max_finite_of(Elem e) {
  return e == Elem::kE4M3 ? 448.0f : e == Elem::kE5M2 ? 57344.0f : 6.0f;
}

// ---- element rounding: cast.round_to_format followed by cast.encode ------------------------------
//
// round_to_format keeps |v| to the quantum q = 2^(E - m), E = max(exponent(v), emin): t = |v| / q is
// exact, its integer part the kept significand. In code space the rounded k * q is simply
// ((E - emin) << m) + k: for E > emin, k in [2^m, 2^(m+1)] carries into the exponent field by itself,
// and for E = emin (subnormal targets and the first binade) the code is k. Saturation at max_finite
// is min(code, max_code) because codes are monotonic in the value.

// The code (sign included) of float32 `v` in format `f`; `sr` selects stochastic rounding with the
// kSRBits random bits `rand`.
//
// SR adds rand to the 16 bits just below the kept LSB and truncates the rest, in a float32 bit
// pattern whose kept LSB is bit 23 - m, where integer addition does the carrying: out of the
// mantissa into the exponent field, as rounding up a binade's last value must.
// * |v| >= 2^emin: v's own pattern. (pattern >> (23 - m)) is (efield << m) + the kept mantissa bits,
//   so the code ((E - emin) << m) + k, k counting the implicit bit, is that minus (emin_field - 1) << m.
// * |v| < 2^emin (subnormal targets; FP32 subnormals): the quantum is 2^(emin - m) throughout, and
//   2^emin + |v| rounded toward zero is the pattern of the binade [2^emin, 2^(emin + 1)) whose mantissa
//   is floor(|v| / 2^(emin - 23)): the same bits of |v| at the same places. The code is k itself,
//   so the 2^emin added is taken off whole: minus emin_field << m.
// Bits below the 16 fall off in both, as the reference's floor drops them. The general quantum
// arithmetic (significand, variable shift, exponent offset) costs about twice the instructions.
SNIP_QM uint32_t round_to_code(float v, const Format& f, bool sr, uint32_t rand) {
  const uint32_t bits = f2u(v);
  const uint32_t sign = (bits >> 31) << f.sign_shift;
  const uint32_t abs_bits = bits & kAbsMask;
  // reference: t = NaN -> NaN, except Inf kept where the format has it
  const uint32_t nonfinite_code = abs_bits == kInfBits && f.inf_code ? f.inf_code : f.nan_code;
  if (sr) {  // selects, no branch: NaN and Inf patterns go through the sum harmlessly
    const uint32_t emin_bits = uint32_t(f.emin_field) << 23;
    const bool below = abs_bits < emin_bits;
    const uint32_t x = below ? f2u(add_rz(u2f(abs_bits), u2f(emin_bits))) : abs_bits;
    const uint32_t base = uint32_t(below ? f.emin_field : f.emin_field - 1) << f.man_bits;
    const uint32_t code = ((x + (rand << (7 - f.man_bits))) >> (23 - f.man_bits)) - base;
    return sign | (abs_bits >= kInfBits ? nonfinite_code : code < f.max_code ? code : f.max_code);
  }
  if (abs_bits >= kInfBits) return sign | nonfinite_code;
  const int efield_in = int(abs_bits >> 23);
  const int efield = efield_in > f.emin_field ? efield_in : f.emin_field;
  // 1 / q = 2^(m - E): a power of two whose exponent field stays in [1, 254] for every format here.
  const float inv_q = u2f(uint32_t(254 + f.man_bits - efield) << 23);
  const uint32_t k = uint32_t(rintf(mul_rn(u2f(abs_bits), inv_q)));  // t exact; half to even, as torch.round
  const uint32_t code = (uint32_t(efield - f.emin_field) << f.man_bits) + k;
  return sign | (code < f.max_code ? code : f.max_code);
}

// The E4M3 byte with the value of E2M1 code c (4 bits; every E2M1 value is an E4M3 value): the sign
// moves from bit 3 to bit 7; a normal magnitude code 2E + m (E >= 1) is 2^(E-1) (1 + m / 2): E4M3
// exponent field E + 6, mantissa m << 2, i.e. byte 4 * code + 0x30; the subnormal 0.5 (code 1) is 0x30.
SNIP_QM uint32_t e2m1_as_e4m3_byte(uint32_t c) {
  const uint32_t mag = c & 7u;
  return ((c & 8u) << 4) | (mag >= 2u ? 4u * mag + 0x30u : 0x30u * mag);
}

// cast.decode for the formats here (NaN codes give NaN, Inf codes +-Inf).
SNIP_QM float decode(uint32_t code, const Format& f) {
  const uint32_t mag = code & ((1u << f.sign_shift) - 1);
  const bool neg = (code >> f.sign_shift) & 1;
  float a;
  if (f.inf_code && mag == f.inf_code) {
    a = u2f(kInfBits);
  } else if (f.has_nan && (mag == f.nan_code || (f.inf_code && mag > f.inf_code))) {
    a = u2f(kNaNBits);
  } else {
    const uint32_t efield = mag >> f.man_bits, mant = mag & ((1u << f.man_bits) - 1);
    // value = (efield ? 2^m + mant : mant) * 2^(max(efield, 1) - bias - m), exact in float32
    const uint32_t sig = efield ? (mant | (1u << f.man_bits)) : mant;
    const int exp = int(efield ? efield : 1) - f.bias - f.man_bits;
    a = mul_rn(float(sig), u2f(uint32_t(127 + exp) << 23));
  }
  return neg ? -a : a;
}

// ---- block scales (reference.block_scales, reference._nvfp4_tensor_scale) ------------------------

// The smallest power of two >= positive float32 `s` (reference._round_up_pow2). Normal s: the bit
// pattern rounded up to the next exponent. Subnormal s = m * 2^-149: next_pow2(m) * 2^-149, whose bit
// pattern is the integer next_pow2(m) (up to 2^23, the bits of 2^-126).
SNIP_QM float round_up_pow2(float s) {
  uint32_t b = f2u(s);
  if (b < 0x00800000u) {
    --b;
    b |= b >> 1;
    b |= b >> 2;
    b |= b >> 4;
    b |= b >> 8;
    b |= b >> 16;
    return u2f(b + 1);
  }
  if (b & 0x7FFFFFu) b = (b + 0x7FFFFFu) & 0xFF800000u;
  return u2f(b);
}

// A block's float32 element scale (what x is divided by) and the bits stored in the scales tensor:
// the float32 pattern (FP32, POW2) or one byte (E8M0, NVFP4's E4M3).
struct BlockScale {
  float s;
  uint32_t stored;
};

// amax_bits: the block's max |x| as a float32 bit pattern with NaN clamped to Inf (integer order on
// non-negative floats is float order, so the block max is an integer max and "non-finite" is >= Inf).
SNIP_QM BlockScale block_scale(uint32_t amax_bits, ScaleKind kind, Elem elem, float tensor_scale) {
  const bool finite = amax_bits < kInfBits;
  const float amax = u2f(amax_bits);
  if (kind == ScaleKind::kNVFP4) {
    constexpr Format e4m3 = format_of(Elem::kE4M3);
    uint32_t b;
    if (!finite || !(fabsf(tensor_scale) < INFINITY)) {
      b = e4m3.nan_code;                                  // torch.full_like(nan) -> 0x7F
    } else if (amax_bits == 0) {
      b = 0x38;                                           // 1.0
    } else {
      b = round_to_code(div_rn(amax, mul_rn(tensor_scale, 6.0f)), e4m3, false, 0);
      if ((b & 0x7F) == 0) b = 1;                         // +-0 -> E4M3 min subnormal
    }
    const float s = mul_rn(decode(b, e4m3), tensor_scale);
    return BlockScale{s == 0.0f ? INFINITY : s, b};     // an underflowed b * t: zero codes (reference)
  }
  float s;
  if (!finite) {
    s = u2f(kNaNBits);
  } else if (amax_bits == 0) {
    s = 1.0f;
  } else {
    s = div_rn(amax, max_finite_of(elem));
    if (s == 0.0f) s = u2f(1u);                           // 2^-149: a subnormal amax underflowed
    if (kind != ScaleKind::kFP32) s = round_up_pow2(s);
    if (kind == ScaleKind::kE8M0 && f2u(s) < 0x00400000u) s = u2f(0x00400000u);  // >= 2^-127
  }
  if (kind != ScaleKind::kE8M0) return BlockScale{s, f2u(s)};
  // torch's float -> float8_e8m0fnu: NaN -> 0xFF, 2^-127 (a float32 subnormal) -> 0, else the exponent.
  const uint32_t bits = f2u(s);
  return BlockScale{s, !finite ? 0xFFu : bits == 0x00400000u ? 0u : bits >> 23};
}

// reference._nvfp4_tensor_scale: t = tensor_amax / (448 * 6), never 0 for a positive amax, 1 for a
// zero amax, NaN for a non-finite one.
SNIP_QM float nvfp4_tensor_scale(float tensor_amax) {
  if (!(fabsf(tensor_amax) < INFINITY)) return u2f(kNaNBits);
  if (tensor_amax == 0.0f) return 1.0f;
  const float t = div_rn(tensor_amax, 448.0f * 6.0f);
  return (t == 0.0f && tensor_amax > 0.0f) ? u2f(1u) : t;
}

// ---- element / scale: x / s without a division per element ---------------------------------------
//
// Every element of a block is divided by the same scale s. With r = RN(1/s) computed once per block,
// q0 = RN(x r), the remainder e = x - q0 s (exact, one fused multiply-add) and q1 = RN(q0 + e r)
// (Markstein's correction) equal RN(x / s) whenever nothing underflows: |x| >= 2^-100 and a normal
// quotient. That was checked on every pair of BF16 / FP16 significands and float32 scale significands
// (tests/ops/test_quant_math_host.py), which is every such case, as the rounding then depends on the
// significands only. Outside it, with s >= 2^-60, the true quotient is below 2^-40 in magnitude and
// so is q1, with x's sign (copysign also keeps -0's): both round to a signed zero code in every format
// and rounding here, so the codes still agree. Float32 inputs (whose significands were not
// enumerated), NVFP4's T x values, and scales below 2^-60 or without a normal reciprocal divide.

SNIP_QM float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

SNIP_QM float with_sign_of(float magnitude, float sign) {  // one LOP3 on the device
#if defined(__CUDA_ARCH__)
  return copysignf(magnitude, sign);
#else
  return std::copysign(magnitude, sign);
#endif
}

struct Divisor {
  float s;
  float r;  // RN(1 / s), or 0: divide
};

// `reciprocal`: the elements are BF16 or FP16 values (the enumerated significands).
SNIP_QM Divisor divisor_of(float s, bool reciprocal) {
  const uint32_t b = f2u(s) & kAbsMask;
  const bool ok = reciprocal && b >= 0x21800000u && b < 0x7E800000u;  // 2^-60 <= s < 2^126
  return Divisor{s, ok ? div_rn(1.0f, s) : 0.0f};
}

// x / s through the reciprocal (d.r != 0; above).
SNIP_QM float reciprocal_quotient(float x, const Divisor& d) {
  const float q0 = mul_rn(x, d.r);
  return with_sign_of(fma_rn(fma_rn(-q0, d.s, x), d.r, q0), x);
}

// x / s, as the codes see it (above).
SNIP_QM float quotient(float x, const Divisor& d) {
  return d.r == 0.0f ? div_rn(x, d.s) : reciprocal_quotient(x, d);
}

// f(q) with q the quotient function of `d`, chosen once for all the elements f divides: a kernel
// dividing a run element by element by `quotient` branches per element (and, around the division's
// slow path, sets up a reconvergence point per element). kReciprocal: d may hold a reciprocal (the
// elements are BF16 or FP16); false compiles the division alone.
template <bool kReciprocal, class F>
SNIP_QM void with_quotient(const Divisor& d, F&& f) {
  if (kReciprocal && d.r != 0.0f) {
    f([&](float x) { return reciprocal_quotient(x, d); });
  } else {
    f([&](float x) { return div_rn(x, d.s); });
  }
}

// ---- scale layout --------------------------------------------------------------------------------

// Byte offset of scale (row r, block k) in the Blackwell layout for n blocks per row
// (snip_ops/scale_layout.py: 128x4 atoms of 512 bytes, K-atoms contiguous).
SNIP_QM int64_t blackwell_offset(int64_t r, int64_t k, int64_t n) {
  return ((r >> 7) * ((n + 3) >> 2) + (k >> 2)) * 512 + (r & 31) * 16 + ((r >> 5) & 3) * 4 + (k & 3);
}

// Stores the bits of block scale (r, k) of an output (r: its block row): 4 bytes for FP32/POW2, else
// one byte. The Hopper layout holds FP32/POW2 scales only (the op refuses others).
SNIP_QM void store_scale(const Output& o, ScaleKind kind, int64_t r, int64_t k, uint32_t bits) {
  if (o.layout == ScaleLayout::kBlackwell) {
    static_cast<uint8_t*>(o.scales)[blackwell_offset(r, k, o.nblk)] = uint8_t(bits);
  } else if (o.layout == ScaleLayout::kHopper) {
    static_cast<uint32_t*>(o.scales)[k * o.mn_pitch + r] = bits;
  } else if (kind == ScaleKind::kFP32 || kind == ScaleKind::kPow2) {
    static_cast<uint32_t*>(o.scales)[r * o.nblk + k] = bits;
  } else {
    static_cast<uint8_t*>(o.scales)[r * o.nblk + k] = uint8_t(bits);
  }
}

// The float32 element scale of stored scale i (plain layout): reference `scales.float() (* tensor_scale)`.
SNIP_QM float scale_value(const void* scales, int64_t i, ScaleKind kind, float ts) {
  switch (kind) {
    case ScaleKind::kFP32:
    case ScaleKind::kPow2: return static_cast<const float*>(scales)[i];
    case ScaleKind::kE8M0: {
      const uint32_t e = static_cast<const uint8_t*>(scales)[i];
      return e == 0xFF ? u2f(kNaNBits) : e == 0 ? u2f(0x00400000u) : u2f(e << 23);
    }
    case ScaleKind::kNVFP4: return mul_rn(decode(static_cast<const uint8_t*>(scales)[i], format_of(Elem::kE4M3)), ts);
  }
  return 0.0f;
}

// ---- codes of a block's elements ---------------------------------------------------------------

#if SNIP_WITH_CUDA
// Codes of two elements already divided by the scale (finite block), round to nearest even.
// FP8 uses the hardware satfinite conversion (sm_89+), which is this rounding exactly; E2M1 uses it
// only where it exists (sm_100a), the arithmetic above elsewhere. The host implementations
// (quantize_host.cpp) round with round_to_code itself: a build without CUDA has no CUDA header.
template <Elem E>
SNIP_QM uint32_t rne_codes2(float a, float b) {
  if constexpr (E == Elem::kE4M3 || E == Elem::kE5M2) {
    return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, E == Elem::kE4M3 ? __NV_E4M3 : __NV_E5M2);
  } else {
#if defined(__CUDA_ARCH_FEAT_SM100_ALL)
    return __nv_cvt_float2_to_fp4x2(make_float2(a, b), __NV_E2M1, cudaRoundNearest);
#else
    constexpr Format f = format_of(E);
    return round_to_code(a, f, false, 0) | (round_to_code(b, f, false, 0) << 4);
#endif
  }
}
#endif  // SNIP_WITH_CUDA

}  // namespace snip::quant
