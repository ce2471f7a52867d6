#include "oracle/arithmetic_floor.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "reference/prepare.hpp"
#include "reference/state_io.hpp"

namespace gdn::oracle {

bool ArithmeticFloor::applies() const { return largest <= std::numeric_limits<float>::max(); }

ArithmeticFloor arithmetic_floor(const Problem& problem, const Inputs& inputs, double unit) {
  validate(problem, inputs);
  using reference::Matrix;
  const int HV = problem.HV, K = problem.K, V = problem.V;
  ArithmeticFloor result;
  for (Outputs<double>* floor : {&result.independent, &result.shared}) {
    floor->o = HostTensor<double>(problem.v_shape());
    if (problem.has_hT) floor->hT = HostTensor<double>(problem.state_shape());
    if (problem.store_intermediate_states) floor->intermediate = HostTensor<double>(problem.intermediate_shape());
  }
  Outputs<double>& floor = result.independent;
  Outputs<double>& shared = result.shared;

  Matrix<double> S(K, V), energy(K, V);
  std::vector<double> q(K), k(K);
  const double root_k = std::sqrt(double(K));
  const double u2 = unit * unit;
  // NaN compares false with everything: record it as +inf so that applies() is false.
  auto track = [&result](double x) {
    const double magnitude = std::isnan(x) ? std::numeric_limits<double>::infinity() : std::fabs(x);
    result.largest = std::max(result.largest, magnitude);
  };
  for (int n = 0; n < problem.N(); ++n) {
    const std::int64_t row = reference::state_row(problem, inputs, n);
    if (row < 0) continue;
    for (int j = 0; j < HV; ++j) {
      const int h = j / problem.group_size();
      reference::initial_state(problem, inputs, row, j, S);
      energy.setZero();  // h0 is given exactly (fp32 values): it carries no error yet
      double gate_relative = 0;  // energy of the decays' shared relative error in S
      if (problem.seq_len(n) > 0) ++result.shared_groups;
      result.shared_tokens += problem.seq_len(n);
      for (std::int64_t t = problem.seq_begin(n); t < problem.seq_begin(n) + problem.seq_len(n); ++t) {
        reference::load_qk(problem, inputs, t, h, q.data(), k.data());
        double g, beta;
        reference::load_gates(problem, inputs, t, j, &g, &beta);
        const double alpha = std::exp(g);
        double k2 = 0;
        for (int kk = 0; kk < K; ++kk) k2 += k[kk] * k[kk];
        // Errors made earlier: decayed, and shrunk along k by (1 - beta |k|^2) (an error spread
        // evenly over the K directions loses beta (2 - beta) |k|^2 / K of its energy per step).
        const double contraction =
            alpha == 0 ? 0.0 : alpha * alpha * std::max(0.0, 1 - beta * (2 - beta) * k2 / K);
        // exp(g) rounds once (u / 2 relative); fused gates compute g itself with a few
        // roundings (exp, softplus, product: about 2u relative, an absolute 2u |g| in the
        // exponent). ONE draw per token shared by every element of the head's state (kept
        // apart: it does not average out over the elements); the rounding of each product
        // alpha S is independent.
        const double gate_error = 0.5 + (problem.gate_mode == GateMode::fused ? 2 * std::fabs(g) : 0.0);
        const double gate_step = gate_error * gate_error * u2;
        const double* v = inputs.v.data() + (t * HV + j) * V;
        double decayed_norm2 = 0, updated_norm2 = 0;
        for (int vv = 0; vv < V; ++vv) {
          double dot = 0, dot_terms2 = 0;
          for (int kk = 0; kk < K; ++kk) {
            S(kk, vv) *= alpha;
            dot += S(kk, vv) * k[kk];
            dot_terms2 += S(kk, vv) * k[kk] * S(kk, vv) * k[kk];
            track(S(kk, vv));
          }
          const double delta = v[vv] - dot;
          track(dot);
          track(delta);
          // Per element, this step's roundings: the decay; the K-term dot product S^T k (a
          // K-term sum errs by about u sqrt(K) |terms|_2: relative to its terms, not to its
          // result, which may cancel), written back along k; the sum S + k beta delta; the
          // delta itself with the l2norm of k (relative sqrt(K) u) and beta's rounding.
          const double along_k = u2 * beta * beta * (K * dot_terms2 + (1 + K) * delta * delta);
          double read = 0, read_terms2 = 0, o = 0;
          for (int kk = 0; kk < K; ++kk) {
            const double decayed = S(kk, vv);
            track(k[kk] * beta * delta);
            S(kk, vv) += k[kk] * beta * delta;
            track(S(kk, vv));
            decayed_norm2 += decayed * decayed;
            updated_norm2 += S(kk, vv) * S(kk, vv);
            double& e = energy(kk, vv);
            e = contraction * e + u2 * decayed * decayed + along_k * k[kk] * k[kk] + u2 * S(kk, vv) * S(kk, vv);
            read += q[kk] * q[kk] * e;
            read_terms2 += q[kk] * S(kk, vv) * q[kk] * S(kk, vv);
            o += q[kk] * S(kk, vv);
          }
          // o reads the state through q^: its own dot product, plus the state's independent
          // errors (in energy); the decays' shared error is relative to o itself.
          floor.o.data()[(t * HV + j) * V + vv] = unit * root_k * std::sqrt(read_terms2) + std::sqrt(read);
          shared.o.data()[(t * HV + j) * V + vv] = std::fabs(o);
          track(o);
          track(floor.o.data()[(t * HV + j) * V + vv]);
        }
        // The decays' shared error is a relative perturbation of the decayed part of S: of the
        // new S it is that part's share (at most all of it; none after an underflowing gate).
        const double share = updated_norm2 > 0 ? std::min(1.0, decayed_norm2 / updated_norm2) : 0.0;
        gate_relative = share * (gate_relative + gate_step);
        for (int vv = 0; vv < V; ++vv) shared.o.data()[(t * HV + j) * V + vv] *= std::sqrt(gate_relative);
        if (problem.store_intermediate_states) {
          reference::store_state(problem, energy.cwiseSqrt().eval(), t, j, floor.intermediate.data());
          reference::store_state(problem, (std::sqrt(gate_relative) * S.cwiseAbs()).eval(), t, j,
                                 shared.intermediate.data());
        }
      }
      if (problem.has_hT) {
        reference::store_state(problem, energy.cwiseSqrt().eval(), row, j, floor.hT.data());
        reference::store_state(problem, (std::sqrt(gate_relative) * S.cwiseAbs()).eval(), row, j, shared.hT.data());
      }
    }
  }
  for (const Outputs<double>* part : {&result.independent, &result.shared})
    for (const HostTensor<double>* f : {&part->o, &part->hT, &part->intermediate})
      for (std::int64_t i = 0; i < f->numel(); ++i)
        if (!std::isfinite((*f)[i])) result.largest = std::numeric_limits<double>::infinity();
  return result;
}

}  // namespace gdn::oracle
