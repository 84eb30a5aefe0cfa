// snip_C::adamw_ on host memory: the CUDA kernel's loop (Philox block by Philox block, 8 elements
// each) with the same per-element arithmetic (adamw_math.cuh), parallel over Philox blocks. The
// optimizer uses it on the CPU when the extension is built; it also lets CPU-only machines check the
// kernel's arithmetic against the PyTorch reference bit for bit.
#include <ATen/Parallel.h>

#include "optim/adamw.h"
#include "optim/adamw_math.cuh"

namespace snip::optim {
namespace {

template <typename T>
float load(const void* p, int64_t i) {
  if constexpr (sizeof(T) == 4) return static_cast<const float*>(p)[i];
  else return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
}

// FP32 as is; BF16 with SR from the bits of element j of Philox block `w` when `sr`, else rounded to
// nearest even.
template <typename T>
void store(void* p, int64_t i, float x, bool sr, const quant::Words& w, int j) {
  if constexpr (sizeof(T) == 4) static_cast<float*>(p)[i] = x;
  else static_cast<uint16_t*>(p)[i] = sr ? bf16_sr(x, quant::block_bits(w, j)) : bf16_rne(x);
}

template <typename P, typename S>
void update(const TensorSlot& t, const Scalars& s, uint64_t seed, bool sr) {
  constexpr bool kStateBF16 = sizeof(S) == 2;
  constexpr int kElems = quant::kElemsPerBlock;
  const bool param_sr = sizeof(P) == 2 && sr;
  const int64_t begin = first_philox_block(t), end = t.index_base + t.numel;
  at::parallel_for(begin, begin + num_philox_blocks(t), 2048, [&](int64_t pb_begin, int64_t pb_end) {
    for (int64_t pb = pb_begin; pb < pb_end; ++pb) {
      quant::Words wp{}, wm{}, wv{};
      if (param_sr) wp = quant::philox(uint64_t(pb), seed, t.offset);
      if (kStateBF16) {
        wm = quant::philox(uint64_t(pb), seed, t.offset + 1);
        wv = quant::philox(uint64_t(pb), seed, t.offset + 2);
      }
      for (int j = 0; j < kElems; ++j) {
        const int64_t gi = pb * kElems + j;
        if (gi < t.index_base || gi >= end) continue;
        const int64_t i = gi - t.index_base;
        float p = load<P>(t.param, i), m = load<S>(t.exp_avg, i), v = load<S>(t.exp_avg_sq, i);
        adamw_element(p, load<P>(t.grad, i), m, v, s);
        store<S>(t.exp_avg, i, m, kStateBF16, wm, j);
        store<S>(t.exp_avg_sq, i, v, kStateBF16, wv, j);
        store<P>(t.param, i, p, param_sr, wp, j);
      }
    }
  });
}

}  // namespace

void adamw_cpu(const TensorSlot* slots, int num_slots, const Scalars& s, uint64_t seed, bool param_bf16,
               bool state_bf16, bool sr) {
  for (int k = 0; k < num_slots; ++k) {
    if (param_bf16) {
      state_bf16 ? update<uint16_t, uint16_t>(slots[k], s, seed, sr) : update<uint16_t, float>(slots[k], s, seed, sr);
    } else {
      state_bf16 ? update<float, uint16_t>(slots[k], s, seed, sr) : update<float, float>(slots[k], s, seed, sr);
    }
  }
}

}  // namespace snip::optim
