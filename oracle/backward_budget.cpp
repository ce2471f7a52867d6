#include "oracle/backward_budget.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "reference/backward.hpp"
#include "reference/backward_chunked.hpp"
#include "reference/precision.hpp"
#include "reference/prepare.hpp"

namespace gdn::oracle {

namespace {

std::string sci(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.2e", x);
  return buffer;
}

std::string compact(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

constexpr OutputTensor kAllGradients[] = {OutputTensor::dq,     OutputTensor::dk,     OutputTensor::dv,
                                          OutputTensor::dg,     OutputTensor::dbeta,  OutputTensor::da,
                                          OutputTensor::db,     OutputTensor::dA_log, OutputTensor::ddt_bias,
                                          OutputTensor::dh0};

std::string names_of(const std::vector<OutputTensor>& tensors) {
  std::string s;
  for (OutputTensor t : tensors) s += (s.empty() ? "" : ", ") + std::string(output_tensor_name(t));
  return s;
}

bool is_gate_gradient(OutputTensor t) {
  return t == OutputTensor::dg || t == OutputTensor::dbeta || t == OutputTensor::da || t == OutputTensor::db ||
         t == OutputTensor::dA_log || t == OutputTensor::ddt_bias;
}

// max |x - exact| / M with the conventions of docs/budgets.md "Gradients": NaN when M is not
// finite (nothing can be measured against it), 0 or inf when M = 0 (every term of every
// element is exactly 0, so is the exact gradient: only exactly 0 is right).
double relative_to_terms(double max_abs_difference, double M) {
  if (!std::isfinite(M)) return std::numeric_limits<double>::quiet_NaN();
  if (M == 0) return max_abs_difference == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return max_abs_difference / M;
}

// Why an error relative to the terms is not finite.
std::string terms_diagnosis(const TensorMetrics& m, double max_abs_difference, double M) {
  const std::string name = output_tensor_name(m.tensor);
  if (!std::isfinite(M))
    return "the term magnitudes of " + name + " are not finite (the exact backward overflowed or met a NaN)";
  if (m.nonfinite_mismatches > 0)
    return "NaN or inf where the exact gradient is finite (or unlike a non-finite one): " +
           std::to_string(m.nonfinite_mismatches) + " elements of " + name + " (" + std::to_string(m.nan_count) +
           " NaN, " + std::to_string(m.inf_count) + " inf)";
  if (M == 0)
    return "every term of " + name + " is exactly 0 (so is the exact gradient), got max |x - exact| = " +
           sci(max_abs_difference);
  return "the difference overflowed the largest double";
}

// The decay's share of the arithmetic floor of gradients (docs/budgets.md, "Gradients"), in
// units of M: alpha_t = exp(g_t) evaluated in fp32 is off by a relative sigma_t = u (s_exp +
// s_g |g_t|), and that one factor scales every term flowing back through token t (dS, so dh0
// and the earlier tokens' gradients). s_exp = 2: an fp32 exp within 2 ulp (CUDA's expf; libm's
// is within 1). s_g = 3 for fused gates, g = -exp(A_log) softplus(a + dt_bias) in fp32 (the
// exp, the softplus and the product, each within about an ulp of g, so about |g| u each in
// absolute terms), 0 where g is given (an exact input). Along a sequence the tokens' factors
// add in energy; the worst (sequence, value head) is taken. Tokens whose alpha underflows fp32
// (g < -87) or resets (alpha = 0) carry nothing further and are left out.
double decay_sigma(const Problem& problem, const Inputs& inputs) {
  const double u = unit_roundoff(DType::f32);
  const double s_g = problem.gate_mode == GateMode::fused ? 3.0 : 0.0;
  double worst = 0;
  for (int n = 0; n < problem.N(); ++n)
    for (int j = 0; j < problem.HV; ++j) {
      double energy = 0;
      for (std::int64_t t = problem.seq_begin(n); t < problem.seq_begin(n) + problem.seq_len(n); ++t) {
        double g = 0, beta = 0;
        reference::load_gates<double>(problem, inputs, t, j, &g, &beta);
        if (!std::isfinite(g) || g < -87.0) continue;
        const double sigma = u * (2.0 + s_g * std::fabs(g));
        energy += sigma * sigma;
      }
      worst = std::max(worst, std::sqrt(energy));
    }
  return worst;
}

std::int64_t longest_sequence(const Problem& problem) {
  std::int64_t L = 0;
  for (int n = 0; n < problem.N(); ++n) L = std::max(L, problem.seq_len(n));
  return L;
}

}  // namespace

bool is_gradient(OutputTensor tensor) {
  for (OutputTensor t : kAllGradients)
    if (t == tensor) return true;
  return false;
}

std::vector<OutputTensor> gradient_tensors(const Problem& problem) {
  std::vector<OutputTensor> t{OutputTensor::dq, OutputTensor::dk, OutputTensor::dv};
  if (problem.gate_mode == GateMode::direct) {
    t.push_back(OutputTensor::dg);
    t.push_back(OutputTensor::dbeta);
  } else {
    t.push_back(OutputTensor::da);
    t.push_back(OutputTensor::db);
    t.push_back(OutputTensor::dA_log);
    t.push_back(OutputTensor::ddt_bias);
  }
  if (problem.has_h0) t.push_back(OutputTensor::dh0);
  return t;
}

HostTensor<double>& gradient_of(Gradients<double>& g, OutputTensor tensor) {
  switch (tensor) {
    case OutputTensor::dq: return g.dq;
    case OutputTensor::dk: return g.dk;
    case OutputTensor::dv: return g.dv;
    case OutputTensor::dg: return g.dg;
    case OutputTensor::dbeta: return g.dbeta;
    case OutputTensor::da: return g.da;
    case OutputTensor::db: return g.db;
    case OutputTensor::dA_log: return g.dA_log;
    case OutputTensor::ddt_bias: return g.ddt_bias;
    case OutputTensor::dh0: return g.dh0;
    default: break;
  }
  throw std::invalid_argument(std::string("oracle::gradient_of: ") + output_tensor_name(tensor) + " is not a gradient");
}

const HostTensor<double>& gradient_of(const Gradients<double>& g, OutputTensor tensor) {
  return gradient_of(const_cast<Gradients<double>&>(g), tensor);
}

void round_gradients(const Problem& problem, Gradients<double>& g) {
  for (OutputTensor t : kAllGradients) reference::round_in_place(output_dtype(problem, t), gradient_of(g, t));
}

Gradients<double> emulate_backward(const Problem& problem, const Inputs& inputs, const BackwardInputs& backward,
                                   Formulation formulation, int chunk_size) {
  const Gradients<float> fp32 = formulation == Formulation::sequential
                                    ? reference::sequential_backward<float>(problem, inputs, backward)
                                    : reference::chunked_backward<float>(problem, inputs, backward, chunk_size);
  Gradients<double> out = fp32.cast<double>();
  round_gradients(problem, out);
  return out;
}

reference::BackwardProducts operand_products(DType input_dtype) {
  switch (input_dtype) {
    case DType::bf16: return reference::BackwardProducts::bf16;
    case DType::f16: return reference::BackwardProducts::f16;
    default: return reference::BackwardProducts::fp32;
  }
}

Gradients<double> emulate_backward_operands(const Problem& problem, const Inputs& inputs,
                                            const BackwardInputs& backward, int chunk_size) {
  Gradients<double> out = reference::chunked_backward_products(problem, inputs, backward, chunk_size,
                                                               operand_products(problem.input_dtype))
                              .cast<double>();
  round_gradients(problem, out);
  return out;
}

ExactGradients exact_gradients(const Problem& problem, const Inputs& inputs, const BackwardInputs& backward,
                               bool long_double) {
  ExactGradients e;
  if (long_double) {
    Gradients<long double> m;
    e.value = reference::sequential_backward<long double>(problem, inputs, backward, &m).cast<double>();
    e.magnitudes = m.cast<double>();
  } else {
    e.value = reference::sequential_backward<double>(problem, inputs, backward, &e.magnitudes);
  }
  return e;
}

double term_scale(const HostTensor<double>& magnitudes) {
  double M = 0;
  for (std::int64_t i = 0; i < magnitudes.numel(); ++i) {
    const double x = magnitudes[i];
    if (std::isnan(x)) return x;
    M = std::max(M, std::fabs(x));
  }
  return M;
}

double fixed_gradient_threshold(const BudgetOptions& options, OutputTensor tensor) {
  if (options.fixed_rel_rms) return *options.fixed_rel_rms;
  // fla's tests (tests/ops/test_gated_delta.py, test_chunk): dq, dk, dv, dh0 at 0.008, db and
  // dg at 0.02 (ratio of RMS errors); the fused gates' gradients go with the gates.
  return is_gate_gradient(tensor) ? 0.02 : 0.008;
}

bool backward_in_scope(const Problem& problem, std::string* why) {
  const char* rule = nullptr;
  if (problem.uses_state_cache())
    rule = "state_slots: the backward covers dense states only (a state cache is an inference option)";
  else if (problem.store_intermediate_states)
    rule = "store_intermediate_states: the backward does not differentiate per-token states";
  else if (problem.state_dtype != DType::f32)
    rule = "state_dtype: the backward covers fp32 states only";
  else if (problem.linear_gates())
    rule = "gate_space: the backward differentiates log-space gates only";
  if (rule && why) *why = rule;
  return rule == nullptr;
}

void validate_backward_inputs(const Problem& problem, const Inputs& inputs, const BackwardInputs& backward) {
  reference::validate_backward(problem, inputs, backward);
  auto exact_in = [](const char* name, const HostTensor<double>& t, DType dtype) {
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      const double x = t[i];
      if (std::isfinite(x) && reference::round_to(dtype, x) != x)
        throw ProblemError(name, std::string("must hold values exactly representable in ") + dtype_name(dtype) +
                                     " (its storage dtype, §6-§7); element " + index_string(t.shape(), i) + " is " +
                                     sci(x) + " (round it first)");
    }
  };
  exact_in("dO", backward.dO, problem.input_dtype);
  if (backward.dhT.defined()) exact_in("dhT", backward.dhT, DType::f32);
}

Verdict judge_gradients(const Problem& problem, const Inputs& inputs, const ExactGradients& exact,
                        const Gradients<double>& actual, const Gradients<double>* baseline, Formulation formulation,
                        int chunk_size, const BudgetOptions& options) {
  Verdict v;
  v.problem = problem.describe();
  v.budget = options.describe();
  if (options.model == BudgetModel::calibrated && !baseline)
    throw std::invalid_argument("oracle::judge_gradients: the calibrated budget needs the emulation's gradients");
  if (options.model == BudgetModel::calibrated && options.baseline != BudgetBaseline::emulation &&
      formulation != Formulation::chunked)
    throw std::invalid_argument("oracle::judge_gradients: the backward's operand model is of the chunked form; a "
                                "sequential formulation is judged on the emulation (gradient_budget)");
  if (options.model == BudgetModel::analytic && formulation == Formulation::chunked && chunk_size < 1)
    throw std::invalid_argument("oracle::judge_gradients: the analytic budget of a chunked formulation needs its chunk size");
  const std::vector<OutputTensor> expected = gradient_tensors(problem);
  for (OutputTensor t : kAllGradients) {
    const bool wanted = std::find(expected.begin(), expected.end(), t) != expected.end();
    const HostTensor<double>& x = gradient_of(actual, t);
    if (!wanted && x.defined()) {
      v.status = Status::error;
      v.message = std::string("gradient '") + output_tensor_name(t) +
                  "' was given but the problem has no such input (its gradients: " + names_of(expected) + ")";
      return v;
    }
    if (wanted && x.shape() != output_shape(problem, t)) {
      v.status = Status::error;
      v.message = std::string("gradient '") + output_tensor_name(t) + "' has shape " +
                  (x.defined() ? shape_string(x.shape()) : std::string("(missing)")) + ", expected " +
                  shape_string(output_shape(problem, t));
      return v;
    }
  }
  std::vector<std::string> notes;
  auto note = [&notes](const std::string& text) {
    if (std::find(notes.begin(), notes.end(), text) == notes.end()) notes.push_back(text);
  };
  const double analytic_rel =
      options.model == BudgetModel::analytic
          ? analytic_relative_bound(problem, inputs, formulation, chunk_size, options.analytic_long_double)
          : 0.0;
  for (OutputTensor tensor : expected) {
    const char* name = output_tensor_name(tensor);
    const HostTensor<double>& E = gradient_of(exact.value, tensor);
    const HostTensor<double>& x = gradient_of(actual, tensor);
    const TensorMetrics m = compare(problem, &inputs, tensor, E, x);
    v.metrics.push_back(m);
    const bool uses_terms = options.model == BudgetModel::calibrated || options.model == BudgetModel::analytic;
    const double M = uses_terms ? term_scale(gradient_of(exact.magnitudes, tensor)) : 0.0;
    const std::string per_M = " of M = " + sci(M) + " (largest term magnitude of " + name + ")";
    switch (options.model) {
      case BudgetModel::calibrated: {
        const HostTensor<double>& B = gradient_of(*baseline, tensor);
        const TensorMetrics b = compare(problem, &inputs, tensor, E, B);
        v.baseline_metrics.push_back(b);
        const DType floor_dtype = tensor == OutputTensor::dh0 && options.state_unit_input &&
                                          (problem.input_dtype == DType::bf16 || problem.input_dtype == DType::f16)
                                      ? problem.input_dtype
                                      : output_dtype(problem, tensor);
        // The floor: floor_units ulps of the storage dtype at max |exact| (the forward's max_abs
        // floor), in units of M. One rounding flip of the largest element costs one ulp; the
        // ulp, not u, also covers gradients in the subnormal range of fp16 and bf16.
        const double largest = max_abs(E);
        const double floor = M > 0 && std::isfinite(M) ? options.floor_units * ulp_of(floor_dtype, largest) / M : 0.0;
        const double d = difference(E, x).max_abs;
        const double d_emulation = difference(E, B).max_abs;
        const double error = relative_to_terms(d, M);
        const double emulation = relative_to_terms(d_emulation, M);
        std::string basis;
        double budget = floor;
        if (std::isfinite(emulation)) {
          budget += options.factor * emulation;
          basis = compact(options.factor) + " x " + sci(emulation) +
                  (options.baseline == BudgetBaseline::emulation
                       ? std::string(" (emulation) + ")
                       : std::string(" (emulation, operands single: products in ") +
                             dtype_name(problem.input_dtype) + ") + ");
        } else {
          // As in the forward: an emulation that is not finite says nothing about what the
          // precision achieves, and factor x inf would pass anything. Its term is dropped.
          const std::string why = "the emulation's error is " + sci(emulation) + ": " +
                                  terms_diagnosis(b, d_emulation, M);
          basis = why + "; its term dropped; ";
          note(std::string(name) + ": " + why + "; its term is dropped, the budget is the floor alone");
        }
        basis += sci(floor) + " (" + compact(options.floor_units) + " ulp " + dtype_name(floor_dtype) +
                 " at max|exact|)";
        Check check = make_check(tensor, "rel_terms", error, budget, basis + "," + per_M, terms_diagnosis(m, d, M));
        if (!check.pass && std::isfinite(error) && std::isfinite(budget) && options.arithmetic_units > 0) {
          // The arithmetic floor of gradients (docs/budgets.md, "Gradients"): the emulation is one
          // draw of an fp32 rounding error, and on a tensor of few elements (dh0 of a K = V = 1
          // head, dA_log of one head) a correct fp32 backward in another order lands at any
          // multiple of it. The probabilistic model of one element's error, independent
          // roundings adding in energy along the reverse sweep (L + 1 steps of K- and V-term
          // reductions), is u_f32 sqrt((L + 1)(K + V)) of M; it enters with arith standard
          // deviations and the weight of a maximum over n elements, 1 / sqrt(1 + 2 ln n), and
          // only into a check that fails without it.
          // The decays' share (decay_sigma) is one factor per token shared by every element
          // it scales: it enters with arith standard deviations and no maximum-over-n weight.
          const double L = static_cast<double>(longest_sequence(problem));
          const double n = static_cast<double>(std::max<std::int64_t>(E.numel(), 1));
          const double model = unit_roundoff(DType::f32) * std::sqrt((L + 1) * (problem.K + problem.V));
          const double decay = decay_sigma(problem, inputs);
          const double arith = options.arithmetic_units * model / std::sqrt(1 + 2 * std::log(n));
          const double arith_decay = options.arithmetic_units * decay;
          check = make_check(tensor, "rel_terms", error, budget + arith + arith_decay,
                             basis + " + " + sci(arith) + " (arithmetic floor: " + compact(options.arithmetic_units) +
                                 " x u f32 sqrt((L+1)(K+V)) / sqrt(1 + 2 ln n), L = " + compact(L) + ", n = " +
                                 compact(n) + ") + " + sci(arith_decay) + " (the decays: " +
                                 compact(options.arithmetic_units) + " x sqrt(sum_t (u (2 + s_g |g_t|))^2), s_g = " +
                                 (problem.gate_mode == GateMode::fused ? "3" : "0") + ")," + per_M,
                             terms_diagnosis(m, d, M));
        }
        v.checks.push_back(check);
        break;
      }
      case BudgetModel::analytic: {
        const double d = difference(E, x).max_abs;
        v.checks.push_back(make_check(tensor, "rel_terms", relative_to_terms(d, M), analytic_rel,
                                      std::string("u (64 sqrt((L+1)(K+V)) + 16 Gamma_C), u = ") +
                                          (options.analytic_long_double ? "2^-64" : "2^-53") + "," + per_M,
                                      terms_diagnosis(m, d, M)));
        break;
      }
      case BudgetModel::fixed: {
        const double threshold = fixed_gradient_threshold(options, tensor);
        const std::string basis = options.fixed_rel_rms ? std::string("fixed")
                                  : is_gate_gradient(tensor) ? std::string("fixed, fla's gate gradients")
                                                             : std::string("fixed, fla's dq/dk/dv/dh0");
        const std::string why = m.nonfinite_mismatches > 0 ? terms_diagnosis(m, 0, 1)
                                : m.rms_ref == 0 ? std::string("relative to an exact ") + name + " that is all zero"
                                                 : std::string("the difference overflowed the largest double");
        if (options.fixed_abs_rms > 0)
          v.checks.push_back(make_check(tensor, "rms_error", m.rms_error, threshold * m.rms_ref + options.fixed_abs_rms,
                                        basis + ": " + sci(threshold) + " x rms(ref) " + sci(m.rms_ref) + " + " +
                                            sci(options.fixed_abs_rms),
                                        why));
        else
          v.checks.push_back(make_check(tensor, "rel_rms", m.rel_rms, threshold, basis, why));
        v.checks.push_back(make_check(tensor, "nonfinite", double(m.nonfinite_mismatches), 0.0, "none allowed"));
        break;
      }
      case BudgetModel::bitwise:
        v.checks.push_back(make_check(tensor, "mismatches", double(m.mismatches), 0.0, "bit for bit"));
        break;
    }
    // The oracle must be finite (the forward's rule): a result that reproduces a non-finite
    // exact gradient has no error by the metrics, yet nothing was checked. Likewise the term
    // magnitudes the calibrated and analytic errors are measured in.
    if (options.model != BudgetModel::bitwise) {
      std::string why;
      if (m.ref_nan_count + m.ref_inf_count > 0)
        why = "the exact gradient is not finite: " + std::to_string(m.ref_nan_count) + " NaN, " +
              std::to_string(m.ref_inf_count) + " inf elements of " + name +
              " (the oracle overflowed, or a NaN reached it): nothing can be judged against it";
      else if (uses_terms && !std::isfinite(M))
        why = std::string("the term magnitudes of ") + name + " are not finite: nothing can be measured against them";
      if (!why.empty()) {
        v.checks.push_back(unjudgeable_check(tensor, 1.0, why));
        note(std::string(name) + ": " + why);
      }
    }
  }
  finish_verdict(v, std::move(notes));
  return v;
}

BackwardContext::BackwardContext(std::string name, Problem problem, Inputs inputs, BackwardInputs backward,
                                 Oracle oracle)
    : name_(std::move(name)),
      problem_(std::move(problem)),
      inputs_(std::move(inputs)),
      backward_(std::move(backward)),
      oracle_(oracle) {
  validate_backward_inputs(problem_, inputs_, backward_);
}

const ExactGradients& BackwardContext::exact() {
  if (!exact_) exact_ = exact_gradients(problem_, inputs_, backward_, oracle_ == Oracle::f80);
  return *exact_;
}

const Gradients<double>& BackwardContext::baseline(const BudgetOptions& options, Formulation formulation,
                                                  int chunk_size) {
  if (options.baseline == BudgetBaseline::emulation) return emulation(formulation, chunk_size);
  if (formulation != Formulation::chunked || chunk_size < 1)
    throw std::invalid_argument("oracle::BackwardContext: the operand baseline needs a chunked formulation with "
                                "chunk_size >= 1");
  auto it = operand_models_.find(chunk_size);
  if (it == operand_models_.end())
    it = operand_models_.emplace(chunk_size, emulate_backward_operands(problem_, inputs_, backward_, chunk_size)).first;
  return it->second;
}

const Gradients<double>& BackwardContext::emulation(Formulation formulation, int chunk_size) {
  if (formulation == Formulation::chunked && chunk_size < 1)
    throw std::invalid_argument("oracle::BackwardContext: a chunked formulation needs chunk_size >= 1");
  const int key = formulation == Formulation::sequential ? 0 : chunk_size;
  auto it = emulations_.find(key);
  if (it == emulations_.end())
    it = emulations_.emplace(key, emulate_backward(problem_, inputs_, backward_, formulation, chunk_size)).first;
  return it->second;
}

Verdict evaluate_gradients(const std::string& implementation, Formulation formulation, int chunk_size,
                           BackwardContext& context, const Gradients<double>& actual, const BudgetOptions& options,
                           const Gradients<double>* first) {
  Verdict v;
  if (options.model == BudgetModel::bitwise) {
    if (!first) throw std::invalid_argument("oracle::evaluate_gradients: bitwise needs the first run");
    ExactGradients runs;
    runs.value = *first;
    v = judge_gradients(context.problem(), context.inputs(), runs, actual, nullptr, formulation, chunk_size, options);
  } else {
    std::string note;
    const BudgetOptions used = gradient_budget(options, formulation, &note);
    const Gradients<double>* baseline =
        used.model == BudgetModel::calibrated ? &context.baseline(used, formulation, chunk_size) : nullptr;
    v = judge_gradients(context.problem(), context.inputs(), context.exact(), actual, baseline, formulation, chunk_size,
                        used);
    if (!note.empty()) v.message = note + (v.message.empty() ? "" : "; " + v.message);
  }
  v.case_name = context.name();
  v.implementation = implementation;
  return v;
}

Verdict evaluate_backward(const std::string& implementation, Formulation formulation, int chunk_size,
                          const BackwardRun& run, BackwardContext& context, const BudgetOptions& options,
                          Gradients<double>* actual_out) {
  Verdict v;
  try {
    const auto start = std::chrono::steady_clock::now();
    Gradients<double> actual = run(context.problem(), context.inputs(), context.backward());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (options.model == BudgetModel::bitwise) {
      const Gradients<double> again = run(context.problem(), context.inputs(), context.backward());
      v = evaluate_gradients(implementation, formulation, chunk_size, context, again, options, &actual);
      v.message = "run twice, compared bit for bit" + (v.message.empty() ? std::string() : "; " + v.message);
    } else {
      v = evaluate_gradients(implementation, formulation, chunk_size, context, actual, options);
    }
    v.seconds = seconds;
    if (actual_out) *actual_out = std::move(actual);
  } catch (const std::exception& e) {
    v = Verdict{};
    v.problem = context.problem().describe();
    v.budget = options.describe();
    v.status = Status::error;
    v.message = std::string("threw: ") + e.what();
  }
  v.case_name = context.name();
  v.implementation = implementation;
  return v;
}

Verdict evaluate_backward(Implementation& implementation, BackwardContext& context, const BudgetOptions& options,
                          Gradients<double>* actual_out) {
  const std::string name = implementation.name();
  auto skipped = [&](const std::string& why) {
    Verdict v;
    v.case_name = context.name();
    v.implementation = name;
    v.problem = context.problem().describe();
    v.budget = options.describe();
    v.status = Status::skipped;
    v.message = why;
    return v;
  };
  std::string why;
  if (!implementation.available(&why)) return skipped("not available: " + why);
  if (!implementation.has_backward()) return skipped("no backward: " + name + " implements the forward only");
  if (!backward_in_scope(context.problem(), &why)) return skipped("outside the backward's scope: " + why);
  if (!implementation.supports_backward(context.problem(), &why)) return skipped("backward unsupported: " + why);
  const BackwardRun run = [&implementation](const Problem& p, const Inputs& in, const BackwardInputs& b) {
    return implementation.backward(p, in, b);
  };
  return evaluate_backward(name, implementation.backward_formulation(), implementation.chunk_size(), run, context,
                           options, actual_out);
}

BudgetOptions gradient_budget(const BudgetOptions& options, Formulation formulation, std::string* note) {
  BudgetOptions b = options;
  if (b.model == BudgetModel::calibrated && b.baseline != BudgetBaseline::emulation &&
      formulation != Formulation::chunked) {
    b.baseline = BudgetBaseline::emulation;
    if (note)
      *note = "gradients: the operand model is of the chunked form; this sequential backward is judged with " +
              b.describe();
  }
  return b;
}

Verdict judge_backward(const Problem& problem, const Inputs& inputs, const BackwardInputs& backward,
                       const Gradients<double>& actual, Formulation formulation, int chunk_size,
                       const BudgetOptions& options) {
  BackwardContext context("", problem, inputs, backward);
  if (options.model == BudgetModel::bitwise)
    throw std::invalid_argument("oracle::judge_backward: bitwise compares two runs (evaluate_backward runs them)");
  return evaluate_gradients("", formulation, chunk_size, context, actual, options);
}

}  // namespace gdn::oracle
