// What tests/native/cutlass_host_reference_<arch>.cu share: CUTLASS's host reference GEMM
// (cutlass/util/reference/host/gett.hpp, the check CUTLASS examples 67 and 72 run on their device
// kernels) fed with the very Arguments one of snip's GEMM kernels would be launched with, and that
// kernel's can_implement, behind a C API that tests/cutlass_host.py loads with ctypes.
//
// The operands reach the reference only through the kernel's own types: A and B through its
// StrideA/StrideB, the scale factors through its LayoutSFA/LayoutSFB (built by the kernel's
// `arguments()`, the function its launcher calls), D through its StrideD and ElementD, alpha through
// its epilogue arguments. So the reference reads each buffer exactly as the kernel is told to read
// it. Nothing here launches or instantiates a kernel: this is host code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cute/tensor.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/numeric_types.h"
#include "cutlass/util/reference/host/gett.hpp"

#include "gemm/gemm_args.h"

// A torch tensor as an op file sees it: data pointer, sizes and strides (in the tensor's elements;
// packed FP4 codes are bytes, two elements each).
struct SnipRefTensor {
  const void* data;
  int64_t size0, size1, stride0, stride1;
};

// The four tensors an op receives, in its argument order.
struct SnipRefOperands {
  SnipRefTensor a, sfa, b, sfb;
};

namespace snip_ref {

template <class T>
const char* element_name() {
  if constexpr (std::is_same_v<T, cutlass::float_e4m3_t>) return "e4m3";
  else if constexpr (std::is_same_v<T, cutlass::float_e5m2_t>) return "e5m2";
  else if constexpr (std::is_same_v<T, cutlass::float_e2m1_t>) return "e2m1";
  else if constexpr (std::is_same_v<T, cutlass::float_ue4m3_t>) return "ue4m3";
  else if constexpr (std::is_same_v<T, cutlass::float_ue8m0_t>) return "ue8m0";
  else if constexpr (std::is_same_v<T, cutlass::bfloat16_t>) return "bf16";
  else if constexpr (std::is_same_v<T, float>) return "f32";
  else static_assert(sizeof(T) == 0, "element type without a name here");
}

// Per kernel variant: which kernel (name and type as its instantiation file spells them), what it
// reads and writes (`describe`, "key=value" pairs), and the two entry points.
struct Variant {
  const char* name;
  const char* type;
  std::string (*describe)();
  int (*can_implement)(int m, int n, int k, const SnipRefOperands& ops);
  int (*gemm)(int m, int n, int k, const SnipRefOperands& ops, const float* alpha, float* out);
};

// GemmUniversalAdapter<GemmKernel>::can_implement of the Arguments that `make_args` (the op file's
// argument building) and the kernel's `arguments()` give; cutlass::Status as an int (0: success).
template <class Gemm, auto make_args>
int can_implement(int m, int n, int k, const SnipRefOperands& ops) {
  const auto args = Gemm::arguments(make_args(m, n, k, ops, nullptr, nullptr));
  return int(cutlass::gemm::device::GemmUniversalAdapter<typename Gemm::GemmKernel>::can_implement(args));
}

// D = alpha * A.B^T with its block scales, by CUTLASS's host reference over the kernel's Arguments
// (accumulation in the kernel's ElementAccumulator, D rounded to its ElementD), written to `out` as
// row-major FP32 [m, n]. Returns can_implement's status and computes only when it is 0.
template <class Gemm, auto make_args>
int gemm(int m, int n, int k, const SnipRefOperands& ops, const float* alpha, float* out) {
  using namespace cute;
  using ElementD = typename Gemm::ElementD;
  std::vector<ElementD> d(size_t(m) * size_t(n));
  const auto args = Gemm::arguments(make_args(m, n, k, ops, alpha, d.data()));
  const int status = int(cutlass::gemm::device::GemmUniversalAdapter<typename Gemm::GemmKernel>::can_implement(args));
  if (status != 0) return status;

  const auto& ml = args.mainloop;
  using ElementA = std::remove_cv_t<std::remove_pointer_t<decltype(ml.ptr_A)>>;
  using ElementB = std::remove_cv_t<std::remove_pointer_t<decltype(ml.ptr_B)>>;
  auto A = make_tensor(recast_ptr<ElementA const>(ml.ptr_A), make_layout(make_shape(m, k, 1), ml.dA));
  auto B = make_tensor(recast_ptr<ElementB const>(ml.ptr_B), make_layout(make_shape(n, k, 1), ml.dB));
  auto SFA = make_tensor(ml.ptr_SFA, ml.layout_SFA);
  auto SFB = make_tensor(ml.ptr_SFB, ml.layout_SFB);
  cutlass::reference::host::GettBlockScalingMainloopParams<typename Gemm::ElementAccumulator, decltype(A),
                                                           decltype(SFA), decltype(B), decltype(SFB)>
      mainloop{A, SFA, B, SFB};

  // ptr_D is `ElementD const*` in some epilogues' Arguments; it is d's storage.
  auto D = make_tensor(const_cast<ElementD*>(args.epilogue.ptr_D), make_layout(make_shape(m, n, 1), args.epilogue.dD));
  using Compute = typename Gemm::ElementCompute;
  // No source tensor C: snip's GEMMs here are built with beta = 0 (D = alpha * acc).
  cutlass::reference::host::GettEpilogueParams<Compute, Compute, typename Gemm::ElementAccumulator, Compute,
                                               decltype(D), decltype(D)>
      epilogue;
  epilogue.D = D;
  const auto& fusion = args.epilogue.thread;
  epilogue.alpha = fusion.alpha_ptr ? *fusion.alpha_ptr : fusion.alpha;
  epilogue.beta = Compute(0);
  cutlass::reference::host::Gemm3x(mainloop, epilogue);

  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) out[size_t(i) * n + j] = float(D(i, j, 0));
  return 0;
}

// ---- snip_C::fp8_gemm_nt_blockwise (FP32 scales; sm90/ and sm100/ instantiations, one op) ----

// fp8_gemm_nt_blockwise_op.cpp's make_args (and the output fields fp8_gemm_nt_blockwise sets)
// without torch, which host-only code cannot include: the same fields from the same tensor sizes and
// strides. The op has no alpha (the kernels' arguments() set 1).
inline snip::gemm::Fp8BlockwiseArgs fp8_blockwise_args(int m, int n, int k, const SnipRefOperands& t,
                                                      const float* alpha, void* d) {
  (void)alpha;
  const int64_t kb = (k + 127) / 128;
  snip::gemm::Fp8BlockwiseArgs args;
  args.m = m;
  args.n = n;
  args.k = k;
  args.a = t.a.data;
  args.lda = m > 1 ? t.a.stride0 : k;
  args.b = t.b.data;
  args.ldb = n > 1 ? t.b.stride0 : k;
  args.sfa = static_cast<const float*>(t.sfa.data);
  args.sfa_rows = int(t.sfa.size1);
  args.ld_sfa = kb > 1 ? t.sfa.stride0 : t.sfa.size1;
  args.sfb = static_cast<const float*>(t.sfb.data);
  args.sfb_rows = int(t.sfb.size1);
  args.ld_sfb = kb > 1 ? t.sfb.stride0 : t.sfb.size1;
  args.d = d;
  args.ldd = n;
  args.accumulate = false;
  return args;
}

// fp8_blockwise_args for a kernel that reads B's 128x128-block scales repeated to one per row of B
// (the op's per_row_b_scales): the same expansion of the sfb the op receives, kept until the next call.
inline snip::gemm::Fp8BlockwiseArgs fp8_blockwise_args_per_row_b(int m, int n, int k, const SnipRefOperands& t,
                                                                  const float* alpha, void* d) {
  thread_local std::vector<float> rows;
  snip::gemm::Fp8BlockwiseArgs args = fp8_blockwise_args(m, n, k, t, alpha, d);
  const int64_t kb = (k + 127) / 128, blocks = (n + 127) / 128;
  rows.assign(size_t(kb * blocks * 128), 0.0f);
  for (int64_t i = 0; i < kb; ++i)
    for (int64_t j = 0; j < blocks * 128; ++j) rows[size_t(i * blocks * 128 + j)] = args.sfb[i * args.ld_sfb + j / 128];
  args.sfb = rows.data();
  args.sfb_rows = int(blocks * 128);
  args.ld_sfb = blocks * 128;
  return args;
}

// A scale block read off a blockwise LayoutSFA/LayoutSFB: ((rows per scale, _), (K per scale, _), _).
template <class Layout>
std::string scale_block() {
  return std::to_string(int(cute::size<0, 0>(Layout{}))) + "x" + std::to_string(int(cute::size<1, 0>(Layout{})));
}

template <class Gemm>
std::string describe_fp8_blockwise() {
  return std::string("a=") + element_name<typename Gemm::ElementA>() + " b=" + element_name<typename Gemm::ElementB>() +
         " sf=f32 sfa_block=" + scale_block<typename Gemm::LayoutSFA>() +
         " sfb_block=" + scale_block<typename Gemm::LayoutSFB>() + " d=" + element_name<typename Gemm::ElementD>();
}

// What such a kernel computes is the op's: B in 128x128 scale blocks, whatever layout it reads them in.
template <class Gemm>
std::string describe_fp8_blockwise_per_row_b() {
  std::string text = describe_fp8_blockwise<Gemm>();
  const std::string per_row = "sfb_block=1x128";
  text.replace(text.find(per_row), per_row.size(), "sfb_block=128x128 sfb_read=per_row");
  return text;
}

}  // namespace snip_ref

// A table line for an fp8_gemm_nt_blockwise instantiation: its variant name and its type, spelled as
// in its instantiation file (tests/ops/test_cutlass_host_reference.py compares the two).
#define SNIP_REF_FP8_BLOCKWISE(name, ...)                                                                   \
  snip_ref::Variant {                                                                                       \
    name, #__VA_ARGS__, &snip_ref::describe_fp8_blockwise<__VA_ARGS__>,                                     \
        &snip_ref::can_implement<__VA_ARGS__, &snip_ref::fp8_blockwise_args>,                               \
        &snip_ref::gemm<__VA_ARGS__, &snip_ref::fp8_blockwise_args>                                         \
  }

// The same for an instantiation that reads B's block scales repeated per row (fp8_blockwise_args_per_row_b).
#define SNIP_REF_FP8_BLOCKWISE_PER_ROW_B(name, ...)                                                         \
  snip_ref::Variant {                                                                                       \
    name, #__VA_ARGS__, &snip_ref::describe_fp8_blockwise_per_row_b<__VA_ARGS__>,                           \
        &snip_ref::can_implement<__VA_ARGS__, &snip_ref::fp8_blockwise_args_per_row_b>,                     \
        &snip_ref::gemm<__VA_ARGS__, &snip_ref::fp8_blockwise_args_per_row_b>                               \
  }

// Defined by each arch's file: its kernel variants.
extern const snip_ref::Variant kSnipRefVariants[];
extern const int kSnipRefVariantCount;

namespace snip_ref {
inline const Variant* find(const char* name) {
  for (int i = 0; i < kSnipRefVariantCount; ++i)
    if (std::string(kSnipRefVariants[i].name) == name) return &kSnipRefVariants[i];
  return nullptr;
}
}  // namespace snip_ref

// ---- C API (tests/cutlass_host.py) ---------------------------------------------------------------

extern "C" int snip_ref_variant_count() { return kSnipRefVariantCount; }
extern "C" const char* snip_ref_variant_name(int i) { return kSnipRefVariants[i].name; }
extern "C" const char* snip_ref_variant_type(int i) { return kSnipRefVariants[i].type; }

// "key=value key=value ...": element names of A, B, the scale factors and D, and the scale blocks.
extern "C" const char* snip_ref_variant_describe(int i) {
  static std::vector<std::string> texts = [] {
    std::vector<std::string> t;
    for (int v = 0; v < kSnipRefVariantCount; ++v) t.push_back(kSnipRefVariants[v].describe());
    return t;
  }();
  return texts[i].c_str();
}

// -1: no such variant; otherwise cutlass::Status of GemmUniversalAdapter::can_implement (0: success).
extern "C" int snip_ref_can_implement(const char* variant, int m, int n, int k, const SnipRefOperands* ops) {
  const snip_ref::Variant* v = snip_ref::find(variant);
  return v ? v->can_implement(m, n, k, *ops) : -1;
}

// out: row-major FP32 [m, n]. alpha: one FP32 read by the epilogue as the kernel reads its alpha
// pointer, or null. Returns as snip_ref_can_implement; `out` is written only on 0.
extern "C" int snip_ref_gemm(const char* variant, int m, int n, int k, const SnipRefOperands* ops, const float* alpha,
                             float* out) {
  const snip_ref::Variant* v = snip_ref::find(variant);
  return v ? v->gemm(m, n, k, *ops, alpha, out) : -1;
}
