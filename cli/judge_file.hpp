#pragma once
// Judging the outputs stored in one case file (verify, replay, the verify fuzz target): what the
// file says about how it is judged (formulation, chunk size, budget), read strictly, and the
// rule that a file's own gdn.budget may tighten its judgment but never loosen it.
#include <functional>
#include <optional>
#include <string>

#include "oracle/budget.hpp"
#include "oracle/case_file.hpp"
#include "oracle/registry.hpp"

namespace gdn::cli {

// True when judging with `candidate` can never pass what `reference` fails: the same model with
// every parameter at most as generous (bitwise is tighter than everything). Budgets that are
// not comparable this way (another model or baseline) are not "no looser".
bool budget_no_looser(const oracle::BudgetOptions& candidate, const oracle::BudgetOptions& reference);

// The budget to judge a file with. `given` (--budget) wins. Else the default is the entry's
// default budget (the implementation the file names, when registered), else the oracle's
// calibrated one; the file's gdn.budget is used only when budget_no_looser(file's, default),
// otherwise the default is used and *note says so. A malformed gdn.budget throws CaseFileError.
oracle::BudgetOptions file_budget(const oracle::CaseFile& c, const std::optional<oracle::BudgetOptions>& given,
                                  const oracle::RegistryEntry* entry, std::string* note = nullptr);
// The same for the file's gradients: the default is the entry's backward budget
// (oracle::backward_budget_of), else calibrated; the file's gdn.budget under the same rule.
oracle::BudgetOptions file_gradient_budget(const oracle::CaseFile& c, const std::optional<oracle::BudgetOptions>& given,
                                           const oracle::RegistryEntry* entry, std::string* note = nullptr);

// Judges the outputs and the gradients a case file holds (one verdict; its checks name o, hT,
// ... and dq ... dh0). Never throws: a file that cannot be read, is not a regular file (a
// folder, a FIFO: refused before it is opened), holds neither outputs nor gradients, or cannot be
// judged (a budget that does not apply, a malformed key) is one ERROR verdict naming the path
// and the reason. `find_entry` maps gdn.implementation to a registered entry (may return null).
using EntryLookup = std::function<const oracle::RegistryEntry*(const std::string& name)>;
// `limits` bound the estimated memory and work of a case (oracle/limits.hpp): a file over them
// is an ERROR naming the limit and the flag that raises it.
oracle::Verdict judge_case_file(const std::string& path, const std::optional<oracle::BudgetOptions>& budget,
                                const EntryLookup& find_entry, const oracle::CaseLimits& limits = {});
// The same for a file already decoded (the fuzz target judges bytes; `path` names it).
oracle::Verdict judge_case(const oracle::CaseFile& c, const std::string& path,
                           const std::optional<oracle::BudgetOptions>& budget, const EntryLookup& find_entry);

// The gradients a case file holds (out.dq ... out.dh0, gdn-case/2) judged like its outputs:
// oracle::BackwardContext on the file's problem, inputs and cotangents (in.dO, in.dhT), the
// exact backward in double, the file's formulation and chunk size, one check per gradient
// (docs/budgets.md "Gradients"). `budget` is the one chosen for the file (file_budget); an
// operand baseline judges a chunked file against the backward's operand model and a sequential
// one against the emulation (a note in the verdict says so: oracle::gradient_budget); bitwise compares with the exact gradients bit for
// bit, as it does outputs. Throws (ProblemError, std::invalid_argument) where judging fails;
// the callers turn that into an ERROR verdict. Needs c.gradients and c.backward.
oracle::Verdict judge_file_gradients(const oracle::CaseFile& c, const std::string& case_name,
                                     const std::string& implementation, const oracle::BudgetOptions& budget);

// One verdict for one file from its forward's and its backward's verdicts: the checks (o, hT,
// ... then dq ... dh0), metrics and messages of both; ERROR if either is, else FAIL if either
// fails, else PASS.
oracle::Verdict combine_verdicts(oracle::Verdict forward, const oracle::Verdict& backward);

// An ERROR verdict for `path` (case name) with `message`.
oracle::Verdict error_verdict(const std::string& path, const std::string& implementation, const std::string& message);

// "" when `path` names a regular file, else why not (missing, a folder, a FIFO, ...): checked
// before a file is opened, since opening a FIFO blocks.
std::string not_a_regular_file(const std::string& path);

}  // namespace gdn::cli
