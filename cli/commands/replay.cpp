// gdn-testbed replay: re-run the implementation a case file names (or --impl NAME) on its
// inputs and judge it; a file with outputs but no runnable implementation is judged on the
// outputs it holds. A backward case (gdn-case/2, in.dO) re-runs the implementation's backward
// on the file's cotangents when it has one (and its forward only when the file holds outputs);
// otherwise, or when that backward cannot run here, the gradients the file holds are judged as
// stored, in the same verdict as the forward. --expect pass|fail turns the verdict into the exit status.
#include <iostream>
#include <new>
#include <optional>
#include <memory>

#include "cli/commands/commands.hpp"
#include "cli/commands/options.hpp"
#include "cli/output.hpp"
#include "cli/registry_all.hpp"
#include "oracle/backward_budget.hpp"

namespace gdn::cli {

namespace {

struct ReplayOptions {
  std::vector<std::string> files;
  std::string impl;
  CLI::Option* impl_option = nullptr;
  BudgetChoice budget;
  std::string expect;
  VerdictFiles files_out;
  oracle::CaseLimits limits;
};

// One file's verdict. Never throws: a file that cannot be read or judged is an ERROR verdict,
// so one bad file does not end a batch.
oracle::Verdict replay_one(const ReplayOptions& o, const std::string& path,
                           const std::optional<oracle::BudgetOptions>& budget) {
  const bool impl_given = o.impl_option->count() > 0;
  if (const std::string why = not_a_regular_file(path); !why.empty())
    return error_verdict(path, "(unreadable)", path + ": " + why);
  try {
    const oracle::CaseFile c = oracle::read_case_file(path, o.limits);
    const std::string name = impl_given ? o.impl : c.meta("gdn.implementation");
    const oracle::RegistryEntry* entry = name.empty() ? nullptr : default_registry().find(name);
    oracle::Verdict v;
    std::unique_ptr<Implementation> backward_impl;
    if (entry && c.backward) {
      backward_impl = entry->make();
      if (!backward_impl->has_backward()) backward_impl.reset();
    }
    if (backward_impl) {
      // The backward re-run on the file's inputs and cotangents, judged under the entry's
      // backward budget (or the file's, where no looser); the forward too when the file has
      // outputs to say it was part of the case.
      std::string note;
      const oracle::BudgetOptions gb = file_gradient_budget(c, budget, entry, &note);
      std::string why;
      if (!oracle::backward_in_scope(c.problem, &why))
        return error_verdict(path, entry->name, path + ": holds backward inputs for a problem outside the backward's "
                                                       "scope: " + why);
      oracle::BackwardContext context(c.meta("gdn.case_name", path), c.problem, c.inputs, *c.backward);
      v = oracle::evaluate_backward(*backward_impl, context, gb);
      if (v.status == oracle::Status::skipped && c.gradients) {
        // It cannot run here (a GPU kernel without a device): the gradients the file holds are
        // judged as they are rather than hidden behind SKIPPED.
        const std::string why_not = v.message;
        v = judge_file_gradients(c, c.meta("gdn.case_name", path), entry->name, gb);
        v.message = "judged the gradients stored in the file; the backward was not re-run: " + why_not +
                    (v.message.empty() ? "" : "; " + v.message);
      } else {
        v.message += std::string(v.message.empty() ? "" : "; ") + "re-ran " + entry->name + "'s backward";
      }
      if (!note.empty()) v.message += "; " + note;
      if (c.outputs) {
        std::string forward_note;
        const oracle::BudgetOptions b = file_budget(c, budget, entry, &forward_note);
        oracle::CaseContext forward_context(c.meta("gdn.case_name", path), c.problem, c.inputs);
        oracle::Verdict f = oracle::evaluate(*backward_impl, forward_context, b);
        if (!forward_note.empty()) f.message += (f.message.empty() ? "" : "; ") + forward_note;
        v = v.status == oracle::Status::skipped ? f : f.status == oracle::Status::skipped ? v : combine_verdicts(f, v);
      }
    } else if (entry) {
      std::string note;
      const oracle::BudgetOptions b = file_budget(c, budget, entry, &note);
      oracle::CaseContext context(c.meta("gdn.case_name", path), c.problem, c.inputs);
      auto impl = entry->make();
      v = oracle::evaluate(*impl, context, b);
      v.message += std::string(v.message.empty() ? "" : "; ") + "re-ran " + entry->name;
      if (!note.empty()) v.message += "; " + note;
      if (c.gradients) {
        // An implementation without a backward: the stored gradients are judged as they are,
        // under its gradient budget, and a SKIPPED forward does not hide them.
        std::string gradient_note;
        const oracle::BudgetOptions gb = file_gradient_budget(c, budget, entry, &gradient_note);
        oracle::Verdict g = judge_file_gradients(c, c.meta("gdn.case_name", path),
                                                 c.meta("gdn.implementation", entry->name), gb);
        if (!gradient_note.empty()) g.message += (g.message.empty() ? "" : "; ") + gradient_note;
        g.message = "judged the gradients stored in the file" + (g.message.empty() ? "" : "; " + g.message);
        if (v.status == oracle::Status::skipped) g.message += "; the forward was not re-run: " + v.message;
        v = v.status == oracle::Status::skipped ? g : combine_verdicts(v, g);
      }
    } else if ((c.outputs || c.gradients) && !impl_given) {
      v = judge_case(c, path, budget, [](const std::string&) { return nullptr; });
      if (v.status != oracle::Status::error)
        v.message += std::string("; judged the ") +
                     (c.outputs && c.gradients ? "outputs and gradients" : c.gradients ? "gradients" : "outputs") +
                     " stored in the file (" +
                     (name.empty() ? std::string("no implementation named") : name + " is not registered here") + ")";
    } else if (!name.empty()) {
      return error_verdict(path, name, path + ": implementation '" + name + "' is not registered here (gdn-testbed list)");
    } else {
      return error_verdict(path, "(unnamed)", path + " names no implementation and holds no outputs: give --impl NAME");
    }
    v.case_name = path;
    return v;
  } catch (const std::bad_alloc&) {
    return error_verdict(path, "(unreadable)", path + ": out of memory while reading or judging it");
  } catch (const std::exception& e) {
    const std::string what = e.what();
    return error_verdict(path, "(unreadable)", what.find(path) != std::string::npos ? what : path + ": " + what);
  }
}

int replay(const ReplayOptions& o, const std::string& command) {
  if (o.files.empty()) throw UsageError("replay needs a case file");
  if (o.impl_option->count() > 0 && default_registry().find(o.impl) == nullptr)
    throw UsageError("--impl: implementation '" + o.impl + "' is not registered here (gdn-testbed list)");
  const auto budget = o.budget.get();
  std::vector<oracle::Verdict> verdicts;
  for (const std::string& path : o.files) {
    oracle::Verdict v = replay_one(o, path, budget);
    std::cout << v.details() << "\n";
    verdicts.push_back(std::move(v));
  }
  o.files_out.write("gdn-testbed replay", command, verdicts);
  if (tally(verdicts).skipped == static_cast<int>(verdicts.size())) {
    std::cout << "replay: SKIPPED (the implementation cannot run here)\n";
    return 77;
  }
  if (o.expect.empty()) return exit_code(verdicts);
  for (const oracle::Verdict& v : verdicts) {
    const bool matches = o.expect == "pass" ? v.passed() : v.status == oracle::Status::fail;
    if (!matches) {
      std::cout << "expected " << o.expect << ", got " << oracle::status_name(v.status) << " for " << v.case_name << "\n";
      return 1;
    }
  }
  std::cout << "every verdict is " << o.expect << ", as expected\n";
  return 0;
}

}  // namespace

void add_replay(CLI::App& app, Context& context) {
  CLI::App* sub = app.add_subcommand(
      "replay",
      "re-run the implementation a case file names (or --impl NAME) and judge it; a file with outputs but "
      "no runnable implementation is judged on its outputs. Exit 77 when it cannot run here (SKIPPED).");
  auto o = std::make_shared<ReplayOptions>();
  sub->add_option("FILE", o->files, "case files (.safetensors), e.g. those fuzz saved")->type_name("");
  o->impl_option = sub->add_option("--impl", o->impl, "run this implementation instead of the one the file names")
                       ->type_name("NAME");
  add_budget(*sub, &o->budget,
             "the file's gdn.budget where it is no looser than the implementation's own, else that");
  sub->add_option("--expect", o->expect, "exit 0 iff every verdict is this (pass: PASS, fail: FAIL)")
      ->type_name("pass|fail")
      ->check(CLI::IsMember({"pass", "fail"}).description(""));
  add_verdict_files(*sub, &o->files_out);
  add_case_limits(*sub, &o->limits);
  sub->callback([o, &context] { context.exit_code = replay(*o, context.command_line); });
}

}  // namespace gdn::cli
