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
// How fast memory is fed depends on the bytes each SM has in flight: the threads it holds times
// the loads each thread has outstanding. So BF16 values stay packed in registers rather than
// unpacked to float, every variant stays within 80 registers (at least three 256-thread CTAs per
// SM; scripts/check_sass.sh checks this in the binary), and with BF16 parameters a thread loads
// both of its Philox blocks before computing either (adamw_kernel).
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
  static __device__ __forceinline__ void store(void* p, int64_t i, float x, bool, const Words&, int) {
    static_cast<float*>(p)[i] = x;
  }
};

template <>
struct Elem<uint16_t> {
  static __device__ __forceinline__ float load(const void* p, int64_t i) {
    return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
  static __device__ __forceinline__ uint16_t to_bf16(float x, bool sr, const Words& w, int j) {
    return sr ? bf16_sr(x, quant::block_bits(w, j)) : bf16_rne(x);
  }
  static __device__ __forceinline__ void store(void* p, int64_t i, float x, bool sr, const Words& w, int j) {
    static_cast<uint16_t*>(p)[i] = to_bf16(x, sr, w, j);
  }
};

// One Philox block's eight elements of one tensor, held in registers in their storage format and
// updated in place: BF16 stays packed two to a word, so a thread with BF16 moments keeps half the
// registers that unpacked floats would take, and more warps fit on an SM to keep loads in flight.
// `j` is a compile-time constant wherever these are called (fully unrolled loops).
template <typename T>
struct Vec8;

template <>
struct Vec8<float> {
  float4 a, b;
  __device__ __forceinline__ void load(const void* p, int64_t i) {
    const float4* q = reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
    a = q[0], b = q[1];
  }
  __device__ __forceinline__ void store(void* p, int64_t i) const {
    float4* q = reinterpret_cast<float4*>(static_cast<float*>(p) + i);
    q[0] = a, q[1] = b;
  }
  __device__ __forceinline__ float& at(int j) {
    float4& h = j < 4 ? a : b;
    return (j & 3) == 0 ? h.x : (j & 3) == 1 ? h.y : (j & 3) == 2 ? h.z : h.w;
  }
  __device__ __forceinline__ float get(int j) { return at(j); }
  __device__ __forceinline__ void set(int j, float x, bool, const Words&) { at(j) = x; }
};

template <>
struct Vec8<uint16_t> {
  uint4 h;  // element 2k in the low half of word k, 2k + 1 in the high half
  __device__ __forceinline__ void load(const void* p, int64_t i) {
    h = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p) + i);
  }
  __device__ __forceinline__ void store(void* p, int64_t i) const {
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p) + i) = h;
  }
  __device__ __forceinline__ uint32_t& word(int k) { return k == 0 ? h.x : k == 1 ? h.y : k == 2 ? h.z : h.w; }
  __device__ __forceinline__ float get(int j) {
    const uint32_t w = word(j >> 1);
    return quant::u2f((j & 1) ? w & 0xFFFF0000u : w << 16);
  }
  __device__ __forceinline__ void set(int j, float x, bool sr, const Words& w) {
    const uint32_t b = Elem<uint16_t>::to_bf16(x, sr, w, j);
    uint32_t& d = word(j >> 1);
    d = (j & 1) ? (d & 0xFFFFu) | (b << 16) : (d & 0xFFFF0000u) | b;
  }
};

// The three Philox streams of block `pb`: the parameter's (when its write-back rounds with SR) and,
// with BF16 moments, m's and v's.
struct BlockBits {
  Words p, m, v;
};

template <typename P, typename S>
__device__ __forceinline__ BlockBits philox_streams(const TensorSlot& t, int64_t pb, uint64_t seed, bool param_sr) {
  BlockBits b{};
  if (param_sr) b.p = philox(uint64_t(pb), seed, t.offset);
  if constexpr (sizeof(S) == 2) {
    b.m = philox(uint64_t(pb), seed, t.offset + 1);
    b.v = philox(uint64_t(pb), seed, t.offset + 2);
  }
  return b;
}

// A Philox block whose eight elements all lie in the tensor and may be accessed as vectors.
__device__ __forceinline__ bool whole_vector_block(const TensorSlot& t, int64_t pb) {
  const int64_t g0 = pb * kElems;
  return t.vector_ok && g0 >= t.index_base && g0 + kElems <= t.index_base + t.numel;
}

// One whole Philox block, its vectors already in registers: update in place and store.
template <typename P, typename S>
struct VectorBlock {
  Vec8<P> p, g;
  Vec8<S> m, v;
  int64_t i0;  // local index of the block's first element

  __device__ __forceinline__ void load(const TensorSlot& t, int64_t pb) {
    i0 = pb * kElems - t.index_base;
    p.load(t.param, i0);
    g.load(t.grad, i0);
    m.load(t.exp_avg, i0);
    v.load(t.exp_avg_sq, i0);
  }
  __device__ __forceinline__ void update_and_store(const TensorSlot& t, int64_t pb, const Scalars& s, uint64_t seed,
                                                   bool param_sr) {
    constexpr bool kStateBF16 = sizeof(S) == 2;
    const BlockBits b = philox_streams<P, S>(t, pb, seed, param_sr);
#pragma unroll
    for (int j = 0; j < kElems; ++j) {
      float pj = p.get(j), mj = m.get(j), vj = v.get(j);
      adamw_element(pj, g.get(j), mj, vj, s);
      m.set(j, mj, kStateBF16, b.m);
      v.set(j, vj, kStateBF16, b.v);
      p.set(j, pj, param_sr, b.p);
    }
    m.store(t.exp_avg, i0);
    v.store(t.exp_avg_sq, i0);
    p.store(t.param, i0);
  }
};

// Any Philox block of the tensor, element by element (a shard's partial first and last blocks, and
// tensors without vector_ok).
template <typename P, typename S>
__device__ __forceinline__ void scalar_block(const TensorSlot& t, int64_t pb, const Scalars& s, uint64_t seed,
                                             bool param_sr) {
  constexpr bool kStateBF16 = sizeof(S) == 2;
  const BlockBits b = philox_streams<P, S>(t, pb, seed, param_sr);
  const int64_t g0 = pb * kElems, i0 = g0 - t.index_base, end = t.index_base + t.numel;
#pragma unroll
  for (int j = 0; j < kElems; ++j) {
    if (g0 + j < t.index_base || g0 + j >= end) continue;
    const int64_t i = i0 + j;
    float p = Elem<P>::load(t.param, i), m = Elem<S>::load(t.exp_avg, i), v = Elem<S>::load(t.exp_avg_sq, i);
    adamw_element(p, Elem<P>::load(t.grad, i), m, v, s);
    Elem<S>::store(t.exp_avg, i, m, kStateBF16, b.m, j);
    Elem<S>::store(t.exp_avg_sq, i, v, kStateBF16, b.v, j);
    Elem<P>::store(t.param, i, p, param_sr, b.p, j);
  }
}

template <typename P, typename S>
__device__ __forceinline__ void any_block(const TensorSlot& t, int64_t pb, const Scalars& s, uint64_t seed,
                                          bool param_sr) {
  if (whole_vector_block(t, pb)) {
    VectorBlock<P, S> a;
    a.load(t, pb);
    a.update_and_store(t, pb, s, seed, param_sr);
  } else {
    scalar_block<P, S>(t, pb, s, seed, param_sr);
  }
}

// A thread's Philox blocks are pb and pb + kThreads (so a warp's accesses stay contiguous). With BF16
// parameters, where both are whole vector blocks, both blocks' loads are issued before either is
// computed: twice the bytes in flight per thread at the same occupancy, as two blocks' packed
// vectors still fit the register budget. FP32 parameters carry 32 or 24 registers of vectors per
// block, which two blocks would push past it, and already move more bytes per block.
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
  const int64_t begin_pb = first_philox_block(t) + (int64_t(blockIdx.x) - block_start[lo]) * kPhiloxBlocksPerCta;
  const int64_t end_pb = min(begin_pb + kPhiloxBlocksPerCta, first_philox_block(t) + num_philox_blocks(t));
  const bool param_sr = sizeof(P) == 2 && sr;
  static_assert(kPhiloxBlocksPerCta == 2 * kThreads, "each thread owns two Philox blocks");

  const int64_t pb0 = begin_pb + threadIdx.x, pb1 = pb0 + kThreads;
  if constexpr (sizeof(P) == 2) {
    if (pb1 < end_pb && whole_vector_block(t, pb0) && whole_vector_block(t, pb1)) {
      VectorBlock<P, S> a, b;
      a.load(t, pb0);
      b.load(t, pb1);
      a.update_and_store(t, pb0, s, seed, param_sr);
      b.update_and_store(t, pb1, s, seed, param_sr);
      return;
    }
  }
  if (pb0 < end_pb) any_block<P, S>(t, pb0, s, seed, param_sr);
  if (pb1 < end_pb) any_block<P, S>(t, pb1, s, seed, param_sr);
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
