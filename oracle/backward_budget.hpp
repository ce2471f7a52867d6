#pragma once
// Gradient budgets and verdicts (docs/budgets.md, "Gradients"): the backward judged like the
// forward, with the same BudgetOptions, Check and Verdict. One check per gradient tensor the
// problem has (dq, dk, dv, then dg, dbeta or da, db, dA_log, ddt_bias, then dh0).
//
// The error of a gradient tensor is normwise relative to its term magnitudes:
//   error = max |x - exact| / M,   M = the largest term magnitude of the tensor
// (reference::sequential_backward's term_magnitudes: the sum of the magnitudes of the terms
// that form each element, carried through the chain rules in absolute value). Gradients cancel
// (dg_t = <dSd, Sd_t>, dbeta_t = du . (v - p) end many orders below their terms) and every
// implementation's rounding error scales with the terms, not with the result: relative to
// max |exact| a correct fp32 dg can be off by any factor, relative to M it is not.
//
// Budgets per model (error and budget in the same units, fractions of M):
//   calibrated: factor x (error of the baseline) + floor_units x u(the gradient's storage dtype);
//               the baseline is the fp32 emulation of the implementation's formulation, or with
//               baseline=operands_single (or _qk, the same model here) the chunked backward with
//               every operand of its products rounded once to the input dtype
//               (emulate_backward_operands: the design of kernels that store their operands in
//               bf16 / fp16, fla's and FlashQLA's); chunked formulations only;
//   fixed:      rel_rms <= fla's thresholds (0.008 for dq, dk, dv, dh0; 0.02 for the gate
//               gradients), or fixed(rel_rms=X[,abs=A]) for every tensor, plus no non-finite
//               mismatch;
//   bitwise:    bit for bit against another run (determinism);
//   analytic:   max |x - exact| <= rel x M, rel = analytic_relative_bound (the exact references).
// Never PASS while an error, a budget, the exact gradient or its term magnitudes are not finite
// (the forward's rule, docs/budgets.md "Non-finite errors and budgets").
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/gradients.hpp"
#include "core/implementation.hpp"
#include "oracle/budget.hpp"
#include "reference/backward_chunked.hpp"

namespace gdn::oracle {

// The gradient tensors the problem has, in the fixed order of the checks.
std::vector<OutputTensor> gradient_tensors(const Problem& problem);
// True for dq ... dh0.
bool is_gradient(OutputTensor tensor);
// The tensor of `gradients` named by `tensor` (a gradient); std::invalid_argument otherwise.
const HostTensor<double>& gradient_of(const Gradients<double>& gradients, OutputTensor tensor);
HostTensor<double>& gradient_of(Gradients<double>& gradients, OutputTensor tensor);

// Rounds every gradient to its storage dtype (output_dtype: §6's proposal, confirmed here).
void round_gradients(const Problem& problem, Gradients<double>& gradients);

// The precision emulation of the backward: what a straightforward backward in fp32 computes
// on this input. The exact backward's own code instantiated on float (the sequential adjoint,
// or the chunked WY backward at chunk_size for a chunked formulation), inputs and cotangents in
// their dtypes (exact in float by the Inputs contract), fp32 gates, states and accumulation,
// every gradient rounded once to its storage dtype at the end.
Gradients<double> emulate_backward(const Problem& problem, const Inputs& inputs, const BackwardInputs& backward,
                                   Formulation formulation, int chunk_size);

// The operand model of the backward, the gradient budget's baseline=operands_single: the
// chunked backward at chunk_size with every operand of the adjoint's products (the forward's
// recomputed S0, T, W, U, Vnew, the normalised q and k, the cotangents' products alike) rounded
// once to the input dtype before the product and accumulated in fp32
// (reference::chunked_backward_products with BackwardProducts::bf16 or f16; fp32 inputs: no
// rounding, the chunked emulation), every gradient rounded once to its storage dtype. For the
// backward, baseline=operands_single and operands_single_qk name this one model: it rounds the
// normalised q and k wherever they enter a product, which is what storing them does.
reference::BackwardProducts operand_products(DType input_dtype);
Gradients<double> emulate_backward_operands(const Problem& problem, const Inputs& inputs,
                                            const BackwardInputs& backward, int chunk_size);

// The oracle's gradients and their term magnitudes (sequential_backward in double, or in long
// double narrowed to double).
struct ExactGradients {
  Gradients<double> value;
  Gradients<double> magnitudes;
};
ExactGradients exact_gradients(const Problem& problem, const Inputs& inputs, const BackwardInputs& backward,
                               bool long_double = false);

// The largest term magnitude of one gradient tensor (M above): max over finite elements; NaN
// when any magnitude is NaN, inf when any is inf.
double term_scale(const HostTensor<double>& magnitudes);

// fixed: the rel_rms threshold of a gradient tensor (fla's, or the options' override).
double fixed_gradient_threshold(const BudgetOptions& options, OutputTensor tensor);

// Judges `actual` against the exact gradients. baseline: the gradients of the options' baseline
// (BackwardContext::baseline: the emulation, or the operand model for a chunked formulation;
// required for calibrated, whose basis names which). For bitwise, `exact.value` is the run `actual` must equal bit for bit (its
// magnitudes are unused). ERROR (with the tensor named) when a gradient the problem has is
// missing or has the wrong shape, or one it has not is given. The inputs are needed for the
// analytic bound and the metrics' locations.
Verdict judge_gradients(const Problem& problem, const Inputs& inputs, const ExactGradients& exact,
                        const Gradients<double>& actual, const Gradients<double>* baseline, Formulation formulation,
                        int chunk_size, const BudgetOptions& options);

// Whether the problem lies in the backward's scope (docs/backward.md, "Scope"; the rules of
// reference::validate_backward that concern the problem alone): dense states (no state cache),
// no per-token states, fp32 states, log-space gates. Fills *why with the rule when not.
bool backward_in_scope(const Problem& problem, std::string* why = nullptr);

// Checks the backward's inputs (reference::validate_backward) and the Inputs contract for the
// cotangents: dO exactly representable in the input dtype (it is the gradient of o), dhT in
// fp32. ProblemError naming the tensor and the element otherwise.
void validate_backward_inputs(const Problem& problem, const Inputs& inputs, const BackwardInputs& backward);

// One problem, its inputs and cotangents, with the exact gradients and the emulations computed
// once and shared by every backward judged on it (the forward's CaseContext, for gradients).
class BackwardContext {
 public:
  using Oracle = CaseContext::Oracle;
  // Validates (validate_backward_inputs) before any work.
  BackwardContext(std::string name, Problem problem, Inputs inputs, BackwardInputs backward,
                  Oracle oracle = Oracle::f64);
  const std::string& name() const { return name_; }
  const Problem& problem() const { return problem_; }
  const Inputs& inputs() const { return inputs_; }
  const BackwardInputs& backward() const { return backward_; }
  Oracle oracle() const { return oracle_; }
  const ExactGradients& exact();
  // emulate_backward for the formulation (chunked at chunk_size).
  const Gradients<double>& emulation(Formulation formulation, int chunk_size);
  // The calibrated budget's baseline for `options`: emulation(), or emulate_backward_operands
  // for the operand baselines (chunked formulations only; std::invalid_argument otherwise).
  const Gradients<double>& baseline(const BudgetOptions& options, Formulation formulation, int chunk_size);

 private:
  std::string name_;
  Problem problem_;
  Inputs inputs_;
  BackwardInputs backward_;
  Oracle oracle_;
  std::optional<ExactGradients> exact_;
  std::map<int, Gradients<double>> emulations_;  // key: 0 sequential, C chunked
  std::map<int, Gradients<double>> operand_models_;  // key: C
};

// judge_gradients with the exact gradients and the emulation taken from the context. Under
// bitwise the caller passes the second run as `actual` and the first as `first` (required).
Verdict evaluate_gradients(const std::string& implementation, Formulation formulation, int chunk_size,
                           BackwardContext& context, const Gradients<double>& actual, const BudgetOptions& options,
                           const Gradients<double>* first = nullptr);

// A backward under test as the oracle runs it: fuzz::BackwardImplementation's fields.
using BackwardRun = std::function<Gradients<double>(const Problem&, const Inputs&, const BackwardInputs&)>;

// Runs the backward on the context and judges it: ERROR when it throws (the message names it),
// else PASS/FAIL. Under bitwise it runs twice and compares the runs (determinism). When
// actual_out is non-null it receives the gradients of the (first) run.
Verdict evaluate_backward(const std::string& implementation, Formulation formulation, int chunk_size,
                          const BackwardRun& run, BackwardContext& context, const BudgetOptions& options,
                          Gradients<double>* actual_out = nullptr);

// An implementation's backward (Implementation::has_backward) run on the context and judged,
// as the forward's oracle::evaluate does outputs: SKIPPED (with the reason) when it is not
// available here, has no backward, the problem is outside the backward's scope
// (backward_in_scope) or its backward does not support the problem (supports_backward); else evaluate_backward above with its backward_formulation() and
// chunk_size().
Verdict evaluate_backward(Implementation& implementation, BackwardContext& context, const BudgetOptions& options,
                          Gradients<double>* actual_out = nullptr);

// A budget applied to the gradients of a backward of this formulation: the operand model is of
// the chunked form, so for a sequential one a calibrated budget with an operand baseline is
// judged on the emulation instead (what judge_gradients requires); *note (when non-null) says
// so when the budget changed, and is left alone otherwise. evaluate_gradients applies it.
BudgetOptions gradient_budget(const BudgetOptions& options, Formulation formulation, std::string* note = nullptr);

// The convenience form: exact gradients and emulation computed here (oracle in double).
Verdict judge_backward(const Problem& problem, const Inputs& inputs, const BackwardInputs& backward,
                       const Gradients<double>& actual, Formulation formulation, int chunk_size,
                       const BudgetOptions& options);

}  // namespace gdn::oracle
