#include "reference/backward_chunked.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "reference/backward_impl.hpp"
#include "reference/prepare.hpp"

namespace gdn::reference {

template <class Scalar>
Gradients<Scalar> chunked_backward(const Problem& problem, const Inputs& inputs, const BackwardInputs& backward,
                                   int chunk_size, ChunkBackwardTrace<Scalar>* trace) {
  using std::exp;
  if (chunk_size < 1) throw ProblemError("chunk_size", "must be >= 1, got " + std::to_string(chunk_size));
  validate_backward(problem, inputs, backward);
  const int HV = problem.HV, K = problem.K, V = problem.V;

  // The forward's intermediates of every chunk: S0 at every chunk start, gamma, T, W, U, Vnew.
  ChunkTrace<Scalar> forward;
  chunked<Scalar>(problem, inputs, chunk_size, &forward);

  detail::RecurrenceGradients<Scalar> raw(problem);
  std::size_t next = 0;  // first record of the current (sequence, head)
  Matrix<Scalar> dS(K, V);
  for (int n = 0; n < problem.N(); ++n) {
    for (int j = 0; j < HV; ++j) {
      const int h = j / problem.group_size();
      std::size_t end = next;
      while (end < forward.records.size() && forward.records[end].sequence == n && forward.records[end].head == j)
        ++end;
      dS.setZero();
      if (backward.dhT.defined()) load_state<Scalar>(problem, backward.dhT.data(), n, j, dS);
      for (std::size_t r = end; r-- > next;) {
        const ChunkRecord<Scalar>& rec = forward.records[r];
        const int c = rec.length;
        const std::int64_t start = rec.begin;
        // The chunk's inputs as the forward read them (scale folded into Q), and its segments:
        // a token whose exp(g) is exactly 0 resets, and its gamma restarts at 0 (chunked.cpp).
        Matrix<Scalar> Q(c, K), Kc(c, K), Vc(c, V), dO(c, V);
        Vector<Scalar> beta(c);
        std::vector<int> seg(static_cast<std::size_t>(c));
        std::vector<char> reset(static_cast<std::size_t>(c), 0);
        int segment = -1;
        for (int i = 0; i < c; ++i) {
          load_qk(problem, inputs, start + i, h, &Q(i, 0), &Kc(i, 0));
          Vc.row(i) = Eigen::Map<const Vector<double>>(inputs.v.data() + ((start + i) * HV + j) * V, V)
                          .transpose()
                          .template cast<Scalar>();
          dO.row(i) = Eigen::Map<const Vector<double>>(backward.dO.data() + ((start + i) * HV + j) * V, V)
                          .transpose()
                          .template cast<Scalar>();
          Scalar g;
          load_gates(problem, inputs, start + i, j, &g, &beta(i));
          if (exp(g) == Scalar(0)) {
            segment = i;
            reset[static_cast<std::size_t>(i)] = 1;
          }
          seg[static_cast<std::size_t>(i)] = segment;
        }
        const auto same = [&](int x, int y) { return seg[static_cast<std::size_t>(x)] == seg[static_cast<std::size_t>(y)]; };
        const Vector<Scalar>& gamma = rec.gamma;
        // a_i = exp(gamma_i) from the chunk's start, b_i = exp(gamma_c - gamma_i) to its end,
        // E_ij = exp(gamma_i - gamma_j) for j <= i: zero across a reset, as in the forward.
        Vector<Scalar> a(c), b(c);
        Matrix<Scalar> E = Matrix<Scalar>::Zero(c, c);
        for (int i = 0; i < c; ++i) {
          a(i) = seg[static_cast<std::size_t>(i)] < 0 ? exp(gamma(i)) : Scalar(0);
          b(i) = same(i, c - 1) ? exp(gamma(c - 1) - gamma(i)) : Scalar(0);
          for (int l = 0; l < i; ++l) E(i, l) = same(i, l) ? exp(gamma(i) - gamma(l)) : Scalar(0);
          E(i, i) = 1;
        }
        const Matrix<Scalar>& S0 = rec.S0;
        const Matrix<Scalar>& W = rec.W;
        const Matrix<Scalar>& U = rec.U;
        const Matrix<Scalar>& Vn = rec.Vnew;
        const Matrix<Scalar>& T = rec.T;
        const Matrix<Scalar> Gk = Kc * Kc.transpose();
        const Matrix<Scalar> QK = Q * Kc.transpose();
        Matrix<Scalar> P = Matrix<Scalar>::Zero(c, c);
        for (int i = 0; i < c; ++i)
          for (int l = 0; l <= i; ++l) P(i, l) = E(i, l) * QK(i, l);

        Vector<Scalar> da = Vector<Scalar>::Zero(c), db = Vector<Scalar>::Zero(c), dbeta = Vector<Scalar>::Zero(c);
        const Matrix<Scalar> dS_end = dS;
        // S_end = a_c S0 + K^T diag(b) Vnew
        Matrix<Scalar> dS0 = a(c - 1) * dS_end;
        da(c - 1) += dS_end.cwiseProduct(S0).sum();
        const Matrix<Scalar> KdS = Kc * dS_end;  // [c, V]
        Matrix<Scalar> dVn = b.asDiagonal() * KdS;
        Matrix<Scalar> dK = b.asDiagonal() * (Vn * dS_end.transpose());
        for (int i = 0; i < c; ++i) db(i) += KdS.row(i).dot(Vn.row(i));
        // O = diag(a) Q S0 + P Vnew, P = Mask . (Q K^T) . E
        const Matrix<Scalar> QS0 = Q * S0;
        Matrix<Scalar> dQ = a.asDiagonal() * (dO * S0.transpose());
        dS0.noalias() += Q.transpose() * (a.asDiagonal() * dO);
        for (int i = 0; i < c; ++i) da(i) += QS0.row(i).dot(dO.row(i));
        Matrix<Scalar> dP = dO * Vn.transpose();
        dVn.noalias() += P.transpose() * dO;
        Matrix<Scalar> dQK = Matrix<Scalar>::Zero(c, c), dE = Matrix<Scalar>::Zero(c, c);
        for (int i = 0; i < c; ++i)
          for (int l = 0; l <= i; ++l) {
            dQK(i, l) = dP(i, l) * E(i, l);
            dE(i, l) = dP(i, l) * QK(i, l);
          }
        dQ.noalias() += dQK * Kc;
        dK.noalias() += dQK.transpose() * Q;
        // Vnew = U - W S0
        const Matrix<Scalar> dU = dVn;
        const Matrix<Scalar> dW = -dVn * S0.transpose();
        dS0.noalias() -= W.transpose() * dVn;
        // [W | U] = T R, T = (I + A)^-1: dR = T^T d[W | U], dA = -dR [W | U]^T (strictly lower).
        const Matrix<Scalar> dX = T.transpose() * dW;  // R's key part: diag(beta a) K
        const Matrix<Scalar> dY = T.transpose() * dU;  // R's value part: diag(beta) V
        Matrix<Scalar> dA = -(dX * W.transpose() + dY * U.transpose());
        dA.template triangularView<Eigen::Upper>().setZero();
        Matrix<Scalar> dV(c, V);
        for (int i = 0; i < c; ++i) {
          const Scalar kx = Kc.row(i).dot(dX.row(i));
          dK.row(i) += (beta(i) * a(i)) * dX.row(i);
          dbeta(i) += a(i) * kx + Vc.row(i).dot(dY.row(i));
          da(i) += beta(i) * kx;
          dV.row(i) = beta(i) * dY.row(i);
        }
        // A_il = beta_i E_il (k_i . k_l), i > l
        Matrix<Scalar> dGk = Matrix<Scalar>::Zero(c, c);
        for (int i = 0; i < c; ++i)
          for (int l = 0; l < i; ++l) {
            dbeta(i) += dA(i, l) * E(i, l) * Gk(i, l);
            dE(i, l) += dA(i, l) * beta(i) * Gk(i, l);
            dGk(i, l) = dA(i, l) * beta(i) * E(i, l);
          }
        dK.noalias() += (dGk + dGk.transpose()) * Kc;
        // The decays' exponents: da_i/dgamma_i = a_i; db_i/dgamma_i = -b_i, db_i/dgamma_c = b_i;
        // dE_il/dgamma_i = E_il, dE_il/dgamma_l = -E_il.
        Vector<Scalar> dgamma(c);
        for (int i = 0; i < c; ++i) dgamma(i) = a(i) * da(i) - b(i) * db(i);
        dgamma(c - 1) += b.dot(db);
        for (int i = 0; i < c; ++i)
          for (int l = 0; l < i; ++l) {
            const Scalar e = E(i, l) * dE(i, l);
            dgamma(i) += e;
            dgamma(l) -= e;
          }
        // gamma_i = sum of g over the token's segment up to i (a reset token's gamma is the
        // constant 0), so dg_l = sum of dgamma_i over i >= l in l's segment (0 for a reset token).
        // That sum is not formed from dgamma: its terms cancel (-b_i db_i at i against +b_i db_i
        // at c, E_im dE_im at i against m), and for a strongly decaying token the result is far
        // below them. Summed in closed form, every term carries the token's own decay factor:
        //   dg_l = sum_{i >= l} a_i da_i + sum_{i < l} b_i db_i + sum_{i >= l > m} E_im dE_im.
        Matrix<Scalar> tail = Matrix<Scalar>::Zero(c + 1, c);  // tail(i, m) = sum_{i' >= i} E_i'm dE_i'm
        for (int i = c - 1; i >= 0; --i)
          for (int m = 0; m < c; ++m) tail(i, m) = tail(i + 1, m) + (m < i ? E(i, m) * dE(i, m) : Scalar(0));
        Scalar from_a = 0;  // sum_{i >= l} a_i da_i, built from the end
        for (int i = c - 1; i >= 0; --i) {
          from_a += a(i) * da(i);
          Scalar dg = from_a;
          for (int m = 0; m < i; ++m) dg += b(m) * db(m) + tail(i, m);
          const std::int64_t at = (start + i) * HV + j;
          raw.dg[static_cast<std::size_t>(at)] = reset[static_cast<std::size_t>(i)] ? Scalar(0) : dg;
          raw.dbeta[static_cast<std::size_t>(at)] = dbeta(i);
          Eigen::Map<Vector<Scalar>>(raw.dqs.data() + at * K, K) = dQ.row(i).transpose();
          Eigen::Map<Vector<Scalar>>(raw.dk.data() + at * K, K) = dK.row(i).transpose();
          Eigen::Map<Vector<Scalar>>(raw.dv.data() + at * V, V) = dV.row(i).transpose();
        }
        if (trace) {
          ChunkBackwardRecord<Scalar> record;
          record.forward = rec;
          record.dS_end = dS_end;
          record.dS0 = dS0;
          record.dVnew = dVn;
          record.dW = dW;
          record.dU = dU;
          record.dA = dA;
          record.dgamma = dgamma;
          trace->records.push_back(std::move(record));
        }
        dS = dS0;
      }
      if (problem.has_h0) store_state(problem, dS, n, j, raw.dh0.data());
      next = end;
    }
  }
  if (trace) {
    // Reverse sweeps record the chunks of a (sequence, head) last to first; restore forward order.
    auto& records = trace->records;
    std::size_t group_begin = 0;
    while (group_begin < records.size()) {
      std::size_t group_end = group_begin;
      while (group_end < records.size() && records[group_end].forward.sequence == records[group_begin].forward.sequence &&
             records[group_end].forward.head == records[group_begin].forward.head)
        ++group_end;
      std::reverse(records.begin() + static_cast<std::ptrdiff_t>(group_begin),
                   records.begin() + static_cast<std::ptrdiff_t>(group_end));
      group_begin = group_end;
    }
  }
  return detail::finish_gradients<Scalar>(problem, inputs, raw, nullptr, nullptr);
}

// float: the chunked backward's fp32 precision emulation (oracle/backward_budget.hpp).
template Gradients<float> chunked_backward<float>(const Problem&, const Inputs&, const BackwardInputs&, int,
                                                  ChunkBackwardTrace<float>*);
template Gradients<double> chunked_backward<double>(const Problem&, const Inputs&, const BackwardInputs&, int,
                                                    ChunkBackwardTrace<double>*);
template Gradients<long double> chunked_backward<long double>(const Problem&, const Inputs&, const BackwardInputs&,
                                                              int, ChunkBackwardTrace<long double>*);

}  // namespace gdn::reference
