#pragma once
// The definition (§2): token by token, per (sequence, value head). Double is the oracle,
// long double certifies it, float emulates fp32 accumulation.
#include "core/problem.hpp"

namespace gdn::reference {

// Validates, then runs the recurrence. Throws ProblemError for malformed problems/inputs.
template <class Scalar>
Outputs<Scalar> sequential(const Problem& problem, const Inputs& inputs);

extern template Outputs<float> sequential<float>(const Problem&, const Inputs&);
extern template Outputs<double> sequential<double>(const Problem&, const Inputs&);
extern template Outputs<long double> sequential<long double>(const Problem&, const Inputs&);

}  // namespace gdn::reference
