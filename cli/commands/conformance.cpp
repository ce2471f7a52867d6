// gdn-testbed conformance: the built-in cases (cli/suite.cpp) and the golden vectors against
// the selected implementations, judged against the long double recurrence; a verdict table,
// exit 1 on any FAIL or ERROR. Kernels (RegistryEntry::check_reproducibility) run each case
// twice more, once as given and once with the pack reversed, and must repeat their bits.
// --backward adds, after those, the backward's verdicts (backward_conformance_verdicts: the
// built-in cases in the backward's scope with seeded cotangents, gradients judged against the
// long double adjoint) in the same table, files and exit status; --backward-only judges the
// backward alone.
#include <chrono>
#include <iostream>
#include <memory>

#include "cli/commands/commands.hpp"
#include "cli/commands/options.hpp"
#include "cli/output.hpp"
#include "cli/suite.hpp"

namespace gdn::cli {

namespace {

struct ConformanceOptions {
  std::string impl = "all";
  BudgetChoice budget;
  VerdictFiles files;
  bool verbose = false;
  bool no_golden = false;
  bool backward = false;
  bool backward_only = false;
};

int conformance(const ConformanceOptions& o, const std::string& command) {
  const auto entries = select(o.impl);
  const auto budget = o.budget.get();
  const auto start = std::chrono::steady_clock::now();
  std::vector<oracle::Verdict> verdicts;
  if (!o.backward_only) verdicts = conformance_verdicts(entries, budget);
  std::string golden_note;
  if (!o.no_golden && !o.backward_only) {
    bool available = false;
    std::string why;
    try {
      for (oracle::Verdict& v : golden_verdicts(&available, &why)) verdicts.push_back(std::move(v));
    } catch (const std::exception& e) {
      oracle::Verdict v;
      v.case_name = "golden";
      v.implementation = "golden loader";
      v.status = oracle::Status::error;
      v.message = e.what();
      verdicts.push_back(v);
      available = true;
    }
    if (!available) golden_note = "golden vectors: not run (" + why + ")";
  }
  const bool backward = o.backward || o.backward_only;
  if (backward)
    for (oracle::Verdict& v : backward_conformance_verdicts(entries, budget)) verdicts.push_back(std::move(v));
  print_table(std::cout, verdicts, o.verbose);
  if (!golden_note.empty()) std::cout << golden_note << "\n";
  std::cout << "oracle: "
            << (o.backward_only ? "the adjoint of the recurrence in long double"
                : backward      ? "the recurrence in long double, for gradients its adjoint"
                                : "the recurrence in long double")
            << "; "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s\n";
  o.files.write("gdn-testbed conformance", command, verdicts);
  return exit_code(verdicts);
}

}  // namespace

void add_conformance(CLI::App& app, Context& context) {
  CLI::App* sub = app.add_subcommand(
      "conformance",
      "built-in cases (and the golden vectors) against implementations; verdict table, exit 1 on any "
      "FAIL/ERROR. GPU kernels without a device are SKIPPED, never passed. The default command.");
  auto o = std::make_shared<ConformanceOptions>();
  sub->add_option("--impl", o->impl, "comma-separated names, 'all' (the conformance set), 'prefix*', '*' (gdn-testbed list)")
      ->type_name("LIST")
      ->capture_default_str();
  add_budget(*sub, &o->budget, "each implementation's own");
  add_verdict_files(*sub, &o->files);
  sub->add_flag("--verbose", o->verbose, "every check and metric of failed verdicts below the table");
  sub->add_flag("--no-golden", o->no_golden, "leave out the golden vectors of public implementations");
  sub->add_flag("--backward", o->backward,
                "also judge the backward of every selected implementation that has one (after the forward "
                "verdicts; case names end in /backward): the built-in cases without a state cache or per-token "
                "states, cotangents drawn from each case's seed; implementations without a backward are SKIPPED");
  sub->add_flag("--backward-only", o->backward_only, "judge the backward only (no forward, no golden vectors)");
  sub->callback([o, &context] { context.exit_code = conformance(*o, context.command_line); });
}

}  // namespace gdn::cli
