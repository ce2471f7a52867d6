#pragma once
// Helpers of the host API's pre-launch checks (launch.cpp, chunked_launch.cpp): a broken rule
// is a ProblemError naming the argument and the rule, thrown before anything is launched.
#include <cstdint>
#include <string>

#include "cuda/api/api.hpp"
#include "cuda/recurrent/recurrent_params.hpp"

namespace gdn::cuda::detail {

[[noreturn]] inline void fail(const std::string& argument, const std::string& rule) {
  throw ProblemError(argument, rule);
}

inline std::string str(std::int64_t x) { return std::to_string(x); }

// The kernels' element type of a dtype the checks have accepted (f64 never reaches a kernel).
inline ElementType element_type(DType dtype) {
  switch (dtype) {
    case DType::bf16: return ElementType::bf16;
    case DType::f16: return ElementType::f16;
    default: return ElementType::f32;
  }
}

}  // namespace gdn::cuda::detail
