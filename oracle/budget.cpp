#include "oracle/budget.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "oracle/arithmetic_floor.hpp"
#include "reference/operand_model.hpp"
#include "reference/prepare.hpp"
#include "reference/emulate.hpp"
#include "reference/sequential.hpp"

namespace gdn::oracle {

const char* budget_model_name(BudgetModel model) {
  switch (model) {
    case BudgetModel::calibrated: return "calibrated";
    case BudgetModel::fixed: return "fixed";
    case BudgetModel::bitwise: return "bitwise";
    case BudgetModel::analytic: return "analytic";
  }
  return "?";
}

bool parse_budget_model(const std::string& text, BudgetModel* out) {
  for (BudgetModel m : {BudgetModel::calibrated, BudgetModel::fixed, BudgetModel::bitwise, BudgetModel::analytic})
    if (text == budget_model_name(m)) {
      *out = m;
      return true;
    }
  return false;
}

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

}  // namespace

std::string BudgetOptions::describe() const {
  switch (model) {
    case BudgetModel::calibrated: {
      std::string params;
      if (factor != 2.0) params += ",factor=" + compact(factor);
      if (floor_units != 1.0) params += ",floor=" + compact(floor_units);
      if (arithmetic_units != 4.0) params += ",arith=" + compact(arithmetic_units);
      if (state_unit_input) params += ",state_unit=input";
      if (baseline == BudgetBaseline::operands_single) params += ",baseline=operands_single";
      if (baseline == BudgetBaseline::operands_single_qk) params += ",baseline=operands_single_qk";
      return params.empty() ? "calibrated" : "calibrated(" + params.substr(1) + ")";
    }
    case BudgetModel::fixed: {
      const std::string abs = fixed_abs_rms > 0 ? ",abs=" + compact(fixed_abs_rms) : "";
      if (fixed_rel_rms) return "fixed(rel_rms=" + compact(*fixed_rel_rms) + abs + ")";
      if (fixed_rel_rms_chunked == 0.005 && fixed_rel_rms_recurrent == 0.002)
        return abs.empty() ? "fixed" : "fixed(" + abs.substr(1) + ")";
      return "fixed(chunked=" + compact(fixed_rel_rms_chunked) + ",recurrent=" + compact(fixed_rel_rms_recurrent) + abs + ")";
    }
    case BudgetModel::bitwise: return "bitwise";
    case BudgetModel::analytic: return analytic_long_double ? "analytic(precision=f80)" : "analytic";
  }
  return "?";
}

bool parse_budget(const std::string& text, BudgetOptions* out, std::string* error) {
  static const std::regex form(R"(^([a-z]+)(\((.*)\))?$)");
  std::smatch match;
  if (!std::regex_match(text, match, form)) {
    *error = "budget '" + text + "' is not NAME or NAME(key=value,...)";
    return false;
  }
  BudgetOptions options;
  if (!parse_budget_model(match[1].str(), &options.model)) {
    *error = "budget model must be calibrated, fixed or bitwise, got '" + match[1].str() + "'";
    return false;
  }
  std::stringstream params(match[3].str());
  std::string item;
  while (std::getline(params, item, ',')) {
    if (item.empty()) continue;
    const auto eq = item.find('=');
    if (eq == std::string::npos) {
      *error = "budget parameter '" + item + "' is not key=value";
      return false;
    }
    const std::string key = item.substr(0, eq);
    if (options.model == BudgetModel::calibrated && key == "state_unit") {
      const std::string unit = item.substr(eq + 1);
      if (unit != "input" && unit != "output") {
        *error = "budget parameter 'state_unit' must be input or output, got '" + unit + "'";
        return false;
      }
      options.state_unit_input = unit == "input";
      continue;
    }
    if (options.model == BudgetModel::analytic && key == "precision") {
      const std::string name = item.substr(eq + 1);
      if (name != "f64" && name != "f80") {
        *error = "budget parameter 'precision' must be f64 or f80, got '" + name + "'";
        return false;
      }
      options.analytic_long_double = name == "f80";
      continue;
    }
    if (options.model == BudgetModel::calibrated && key == "baseline") {
      const std::string name = item.substr(eq + 1);
      if (name != "emulation" && name != "operands_single" && name != "operands_single_qk") {
        *error = "budget parameter 'baseline' must be emulation, operands_single or operands_single_qk, got '" + name + "'";
        return false;
      }
      options.baseline = name == "emulation"         ? BudgetBaseline::emulation
                         : name == "operands_single" ? BudgetBaseline::operands_single
                                                     : BudgetBaseline::operands_single_qk;
      continue;
    }
    double value = 0;
    try {
      std::size_t used = 0;
      value = std::stod(item.substr(eq + 1), &used);
      if (used != item.size() - eq - 1) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      *error = "budget parameter '" + key + "' needs a number, got '" + item.substr(eq + 1) + "'";
      return false;
    }
    if (!(value >= 0) || !std::isfinite(value)) {
      *error = "budget parameter '" + key + "' must be finite and >= 0";
      return false;
    }
    if (options.model == BudgetModel::calibrated && key == "factor") options.factor = value;
    else if (options.model == BudgetModel::calibrated && key == "floor") options.floor_units = value;
    else if (options.model == BudgetModel::calibrated && key == "arith") options.arithmetic_units = value;
    else if (options.model == BudgetModel::fixed && key == "rel_rms") options.fixed_rel_rms = value;
    else if (options.model == BudgetModel::fixed && key == "chunked") options.fixed_rel_rms_chunked = value;
    else if (options.model == BudgetModel::fixed && key == "recurrent") options.fixed_rel_rms_recurrent = value;
    else if (options.model == BudgetModel::fixed && key == "abs") options.fixed_abs_rms = value;
    else {
      *error = "budget " + std::string(budget_model_name(options.model)) + " has no parameter '" + key + "'";
      return false;
    }
  }
  *out = options;
  return true;
}

const char* status_name(Status status) {
  switch (status) {
    case Status::pass: return "PASS";
    case Status::fail: return "FAIL";
    case Status::skipped: return "SKIPPED";
    case Status::error: return "ERROR";
  }
  return "?";
}

const Check* Verdict::worst_check() const {
  const Check* worst = nullptr;
  for (const Check& c : checks)
    if (!worst || c.margin > worst->margin || (std::isnan(c.margin) && !std::isnan(worst->margin))) worst = &c;
  return worst;
}

double Verdict::worst_margin() const {
  const Check* c = worst_check();
  return c ? c->margin : 0.0;
}

std::string Verdict::summary() const {
  std::ostringstream s;
  s << status_name(status) << "  " << implementation << "  " << case_name;
  if (const Check* c = worst_check())
    s << "  worst " << output_tensor_name(c->tensor) << "." << c->metric << " " << sci(c->error) << " / "
      << sci(c->budget) << " = margin " << sci(c->margin);
  if (!message.empty()) s << "  (" << message << ")";
  return s.str();
}

std::string Verdict::details() const {
  std::ostringstream s;
  s << summary() << "\n  problem: " << problem << "\n  budget: " << budget << "\n";
  for (const Check& c : checks)
    s << "  " << (c.pass ? "ok   " : "OVER ") << output_tensor_name(c.tensor) << "." << c.metric << "  error "
      << sci(c.error) << "  budget " << sci(c.budget) << "  margin " << sci(c.margin) << "  [" << c.basis << "]\n";
  for (const TensorMetrics& m : metrics) {
    s << "  " << output_tensor_name(m.tensor) << " (" << dtype_name(m.dtype) << ", " << m.count
      << " elements): max_abs " << sci(m.max_abs_error) << "  rel_rms " << sci(m.rel_rms) << "  max_rel "
      << sci(m.max_rel_error) << "  max_ulp " << sci(m.max_ulp) << "  mismatches " << m.mismatches
      << "  nan " << m.nan_count << "  inf " << m.inf_count;
    if (m.worst.flat >= 0)
      s << "\n    worst at " << m.worst.describe() << ": reference " << m.worst_ref << ", got " << m.worst_value;
    s << "\n";
  }
  return s.str();
}

std::ostream& operator<<(std::ostream& out, const Verdict& verdict) { return out << verdict.details(); }

namespace {
nlohmann::json number(double x) {
  if (std::isfinite(x)) return x;
  if (std::isnan(x)) return "nan";
  return x > 0 ? "inf" : "-inf";
}
}  // namespace

// A check whose error or budget is not a finite number (or whose budget is negative) never
// passes, whatever the other number is: an infinite budget would pass any output, a NaN makes
// every comparison meaningless, and inf / inf is NaN. Its margin is +inf and its basis says
// which number is not finite and why (`error_why`, `budget_why`: the judge's diagnosis, e.g.
// "3 elements of o are NaN ..."), before how the budget was formed.
Check make_check(OutputTensor tensor, std::string metric, double error, double budget, std::string basis,
                 const std::string& error_why, const std::string& budget_why) {
  Check c;
  c.tensor = tensor;
  c.metric = std::move(metric);
  c.error = error;
  c.budget = budget;
  const bool error_finite = std::isfinite(error);
  const bool budget_finite = std::isfinite(budget) && budget >= 0;
  if (error_finite && budget_finite) {
    c.margin = error == 0 ? 0.0 : (budget == 0 ? INFINITY : error / budget);
    c.pass = c.margin <= 1.0;
    c.basis = std::move(basis);
    return c;
  }
  std::string why;
  if (!error_finite) why = "error is " + sci(error) + (error_why.empty() ? "" : ": " + error_why);
  if (!budget_finite) {
    if (!why.empty()) why += "; ";
    why += (std::isfinite(budget) ? "budget is negative" : "budget not finite") +
           (budget_why.empty() ? std::string() : ": " + budget_why);
  }
  c.margin = INFINITY;
  c.pass = false;
  c.basis = why + " (never passes); budget: " + basis;
  return c;
}

namespace {

Allowance allowance_of(const BudgetOptions& options, const Problem& problem, const Inputs& inputs,
                       const Outputs<double>& exact, Formulation formulation, int chunk_size);

std::string elements(std::int64_t count) {
  return std::to_string(count) + (count == 1 ? " element" : " elements");
}

// "2 elements of o (1 NaN, 1 inf in o)": the non-finite mismatches of a comparison.
std::string nonfinite_mismatches(const TensorMetrics& m) {
  const std::string name = output_tensor_name(m.tensor);
  return elements(m.nonfinite_mismatches) + " of " + name + " (" + std::to_string(m.nan_count) + " NaN, " +
         std::to_string(m.inf_count) + " inf in " + name + ")";
}

// Why a tensor's error metric is not finite, from its metrics.
std::string error_diagnosis(const TensorMetrics& m, const char* metric) {
  if (m.nonfinite_mismatches > 0)
    return "NaN or inf where the reference is finite (or unlike a non-finite reference): " + nonfinite_mismatches(m);
  if (std::string(metric) == "rel_rms" && m.rms_ref == 0)
    return std::string("relative to a reference ") + output_tensor_name(m.tensor) + " that is all zero";
  return "the difference overflowed the largest double";
}

// The count of non-finite elements of a tensor's exact reference, as words ("" when none).
std::string reference_diagnosis(const TensorMetrics& m) {
  if (m.ref_nan_count + m.ref_inf_count == 0) return "";
  const std::string name = output_tensor_name(m.tensor);
  return "the exact reference is not finite: " + std::to_string(m.ref_nan_count) + " NaN, " +
         std::to_string(m.ref_inf_count) + " inf elements of " + name +
         " (the oracle overflowed, or a NaN reached it): nothing can be judged against it";
}

const HostTensor<double>& tensor_of(const Outputs<double>& outputs, OutputTensor tensor) {
  switch (tensor) {
    case OutputTensor::o: return outputs.o;
    case OutputTensor::hT: return outputs.hT;
    case OutputTensor::intermediate: return outputs.intermediate;
    default: break;  // gradients are judged by oracle/backward_budget.hpp
  }
  throw std::logic_error(std::string("oracle::judge: ") + output_tensor_name(tensor) + " is not a forward output");
}

// The dtype of the calibrated budget's floor: one rounding of the dtype the output is stored in
// (o: the input dtype; states: the state dtype, which covers the storage rounding of a bf16 or
// fp16 state pool), or for states under state_unit=input the input dtype when that is coarser
// (docs/budgets.md, "(a) calibrated").
DType floor_dtype_of(const BudgetOptions& options, const Problem& problem, OutputTensor tensor) {
  const DType stored = output_dtype(problem, tensor);
  const bool state = tensor == OutputTensor::hT || tensor == OutputTensor::intermediate;
  const bool narrow_input = problem.input_dtype == DType::bf16 || problem.input_dtype == DType::f16;
  if (state && options.state_unit_input && narrow_input &&
      unit_roundoff(problem.input_dtype) > unit_roundoff(stored))
    return problem.input_dtype;
  return stored;
}

std::vector<OutputTensor> judged_tensors(const Problem& problem) {
  std::vector<OutputTensor> tensors{OutputTensor::o};
  if (problem.has_hT) tensors.push_back(OutputTensor::hT);
  if (problem.store_intermediate_states) tensors.push_back(OutputTensor::intermediate);
  return tensors;
}

}  // namespace

nlohmann::json to_json(const Check& c) {
  return {{"tensor", output_tensor_name(c.tensor)}, {"metric", c.metric}, {"error", number(c.error)},
          {"budget", number(c.budget)}, {"margin", number(c.margin)}, {"pass", c.pass}, {"basis", c.basis}};
}

nlohmann::json to_json(const Verdict& v) {
  nlohmann::json j = {{"case", v.case_name},
                      {"problem", v.problem},
                      {"implementation", v.implementation},
                      {"budget", v.budget},
                      {"status", status_name(v.status)},
                      {"message", v.message},
                      {"worst_margin", number(v.worst_margin())},
                      {"seconds", v.seconds}};
  j["checks"] = nlohmann::json::array();
  for (const Check& c : v.checks) j["checks"].push_back(to_json(c));
  j["metrics"] = nlohmann::json::array();
  for (const TensorMetrics& m : v.metrics) j["metrics"].push_back(to_json(m));
  j["baseline_metrics"] = nlohmann::json::array();
  for (const TensorMetrics& m : v.baseline_metrics) j["baseline_metrics"].push_back(to_json(m));
  return j;
}

Verdict judge(const Problem& problem, const Inputs* inputs, const Outputs<double>& reference,
              const Outputs<double>& actual, const Outputs<double>* baseline, Formulation formulation,
              const BudgetOptions& options, int chunk_size) {
  Verdict v;
  v.problem = problem.describe();
  v.budget = options.describe();
  if (options.model == BudgetModel::calibrated && !baseline)
    throw std::invalid_argument("oracle::judge: the calibrated budget needs the emulation's outputs");
  std::optional<Allowance> analytic;
  if (options.model == BudgetModel::analytic) {
    if (!inputs) throw std::invalid_argument("oracle::judge: the analytic budget needs the inputs");
    if (formulation == Formulation::chunked && chunk_size < 1)
      throw std::invalid_argument("oracle::judge: the analytic budget of a chunked formulation needs its chunk size");
    analytic = allowance_of(options, problem, *inputs, reference, formulation, chunk_size);
  }
  // What the verdict's message says beyond the checks: why a budget or an error is not finite.
  std::vector<std::string> notes;
  auto note = [&notes](const std::string& text) {
    if (std::find(notes.begin(), notes.end(), text) == notes.end()) notes.push_back(text);
  };
  // The arithmetic floor, computed at most once and only for a check that fails without it.
  std::optional<ArithmeticFloor> arithmetic;
  auto arithmetic_floor_of = [&]() -> const ArithmeticFloor* {
    if (!inputs || !(options.arithmetic_units > 0)) return nullptr;
    if (!arithmetic) arithmetic = arithmetic_floor(problem, *inputs, unit_roundoff(DType::f32), formulation, chunk_size);
    return &*arithmetic;
  };
  for (OutputTensor tensor : judged_tensors(problem)) {
    const char* name = output_tensor_name(tensor);
    const HostTensor<double>& x = tensor_of(actual, tensor);
    const Shape expected = output_shape(problem, tensor);
    if (x.shape() != expected) {
      v.status = Status::error;
      v.message = std::string("output '") + name + "' has shape " +
                  (x.defined() ? shape_string(x.shape()) : std::string("(missing)")) + ", expected " +
                  shape_string(expected);
      return v;
    }
    const TensorMetrics m = compare(problem, inputs, tensor, tensor_of(reference, tensor), x);
    v.metrics.push_back(m);
    switch (options.model) {
      case BudgetModel::calibrated: {
        const TensorMetrics b = compare(problem, inputs, tensor, tensor_of(reference, tensor), tensor_of(*baseline, tensor));
        v.baseline_metrics.push_back(b);
        const DType floor_dtype = floor_dtype_of(options, problem, tensor);
        const double rms_floor = options.floor_units * unit_roundoff(floor_dtype);
        const double abs_floor = options.floor_units * ulp_of(floor_dtype, m.max_abs_ref);
        const std::string units = compact(options.floor_units) + " u " + dtype_name(floor_dtype);
        const char* const baseline_name =
            options.baseline == BudgetBaseline::operands_single      ? " (emulation, operands single) + "
            : options.baseline == BudgetBaseline::operands_single_qk ? " (emulation, operands single, q k stored) + "
                                                                     : " (emulation) + ";
        // The emulation's term, factor x its error. Where that error is not finite (the
        // emulation overflowed or met a NaN; for rel_rms also a reference that is all zero) it
        // says nothing about what the precision achieves, and factor x inf would pass any
        // output: the term is dropped (which only lowers the budget) and the analysis-based
        // parts remain, the floor and, for a check that fails without it, the arithmetic floor
        // where its model applies (docs/budgets.md, "Non-finite errors and budgets").
        auto emulation_term = [&](double baseline_error, const char* metric, std::string* basis) {
          if (std::isfinite(baseline_error)) {
            *basis = compact(options.factor) + " x " + sci(baseline_error) + baseline_name;
            return options.factor * baseline_error;
          }
          const std::string why = b.nonfinite_mismatches > 0
                                      ? "the emulation is NaN or inf where the reference is finite: " +
                                            nonfinite_mismatches(b)
                                      : "the emulation's " + std::string(metric) + " is " + sci(baseline_error) +
                                            ": " + error_diagnosis(b, metric);
          *basis = why + "; its term dropped; ";
          note(std::string(name) + ": " + why + "; its term is dropped, the budget is the analysis-based part alone");
          return 0.0;
        };
        std::string rel_term, abs_term;
        const double rel_emulation = emulation_term(b.rel_rms, "rel_rms", &rel_term);
        const double abs_emulation = emulation_term(b.max_abs_error, "max_abs", &abs_term);
        Check rel = make_check(tensor, "rel_rms", m.rel_rms, rel_emulation + rms_floor,
                               rel_term + sci(rms_floor) + " (" + units + ")", error_diagnosis(m, "rel_rms"));
        Check abs = make_check(tensor, "max_abs", m.max_abs_error, abs_emulation + abs_floor,
                               abs_term + sci(abs_floor) + " (" + compact(options.floor_units) + " ulp " +
                                   dtype_name(floor_dtype) + " at max|ref|)",
                               error_diagnosis(m, "max_abs"));
        // A non-finite error or budget fails whatever is added: no floor is added to it.
        const bool rescue_rel = !rel.pass && std::isfinite(m.rel_rms) && std::isfinite(rel.budget);
        const bool rescue_abs = !abs.pass && std::isfinite(m.max_abs_error) && std::isfinite(abs.budget);
        if (rescue_rel || rescue_abs) {
          const ArithmeticFloor* a = arithmetic_floor_of();
          if (a && !a->applies()) {
            // The model describes an fp32 computation that stays finite: where that
            // computation overflows (or the model met a NaN) it bounds nothing.
            const std::string not_added = "; arithmetic floor not added: the fp32 computation it models " +
                                     (std::isfinite(a->largest) ? "reaches " + sci(a->largest) + " > " +
                                                                      sci(std::numeric_limits<float>::max()) +
                                                                      " (fp32 overflows)"
                                                                : std::string("is not finite"));
            if (rescue_rel) rel.basis += not_added;
            if (rescue_abs) abs.basis += not_added;
          } else if (a) {
            // The floor stands in for what one draw of the emulation's error cannot tell. Over
            // n independent draws the rms of a correct implementation's errors spreads by about
            // 1 / sqrt(2n) around its typical value, the max by about 1 / sqrt(2 ln n): the
            // modelled error enters the rms check with weight 1 / sqrt(n), the max check with
            // 1 / sqrt(1 + 2 ln n): in full for a one-element state, little where the
            // emulation's error is a good estimate. Independent roundings count the tensor's
            // elements; the shared errors (the decays', and the chunked form's intra-chunk dot
            // products') count (token, head) pairs for o, (sequence, head) pairs for hT
            // (docs/budgets.md).
            struct Part {
              double rms = 0, largest = 0;  // over all elements
              std::int64_t nonzero = 0;
            };
            auto summarize = [](const HostTensor<double>& f) {
              Part p;
              double sum_squares = 0;
              for (std::int64_t i = 0; i < f.numel(); ++i) {
                sum_squares += f.data()[i] * f.data()[i];
                p.largest = std::max(p.largest, f.data()[i]);
                p.nonzero += f.data()[i] > 0;
              }
              p.rms = std::sqrt(sum_squares / double(std::max<std::int64_t>(f.numel(), 1)));
              return p;
            };
            const Part own = summarize(tensor_of(a->independent, tensor));
            const Part gates = summarize(tensor_of(a->shared, tensor));
            const std::int64_t decay_draws = tensor == OutputTensor::hT ? a->shared_groups : a->shared_tokens;
            const double n_own = double(std::max<std::int64_t>(own.nonzero, 1));
            const double n_gates = double(std::max<std::int64_t>(decay_draws, 1));
            const double floor_rms =
                options.arithmetic_units * (own.rms / std::sqrt(n_own) + gates.rms / std::sqrt(n_gates));
            const double largest = options.arithmetic_units * (own.largest / std::sqrt(1 + 2 * std::log(n_own)) +
                                                               gates.largest / std::sqrt(1 + 2 * std::log(n_gates)));
            const std::string why = " (arithmetic floor: " + compact(options.arithmetic_units) +
                                    " x modelled fp32 rounding error over " + std::to_string(own.nonzero) +
                                    " elements and " + std::to_string(decay_draws) + " shared draws";
            // rel_rms is relative to rms(ref): the floor's rms over it. When ref is all 0 (and
            // the floor is not) that quotient is inf and would pass anything: it is not added,
            // and only the absolute check can say anything (rel_rms is then 0 or inf itself).
            if (rescue_rel) {
              if (floor_rms > 0 && !(m.rms_ref > 0))
                rel.basis += "; arithmetic floor not added: the reference is all zero (max_abs judges)";
              else if (std::isfinite(floor_rms))
                rel = make_check(tensor, "rel_rms", m.rel_rms, rel.budget + (floor_rms == 0 ? 0.0 : floor_rms / m.rms_ref),
                                 rel.basis + " + " + sci(floor_rms == 0 ? 0.0 : floor_rms / m.rms_ref) + why +
                                     ", rms / sqrt(n))",
                                 error_diagnosis(m, "rel_rms"));
            }
            if (rescue_abs && std::isfinite(largest))
              abs = make_check(tensor, "max_abs", m.max_abs_error, abs.budget + largest,
                               abs.basis + " + " + sci(largest) + why + ", max / sqrt(1 + 2 ln n))",
                               error_diagnosis(m, "max_abs"));
          }
        }
        v.checks.push_back(rel);
        v.checks.push_back(abs);
        break;
      }
      case BudgetModel::fixed: {
        const double threshold = options.fixed_rel_rms ? *options.fixed_rel_rms
                                 : formulation == Formulation::chunked ? options.fixed_rel_rms_chunked
                                                                       : options.fixed_rel_rms_recurrent;
        const std::string basis = options.fixed_rel_rms ? std::string("fixed")
                                  : formulation == Formulation::chunked ? std::string("fixed, chunked")
                                                                        : std::string("fixed, recurrent");
        if (options.fixed_abs_rms > 0) {
          v.checks.push_back(make_check(tensor, "rms_error", m.rms_error, threshold * m.rms_ref + options.fixed_abs_rms,
                                        basis + ": " + sci(threshold) + " x rms(ref) " + sci(m.rms_ref) + " + " +
                                            sci(options.fixed_abs_rms),
                                        error_diagnosis(m, "rms_error")));
        } else {
          v.checks.push_back(make_check(tensor, "rel_rms", m.rel_rms, threshold, basis, error_diagnosis(m, "rel_rms")));
        }
        // A fixed relative RMS says nothing about a few NaNs among many finite values: hold
        // non-finite mismatches to zero explicitly.
        v.checks.push_back(make_check(tensor, "nonfinite", double(m.nonfinite_mismatches), 0.0, "none allowed"));
        break;
      }
      case BudgetModel::bitwise:
        v.checks.push_back(make_check(tensor, "mismatches", double(m.mismatches), 0.0, "bit for bit"));
        break;
      case BudgetModel::analytic: {
        const double budget = tensor == OutputTensor::o    ? analytic->o
                              : tensor == OutputTensor::hT ? analytic->hT
                                                           : analytic->intermediate;
        v.checks.push_back(make_check(tensor, "max_abs", m.max_abs_error, budget,
                                      std::string("u (64 sqrt((L+1)(K+V)) + 16 Gamma_C) x max(max|ref|, magnitudes), u = ") +
                                          (options.analytic_long_double ? "2^-64" : "2^-53"),
                                      error_diagnosis(m, "max_abs"),
                                      "the magnitudes the inputs can reach (oracle::magnitudes) overflow double"));
        break;
      }
    }
    // The oracle itself must be finite: an output equal to a non-finite reference has no error
    // by the metrics, but nothing was checked. Not under bitwise, whose reference is another
    // run of the implementation (agreement, NaN equal to NaN, is all it judges).
    if (options.model != BudgetModel::bitwise) {
      const std::string why = reference_diagnosis(m);
      if (!why.empty()) {
        v.checks.push_back(unjudgeable_check(tensor, double(m.ref_nan_count + m.ref_inf_count), why));
        note(std::string(name) + ": " + why);
      }
    }
  }
  finish_verdict(v, std::move(notes));
  return v;
}

Check unjudgeable_check(OutputTensor tensor, double count, std::string why) {
  Check c = make_check(tensor, "reference", count, 0.0, std::move(why));
  c.margin = INFINITY;
  c.pass = false;
  return c;
}

void finish_verdict(Verdict& verdict, std::vector<std::string> notes) {
  bool pass = true;
  for (const Check& c : verdict.checks) {
    pass = pass && c.pass;
    if (!std::isfinite(c.error) || !std::isfinite(c.budget)) {
      const std::string text =
          std::string(output_tensor_name(c.tensor)) + ": " + c.basis.substr(0, c.basis.find(" (never passes)"));
      if (std::find(notes.begin(), notes.end(), text) == notes.end()) notes.push_back(text);
    }
  }
  verdict.status = pass ? Status::pass : Status::fail;
  for (const std::string& text : notes) verdict.message += (verdict.message.empty() ? "" : "; ") + text;
}

CaseContext::CaseContext(std::string name, Problem problem, Inputs inputs, Oracle oracle)
    : name_(std::move(name)), problem_(std::move(problem)), inputs_(std::move(inputs)), oracle_(oracle) {}

const Outputs<double>& CaseContext::exact() {
  if (!exact_)
    exact_ = oracle_ == Oracle::f64 ? reference::sequential<double>(problem_, inputs_)
                                    : reference::sequential<long double>(problem_, inputs_).cast<double>();
  return *exact_;
}

const Outputs<double>& CaseContext::baseline(const BudgetOptions& options, Formulation formulation, int chunk_size) {
  if (options.baseline == BudgetBaseline::emulation) return emulation(formulation, chunk_size);
  // The operand model is the chunked form at C = 64 with o and hT only.
  if (formulation != Formulation::chunked || chunk_size != 64 || problem_.store_intermediate_states)
    throw std::invalid_argument("budget baseline operands_single needs a chunked formulation at C = 64 without "
                                "intermediate states");
  const bool qk = options.baseline == BudgetBaseline::operands_single_qk;
  std::optional<Outputs<double>>& cached = qk ? operands_single_qk_ : operands_single_;
  if (!cached)
    cached = reference::emulate_operands(
        problem_, inputs_, qk ? reference::OperandRounding::single_qk : reference::OperandRounding::single);
  return *cached;
}

const Outputs<double>& CaseContext::emulation(Formulation formulation, int chunk_size) {
  if (problem_.store_intermediate_states) formulation = Formulation::sequential;
  const int key = formulation == Formulation::sequential ? 0 : chunk_size;
  auto it = emulations_.find(key);
  if (it == emulations_.end())
    it = emulations_.emplace(key, reference::emulate(problem_, inputs_, formulation, chunk_size)).first;
  return it->second;
}

namespace {
Verdict skipped(const std::string& implementation, const CaseContext& context, const BudgetOptions& options,
                std::string why) {
  Verdict v;
  v.case_name = context.name();
  v.problem = context.problem().describe();
  v.implementation = implementation;
  v.budget = options.describe();
  v.status = Status::skipped;
  v.message = std::move(why);
  return v;
}
}  // namespace

Verdict evaluate_outputs(const std::string& implementation_name, Formulation formulation, int chunk_size,
                         CaseContext& context, const Outputs<double>& actual, const BudgetOptions& options) {
  const Outputs<double>* baseline =
      options.model == BudgetModel::calibrated ? &context.baseline(options, formulation, chunk_size) : nullptr;
  Verdict v =
      judge(context.problem(), &context.inputs(), context.exact(), actual, baseline, formulation, options, chunk_size);
  v.case_name = context.name();
  v.implementation = implementation_name;
  return v;
}

Verdict evaluate(Implementation& implementation, CaseContext& context, const BudgetOptions& options,
                 Outputs<double>* actual_out) {
  const std::string name = implementation.name();
  std::string why;
  if (!implementation.available(&why)) return skipped(name, context, options, "not available: " + why);
  if (!implementation.supports(context.problem(), &why)) return skipped(name, context, options, "unsupported: " + why);
  Verdict v;
  try {
    const auto start = std::chrono::steady_clock::now();
    Outputs<double> actual = implementation.run(context.problem(), context.inputs());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (options.model == BudgetModel::bitwise) {
      const Outputs<double> again = implementation.run(context.problem(), context.inputs());
      v = judge(context.problem(), &context.inputs(), actual, again, nullptr, implementation.formulation(), options);
      v.message = "run twice, compared bit for bit";
    } else {
      v = evaluate_outputs(name, implementation.formulation(), implementation.chunk_size(), context, actual, options);
    }
    v.seconds = seconds;
    if (actual_out) *actual_out = std::move(actual);
  } catch (const std::exception& e) {
    v = skipped(name, context, options, std::string("threw: ") + e.what());
    v.status = Status::error;
  }
  v.case_name = context.name();
  v.implementation = name;
  return v;
}

// ---------------------------------------------------------------------------------------------
// The max-abs form of the budgets

double max_abs(const HostTensor<double>& tensor) {
  double m = 0;
  for (std::int64_t i = 0; i < tensor.numel(); ++i)
    if (std::isfinite(tensor[i])) m = std::max(m, std::fabs(tensor[i]));
  return m;
}

Difference difference(const HostTensor<double>& expected, const HostTensor<double>& actual) {
  Difference d;
  if (expected.shape() != actual.shape()) {
    d.max_abs = std::numeric_limits<double>::infinity();
    return d;
  }
  for (std::int64_t i = 0; i < expected.numel(); ++i) {
    const double e = expected[i], a = actual[i];
    double err;
    if (e == a) err = 0;  // also equal infinities; +0 == -0
    else if (std::isnan(e) && std::isnan(a)) err = 0;
    else if (!std::isfinite(a) || !std::isfinite(e)) err = std::numeric_limits<double>::infinity();
    else err = std::fabs(a - e);
    if (err > d.max_abs || d.worst < 0) {
      d.max_abs = err;
      d.worst = i;
      d.expected_at_worst = e;
      d.actual_at_worst = a;
    }
  }
  return d;
}

Allowance& Allowance::operator+=(const Allowance& other) {
  o += other.o;
  hT += other.hT;
  intermediate += other.intermediate;
  return *this;
}

namespace {
template <class Scalar>
double chunk_log_decay_in(const Problem& problem, const Inputs& inputs, int chunk_size) {
  Scalar largest = 0;
  const std::int64_t C = std::max(chunk_size, 1);
  for (int n = 0; n < problem.N(); ++n)
    for (int j = 0; j < problem.HV; ++j) {
      Scalar running = 0;
      for (std::int64_t i = 0; i < problem.seq_len(n); ++i) {
        if (i % C == 0) running = 0;
        const std::int64_t t = problem.seq_begin(n) + i;
        Scalar g, beta;
        reference::load_gates(problem, inputs, t, j, &g, &beta);
        if (std::exp(g) == 0) running = 0;
        else running += g;
        largest = std::max(largest, std::fabs(running));
      }
    }
  return static_cast<double>(largest);
}
}  // namespace

double chunk_log_decay(const Problem& problem, const Inputs& inputs, int chunk_size, bool long_double) {
  return long_double ? chunk_log_decay_in<long double>(problem, inputs, chunk_size)
                     : chunk_log_decay_in<double>(problem, inputs, chunk_size);
}

Allowance magnitudes(const Problem& problem, const Inputs& inputs) {
  Allowance m;
  const int K = problem.K, V = problem.V;
  const bool k_major = problem.state_layout == StateLayout::k_major;
  std::vector<double> M(static_cast<std::size_t>(V)), q(static_cast<std::size_t>(K)), k(q);
  for (int n = 0; n < problem.N(); ++n) {
    const std::int64_t row = problem.uses_state_cache() ? inputs.state_indices[static_cast<std::size_t>(n)] : n;
    if (row < 0) continue;
    for (int j = 0; j < problem.HV; ++j) {
      const int h = j / problem.group_size();
      for (int vv = 0; vv < V; ++vv) {
        double sum = 0;
        if (problem.has_h0) {
          const double* S0 = inputs.h0.data() + (row * problem.HV + j) * std::int64_t(K) * V;
          for (int kk = 0; kk < K; ++kk) {
            const double x = k_major ? S0[std::int64_t(kk) * V + vv] : S0[std::int64_t(vv) * K + kk];
            sum += x * x;
          }
        }
        M[static_cast<std::size_t>(vv)] = std::sqrt(sum);
      }
      for (std::int64_t t = problem.seq_begin(n); t < problem.seq_begin(n) + problem.seq_len(n); ++t) {
        reference::load_qk(problem, inputs, t, h, q.data(), k.data());
        double g, beta, qn = 0;
        reference::load_gates(problem, inputs, t, j, &g, &beta);
        for (double x : q) qn += x * x;
        qn = std::sqrt(qn);
        const double alpha = std::exp(g);
        for (int vv = 0; vv < V; ++vv) {
          double& bound = M[static_cast<std::size_t>(vv)];
          const double x = std::fabs(inputs.v[(t * problem.HV + j) * V + vv]);
          bound = beta <= 1 ? std::sqrt(alpha * alpha * bound * bound + x * x) : alpha * bound + beta * x;
          m.o = std::max(m.o, bound * qn);
          m.intermediate = std::max(m.intermediate, bound);
        }
      }
      for (double bound : M) m.hT = std::max(m.hT, bound);
    }
  }
  return m;
}

// The analytic model's coefficients, in units of u (docs/budgets.md, "(d) analytic").
constexpr double kAnalyticPerSqrtWork = 64;
constexpr double kAnalyticPerLogDecay = 16;

double analytic_relative_bound(const Problem& problem, const Inputs& inputs, Formulation formulation,
                               int chunk_size, bool long_double) {
  const double u = long_double ? 0x1p-64 : 0x1p-53;
  std::int64_t longest = 0;
  for (int n = 0; n < problem.N(); ++n) longest = std::max(longest, problem.seq_len(n));
  double bound = kAnalyticPerSqrtWork * u * std::sqrt(double(longest + 1) * (problem.K + problem.V));
  if (formulation == Formulation::chunked)
    bound += kAnalyticPerLogDecay * u * chunk_log_decay(problem, inputs, chunk_size, long_double);
  return bound;
}

namespace {
// The max-abs budget with non-finite parts left as they are (judge() reports them).
Allowance allowance_of(const BudgetOptions& options, const Problem& problem, const Inputs& inputs,
                       const Outputs<double>& exact, Formulation formulation, int chunk_size) {
  if (options.model == BudgetModel::bitwise) return {};
  if (options.model == BudgetModel::fixed)
    throw std::invalid_argument("oracle::max_abs_allowance: the fixed budget bounds an rms, no single element");
  const Allowance m = magnitudes(problem, inputs);
  Allowance scale;
  scale.o = std::max(max_abs(exact.o), m.o);
  scale.hT = std::max(max_abs(exact.hT), m.hT);
  scale.intermediate = std::max(max_abs(exact.intermediate), m.intermediate);
  Allowance a;
  if (options.model == BudgetModel::analytic) {
    const double relative =
        analytic_relative_bound(problem, inputs, formulation, chunk_size, options.analytic_long_double);
    a.o = scale.o * relative;
    a.hT = scale.hT * relative;
    a.intermediate = scale.intermediate * relative;
    return a;
  }
  // calibrated: the floor in the dtype judge() takes, plus factor x the baseline's error.
  a.o = scale.o * (options.floor_units * unit_roundoff(floor_dtype_of(options, problem, OutputTensor::o)));
  a.hT = scale.hT * (options.floor_units * unit_roundoff(floor_dtype_of(options, problem, OutputTensor::hT)));
  a.intermediate =
      scale.intermediate * (options.floor_units * unit_roundoff(floor_dtype_of(options, problem, OutputTensor::intermediate)));
  if (options.factor > 0) {
    Outputs<double> baseline;
    if (options.baseline != BudgetBaseline::emulation) {
      if (formulation != Formulation::chunked || chunk_size != 64 || problem.store_intermediate_states)
        throw std::invalid_argument("budget baseline operands_single needs a chunked formulation at C = 64 without "
                                    "intermediate states");
      baseline = reference::emulate_operands(problem, inputs,
                                             options.baseline == BudgetBaseline::operands_single_qk
                                                 ? reference::OperandRounding::single_qk
                                                 : reference::OperandRounding::single);
    } else {
      // A chunked formulation has no per-token states: the sequential emulation stands in.
      baseline = reference::emulate(problem, inputs,
                                    problem.store_intermediate_states ? Formulation::sequential : formulation,
                                    chunk_size);
    }
    // A baseline that is not finite (it overflowed) bounds nothing: its term is dropped, as
    // judge() drops it, leaving the floor.
    auto term = [&options](const HostTensor<double>& e, const HostTensor<double>& b) {
      const double d = difference(e, b).max_abs;
      return std::isfinite(d) ? options.factor * d : 0.0;
    };
    a.o += term(exact.o, baseline.o);
    a.hT += term(exact.hT, baseline.hT);
    a.intermediate += term(exact.intermediate, baseline.intermediate);
  }
  return a;
}
}  // namespace

Allowance max_abs_allowance(const BudgetOptions& options, const Problem& problem, const Inputs& inputs,
                            const Outputs<double>& exact, Formulation formulation, int chunk_size) {
  Allowance a = allowance_of(options, problem, inputs, exact, formulation, chunk_size);
  // No finite bound applies (the magnitudes overflow double): 0, so that only equal results
  // pass, however the caller compares.
  for (double* part : {&a.o, &a.hT, &a.intermediate})
    if (!std::isfinite(*part) || *part < 0) *part = 0;
  return a;
}

}  // namespace gdn::oracle
