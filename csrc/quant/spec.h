// Torch-side helpers shared by the quantize and dequantize ops: the spec string (exactly what
// formats.QuantSpec.describe() writes, e.g. "e2m1/1x16/nvfp4/sr") -> quant::Spec, and the dtypes
// of inputs, codes and scales.
#pragma once
#include <string_view>

#include <c10/core/ScalarType.h>

#include "quant/quantize.h"

namespace snip::quant {

// Parses a spec; rejects (with an error that names `op`) every spec without a kernel.
Spec parse_spec(std::string_view text, const char* op);

// The element type of x (float32, float16, bfloat16), or an error naming `op`.
InputDType input_dtype(c10::ScalarType t, const char* op);

// float8_e4m3fn / float8_e5m2 for FP8 codes, uint8 for packed FP4 codes.
c10::ScalarType codes_dtype(const Spec& s);
// float32 (FP32, POW2), float8_e8m0fnu (E8M0), float8_e4m3fn (NVFP4).
c10::ScalarType scales_dtype(const Spec& s);

}  // namespace snip::quant
