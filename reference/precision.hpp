#pragma once
// Rounding to the storage dtypes kernels use, through Eigen's own bfloat16 and half (round to
// nearest even). Everything that emulates a kernel's storage goes through these two functions.
#include <Eigen/Core>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/dtype.hpp"
#include "core/host_tensor.hpp"
#include "core/problem.hpp"

namespace gdn::reference {

// Round a value to `dtype` and return it widened back to double (exact).
inline double round_to(DType dtype, double x) {
  switch (dtype) {
    case DType::f64: return x;
    case DType::f32: return static_cast<double>(static_cast<float>(x));
    // Eigen's constructors go through float: a double is first rounded to float. Inputs made
    // by the generators are rounded once from double, so a rare double rounding only changes
    // which representable value is drawn; outputs come from float and round exactly once.
    case DType::bf16: return static_cast<double>(static_cast<float>(Eigen::bfloat16(static_cast<float>(x))));
    case DType::f16: return static_cast<double>(static_cast<float>(Eigen::half(static_cast<float>(x))));
  }
  return x;
}

// Round to TF32 (10 mantissa bits) to nearest, ties away from zero, as the tensor cores' operand
// conversion cvt.rna.tf32.f32 does; infinities and NaN unchanged.
inline float round_tf32(float x) {
  if (!std::isfinite(x)) return x;
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  u = (u + 0x1000u) & 0xffffe000u;
  std::memcpy(&x, &u, sizeof u);
  return x;
}

template <class T>
void round_in_place(DType dtype, HostTensor<T>& tensor) {
  if (dtype == DType::f64) return;
  for (std::int64_t i = 0; i < tensor.numel(); ++i)
    tensor[i] = static_cast<T>(round_to(dtype, static_cast<double>(tensor[i])));
}

// True when every element is exactly representable in dtype (the Inputs contract).
inline bool representable(DType dtype, const HostTensor<double>& tensor) {
  for (std::int64_t i = 0; i < tensor.numel(); ++i) {
    const double x = tensor[i];
    if (x == x && round_to(dtype, x) != x) return false;
  }
  return true;
}

// The states a kernel stores, rounded once to the problem's state dtype (§7): hT (the whole
// cache with a state cache) and the per-token states. Kernels keep the running state in fp32
// and round only what they write, so the rounding is applied to outputs, never fed back into
// the recurrence. Every emulation of a kernel's storage ends with this.
template <class T>
void round_stored_states(const Problem& problem, Outputs<T>& outputs) {
  if (problem.state_dtype == DType::f32) return;
  round_in_place(problem.state_dtype, outputs.hT);
  round_in_place(problem.state_dtype, outputs.intermediate);
}

}  // namespace gdn::reference
