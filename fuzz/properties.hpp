#pragma once
// The property suite of §2, written once against gdn::Implementation: the references' tests,
// the fuzzer and the GPU conformance suite all call these functions on their implementation.
// A property takes one generated Case, derives from it (deterministically, from its seed) the
// problems it needs, runs the implementation on them, and returns a verdict with the worst
// error over the error it was allowed. It never throws for a failing implementation; it
// throws only for a malformed case (ProblemError).
//
// Budgets: the oracle's (oracle/budget.hpp, docs/budgets.md). Every comparison of an
// implementation's output with a value it should equal allows, per output tensor (o, hT,
// intermediate states), the max-abs budget oracle::max_abs_allowance gives the run under the
// property's BudgetOptions: analytic for the double references (a rounding-error bound of the
// recurrence, docs/budgets.md "(d) analytic"), calibrated for kernels (factor x the error of
// the straightforward implementation in its own storage precisions on the very same input, plus
// a floor of a few units of the output dtype's rounding, relative to the magnitudes the
// computation handles). A relation between several runs of the implementation (state carry,
// packing, linearity, ...) holds exactly for the operator; for the implementation it may be
// off by the sum of the runs' budgets, each formed on that run's own input. Three relations are
// exact for every implementation this suite certifies, whatever the budget: packing
// independence (batch invariance, which the project's kernels have by construction),
// everything after an underflowing gate (computed from identical data once exp(g) = 0 zeroes
// the state), and store-and-retrieve on dyadic data (every intermediate is exact in fp32);
// they are compared bit for bit (up to the sign of zero).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/implementation.hpp"
#include "oracle/budget.hpp"
#include "fuzz/generators.hpp"

namespace gdn::fuzz {

enum class PropertyStatus { pass, fail, unsupported };

struct PropertyResult {
  PropertyStatus status = PropertyStatus::pass;
  std::string message;   // failures (every failing check), or why unsupported
  double worst_margin = 0;  // largest error / allowed over all checks (0 when all exact)
  int checks = 0;           // comparisons made
  bool passed() const { return status == PropertyStatus::pass; }
};

using PropertyFunction =
    std::function<PropertyResult(Implementation&, const Case&, const oracle::BudgetOptions&)>;

struct Property {
  std::string name;       // e.g. "state_carry"
  std::string statement;  // one line: what must hold
  PropertyFunction check;
};

// (a) o, hT (and intermediate states) equal reference::sequential<double> within the budget.
PropertyResult matches_sequential(Implementation& impl, const Case& c, const oracle::BudgetOptions& budget);
// (b) One sequence run whole equals the same sequence split at 1 to 4 random points (zero-length
//     parts included), each part started from the implementation's own final state of the
//     part before (passed back unchanged: fp32 from a kernel, double from a reference).
PropertyResult state_carry(Implementation& impl, const Case& c, const oracle::BudgetOptions& budget);
// (c) One sequence alone equals the same sequence packed at a random position among 1 to 3
//     random neighbours (dense states, or cache slots in random order with padding rows, when
//     the case uses a cache). Padding rows output exact zeros; cache slots nobody names come
//     back unchanged.
PropertyResult packing_independence(Implementation& impl, const Case& c, const oracle::BudgetOptions& budget);
// (d) GVA (HV = group * H) equals MHA with q and k repeated along the head axis (a case with
//     group 1 is widened to group 2 first).
PropertyResult gva_equals_repeated_heads(Implementation& impl, const Case& c, const oracle::BudgetOptions& budget);
// (e) use_qk_l2norm = true equals l2norm off with q, k normalised beforehand as §2 writes it
//     (x / sqrt(sum x^2 + 1e-6), in long double). The normalised inputs are passed in f64 when
//     the implementation supports it; otherwise they are rounded to the input dtype and the
//     effect of that rounding on the exact operator (measured with the double reference) is
//     added to the budget.
PropertyResult l2norm_equals_prenormalized(Implementation& impl, const Case& c, const oracle::BudgetOptions& budget);
// (f) o is linear in q: o(a q1 + b q2) = a o(q1) + b o(q2), hT does not depend on q. q1, q2 are
//     complementary random masks of q, a, b in {+-1, +-2, +-4}: every input is exactly
//     representable in its dtype. (l2norm is switched off, keys pre-normalised: it is not
//     linear.)
PropertyResult linear_in_q(Implementation& impl, const Case& c, const oracle::BudgetOptions& budget);
// (f) (o, hT) is jointly linear in (v, h0), the same construction on v and h0.
PropertyResult linear_in_v_and_h0(Implementation& impl, const Case& c, const oracle::BudgetOptions& budget);
// (g) beta = 0: S_t = exp(g_1 + ... + g_t) S_0 and o_t = S_t^T (scale q^_t), against that closed
//     form evaluated in long double.
PropertyResult pure_decay(Implementation& impl, const Case& c, const oracle::BudgetOptions& budget);
// (h) A token with g = -1e4 (exp(g) = 0 in every precision; fused gates: a = 1e4) makes every
//     later output and the final state independent of the earlier tokens (q, k, v, beta) and of
//     h0: replacing them changes nothing from that token on.
PropertyResult underflow_resets(Implementation& impl, const Case& c, const oracle::BudgetOptions& budget);
// (i) Keys and queries are unit basis vectors e_i, g = 0, beta = 1, scale = 1, no l2norm: each
//     token stores v in row i of the state and reads it back, so o_t = v_t and hT is h0 with the
//     written rows replaced by their last value, exactly.
PropertyResult exact_store_and_retrieve(Implementation& impl, const Case& c, const oracle::BudgetOptions& budget);
// (j) o, hT equal reference::sequential<long double> within the budget (certifies the double
//     references; for a kernel it is (a) against a more exact oracle).
PropertyResult matches_long_double(Implementation& impl, const Case& c, const oracle::BudgetOptions& budget);

// (k) Per-token states anchored without a second implementation: with the case's per-token
//     states switched on, (1) each sequence's last per-token state equals its final state hT,
//     (2) the state after token t of a sequence equals the final state of the prefix ending at
//     t, run alone from the same initial state (1 to 3 random t per case, the last token
//     included), and (3) padding rows store zero states. An implementation without per-token
//     states passes with no check (nothing to anchor); one that rejects the problem itself is
//     unsupported. Budgets: each run's max-abs allowance for its states.
PropertyResult intermediate_states_anchor(Implementation& impl, const Case& c, const oracle::BudgetOptions& budget);

// All of the above, in this order.
const std::vector<Property>& all_properties();
const Property& find_property(const std::string& name);  // throws std::invalid_argument

// For RapidCheck properties: RC_FAIL with the result's message when it failed, RC_DISCARD when
// the implementation does not support the derived problem.
void rc_require(const PropertyResult& result);

// ----- building blocks, shared with other tests ------------------------------------------

// The spec's l2norm in long double, rounded to double.
void l2normalize_rows(HostTensor<double>& x, int row_length);

}  // namespace gdn::fuzz
