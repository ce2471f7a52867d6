#pragma once
// Implementations selectable by name (the CLI's --impl, conformance, fuzz). The references
// are always registered; other layers add theirs through Registry::add, e.g. the CUDA layer's
// `void gdn::cuda::register_implementations(gdn::oracle::Registry&)`, which the CLI calls when
// built with CUDA. Explicit registration, not static initialisers: those are dropped when the
// object file sits in a static library nobody references.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/implementation.hpp"
#include "oracle/budget.hpp"

namespace gdn::oracle {

struct RegistryEntry {
  std::string name;
  std::string description;
  std::function<std::unique_ptr<Implementation>()> make;
  // The budget the implementation is judged by unless the user names another (docs/budgets.md):
  // calibrated for anything kernel-like, tight fixed thresholds for the double references.
  BudgetOptions default_budget;
  // In the default conformance set. Planted-fault copies are registered but not default.
  bool in_conformance = true;
  // Kernels on a device: reported SKIPPED, never passed, when unavailable.
  bool gpu = false;
  // Conformance reruns each case, and the reversed pack, and compares the bits
  // (oracle/reproducibility.hpp): for kernels, whose races and uninitialised reads often stay
  // within every budget. The references are deterministic by construction and are not rerun.
  bool check_reproducibility = false;
  // The budget the entry's backward (Implementation::has_backward) is judged by unless the user
  // names another (docs/budgets.md "Gradients"); absent, the default_budget applied to gradients
  // (oracle::gradient_budget, in evaluate_gradients): calibrated for kernels. The exact references set analytic here,
  // since their forward's tight fixed thresholds have no notion of a gradient's cancellation.
  std::optional<BudgetOptions> backward_budget;
};

// entry.backward_budget, else entry.default_budget (evaluate_gradients applies gradient_budget).
BudgetOptions backward_budget_of(const RegistryEntry& entry);

class Registry {
 public:
  // Throws std::invalid_argument when the name is taken or empty.
  void add(RegistryEntry entry);
  const RegistryEntry* find(const std::string& name) const;
  const std::vector<RegistryEntry>& entries() const { return entries_; }
  // Comma-separated names; "all" for the conformance set, "*" for every entry, or a trailing
  // '*' as a prefix match ("reference.*"). Throws std::invalid_argument naming the unknown one.
  std::vector<const RegistryEntry*> select(const std::string& names) const;

 private:
  std::vector<RegistryEntry> entries_;
};

// The references (sequential and chunked in double and long double, the fp32 emulations, each
// with its backward) and the planted-fault copies (fault.*, see implementations.hpp; the
// fault.backward_* ones plant their bug in the backward).
void register_references(Registry& registry);

}  // namespace gdn::oracle
