#pragma once
// The conformance suite: built-in cases that cover the operator's options (varlen with empty
// sequences, chunk boundaries, GVA, l2norm, small-norm and zero q/k rows under l2norm, every
// dtype, every gate regime, beta up to 2, fused gates, both state layouts, the state cache with
// padding rows, shared and out-of-order slots, decode batches of Ts = 1, C - 1, C, C + 1,
// per-token states, lengths 0, 1, C - 1, C, C + 1 at the start, middle and end of a pack for
// C = 64 and 37, zero keys ending sequences after strong decays), and the golden vectors of
// public implementations, built into the binary.
// Each feature a registered implementation supports is in at least two cases of different
// shapes (cli/suite_test.cpp checks it against the registry).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "cli/campaign.hpp"

namespace gdn::cli {

std::vector<GeneratedCase> conformance_cases();

// What `gdn-testbed conformance` judges, without the golden vectors: every implementation of
// `entries` on every built-in case (case-major), against the long double oracle, under `budget`
// or else the entry's default; kernels (RegistryEntry::check_reproducibility) with their
// reproducibility checks (oracle/reproducibility.hpp): a second run and the reversed pack must
// repeat the bits.
std::vector<oracle::Verdict> conformance_verdicts(const std::vector<const oracle::RegistryEntry*>& entries,
                                                  const std::optional<oracle::BudgetOptions>& budget);

// The built-in cases the backward covers (oracle::backward_in_scope: the cases with a state
// cache or per-token states are left out; *out_of_scope counts them), each with its cotangents
// drawn by fuzz::make_backward_inputs from the case's own seed (its generator's "seed"): what
// `conformance --backward` judges and `generate --suite conformance --backward` writes.
struct BackwardCase {
  GeneratedCase generated;
  BackwardInputs cotangents;
  std::uint64_t seed = 0;
};
std::vector<BackwardCase> backward_conformance_cases(std::size_t* out_of_scope = nullptr);

// What `gdn-testbed conformance --backward` adds: every implementation of `entries` on every
// case of backward_conformance_cases (case-major), its backward judged against the long double
// sequential adjoint (oracle::evaluate_backward), under `budget` (applied to gradients by
// oracle::gradient_budget in evaluate_gradients) or else the entry's backward budget (oracle::backward_budget_of).
// Case names end in "/backward". SKIPPED with the reason for an implementation without a
// backward or one that does not support the case. Kernels (check_reproducibility) run the
// backward once more and on the reversed pack, bit for bit (add_backward_reproducibility_checks).
std::vector<oracle::Verdict> backward_conformance_verdicts(const std::vector<const oracle::RegistryEntry*>& entries,
                                                           const std::optional<oracle::BudgetOptions>& budget);

// The golden-vector verdicts of the double references (empty when the golden loader is not
// built in). Each golden case gives one verdict per reference, with the golden tolerance as
// the budget (reference/golden.hpp). The cases are the ones built into the binary, or those of
// the folder GDN_GOLDEN_DIR names (reference::load_all_golden); a loading error is thrown.
std::vector<oracle::Verdict> golden_verdicts(bool* available, std::string* why);

}  // namespace gdn::cli
