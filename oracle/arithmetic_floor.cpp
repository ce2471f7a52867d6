#include "oracle/arithmetic_floor.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "reference/prepare.hpp"
#include "reference/state_io.hpp"

namespace gdn::oracle {

bool ArithmeticFloor::applies() const { return largest <= std::numeric_limits<float>::max(); }

ArithmeticFloor arithmetic_floor(const Problem& problem, const Inputs& inputs, double unit, Formulation formulation,
                                 int chunk_size) {
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
  // The chunked form's intra-chunk dot products (arithmetic_floor.hpp): per chunk, each token's
  // k^, Vnew = beta delta, the energy a[v] of its Vnew error from A's draws, and the decay
  // e^(gamma_i - gamma_l) from each earlier token l to the current one.
  const int C = formulation == Formulation::chunked && chunk_size >= 1 ? chunk_size : 0;
  Matrix<double> chunk_keys(std::max(C, 1), K), chunk_vnew(std::max(C, 1), V), chunk_a(std::max(C, 1), V);
  std::vector<double> chunk_decay(std::size_t(std::max(C, 1))), dP2, P2, dA2, chunk_energy(V);
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
      double gate_relative = 0;  // energy of the shared relative error in S (decays, writes)
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
        // The chunked form: this token's place in its chunk, and the squared errors of its
        // P_il (l <= pos) and A_il (l < pos) with the squared P_il themselves.
        const int pos = C > 0 ? static_cast<int>((t - problem.seq_begin(n)) % C) : 0;
        if (C > 0) {
          for (int l = 0; l < pos; ++l) chunk_decay[l] *= alpha;
          chunk_decay[pos] = 1;
          for (int kk = 0; kk < K; ++kk) chunk_keys(pos, kk) = k[kk];
          dP2.assign(pos + 1, 0.0);
          P2.assign(pos + 1, 0.0);
          dA2.assign(pos + 1, 0.0);
          for (int l = 0; l <= pos; ++l) {
            double qk = 0, qk_terms2 = 0, kk_terms2 = 0;
            for (int kk = 0; kk < K; ++kk) {
              const double term = q[kk] * chunk_keys(l, kk), key_term = k[kk] * chunk_keys(l, kk);
              qk += term;
              qk_terms2 += term * term;
              kk_terms2 += key_term * key_term;
            }
            const double d2 = chunk_decay[l] * chunk_decay[l];
            dP2[l] = u2 * K * qk_terms2 * d2;
            P2[l] = qk * qk * d2;
            if (l < pos) dA2[l] = beta * beta * u2 * K * kk_terms2 * d2;
          }
        }
        double decayed_norm2 = 0, updated_norm2 = 0, write_norm2 = 0;
        // The token's other scalars, each one draw shared by the head: the l2norm factors
        // 1 / sqrt(sum x^2 + 1e-6) (the K-term sum errs by u sqrt(K) |x*x|_2, halved by the sqrt,
        // then the sqrt's and the reciprocal's roundings, u / 2 each) and a fused beta (about
        // 2u, as for fused g). rq scales o_t; rk and beta scale the write k^ beta delta.
        auto norm_error = [&](const HostTensor<double>& x) {
          if (!problem.use_qk_l2norm) return 0.0;
          const double* row = x.data() + (t * problem.H + h) * K;
          double sum2 = 0, sum4 = 0;
          for (int kk = 0; kk < K; ++kk) {
            sum2 += row[kk] * row[kk];
            sum4 += row[kk] * row[kk] * row[kk] * row[kk];
          }
          const double sum_error = 0.5 * root_k * std::sqrt(sum4) / (sum2 + 1e-6);
          return std::sqrt(sum_error * sum_error + 0.5);
        };
        const double q_error = norm_error(inputs.q), k_error = norm_error(inputs.k);
        const double beta_error = problem.gate_mode == GateMode::fused ? 2.0 : 0.0;
        const double write_step = (k_error * k_error + beta_error * beta_error) * u2;
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
          if (C > 0) {
            // Vnew = beta delta; the errors of the row's shared P and A draws, in energy.
            chunk_vnew(pos, vv) = beta * delta;
            double a = 0;
            for (int l = 0; l < pos; ++l) a += dA2[l] * chunk_vnew(l, vv) * chunk_vnew(l, vv);
            chunk_a(pos, vv) = a;
            double energy_v = 0;
            for (int l = 0; l <= pos; ++l)
              energy_v += dP2[l] * chunk_vnew(l, vv) * chunk_vnew(l, vv) + P2[l] * chunk_a(l, vv);
            chunk_energy[vv] = energy_v;
          }
          // Per element, this step's roundings: the decay; the K-term dot product S^T k (a
          // K-term sum errs by about u sqrt(K) |terms|_2: relative to its terms, not to its
          // result, which may cancel), written back along k; the sum S + k beta delta; the
          // delta itself with the l2norm of k (relative sqrt(K) u) and beta's rounding.
          const double along_k = u2 * beta * beta * (K * dot_terms2 + (1 + K) * delta * delta);
          double read = 0, read_terms2 = 0, o = 0;
          for (int kk = 0; kk < K; ++kk) {
            const double decayed = S(kk, vv);
            track(k[kk] * beta * delta);
            write_norm2 += k[kk] * beta * delta * k[kk] * beta * delta;
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
        const double write_share = updated_norm2 > 0 ? std::min(1.0, write_norm2 / updated_norm2) : 0.0;
        gate_relative = share * (gate_relative + gate_step) + write_share * write_step;
        for (int vv = 0; vv < V; ++vv) {
          double& shared_o = shared.o.data()[(t * HV + j) * V + vv];
          shared_o *= std::sqrt(gate_relative + q_error * q_error * u2);
          if (C > 0) shared_o = std::sqrt(shared_o * shared_o + chunk_energy[vv]);
        }
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
