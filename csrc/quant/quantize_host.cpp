// snip_C::quantize / snip_C::dequantize on host memory: the kernels' contract (quantize.h: row,
// column and fused outputs, 1-D and 2-D blocks, padding, the Blackwell scale layout, NVFP4's tensor
// scale) computed with the kernels' arithmetic (quant_math.cuh: Philox4x32-10, round_to_code,
// block_scale, decode), so every output is bit-identical to the kernels' and to snip_ops.reference.
// Element rounding is round_to_code for RNE too: the hardware conversions the kernels use for RNE
// reproduce it exactly (csrc/quant/README.md).
//
// Work split: the row output goes strip by strip (one row, or the rows of a 2-D block), the column
// output (codes of x^T) block of rows of x by block of rows; both read x row by row, so every inner
// loop runs along contiguous memory, and codes of x^T are gathered in a small tile and leave as
// contiguous rows of x^T. The SR bits of element (r, c) are element_bits(i), i = r * cols + c, for
// both outputs (each with its own offset): one Philox block serves the 8 elements of indices
// 8b .. 8b+7, as in the kernels. Strips are independent, so the results do not depend on the number
// of threads (at::parallel_for).
#include "quant/quantize_host.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "quant/hadamard.cuh"
#include "quant/quant_math.cuh"

namespace snip::quant {
namespace {

// Elements per parallel task at least: small tensors run on the calling thread.
constexpr int64_t kGrainElements = 1 << 15;
// Columns of x per tile of x^T codes (tile: kTileCols x block bytes).
constexpr int64_t kTileCols = 256;

// The element loops are compiled twice on x86-64 Linux, for AVX2 and for the baseline ISA, and the
// AVX2 version is chosen at load time where the CPU has it (an ifunc): vectorized (round_to_code's
// rintf / floorf become vroundps), they run 5-10x faster with the same IEEE operations, hence the
// same results. This file is compiled with -fno-trapping-math (CMakeLists.txt), which lets the
// compiler evaluate both sides of round_to_code's branches; it changes no result.
#if defined(__x86_64__) && defined(__GLIBC__) && (defined(__GNUC__) || defined(__clang__))
#define SNIP_VECTORIZED __attribute__((target_clones("avx2", "default")))
#else
#define SNIP_VECTORIZED
#endif

template <Elem E> constexpr int kCodeBits = E == Elem::kE2M1 ? 4 : 8;

// |v| as a bit pattern with NaN clamped to Inf: block maxima are integer maxima, "non-finite" >= Inf.
inline uint32_t abs_bits(float v) { return std::min(f2u(v) & kAbsMask, kInfBits); }

inline bool finite(float s) { return std::fabs(s) < INFINITY; }

// Elements c0 .. c0+n-1 of row r of x as float32 (exact widening), zeros past the last column.
template <typename T>
void load(const Args& a, int64_t r, int64_t c0, int64_t n, float* v) {
  const T* row = static_cast<const T*>(a.x) + r * a.ld + c0;
  const int64_t real = std::clamp<int64_t>(a.cols - c0, 0, n);
  for (int64_t i = 0; i < real; ++i) v[i] = static_cast<float>(row[i]);
  std::fill(v + real, v + n, 0.0f);
}

// The SR bits of the n elements with linear indices first .. first+n-1 (of the unpadded x).
void sr_bits(uint64_t first, int64_t n, uint64_t seed, uint64_t offset, uint32_t* w) {
  if (n <= 0) return;
  const uint64_t b0 = first / kElemsPerBlock;
  const int64_t lead = int64_t(first % kElemsPerBlock);
  const int64_t blocks = int64_t((first + uint64_t(n) - 1) / kElemsPerBlock - b0 + 1);
  for (int64_t b = 0; b < blocks; ++b) {
    const Words p = philox(b0 + b, seed, offset);
    for (int j = 0; j < kElemsPerBlock; ++j) {
      const int64_t i = kElemsPerBlock * b + j - lead;
      if (i >= 0 && i < n) w[i] = block_bits(p, j);
    }
  }
}

// One code per byte (sign included) of n elements sharing the finite scale s; w: their SR bits.
template <Elem E, bool kSR>
SNIP_VECTORIZED void codes(const float* __restrict v, int64_t n, float s, const uint32_t* __restrict w,
                           uint8_t* __restrict out) {
  constexpr Format F = format_of(E);
  for (int64_t i = 0; i < n; ++i) out[i] = uint8_t(round_to_code(div_rn(v[i], s), F, kSR, kSR ? w[i] : 0u));
}

// The same with a scale per element (x^T: a block per column of x); a non-finite scale (NaN/Inf
// block) gives code 0, as the reference.
template <Elem E, bool kSR>
SNIP_VECTORIZED void codes_each(const float* __restrict v, int64_t n, const float* __restrict s,
                                const uint32_t* __restrict w, uint8_t* __restrict out) {
  constexpr Format F = format_of(E);
  for (int64_t i = 0; i < n; ++i)
    out[i] = finite(s[i]) ? uint8_t(round_to_code(div_rn(v[i], s[i]), F, kSR, kSR ? w[i] : 0u)) : uint8_t(0);
}

// Stores n codes (one per byte) as a row of the output: bytes (FP8) or packed nibbles (FP4, element
// 2j in the low nibble of byte j; an odd n leaves a zero high nibble).
template <Elem E>
void store_codes(const uint8_t* c, int64_t n, uint8_t* dst) {
  if constexpr (kCodeBits<E> == 8) {
    std::memcpy(dst, c, n);
  } else {
    for (int64_t j = 0; 2 * j < n; ++j) dst[j] = uint8_t(c[2 * j] | (2 * j + 1 < n ? c[2 * j + 1] << 4 : 0));
  }
}

// at::parallel_for's grain size (items per task at least) for items of the given number of elements.
int64_t grain(int64_t elements_per_item) {
  return std::max<int64_t>(1, kGrainElements / std::max<int64_t>(1, elements_per_item));
}

// Codes of x (blocks along its rows): strips of block_rows rows (1 for 1-D blocks); within a strip
// the block maxima first, then row by row the codes.
template <typename T, Elem E, bool kSR>
void quantize_rows(const Args& a, float ts) {
  const Output& o = a.row;
  const Spec& sp = a.spec;
  const int64_t br = sp.block_rows, bc = sp.block_cols, nblk = o.nblk, width = nblk * bc;
  const int64_t strips = (a.rows + br - 1) / br;
  at::parallel_for(0, strips, grain(br * width), [&](int64_t s_begin, int64_t s_end) {
    std::vector<float> v(width), scale(nblk);
    std::vector<uint32_t> amax(nblk), w(kSR ? width : 0);
    std::vector<uint8_t> c(width);
    for (int64_t strip = s_begin; strip < s_end; ++strip) {
      const int64_t r0 = strip * br, r1 = std::min(r0 + br, a.rows);
      std::fill(amax.begin(), amax.end(), 0u);
      for (int64_t r = r0; r < r1; ++r) {
        load<T>(a, r, 0, width, v.data());
        for (int64_t k = 0; k < nblk; ++k) {
          uint32_t m = amax[k];
          for (int64_t i = 0; i < bc; ++i) m = std::max(m, abs_bits(v[k * bc + i]));
          amax[k] = m;
        }
      }
      for (int64_t k = 0; k < nblk; ++k) {
        const BlockScale bs = block_scale(amax[k], sp.scale, E, ts);
        scale[k] = bs.s;
        if (br == 1 || o.layout != ScaleLayout::kBlackwell) {
          store_scale(o, sp.scale, br == 1 ? r0 : strip, k, bs.stored);
        } else {  // the Blackwell layout repeats a 2-D block's scale on each of its rows
          for (int64_t r = r0; r < r1; ++r) store_scale(o, sp.scale, r, k, bs.stored);
        }
      }
      for (int64_t r = r0; r < r1; ++r) {
        if (br > 1) load<T>(a, r, 0, width, v.data());  // 1-D blocks: v still holds row r
        if constexpr (kSR) sr_bits(uint64_t(r) * uint64_t(a.cols), std::min(a.cols, width), a.seed, o.offset, w.data());
        for (int64_t k = 0; k * bc < o.inner_store; ++k) {
          uint8_t* ck = c.data() + k * bc;
          if (finite(scale[k])) {
            codes<E, kSR>(v.data() + k * bc, bc, scale[k], kSR ? w.data() + k * bc : nullptr, ck);
          } else {
            std::fill(ck, ck + bc, uint8_t(0));  // NaN/Inf block: zero codes, as the reference
          }
        }
        store_codes<E>(c.data(), o.inner_store, static_cast<uint8_t*>(o.codes) + r * o.ld);
      }
    }
  });
}

// Codes of x^T (blocks along the columns of x): strips of block_cols rows of x, one block of x^T
// per column of x (2-D blocks: block_cols columns share one); strips past the last row are the
// zero padding of x^T's rows (scale 1, codes 0).
template <typename T, Elem E, bool kSR>
void quantize_cols(const Args& a, float ts) {
  const Output& o = a.col;
  const Spec& sp = a.spec;
  const int64_t b = sp.block_cols, K = a.cols;
  const bool two_d = sp.block_rows > 1;
  at::parallel_for(0, o.nblk, grain(b * K), [&](int64_t s_begin, int64_t s_end) {
    std::vector<float> v(K), scale(K);
    std::vector<uint32_t> amax(K), w(kSR ? kTileCols : 0);
    std::vector<uint8_t> c(kTileCols), tile(kTileCols * b);
    for (int64_t strip = s_begin; strip < s_end; ++strip) {
      const int64_t r0 = strip * b, r1 = std::min(r0 + b, a.rows);
      std::fill(amax.begin(), amax.end(), 0u);
      for (int64_t r = r0; r < r1; ++r) {
        load<T>(a, r, 0, K, v.data());
        for (int64_t col = 0; col < K; ++col) amax[col] = std::max(amax[col], abs_bits(v[col]));
      }
      if (two_d) {
        for (int64_t c0 = 0; c0 < K; c0 += b) {
          const auto first = amax.begin() + c0, last = amax.begin() + std::min(c0 + b, K);
          std::fill(first, last, *std::max_element(first, last));
        }
      }
      for (int64_t col = 0; col < K; ++col) {
        const BlockScale bs = block_scale(amax[col], sp.scale, E, ts);
        scale[col] = bs.s;
        if (!two_d || o.layout == ScaleLayout::kBlackwell) {
          store_scale(o, sp.scale, col, strip, bs.stored);
        } else if (col % b == 0) {
          store_scale(o, sp.scale, col / b, strip, bs.stored);
        }
      }
      // x^T elements r0 .. r0+n-1 of each of its rows (bytes from r0 * bits / 8: b is even).
      const int64_t n = std::min(b, o.inner_store - r0);
      for (int64_t c0 = 0; c0 < K; c0 += kTileCols) {
        const int64_t nc = std::min(kTileCols, K - c0);
        std::fill(tile.begin(), tile.end(), uint8_t(0));
        for (int64_t r = r0; r < r1; ++r) {
          load<T>(a, r, c0, nc, v.data());
          if constexpr (kSR) sr_bits(uint64_t(r) * uint64_t(K) + uint64_t(c0), nc, a.seed, o.offset, w.data());
          codes_each<E, kSR>(v.data(), nc, scale.data() + c0, kSR ? w.data() : nullptr, c.data());
          for (int64_t i = 0; i < nc; ++i) tile[i * b + (r - r0)] = c[i];
        }
        for (int64_t i = 0; i < nc; ++i) {
          uint8_t* dst = static_cast<uint8_t*>(o.codes) + (c0 + i) * o.ld + r0 * kCodeBits<E> / 8;
          store_codes<E>(tile.data() + i * b, n, dst);
        }
      }
    }
  });
}

template <typename T, Elem E, bool kSR>
void quantize_typed(const Args& a, float ts) {
  if (a.row.codes != nullptr) quantize_rows<T, E, kSR>(a, ts);
  if (a.col.codes != nullptr) quantize_cols<T, E, kSR>(a, ts);
}

template <typename T>
void quantize_dtype(const Args& a, float ts) {
  const auto rounding = [&]<Elem E>() {
    a.spec.sr ? quantize_typed<T, E, true>(a, ts) : quantize_typed<T, E, false>(a, ts);
  };
  switch (a.spec.elem) {
    case Elem::kE4M3: return rounding.template operator()<Elem::kE4M3>();
    case Elem::kE5M2: return rounding.template operator()<Elem::kE5M2>();
    case Elem::kE2M1: return rounding.template operator()<Elem::kE2M1>();
  }
}

template <typename T>
float tensor_amax(const void* x, int64_t rows, int64_t cols, int64_t ld) {
  const uint32_t m = at::parallel_reduce(
      0, rows, grain(cols), uint32_t(0),
      [&](int64_t r_begin, int64_t r_end, uint32_t acc) {
        for (int64_t r = r_begin; r < r_end; ++r) {
          const T* row = static_cast<const T*>(x) + r * ld;
          for (int64_t c = 0; c < cols; ++c) acc = std::max(acc, abs_bits(static_cast<float>(row[c])));
        }
        return acc;
      },
      [](uint32_t p, uint32_t q) { return std::max(p, q); });
  return u2f(m);
}

template <typename T>
void hadamard_rows(const void* x, int64_t rows, int64_t cols, int64_t ld, uint32_t signs, float* out) {
  const int64_t groups = (rows + kHadamardSize - 1) / kHadamardSize;
  at::parallel_for(0, groups, std::max<int64_t>(1, kGrainElements / (kHadamardSize * std::max<int64_t>(cols, 1))),
                   [&](int64_t g_begin, int64_t g_end) {
    float v[kHadamardSize];
    for (int64_t g = g_begin; g < g_end; ++g)
      for (int64_t c = 0; c < cols; ++c) {
        for (int p = 0; p < kHadamardSize; ++p) {
          const int64_t r = g * kHadamardSize + p;
          v[p] = r < rows ? static_cast<float>(static_cast<const T*>(x)[r * ld + c]) : 0.0f;
        }
        hadamard16(v, signs);
        for (int p = 0; p < kHadamardSize; ++p) out[(g * kHadamardSize + p) * cols + c] = v[p];
      }
  });
}

// Elements c0 .. c0+n-1 of a row of codes (FP4: c0 even) decoded and times their block's scale s.
template <Elem E>
SNIP_VECTORIZED void decode_run(const uint8_t* __restrict row, int64_t c0, int64_t n, const float* __restrict value,
                                float s, float* __restrict y) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = c0 + i;
    const uint32_t code = kCodeBits<E> == 8 ? row[c] : (row[c / 2] >> (4 * (c % 2))) & 0xF;
    y[i] = mul_rn(value[code], s);
  }
}

// float32 -> bfloat16, round to nearest even (torch's conversion).
SNIP_VECTORIZED void to_bf16(const float* __restrict y, int64_t n, c10::BFloat16* __restrict out) {
  for (int64_t i = 0; i < n; ++i) out[i] = c10::BFloat16(y[i]);
}

template <Elem E, bool kBF16>
void dequantize_typed(const uint8_t* codes, int64_t ld, const void* scales, int64_t lds, float ts, const Spec& spec,
                      int64_t rows, int64_t cols, void* out) {
  constexpr Format F = format_of(E);
  constexpr int kCodes = 1 << kCodeBits<E>;
  float value[kCodes];  // decode of every code
  for (int c = 0; c < kCodes; ++c) value[c] = decode(uint32_t(c), F);
  at::parallel_for(0, rows, grain(cols), [&](int64_t r_begin, int64_t r_end) {
    std::vector<float> y(kBF16 ? cols : 0);
    for (int64_t r = r_begin; r < r_end; ++r) {
      float* yr = kBF16 ? y.data() : static_cast<float*>(out) + r * cols;
      for (int64_t c0 = 0; c0 < cols; c0 += spec.block_cols) {
        const float s = scale_value(scales, r / spec.block_rows * lds + c0 / spec.block_cols, spec.scale, ts);
        decode_run<E>(codes + r * ld, c0, std::min<int64_t>(spec.block_cols, cols - c0), value, s, yr + c0);
      }
      if constexpr (kBF16) to_bf16(yr, cols, static_cast<c10::BFloat16*>(out) + r * cols);
    }
  });
}

template <Elem E>
void dequantize_elem(const uint8_t* codes, int64_t ld, const void* scales, int64_t lds, float ts, const Spec& spec,
                     int64_t rows, int64_t cols, void* out, bool bf16) {
  if (bf16) dequantize_typed<E, true>(codes, ld, scales, lds, ts, spec, rows, cols, out);
  else dequantize_typed<E, false>(codes, ld, scales, lds, ts, spec, rows, cols, out);
}

}  // namespace

float quantize_tensor_amax_host(const void* x, InputDType dtype, int64_t rows, int64_t cols, int64_t ld) {
  switch (dtype) {
    case InputDType::kFloat32: return tensor_amax<float>(x, rows, cols, ld);
    case InputDType::kFloat16: return tensor_amax<c10::Half>(x, rows, cols, ld);
    case InputDType::kBFloat16: return tensor_amax<c10::BFloat16>(x, rows, cols, ld);
  }
  return u2f(kNaNBits);
}

void hadamard_rows_host(const void* x, InputDType dtype, int64_t rows, int64_t cols, int64_t ld, uint32_t signs,
                        float* out) {
  switch (dtype) {
    case InputDType::kFloat32: return hadamard_rows<float>(x, rows, cols, ld, signs, out);
    case InputDType::kFloat16: return hadamard_rows<c10::Half>(x, rows, cols, ld, signs, out);
    case InputDType::kBFloat16: return hadamard_rows<c10::BFloat16>(x, rows, cols, ld, signs, out);
  }
}

void quantize_host(const Args& a) {
  const float ts = a.spec.scale == ScaleKind::kNVFP4 ? nvfp4_tensor_scale(*a.tensor_amax) : 1.0f;
  if (a.tensor_scale != nullptr) *a.tensor_scale = ts;
  switch (a.dtype) {
    case InputDType::kFloat32: return quantize_dtype<float>(a, ts);
    case InputDType::kFloat16: return quantize_dtype<c10::Half>(a, ts);
    case InputDType::kBFloat16: return quantize_dtype<c10::BFloat16>(a, ts);
  }
}

void dequantize_host(const void* codes, int64_t ld, const void* scales, int64_t lds, float tensor_scale,
                     const Spec& spec, int64_t rows, int64_t cols, void* out, bool out_bf16) {
  if (rows * cols == 0) return;
  const auto* c = static_cast<const uint8_t*>(codes);
  const float ts = tensor_scale;
  switch (spec.elem) {
    case Elem::kE4M3: return dequantize_elem<Elem::kE4M3>(c, ld, scales, lds, ts, spec, rows, cols, out, out_bf16);
    case Elem::kE5M2: return dequantize_elem<Elem::kE5M2>(c, ld, scales, lds, ts, spec, rows, cols, out, out_bf16);
    case Elem::kE2M1: return dequantize_elem<Elem::kE2M1>(c, ld, scales, lds, ts, spec, rows, cols, out, out_bf16);
  }
}

}  // namespace snip::quant
