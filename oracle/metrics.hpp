#pragma once
// Error metrics of one output tensor of an implementation against a reference, and where the
// worst error sits in problem terms (sequence, head, token, element). Metrics describe; the
// budgets in budget.hpp judge.
#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "core/problem.hpp"

namespace gdn::oracle {

// The forward's outputs, and the backward's gradients (core/gradients.hpp, judged by
// oracle/backward_budget.hpp): one name space for checks, metrics and locations.
enum class OutputTensor { o, hT, intermediate, dq, dk, dv, dg, dbeta, da, db, dA_log, ddt_bias, dh0 };
const char* output_tensor_name(OutputTensor tensor);

// The dtype an output is stored in (§7): o in the input dtype, states in the state dtype; a gradient in
// the dtype of the input it differentiates (§6): dq, dk, dv the input dtype, dg, dbeta, da, db
// the gate dtype, dA_log, ddt_bias, dh0 fp32.
DType output_dtype(const Problem& problem, OutputTensor tensor);
// The shape the problem gives the output.
Shape output_shape(const Problem& problem, OutputTensor tensor);

// A flat index of an output tensor decoded through the problem. Fields that do not apply are
// -1: token for hT (a final state), sequence for a cache slot no sequence names.
struct Location {
  std::int64_t flat = -1;
  int sequence = -1;
  int head = -1;            // value head
  std::int64_t token = -1;  // packed token index (o, intermediate)
  std::int64_t position = -1;  // token - cu_seqlens[sequence]
  std::int64_t state_row = -1; // row of the state tensor (hT: sequence or cache slot)
  int k = -1, v = -1;       // element: v for o; (k, v) of S[k][v] for states, whatever the layout
  std::string describe() const;
};

Location locate(const Problem& problem, const Inputs* inputs, OutputTensor tensor, std::int64_t flat);

struct TensorMetrics {
  OutputTensor tensor = OutputTensor::o;
  DType dtype = DType::f32;  // the output's dtype: the unit for ULPs and budget floors
  std::int64_t count = 0;
  double max_abs_error = 0;  // max |ref - x|
  double rms_error = 0;      // rms(ref - x); finite for finite values (sums rescaled on overflow)
  double rms_ref = 0;        // rms(ref)
  double max_abs_ref = 0;    // max |ref|
  double rel_rms = 0;        // rms(ref - x) / rms(ref); 0 when both are 0, inf when only ref is
  double rel_floor = 0;      // the floor of max_rel_error (absolute value)
  double max_rel_error = 0;  // max |ref - x| / max(|ref|, rel_floor)
  // fp32 outputs: largest distance in representable floats between float(ref) and x.
  // Other dtypes: largest |ref - x| in units of the output dtype's ulp at |ref|.
  // inf where an fp32 output or its reference lies outside fp32's range.
  double max_ulp = 0;
  std::int64_t mismatches = 0;  // elements not bitwise equal (as doubles; NaN equals NaN)
  std::int64_t nan_count = 0, inf_count = 0;          // in x
  std::int64_t ref_nan_count = 0, ref_inf_count = 0;  // in ref
  // Elements where x is not finite but ref is, or x and ref are different non-finite values:
  // their error is +inf and every budget fails on them.
  std::int64_t nonfinite_mismatches = 0;
  Location worst;  // of max_abs_error (first non-finite mismatch if any)
  double worst_ref = 0, worst_value = 0;
};

struct MetricOptions {
  // max_rel_error divides by max(|ref|, rel_floor_fraction * rms(ref)): elements near zero
  // would otherwise turn rounding noise into huge relative errors.
  double rel_floor_fraction = 1e-3;
};

// Compares element by element; shapes must match (ProblemError naming the tensor otherwise).
// inputs may be null; with a state cache it maps slots back to sequences.
TensorMetrics compare(const Problem& problem, const Inputs* inputs, OutputTensor tensor,
                      const HostTensor<double>& reference, const HostTensor<double>& actual,
                      const MetricOptions& options = {});

// Distance in representable fp32 values (0 for equal, 1 for neighbours); +0 and -0 are equal.
double ulp_distance_f32(float a, float b);
// Unit in the last place of dtype at magnitude |x| (the spacing of representable values there).
double ulp_of(DType dtype, double x);

nlohmann::json to_json(const TensorMetrics& metrics);
nlohmann::json to_json(const Location& location);

}  // namespace gdn::oracle
