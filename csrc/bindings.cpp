// The only binding file: op schemas, their kernels per dispatch key, build_info, and the Python
// module init. Ops are called as torch.ops.snip_C.<name>; importing snip_ops._C registers them.
#include <Python.h>

#include <string>

#include <torch/library.h>

#include "ops.h"

namespace {

// Kernels compiled into this build and the archs each one runs on ("*": every compiled arch).
// Add a line per op; guard arch-specific ones with SNIP_HAS_SM90 / SNIP_HAS_SM100.
struct KernelEntry {
  const char* name;
  const char* archs;
};
constexpr KernelEntry kKernels[] = {
    {"fp8_quantize_1x128", "*"},
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
    const std::string archs = std::string(k.archs) == "*" ? SNIP_ARCHS : k.archs;
    kernels += (kernels.empty() ? "\"" : ", \"") + std::string(k.name) + "\": " + json_list(archs);
  }
  return std::string("{\"archs\": ") + json_list(SNIP_ARCHS) + ", \"cuda\": \"" SNIP_CUDA_VERSION
         "\", \"torch\": \"" SNIP_TORCH_VERSION "\", \"cutlass\": \"" SNIP_CUTLASS_VERSION
         "\", \"kernels\": {" + kernels + "}}";
}

}  // namespace

TORCH_LIBRARY(snip_C, m) {
  m.def("build_info() -> str", &build_info);
  m.def("fp8_quantize_1x128(Tensor x, bool pow2_scale) -> (Tensor codes, Tensor scales)");
}

TORCH_LIBRARY_IMPL(snip_C, CUDA, m) {
  m.impl("fp8_quantize_1x128", &snip::fp8_quantize_1x128);
}

// The CPU entry runs the same argument checks and then refuses with a message that points to the
// reference implementation, instead of the dispatcher's generic "no CPU backend" error.
TORCH_LIBRARY_IMPL(snip_C, CPU, m) {
  m.impl("fp8_quantize_1x128", &snip::fp8_quantize_1x128);
}

TORCH_LIBRARY_IMPL(snip_C, Meta, m) {
  m.impl("fp8_quantize_1x128", &snip::fp8_quantize_1x128_meta);
}

// A bare module: everything is reached through torch.ops.snip_C, so no pybind11 is needed.
PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C", "snip native ops (torch.ops.snip_C)", -1,
                            nullptr, nullptr, nullptr, nullptr, nullptr};
  return PyModule_Create(&def);
}
