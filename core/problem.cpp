#include "core/problem.hpp"

#include <cmath>
#include <sstream>

namespace gdn {

bool parse_dtype(const std::string& text, DType* out) {
  if (text == "f64" || text == "float64" || text == "double") *out = DType::f64;
  else if (text == "f32" || text == "float32" || text == "float") *out = DType::f32;
  else if (text == "bf16" || text == "bfloat16") *out = DType::bf16;
  else if (text == "f16" || text == "float16" || text == "half") *out = DType::f16;
  else return false;
  return true;
}

namespace {

// Sizes beyond these are not malformed in principle, but no kernel or reference here is meant
// for them, and a typo'd shape should not allocate terabytes before failing.
constexpr int kMaxHeads = 4096;
constexpr int kMaxHeadDim = 4096;
constexpr std::int64_t kMaxTokens = std::int64_t(1) << 40;

[[noreturn]] void fail(const std::string& argument, const std::string& rule) {
  throw ProblemError(argument, rule);
}

std::string str(std::int64_t x) { return std::to_string(x); }

void check_shape(const char* name, const HostTensor<double>& tensor, const Shape& expected) {
  if (!tensor.defined())
    fail(name, "is required by this problem but was not given (expected shape " +
                   shape_string(expected) + ")");
  if (tensor.shape() != expected)
    fail(name, "must have shape " + shape_string(expected) + ", got " + shape_string(tensor.shape()));
}

void check_finite(const char* name, const HostTensor<double>& tensor) {
  for (std::int64_t i = 0; i < tensor.numel(); ++i)
    if (!std::isfinite(tensor[i]))
      fail(name, "must be finite; element " + str(i) + " is " + std::to_string(tensor[i]));
}

}  // namespace

double Problem::effective_scale() const { return scale ? *scale : 1.0 / std::sqrt(double(K)); }

Shape Problem::state_shape() const {
  const std::int64_t rows = uses_state_cache() ? state_slots : N();
  if (state_layout == StateLayout::k_major) return {rows, HV, K, V};
  return {rows, HV, V, K};
}

Shape Problem::intermediate_shape() const {
  if (state_layout == StateLayout::k_major) return {T, HV, K, V};
  return {T, HV, V, K};
}

std::string Problem::describe() const {
  std::ostringstream s;
  s << "N=" << N() << " T=" << T << " H=" << H << " HV=" << HV << " K=" << K << " V=" << V
    << " dtype=" << dtype_name(input_dtype) << " gate=" << dtype_name(gate_dtype)
    << (gate_mode == GateMode::fused ? " fused" : "") << (allow_negative_eigenvalues ? " negeig" : "")
    << (use_qk_l2norm ? " l2norm" : "") << (has_h0 ? " h0" : "") << (has_hT ? " hT" : "")
    << (state_layout == StateLayout::v_major ? " v_major" : "");
  if (state_dtype != DType::f32) s << " state=" << dtype_name(state_dtype);
  if (gate_space == GateSpace::linear) s << " alpha";
  if (uses_state_cache()) s << " slots=" << state_slots;
  if (store_intermediate_states) s << " intermediate";
  if (scale) s << " scale=" << *scale;
  return s.str();
}

void Problem::validate() const {
  if (cu_seqlens.size() < 2)
    fail("cu_seqlens", "must hold N+1 >= 2 boundaries, got " + str(std::int64_t(cu_seqlens.size())));
  if (cu_seqlens.front() != 0)
    fail("cu_seqlens", "must start at 0, got cu_seqlens[0] = " + str(cu_seqlens.front()));
  for (std::size_t i = 1; i < cu_seqlens.size(); ++i)
    if (cu_seqlens[i] < cu_seqlens[i - 1])
      fail("cu_seqlens", "must be non-decreasing, got cu_seqlens[" + str(std::int64_t(i)) + "] = " +
                             str(cu_seqlens[i]) + " < cu_seqlens[" + str(std::int64_t(i - 1)) +
                             "] = " + str(cu_seqlens[i - 1]));
  if (T < 0 || T > kMaxTokens) fail("T", "must be in [0, 2^40], got " + str(T));
  if (cu_seqlens.back() != T)
    fail("cu_seqlens", "must end at T = " + str(T) + ", got cu_seqlens[N] = " + str(cu_seqlens.back()));
  if (H < 1 || H > kMaxHeads) fail("H", "must be in [1, " + str(kMaxHeads) + "], got " + str(H));
  if (HV < 1 || HV > kMaxHeads) fail("HV", "must be in [1, " + str(kMaxHeads) + "], got " + str(HV));
  if (HV % H != 0)
    fail("HV", "must be a multiple of H (HV % H == 0), got HV = " + str(HV) + ", H = " + str(H));
  if (K < 1 || K > kMaxHeadDim) fail("K", "must be in [1, " + str(kMaxHeadDim) + "], got " + str(K));
  if (V < 1 || V > kMaxHeadDim) fail("V", "must be in [1, " + str(kMaxHeadDim) + "], got " + str(V));
  if (scale && !std::isfinite(*scale)) fail("scale", "must be finite, got " + std::to_string(*scale));
  if (state_slots < 0) fail("state_slots", "must be >= 0 (0: dense states), got " + str(state_slots));
  if (uses_state_cache() && !has_h0 && !has_hT)
    fail("state_slots", "a state cache needs has_h0 or has_hT (otherwise it is never used)");
  if (gate_dtype != DType::f32 && gate_dtype != input_dtype)
    fail("gate_dtype", std::string("must be f32 or the input dtype (") + dtype_name(input_dtype) +
                           "), got " + dtype_name(gate_dtype));
  if (state_dtype != DType::f32 && state_dtype != DType::bf16 && state_dtype != DType::f16)
    fail("state_dtype", std::string("must be f32, bf16 or f16 (kernels compute in fp32 and store states in it), got ") +
                            dtype_name(state_dtype));
  if (gate_space == GateSpace::linear && gate_mode != GateMode::direct)
    fail("gate_space", "linear (alpha = exp(g) given) applies to direct gates only; fused gates compute g themselves");
  if (allow_negative_eigenvalues && gate_mode != GateMode::fused)
    fail("allow_negative_eigenvalues",
         "applies to fused gates only (with direct gates, pass beta in [0, 2) yourself)");
}

Problem Problem::fixed_length(int batch, std::int64_t tokens_per_sequence, int H, int HV, int K,
                              int V) {
  if (batch < 1) fail("batch", "must be >= 1, got " + str(batch));
  if (tokens_per_sequence < 0) fail("tokens_per_sequence", "must be >= 0, got " + str(tokens_per_sequence));
  return packed(std::vector<std::int64_t>(static_cast<std::size_t>(batch), tokens_per_sequence), H,
                HV, K, V);
}

Problem Problem::packed(const std::vector<std::int64_t>& lengths, int H, int HV, int K, int V) {
  Problem p;
  p.cu_seqlens.assign(1, 0);
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 0) fail("lengths", "must be >= 0, got lengths[" + str(std::int64_t(i)) + "] = " + str(lengths[i]));
    p.cu_seqlens.push_back(p.cu_seqlens.back() + lengths[i]);
  }
  p.T = p.cu_seqlens.back();
  p.H = H;
  p.HV = HV;
  p.K = K;
  p.V = V;
  return p;
}

void validate(const Problem& problem, const Inputs& inputs) {
  problem.validate();
  check_shape("q", inputs.q, problem.q_shape());
  check_shape("k", inputs.k, problem.q_shape());
  check_shape("v", inputs.v, problem.v_shape());
  if (problem.gate_mode == GateMode::direct) {
    check_shape(problem.decay_name(), inputs.g, problem.gate_shape());
    check_shape("beta", inputs.beta, problem.gate_shape());
    if (problem.linear_gates()) {
      // alpha = exp(g): alpha = 0 is the hard reset (g = -inf), alpha > 1 growth (a positive
      // finite g, accepted as g is); a negative, NaN or infinite alpha is no exp(g) of any
      // g the operator accepts.
      for (std::int64_t i = 0; i < inputs.g.numel(); ++i)
        if (!(inputs.g[i] >= 0) || inputs.g[i] == INFINITY)
          fail("alpha", "must be finite and >= 0 (alpha = exp(g); 0 is a hard reset); element " + str(i) + " is " +
                            std::to_string(inputs.g[i]));
    } else {
      // g = +inf or NaN has no meaning; g = -inf is a legal hard reset only in the limit, and
      // exp(-inf) = 0 is what every implementation computes, so allow it.
      for (std::int64_t i = 0; i < inputs.g.numel(); ++i)
        if (std::isnan(inputs.g[i]) || inputs.g[i] == INFINITY)
          fail("g", "must not be NaN or +inf; element " + str(i) + " is " + std::to_string(inputs.g[i]));
    }
  } else {
    check_shape("a", inputs.a, problem.gate_shape());
    check_shape("b", inputs.b, problem.gate_shape());
    check_shape("A_log", inputs.A_log, problem.head_param_shape());
    check_shape("dt_bias", inputs.dt_bias, problem.head_param_shape());
    check_finite("A_log", inputs.A_log);
    check_finite("dt_bias", inputs.dt_bias);
  }
  if (problem.has_h0 || problem.uses_state_cache()) check_shape("h0", inputs.h0, problem.state_shape());
  if (problem.uses_state_cache()) {
    if (inputs.state_indices.size() != static_cast<std::size_t>(problem.N()))
      fail("state_indices", "must hold one slot per sequence (N = " + str(problem.N()) + "), got " +
                                str(std::int64_t(inputs.state_indices.size())));
    std::vector<int> seen(static_cast<std::size_t>(problem.state_slots), -1);
    for (int n = 0; n < problem.N(); ++n) {
      const std::int32_t slot = inputs.state_indices[static_cast<std::size_t>(n)];
      if (slot == -1) continue;
      if (slot < 0 || slot >= problem.state_slots)
        fail("state_indices", "must be -1 (padding) or in [0, state_slots = " + str(problem.state_slots) +
                                  "), got state_indices[" + str(n) + "] = " + str(slot));
      // Two sequences updating one slot in place would race in any parallel kernel and have
      // no defined result.
      if (problem.has_hT && seen[static_cast<std::size_t>(slot)] >= 0)
        fail("state_indices", "must not name one slot twice when the state is written back; slot " +
                                  str(slot) + " is used by sequences " + str(seen[static_cast<std::size_t>(slot)]) +
                                  " and " + str(n));
      seen[static_cast<std::size_t>(slot)] = n;
    }
  } else if (!inputs.state_indices.empty()) {
    fail("state_indices", "given but the problem has no state cache (state_slots = 0)");
  }
}

}  // namespace gdn
