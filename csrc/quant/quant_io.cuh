// Device-side building blocks shared by the quantize kernels: input loads, the SR bits of a run of
// elements, the codes of a run, and scale stores (plain or Blackwell layout).
#pragma once
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "quant/quant_math.cuh"

namespace snip::quant {

template <Elem E> constexpr int kCodeBits = E == Elem::kE2M1 ? 4 : 8;

// An input element as float32 (exact).
template <typename T>
__device__ __forceinline__ float widen(T e) {
  if constexpr (std::is_same_v<T, float>) {
    return e;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __half2float(e);
  } else {
    return __bfloat162float(e);
  }
}

// N consecutive input elements of a row, kept in the input type (16-bit inputs take half the
// registers of float32 copies) and widened to float32 on use.
template <typename T, int N>
struct Run {
  static_assert((N * sizeof(T)) % 16 == 0, "runs are whole 16-byte vectors");
  uint4 raw[N * sizeof(T) / 16];
  __device__ __forceinline__ float operator[](int i) const { return widen(reinterpret_cast<const T*>(raw)[i]); }
};

// Loads elements c0 .. c0+N-1 of a row, zeros past `cols` (zero padding). `vec`: the row start is
// 16-byte aligned, so a run fully inside the row moves as 16-byte vectors.
template <typename T, int N>
__device__ __forceinline__ void load_run(Run<T, N>& v, const T* row, int64_t c0, int64_t cols, bool vec) {
  if (vec && c0 + N <= cols) {
#pragma unroll
    for (int j = 0; j < int(N * sizeof(T) / 16); ++j) v.raw[j] = __ldg(reinterpret_cast<const uint4*>(row + c0) + j);
  } else {
    using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint16_t>;  // zero bits are +0.0
    Bits* e = reinterpret_cast<Bits*>(v.raw);
#pragma unroll
    for (int i = 0; i < N; ++i) e[i] = c0 + i < cols ? reinterpret_cast<const Bits*>(row)[c0 + i] : Bits(0);
  }
}

// Starts a 16-byte copy from global to shared memory that completes behind the thread's other work
// (cp.async, sm_80+; both addresses 16-byte aligned); wait_async_copies() waits for all of the
// thread's copies and makes them visible to it (to it alone: other threads need a barrier too).
__device__ __forceinline__ void copy_async16(uint4* smem, const uint4* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
#else
  *smem = __ldg(gmem);
#endif
}
__device__ __forceinline__ void wait_async_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// |v| as a bit pattern with NaN clamped to Inf: block maxima are integer maxima, "non-finite" >= Inf.
__device__ __forceinline__ uint32_t abs_bits(float v) { return min(f2u(v) & kAbsMask, kInfBits); }

// 16-bit inputs find their maxima two at a time, on the packed words as loaded: a BF16 or FP16
// magnitude orders as its unsigned bits do, and widening to float32 keeps that order, so the
// largest abs_bits of a set of elements is the abs_bits of the element with the largest 16-bit
// magnitude (NaN clamped to Inf in either width). Per pair: one LOP3 and two 16x2 min/max, where
// element by element it takes a widening, a LOP3 and a min/max each.
__device__ __forceinline__ uint32_t max_u16x2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __vmaxu2(a, b);
#else
  return max(a & 0xFFFFu, b & 0xFFFFu) | (max(a >> 16, b >> 16) << 16);
#endif
}
__device__ __forceinline__ uint32_t min_u16x2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __vminu2(a, b);
#else
  return min(a & 0xFFFFu, b & 0xFFFFu) | (min(a >> 16, b >> 16) << 16);
#endif
}
// The magnitudes of a packed pair of 16-bit T, each clamped at T's Inf.
template <typename T>
__device__ __forceinline__ uint32_t abs_pair(uint32_t w) {
  return min_u16x2(w & 0x7FFF7FFFu, std::is_same_v<T, __half> ? 0x7C007C00u : 0x7F807F80u);
}
// abs_bits of the element whose clamped 16-bit magnitude is m.
template <typename T>
__device__ __forceinline__ uint32_t abs_bits_of16(uint32_t m) {
  if constexpr (std::is_same_v<T, __half>) {
    return f2u(__half2float(__ushort_as_half(uint16_t(m))));
  } else {
    return m << 16;
  }
}
// The packed 16-bit words of a run (element 2k in the low half of word k).
template <typename T, int N>
__device__ __forceinline__ uint32_t pair_word(const Run<T, N>& v, int k) {
  return reinterpret_cast<const uint32_t*>(v.raw)[k];
}

// The largest abs_bits of a run's elements.
template <typename T, int N>
__device__ __forceinline__ uint32_t run_max_bits(const Run<T, N>& v) {
  if constexpr (sizeof(T) == 4) {
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < N; ++i) m = max(m, abs_bits(v[i]));
    return m;
  } else {
    uint32_t m = 0;
#pragma unroll
    for (int k = 0; k < N / 2; ++k) m = max_u16x2(m, abs_pair<T>(pair_word(v, k)));
    return abs_bits_of16<T>(max(m & 0xFFFFu, m >> 16));
  }
}

// SR bits of the N elements (row, c0 .. c0+N-1) of a [rows, cols] input (N a multiple of 8), packed
// two per word: element 2k's in the low half of w[k], element 2k+1's in the high half, which for a
// run of whole Philox blocks is the blocks' words as they come. With cols % 8 == 0 and c0 % 8 == 0
// one Philox block serves 8 elements; otherwise the blocks straddle rows and each element takes its
// own. Bits past `cols` are never used (their elements are zero padding, which rounds to 0 whatever
// the bits).
// `key`: the seed, or its round keys (PhiloxKey) where the kernel has them precomputed.
template <int N, typename Key>
__device__ __forceinline__ void run_bits(uint32_t (&w)[N / 2], int64_t row, int64_t c0, int64_t cols, const Key& key,
                                         uint64_t offset) {
  static_assert(N % kElemsPerBlock == 0, "runs are whole Philox blocks");
  const uint64_t base = uint64_t(row) * uint64_t(cols) + uint64_t(c0);
  if (cols % kElemsPerBlock == 0) {
#pragma unroll
    for (int g = 0; g < N / kElemsPerBlock; ++g) {
      const Words pw = philox(base / kElemsPerBlock + g, key, offset);
#pragma unroll
      for (int k = 0; k < 4; ++k) w[4 * g + k] = pw.w[k];
    }
  } else {
#pragma unroll
    for (int k = 0; k < N / 2; ++k) {
      const uint32_t lo = c0 + 2 * k < cols ? element_bits(base + 2 * k, key, offset) : 0u;
      const uint32_t hi = c0 + 2 * k + 1 < cols ? element_bits(base + 2 * k + 1, key, offset) : 0u;
      w[k] = lo | (hi << 16);
    }
  }
}

// Element i's SR bits from run_bits' packed words (i a compile-time index after unrolling;
// quant_math.cuh's block_bits takes a runtime one).
template <int M>
__device__ __forceinline__ uint32_t bits_of(const uint32_t (&w)[M], int i) {
  return (i & 1) ? w[i >> 1] >> 16 : w[i >> 1] & 0xFFFFu;
}

// Inputs of type T take quotient's reciprocal: BF16 and FP16, whose significands were enumerated.
template <typename T> constexpr bool kReciprocalChecked = !std::is_same_v<T, float>;

// Codes of a run of N elements sharing one block scale, packed little-endian into 32-bit words
// (FP8: byte i = element i; FP4: nibble i = element i, i.e. element 2j in the low nibble of byte j).
// A non-finite scale (NaN/Inf block) gives all-zero codes, as the reference does.
// `d`: the block scale's divisor_of(s, kReciprocalChecked<T>), computed once by the caller.
template <Elem E, bool kSR, typename T, int N>
__device__ __forceinline__ void run_codes(uint32_t (&out)[N * kCodeBits<E> / 32], const Run<T, N>& v, const Divisor& d,
                                          const uint32_t (&w)[N / 2]) {
  constexpr int kBits = kCodeBits<E>;
  constexpr int kPerWord = 32 / kBits;
#pragma unroll
  for (int k = 0; k < N / kPerWord; ++k) out[k] = 0;
  if (!(fabsf(d.s) < INFINITY)) return;
  with_quotient<kReciprocalChecked<T>>(d, [&](auto quotient_of) {
#pragma unroll
    for (int i = 0; i < N; i += 2) {
      const float a = quotient_of(v[i]), b = quotient_of(v[i + 1]);
      uint32_t c2;
      if constexpr (kSR) {
        constexpr Format F = format_of(E);
        c2 = round_to_code(a, F, true, bits_of(w, i)) | (round_to_code(b, F, true, bits_of(w, i + 1)) << kBits);
      } else {
        c2 = rne_codes2<E>(a, b);
      }
      out[i / kPerWord] |= c2 << (kBits * (i % kPerWord));
    }
  });
}

// `a` with the Philox round keys of its seed (Args::key), for a kernel that reads them.
inline Args keyed(const Args& a) {
  Args b = a;
  b.key = philox_key(a.seed);
  return b;
}

// The NVFP4 tensor scale from the device tensor amax (1 for other scale kinds, where it is unused).
__device__ __forceinline__ float tensor_scale_of(const Args& a) {
  return a.spec.scale == ScaleKind::kNVFP4 ? nvfp4_tensor_scale(*a.tensor_amax) : 1.0f;
}

}  // namespace snip::quant
