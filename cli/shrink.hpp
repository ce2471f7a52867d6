#pragma once
// Shrinking a failing case to a small one that still fails. It works on the concrete data
// (Problem + Inputs), not on a generator's seed: every candidate is a slice of the current
// case (fewer sequences, shorter ones, fewer heads, a smaller K or V, fewer features), so the
// values that triggered the failure stay the same values, and cases read from files (an
// external implementation's failures) shrink as well as generated ones.
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "core/problem.hpp"

namespace gdn::cli {

struct ConcreteCase {
  Problem problem;
  Inputs inputs;
};

// Which part of a case to keep. Query/key head h' of the result is original query_heads[h'],
// value head j' is original value_heads[j']; with group = value_heads.size() /
// query_heads.size(), value head j' must belong to query head j' / group (GVA stays GVA).
// K and V keep their first K, V entries.
struct Selection {
  struct Sequence {
    int index;            // original sequence
    std::int64_t length;  // tokens kept from its start (<= its length)
  };
  std::vector<Sequence> sequences;
  std::vector<int> query_heads, value_heads;
  int K = 1, V = 1;
};

Selection select_all(const Problem& problem);
// The sub-case. Throws ProblemError when the selection does not fit the problem.
ConcreteCase apply(const ConcreteCase& source, const Selection& selection);

struct ShrinkOptions {
  int max_evaluations = 400;   // calls of the predicate
  double max_seconds = 20.0;   // wall time
  // Stops early when it returns true (e.g. SIGINT): the best case so far is returned.
  std::function<bool()> interrupted;
};

struct ShrinkResult {
  ConcreteCase smallest;
  int evaluations = 0;
  int accepted = 0;  // candidates that still failed and were taken
  double seconds = 0;
  bool stopped_early = false;  // a limit or an interrupt ended it before a fixed point
  std::vector<std::string> steps;  // what each accepted candidate changed, in order
};

// still_fails(candidate) must be true for `failing` itself (not re-checked). Greedy: passes
// over the candidate list until none is accepted or a limit is reached.
ShrinkResult shrink(const ConcreteCase& failing, const std::function<bool(const ConcreteCase&)>& still_fails,
                    const ShrinkOptions& options = {});

// Elements summed over all input tensors: the size measure that shrinking reduces.
std::int64_t case_size(const ConcreteCase& c);

}  // namespace gdn::cli
