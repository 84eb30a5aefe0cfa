#include "quant/spec.h"

#include <string>
#include <vector>

#include <c10/util/Exception.h>

namespace snip::quant {
namespace {

constexpr const char* kSupported =
    "kernels exist for elements e4m3|e5m2|e2m1, blocks 1x16|1x32|1x128|16x16|128x128, scales "
    "fp32|pow2|e8m0|nvfp4 (nvfp4: e2m1 only), rounding rne|sr; snip_ops.quantize runs every other spec "
    "on the reference";

}  // namespace

Spec parse_spec(std::string_view text, const char* op) {
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t end = text.find('/', start);
    parts.emplace_back(text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  TORCH_CHECK(parts.size() == 4, op, "spec '", text, "' is not '<element>/<rows>x<cols>/<scale>/<rounding>'");
  Spec s{};
  if (parts[0] == "e4m3") s.elem = Elem::kE4M3;
  else if (parts[0] == "e5m2") s.elem = Elem::kE5M2;
  else if (parts[0] == "e2m1") s.elem = Elem::kE2M1;
  else TORCH_CHECK(false, op, "spec '", text, "': no kernel for element '", parts[0], "'; ", kSupported);

  const size_t x = parts[1].find('x');
  TORCH_CHECK(x != std::string::npos, op, "spec '", text, "': block '", parts[1], "' is not '<rows>x<cols>'");
  try {
    s.block_rows = std::stoi(parts[1].substr(0, x));
    s.block_cols = std::stoi(parts[1].substr(x + 1));
  } catch (const std::exception&) {
    TORCH_CHECK(false, op, "spec '", text, "': block '", parts[1], "' is not '<rows>x<cols>'");
  }
  const int br = s.block_rows, bc = s.block_cols;
  TORCH_CHECK((br == 1 && (bc == 16 || bc == 32 || bc == 128)) || (br == bc && (bc == 16 || bc == 128)), op,
              "spec '", text, "': no kernel for block ", parts[1], "; ", kSupported);

  if (parts[2] == "fp32") s.scale = ScaleKind::kFP32;
  else if (parts[2] == "pow2") s.scale = ScaleKind::kPow2;
  else if (parts[2] == "e8m0") s.scale = ScaleKind::kE8M0;
  else if (parts[2] == "nvfp4") s.scale = ScaleKind::kNVFP4;
  else TORCH_CHECK(false, op, "spec '", text, "': no kernel for scale '", parts[2], "'; ", kSupported);
  TORCH_CHECK(s.scale != ScaleKind::kNVFP4 || s.elem == Elem::kE2M1, op, "spec '", text,
              "': nvfp4 scaling is defined for e2m1 elements only");

  if (parts[3] == "rne") s.sr = false;
  else if (parts[3] == "sr") s.sr = true;
  else TORCH_CHECK(false, op, "spec '", text, "': no kernel for rounding '", parts[3], "'; ", kSupported);
  return s;
}

InputDType input_dtype(c10::ScalarType t, const char* op) {
  switch (t) {
    case c10::kFloat: return InputDType::kFloat32;
    case c10::kHalf: return InputDType::kFloat16;
    case c10::kBFloat16: return InputDType::kBFloat16;
    default: TORCH_CHECK(false, op, "x must be bfloat16, float16 or float32, got ", t);
  }
}

c10::ScalarType codes_dtype(const Spec& s) {
  switch (s.elem) {
    case Elem::kE4M3: return c10::kFloat8_e4m3fn;
    case Elem::kE5M2: return c10::kFloat8_e5m2;
    case Elem::kE2M1: return c10::kByte;
  }
  return c10::kByte;
}

c10::ScalarType scales_dtype(const Spec& s) {
  switch (s.scale) {
    case ScaleKind::kFP32:
    case ScaleKind::kPow2: return c10::kFloat;
    case ScaleKind::kE8M0: return c10::kFloat8_e8m0fnu;
    case ScaleKind::kNVFP4: return c10::kFloat8_e4m3fn;
  }
  return c10::kFloat;
}

}  // namespace snip::quant
