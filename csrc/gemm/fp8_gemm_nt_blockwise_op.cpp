// Torch side of snip_C::fp8_gemm_nt_blockwise / fp8_gemm_nt_blockwise_acc: one op for the Hopper
// (sm90/, wgmma) and Blackwell (sm100/, tcgen05) kernels, which take the same arguments and scale
// layout; the device's arch picks the kernel family, A's dtype (E4M3 or E5M2) and the output dtype
// the instantiation, and the tile heuristic (fp8_gemm_heuristic.h) the tile among those compiled.
// Argument checks with messages that say what to change, output/workspace allocation, stream, the
// CPU entry (same checks, then a pointer to the fallback) and the Meta (fake) functions for
// torch.compile. Compiled for whichever archs the build has (SNIP_HAS_SM90 / SNIP_HAS_SM100).
#if SNIP_HAS_SM90 || SNIP_HAS_SM100
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/repeat_interleave.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>

#include "gemm/fp8_gemm_heuristic.h"
#include "gemm/op_common.h"
#include "ops.h"

#if SNIP_HAS_SM90
namespace snip::gemm::sm90 {
extern const Fp8BlockwiseVariant kFp8Variant_b128_bf16_128x128;
extern const Fp8BlockwiseVariant kFp8Variant_b128_bf16_128x128_overlapped;
extern const Fp8BlockwiseVariant kFp8Variant_b128_bf16_128x128_c2x1_overlapped;
extern const Fp8BlockwiseVariant kFp8Variant_b128_bf16_128x192;
extern const Fp8BlockwiseVariant kFp8Variant_b1_bf16_128x192;
extern const Fp8BlockwiseVariant kFp8Variant_b1_f32_128x192;
extern const Fp8BlockwiseVariant kFp8Variant_b128_bf16_64x128;
extern const Fp8BlockwiseVariant kFp8Variant_b128_f32_128x128;
extern const Fp8BlockwiseVariant kFp8Variant_b1_bf16_128x128;
extern const Fp8BlockwiseVariant kFp8Variant_b1_f32_128x128;
extern const Fp8BlockwiseVariant kFp8Variant_b1_f32_128x128_overlapped;
extern const Fp8BlockwiseVariant kFp8Variant_e5m2_b128_bf16_128x128;
extern const Fp8BlockwiseVariant kFp8Variant_e5m2_b128_f32_128x128;
extern const Fp8BlockwiseVariant kFp8Variant_e5m2_b1_f32_128x128;
extern const Fp8BlockwiseVariant kFp8Variant_e5m2_b128_bf16_128x128_overlapped;
extern const Fp8BlockwiseVariant kFp8Variant_e5m2_b1_f32_128x128_overlapped;
}  // namespace snip::gemm::sm90
#endif
#if SNIP_HAS_SM100
namespace snip::gemm::sm100 {
extern const Fp8BlockwiseVariant kFp8Variant_sm100_b128_bf16_256x128_2sm;
extern const Fp8BlockwiseVariant kFp8Variant_sm100_b128_f32_256x128_2sm;
extern const Fp8BlockwiseVariant kFp8Variant_sm100_b1_f32_256x128_2sm;
extern const Fp8BlockwiseVariant kFp8Variant_sm100_e5m2_b128_bf16_256x128_2sm;
extern const Fp8BlockwiseVariant kFp8Variant_sm100_e5m2_b128_f32_256x128_2sm;
extern const Fp8BlockwiseVariant kFp8Variant_sm100_e5m2_b1_f32_256x128_2sm;
}  // namespace snip::gemm::sm100
#endif

namespace snip {
namespace {

using gemm::aligned16;
using gemm::Fp8BlockwiseArgs;
using gemm::Fp8BlockwiseVariant;
using gemm::Fp8Element;
using gemm::OutDType;

constexpr const char* kOp = "snip_C::fp8_gemm_nt_blockwise: ";
constexpr int64_t kScaleK = 128;

// Every compiled instantiation. Only what the GEMMs of a linear layer need is compiled: a
// combination without a BF16-output instantiation (E5M2 x 1x128, Blackwell 1x128) runs the FP32 one
// into a temporary and casts it -- the same single rounding of the FP32 result. The overlapped-
// promotion mainloop is compiled for the kinds a linear layer's GEMMs use (128x128 B blocks with
// BF16 out: fprop and dgrad; 1x128 with FP32 out: wgrad; E4M3 and E5M2 A), for E4M3 fprop/dgrad
// also with a 2x1 cluster (B multicast), and is chosen only by a config. The 128x192 tile
// (sm90/wide_tile_mainloop.cuh) is compiled for E4M3: fprop/dgrad with BF16 out (whose mainloop reads B's
// block scales repeated per row: `per_row_b_scales`) and wgrad with BF16 or FP32 out.
const Fp8BlockwiseVariant* const kVariants[] = {
#if SNIP_HAS_SM90
    &gemm::sm90::kFp8Variant_b128_bf16_128x128,      &gemm::sm90::kFp8Variant_b128_bf16_64x128,
    &gemm::sm90::kFp8Variant_b128_f32_128x128,       &gemm::sm90::kFp8Variant_b1_bf16_128x128,
    &gemm::sm90::kFp8Variant_b1_f32_128x128,         &gemm::sm90::kFp8Variant_e5m2_b128_bf16_128x128,
    &gemm::sm90::kFp8Variant_e5m2_b128_f32_128x128,  &gemm::sm90::kFp8Variant_e5m2_b1_f32_128x128,
    &gemm::sm90::kFp8Variant_b128_bf16_128x128_overlapped,
    &gemm::sm90::kFp8Variant_b128_bf16_128x128_c2x1_overlapped,
    &gemm::sm90::kFp8Variant_b1_f32_128x128_overlapped,
    &gemm::sm90::kFp8Variant_e5m2_b128_bf16_128x128_overlapped,
    &gemm::sm90::kFp8Variant_e5m2_b1_f32_128x128_overlapped,
    &gemm::sm90::kFp8Variant_b128_bf16_128x192,  &gemm::sm90::kFp8Variant_b1_bf16_128x192,
    &gemm::sm90::kFp8Variant_b1_f32_128x192,
#endif
#if SNIP_HAS_SM100
    &gemm::sm100::kFp8Variant_sm100_b128_bf16_256x128_2sm,
    &gemm::sm100::kFp8Variant_sm100_b128_f32_256x128_2sm,
    &gemm::sm100::kFp8Variant_sm100_b1_f32_256x128_2sm,
    &gemm::sm100::kFp8Variant_sm100_e5m2_b128_bf16_256x128_2sm,
    &gemm::sm100::kFp8Variant_sm100_e5m2_b128_f32_256x128_2sm,
    &gemm::sm100::kFp8Variant_sm100_e5m2_b1_f32_256x128_2sm,
#endif
};

std::string compiled_archs() {
  std::string s;
  for (const int arch : {90, 100}) {
    bool any = false;
    for (const auto* v : kVariants) any = any || v->arch == arch;
    if (any) s += (s.empty() ? "sm_" : " and sm_") + std::to_string(arch) + "a";
  }
  return s;
}

// What a call asks for: the kernel family (arch), A's element, B's blocks, the output dtype.
struct Kind {
  int arch;
  Fp8Element a;
  int64_t b_block;
  OutDType out;
};

std::vector<const Fp8BlockwiseVariant*> variants_for(const Kind& k) {
  std::vector<const Fp8BlockwiseVariant*> v;
  for (const auto* var : kVariants)
    if (var->arch == k.arch && var->a == k.a && var->b_block == k.b_block && var->out == k.out) v.push_back(var);
  return v;
}

// The instantiations that compute `k` and whether they write FP32 for a BF16 result (no BF16
// instantiation of that combination); empty when nothing is compiled for the arch.
std::vector<const Fp8BlockwiseVariant*> variants_computing(const Kind& k, bool* via_f32) {
  auto vs = variants_for(k);
  *via_f32 = false;
  if (vs.empty() && k.out == OutDType::kBF16) {
    vs = variants_for({k.arch, k.a, k.b_block, OutDType::kF32});
    *via_f32 = !vs.empty();
  }
  return vs;
}

std::string tile_list(const std::vector<const Fp8BlockwiseVariant*>& vs) {
  std::string s;
  for (const auto* v : vs)
    s += (s.empty() ? "" : ", ") + std::to_string(v->tile_m) + "x" + std::to_string(v->tile_n) +
         (v->cluster_m > 1 ? " (cluster=" + std::to_string(v->cluster_m) + "x" + std::to_string(v->cluster_n) + ")"
                           : std::string()) +
         (v->overlapped_promotion ? " (promotion=overlapped)" : "");
  return s;
}

OutDType out_kind(c10::ScalarType t) {
  TORCH_CHECK(t == at::kBFloat16 || t == at::kFloat, kOp, "out_dtype must be bfloat16 or float32, got ", t);
  return t == at::kBFloat16 ? OutDType::kBF16 : OutDType::kF32;
}

Fp8Element a_kind(c10::ScalarType t) {
  TORCH_CHECK(t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2, kOp,
              "a must be float8_e4m3fn or float8_e5m2 codes, got ", t,
              "; other formats run through snip_ops.gemm_kernels.qgemm's other paths");
  return t == at::kFloat8_e5m2 ? Fp8Element::kE5M2 : Fp8Element::kE4M3;
}

void check_b_dtype(c10::ScalarType t) {
  TORCH_CHECK(t == at::kFloat8_e4m3fn, kOp, "b must be float8_e4m3fn codes (B is E4M3; A may be E4M3 or E5M2), got ",
              t, "; other formats run through snip_ops.gemm_kernels.qgemm's other paths");
}

void check_b_block(int64_t b_block) {
  TORCH_CHECK(b_block == 1 || b_block == 128, kOp,
              "b_block must be 128 (B scales per 128x128 block) or 1 (B scales per 1x128 row block), got ",
              b_block);
}

int64_t out_align(OutDType o) { return o == OutDType::kBF16 ? 8 : 4; }  // elements per 16 bytes

struct Problem {
  int64_t m, n, k, kb;
  Fp8Element a;
  OutDType out;
};

void check_scales(const at::Tensor& s, const char* name, int64_t kb, int64_t min_rows, const char* rows_what) {
  TORCH_CHECK(s.scalar_type() == at::kFloat, kOp, name, " must be float32, got ", s.scalar_type());
  TORCH_CHECK(s.dim() == 2, kOp, name, " must be 2-D [ceil(K/128), rows] (MN-major scales), got ", s.dim(), "-D");
  TORCH_CHECK(s.size(0) == kb, kOp, name, ".size(0) must be ceil(K/128) = ", kb, ", got ", s.size(0),
              " (scales are MN-major: [K blocks, rows]; snip_ops.gemm_kernels converts QTensor scales)");
  TORCH_CHECK(s.size(1) >= min_rows, kOp, name, ".size(1) must be >= ", rows_what, " = ", min_rows, ", got ",
              s.size(1));
  TORCH_CHECK(s.size(1) % 4 == 0, kOp, name, ".size(1) must be a multiple of 4 (16-byte scale loads), got ",
              s.size(1), "; pad the scale rows");
  TORCH_CHECK(s.size(1) <= 1 || s.stride(1) == 1, kOp, name, " must have unit stride along its rows (dim 1)");
  TORCH_CHECK(s.size(0) <= 1 || (s.stride(0) >= s.size(1) && s.stride(0) % 4 == 0), kOp, name,
              ".stride(0) must be >= size(1) and a multiple of 4, got ", s.stride(0));
}

// Every check that does not need the data: shapes, dtypes, strides, alignments of sizes.
Problem check_args(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b, const at::Tensor& sfb,
                   int64_t b_block, c10::ScalarType out_dtype, const std::optional<at::Tensor>& bias) {
  gemm::check_nt_operands(kOp, a, b, 1);
  const Fp8Element ak = a_kind(a.scalar_type());
  check_b_dtype(b.scalar_type());
  check_b_block(b_block);
  const int64_t m = a.size(0), n = b.size(0), k = a.size(1);
  TORCH_CHECK(k % 16 == 0, kOp, "K must be a multiple of 16 (TMA needs 16-byte rows), got K = ", k,
              "; pad K with zero codes (snip_ops.gemm_kernels.qgemm does)");
  const int64_t kb = (k + kScaleK - 1) / kScaleK;
  check_scales(sfa, "sfa", kb, m, "M");
  check_scales(sfb, "sfb", kb, (n + b_block - 1) / b_block, b_block == 1 ? "N" : "ceil(N/128)");
  const OutDType out = out_kind(out_dtype);
  TORCH_CHECK(n % out_align(out) == 0, kOp, "N must be a multiple of ", out_align(out), " for ", out_dtype,
              " output (16-byte rows), got N = ", n, "; pad N (snip_ops.gemm_kernels.qgemm does)");
  if (bias) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == n, kOp, "bias must be 1-D [N = ", n, "], got shape ",
                bias->sizes());
    TORCH_CHECK(bias->scalar_type() == at::kFloat || bias->scalar_type() == at::kBFloat16 ||
                    bias->scalar_type() == at::kHalf,
                kOp, "bias must be float32, bfloat16 or float16, got ", bias->scalar_type());
  }
  return {m, n, k, kb, ak, out};
}

// The kernel family of the device the tensors are on (checked: one CUDA device, 16-byte aligned).
int device_arch(std::initializer_list<const at::Tensor*> ts) {
  const at::Tensor& a = **ts.begin();
  const gemm::DeviceInfo prop = gemm::check_cuda_tensors(kOp, ts);
  const int arch = prop.major == 9 && prop.minor == 0 ? 90 : prop.major == 10 && prop.minor == 0 ? 100 : 0;
  bool compiled = false;
  for (const auto* v : kVariants) compiled = compiled || (arch != 0 && v->arch == arch);
  TORCH_CHECK(compiled, kOp, "this kernel is compiled for ", compiled_archs(), " only; device ", a.device(), " is sm_",
              prop.major, prop.minor, "; snip_ops.gemm_kernels.qgemm picks the right path per device");
  return arch;
}

// Whether variant `v` reads B's 128x128-block scales repeated to one per row (its mainloop reads one per
// 64-column third of its 192-wide tiles: sm90/wide_tile_mainloop.cuh).
bool reads_per_row_b_scales(const Fp8BlockwiseVariant* v) {
#if SNIP_HAS_SM90
  return v == &gemm::sm90::kFp8Variant_b128_bf16_128x192;
#else
  (void)v;
  return false;
#endif
}

struct Choice {
  const Fp8BlockwiseVariant* variant;
  bool via_f32;  // the variant writes FP32 for a BF16 result
};

Choice pick_variant(const Kind& kind, int64_t m, int64_t n, int64_t k, const std::string& config, int sms,
                    Fp8BlockwiseArgs* args) {
  bool via_f32 = false;
  const auto vs = variants_computing(kind, &via_f32);
  TORCH_CHECK(!vs.empty(), kOp, "no kernel compiled for sm_", kind.arch, "a with this a dtype, b_block=",
              kind.b_block, " and output dtype (this build has kernels for ", compiled_archs(), ")");
  gemm::Fp8GemmOverride ov;
  std::string err;
  TORCH_CHECK(gemm::parse_fp8_gemm_config(config, &ov, &err), kOp, "config '", config, "': ", err);
  // The mainloop first (serial unless the config asks for the overlapped one), then the tile.
  const bool overlapped = ov.promotion == gemm::Promotion::kOverlapped;
  // Then the cluster: the one named, else per tile the one with the fewest CTAs along M (a Hopper 2x1
  // cluster, which multicasts B, is there to be chosen by config next to the tile's 1x2 one).
  auto fewest_along_m = [&](const Fp8BlockwiseVariant* v) {
    for (const auto* w : vs)
      if (w->overlapped_promotion == v->overlapped_promotion && w->tile_m == v->tile_m && w->tile_n == v->tile_n &&
          w->cluster_m < v->cluster_m)
        return false;
    return true;
  };
  std::vector<const Fp8BlockwiseVariant*> mainloop_vs;
  for (const auto* v : vs)
    if (v->overlapped_promotion == overlapped &&
        (ov.cluster_m ? v->cluster_m == ov.cluster_m && v->cluster_n == ov.cluster_n : fewest_along_m(v)))
      mainloop_vs.push_back(v);
  TORCH_CHECK(!mainloop_vs.empty(), kOp, "config '", config, "': ",
              ov.cluster_m ? "cluster=" + std::to_string(ov.cluster_m) + "x" + std::to_string(ov.cluster_n) +
                                 (overlapped ? " with promotion=overlapped" : "")
                           : std::string("promotion=overlapped"),
              " is not compiled for b_block=", kind.b_block, " and this a/output dtype on sm_", kind.arch,
              "a; compiled: ", tile_list(vs));
  // A full tile's throughput relative to 128x128 cooperative, wave quantization removed: the median over the
  // fprop and dgrad shapes of bench/results/nvidia-h200-gemm-configs.json (64x128 ping-pong; 128x192, whose
  // wgrad shapes' median is higher, is given the fprop/dgrad one everywhere).
  constexpr double kPingpong64Efficiency = 0.67;
  constexpr double kWide192Efficiency = 1.05;
  std::vector<gemm::TileCandidate> cands;
  for (const auto* v : mainloop_vs)
    cands.push_back({v->tile_m, v->tile_n, v->cluster_m, v->cluster_n,
                     v->tile_m == 64 ? kPingpong64Efficiency : v->tile_n == 192 ? kWide192Efficiency : 1.0});
  const auto choice = gemm::choose_fp8_gemm_config(int(m), int(n), int(k), cands, sms);
  const Fp8BlockwiseVariant* v = mainloop_vs[choice.candidate];
  if (ov.tile_m) {
    v = nullptr;
    for (const auto* c : mainloop_vs)
      if (c->tile_m == ov.tile_m && c->tile_n == ov.tile_n) v = c;
    TORCH_CHECK(v, kOp, "config '", config, "': tile ", ov.tile_m, "x", ov.tile_n,
                overlapped ? " with promotion=overlapped" : "", " is not compiled for b_block=", kind.b_block,
                " and this a/output dtype on sm_", kind.arch, "a; compiled: ", tile_list(vs));
  }
  if (args) {
    args->raster = ov.has_raster ? ov.raster : choice.raster;
    args->swizzle = ov.swizzle ? ov.swizzle : choice.swizzle;
  }
  return {v, via_f32};
}

// B's 128x128-block scales [ceil(K/128), >= ceil(N/128)] repeated to one per row of B,
// [ceil(K/128), ceil(N/128) * 128] contiguous: what a `reads_per_row_b_scales` variant reads. The same values,
// so the same bits; a ceil(K/128) x N FP32 copy (1/32 of B's bytes), made per call.
at::Tensor per_row_b_scales(Fp8BlockwiseArgs* args, const at::Tensor& sfb, int64_t n) {
  const int64_t blocks = (n + kScaleK - 1) / kScaleK;
  at::Tensor rows = sfb.narrow(1, 0, blocks).repeat_interleave(kScaleK, 1).contiguous();
  args->sfb = rows.data_ptr<float>();
  args->sfb_rows = int(rows.size(1));
  args->ld_sfb = rows.size(1);
  return rows;
}

Fp8BlockwiseArgs make_args(const Problem& p, const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                           const at::Tensor& sfb) {
  Fp8BlockwiseArgs args;
  args.m = int(p.m);
  args.n = int(p.n);
  args.k = int(p.k);
  args.a = a.data_ptr();
  args.lda = p.m > 1 ? a.stride(0) : p.k;
  args.b = b.data_ptr();
  args.ldb = p.n > 1 ? b.stride(0) : p.k;
  args.sfa = sfa.data_ptr<float>();
  args.sfa_rows = int(sfa.size(1));
  args.ld_sfa = p.kb > 1 ? sfa.stride(0) : sfa.size(1);
  args.sfb = sfb.data_ptr<float>();
  args.sfb_rows = int(sfb.size(1));
  args.ld_sfb = p.kb > 1 ? sfb.stride(0) : sfb.size(1);
  args.device = a.device().index();
  args.sm_count = gemm::device_info(args.device).sms;
  return args;
}

void check_out(const at::Tensor& out, const Problem& p) {
  TORCH_CHECK(out.dim() == 2 && out.size(0) == p.m && out.size(1) == p.n, kOp, "out must be [M, N] = [", p.m, ", ",
              p.n, "], got ", out.sizes());
  TORCH_CHECK(out.size(1) <= 1 || out.stride(1) == 1, kOp, "out must be row-major (unit stride along N)");
  TORCH_CHECK(out.size(0) <= 1 || out.stride(0) % out_align(p.out) == 0, kOp, "out's row stride must be a multiple of ",
              out_align(p.out), " elements (16 bytes), got ", out.stride(0));
}

void check_meta(const at::Tensor& a, const at::Tensor& b, int64_t b_block) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2, kOp, "a and b must be 2-D");
  a_kind(a.scalar_type());
  check_b_dtype(b.scalar_type());
  check_b_block(b_block);
}

}  // namespace

at::Tensor fp8_gemm_nt_blockwise(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                                 const at::Tensor& sfb, int64_t b_block, c10::ScalarType out_dtype,
                                 const std::optional<at::Tensor>& bias, c10::string_view config) {
  const Problem p = check_args(a, sfa, b, sfb, b_block, out_dtype, bias);
  const int arch = device_arch({&a, &sfa, &b, &sfb});
  if (bias)
    TORCH_CHECK(bias->device() == a.device(), kOp, "bias must be on ", a.device(), ", got ", bias->device());
  const c10::cuda::CUDAGuard guard(a.device());
  if (p.m == 0 || p.n == 0) return at::empty({p.m, p.n}, a.options().dtype(out_dtype));
  std::optional<at::Tensor> bias32;
  if (bias) {
    bias32 = bias->to(at::kFloat).contiguous();
    if (!aligned16(*bias32)) bias32 = bias32->clone();  // a view at an odd offset
  }
  if (p.k == 0) {  // empty reduction: the bias alone
    at::Tensor out = at::zeros({p.m, p.n}, a.options().dtype(at::kFloat));
    if (bias32) out.add_(*bias32);
    return out.to(out_dtype);
  }
  Fp8BlockwiseArgs args = make_args(p, a, sfa, b, sfb);
  const Choice c = pick_variant({arch, p.a, b_block, p.out}, p.m, p.n, p.k, std::string(config), args.sm_count, &args);
  at::Tensor out = at::empty({p.m, p.n}, a.options().dtype(c.via_f32 ? at::kFloat : out_dtype));
  at::Tensor sfb_rows;  // kept until the launch is queued
  if (reads_per_row_b_scales(c.variant)) sfb_rows = per_row_b_scales(&args, sfb, p.n);
  args.bias = bias32 ? bias32->data_ptr<float>() : nullptr;
  args.d = out.data_ptr();
  args.ldd = p.n;
  args.accumulate = false;
  gemm::launch(kOp, *c.variant, args, a);
  return c.via_f32 ? out.to(out_dtype) : out;
}

void fp8_gemm_nt_blockwise_acc(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                               const at::Tensor& sfb, int64_t b_block, const at::Tensor& out,
                               c10::string_view config) {
  const Problem p = check_args(a, sfa, b, sfb, b_block, out.scalar_type(), std::nullopt);
  check_out(out, p);
  const int arch = device_arch({&a, &sfa, &b, &sfb, &out});
  const c10::cuda::CUDAGuard guard(a.device());
  if (p.m == 0 || p.n == 0 || p.k == 0) return;
  Fp8BlockwiseArgs args = make_args(p, a, sfa, b, sfb);
  const Choice c = pick_variant({arch, p.a, b_block, p.out}, p.m, p.n, p.k, std::string(config), args.sm_count, &args);
  // Without a BF16 instantiation: out + A.B^T in FP32 (as the BF16 epilogue computes it), rounded once.
  at::Tensor sfb_rows;  // kept until the launch is queued
  if (reads_per_row_b_scales(c.variant)) sfb_rows = per_row_b_scales(&args, sfb, p.n);
  const at::Tensor target = c.via_f32 ? out.to(at::kFloat).contiguous() : out;
  args.d = target.data_ptr();
  args.ldd = p.m > 1 ? target.stride(0) : p.n;
  args.accumulate = true;
  gemm::launch(kOp, *c.variant, args, a);
  if (c.via_f32) out.copy_(target);
}

at::Tensor fp8_gemm_nt_blockwise_meta(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                                      const at::Tensor& sfb, int64_t b_block, c10::ScalarType out_dtype,
                                      const std::optional<at::Tensor>& bias, c10::string_view config) {
  (void)sfa, (void)sfb, (void)bias, (void)config;
  check_meta(a, b, b_block);
  out_kind(out_dtype);
  return at::empty_symint({a.sym_size(0), b.sym_size(0)}, a.options().dtype(out_dtype));
}

void fp8_gemm_nt_blockwise_acc_meta(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                                    const at::Tensor& sfb, int64_t b_block, const at::Tensor& out,
                                    c10::string_view config) {
  (void)sfa, (void)sfb, (void)config;
  TORCH_CHECK(out.dim() == 2, kOp, "out must be 2-D");
  check_meta(a, b, b_block);
  out_kind(out.scalar_type());
}

std::string fp8_gemm_nt_blockwise_config(int64_t m, int64_t n, int64_t k, int64_t b_block,
                                         c10::ScalarType out_dtype, int64_t num_sms, c10::string_view config,
                                         int64_t arch, c10::ScalarType a_dtype) {
  check_b_block(b_block);
  TORCH_CHECK(arch == 90 || arch == 100, kOp, "arch must be 90 (sm_90a) or 100 (sm_100a), got ", arch);
  TORCH_CHECK(m >= 0 && n >= 0 && k >= 0 && m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX, kOp,
              "M, N, K must be in [0, 2^31)");
  Fp8BlockwiseArgs args;
  const Choice c = pick_variant({int(arch), a_kind(a_dtype), b_block, out_kind(out_dtype)}, m, n, k,
                                std::string(config), int(num_sms), &args);
  const Fp8BlockwiseVariant* v = c.variant;
  const char* raster = args.raster == gemm::Raster::kAlongM ? "m" : args.raster == gemm::Raster::kAlongN ? "n" : "auto";
  return std::string(v->name) + " tile=" + std::to_string(v->tile_m) + "x" + std::to_string(v->tile_n) +
         " schedule=" + v->schedule + " raster=" + raster + " swizzle=" + std::to_string(args.swizzle) +
         (v->cluster_m > 1 ? " cluster=" + std::to_string(v->cluster_m) + "x" + std::to_string(v->cluster_n)
                           : std::string()) +
         (v->overlapped_promotion ? " promotion=overlapped" : "") +
         (c.via_f32 ? " (FP32 output, cast)" : "");
}

}  // namespace snip
#endif  // SNIP_HAS_SM90 || SNIP_HAS_SM100
