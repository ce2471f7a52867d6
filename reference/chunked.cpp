#include "reference/chunked.hpp"

#include <algorithm>
#include <cmath>

#include "reference/prepare.hpp"

namespace gdn::reference {

template <class Scalar>
Outputs<Scalar> chunked(const Problem& problem, const Inputs& inputs, int chunk_size,
                        ChunkTrace<Scalar>* trace) {
  if (chunk_size < 1) throw ProblemError("chunk_size", "must be >= 1, got " + std::to_string(chunk_size));
  validate(problem, inputs);
  if (problem.store_intermediate_states)
    throw ProblemError("store_intermediate_states",
                       "is a per-token option; use the sequential reference for it");
  Outputs<Scalar> out = allocate_outputs<Scalar>(problem, inputs);
  const int HV = problem.HV, K = problem.K, V = problem.V;
  const int C = chunk_size;

  // Work buffers sized once for a full chunk; blocks of them serve shorter chunks.
  Matrix<Scalar> S(K, V), S_next(K, V);
  Matrix<Scalar> gram(C, C), attention(C, C);
  Matrix<Scalar> rhs(C, K + V);        // [diag(beta e^gamma) K | diag(beta) V], solved in place -> [W | U]
  Matrix<Scalar> stacked(2 * C, K);    // [W ; diag(e^gamma) Q]: one product with S0 serves both
  Matrix<Scalar> stacked_state(2 * C, V);
  Matrix<Scalar> vnew(C, V), decayed_keys(C, K), chunk_output(C, V);
  Matrix<Scalar> queries(C, K), keys(C, K), values(C, V);
  Vector<Scalar> gamma(C), betas(C);
  std::vector<int> segment_start(static_cast<std::size_t>(C));

  for (int n = 0; n < problem.N(); ++n) {
    const std::int64_t row = state_row(problem, inputs, n);
    if (row < 0) continue;
    const std::int64_t begin = problem.seq_begin(n), length = problem.seq_len(n);
    for (int j = 0; j < HV; ++j) {
      const int h = j / problem.group_size();
      initial_state(problem, inputs, row, j, S);
      int chunk_index = 0;
      for (std::int64_t start = begin; start < begin + length; start += C, ++chunk_index) {
        using std::exp;
        const int c = static_cast<int>(std::min<std::int64_t>(C, begin + length - start));
        // Gather the chunk into small contiguous buffers (stays in cache; no converted copy
        // of the whole input is ever made).
        // A token whose exp(g) is exactly 0 (g = -inf, or an underflowing g = -1e4) resets the
        // state: every decay factor spanning it is exactly 0 in Scalar. The cumulative sum
        // restarts there (segment_start), which is the same algebra, but never forms
        // -inf - (-inf) = NaN, nor differences of huge sums that lose |gamma| * u of accuracy.
        Scalar running = 0;
        int segment = -1;  // first token of the current segment; -1: from the chunk's start
        for (int i = 0; i < c; ++i) {
          load_qk(problem, inputs, start + i, h, &queries(i, 0), &keys(i, 0));
          values.row(i) = Eigen::Map<const Vector<double>>(inputs.v.data() + ((start + i) * HV + j) * V, V)
                              .transpose()
                              .template cast<Scalar>();
          Scalar g;
          load_gates(problem, inputs, start + i, j, &g, &betas(i));
          if (exp(g) == Scalar(0)) {
            segment = i;
            running = 0;
          } else {
            running += g;
          }
          gamma(i) = running;
          segment_start[i] = segment;
        }
        // exp(gamma_i) from the chunk's start, exp(gamma_c - gamma_i) to its end: 0 across a reset.
        auto decay_from_start = [&](int i) { return segment_start[i] < 0 ? exp(gamma(i)) : Scalar(0); };
        auto decay_to_end = [&](int i) {
          return segment_start[i] == segment_start[c - 1] ? exp(gamma(c - 1) - gamma(i)) : Scalar(0);
        };
        const auto Q = queries.topRows(c);
        const auto Kc = keys.topRows(c);
        const auto Vc = values.topRows(c);
        auto beta = [&](int i) { return betas(i); };

        // A = strictly lower (beta_i e^(gamma_i - gamma_j) k_i.k_j); the decay always from the
        // difference, never a quotient of exponentials (§4).
        auto G = gram.topLeftCorner(c, c);
        G.noalias() = Kc * Kc.transpose();
        auto P = attention.topLeftCorner(c, c);
        P.noalias() = Q * Kc.transpose();
        for (int i = 0; i < c; ++i) {
          const int s = std::max(segment_start[i], 0);
          G.row(i).head(s).setZero();  // pairs across a reset
          P.row(i).head(s).setZero();
          // Vectorised exp of the row's differences (Eigen's packet exp).
          const auto decay = (gamma(i) - gamma.segment(s, i - s).array()).exp().transpose();
          G.row(i).segment(s, i - s).array() *= beta(i) * decay;
          P.row(i).segment(s, i - s).array() *= decay;
          P.row(i).tail(c - 1 - i).setZero();  // Mask: i >= j
        }
        auto R = rhs.topLeftCorner(c, K + V);
        for (int i = 0; i < c; ++i) {
          R.row(i).head(K) = (beta(i) * decay_from_start(i)) * Kc.row(i);
          R.row(i).tail(V) = beta(i) * Vc.row(i);
        }
        // [W | U] = (I + A)^-1 R by forward substitution on the unit lower triangle.
        G.template triangularView<Eigen::StrictlyUpper>().setZero();
        G.template triangularView<Eigen::UnitLower>().solveInPlace(R);

        auto WQ = stacked.topRows(2 * c);
        WQ.topRows(c) = R.leftCols(K);
        for (int i = 0; i < c; ++i) WQ.row(c + i) = decay_from_start(i) * Q.row(i);
        auto WQ_S = stacked_state.topRows(2 * c);
        WQ_S.noalias() = WQ * S;
        auto Vn = vnew.topRows(c);
        Vn = R.rightCols(V) - WQ_S.topRows(c);  // Vnew = U - W S0

        // O = diag(e^gamma) Q S0 + (Mask . QK^T . E) Vnew   (scale is folded into Q)
        // Computed in a buffer of its own, then copied: a product written straight into the
        // output would start at whatever alignment the packing gives, and Eigen's vectorisation
        // (which peels for alignment) would round differently at different positions in the
        // pack: the reference would not be batch invariant.
        auto Oc = chunk_output.topRows(c);
        Oc = WQ_S.bottomRows(c);
        Oc.noalias() += P * Vn;
        Eigen::Map<Matrix<Scalar>, 0, Eigen::OuterStride<>> O(out.o.data() + (start * HV + j) * V, c, V,
                                                             Eigen::OuterStride<>(HV * V));
        O = Oc;

        // S_end = e^gamma_c S0 + K^T diag(e^(gamma_c - gamma)) Vnew
        auto DK = decayed_keys.topRows(c);
        for (int i = 0; i < c; ++i) DK.row(i) = decay_to_end(i) * Kc.row(i);
        S_next = decay_from_start(c - 1) * S;
        S_next.noalias() += DK.transpose() * Vn;

        if (trace) {
          ChunkRecord<Scalar> record;
          record.sequence = n;
          record.head = j;
          record.chunk = chunk_index;
          record.begin = start;
          record.length = c;
          record.gamma = gamma.head(c);
          record.A = G.template triangularView<Eigen::StrictlyLower>();
          record.T = Matrix<Scalar>::Identity(c, c);
          G.template triangularView<Eigen::UnitLower>().solveInPlace(record.T);
          record.W = R.leftCols(K);
          record.U = R.rightCols(V);
          record.Vnew = Vn;
          record.S0 = S;
          record.S_end = S_next;
          trace->records.push_back(std::move(record));
        }
        S.swap(S_next);
      }
      if (problem.has_hT) store_state(problem, S, row, j, out.hT.data());
    }
  }
  return out;
}

template Outputs<float> chunked<float>(const Problem&, const Inputs&, int, ChunkTrace<float>*);
template Outputs<double> chunked<double>(const Problem&, const Inputs&, int, ChunkTrace<double>*);
template Outputs<long double> chunked<long double>(const Problem&, const Inputs&, int,
                                                   ChunkTrace<long double>*);

}  // namespace gdn::reference
