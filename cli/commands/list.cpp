// gdn-testbed list: the registered implementations, whether they can run here, their default
// budgets, and whether they have a backward (and its budget).
#include <iostream>

#include "cli/commands/commands.hpp"
#include "cli/commands/options.hpp"
#include "cli/registry_all.hpp"

namespace gdn::cli {

namespace {

int list() {
  for (const oracle::RegistryEntry& e : default_registry().entries()) {
    std::string why;
    const auto impl = e.make();
    const bool available = impl->available(&why);
    std::cout << e.name << (e.in_conformance ? "" : "  [not in 'all']") << (e.gpu ? "  [gpu]" : "")
              << (available ? "" : "  [unavailable: " + why + "]") << "\n    " << e.description
              << "\n    default budget: " << e.default_budget.describe() << "\n    backward: "
              << (impl->has_backward() ? "budget " + oracle::backward_budget_of(e).describe() : std::string("none"))
              << "\n";
  }
  return 0;
}

}  // namespace

void add_list(CLI::App& app, Context& context) {
  CLI::App* sub = app.add_subcommand("list", "registered implementations and their default budgets");
  sub->callback([&context] { context.exit_code = list(); });
}

}  // namespace gdn::cli
