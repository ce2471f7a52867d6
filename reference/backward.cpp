#include "reference/backward.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "reference/backward_impl.hpp"
#include "reference/prepare.hpp"
#include "reference/sequential.hpp"
#include "reference/state_io.hpp"

namespace gdn::reference {

void validate_backward(const Problem& problem, const Inputs& inputs, const BackwardInputs& backward) {
  validate(problem, inputs);
  if (problem.uses_state_cache())
    throw ProblemError("state_slots", "the backward covers dense states only (§6); a state cache is an inference "
                                      "option, got state_slots = " + std::to_string(problem.state_slots));
  if (problem.store_intermediate_states)
    throw ProblemError("store_intermediate_states",
                       "the backward does not differentiate per-token states (an inference option, §6)");
  if (problem.state_dtype != DType::f32)
    throw ProblemError("state_dtype", std::string("the backward covers fp32 states only (reduced-precision state pools "
                                                  "are an inference option), got ") + dtype_name(problem.state_dtype));
  if (problem.linear_gates())
    throw ProblemError("gate_space", "the backward differentiates log-space gates only (dg); linear alpha is an "
                                     "inference convention");
  if (!backward.dO.defined())
    throw ProblemError("dO", "is required by the backward but was not given (expected shape " +
                                 shape_string(problem.v_shape()) + ")");
  if (backward.dO.shape() != problem.v_shape())
    throw ProblemError("dO", "must have shape " + shape_string(problem.v_shape()) + ", got " +
                                 shape_string(backward.dO.shape()));
  if (backward.dhT.defined()) {
    if (!problem.has_hT)
      throw ProblemError("dhT", "given but the problem has no final state output (has_hT = false)");
    if (backward.dhT.shape() != problem.state_shape())
      throw ProblemError("dhT", "must have shape " + shape_string(problem.state_shape()) + ", got " +
                                    shape_string(backward.dhT.shape()));
  }
}

template <class Scalar>
Gradients<Scalar> sequential_backward(const Problem& problem, const Inputs& inputs, const BackwardInputs& backward,
                                      Gradients<Scalar>* term_magnitudes) {
  using std::abs;
  using std::exp;
  validate_backward(problem, inputs, backward);
  const int HV = problem.HV, K = problem.K, V = problem.V;
  const bool with_m = term_magnitudes != nullptr;
  detail::RecurrenceGradients<Scalar> raw(problem);
  detail::RecurrenceGradients<Scalar> mag(with_m ? problem : Problem{});

  Matrix<Scalar> S(K, V), Sd(K, V), dS(K, V), dSd(K, V), mS(K, V), mdS(K, V), mSd(K, V), mdSd(K, V), mSw(K, V);
  Vector<Scalar> qs(K), k(K), v(V), p(V), u(V), dO(V), du(V), dp(V), dk(K), dq(K), mp(V), mu(V), mdp(V), mdu(V);
  std::vector<Matrix<Scalar>> checkpoints, block;

  // The forward quantities of token t (value head j, query/key head h).
  auto load = [&](std::int64_t t, int h, int j, Scalar* g, Scalar* beta) {
    load_qk(problem, inputs, t, h, qs.data(), k.data());
    v = Eigen::Map<const Vector<double>>(inputs.v.data() + (t * HV + j) * V, V).template cast<Scalar>();
    load_gates(problem, inputs, t, j, g, beta);
  };
  // One forward step (§2) from the state before token t to the state after it.
  auto step = [&](std::int64_t t, int h, int j, Matrix<Scalar>& state) {
    Scalar g, beta;
    load(t, h, j, &g, &beta);
    state *= exp(g);
    u.noalias() = beta * (v - state.transpose() * k);
    state.noalias() += k * u.transpose();
  };

  for (int n = 0; n < problem.N(); ++n) {
    const std::int64_t begin = problem.seq_begin(n), length = problem.seq_len(n);
    const std::int64_t stride = std::max<std::int64_t>(
        1, static_cast<std::int64_t>(std::ceil(std::sqrt(static_cast<double>(length)))));
    for (int j = 0; j < HV; ++j) {
      const int h = j / problem.group_size();
      // Forward, keeping the state before every stride-th token.
      initial_state(problem, inputs, n, j, S);
      checkpoints.clear();
      for (std::int64_t t = begin; t < begin + length; ++t) {
        if ((t - begin) % stride == 0) checkpoints.push_back(S);
        step(t, h, j, S);
      }
      // Reverse, from dhT (or zero).
      dS.setZero();
      if (backward.dhT.defined()) load_state<Scalar>(problem, backward.dhT.data(), n, j, dS);
      if (with_m) mdS = dS.cwiseAbs();
      for (std::int64_t b = static_cast<std::int64_t>(checkpoints.size()) - 1; b >= 0; --b) {
        const std::int64_t first = begin + b * stride, last = std::min(first + stride, begin + length);
        // The states before each token of the block, recomputed from its checkpoint.
        block.assign(1, checkpoints[static_cast<std::size_t>(b)]);
        for (std::int64_t t = first; t + 1 < last; ++t) {
          block.push_back(block.back());
          step(t, h, j, block.back());
        }
        for (std::int64_t t = last - 1; t >= first; --t) {
          const Matrix<Scalar>& S_prev = block[static_cast<std::size_t>(t - first)];
          Scalar g, beta;
          load(t, h, j, &g, &beta);
          const Scalar alpha = exp(g);
          Sd = alpha * S_prev;
          p.noalias() = Sd.transpose() * k;
          u = beta * (v - p);
          S = Sd;
          S.noalias() += k * u.transpose();
          dO = Eigen::Map<const Vector<double>>(backward.dO.data() + (t * HV + j) * V, V).template cast<Scalar>();

          if (with_m) mS = dS.cwiseAbs() + qs.cwiseAbs() * dO.cwiseAbs().transpose();
          dS.noalias() += qs * dO.transpose();             // the read o = S^T qs
          dq.noalias() = S * dO;
          du.noalias() = dS.transpose() * k;               // the write S = Sd + k u^T
          dk.noalias() = dS * u;
          dp = -beta * du;                                 // the delta u = beta (v - p)
          dSd = dS;
          dSd.noalias() += k * dp.transpose();             // p = Sd^T k
          dk.noalias() += Sd * dp;
          const std::int64_t i = t * HV + j;
          const auto at = [](std::int64_t x) { return static_cast<std::size_t>(x); };
          Eigen::Map<Vector<Scalar>>(raw.dqs.data() + i * K, K) = dq;
          Eigen::Map<Vector<Scalar>>(raw.dk.data() + i * K, K) = dk;
          Eigen::Map<Vector<Scalar>>(raw.dv.data() + i * V, V) = beta * du;
          raw.dbeta[at(i)] = du.dot(v - p);
          raw.dg[at(i)] = dSd.cwiseProduct(Sd).sum();      // the decay: d alpha * alpha
          if (with_m) {
            // Term magnitudes of the last step that forms each gradient. The carried states (S
            // before token t, dS after it) enter with their values; every sum this step forms
            // enters with its terms' magnitude, never its value, which can cancel to far below
            // them: the read dS + qs dO^T (mS), p = Sd^T k, u = beta (v - p), the state after
            // the write S = Sd + k u^T (dq = S dO: K = 1, beta near 1 cancels S), du = dS^T k,
            // dp = -beta du and dSd = dS + k dp^T.
            mSd = Sd.cwiseAbs();
            mp.noalias() = mSd.transpose() * k.cwiseAbs();
            mu = abs(beta) * (v.cwiseAbs() + mp);
            mdu.noalias() = mS.transpose() * k.cwiseAbs();
            mdp = abs(beta) * mdu;
            mdSd = mS;
            mdSd.noalias() += k.cwiseAbs() * mdp.transpose();
            mSw = mSd;
            mSw.noalias() += k.cwiseAbs() * mu.transpose();
            Eigen::Map<Vector<Scalar>>(mag.dqs.data() + i * K, K) = mSw * dO.cwiseAbs();
            Eigen::Map<Vector<Scalar>>(mag.dk.data() + i * K, K) = mS * mu + mSd * mdp;
            Eigen::Map<Vector<Scalar>>(mag.dv.data() + i * V, V) = abs(beta) * mdu;
            // dbeta = du . (v - p) with du = dS^T k a K-term sum of this step: du enters with its
            // terms' magnitude mdu (as in dv), not its value, which can cancel to far below them.
            mag.dbeta[at(i)] = mdu.dot(v.cwiseAbs() + mp);
            mag.dg[at(i)] = mdSd.cwiseProduct(mSd).sum();
            // dh0 is the adjoint state itself: a sum over every token of the sequence (each
            // read qs dO^T and the write's k dp^T, decayed) and dhT, which can cancel to far
            // below its terms while its rounding error, accumulated along the whole reverse
            // sweep, scales with them. Its magnitude is therefore carried: the sum of the
            // magnitudes of every term added to dS, not |dS| of the last step (which is the
            // cancelled result itself). Linear in L, no growth: dp enters with its value (its
            // rounding is relative to |dS|, a term already counted).
            mdS += qs.cwiseAbs() * dO.cwiseAbs().transpose();
            mdS = alpha * (mdS + k.cwiseAbs() * dp.cwiseAbs().transpose());
          }
          dS = alpha * dSd;                                // to the state before token t
        }
      }
      if (problem.has_h0) {
        store_state(problem, dS, n, j, raw.dh0.data());
        if (with_m) store_state(problem, mdS, n, j, mag.dh0.data());
      }
    }
  }
  return detail::finish_gradients(problem, inputs, raw, with_m ? &mag : nullptr, term_magnitudes);
}

template <class Scalar>
Scalar backward_loss(const Problem& problem, const Outputs<Scalar>& outputs, const BackwardInputs& backward) {
  Scalar sum = 0;
  for (std::int64_t i = 0; i < outputs.o.numel(); ++i) sum += static_cast<Scalar>(backward.dO[i]) * outputs.o[i];
  if (problem.has_hT && backward.dhT.defined())
    for (std::int64_t i = 0; i < outputs.hT.numel(); ++i)
      sum += static_cast<Scalar>(backward.dhT[i]) * outputs.hT[i];
  return sum;
}

template Gradients<float> sequential_backward<float>(const Problem&, const Inputs&, const BackwardInputs&,
                                                     Gradients<float>*);
template Gradients<double> sequential_backward<double>(const Problem&, const Inputs&, const BackwardInputs&,
                                                       Gradients<double>*);
template Gradients<long double> sequential_backward<long double>(const Problem&, const Inputs&,
                                                                 const BackwardInputs&, Gradients<long double>*);
template float backward_loss<float>(const Problem&, const Outputs<float>&, const BackwardInputs&);
template double backward_loss<double>(const Problem&, const Outputs<double>&, const BackwardInputs&);
template long double backward_loss<long double>(const Problem&, const Outputs<long double>&, const BackwardInputs&);

}  // namespace gdn::reference
