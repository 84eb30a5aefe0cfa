// Torch side of snip_C::{nvfp4,mxfp4,mxfp8}_gemm_nt (Blackwell sm_100a; BF16 or FP32 output, an
// instantiation each): argument checks, output and workspace allocation, stream, the CPU entry
// (same checks, then a pointer to the fallback) and the Meta (fake) functions. Never run on a GPU
// (none with sm_100 was available); the checks and shapes are tested on the CPU
// (tests/ops/test_gemm_dispatch.py).
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>

#include "gemm/op_common.h"
#include "gemm/sm100/blockscaled_gemm_heuristic.h"
#include "ops.h"

namespace snip::gemm::sm100 {
extern const BlockScaledVariant kVariant_nvfp4;
extern const BlockScaledVariant kVariant_mxfp4;
extern const BlockScaledVariant kVariant_mxfp8;
extern const BlockScaledVariant kVariant_nvfp4_f32;
extern const BlockScaledVariant kVariant_mxfp4_f32;
extern const BlockScaledVariant kVariant_mxfp8_f32;
}  // namespace snip::gemm::sm100

namespace snip {
namespace {

using gemm::device_info;
using gemm::BlockScaledArgs;
using gemm::BlockScaledKind;
using gemm::BlockScaledVariant;
using gemm::OutDType;

struct KindInfo {
  const char* op;        // "snip_C::nvfp4_gemm_nt: "
  bool fp4;              // codes packed two per byte
  int sf_vec;            // elements per scale
  c10::ScalarType sf;    // scale dtype (uint8 also accepted: same bytes)
  const char* sf_name;
  const BlockScaledVariant* bf16;  // the instantiation writing BF16
  const BlockScaledVariant* f32;   // and FP32
};

KindInfo info(BlockScaledKind kind) {
  switch (kind) {
    case BlockScaledKind::kNVFP4:
      return {"snip_C::nvfp4_gemm_nt: ", true, 16, at::kFloat8_e4m3fn, "float8_e4m3fn", &gemm::sm100::kVariant_nvfp4,
              &gemm::sm100::kVariant_nvfp4_f32};
    case BlockScaledKind::kMXFP4:
      return {"snip_C::mxfp4_gemm_nt: ", true, 32, at::kFloat8_e8m0fnu, "float8_e8m0fnu", &gemm::sm100::kVariant_mxfp4,
              &gemm::sm100::kVariant_mxfp4_f32};
    default:
      return {"snip_C::mxfp8_gemm_nt: ", false, 32, at::kFloat8_e8m0fnu, "float8_e8m0fnu", &gemm::sm100::kVariant_mxfp8,
              &gemm::sm100::kVariant_mxfp8_f32};
  }
}

OutDType out_kind(const KindInfo& ki, c10::ScalarType t) {
  TORCH_CHECK(t == at::kBFloat16 || t == at::kFloat, ki.op, "out_dtype must be bfloat16 or float32, got ", t);
  return t == at::kBFloat16 ? OutDType::kBF16 : OutDType::kF32;
}

int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

// Bytes of one operand's scale factors in CUTLASS's Sm1xxBlockScaledConfig layout: 128-row x
// 4-scale atoms of 512 bytes, ceil(rows/128) x ceil(ceil(K/vec)/4) of them.
int64_t sf_bytes(int64_t rows, int64_t k, int64_t vec) { return round_up(rows, 128) * round_up((k + vec - 1) / vec, 4); }

struct Problem {
  int64_t m, n, k;
};

Problem check_args(BlockScaledKind kind, const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                   const at::Tensor& sfb, const std::optional<at::Tensor>& alpha, c10::ScalarType out_dtype) {
  const KindInfo ki = info(kind);
  const char* kOp = ki.op;
  const int64_t n_align = out_kind(ki, out_dtype) == OutDType::kBF16 ? 8 : 4;  // 16-byte output rows
  gemm::check_nt_operands(kOp, a, b, ki.fp4 ? 2 : 1);
  for (const auto* t : {&a, &b}) {
    if (ki.fp4) {
      TORCH_CHECK(t->scalar_type() == at::kByte || t->scalar_type() == at::kFloat4_e2m1fn_x2, kOp,
                  "a and b must be packed E2M1 codes (uint8 or float4_e2m1fn_x2, two per byte, low nibble first), "
                  "got ", t->scalar_type());
    } else {
      TORCH_CHECK(t->scalar_type() == at::kFloat8_e4m3fn, kOp, "a and b must be float8_e4m3fn codes, got ",
                  t->scalar_type());
    }
  }
  const int64_t m = a.size(0), n = b.size(0), k = ki.fp4 ? 2 * a.size(1) : a.size(1);
  const int64_t k_align = ki.fp4 ? 32 : 16;
  TORCH_CHECK(k % k_align == 0, kOp, "K must be a multiple of ", k_align, " elements (16-byte TMA rows), got K = ", k,
              "; pad K with zero codes (snip_ops.gemm_kernels.qgemm does)");
  TORCH_CHECK(n % n_align == 0, kOp, "N must be a multiple of ", n_align, " for ", out_dtype,
              " output (16-byte rows), got N = ", n, "; pad N (snip_ops.gemm_kernels.qgemm does)");
  for (const auto& [s, rows, name] : {std::tuple{&sfa, m, "sfa"}, std::tuple{&sfb, n, "sfb"}}) {
    TORCH_CHECK(s->scalar_type() == ki.sf || s->scalar_type() == at::kByte, kOp, name, " must be ", ki.sf_name,
                " (or its bytes as uint8), got ", s->scalar_type());
    TORCH_CHECK(s->is_contiguous(), kOp, name, " must be contiguous");
    const int64_t want = sf_bytes(rows, k, ki.sf_vec);
    TORCH_CHECK(s->numel() == want, kOp, name, " must hold ", want,
                " scale factors in CUTLASS's blocked layout (round_up(rows, 128) * round_up(ceil(K / ", ki.sf_vec,
                "), 4)), got ", s->numel(), "; convert with snip_ops.gemm_kernels.to_blocked_scales");
  }
  if (kind == BlockScaledKind::kNVFP4) {
    TORCH_CHECK(alpha.has_value(), kOp, "alpha (product of the two per-tensor scales) is required");
    TORCH_CHECK(alpha->scalar_type() == at::kFloat && alpha->numel() == 1, kOp,
                "alpha must be a one-element float32 tensor, got ", alpha->scalar_type(), " with ", alpha->numel(),
                " elements");
  }
  return {m, n, k};
}

at::Tensor run(BlockScaledKind kind, const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
               const at::Tensor& sfb, const std::optional<at::Tensor>& alpha, c10::ScalarType out_dtype) {
  const KindInfo ki = info(kind);
  const Problem p = check_args(kind, a, sfa, b, sfb, alpha, out_dtype);
  const at::Tensor& alpha_or_a = alpha ? *alpha : a;  // (a checked twice when there is no alpha)
  gemm::check_device(ki.op, {&a, &sfa, &b, &sfb, &alpha_or_a}, 10, "sm_100a (Blackwell B200/GB200)");
  const c10::cuda::CUDAGuard guard(a.device());
  if (p.m == 0 || p.n == 0 || p.k == 0) return at::zeros({p.m, p.n}, a.options().dtype(out_dtype));
  at::Tensor out = at::empty({p.m, p.n}, a.options().dtype(out_dtype));
  BlockScaledArgs args;
  args.m = int(p.m);
  args.n = int(p.n);
  args.k = int(p.k);
  args.a = a.data_ptr();
  args.lda = p.m > 1 ? (ki.fp4 ? 2 : 1) * a.stride(0) : p.k;  // elements
  args.b = b.data_ptr();
  args.ldb = p.n > 1 ? (ki.fp4 ? 2 : 1) * b.stride(0) : p.k;
  args.sfa = sfa.data_ptr();
  args.sfb = sfb.data_ptr();
  args.alpha = alpha ? alpha->data_ptr<float>() : nullptr;
  args.d = out.data_ptr();
  args.ldd = p.n;
  args.device = a.device().index();
  args.sm_count = device_info(args.device).sms;
  const BlockScaledVariant* compiled = out_kind(ki, out_dtype) == OutDType::kBF16 ? ki.bf16 : ki.f32;
  const BlockScaledVariant* v = gemm::sm100::choose_blockscaled_variant({compiled}, args.m, args.n, args.k);
  gemm::launch(ki.op, *v, args, a);
  return out;
}

at::Tensor meta(BlockScaledKind kind, const at::Tensor& a, const at::Tensor& b, c10::ScalarType out_dtype) {
  const KindInfo ki = info(kind);
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2, ki.op, "a and b must be 2-D");
  out_kind(ki, out_dtype);
  return at::empty_symint({a.sym_size(0), b.sym_size(0)}, a.options().dtype(out_dtype));
}

}  // namespace

at::Tensor nvfp4_gemm_nt(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b, const at::Tensor& sfb,
                         const at::Tensor& alpha, c10::ScalarType out_dtype) {
  return run(BlockScaledKind::kNVFP4, a, sfa, b, sfb, alpha, out_dtype);
}
at::Tensor mxfp4_gemm_nt(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b, const at::Tensor& sfb,
                         c10::ScalarType out_dtype) {
  return run(BlockScaledKind::kMXFP4, a, sfa, b, sfb, std::nullopt, out_dtype);
}
at::Tensor mxfp8_gemm_nt(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b, const at::Tensor& sfb,
                         c10::ScalarType out_dtype) {
  return run(BlockScaledKind::kMXFP8, a, sfa, b, sfb, std::nullopt, out_dtype);
}
at::Tensor nvfp4_gemm_nt_meta(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b, const at::Tensor& sfb,
                              const at::Tensor& alpha, c10::ScalarType out_dtype) {
  (void)sfa, (void)sfb, (void)alpha;
  return meta(BlockScaledKind::kNVFP4, a, b, out_dtype);
}
at::Tensor mxfp4_gemm_nt_meta(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                              const at::Tensor& sfb, c10::ScalarType out_dtype) {
  (void)sfa, (void)sfb;
  return meta(BlockScaledKind::kMXFP4, a, b, out_dtype);
}
at::Tensor mxfp8_gemm_nt_meta(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                              const at::Tensor& sfb, c10::ScalarType out_dtype) {
  (void)sfa, (void)sfb;
  return meta(BlockScaledKind::kMXFP8, a, b, out_dtype);
}

}  // namespace snip
