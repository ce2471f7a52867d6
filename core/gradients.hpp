#pragma once
// What the backward of the operator takes and returns (docs/semantics.md §6, docs/backward.md),
// beside the forward's Inputs and Outputs: the loss's gradients with respect to the forward's
// outputs (BackwardInputs) and the gradients with respect to its inputs (Gradients). The exact
// backward references (reference/backward.hpp), the gradient budgets (oracle/backward_budget.hpp),
// case files and the Python package all use these containers.
#include "core/problem.hpp"

namespace gdn {

// The loss's gradient with respect to the forward's outputs, L = <dO, o> + <dhT, hT>.
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

}  // namespace gdn
