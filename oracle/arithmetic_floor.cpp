#include "oracle/arithmetic_floor.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "reference/prepare.hpp"
#include "reference/state_io.hpp"

namespace gdn::oracle {

Outputs<double> arithmetic_floor(const Problem& problem, const Inputs& inputs, double unit) {
  validate(problem, inputs);
  using reference::Matrix;
  const int HV = problem.HV, K = problem.K, V = problem.V;
  Outputs<double> floor;
  floor.o = HostTensor<double>(problem.v_shape());
  if (problem.has_hT) floor.hT = HostTensor<double>(problem.state_shape());
  if (problem.store_intermediate_states) floor.intermediate = HostTensor<double>(problem.intermediate_shape());

  Matrix<double> S(K, V), column_floor(K, V);
  std::vector<double> q(K), k(K), handled(V), error(V);
  const double root_k = std::sqrt(double(K));
  for (int n = 0; n < problem.N(); ++n) {
    const std::int64_t row = reference::state_row(problem, inputs, n);
    if (row < 0) continue;
    for (int j = 0; j < HV; ++j) {
      const int h = j / problem.group_size();
      reference::initial_state(problem, inputs, row, j, S);
      // h0 is given exactly (fp32 values): it carries no error yet, only magnitude.
      double memory = 0;
      for (int vv = 0; vv < V; ++vv) handled[vv] = S.col(vv).norm();
      for (std::int64_t t = problem.seq_begin(n); t < problem.seq_begin(n) + problem.seq_len(n); ++t) {
        reference::load_qk(problem, inputs, t, h, q.data(), k.data());
        double g, beta;
        reference::load_gates(problem, inputs, t, j, &g, &beta);
        const double alpha = std::exp(g);
        S *= alpha;
        memory = alpha * memory + 1;  // alpha == 0: every earlier error is multiplied by 0
        double q_norm = 0, k_norm = 0;
        for (int kk = 0; kk < K; ++kk) {
          q_norm += q[kk] * q[kk];
          k_norm += k[kk] * k[kk];
        }
        q_norm = std::sqrt(q_norm);
        k_norm = std::sqrt(k_norm);
        const double* v = inputs.v.data() + (t * HV + j) * V;
        for (int vv = 0; vv < V; ++vv) {
          double dot = 0, dot_magnitude = 0;
          for (int kk = 0; kk < K; ++kk) {
            dot += S(kk, vv) * k[kk];
            dot_magnitude += std::fabs(S(kk, vv) * k[kk]);
          }
          const double update = beta * (v[vv] - dot);
          for (int kk = 0; kk < K; ++kk) S(kk, vv) += k[kk] * update;
          // The largest magnitude this column's roundings have been relative to, within memory.
          const double step = std::fabs(beta) * (std::fabs(v[vv]) + dot_magnitude) * k_norm;
          handled[vv] = std::max({alpha * handled[vv], S.col(vv).norm(), step});
          error[vv] = unit * std::sqrt(double(K) * memory) * handled[vv];
          double read_magnitude = 0;
          for (int kk = 0; kk < K; ++kk) read_magnitude += std::fabs(q[kk] * S(kk, vv));
          floor.o.data()[(t * HV + j) * V + vv] = unit * root_k * read_magnitude + q_norm * error[vv];
        }
        if (problem.store_intermediate_states) {
          for (int vv = 0; vv < V; ++vv) column_floor.col(vv).setConstant(error[vv]);
          reference::store_state(problem, column_floor, t, j, floor.intermediate.data());
        }
      }
      if (problem.has_hT) {
        for (int vv = 0; vv < V; ++vv) column_floor.col(vv).setConstant(memory > 0 ? error[vv] : 0.0);
        reference::store_state(problem, column_floor, row, j, floor.hT.data());
      }
    }
  }
  return floor;
}

}  // namespace gdn::oracle
