#pragma once
// Reproducibility: what must hold bit for bit, whatever the budget. An implementation that
// declares itself deterministic (Implementation::deterministic, every kernel of this project)
// gives the same bits for the same inputs, and batch invariant ones give each sequence the
// same bits wherever it sits in a pack. A race or a read of uninitialised memory often stays
// within every error budget and shows only here. The GPU testbed's bitwise properties and
// `gdn-testbed conformance` both judge through these functions.
#include <string>
#include <vector>

#include "core/gradients.hpp"
#include "core/implementation.hpp"
#include "oracle/budget.hpp"

namespace gdn::oracle {

bool bits_equal(const HostTensor<double>& a, const HostTensor<double>& b);
// o, hT and intermediate states bit for bit (undefined tensors compare equal to undefined ones).
bool outputs_bits_equal(const Outputs<double>& a, const Outputs<double>& b);

// The problem restricted to (and reordered as) the given sequences, with the inputs sliced to
// match; state-cache slots keep their numbers, dense states move with their sequence.
void select_sequences(const Problem& problem, const Inputs& inputs, const std::vector<int>& order,
                      Problem* out_problem, Inputs* out_inputs);

// Bitwise comparison of sequence `n` of (p, out) with sequence `m` of (q, other): o rows,
// intermediate rows and its final state (dense row or cache slot). Empty when equal, else a
// description of the first difference.
std::string compare_sequence_bits(const Problem& p, const Inputs& in, const Outputs<double>& out, int n,
                                  const Problem& q, const Inputs& qin, const Outputs<double>& other, int m);

// Exact rules beyond any budget (docs/semantics.md, state cache): padding sequences output
// exactly +0 (o and intermediate) and cache slots no sequence names come back bit for bit as
// they went in. "" when they hold, else the first violation.
std::string check_exact_rules(const Problem& problem, const Inputs& inputs, const Outputs<double>& out);

// Batch invariance of a run that gave `packed`: the pack reversed (every sequence moves, the
// cache slots stay) must give each sequence the same bits. "" when it does, else the first
// difference; a problem of fewer than two sequences is trivially invariant.
std::string reversed_pack_diff(Implementation& implementation, const Problem& problem, const Inputs& inputs,
                               const Outputs<double>& packed);

// The reproducibility checks of a case an implementation already ran (`first`, its outputs):
// one more run on the same inputs must give the same bits (metric "repeat_bits"), the reversed
// pack each sequence's bits ("repack_bits", with two or more sequences), and the exact rules
// hold ("exact_rules"). Each check's error is 0 (pass) or 1 (the property is violated; the
// basis says where), its budget 0. An implementation that throws on a rerun gives a failing
// check whose basis is the exception's text.
std::vector<Check> reproducibility_checks(Implementation& implementation, const Problem& problem,
                                          const Inputs& inputs, const Outputs<double>& first);

// Adds reproducibility_checks to a PASS or FAIL verdict of `implementation` on (problem,
// inputs) whose outputs were `first`; a violated check turns PASS into FAIL and says why in the
// message (a race or uninitialised memory: run it under compute-sanitizer). SKIPPED and ERROR
// verdicts are left as they are.
void add_reproducibility_checks(Verdict& verdict, Implementation& implementation, const Problem& problem,
                                const Inputs& inputs, const Outputs<double>& first);

// ---- the backward (Implementation::backward) ----------------------------------------------

// The reproducibility checks of a backward run that gave `first` on (problem, inputs,
// cotangents; `first` has the problem's gradient shapes, as a PASS or FAIL verdict's run does;
// the reruns' shapes are checked here): one more run on the same inputs must give the same bits, one check per gradient
// tensor the problem has (metric "repeat_bits": the error is the number of bits that differ
// over the tensor, the budget 0, the basis how many elements differ and where the first is);
// with two or more sequences, the reversed pack (inputs and cotangents reordered) must give
// each sequence the same bits in its token rows of dq ... db and its dh0 row ("repack_bits",
// batch invariance; dA_log and ddt_bias, sums over every sequence, are left out: the order of
// their terms moves with the pack). A rerun that throws gives a failing check naming it.
std::vector<Check> backward_reproducibility_checks(Implementation& implementation, const Problem& problem,
                                                   const Inputs& inputs, const BackwardInputs& cotangents,
                                                   const Gradients<double>& first);

// Adds backward_reproducibility_checks to a PASS or FAIL gradient verdict as
// add_reproducibility_checks does for outputs (a violation turns PASS into FAIL and the message
// says to run the sanitizers); SKIPPED and ERROR verdicts are left as they are.
void add_backward_reproducibility_checks(Verdict& verdict, Implementation& implementation, const Problem& problem,
                                         const Inputs& inputs, const BackwardInputs& cotangents,
                                         const Gradients<double>& first);

}  // namespace gdn::oracle
