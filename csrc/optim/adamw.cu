// Fused multi-tensor AdamW with BF16 stochastic-rounding write-back (snip_ops/optim.py).
//
// A CUDA block owns kPhiloxBlocksPerCta consecutive Philox blocks (quant::kElemsPerBlock = 8
// consecutive global element indices each) of one tensor and finds that tensor by binary search in
// block_start. A thread handles whole Philox blocks, so one Philox call per rounded stream (param,
// m, v) gives the bits of all eight elements. Memory bound: 8-element vector accesses (two float4
// or one uint4 per tensor) where the slot's vector_ok allows; the partial first and last Philox
// blocks of a shard, and every block of a tensor without vector_ok, go element by element. The
// arithmetic is adamw_math.cuh's, shared with the CPU loop.
//
// No hardware SR (cvt.rs on sm_100a, docs/design.md §9): the software rule is a handful of integer
// operations; the Philox calls, one per 8 elements and rounded stream, are the larger share.
#include "kernel_launch.cuh"
#include "optim/adamw.h"
#include "optim/adamw_math.cuh"

namespace snip::optim {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kPhiloxBlocksPerCta = kThreads * 2;
constexpr int kElems = quant::kElemsPerBlock;

using quant::philox;
using quant::Words;

// Element access by storage type: float, or BF16 held as uint16_t bits. Stores of float are exact;
// of BF16, SR with the bits of element j of Philox block `w` when `sr`, else round to nearest even
// (a flag and a reference rather than a nullable pointer, which would put `w` in local memory).
template <typename T>
struct Elem;

template <>
struct Elem<float> {
  static __device__ __forceinline__ float load(const void* p, int64_t i) { return static_cast<const float*>(p)[i]; }
  static __device__ __forceinline__ void load8(const void* p, int64_t i, float (&x)[kElems]) {
    const float4* q = reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
    const float4 a = q[0], b = q[1];
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
  }
  static __device__ __forceinline__ void store(void* p, int64_t i, float x, bool, const Words&, int) {
    static_cast<float*>(p)[i] = x;
  }
  static __device__ __forceinline__ void store8(void* p, int64_t i, const float (&x)[kElems], bool, const Words&) {
    float4* q = reinterpret_cast<float4*>(static_cast<float*>(p) + i);
    q[0] = make_float4(x[0], x[1], x[2], x[3]);
    q[1] = make_float4(x[4], x[5], x[6], x[7]);
  }
};

template <>
struct Elem<uint16_t> {
  static __device__ __forceinline__ float load(const void* p, int64_t i) {
    return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
  static __device__ __forceinline__ void load8(const void* p, int64_t i, float (&x)[kElems]) {
    const uint4 v = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p) + i);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      x[2 * k] = quant::u2f(w[k] << 16);
      x[2 * k + 1] = quant::u2f(w[k] & 0xFFFF0000u);
    }
  }
  static __device__ __forceinline__ uint16_t to_bf16(float x, bool sr, const Words& w, int j) {
    return sr ? bf16_sr(x, quant::block_bits(w, j)) : bf16_rne(x);
  }
  static __device__ __forceinline__ void store(void* p, int64_t i, float x, bool sr, const Words& w, int j) {
    static_cast<uint16_t*>(p)[i] = to_bf16(x, sr, w, j);
  }
  static __device__ __forceinline__ void store8(void* p, int64_t i, const float (&x)[kElems], bool sr,
                                                const Words& w) {
    uint32_t h[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      h[k] = uint32_t(to_bf16(x[2 * k], sr, w, 2 * k)) | (uint32_t(to_bf16(x[2 * k + 1], sr, w, 2 * k + 1)) << 16);
    }
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p) + i) = make_uint4(h[0], h[1], h[2], h[3]);
  }
};

template <typename P, typename S>
__global__ void __launch_bounds__(kThreads) adamw_kernel(const TensorSlot* __restrict__ slots,
                                                         const int64_t* __restrict__ block_start, int num_slots,
                                                         Scalars s, uint64_t seed, bool sr) {
  int lo = 0, hi = num_slots - 1;  // the last slot whose first CUDA block is <= this one
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (block_start[mid] <= int64_t(blockIdx.x)) lo = mid; else hi = mid - 1;
  }
  const TensorSlot t = slots[lo];
  const int64_t end = t.index_base + t.numel;  // global indices [index_base, end)
  const int64_t begin_pb = first_philox_block(t) + (int64_t(blockIdx.x) - block_start[lo]) * kPhiloxBlocksPerCta;
  const int64_t end_pb = min(begin_pb + kPhiloxBlocksPerCta, first_philox_block(t) + num_philox_blocks(t));
  constexpr bool kStateBF16 = sizeof(S) == 2;
  const bool param_sr = sizeof(P) == 2 && sr;

  for (int64_t pb = begin_pb + threadIdx.x; pb < end_pb; pb += kThreads) {
    Words wp{}, wm{}, wv{};
    if (param_sr) wp = philox(uint64_t(pb), seed, t.offset);
    if constexpr (kStateBF16) {
      wm = philox(uint64_t(pb), seed, t.offset + 1);
      wv = philox(uint64_t(pb), seed, t.offset + 2);
    }
    const int64_t g0 = pb * kElems;
    const int64_t i0 = g0 - t.index_base;  // local index of the Philox block's first element (may be < 0)
    if (t.vector_ok && g0 >= t.index_base && g0 + kElems <= end) {
      float p[kElems], g[kElems], m[kElems], v[kElems];
      Elem<P>::load8(t.param, i0, p);
      Elem<P>::load8(t.grad, i0, g);
      Elem<S>::load8(t.exp_avg, i0, m);
      Elem<S>::load8(t.exp_avg_sq, i0, v);
#pragma unroll
      for (int j = 0; j < kElems; ++j) adamw_element(p[j], g[j], m[j], v[j], s);
      Elem<S>::store8(t.exp_avg, i0, m, kStateBF16, wm);
      Elem<S>::store8(t.exp_avg_sq, i0, v, kStateBF16, wv);
      Elem<P>::store8(t.param, i0, p, param_sr, wp);
      continue;
    }
#pragma unroll
    for (int j = 0; j < kElems; ++j) {
      if (g0 + j < t.index_base || g0 + j >= end) continue;
      const int64_t i = i0 + j;
      float p = Elem<P>::load(t.param, i), m = Elem<S>::load(t.exp_avg, i), v = Elem<S>::load(t.exp_avg_sq, i);
      adamw_element(p, Elem<P>::load(t.grad, i), m, v, s);
      Elem<S>::store(t.exp_avg, i, m, kStateBF16, wm, j);
      Elem<S>::store(t.exp_avg_sq, i, v, kStateBF16, wv, j);
      Elem<P>::store(t.param, i, p, param_sr, wp, j);
    }
  }
}

template <typename P, typename S>
cudaError_t launch(const TensorSlot* slots, const int64_t* block_start, int num_slots, int64_t num_blocks,
                   const Scalars& s, uint64_t seed, bool sr, cudaStream_t stream) {
  launch_kernel(adamw_kernel<P, S>, unsigned(num_blocks), kThreads, 0, stream, slots, block_start, num_slots, s, seed,
                sr);
  return cudaGetLastError();
}

}  // namespace

int64_t adamw_blocks(const TensorSlot& t) {
  return (num_philox_blocks(t) + kPhiloxBlocksPerCta - 1) / kPhiloxBlocksPerCta;
}

cudaError_t launch_adamw(const TensorSlot* slots, const int64_t* block_start, int num_slots, int64_t num_blocks,
                         const Scalars& s, uint64_t seed, bool param_bf16, bool state_bf16, bool sr,
                         cudaStream_t stream) {
  if (num_slots == 0 || num_blocks == 0) return cudaSuccess;
  if (num_blocks > int64_t(0x7FFFFFFF)) return cudaErrorInvalidValue;
  if (param_bf16) {
    return state_bf16 ? launch<uint16_t, uint16_t>(slots, block_start, num_slots, num_blocks, s, seed, sr, stream)
                      : launch<uint16_t, float>(slots, block_start, num_slots, num_blocks, s, seed, sr, stream);
  }
  return state_bf16 ? launch<float, uint16_t>(slots, block_start, num_slots, num_blocks, s, seed, sr, stream)
                    : launch<float, float>(slots, block_start, num_slots, num_blocks, s, seed, sr, stream);
}

}  // namespace snip::optim
