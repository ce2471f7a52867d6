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
#include "core/problem.hpp"

namespace gdn::reference {

// What the backward takes beyond the forward's Problem and Inputs: the loss's gradient with
// respect to the forward's outputs.
struct BackwardInputs {
  HostTensor<double> dO;   // [T, HV, V], required
  HostTensor<double> dhT;  // state_shape() in the problem's layout; only with has_hT; undefined = zero
};

// The gradients, mirroring Inputs: a tensor is defined exactly when the forward's input it
// differentiates is used by the problem (dg, dbeta with direct gates; da, db, dA_log, ddt_bias
// with fused gates; dh0 with has_h0, in the problem's state layout).
template <class Scalar>
struct Gradients {
  HostTensor<Scalar> dq, dk;            // [T, H, K]  (summed over the value heads of a group)
  HostTensor<Scalar> dv;                // [T, HV, V]
  HostTensor<Scalar> dg, dbeta;         // [T, HV]   (GateMode::direct)
  HostTensor<Scalar> da, db;            // [T, HV]   (GateMode::fused)
  HostTensor<Scalar> dA_log, ddt_bias;  // [HV]      (GateMode::fused)
  HostTensor<Scalar> dh0;               // state_shape(), when has_h0

  template <class U>
  Gradients<U> cast() const {
    Gradients<U> out;
    out.dq = dq.template cast<U>();
    out.dk = dk.template cast<U>();
    out.dv = dv.template cast<U>();
    out.dg = dg.template cast<U>();
    out.dbeta = dbeta.template cast<U>();
    out.da = da.template cast<U>();
    out.db = db.template cast<U>();
    out.dA_log = dA_log.template cast<U>();
    out.ddt_bias = ddt_bias.template cast<U>();
    out.dh0 = dh0.template cast<U>();
    return out;
  }

  // Every tensor with its name, defined or not, in a fixed order (for comparisons and reports).
  template <class F>
  void for_each(F&& f) const {
    f("dq", dq); f("dk", dk); f("dv", dv); f("dg", dg); f("dbeta", dbeta); f("da", da); f("db", db);
    f("dA_log", dA_log); f("ddt_bias", ddt_bias); f("dh0", dh0);
  }
  template <class F>
  void for_each(F&& f) {
    f("dq", dq); f("dk", dk); f("dv", dv); f("dg", dg); f("dbeta", dbeta); f("da", da); f("db", db);
    f("dA_log", dA_log); f("ddt_bias", ddt_bias); f("dh0", dh0);
  }
};

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
// (docs/backward.md, "Comparing gradients").
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
