// C entry points into the real launchers of the elementwise kernels (csrc/quant/quantize.h,
// csrc/optim/adamw.h), linked with those kernels built for the host shim (cuda_host_shim.h), so
// that tests/cuda_host.py runs them on CPU tensors through ctypes. Each returns the launcher's
// cudaError_t; snip_cuda_host_error() says why a launch failed.
#include <cstddef>
#include <cstdint>

#include "optim/adamw.h"
#include "quant/quantize.h"

using snip::optim::Scalars;
using snip::optim::TensorSlot;
using snip::quant::Elem;
using snip::quant::InputDType;
using snip::quant::Output;
using snip::quant::ScaleKind;
using snip::quant::ScaleLayout;
using snip::quant::Spec;

// tests/cuda_host.py writes TensorSlot and Scalars as arrays of 8-byte fields / of floats.
static_assert(sizeof(TensorSlot) == 64 && offsetof(TensorSlot, vector_ok) == 56);
static_assert(sizeof(Scalars) == 8 * sizeof(float));

namespace {

Spec spec_of(int elem, int block_rows, int block_cols, int scale, int sr) {
  return Spec{Elem(elem), block_rows, block_cols, ScaleKind(scale), sr != 0};
}

Output output_of(void* codes, int64_t ld, int64_t inner_store, void* scales, int64_t nblk, int64_t mn_pitch,
                 int scale_layout, uint64_t offset) {
  Output o;
  o.codes = codes;
  o.ld = ld;
  o.inner_store = inner_store;
  o.scales = scales;
  o.nblk = nblk;
  o.layout = ScaleLayout(scale_layout);
  o.mn_pitch = mn_pitch;
  o.offset = offset;
  return o;
}

}  // namespace

// launch_quantize_tile when `tile`, else launch_quantize_rows. An output with null codes is not
// requested. scale_layout: ScaleLayout's value, mn_pitch its Hopper pitch. hadamard_signs >= 0: the
// column output of T x (Args::hadamard).
extern "C" int snip_quantize(int tile, const void* x, int dtype, int64_t rows, int64_t cols, int64_t ld, int elem,
                             int block_rows, int block_cols, int scale, int sr, uint64_t seed, void* codes,
                             int64_t codes_ld, int64_t inner_store, void* scales, int64_t nblk, int64_t mn_pitch,
                             uint64_t offset, void* codes_t, int64_t codes_t_ld, int64_t inner_store_t, void* scales_t,
                             int64_t nblk_t, int64_t mn_pitch_t, uint64_t offset_t, int scale_layout,
                             const float* tensor_amax, float* tensor_scale,
                             int64_t hadamard_signs) {
  snip::quant::Args a{};
  a.x = x;
  a.dtype = InputDType(dtype);
  a.rows = rows;
  a.cols = cols;
  a.ld = ld;
  a.spec = spec_of(elem, block_rows, block_cols, scale, sr);
  a.seed = seed;
  if (codes != nullptr) a.row = output_of(codes, codes_ld, inner_store, scales, nblk, mn_pitch, scale_layout, offset);
  if (codes_t != nullptr) {
    a.col = output_of(codes_t, codes_t_ld, inner_store_t, scales_t, nblk_t, mn_pitch_t, scale_layout, offset_t);
  }
  a.tensor_amax = tensor_amax;
  a.tensor_scale = tensor_scale;
  a.hadamard = hadamard_signs >= 0;
  a.hadamard_signs = a.hadamard ? uint32_t(hadamard_signs) : 0u;
  return tile ? snip::quant::launch_quantize_tile(a, nullptr) : snip::quant::launch_quantize_rows(a, nullptr);
}

extern "C" int snip_quantize_tensor_amax(const void* x, int dtype, int64_t rows, int64_t cols, int64_t ld,
                                         float* amax) {
  return snip::quant::launch_quantize_tensor_amax(x, InputDType(dtype), rows, cols, ld, amax, nullptr);
}

extern "C" int snip_quantize_tensor_amax_hadamard(const void* x, int dtype, int64_t rows, int64_t cols, int64_t ld,
                                                  uint32_t signs, float* amax) {
  return snip::quant::launch_quantize_tensor_amax_hadamard(x, InputDType(dtype), rows, cols, ld, signs, amax, nullptr);
}

extern "C" int snip_dequantize(const void* codes, int64_t ld, const void* scales, int64_t lds,
                               const float* tensor_scale, int elem, int block_rows, int block_cols, int scale,
                               int64_t rows, int64_t cols, void* out, int out_bf16) {
  return snip::quant::launch_dequantize(codes, ld, scales, lds, tensor_scale,
                                        spec_of(elem, block_rows, block_cols, scale, 0), rows, cols, out,
                                        out_bf16 != 0, nullptr);
}

extern "C" int snip_e2m1_as_e4m3(const uint8_t* codes, int64_t ld, int64_t rows, int64_t cols, uint8_t* out,
                                 int64_t ld_out, int64_t rows_out, int64_t cols_out) {
  return snip::quant::launch_e2m1_as_e4m3(codes, ld, rows, cols, out, ld_out, rows_out, cols_out, nullptr);
}

extern "C" int64_t snip_adamw_blocks(int64_t numel, int64_t index_base) {
  TensorSlot t{};
  t.numel = numel;
  t.index_base = index_base;
  return snip::optim::adamw_blocks(t);
}

extern "C" int snip_adamw(const TensorSlot* slots, const int64_t* block_start, int num_slots, int64_t num_blocks,
                          const Scalars* s, uint64_t seed, int param_bf16, int state_bf16, int sr) {
  return snip::optim::launch_adamw(slots, block_start, num_slots, num_blocks, *s, seed, param_bf16 != 0,
                                   state_bf16 != 0, sr != 0, nullptr);
}
