#pragma once
// Error budgets and verdicts. A verdict is never a bare boolean: every check carries the error,
// the budget it was held to, how that budget was formed, and the margin error / budget.
// The models and the reasoning behind their numbers: docs/budgets.md.
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/implementation.hpp"
#include "oracle/metrics.hpp"

namespace gdn::oracle {

// analytic: a rounding-error bound derived from the recurrence itself, for evaluations whose
//   working precision is far below every storage dtype (the double and long double references):
//   no emulation can serve as their baseline (docs/budgets.md, "(d) analytic").
enum class BudgetModel { calibrated, fixed, bitwise, analytic };
// calibrated: which precision emulation sets the budget (docs/budgets.md).
//   emulation: reference::emulate for the implementation's formulation (fp32 arithmetic, inputs
//     in their dtypes, o rounded once): what a straightforward implementation achieves.
//   operands_single: reference::emulate_operands(single), the chunked form in fp32 with every
//     computed tensor-core operand rounded once to the input dtype: the design of kernels that
//     single-round their operands (the chunked prefill's ChunkedRounding::single, fla's).
//     Chunked formulations only.
//   operands_single_qk: emulate_operands(single_qk), operands_single with the l2-normalised q
//     and k stored in the input dtype and used as the operands (fla's chunk kernels on both
//     backends, FlashQLA: reference/operand_model.hpp). Chunked formulations only.
enum class BudgetBaseline { emulation, operands_single, operands_single_qk };
const char* budget_model_name(BudgetModel model);
bool parse_budget_model(const std::string& text, BudgetModel* out);

struct BudgetOptions {
  BudgetModel model = BudgetModel::calibrated;
  // calibrated: error <= factor * (emulation's error) + floor_units * (output dtype's rounding).
  double factor = 2.0;
  double floor_units = 1.0;
  // calibrated: the arithmetic floor (oracle/arithmetic_floor.hpp): this many times the
  // modelled rounding error of a correct fp32 computation, weighted by the check's statistics.
  // Added only to a check that fails without it (it can only raise a budget; computing it
  // costs one more pass of the recurrence), and only where its model applies (the fp32
  // computation it models stays finite: ArithmeticFloor::applies). 0 turns it off.
  double arithmetic_units = 4.0;
  // calibrated: the unit of the floor for states (hT, intermediate): false, the state dtype's
  // (Problem::state_dtype: one rounding of each stored state); true, the input dtype's when that
  // is bf16 or fp16 and coarser than the state dtype: for kernels that feed their state products
  // with tensor-core operands in the input dtype by design (docs/budgets.md).
  bool state_unit_input = false;
  BudgetBaseline baseline = BudgetBaseline::emulation;
  // fixed: relative RMS thresholds as other projects use them (docs/budgets.md).
  double fixed_rel_rms_chunked = 0.005;
  double fixed_rel_rms_recurrent = 0.002;
  // Replaces both thresholds (e.g. for the double references: docs/budgets.md, "references").
  std::optional<double> fixed_rel_rms;
  // An absolute allowance added to the fixed budget: rms(ref - x) <= rel_rms * rms(ref) +
  // fixed_abs_rms. For outputs that cancel to near zero the relative error says nothing about
  // the arithmetic (docs/budgets.md, "references"); 0 leaves the check purely relative.
  double fixed_abs_rms = 0.0;
  // analytic: the unit roundoff of the evaluation: false, double's (2^-53); true, long
  // double's (2^-64), for a long double computation.
  bool analytic_long_double = false;

  // "calibrated", "calibrated(factor=3,floor=1,arith=1,state_unit=input,baseline=operands_single)", "fixed",
  // "fixed(rel_rms=1e-12,abs=1e-14)", "bitwise", "analytic", "analytic(precision=f80)".
  std::string describe() const;
};
// Parses the describe() forms above (and plain names).
bool parse_budget(const std::string& text, BudgetOptions* out, std::string* error);

enum class Status { pass, fail, skipped, error };
const char* status_name(Status status);  // "PASS", "FAIL", "SKIPPED", "ERROR"

struct Check {
  OutputTensor tensor = OutputTensor::o;
  std::string metric;  // "rel_rms", "max_abs", "mismatches"
  double error = 0;
  double budget = 0;
  // error / budget: 0 when the error is 0, inf when only the budget is; inf, and never a pass,
  // when the error or the budget is not finite (docs/budgets.md, "Non-finite errors and budgets").
  double margin = 0;
  bool pass = false;   // margin <= 1 with a finite error and a finite budget
  // How the budget was formed, e.g. "2 x 1.6e-03 (emulation) + 3.9e-03 (1 u bf16)"; when the
  // error or the budget is not finite it starts with which and why.
  std::string basis;
};

// One check: margin error / budget, pass when <= 1; when the error or the budget is not a
// finite number (or the budget is negative) the check fails whatever the other number is, its
// margin is inf and its basis starts with which number and why (error_why, budget_why). Every
// verdict's checks are made here (forward and gradients: oracle/backward_budget.hpp).
Check make_check(OutputTensor tensor, std::string metric, double error, double budget, std::string basis,
                 const std::string& error_why = "", const std::string& budget_why = "");

// A check that fails because there is nothing to judge against (the oracle or its scale is
// not finite): margin inf, never a pass, `why` as its basis. `count`: the offending elements.
Check unjudgeable_check(OutputTensor tensor, double count, std::string why);

struct Verdict {
  std::string case_name;
  std::string problem;         // Problem::describe()
  std::string implementation;
  std::string budget;          // BudgetOptions::describe()
  Status status = Status::error;
  std::string message;         // skip reason, error text, notes
  std::vector<Check> checks;
  std::vector<TensorMetrics> metrics;           // implementation vs the oracle
  std::vector<TensorMetrics> baseline_metrics;  // emulation vs the oracle (calibrated)
  double seconds = 0;          // wall time of the implementation's run

  bool passed() const { return status == Status::pass; }
  bool failed() const { return status == Status::fail || status == Status::error; }
  // The check with the largest margin (null when there are none).
  const Check* worst_check() const;
  double worst_margin() const;
  std::string summary() const;  // one line
  std::string details() const;  // every check and metric, several lines
};
std::ostream& operator<<(std::ostream& out, const Verdict& verdict);
// The end of every judge (forward and gradients): PASS only when every check passes, else FAIL;
// each check whose error or budget is not finite adds why to the notes; the notes, each once,
// are appended to the message.
void finish_verdict(Verdict& verdict, std::vector<std::string> notes);
nlohmann::json to_json(const Verdict& verdict);
nlohmann::json to_json(const Check& check);

// Judges `actual` against `reference` (the oracle's outputs) under the options. baseline is the
// precision-emulating reference's outputs on the same input: required for calibrated, unused
// otherwise. Never PASS while a check's error or budget is not finite or the oracle's outputs
// are not (a failing `reference` check per such tensor, except under bitwise); a calibrated
// check whose emulation error is not finite drops that term and keeps the analysis-based
// floors; the verdict's message says why (docs/budgets.md, "Non-finite errors and budgets"). For bitwise, `reference` is whatever the outputs must equal bit for bit (another
// run, another packing). Checks o, and hT / intermediate when the problem asks for them.
// analytic needs `inputs` and, for a chunked formulation, its chunk_size (> 0).
Verdict judge(const Problem& problem, const Inputs* inputs, const Outputs<double>& reference,
              const Outputs<double>& actual, const Outputs<double>* baseline, Formulation formulation,
              const BudgetOptions& options, int chunk_size = 0);

// One problem and its inputs with the oracle's and the emulations' outputs computed once and
// shared by every implementation judged on it.
class CaseContext {
 public:
  // f64: reference::sequential<double>, the oracle of fuzzing (fast). f80: the recurrence in
  // long double, for conformance, where the double references themselves are under test.
  enum class Oracle { f64, f80 };
  CaseContext(std::string name, Problem problem, Inputs inputs, Oracle oracle = Oracle::f64);
  const std::string& name() const { return name_; }
  const Problem& problem() const { return problem_; }
  const Inputs& inputs() const { return inputs_; }
  // The oracle's outputs (widened/narrowed to double).
  const Outputs<double>& exact();
  Oracle oracle() const { return oracle_; }
  // reference::emulate for the formulation (chunked at chunk_size). A chunked formulation
  // cannot produce per-token states, so with store_intermediate_states the sequential
  // emulation stands in (docs/budgets.md).
  const Outputs<double>& emulation(Formulation formulation, int chunk_size);
  // The baseline `options` name for the formulation: emulation() or the operand model.
  const Outputs<double>& baseline(const BudgetOptions& options, Formulation formulation, int chunk_size);

 private:
  std::string name_;
  Problem problem_;
  Inputs inputs_;
  Oracle oracle_;
  std::optional<Outputs<double>> exact_;
  std::map<int, Outputs<double>> emulations_;  // key: 0 sequential, C chunked
  std::optional<Outputs<double>> operands_single_, operands_single_qk_;
};

// Runs the implementation on the case and judges it: SKIPPED when it is not available here or
// does not support the problem (with the reason), ERROR when it throws, else PASS/FAIL.
// Under bitwise it runs twice and compares the runs (determinism).
// When actual_out is non-null it receives the implementation's outputs.
Verdict evaluate(Implementation& implementation, CaseContext& context, const BudgetOptions& options,
                 Outputs<double>* actual_out = nullptr);

// Judges outputs someone else computed (an external implementation's, read from a case file).
Verdict evaluate_outputs(const std::string& implementation_name, Formulation formulation, int chunk_size,
                         CaseContext& context, const Outputs<double>& actual, const BudgetOptions& options);

// ----- the max-abs form of the budgets, for relations between runs ------------------------
//
// A relation between several runs of an implementation (state carry, packing, linearity, ...:
// fuzz/properties.hpp) holds exactly for the operator; for the implementation it may be off by
// the sum of the runs' errors. Each run's share is the max-abs budget of its outputs below,
// formed on that run's own input, so the property suite and the verdicts answer "how wrong may
// this run be" with the same model and the same parameters (docs/budgets.md, "Relations").

// The max-abs error of `actual` against `expected` (+inf where actual is not finite but
// expected is, or shapes differ; NaN against NaN and +0 against -0 count as equal) and the
// flat index of the worst element.
struct Difference {
  double max_abs = 0;
  std::int64_t worst = -1;
  double expected_at_worst = 0, actual_at_worst = 0;
};
Difference difference(const HostTensor<double>& expected, const HostTensor<double>& actual);
// max |x| over the finite elements.
double max_abs(const HostTensor<double>& tensor);

// One number per output tensor.
struct Allowance {
  double o = 0, hT = 0, intermediate = 0;
  Allowance& operator+=(const Allowance& other);
};

// Bounds on the magnitudes the recurrence handles, from the inputs alone: for every column s
// of a state (S[:, v]), |s_t|^2 <= exp(2 g_t) |s_{t-1}|^2 + v_t[v]^2 when beta <= 1 (the
// component along k^ becomes a convex combination of the decayed one and v, the rest only
// decays), |s_t| <= exp(g_t) |s_{t-1}| + beta |v_t[v]| otherwise; valid for |k^| <= 1, i.e.
// contractive inputs. o: max over tokens of that bound times |scale q^_t|; hT, intermediate:
// the bound itself.
Allowance magnitudes(const Problem& problem, const Inputs& inputs);

// The largest in-chunk cumulative log decay |g_s + ... + g_i| over every sequence, value head
// and chunk of chunk_size tokens (s: the chunk's start, or the last token with exp(g) = 0,
// where the chunked form restarts its sums). The chunked form takes differences of such sums,
// so their rounding (u per addition, relative to this magnitude) is an absolute error in the
// exponent of every decay factor: a term no sequential computation has. long_double: where
// exp(g) = 0 is judged in long double (exp(-1e4) is not 0 there).
double chunk_log_decay(const Problem& problem, const Inputs& inputs, int chunk_size, bool long_double = false);

// The analytic model's relative bound for one run (docs/budgets.md, "(d) analytic"):
// u (64 sqrt((L + 1)(K + V)) + 16 Gamma_C), L the longest sequence, Gamma_C chunk_log_decay()
// for a chunked formulation (0 for a sequential one), u double's or long double's.
double analytic_relative_bound(const Problem& problem, const Inputs& inputs, Formulation formulation,
                               int chunk_size, bool long_double);

// The max-abs budget of one run per output tensor, with scale = max(max|exact|, magnitudes()):
//   analytic:   scale * analytic_relative_bound();
//   calibrated: scale * floor_units * u(floor dtype) + factor * max|baseline - exact|, the floor
//               dtype and the baseline as judge() takes them (o: the input dtype; states: the
//               state dtype, or the input dtype under state_unit=input where that is coarser;
//               baseline: the emulation of the
//               formulation, sequential for per-token states, or operands_single). The
//               arithmetic floor is not added: it rescues one verdict whose emulation happened
//               to be lucky, and a sum over runs has no such single draw;
//   bitwise:    0 (bit for bit, up to the sign of zero);
//   fixed:      throws std::invalid_argument (an rms threshold bounds no single element).
// `exact` is the exact value on that run's input; without a baseline any approximation of it
// within this budget serves (only max|.| is used). A baseline term that is not finite (the
// emulation overflowed) is dropped; a tensor whose allowance would not be finite gets 0, so
// that only equal results pass however the caller compares.
Allowance max_abs_allowance(const BudgetOptions& options, const Problem& problem, const Inputs& inputs,
                            const Outputs<double>& exact, Formulation formulation, int chunk_size);

}  // namespace gdn::oracle
