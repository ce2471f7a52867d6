#pragma once
// The conformance suite: built-in cases that cover the operator's options (varlen with empty
// sequences, chunk boundaries, GVA, l2norm, every dtype, every gate regime, beta up to 2, fused
// gates, both state layouts, the state cache with padding, per-token states), and the golden
// vectors of public implementations when they are built in.
#include <vector>

#include "cli/campaign.hpp"

namespace gdn::cli {

std::vector<GeneratedCase> conformance_cases();

// The golden-vector verdicts of the double references (empty when the golden loader is not
// built in). Each golden case gives one verdict per reference, with the golden tolerance as
// the budget (reference/golden.hpp).
std::vector<oracle::Verdict> golden_verdicts(bool* available, std::string* why);

}  // namespace gdn::cli
