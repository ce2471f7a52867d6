#pragma once
// The backward's property suite (docs/backward.md, "Properties"): relations every correct
// backward satisfies, written once against a backward function so that the two references
// (and later kernels) are held to the same statements. Cases come from the one generator
// (gen_case) restricted to what the backward covers (backward_space: dense fp32 states, no
// per-token states, log-space gates); the cotangents dO, dhT from make_backward_inputs.
//
// Budgets: a run's gradients may differ from the exact ones by rel x M per tensor, M the
// largest term magnitude of that tensor (reference::sequential_backward's term_magnitudes,
// so that cancellation in dg or dbeta is judged against what the terms were, not against the
// small result) and rel the analytic relative bound of the forward's model at the run's
// formulation (oracle::analytic_relative_bound, docs/budgets.md "(d) analytic"). A relation
// between several runs allows the sum of their budgets. Relations that hold bit for bit for the
// references (packing independence) are compared exactly.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/implementation.hpp"
#include "fuzz/generators.hpp"
#include "fuzz/properties.hpp"
#include "reference/backward.hpp"

namespace gdn::fuzz {

// A backward under test: its formulation decides its budget (chunk size for the chunked form).
struct BackwardImplementation {
  std::string name;
  Formulation formulation = Formulation::sequential;
  int chunk_size = 64;
  std::function<reference::Gradients<double>(const Problem&, const Inputs&, const reference::BackwardInputs&)> run;
};

BackwardImplementation sequential_backward_reference();
BackwardImplementation chunked_backward_reference(int chunk_size);

// The backward's share of a case space (oracle::backward_in_scope): everything but a state
// cache, per-token states, reduced-precision states and linear-space gates.
CaseSpace backward_space(CaseSpace space);

// Seeded cotangents: dO ~ N(0, 1) rounded to the input dtype (it is the gradient of o), dhT
// ~ N(0, 1) in fp32 when the problem has a final state (absent for one draw in four, which the
// contract reads as zero).
reference::BackwardInputs make_backward_inputs(const Problem& problem, std::uint64_t seed);

// The largest term magnitude of every gradient tensor (reference::sequential_backward's
// term_magnitudes, in double), 0 for tensors the problem has not.
struct GradientScale {
  double dq = 0, dk = 0, dv = 0, dg = 0, dbeta = 0, da = 0, db = 0, dA_log = 0, ddt_bias = 0, dh0 = 0;
  double of(const std::string& tensor) const;
};
GradientScale gradient_scale(const Problem& problem, const Inputs& inputs, const reference::BackwardInputs& backward);

// The largest normwise relative difference over the tensors: max |x - y| / M per tensor.
// Tensors defined in one and not the other count as infinitely different.
double gradient_difference(const reference::Gradients<double>& x, const reference::Gradients<double>& y,
                           const GradientScale& scale, std::string* worst_tensor = nullptr);

// (a) The implementation's gradients equal sequential_backward<double> within both budgets.
PropertyResult backward_matches_sequential(const BackwardImplementation& impl, const Case& c);
// (b) State carry run backwards: one sequence split at a random token (ends included) gives
//     the unsplit gradients when the second part starts from the first part's final state
//     (forward) and the first part's dhT is the second part's dh0 (backward); per-token
//     gradients concatenate, dA_log and ddt_bias add.
PropertyResult backward_state_carry(const BackwardImplementation& impl, const Case& c);
// (c) Packing independence: every sequence run alone gives, bit for bit, its rows and its dh0
//     of the packed run; dA_log and ddt_bias (sums over all sequences) add up within budgets.
PropertyResult backward_packing_independence(const BackwardImplementation& impl, const Case& c);
// (d) Every gradient is linear in the cotangents: grad(x dO1 + y dO2, x dhT1 + y dhT2) =
//     x grad(dO1, dhT1) + y grad(dO2, dhT2), x, y in {+-1, +-2, +-4}.
PropertyResult backward_linear_in_cotangents(const BackwardImplementation& impl, const Case& c);
// (e) GVA equals repeated heads: with q and k repeated along the head axis (HV = H), dq and dk
//     summed over each group give the GVA dq, dk; every other gradient is the same (a case
//     with group 1 is widened to group 2 first).
PropertyResult backward_gva_equals_repeated_heads(const BackwardImplementation& impl, const Case& c);
// (f) beta = 0 (direct gates, no l2norm): the state only decays, and the gradients have a
//     closed form, evaluated in long double: dq_t = scale e^{G_t} S0 dO_t, dk = dv = 0,
//     dS_t = sum_{s>=t} e^{G_s - G_t} qs_s dO_s^T + e^{G_L - G_t} dhT,
//     dbeta_t = (dS_t^T k_t) . (v_t - e^{G_t} S0^T k_t), dg_t = sum_{s>=t} e^{G_s} qs_s^T S0 dO_s
//     + e^{G_L} <dhT, S0>, dh0 = dS_0.
PropertyResult backward_pure_decay(const BackwardImplementation& impl, const Case& c);
// (g) A hard reset (g = -inf, or a = 1e4 with fused gates) at a random token r of a sequence:
//     dg_r (da_r) is exactly 0, the tokens before r get the gradients of the prefix run alone
//     with dhT = 0, the tokens from r on those of the suffix run alone from a zero state, and
//     dh0 those of the prefix.
PropertyResult backward_reset(const BackwardImplementation& impl, const Case& c);

struct BackwardProperty {
  std::string name;
  std::function<PropertyResult(const BackwardImplementation&, const Case&)> check;
};
const std::vector<BackwardProperty>& all_backward_properties();

}  // namespace gdn::fuzz
