#include "reference/backward_chunked.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "reference/backward_impl.hpp"
#include "reference/precision.hpp"
#include "reference/prepare.hpp"

namespace gdn::reference {
namespace {

// The products of the adjoint as written: Eigen's own, lazily (the reference's expressions
// unchanged, so chunked_backward<Scalar> computes exactly what it did before products were
// a parameter).
struct ExactProducts {
  template <class A, class B>
  static auto mul(const A& a, const B& b) {
    return a * b;
  }
};

float round_bf16(float x) { return static_cast<float>(Eigen::bfloat16(x)); }
float round_f16(float x) { return static_cast<float>(Eigen::half(x)); }

// x as the sum of `terms` values of the tensor cores' operand type, each the rounding of what
// the previous ones leave (terms 1: x rounded once; 2: hi + lo; 3: hi + mid + lo).
std::vector<Matrix<float>> split(const Matrix<float>& x, BackwardProducts products) {
  const int terms = products == BackwardProducts::tf32 || products == BackwardProducts::bf16 ||
                            products == BackwardProducts::f16
                        ? 1
                    : products == BackwardProducts::bf16x3 ? 3
                                                           : 2;
  float (*round)(float) = products == BackwardProducts::tf32 || products == BackwardProducts::tf32x3 ? round_tf32
                          : products == BackwardProducts::f16                                        ? round_f16
                                                                                                     : round_bf16;
  std::vector<Matrix<float>> out;
  Matrix<float> rest = x;
  for (int t = 0; t < terms; ++t) {
    Matrix<float> part = rest.unaryExpr(round);
    rest -= part;
    out.push_back(std::move(part));
  }
  return out;
}

// A tensor-core product of fp32 matrices: each operand split (split()), the partial products
// whose term indices add to at most terms - 1 (1: hi hi; 2: lo hi, hi lo, hi hi; 3: the six of
// bf16x3), each exact in fp32 accumulation as on the tensor cores, summed smallest first in fp32.
template <BackwardProducts kProducts>
struct RoundedProducts {
  template <class A, class B>
  static Matrix<float> mul(const A& a, const B& b) {
    const std::vector<Matrix<float>> x = split(Matrix<float>(a), kProducts), y = split(Matrix<float>(b), kProducts);
    const int terms = static_cast<int>(x.size());
    Matrix<float> sum = Matrix<float>::Zero(x[0].rows(), y[0].cols());
    for (int order = terms - 1; order >= 0; --order)
      for (int i = order; i >= 0; --i) sum.noalias() += x[static_cast<std::size_t>(i)] * y[static_cast<std::size_t>(order - i)];
    return sum;
  }
};

template <class Scalar, class Products>
Gradients<Scalar> chunked_backward_with(const Problem& problem, const Inputs& inputs, const BackwardInputs& backward,
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
        const Matrix<Scalar> Gk = Products::mul(Kc, Kc.transpose());
        const Matrix<Scalar> QK = Products::mul(Q, Kc.transpose());
        Matrix<Scalar> P = Matrix<Scalar>::Zero(c, c);
        for (int i = 0; i < c; ++i)
          for (int l = 0; l <= i; ++l) P(i, l) = E(i, l) * QK(i, l);

        Vector<Scalar> da = Vector<Scalar>::Zero(c), db = Vector<Scalar>::Zero(c), dbeta = Vector<Scalar>::Zero(c);
        const Matrix<Scalar> dS_end = dS;
        // S_end = a_c S0 + K^T diag(b) Vnew
        Matrix<Scalar> dS0 = a(c - 1) * dS_end;
        da(c - 1) += dS_end.cwiseProduct(S0).sum();
        const Matrix<Scalar> KdS = Products::mul(Kc, dS_end);  // [c, V]
        Matrix<Scalar> dVn = b.asDiagonal() * KdS;
        Matrix<Scalar> dK = b.asDiagonal() * Products::mul(Vn, dS_end.transpose());
        for (int i = 0; i < c; ++i) db(i) += KdS.row(i).dot(Vn.row(i));
        // O = diag(a) Q S0 + P Vnew, P = Mask . (Q K^T) . E
        const Matrix<Scalar> QS0 = Products::mul(Q, S0);
        Matrix<Scalar> dQ = a.asDiagonal() * Products::mul(dO, S0.transpose());
        dS0.noalias() += Products::mul(Q.transpose(), a.asDiagonal() * dO);
        for (int i = 0; i < c; ++i) da(i) += QS0.row(i).dot(dO.row(i));
        Matrix<Scalar> dP = Products::mul(dO, Vn.transpose());
        dVn.noalias() += Products::mul(P.transpose(), dO);
        Matrix<Scalar> dQK = Matrix<Scalar>::Zero(c, c), dE = Matrix<Scalar>::Zero(c, c);
        for (int i = 0; i < c; ++i)
          for (int l = 0; l <= i; ++l) {
            dQK(i, l) = dP(i, l) * E(i, l);
            dE(i, l) = dP(i, l) * QK(i, l);
          }
        dQ.noalias() += Products::mul(dQK, Kc);
        dK.noalias() += Products::mul(dQK.transpose(), Q);
        // Vnew = U - W S0
        const Matrix<Scalar> dU = dVn;
        const Matrix<Scalar> dW = Products::mul(-dVn, S0.transpose());
        dS0.noalias() -= Products::mul(W.transpose(), dVn);
        // [W | U] = T R, T = (I + A)^-1: dR = T^T d[W | U], dA = -dR [W | U]^T (strictly lower).
        const Matrix<Scalar> dX = Products::mul(T.transpose(), dW);  // R's key part: diag(beta a) K
        const Matrix<Scalar> dY = Products::mul(T.transpose(), dU);  // R's value part: diag(beta) V
        Matrix<Scalar> dA = -(Products::mul(dX, W.transpose()) + Products::mul(dY, U.transpose()));
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
        dK.noalias() += Products::mul(dGk + dGk.transpose(), Kc);
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

}  // namespace

template <class Scalar>
Gradients<Scalar> chunked_backward(const Problem& problem, const Inputs& inputs, const BackwardInputs& backward,
                                   int chunk_size, ChunkBackwardTrace<Scalar>* trace) {
  return chunked_backward_with<Scalar, ExactProducts>(problem, inputs, backward, chunk_size, trace);
}

namespace {
template <BackwardProducts kProducts>
Gradients<float> rounded(const Problem& problem, const Inputs& inputs, const BackwardInputs& backward, int chunk_size) {
  return chunked_backward_with<float, RoundedProducts<kProducts>>(problem, inputs, backward, chunk_size, nullptr);
}
}  // namespace

Gradients<float> chunked_backward_products(const Problem& problem, const Inputs& inputs,
                                           const BackwardInputs& backward, int chunk_size, BackwardProducts products) {
  switch (products) {
    case BackwardProducts::fp32:
      return chunked_backward_with<float, ExactProducts>(problem, inputs, backward, chunk_size, nullptr);
    case BackwardProducts::tf32: return rounded<BackwardProducts::tf32>(problem, inputs, backward, chunk_size);
    case BackwardProducts::tf32x3: return rounded<BackwardProducts::tf32x3>(problem, inputs, backward, chunk_size);
    case BackwardProducts::bf16: return rounded<BackwardProducts::bf16>(problem, inputs, backward, chunk_size);
    case BackwardProducts::f16: return rounded<BackwardProducts::f16>(problem, inputs, backward, chunk_size);
    case BackwardProducts::bf16x2: return rounded<BackwardProducts::bf16x2>(problem, inputs, backward, chunk_size);
    case BackwardProducts::bf16x3: return rounded<BackwardProducts::bf16x3>(problem, inputs, backward, chunk_size);
  }
  throw ProblemError("products", "not a BackwardProducts value");
}

const char* backward_products_name(BackwardProducts products) {
  switch (products) {
    case BackwardProducts::fp32: return "fp32";
    case BackwardProducts::tf32: return "tf32";
    case BackwardProducts::tf32x3: return "tf32x3";
    case BackwardProducts::bf16: return "bf16";
    case BackwardProducts::f16: return "f16";
    case BackwardProducts::bf16x2: return "bf16x2";
    case BackwardProducts::bf16x3: return "bf16x3";
  }
  return "?";
}

// float: the chunked backward's fp32 precision emulation (oracle/backward_budget.hpp).
template Gradients<float> chunked_backward<float>(const Problem&, const Inputs&, const BackwardInputs&, int,
                                                  ChunkBackwardTrace<float>*);
template Gradients<double> chunked_backward<double>(const Problem&, const Inputs&, const BackwardInputs&, int,
                                                    ChunkBackwardTrace<double>*);
template Gradients<long double> chunked_backward<long double>(const Problem&, const Inputs&, const BackwardInputs&,
                                                              int, ChunkBackwardTrace<long double>*);

}  // namespace gdn::reference
