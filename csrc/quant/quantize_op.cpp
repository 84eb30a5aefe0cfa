// Torch-facing side of snip_C::quantize: argument checks, output shapes and allocation, the NVFP4
// tensor-amax pass, kernel choice (CUDA kernels, or on the CPU their host implementation,
// quantize_host.cpp), and the Meta (fake) implementation that lets torch.compile trace the op.
//
// Outputs (unrequested ones are empty [0] tensors of their dtype):
//   codes   [M, Kp]            x quantized with blocks along its rows (FP4: [M, ceil(Kp / 2)] packed)
//   scales  by scale_layout (snip_ops/scale_layout.py): "plain" [ceil(M / br), ceil(Kp / bc)];
//           "blackwell" [round_up(M, 128), round_up(ceil(Kp / bc), 4)]; "hopper" (FP32/POW2 scales of
//           128-long blocks) the plain grid transposed, [ceil(Kp / bc), round_up(ceil(M / br), 4)]
//   codes_t [K, Mp]            x^T quantized with blocks along its rows (the columns of x)
//   scales_t                   the same for x^T (2-D blocks: the same values as `scales`, transposed)
//   tensor_scale               0-d float32 (NVFP4), else [0]
// where Kp = round_up(K, pad), Mp = round_up(M, pad): each output is the reference quantization of
// its operand zero-padded along its inner (reduction) dimension, which is what TMA / the GEMM's K
// tiling want. Padding elements get code 0; blocks made only of padding get scale 1. SR bits
// depend on the element's index in the unpadded x only, so padding never shifts them.
//
// hadamard_signs >= 0 (a 16-bit sign mask; column output only, e2m1 in 1x16 blocks): codes_t is (T x)^T,
// T the 16-point random Hadamard transform on x's rows (quant/hadamard.cuh), x's rows zero-padded to
// M16 = round_up(M, 16) first: codes_t [K, round_up(M16, pad)]; SR indices and the NVFP4 tensor amax
// are those of T x [M16, K] (snip_ops.hadamard.random_hadamard, then the reference quantization).
#include <cmath>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#if SNIP_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "ops.h"
#include "quant/quantize.h"
#include "quant/quantize_host.h"
#include "quant/spec.h"

namespace snip {
namespace {

constexpr const char* kOp = "snip_C::quantize: ";
using quant::Spec;

c10::SymInt ceil_div(const c10::SymInt& a, int64_t b) { return (a + (b - 1)) / b; }
c10::SymInt round_up(const c10::SymInt& a, int64_t b) { return ceil_div(a, b) * b; }

// Shapes of one output: `outer` rows of `inner` elements (before padding), blocks of `bo` rows x
// `bi` elements along the inner dimension.
std::pair<std::vector<c10::SymInt>, std::vector<c10::SymInt>> output_shapes(
    const Spec& s, const c10::SymInt& outer, const c10::SymInt& inner, int64_t pad, quant::ScaleLayout layout) {
  const int64_t bi = s.block_cols, bo = s.block_rows;  // square 2-D blocks: bo == bi
  const c10::SymInt inner_store = round_up(inner, pad);
  const c10::SymInt width = s.elem == quant::Elem::kE2M1 ? ceil_div(inner_store, 2) : inner_store;
  const c10::SymInt nblk = ceil_div(inner_store, bi);
  if (layout == quant::ScaleLayout::kBlackwell) return {{outer, width}, {round_up(outer, 128), round_up(nblk, 4)}};
  if (layout == quant::ScaleLayout::kHopper) return {{outer, width}, {nblk, round_up(ceil_div(outer, bo), 4)}};
  return {{outer, width}, {ceil_div(outer, bo), nblk}};
}

struct Checked {
  Spec spec;
  quant::InputDType dtype;
  quant::ScaleLayout layout;
};

Checked check_args(const at::Tensor& x, c10::string_view spec, bool rowwise, bool colwise,
                   const std::optional<at::Tensor>& tensor_amax, c10::string_view scale_layout, int64_t pad,
                   int64_t hadamard_signs) {
  TORCH_CHECK(x.dim() == 2, kOp, "x must be 2-D [rows, cols], got ", x.dim(), "-D");
  const quant::InputDType dt = quant::input_dtype(x.scalar_type(), kOp);
  // sym_: reading a plain stride would specialize every symbolic size under torch.compile.
  TORCH_CHECK(x.sym_stride(1) == 1 || x.sym_size(1) <= 1, kOp,
              "x must have unit stride along its last dimension (any row stride is fine); call .contiguous()");
  const Spec s = quant::parse_spec(spec, kOp);
  TORCH_CHECK(rowwise || colwise, kOp, "request rowwise and/or colwise outputs");
  TORCH_CHECK(pad >= 1, kOp, "pad must be >= 1, got ", pad);
  quant::ScaleLayout layout = quant::ScaleLayout::kPlain;
  if (scale_layout == "blackwell") {
    layout = quant::ScaleLayout::kBlackwell;
    TORCH_CHECK((s.scale == quant::ScaleKind::kE8M0 || s.scale == quant::ScaleKind::kNVFP4) &&
                    (s.block_cols == 16 || s.block_cols == 32),
                kOp, "the blackwell scale layout needs 1-byte scales (e8m0, nvfp4) on 16- or 32-element blocks, "
                "got spec ", spec);
  } else if (scale_layout == "hopper") {
    layout = quant::ScaleLayout::kHopper;
    TORCH_CHECK((s.scale == quant::ScaleKind::kFP32 || s.scale == quant::ScaleKind::kPow2) && s.block_cols == 128,
                kOp, "the hopper scale layout needs fp32 or pow2 scales on 128-element blocks, got spec ", spec);
  } else {
    TORCH_CHECK(scale_layout == "plain", kOp, "scale_layout must be plain, blackwell or hopper, got ", scale_layout);
  }
  TORCH_CHECK(hadamard_signs >= -1 && hadamard_signs < (1 << quant::kHadamardSize), kOp,
              "hadamard_signs must be -1 (no transform) or a ", quant::kHadamardSize, "-bit sign mask, got ",
              hadamard_signs);
  if (hadamard_signs >= 0) {
    TORCH_CHECK(colwise && !rowwise, kOp, "the Hadamard transform applies to the column output only "
                "(rowwise=False, colwise=True)");
    TORCH_CHECK(s.block_rows == 1 && s.block_cols == quant::kHadamardSize, kOp,
                "the Hadamard transform needs 1x16 blocks (one transform group per block), got spec ", spec);
    TORCH_CHECK(s.elem == quant::Elem::kE2M1, kOp, "the Hadamard transform is fused for e2m1 elements only "
                "(snip_ops.quantize_hadamard_t transforms first for others), got spec ", spec);
  }
  if (tensor_amax.has_value()) {
    TORCH_CHECK(s.scale == quant::ScaleKind::kNVFP4, kOp, "tensor_amax is only used by nvfp4 scaling");
    TORCH_CHECK(tensor_amax->numel() == 1 && at::isFloatingType(tensor_amax->scalar_type()), kOp,
                "tensor_amax must be a one-element floating tensor, got ", tensor_amax->sizes(), " ",
                tensor_amax->scalar_type());
  }
  return {s, dt, layout};
}

using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// Allocates every output (`zero_padded_sf`: scales whose padded layout is not all covered by real
// blocks start as zeros, so their padding is finite).
Result allocate(const at::Tensor& x, const Spec& s, bool rowwise, bool colwise, quant::ScaleLayout layout,
                int64_t pad, bool zero_padded_sf, bool hadamard) {
  // Under the Hadamard transform the column output is that of T x, whose rows are x's padded to 16.
  const c10::SymInt K = x.sym_size(1);
  const c10::SymInt M = hadamard ? round_up(x.sym_size(0), quant::kHadamardSize) : x.sym_size(0);
  const auto codes_opt = x.options().dtype(quant::codes_dtype(s));
  const auto scales_opt = x.options().dtype(quant::scales_dtype(s));
  auto scales_alloc = [&](const std::vector<c10::SymInt>& shape) {
    if (zero_padded_sf) return at::zeros_symint(shape, scales_opt);
    return at::empty_symint(shape, scales_opt);
  };
  const std::vector<c10::SymInt> none{c10::SymInt(0)};
  at::Tensor codes = at::empty_symint(none, codes_opt), scales = at::empty_symint(none, scales_opt);
  at::Tensor codes_t = codes, scales_t = scales;
  if (rowwise) {
    const auto [c, sc] = output_shapes(s, M, K, pad, layout);
    codes = at::empty_symint(c, codes_opt);
    scales = scales_alloc(sc);
  }
  if (colwise) {
    const auto [c, sc] = output_shapes(s, K, M, pad, layout);
    codes_t = at::empty_symint(c, codes_opt);
    scales_t = scales_alloc(sc);
  }
  const bool nvfp4 = s.scale == quant::ScaleKind::kNVFP4;
  at::Tensor tensor_scale = at::empty_symint(nvfp4 ? std::vector<c10::SymInt>{} : none, x.options().dtype(at::kFloat));
  return {codes, scales, codes_t, scales_t, tensor_scale};
}

quant::Output output_of(const at::Tensor& codes, const at::Tensor& scales, const Spec& s, int64_t inner, int64_t pad,
                        quant::ScaleLayout layout, uint64_t offset) {
  quant::Output o;
  o.codes = codes.data_ptr();
  o.ld = codes.stride(0);  // 1-byte codes: elements are bytes
  o.inner_store = (inner + pad - 1) / pad * pad;
  o.scales = scales.data_ptr();
  o.nblk = (o.inner_store + s.block_cols - 1) / s.block_cols;
  o.layout = layout;
  o.mn_pitch = layout == quant::ScaleLayout::kHopper ? scales.size(1) : 0;
  o.offset = offset;
  return o;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize(
    const at::Tensor& x, c10::string_view spec, bool rowwise, bool colwise, int64_t seed, int64_t offset,
    int64_t offset_t, const std::optional<at::Tensor>& tensor_amax, c10::string_view scale_layout, int64_t pad,
    int64_t hadamard_signs) {
  const auto [s, dt, layout] = check_args(x, spec, rowwise, colwise, tensor_amax, scale_layout, pad, hadamard_signs);
  const bool cpu = x.is_cpu();
  TORCH_CHECK(cpu || x.is_cuda(), kOp, "x must be a CUDA or CPU tensor, got device ", x.device());
  const bool hadamard = hadamard_signs >= 0;
  const uint32_t signs = hadamard ? uint32_t(hadamard_signs) : 0u;
  // On the CPU the transform is applied up front (the host implementation of the same arithmetic) and
  // T x quantized as any input; the CUDA kernels transform inside the quantization pass.
  at::Tensor tx;
  if (hadamard && cpu) {
    tx = at::empty({(x.size(0) + quant::kHadamardSize - 1) / quant::kHadamardSize * quant::kHadamardSize, x.size(1)},
                   x.options().dtype(at::kFloat));
    quant::hadamard_rows_host(x.data_ptr(), dt, x.size(0), x.size(1), x.stride(0), signs, tx.data_ptr<float>());
  }
  const at::Tensor& src = tx.defined() ? tx : x;
  const quant::InputDType src_dt = tx.defined() ? quant::InputDType::kFloat32 : dt;
  const int64_t M = x.size(0), K = x.size(1);
  const int64_t M_out = hadamard ? (M + quant::kHadamardSize - 1) / quant::kHadamardSize * quant::kHadamardSize : M;
#if SNIP_WITH_CUDA
  std::optional<c10::cuda::CUDAGuard> guard;
  cudaStream_t stream = nullptr;
  if (!cpu) {
    guard.emplace(x.device());
    stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  }
#endif
  // Blackwell atoms cover 128 rows x 4 blocks, Hopper columns 4 block rows: zero-fill only when real
  // blocks leave some of that uncovered.
  auto padded_sf = [&](int64_t outer, int64_t inner) {
    const int64_t nblk = ((inner + pad - 1) / pad * pad + s.block_cols - 1) / s.block_cols;
    if (layout == quant::ScaleLayout::kHopper) return (outer + s.block_rows - 1) / s.block_rows % 4 != 0;
    return layout == quant::ScaleLayout::kBlackwell && (outer % 128 != 0 || nblk % 4 != 0);
  };
  const bool zero_sf = (rowwise && padded_sf(M, K)) || (colwise && padded_sf(K, M_out));
  auto [codes, scales, codes_t, scales_t, tensor_scale] =
      allocate(x, s, rowwise, colwise, layout, pad, zero_sf, hadamard);

  const bool nvfp4 = s.scale == quant::ScaleKind::kNVFP4;
  at::Tensor amax;
  if (nvfp4) {
    if (tensor_amax.has_value()) {
      amax = tensor_amax->to(x.device(), at::kFloat).reshape({}).contiguous();
    } else if (cpu) {
      amax = at::full({}, quant::quantize_tensor_amax_host(src.data_ptr(), src_dt, src.size(0), K, src.stride(0)),
                      x.options().dtype(at::kFloat));
    } else {
      amax = at::zeros({}, x.options().dtype(at::kFloat));
#if SNIP_WITH_CUDA
      C10_CUDA_CHECK(hadamard ? quant::launch_quantize_tensor_amax_hadamard(x.data_ptr(), dt, M, K, x.stride(0), signs,
                                                                            amax.data_ptr<float>(), stream)
                              : quant::launch_quantize_tensor_amax(x.data_ptr(), dt, M, K, x.stride(0),
                                                                   amax.data_ptr<float>(), stream));
#endif
    }
  }
  if (M == 0 || K == 0) {
    // No block to quantize; the tensor scale is still defined (reference._nvfp4_tensor_scale).
    if (nvfp4) {
      const at::Tensor t = amax / (448.0 * 6.0);
      const at::Tensor tiny = at::full({}, std::ldexp(1.0f, -149), t.options());
      const at::Tensor nan = at::full({}, std::numeric_limits<float>::quiet_NaN(), t.options());
      at::Tensor ts = at::where(t.eq(0).logical_and(amax.gt(0)), tiny, t);
      ts = at::where(amax.eq(0), at::ones_like(ts), at::where(at::isfinite(amax), ts, nan));
      tensor_scale.copy_(ts);
    }
    return {codes, scales, codes_t, scales_t, tensor_scale};
  }

  quant::Args a{};
  a.x = src.data_ptr();
  a.dtype = src_dt;
  a.rows = src.size(0);  // the CUDA kernels read x's M rows and transform M_out of them (zeros past M)
  a.cols = K;
  a.ld = src.stride(0);
  a.spec = s;
  a.seed = uint64_t(seed);
  a.hadamard = hadamard && !cpu;
  a.hadamard_signs = signs;
  if (rowwise) a.row = output_of(codes, scales, s, K, pad, layout, uint64_t(offset));
  if (colwise) a.col = output_of(codes_t, scales_t, s, M_out, pad, layout, uint64_t(offset_t));
  a.tensor_amax = nvfp4 ? amax.data_ptr<float>() : nullptr;
  a.tensor_scale = nvfp4 ? tensor_scale.data_ptr<float>() : nullptr;
  if (cpu) {
    quant::quantize_host(a);
    return {codes, scales, codes_t, scales_t, tensor_scale};
  }
#if SNIP_WITH_CUDA  // a build without CUDA registers no CUDA kernel: no CUDA tensor gets here
  const bool rows_kernel = !colwise && s.block_rows == 1;
  C10_CUDA_CHECK(rows_kernel ? quant::launch_quantize_rows(a, stream) : quant::launch_quantize_tile(a, stream));
#endif
  return {codes, scales, codes_t, scales_t, tensor_scale};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> quantize_meta(
    const at::Tensor& x, c10::string_view spec, bool rowwise, bool colwise, int64_t seed, int64_t offset,
    int64_t offset_t, const std::optional<at::Tensor>& tensor_amax, c10::string_view scale_layout, int64_t pad,
    int64_t hadamard_signs) {
  (void)seed, (void)offset, (void)offset_t;
  const auto [s, dt, layout] = check_args(x, spec, rowwise, colwise, tensor_amax, scale_layout, pad, hadamard_signs);
  (void)dt;
  return allocate(x, s, rowwise, colwise, layout, pad, false, hadamard_signs >= 0);
}

}  // namespace snip
