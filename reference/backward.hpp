#pragma once
// The backward (docs/semantics.md §6, docs/backward.md): the gradient of a scalar loss
// L = <dO, o> + <dhT, hT> with respect to every input of the operator, computed as the exact
// adjoint of the recurrence of §2 (a reverse sweep over the tokens of each sequence and value
// head), through the in-kernel l2norm, the scale, GVA and the fused gates of §3. Templated on
// the scalar like the forward: double is the oracle, long double certifies it.
//
// Scope (docs/backward.md says why): dense states only. A state cache (slots, -1 padding) and
// per-token states are inference options no training framework differentiates; the backward
// rejects them with a ProblemError naming the option, before any work.
#include "core/gradients.hpp"
#include "core/problem.hpp"

namespace gdn::reference {

// The containers live in core/gradients.hpp (the oracle, case files and Python use them too);
// the reference's names are aliases.
using gdn::BackwardInputs;
using gdn::Gradients;

// Validates the forward's problem and inputs (gdn::validate), then what the backward adds:
// no state cache, no per-token states, dO of shape [T, HV, V], dhT (when given) only with
// has_hT and of shape state_shape(). Throws ProblemError naming the argument and the rule.
void validate_backward(const Problem& problem, const Inputs& inputs, const BackwardInputs& backward);

// The adjoint of §2, token by token in reverse. The states the reverse sweep needs are
// recomputed from checkpoints every ceil(sqrt(L)) tokens (memory O(sqrt(L) K V) per sequence
// and head, work twice the forward's).
//
// term_magnitudes (optional): for every gradient element, the sum of the magnitudes of the
// terms its last step adds up (e.g. sum_ij |dSd_ij Sd_ij| for dg_t = <dSd, Sd_t>), carried
// through the l2norm, GVA and gate chain rules with absolute values. A gradient can cancel to
// far below the values it is made of (dg above all); rounding errors scale with these
// magnitudes, not with the result, so budgets and comparisons are normwise relative to them
// (docs/backward.md, "Comparing gradients"). A sum formed in the step enters with its terms'
// magnitude, never its cancelled value (the read dS + qs dO^T, p, u = beta (v - p), the state
// after the write S = Sd + k u^T in dq, du = dS^T k, dp, dSd, and 1 - sigmoid(b) in db: 1 +
// sigmoid(b)); the carried states (S before the token, dS after it) enter with their values; dh0, the
// adjoint state after the whole reverse sweep, with the magnitudes of every term the sweep
// added to it (dhT and each token's read and write, decayed), not with |dh0|.
template <class Scalar>
Gradients<Scalar> sequential_backward(const Problem& problem, const Inputs& inputs, const BackwardInputs& backward,
                                      Gradients<Scalar>* term_magnitudes = nullptr);

extern template Gradients<float> sequential_backward<float>(const Problem&, const Inputs&, const BackwardInputs&,
                                                            Gradients<float>*);
extern template Gradients<double> sequential_backward<double>(const Problem&, const Inputs&,
                                                              const BackwardInputs&, Gradients<double>*);
extern template Gradients<long double> sequential_backward<long double>(const Problem&, const Inputs&,
                                                                        const BackwardInputs&,
                                                                        Gradients<long double>*);

// The scalar loss the gradients differentiate, L = <dO, o> + <dhT, hT>, accumulated in Scalar
// (what finite-difference checks evaluate).
template <class Scalar>
Scalar backward_loss(const Problem& problem, const Outputs<Scalar>& outputs, const BackwardInputs& backward);

extern template float backward_loss<float>(const Problem&, const Outputs<float>&, const BackwardInputs&);
extern template double backward_loss<double>(const Problem&, const Outputs<double>&, const BackwardInputs&);
extern template long double backward_loss<long double>(const Problem&, const Outputs<long double>&,
                                                       const BackwardInputs&);

}  // namespace gdn::reference
