#pragma once
// Precision emulation (§7): what a straightforward kernel in the problem's storage precisions
// computes on these very inputs. Inputs are already stored in their dtypes (the Inputs
// contract); state, gates and accumulation are fp32; o is rounded once to the input dtype,
// hT and the per-token states once to the state dtype (no rounding for fp32 states). The error this makes against the double oracle is the baseline that error
// budgets scale from.
#include "core/implementation.hpp"

namespace gdn::reference {

using gdn::Formulation;

Outputs<double> emulate(const Problem& problem, const Inputs& inputs, Formulation formulation,
                        int chunk_size = 64);

}  // namespace gdn::reference
