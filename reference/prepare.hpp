#pragma once
// The part of the recurrence that is the same for every formulation: inputs converted to the
// reference's scalar, l2norm (§2), scale folded into q, and the gates (§3) resolved into
// g and beta. Both the sequential and the chunked reference read their inputs through this.
#include <cmath>
#include <vector>

#include "core/problem.hpp"

namespace gdn::reference {

template <class Scalar>
Scalar softplus(Scalar x) {
  using std::exp;
  using std::log1p;
  return x > Scalar(20) ? x : log1p(exp(x));
}

template <class Scalar>
Scalar sigmoid(Scalar x) {
  using std::exp;
  return Scalar(1) / (Scalar(1) + exp(-x));
}

// g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b) (x2 with negative eigenvalues).
template <class Scalar>
void fused_gates(Scalar a, Scalar b, Scalar A_log, Scalar dt_bias, bool allow_negative_eigenvalues,
                 Scalar* g, Scalar* beta) {
  using std::exp;
  *g = -exp(A_log) * softplus(a + dt_bias);
  *beta = sigmoid(b) * (allow_negative_eigenvalues ? Scalar(2) : Scalar(1));
}

template <class Scalar>
void l2normalize(Scalar* x, int n) {
  using std::sqrt;
  Scalar sum = 0;
  for (int i = 0; i < n; ++i) sum += x[i] * x[i];
  const Scalar inv = Scalar(1) / sqrt(sum + Scalar(1e-6));
  for (int i = 0; i < n; ++i) x[i] *= inv;
}

// q^ (times scale) and k^ of token t, query/key head h, in Scalar: the l2norm of §2 when the
// problem asks for it. Row by row, so the chunked reference can gather a chunk into small
// buffers without materialising converted copies of whole tensors.
template <class Scalar>
void load_qk(const Problem& problem, const Inputs& inputs, std::int64_t t, int h, Scalar* q, Scalar* k) {
  const std::int64_t base = (t * problem.H + h) * problem.K;
  for (int i = 0; i < problem.K; ++i) {
    q[i] = static_cast<Scalar>(inputs.q[base + i]);
    k[i] = static_cast<Scalar>(inputs.k[base + i]);
  }
  if (problem.use_qk_l2norm) {
    l2normalize(q, problem.K);
    l2normalize(k, problem.K);
  }
  const Scalar scale = static_cast<Scalar>(problem.effective_scale());
  for (int i = 0; i < problem.K; ++i) q[i] *= scale;
}

// g and beta of token t, value head j: given directly (g, or log(alpha) with linear gates), or
// through the fused gates of §3.
template <class Scalar>
void load_gates(const Problem& problem, const Inputs& inputs, std::int64_t t, int j, Scalar* g, Scalar* beta) {
  const std::int64_t i = t * problem.HV + j;
  if (problem.gate_mode == GateMode::direct) {
    using std::log;
    // Linear gates hold alpha = exp(g): g is its log in Scalar (log(0) = -inf, the reset), the
    // log of an exact input, so the problem itself is not rounded.
    *g = problem.linear_gates() ? log(static_cast<Scalar>(inputs.g[i])) : static_cast<Scalar>(inputs.g[i]);
    *beta = static_cast<Scalar>(inputs.beta[i]);
  } else {
    fused_gates<Scalar>(static_cast<Scalar>(inputs.a[i]), static_cast<Scalar>(inputs.b[i]),
                        static_cast<Scalar>(inputs.A_log[j]), static_cast<Scalar>(inputs.dt_bias[j]),
                        problem.allow_negative_eigenvalues, g, beta);
  }
}

}  // namespace gdn::reference
