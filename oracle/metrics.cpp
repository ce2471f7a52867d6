#include "oracle/metrics.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

namespace gdn::oracle {

const char* output_tensor_name(OutputTensor tensor) {
  switch (tensor) {
    case OutputTensor::o: return "o";
    case OutputTensor::hT: return "hT";
    case OutputTensor::intermediate: return "intermediate";
    case OutputTensor::dq: return "dq";
    case OutputTensor::dk: return "dk";
    case OutputTensor::dv: return "dv";
    case OutputTensor::dg: return "dg";
    case OutputTensor::dbeta: return "dbeta";
    case OutputTensor::da: return "da";
    case OutputTensor::db: return "db";
    case OutputTensor::dA_log: return "dA_log";
    case OutputTensor::ddt_bias: return "ddt_bias";
    case OutputTensor::dh0: return "dh0";
  }
  return "?";
}

DType output_dtype(const Problem& problem, OutputTensor tensor) {
  switch (tensor) {
    case OutputTensor::o:
    case OutputTensor::dq:
    case OutputTensor::dk:
    case OutputTensor::dv: return problem.input_dtype;
    case OutputTensor::dg:
    case OutputTensor::dbeta:
    case OutputTensor::da:
    case OutputTensor::db: return problem.gate_dtype;
    case OutputTensor::hT:
    case OutputTensor::intermediate: return problem.state_dtype;
    case OutputTensor::dA_log:
    case OutputTensor::ddt_bias:
    case OutputTensor::dh0: return DType::f32;
  }
  return DType::f32;
}

Shape output_shape(const Problem& problem, OutputTensor tensor) {
  switch (tensor) {
    case OutputTensor::o: return problem.v_shape();
    case OutputTensor::hT: return problem.state_shape();
    case OutputTensor::intermediate: return problem.intermediate_shape();
    case OutputTensor::dq:
    case OutputTensor::dk: return problem.q_shape();
    case OutputTensor::dv: return problem.v_shape();
    case OutputTensor::dg:
    case OutputTensor::dbeta:
    case OutputTensor::da:
    case OutputTensor::db: return problem.gate_shape();
    case OutputTensor::dA_log:
    case OutputTensor::ddt_bias: return problem.head_param_shape();
    case OutputTensor::dh0: return problem.state_shape();
  }
  return {};
}

std::string Location::describe() const {
  if (flat < 0) return "-";
  std::ostringstream s;
  if (sequence >= 0) s << "seq " << sequence;
  else if (state_row >= 0) s << "slot " << state_row << " (unused)";
  if (head >= 0) s << ", head " << head;
  if (token >= 0) s << ", token " << token << " (pos " << position << ")";
  if (k >= 0) s << ", k " << k;
  if (v >= 0) s << ", v " << v;
  return s.str();
}

namespace {

int sequence_of_token(const Problem& problem, std::int64_t token) {
  // Last sequence whose begin is <= token: zero-length sequences before it are skipped.
  const auto it = std::upper_bound(problem.cu_seqlens.begin(), problem.cu_seqlens.end(), token);
  return static_cast<int>(it - problem.cu_seqlens.begin()) - 1;
}

void decode_state_element(const Problem& problem, std::int64_t element, Location& loc) {
  if (problem.state_layout == StateLayout::k_major) {
    loc.k = static_cast<int>(element / problem.V);
    loc.v = static_cast<int>(element % problem.V);
  } else {
    loc.v = static_cast<int>(element / problem.K);
    loc.k = static_cast<int>(element % problem.K);
  }
}

}  // namespace

Location locate(const Problem& problem, const Inputs* inputs, OutputTensor tensor, std::int64_t flat) {
  Location loc;
  loc.flat = flat;
  if (flat < 0) return loc;
  const std::int64_t HV = problem.HV, K = problem.K, V = problem.V;
  switch (tensor) {
    case OutputTensor::o:
    case OutputTensor::dv: {
      loc.token = flat / (HV * V);
      loc.head = static_cast<int>((flat / V) % HV);
      loc.v = static_cast<int>(flat % V);
      loc.sequence = sequence_of_token(problem, loc.token);
      loc.position = loc.token - problem.seq_begin(loc.sequence);
      break;
    }
    case OutputTensor::intermediate: {
      loc.token = flat / (HV * K * V);
      loc.head = static_cast<int>((flat / (K * V)) % HV);
      decode_state_element(problem, flat % (K * V), loc);
      loc.sequence = sequence_of_token(problem, loc.token);
      loc.position = loc.token - problem.seq_begin(loc.sequence);
      break;
    }
    case OutputTensor::dq:
    case OutputTensor::dk: {  // [T, H, K]: head is the query/key head
      loc.token = flat / (problem.H * K);
      loc.head = static_cast<int>((flat / K) % problem.H);
      loc.k = static_cast<int>(flat % K);
      loc.sequence = sequence_of_token(problem, loc.token);
      loc.position = loc.token - problem.seq_begin(loc.sequence);
      break;
    }
    case OutputTensor::dg:
    case OutputTensor::dbeta:
    case OutputTensor::da:
    case OutputTensor::db: {  // [T, HV]
      loc.token = flat / HV;
      loc.head = static_cast<int>(flat % HV);
      loc.sequence = sequence_of_token(problem, loc.token);
      loc.position = loc.token - problem.seq_begin(loc.sequence);
      break;
    }
    case OutputTensor::dA_log:
    case OutputTensor::ddt_bias:  // [HV]: a sum over every token of the head
      loc.head = static_cast<int>(flat);
      break;
    case OutputTensor::hT:
    case OutputTensor::dh0: {
      loc.state_row = flat / (HV * K * V);
      loc.head = static_cast<int>((flat / (K * V)) % HV);
      decode_state_element(problem, flat % (K * V), loc);
      if (!problem.uses_state_cache()) {
        loc.sequence = static_cast<int>(loc.state_row);
      } else if (inputs) {
        for (std::size_t n = 0; n < inputs->state_indices.size(); ++n)
          if (inputs->state_indices[n] == loc.state_row) loc.sequence = static_cast<int>(n);
      }
      break;
    }
  }
  return loc;
}

double ulp_distance_f32(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return (std::isnan(a) && std::isnan(b)) ? 0.0 : INFINITY;
  // Map the sign-magnitude bit patterns onto a line where neighbours differ by one.
  auto ordered = [](float x) -> std::int64_t {
    std::int32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    return bits < 0 ? -static_cast<std::int64_t>(bits & 0x7fffffff) : static_cast<std::int64_t>(bits);
  };
  return static_cast<double>(std::llabs(ordered(a) - ordered(b)));
}

double ulp_of(DType dtype, double x) {
  int digits = 53, min_exponent = -1022;  // significand bits incl. implicit; least normal exponent
  switch (dtype) {
    case DType::f64: digits = 53; min_exponent = -1022; break;
    case DType::f32: digits = 24; min_exponent = -126; break;
    case DType::bf16: digits = 8; min_exponent = -126; break;
    case DType::f16: digits = 11; min_exponent = -14; break;
  }
  const double magnitude = std::fabs(x);
  int exponent = min_exponent;
  if (magnitude > 0 && std::isfinite(magnitude)) exponent = std::max(std::ilogb(magnitude), min_exponent);
  return std::ldexp(1.0, exponent - (digits - 1));
}

TensorMetrics compare(const Problem& problem, const Inputs* inputs, OutputTensor tensor,
                      const HostTensor<double>& reference, const HostTensor<double>& actual,
                      const MetricOptions& options) {
  const char* name = output_tensor_name(tensor);
  if (reference.shape() != actual.shape())
    throw ProblemError(name, "the implementation's output has shape " + shape_string(actual.shape()) +
                                 ", the reference's " + shape_string(reference.shape()));
  TensorMetrics m;
  m.tensor = tensor;
  m.dtype = output_dtype(problem, tensor);
  m.count = reference.numel();
  double sum_err2 = 0, sum_ref2 = 0;
  std::int64_t worst = -1, first_nonfinite = -1;
  for (std::int64_t i = 0; i < m.count; ++i) {
    const double r = reference[i], x = actual[i];
    if (std::isnan(x)) ++m.nan_count;
    if (std::isinf(x)) ++m.inf_count;
    if (std::isnan(r)) ++m.ref_nan_count;
    if (std::isinf(r)) ++m.ref_inf_count;
    const bool same = (r == x) || (std::isnan(r) && std::isnan(x));
    if (!same || std::signbit(r) != std::signbit(x)) {
      // -0 vs +0 is a bitwise mismatch but no error.
      if (!(std::isnan(r) && std::isnan(x))) ++m.mismatches;
    }
    if (same) {
      if (std::isfinite(r)) {
        sum_ref2 += r * r;
        m.max_abs_ref = std::max(m.max_abs_ref, std::fabs(r));
      }
      continue;
    }
    if (!std::isfinite(r) || !std::isfinite(x)) {
      ++m.nonfinite_mismatches;
      if (first_nonfinite < 0) first_nonfinite = i;
      continue;
    }
    const double e = std::fabs(r - x);
    sum_err2 += e * e;
    sum_ref2 += r * r;
    m.max_abs_ref = std::max(m.max_abs_ref, std::fabs(r));
    if (worst < 0 || e > m.max_abs_error) {
      m.max_abs_error = e;
      worst = i;
    }
    if (m.dtype == DType::f32) {
      // A value outside fp32's range has no fp32 neighbours (and converting it is undefined).
      constexpr double f32_max = std::numeric_limits<float>::max();
      const bool in_range = std::fabs(r) <= f32_max && std::fabs(x) <= f32_max;
      m.max_ulp = std::max(m.max_ulp, in_range ? ulp_distance_f32(static_cast<float>(r), static_cast<float>(x))
                                               : std::numeric_limits<double>::infinity());
    } else {
      m.max_ulp = std::max(m.max_ulp, e / ulp_of(m.dtype, r));
    }
  }
  const double n = m.count > 0 ? static_cast<double>(m.count) : 1.0;
  m.rms_error = std::sqrt(sum_err2 / n);
  m.rms_ref = std::sqrt(sum_ref2 / n);
  // Sums of squares overflow for finite values above about 1e154: then sum again, scaled by
  // the largest term, so that finite outputs never get an infinite rms (nor rel_rms inf / inf).
  if (std::isinf(sum_err2) || std::isinf(sum_ref2)) {
    double scaled_err2 = 0, scaled_ref2 = 0;
    for (std::int64_t i = 0; i < m.count; ++i) {
      const double r = reference[i], x = actual[i];
      if (!std::isfinite(r)) continue;
      if (std::isfinite(x) && r != x && std::isfinite(m.max_abs_error) && m.max_abs_error > 0) {
        const double e = std::fabs(r - x) / m.max_abs_error;
        scaled_err2 += e * e;
      }
      if ((std::isfinite(x) || r == x) && m.max_abs_ref > 0) {
        const double q = std::fabs(r) / m.max_abs_ref;
        scaled_ref2 += q * q;
      }
    }
    // An error that itself overflowed (|r - x| above the largest double) stays inf.
    if (std::isinf(sum_err2))
      m.rms_error = std::isfinite(m.max_abs_error) ? m.max_abs_error * std::sqrt(scaled_err2 / n) : INFINITY;
    if (std::isinf(sum_ref2)) m.rms_ref = m.max_abs_ref * std::sqrt(scaled_ref2 / n);
  }
  m.rel_rms = m.rms_error == 0 ? 0.0 : (m.rms_ref == 0 ? INFINITY : m.rms_error / m.rms_ref);
  m.rel_floor = options.rel_floor_fraction * m.rms_ref;
  // Second pass: the floor depends on rms(ref).
  for (std::int64_t i = 0; i < m.count; ++i) {
    const double r = reference[i], x = actual[i];
    if (!std::isfinite(r) || !std::isfinite(x) || r == x) continue;
    const double denominator = std::max(std::fabs(r), m.rel_floor);
    const double rel = denominator > 0 ? std::fabs(r - x) / denominator : INFINITY;
    m.max_rel_error = std::max(m.max_rel_error, rel);
  }
  if (m.nonfinite_mismatches > 0) {
    m.max_abs_error = m.rms_error = m.rel_rms = m.max_rel_error = m.max_ulp = INFINITY;
    worst = first_nonfinite;
  }
  m.worst = locate(problem, inputs, tensor, worst);
  if (worst >= 0) {
    m.worst_ref = reference[worst];
    m.worst_value = actual[worst];
  }
  return m;
}

namespace {
// JSON has no inf/NaN: write them as strings so a reader sees what happened.
nlohmann::json number(double x) {
  if (std::isfinite(x)) return x;
  if (std::isnan(x)) return "nan";
  return x > 0 ? "inf" : "-inf";
}
}  // namespace

nlohmann::json to_json(const Location& l) {
  return {{"flat", l.flat}, {"sequence", l.sequence}, {"head", l.head}, {"token", l.token},
          {"position", l.position}, {"state_row", l.state_row}, {"k", l.k}, {"v", l.v},
          {"text", l.describe()}};
}

nlohmann::json to_json(const TensorMetrics& m) {
  return {{"tensor", output_tensor_name(m.tensor)},
          {"dtype", dtype_name(m.dtype)},
          {"count", m.count},
          {"max_abs_error", number(m.max_abs_error)},
          {"rms_error", number(m.rms_error)},
          {"rms_ref", number(m.rms_ref)},
          {"max_abs_ref", number(m.max_abs_ref)},
          {"rel_rms", number(m.rel_rms)},
          {"max_rel_error", number(m.max_rel_error)},
          {"rel_floor", number(m.rel_floor)},
          {"max_ulp", number(m.max_ulp)},
          {"mismatches", m.mismatches},
          {"nan_count", m.nan_count},
          {"inf_count", m.inf_count},
          {"ref_nan_count", m.ref_nan_count},
          {"ref_inf_count", m.ref_inf_count},
          {"nonfinite_mismatches", m.nonfinite_mismatches},
          {"worst", to_json(m.worst)},
          {"worst_ref", number(m.worst_ref)},
          {"worst_value", number(m.worst_value)}};
}

}  // namespace gdn::oracle
