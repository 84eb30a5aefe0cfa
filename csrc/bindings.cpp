// The only binding file: op schemas, their kernels per dispatch key, build_info, and the Python
// module init. Ops are called as torch.ops.snip_C.<name>; importing snip_ops._C registers them.
#include <Python.h>

#include <string>

#include <torch/library.h>

#include "ops.h"

namespace {

// Kernels compiled into this build and the archs each one runs on ("*": every compiled arch; a build
// without CUDA has none), and whether the op also has a CPU implementation (listed as target "cpu").
// Add a line per op; guard arch-specific ones with SNIP_HAS_SM90 / SNIP_HAS_SM100.
struct KernelEntry {
  const char* name;
  const char* archs;
  bool cpu = false;
};
constexpr KernelEntry kKernels[] = {
    {"quantize", "*", true},  // also the tensor-amax pass of nvfp4
    {"dequantize", "*", true},
    {"e2m1_as_e4m3", "*", true},
    {"adamw", "*", true},
// The FP8 blockwise op (fp8_gemm_nt_blockwise, also _acc) runs one kernel family per arch and A type.
#if SNIP_HAS_SM90
    {"fp8_gemm_nt_blockwise", "sm_90a"},       // E4M3 x E4M3
    {"fp8_gemm_nt_blockwise_e5m2", "sm_90a"},  // E5M2 x E4M3
#endif
#if SNIP_HAS_SM100
    {"fp8_gemm_nt_blockwise_sm100", "sm_100a"},       // E4M3 x E4M3
    {"fp8_gemm_nt_blockwise_e5m2_sm100", "sm_100a"},  // E5M2 x E4M3
    {"nvfp4_gemm_nt", "sm_100a"},  // BF16 and FP32 output
    {"mxfp4_gemm_nt", "sm_100a"},
    {"mxfp8_gemm_nt", "sm_100a"},
#endif
};

std::string json_list(const std::string& csv) {
  std::string out = "[";
  size_t start = 0;
  while (start <= csv.size() && !csv.empty()) {
    const size_t end = csv.find(',', start);
    const std::string item = csv.substr(start, end == std::string::npos ? std::string::npos : end - start);
    out += (out.size() > 1 ? ", \"" : "\"") + item + "\"";
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out + "]";
}

// JSON so that Python (snip_ops._ext.build_info) can parse it without a binding library.
std::string build_info() {
  std::string kernels;
  for (const auto& k : kKernels) {
    std::string targets = std::string(k.archs) == "*" ? SNIP_ARCHS : k.archs;
    if (k.cpu) targets += targets.empty() ? "cpu" : ",cpu";
    kernels += (kernels.empty() ? "\"" : ", \"") + std::string(k.name) + "\": " + json_list(targets);
  }
  return std::string("{\"archs\": ") + json_list(SNIP_ARCHS) + ", \"cuda\": \"" SNIP_CUDA_VERSION
         "\", \"torch\": \"" SNIP_TORCH_VERSION "\", \"cutlass\": \"" SNIP_CUTLASS_VERSION
         "\", \"kernels\": {" + kernels + "}}";
}

}  // namespace

TORCH_LIBRARY(snip_C, m) {
  m.def("build_info() -> str", &build_info);
  m.def("quantize(Tensor x, str spec, bool rowwise=True, bool colwise=False, int seed=0, int offset=0, "
        "int offset_t=0, Tensor? tensor_amax=None, str scale_layout=\"plain\", int pad=1, int hadamard_signs=-1) -> "
        "(Tensor codes, "
        "Tensor scales, Tensor codes_t, Tensor scales_t, Tensor tensor_scale)");
  m.def("dequantize(Tensor codes, Tensor scales, Tensor? tensor_scale, str spec, int cols, ScalarType dtype) "
        "-> Tensor");
  m.def("e2m1_as_e4m3(Tensor codes, int cols, int rows_out, int cols_out) -> Tensor");
  m.def("adamw_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
        "int[] param_indices, int[] index_bases, float decay, float beta1, float one_minus_beta1, float beta2, "
        "float one_minus_beta2, float inv_bias_correction2_sqrt, float step_size, float eps, int step, int seed, "
        "bool bf16_sr) -> ()");
#if SNIP_HAS_SM90 || SNIP_HAS_SM100
  m.def("fp8_gemm_nt_blockwise(Tensor a, Tensor sfa, Tensor b, Tensor sfb, int b_block, ScalarType out_dtype, "
        "Tensor? bias=None, str config=\"\") -> Tensor");
  m.def("fp8_gemm_nt_blockwise_acc(Tensor a, Tensor sfa, Tensor b, Tensor sfb, int b_block, Tensor(a!) out, "
        "str config=\"\") -> ()");
  m.def("fp8_gemm_nt_blockwise_config(int m, int n, int k, int b_block, ScalarType out_dtype, int num_sms, "
        "str config=\"\", int arch=90, ScalarType a_dtype=float8_e4m3fn) -> str",
        &snip::fp8_gemm_nt_blockwise_config);
#endif
#if SNIP_HAS_SM100
  m.def("nvfp4_gemm_nt(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor alpha, ScalarType out_dtype=bfloat16) "
        "-> Tensor");
  m.def("mxfp4_gemm_nt(Tensor a, Tensor sfa, Tensor b, Tensor sfb, ScalarType out_dtype=bfloat16) -> Tensor");
  m.def("mxfp8_gemm_nt(Tensor a, Tensor sfa, Tensor b, Tensor sfb, ScalarType out_dtype=bfloat16) -> Tensor");
#endif
}

// The ops with a device kernel and a Meta function, as X(name) lists per arch, so that each name is
// written once for both registrations below.
#define SNIP_COMMON_OPS(X) X(quantize) X(dequantize) X(e2m1_as_e4m3)
#if SNIP_HAS_SM90 || SNIP_HAS_SM100
#define SNIP_FP8_BLOCKWISE_OPS(X) X(fp8_gemm_nt_blockwise) X(fp8_gemm_nt_blockwise_acc)
#else
#define SNIP_FP8_BLOCKWISE_OPS(X)
#endif
#if SNIP_HAS_SM100
#define SNIP_SM100_OPS(X) X(nvfp4_gemm_nt) X(mxfp4_gemm_nt) X(mxfp8_gemm_nt)
#else
#define SNIP_SM100_OPS(X)
#endif
#define SNIP_KERNEL_OPS(X) SNIP_COMMON_OPS(X) SNIP_FP8_BLOCKWISE_OPS(X) SNIP_SM100_OPS(X)

namespace {

// CUDA and CPU share each op's entry point. On the CPU quantize, dequantize, e2m1_as_e4m3 and adamw_ run
// their host implementations (the kernels' arithmetic); the GEMMs run their argument checks and then refuse
// with a message that points to the PyTorch reference (instead of the dispatcher's generic "no CPU
// backend" error). A build without CUDA registers the CPU implementations only.
void impl_device_ops(torch::Library& m) {
#define SNIP_IMPL(op) m.impl(#op, &snip::op);
  SNIP_KERNEL_OPS(SNIP_IMPL)
#undef SNIP_IMPL
  m.impl("adamw_", &snip::adamw_);
}

}  // namespace

#if SNIP_WITH_CUDA
TORCH_LIBRARY_IMPL(snip_C, CUDA, m) { impl_device_ops(m); }
#endif
TORCH_LIBRARY_IMPL(snip_C, CPU, m) { impl_device_ops(m); }

TORCH_LIBRARY_IMPL(snip_C, Meta, m) {
#define SNIP_IMPL_META(op) m.impl(#op, &snip::op##_meta);
  SNIP_KERNEL_OPS(SNIP_IMPL_META)
#undef SNIP_IMPL_META
}

// A bare module: everything is reached through torch.ops.snip_C, so no pybind11 is needed.
PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C", "snip native ops (torch.ops.snip_C)", -1,
                            nullptr, nullptr, nullptr, nullptr, nullptr};
  return PyModule_Create(&def);
}
