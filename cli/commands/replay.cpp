// gdn-testbed replay: re-run the implementation a case file names (or --impl NAME) on its
// inputs and judge it; a file with outputs but no runnable implementation is judged on the
// outputs it holds. --expect pass|fail turns the verdict into the exit status.
#include <iostream>
#include <memory>

#include "cli/commands/commands.hpp"
#include "cli/commands/options.hpp"
#include "cli/output.hpp"
#include "cli/registry_all.hpp"

namespace gdn::cli {

namespace {

struct ReplayOptions {
  std::vector<std::string> files;
  std::string impl;
  CLI::Option* impl_option = nullptr;
  BudgetChoice budget;
  std::string expect;
  VerdictFiles files_out;
};

int replay(const ReplayOptions& o, const std::string& command) {
  if (o.files.empty()) throw UsageError("replay needs a case file");
  const bool impl_given = o.impl_option->count() > 0;
  std::vector<oracle::Verdict> verdicts;
  for (const std::string& path : o.files) {
    const oracle::CaseFile c = oracle::read_case_file(path);
    const std::string name = impl_given ? o.impl : c.meta("gdn.implementation");
    const oracle::RegistryEntry* entry = name.empty() ? nullptr : default_registry().find(name);
    oracle::CaseContext context(c.meta("gdn.case_name", path), c.problem, c.inputs);
    oracle::Verdict v;
    if (entry) {
      auto impl = entry->make();
      v = oracle::evaluate(*impl, context, file_budget(c, o.budget.get(), entry));
      v.message += std::string(v.message.empty() ? "" : "; ") + "re-ran " + entry->name;
    } else if (c.outputs && !impl_given) {
      v = oracle::evaluate_outputs(name.empty() ? "(outputs in file)" : name, formulation_of(c), chunk_size_of(c), context,
                                   *c.outputs, file_budget(c, o.budget.get(), nullptr));
      v.message = "judged the outputs stored in the file (" +
                  (name.empty() ? std::string("no implementation named") : name + " is not registered here") + ")";
    } else if (!name.empty()) {
      throw UsageError("implementation '" + name + "' is not registered here (gdn-testbed list)");
    } else {
      throw UsageError(path + " names no implementation and holds no outputs: give --impl NAME");
    }
    v.case_name = path;
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
  add_budget(*sub, &o->budget, "the file's gdn.budget, else the implementation's own");
  sub->add_option("--expect", o->expect, "exit 0 iff every verdict is this (pass: PASS, fail: FAIL)")
      ->type_name("pass|fail")
      ->check(CLI::IsMember({"pass", "fail"}).description(""));
  add_verdict_files(*sub, &o->files_out);
  sub->callback([o, &context] { context.exit_code = replay(*o, context.command_line); });
}

}  // namespace gdn::cli
