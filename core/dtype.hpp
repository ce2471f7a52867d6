#pragma once
// Element types the problem description names. The core layer holds no arithmetic on
// reduced-precision types: rounding lives in reference/precision.hpp (Eigen's bfloat16/half).
#include <cstddef>
#include <string>

namespace gdn {

enum class DType { f64, f32, bf16, f16 };

inline const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f64: return "f64";
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
  }
  return "?";
}

inline std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f64: return 8;
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
  }
  return 0;
}

// Unit roundoff u = 2^-p (p = significand bits incl. the implicit one): the bound on the
// relative error of one rounding to nearest. Error budgets scale from it.
inline double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::f64: return 0x1p-53;
    case DType::f32: return 0x1p-24;
    case DType::bf16: return 0x1p-8;
    case DType::f16: return 0x1p-11;
  }
  return 0.0;
}

// Parses "f64"/"f32"/"bf16"/"f16" (also "float64", "float32", "bfloat16", "float16").
bool parse_dtype(const std::string& text, DType* out);

}  // namespace gdn
