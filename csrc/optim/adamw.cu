// Fused multi-tensor AdamW with BF16 stochastic-rounding write-back (snip_ops/optim.py).
//
// A block owns kGroupsPerBlock consecutive Philox groups (4 consecutive global element indices) of
// one tensor and finds that tensor by binary search in block_start. A thread handles whole groups,
// so one Philox call gives the bits of its four elements; the first and last group of a shard that
// starts off a multiple of 4 are partial. Memory bound: 4-element vector accesses where aligned.
// The arithmetic is adamw_math.cuh's, shared with the CPU loop.
//
// No hardware SR (cvt.rs on sm_100a): the software rule is a handful of integer operations, and
// the kernel is bandwidth bound on both archs.
#include "kernel_launch.cuh"
#include "optim/adamw.h"
#include "optim/adamw_math.cuh"

namespace snip::optim {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kGroupsPerBlock = kThreads * 4;

using quant::philox;
using quant::Words;

// Element access by storage type: float, or BF16 held as uint16_t bits.
template <typename T>
struct Elem;

template <>
struct Elem<float> {
  static __device__ __forceinline__ float load(const void* p, int64_t i) { return static_cast<const float*>(p)[i]; }
  static __device__ __forceinline__ void load4(const void* p, int64_t i, float (&x)[4]) {
    const float4 v = *reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
  }
  static __device__ __forceinline__ void store(void* p, int64_t i, float x, const uint32_t*) {
    static_cast<float*>(p)[i] = x;
  }
  static __device__ __forceinline__ void store4(void* p, int64_t i, const float (&x)[4], const Words*) {
    *reinterpret_cast<float4*>(static_cast<float*>(p) + i) = make_float4(x[0], x[1], x[2], x[3]);
  }
};

template <>
struct Elem<uint16_t> {
  static __device__ __forceinline__ float load(const void* p, int64_t i) {
    return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
  static __device__ __forceinline__ void load4(const void* p, int64_t i, float (&x)[4]) {
    const uint2 v = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(p) + i);
    x[0] = quant::u2f(v.x << 16), x[1] = quant::u2f(v.x & 0xFFFF0000u);
    x[2] = quant::u2f(v.y << 16), x[3] = quant::u2f(v.y & 0xFFFF0000u);
  }
  // `word` null: round to nearest even.
  static __device__ __forceinline__ void store(void* p, int64_t i, float x, const uint32_t* word) {
    static_cast<uint16_t*>(p)[i] = word ? bf16_sr(x, *word) : bf16_rne(x);
  }
  static __device__ __forceinline__ void store4(void* p, int64_t i, const float (&x)[4], const Words* words) {
    uint16_t h[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) h[j] = words ? bf16_sr(x[j], words->w[j]) : bf16_rne(x[j]);
    *reinterpret_cast<uint2*>(static_cast<uint16_t*>(p) + i) =
        make_uint2(uint32_t(h[0]) | (uint32_t(h[1]) << 16), uint32_t(h[2]) | (uint32_t(h[3]) << 16));
  }
};

template <typename P, typename S>
__global__ void __launch_bounds__(kThreads) adamw_kernel(const TensorSlot* __restrict__ slots,
                                                         const int64_t* __restrict__ block_start, int num_slots,
                                                         Scalars s, uint64_t seed, bool sr) {
  int lo = 0, hi = num_slots - 1;  // the last slot whose first block is <= this block
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (block_start[mid] <= int64_t(blockIdx.x)) lo = mid; else hi = mid - 1;
  }
  const TensorSlot t = slots[lo];
  const int64_t end = t.index_base + t.numel;  // global indices [index_base, end)
  const int64_t begin_group = first_group(t) + (int64_t(blockIdx.x) - block_start[lo]) * kGroupsPerBlock;
  const int64_t end_group = min(begin_group + kGroupsPerBlock, first_group(t) + num_groups(t));
  constexpr bool kStateBF16 = sizeof(S) == 2;
  const bool param_sr = sizeof(P) == 2 && sr;

  for (int64_t group = begin_group + threadIdx.x; group < end_group; group += kThreads) {
    Words wp{}, wm{}, wv{};
    if (param_sr) wp = philox(uint64_t(group), seed, t.offset);
    if constexpr (kStateBF16) {
      wm = philox(uint64_t(group), seed, t.offset + 1);
      wv = philox(uint64_t(group), seed, t.offset + 2);
    }
    const int64_t g0 = group * 4;
    const int64_t i0 = g0 - t.index_base;  // local index of the group's first element (may be < 0)
    if (t.vector_ok && g0 >= t.index_base && g0 + 4 <= end) {
      float p[4], g[4], m[4], v[4];
      Elem<P>::load4(t.param, i0, p);
      Elem<P>::load4(t.grad, i0, g);
      Elem<S>::load4(t.exp_avg, i0, m);
      Elem<S>::load4(t.exp_avg_sq, i0, v);
#pragma unroll
      for (int j = 0; j < 4; ++j) adamw_element(p[j], g[j], m[j], v[j], s);
      Elem<S>::store4(t.exp_avg, i0, m, kStateBF16 ? &wm : nullptr);
      Elem<S>::store4(t.exp_avg_sq, i0, v, kStateBF16 ? &wv : nullptr);
      Elem<P>::store4(t.param, i0, p, param_sr ? &wp : nullptr);
      continue;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (g0 + j < t.index_base || g0 + j >= end) continue;
      const int64_t i = i0 + j;
      float p = Elem<P>::load(t.param, i), m = Elem<S>::load(t.exp_avg, i), v = Elem<S>::load(t.exp_avg_sq, i);
      adamw_element(p, Elem<P>::load(t.grad, i), m, v, s);
      Elem<S>::store(t.exp_avg, i, m, kStateBF16 ? &wm.w[j] : nullptr);
      Elem<S>::store(t.exp_avg_sq, i, v, kStateBF16 ? &wv.w[j] : nullptr);
      Elem<P>::store(t.param, i, p, param_sr ? &wp.w[j] : nullptr);
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

int64_t adamw_blocks(const TensorSlot& t) { return (num_groups(t) + kGroupsPerBlock - 1) / kGroupsPerBlock; }

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
