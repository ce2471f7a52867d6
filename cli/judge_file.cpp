#include "cli/judge_file.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>

#include "oracle/backward_budget.hpp"

namespace gdn::cli {

bool budget_no_looser(const oracle::BudgetOptions& a, const oracle::BudgetOptions& d) {
  using oracle::BudgetModel;
  if (a.model == BudgetModel::bitwise) return true;
  if (a.model != d.model) return false;
  switch (a.model) {
    case BudgetModel::calibrated:
      // Comparisons written so that a NaN parameter is never "no looser".
      return a.factor <= d.factor && a.floor_units <= d.floor_units && a.arithmetic_units <= d.arithmetic_units &&
             (!a.state_unit_input || d.state_unit_input) && a.baseline == d.baseline;
    case BudgetModel::fixed: {
      const double a_chunked = a.fixed_rel_rms ? *a.fixed_rel_rms : a.fixed_rel_rms_chunked;
      const double a_recurrent = a.fixed_rel_rms ? *a.fixed_rel_rms : a.fixed_rel_rms_recurrent;
      const double d_chunked = d.fixed_rel_rms ? *d.fixed_rel_rms : d.fixed_rel_rms_chunked;
      const double d_recurrent = d.fixed_rel_rms ? *d.fixed_rel_rms : d.fixed_rel_rms_recurrent;
      return a_chunked <= d_chunked && a_recurrent <= d_recurrent && a.fixed_abs_rms <= d.fixed_abs_rms;
    }
    case BudgetModel::analytic:
      // long double's unit roundoff is the smaller one.
      return a.analytic_long_double || !d.analytic_long_double;
    case BudgetModel::bitwise:
      return true;
  }
  return false;
}

namespace {

oracle::BudgetOptions budget_with_default(const oracle::CaseFile& c, const std::optional<oracle::BudgetOptions>& given,
                                          const oracle::BudgetOptions& fallback, std::string* note) {
  if (given) return *given;
  // The one parser of the gdn.* judge keys (the reader runs it too); a malformed value throws.
  const oracle::JudgeSettings settings = oracle::judge_settings(c.metadata, c.problem, "case file");
  if (!settings.budget) return fallback;
  const oracle::BudgetOptions b = *settings.budget;
  if (budget_no_looser(b, fallback)) return b;
  if (note)
    *note = "the file's gdn.budget " + b.describe() + " is looser than, or not comparable with, the default " +
            fallback.describe() + ": judged with the default (--budget B to judge otherwise)";
  return fallback;
}

}  // namespace

oracle::BudgetOptions file_budget(const oracle::CaseFile& c, const std::optional<oracle::BudgetOptions>& given,
                                  const oracle::RegistryEntry* entry, std::string* note) {
  return budget_with_default(c, given, entry ? entry->default_budget : oracle::BudgetOptions{}, note);
}

oracle::BudgetOptions file_gradient_budget(const oracle::CaseFile& c, const std::optional<oracle::BudgetOptions>& given,
                                           const oracle::RegistryEntry* entry, std::string* note) {
  std::string why;
  const oracle::BudgetOptions b =
      budget_with_default(c, given, entry ? oracle::backward_budget_of(*entry) : oracle::BudgetOptions{}, &why);
  if (note && !why.empty()) *note = "gradients: " + why;
  return b;
}

oracle::Verdict error_verdict(const std::string& path, const std::string& implementation, const std::string& message) {
  oracle::Verdict v;
  v.case_name = path;
  v.implementation = implementation;
  v.status = oracle::Status::error;
  v.message = message;
  return v;
}

std::string not_a_regular_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::string("cannot stat: ") + std::strerror(errno);
  if (S_ISREG(st.st_mode)) return "";
  if (S_ISDIR(st.st_mode)) return "is a folder, not a case file";
  if (S_ISFIFO(st.st_mode)) return "is a FIFO, not a regular file (refused: reading it could block)";
  return "is not a regular file";
}

oracle::Verdict judge_file_gradients(const oracle::CaseFile& c, const std::string& case_name,
                                     const std::string& implementation, const oracle::BudgetOptions& budget) {
  if (!c.gradients || !c.backward)
    throw std::invalid_argument("judge_file_gradients: the case holds no gradients and cotangents");
  // An operand baseline applies to a chunked formulation's gradients; evaluate_gradients judges a
  // sequential one on the emulation and says so in the verdict (oracle::gradient_budget).
  // The one parser of the gdn.* judge keys, as for the outputs (a malformed value throws).
  const oracle::JudgeSettings settings = oracle::judge_settings(c.metadata, c.problem, case_name);
  oracle::BackwardContext context(case_name, c.problem, c.inputs, *c.backward);
  const Gradients<double>* first = budget.model == oracle::BudgetModel::bitwise ? &context.exact().value : nullptr;
  return oracle::evaluate_gradients(implementation, settings.formulation, settings.chunk_size, context, *c.gradients,
                                    budget, first);
}

oracle::Verdict combine_verdicts(oracle::Verdict f, const oracle::Verdict& b) {
  using oracle::Status;
  const auto rank = [](Status s) { return s == Status::error ? 3 : s == Status::fail ? 2 : s == Status::pass ? 0 : 1; };
  if (rank(b.status) > rank(f.status)) f.status = b.status;
  f.checks.insert(f.checks.end(), b.checks.begin(), b.checks.end());
  f.metrics.insert(f.metrics.end(), b.metrics.begin(), b.metrics.end());
  f.baseline_metrics.insert(f.baseline_metrics.end(), b.baseline_metrics.begin(), b.baseline_metrics.end());
  if (!b.budget.empty() && b.budget != f.budget) f.budget += "; gradients: " + b.budget;
  if (!b.message.empty()) f.message += (f.message.empty() ? "" : "; ") + b.message;
  f.seconds += b.seconds;
  return f;
}

namespace {

// The message of an exception, with the path in front unless it already names it.
std::string with_path(const std::string& path, const std::string& what) {
  return what.find(path) != std::string::npos ? what : path + ": " + what;
}

}  // namespace

oracle::Verdict judge_case(const oracle::CaseFile& c, const std::string& path,
                           const std::optional<oracle::BudgetOptions>& budget, const EntryLookup& find_entry) {
  const std::string name = c.meta("gdn.implementation", "(unnamed)");
  try {
    if (!c.outputs && !c.gradients)
      return error_verdict(c.meta("gdn.case_name", path), name,
                           path + " holds no outputs (out.o) and no gradients (out.dq ...): run the external "
                                  "implementation on it first");
    const oracle::RegistryEntry* entry = find_entry && c.metadata.count("gdn.implementation") ? find_entry(name) : nullptr;
    std::string note, gradient_note;
    const oracle::BudgetOptions b = file_budget(c, budget, entry, c.outputs ? &note : nullptr);
    const oracle::BudgetOptions gb = c.gradients ? file_gradient_budget(c, budget, entry, &gradient_note) : b;
    if (!gradient_note.empty()) note += (note.empty() ? "" : "; ") + gradient_note;
    const oracle::JudgeSettings settings = oracle::judge_settings(c.metadata, c.problem, path);
    const Formulation formulation = settings.formulation;
    const int chunk_size = settings.chunk_size;
    const std::string case_name = c.meta("gdn.case_name", path);
    std::optional<oracle::Verdict> forward;
    if (c.outputs) {
      oracle::CaseContext context(case_name, c.problem, c.inputs);
      forward = oracle::evaluate_outputs(name, formulation, chunk_size, context, *c.outputs, b);
    }
    // A file with gradients: the backward judged too, its checks named dq ... dh0 in the same
    // verdict.
    oracle::Verdict v = !c.gradients ? *forward
                        : forward    ? combine_verdicts(*forward, judge_file_gradients(c, case_name, name, gb))
                                     : judge_file_gradients(c, case_name, name, gb);
    // The file's path first, then why the budget was chosen, then the oracle's own explanation
    // (non-finite errors or budgets are explained there).
    std::string message = note.empty() ? path : path + "; " + note;
    if (!v.message.empty()) message += "; " + v.message;
    v.message = message;
    return v;
  } catch (const std::bad_alloc&) {
    return error_verdict(path, name, path + ": out of memory while judging it");
  } catch (const std::exception& e) {
    return error_verdict(path, name, with_path(path, e.what()));
  }
}

oracle::Verdict judge_case_file(const std::string& path, const std::optional<oracle::BudgetOptions>& budget,
                                const EntryLookup& find_entry, const oracle::CaseLimits& limits) {
  if (const std::string why = not_a_regular_file(path); !why.empty())
    return error_verdict(path, "(unreadable)", path + ": " + why);
  try {
    const oracle::CaseFile c = oracle::read_case_file(path, limits);
    return judge_case(c, path, budget, find_entry);
  } catch (const std::bad_alloc&) {
    return error_verdict(path, "(unreadable)", path + ": out of memory while reading it");
  } catch (const std::exception& e) {
    return error_verdict(path, "(unreadable)", with_path(path, e.what()));
  }
}

}  // namespace gdn::cli
