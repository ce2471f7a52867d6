#pragma once
// The part of the recurrence that is the same for every formulation: inputs converted to the
// reference's scalar, l2norm (§2), scale folded into q, and the gates (§3) resolved into
// g and beta. Both the sequential and the chunked reference start from this.
#include <cmath>
#include <vector>

#include "core/problem.hpp"

namespace gdn::reference {

template <class Scalar>
struct Prepared {
  std::vector<Scalar> q;     // [T, H, K], normalised if use_qk_l2norm, times scale
  std::vector<Scalar> k;     // [T, H, K], normalised if use_qk_l2norm
  std::vector<Scalar> v;     // [T, HV, V]
  std::vector<Scalar> g;     // [T, HV], log decay
  std::vector<Scalar> beta;  // [T, HV]
};

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

template <class Scalar>
Prepared<Scalar> prepare(const Problem& problem, const Inputs& inputs) {
  Prepared<Scalar> out;
  auto convert = [](const HostTensor<double>& t) {
    return std::vector<Scalar>(t.storage().begin(), t.storage().end());
  };
  out.q = convert(inputs.q);
  out.k = convert(inputs.k);
  out.v = convert(inputs.v);
  const std::int64_t rows = problem.T * problem.H;
  if (problem.use_qk_l2norm) {
    for (std::int64_t r = 0; r < rows; ++r) {
      l2normalize(out.q.data() + r * problem.K, problem.K);
      l2normalize(out.k.data() + r * problem.K, problem.K);
    }
  }
  const Scalar scale = static_cast<Scalar>(problem.effective_scale());
  for (Scalar& x : out.q) x *= scale;
  if (problem.gate_mode == GateMode::direct) {
    out.g = convert(inputs.g);
    out.beta = convert(inputs.beta);
  } else {
    const std::int64_t n = problem.T * problem.HV;
    out.g.resize(static_cast<std::size_t>(n));
    out.beta.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t j = i % problem.HV;
      fused_gates<Scalar>(static_cast<Scalar>(inputs.a[i]), static_cast<Scalar>(inputs.b[i]),
                          static_cast<Scalar>(inputs.A_log[j]), static_cast<Scalar>(inputs.dt_bias[j]),
                          problem.allow_negative_eigenvalues, &out.g[static_cast<std::size_t>(i)],
                          &out.beta[static_cast<std::size_t>(i)]);
    }
  }
  return out;
}

}  // namespace gdn::reference
