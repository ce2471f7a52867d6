#include "reference/operand_model.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "reference/precision.hpp"
#include "reference/state_io.hpp"

namespace gdn::reference {

namespace {

constexpr int kChunk = 64;

float softplus_f32(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

}  // namespace

OperandSplits OperandSplits::of(OperandRounding rounding, DType dtype) {
  OperandSplits s;
  s.vnew_in_pv = dtype == DType::f16;
  if (rounding == OperandRounding::single || rounding == OperandRounding::single_qk)
    s = OperandSplits{false, false, false, false, false, false};
  if (rounding == OperandRounding::single_qk) s.qk_stored = true;
  if (rounding == OperandRounding::split_state) s.s0_in_qs = false;
  if (rounding == OperandRounding::split_state_pv) s.s0_in_qs = false, s.vnew_in_pv = true;
  if (rounding == OperandRounding::s0_once) s.s0_in_qs = s.s0_in_ks = false, s.vnew_in_pv = true;
  if (rounding == OperandRounding::split_all) s.vnew_in_pv = true, s.p = true;
  if (rounding == OperandRounding::split_all_p_once) s.vnew_in_pv = true, s.p = dtype == DType::f16;
  s.scaled_state_update = dtype == DType::f16 && rounding != OperandRounding::single &&
                          rounding != OperandRounding::single_qk;
  return s;
}

const char* t_merge_name(TMerge merge) {
  switch (merge) {
    case TMerge::fp32: return "fp32";
    case TMerge::once: return "once";
    case TMerge::split: return "split";
    case TMerge::tf32: return "tf32";
  }
  return "?";
}

namespace {

// (I + A)^-1 of a strictly lower c x c A by forward substitution in fp32, rows in order, the sum
// over earlier rows in index order: the kernel's prepass.
Matrix<float> substitute(const Matrix<float>& A) {
  const int c = static_cast<int>(A.rows());
  Matrix<float> T = Matrix<float>::Identity(c, c);
  for (int i = 0; i < c; ++i)
    for (int col = 0; col < i; ++col) {
      float sum = 0.f;
      for (int q = col; q < i; ++q) sum += A(i, q) * T(q, col);
      T(i, col) = -sum;
    }
  return T;
}

// The same inverse in 16 x 16 blocks with tensor-core products (TMerge), `round` the input
// dtype's rounding. A is padded to whole blocks with zeros (its inverse there is the identity).
Matrix<float> blocked_inverse(const Matrix<float>& A, TMerge merge, const std::function<float(float)>& round) {
  constexpr int kB = 16;
  const int c = static_cast<int>(A.rows()), blocks = (c + kB - 1) / kB, n = blocks * kB;
  Matrix<float> Ap = Matrix<float>::Zero(n, n);
  Ap.topLeftCorner(c, c) = A;
  auto operand = [&](const Matrix<float>& x, int part) -> Matrix<float> {
    // part 0: the operand as the tensor cores take it; part 1: what that left out (split only).
    if (merge == TMerge::tf32) return part == 0 ? Matrix<float>(x.unaryExpr([](float v) { return round_tf32(v); }))
                                                : Matrix<float>::Zero(x.rows(), x.cols());
    const Matrix<float> hi = x.unaryExpr(round);
    if (part == 0) return hi;
    if (merge != TMerge::split) return Matrix<float>::Zero(x.rows(), x.cols());
    return Matrix<float>(x - hi).unaryExpr(round);
  };
  auto product = [&](const Matrix<float>& x, const Matrix<float>& y) -> Matrix<float> {
    const Matrix<float> xh = operand(x, 0), yh = operand(y, 0);
    Matrix<float> out = xh * yh;
    if (merge == TMerge::split) {
      out += xh * operand(y, 1);
      out += operand(x, 1) * yh;
    }
    return out;
  };
  Matrix<float> T = Matrix<float>::Zero(n, n);
  for (int b = 0; b < blocks; ++b) T.block(b * kB, b * kB, kB, kB) = substitute(Ap.block(b * kB, b * kB, kB, kB));
  for (int d = 1; d < blocks; ++d)
    for (int I = d; I < blocks; ++I) {
      const int J = I - d;
      Matrix<float> M = Matrix<float>::Zero(kB, kB);
      for (int Kb = J; Kb < I; ++Kb) M += product(Ap.block(I * kB, Kb * kB, kB, kB), T.block(Kb * kB, J * kB, kB, kB));
      T.block(I * kB, J * kB, kB, kB) = -product(T.block(I * kB, I * kB, kB, kB), M);
    }
  return T.topLeftCorner(c, c);
}

}  // namespace

Outputs<double> emulate_operands(const Problem& problem, const Inputs& inputs, OperandRounding rounding) {
  return emulate_operands(problem, inputs, OperandSplits::of(rounding, problem.input_dtype));
}

Outputs<double> emulate_operands(const Problem& problem, const Inputs& inputs, const OperandSplits& splits) {
  validate(problem, inputs);
  if (problem.store_intermediate_states)
    throw ProblemError("store_intermediate_states", "is a per-token option; the chunked form has no per-token states");
  const DType dtype = problem.input_dtype;
  const bool tensor = dtype == DType::bf16 || dtype == DType::f16;
  // An operand rounded to the input dtype (exact for fp32 inputs: no tensor-core operand).
  auto round_once = [&](const Matrix<float>& x) -> Matrix<float> {
    if (!tensor) return x;
    return x.unaryExpr([&](float v) { return static_cast<float>(round_to(dtype, v)); });
  };
  // What the rounding left out, rounded again; zero where the operand is rounded once.
  auto residue = [&](bool split, const Matrix<float>& x, const Matrix<float>& hi) -> Matrix<float> {
    if (!tensor || !split) return Matrix<float>::Zero(x.rows(), x.cols());
    return round_once(x - hi);
  };

  Outputs<float> out = allocate_outputs<float>(problem, inputs);
  const int H = problem.H, HV = problem.HV, K = problem.K, V = problem.V;
  const float scale = static_cast<float>(problem.effective_scale());
  Matrix<float> S(K, V);
  Matrix<float> Q(kChunk, K), Kc(kChunk, K), Vc(kChunk, V);
  std::vector<float> r_q(kChunk), r_k(kChunk), beta(kChunk), e_start(kChunk), e_end(kChunk);
  std::vector<double> gamma(kChunk);
  std::vector<int> segment(kChunk);

  for (int n = 0; n < problem.N(); ++n) {
    const std::int64_t row = state_row(problem, inputs, n);
    if (row < 0) continue;
    const std::int64_t begin = problem.seq_begin(n), length = problem.seq_len(n);
    for (int j = 0; j < HV; ++j) {
      const int h = j / problem.group_size();
      initial_state(problem, inputs, row, j, S);
      for (std::int64_t start = begin; start < begin + length; start += kChunk) {
        const int c = static_cast<int>(std::min<std::int64_t>(kChunk, begin + length - start));
        // The chunk's raw q, k, v (exact in fp32), the norms as fp32 scales, the gates in fp32
        // and gamma in double with resets, as the prepass computes them.
        double running = 0;
        int seg = -1;
        for (int i = 0; i < c; ++i) {
          const std::int64_t t = start + i;
          float sq = 0.f, sk = 0.f;
          for (int x = 0; x < K; ++x) {
            Q(i, x) = static_cast<float>(inputs.q[(t * H + h) * K + x]);
            Kc(i, x) = static_cast<float>(inputs.k[(t * H + h) * K + x]);
            sq += Q(i, x) * Q(i, x);
            sk += Kc(i, x) * Kc(i, x);
          }
          r_q[i] = problem.use_qk_l2norm ? 1.f / std::sqrt(sq + 1e-6f) : 1.f;
          r_k[i] = problem.use_qk_l2norm ? 1.f / std::sqrt(sk + 1e-6f) : 1.f;
          if (splits.qk_stored && problem.use_qk_l2norm) {
            // x * rstd in fp32, stored in the input dtype; the stored vectors are the operands.
            Q.row(i) = round_once(Matrix<float>(Q.row(i) * r_q[i]));
            Kc.row(i) = round_once(Matrix<float>(Kc.row(i) * r_k[i]));
            r_q[i] = r_k[i] = 1.f;
          }
          for (int x = 0; x < V; ++x) Vc(i, x) = static_cast<float>(inputs.v[(t * HV + j) * V + x]);
          const std::int64_t gi = t * HV + j;
          float g = 0.f;
          if (problem.gate_mode == GateMode::direct) {
            g = problem.linear_gates() ? std::log(static_cast<float>(inputs.g[gi])) : static_cast<float>(inputs.g[gi]);
            beta[i] = static_cast<float>(inputs.beta[gi]);
          } else {
            g = -std::exp(static_cast<float>(inputs.A_log[j])) *
                softplus_f32(static_cast<float>(inputs.a[gi]) + static_cast<float>(inputs.dt_bias[j]));
            beta[i] = (problem.allow_negative_eigenvalues ? 2.f : 1.f) /
                      (1.f + std::exp(-static_cast<float>(inputs.b[gi])));
          }
          if (std::exp(g) == 0.f) {
            seg = i;
            running = 0;
          } else {
            running += static_cast<double>(g);
          }
          gamma[i] = running;
          segment[i] = seg;
        }
        for (int i = c; i < kChunk; ++i) {
          Q.row(i).setZero();
          Kc.row(i).setZero();
          Vc.row(i).setZero();
        }
        for (int i = 0; i < c; ++i) {
          e_start[i] = segment[i] < 0 ? std::exp(static_cast<float>(gamma[i])) : 0.f;
          e_end[i] = segment[i] == segment[c - 1] ? std::exp(static_cast<float>(gamma[c - 1] - gamma[i])) : 0.f;
        }
        float decay = e_start[c - 1], unscale = 1.f;
        if (splits.scaled_state_update && dtype == DType::f16) {
          // The kernel's exponent of the state update (rescale_state_update), from the raw keys.
          std::vector<bool> live(c);
          float largest = 0.f;
          for (int i = 0; i < c; ++i) {
            live[i] = (Kc.row(i).array() != 0.f).any();
            if (live[i]) largest = std::max(largest, e_end[i]);
          }
          int m = 0;
          if (largest > 0.f && largest < 1.f) m = std::min(126, -std::ilogb(largest));
          if (m > 0) {
            const float up = std::ldexp(1.f, m);
            for (int i = 0; i < c; ++i) e_end[i] = live[i] ? e_end[i] * up : 0.f;
            decay *= up;
            unscale = std::ldexp(1.f, -m);
          }
        }
        const auto Qv = Q.topRows(c);
        const auto Kv = Kc.topRows(c);
        const auto Vv = Vc.topRows(c);

        // A (fp32) and P (rounded once) from the raw products and the decays of differences.
        const Matrix<float> kk = Kv * Kv.transpose();
        const Matrix<float> qk = Qv * Kv.transpose();
        Matrix<float> A = Matrix<float>::Zero(c, c), P = Matrix<float>::Zero(c, c);
        for (int i = 0; i < c; ++i) {
          const int s = std::max(segment[i], 0);
          for (int col = s; col <= i; ++col) {
            const float w = std::exp(static_cast<float>(gamma[i] - gamma[col])) * r_k[col];
            if (col < i) A(i, col) = beta[i] * r_k[i] * w * kk(i, col);
            P(i, col) = r_q[i] * w * qk(i, col);
          }
        }
        const Matrix<float> P_lo = residue(splits.p, P, round_once(P));
        P = round_once(P);
        // T = (I + A)^-1 (splits.t_merge says how), then hi (+ lo).
        const Matrix<float> T =
            tensor && splits.t_merge != TMerge::fp32
                ? blocked_inverse(A, splits.t_merge, [&](float v) { return static_cast<float>(round_to(dtype, v)); })
                : substitute(A);
        const Matrix<float> T_hi = round_once(T), T_lo = residue(splits.t, T, T_hi);

        // X = diag(beta) (V - diag(e_start r_k) K S0), S0 hi (+ lo); Vnew = T X.
        const Matrix<float> S_hi = round_once(S), S_lo = residue(true, S, S_hi);
        Matrix<float> KS = Kv * S_hi;
        if (splits.s0_in_ks) KS += Kv * S_lo;
        Matrix<float> X(c, V);
        for (int i = 0; i < c; ++i) X.row(i) = beta[i] * (Vv.row(i) - (e_start[i] * r_k[i]) * KS.row(i));
        const Matrix<float> X_hi = round_once(X), X_lo = residue(splits.x, X, X_hi);
        Matrix<float> Vnew = T_hi * X_hi;
        Vnew += T_hi * X_lo;
        Vnew += T_lo * X_hi;

        // O = scale (diag(e_start r_q) Q S0 + P Vnew), o rounded once.
        Matrix<float> O = Qv * S_hi;
        if (splits.s0_in_qs) O += Qv * S_lo;
        for (int i = 0; i < c; ++i) O.row(i) *= e_start[i] * r_q[i];
        const Matrix<float> Vn_hi = round_once(Vnew);
        O += P * Vn_hi;
        if (tensor && splits.vnew_in_pv) O += P * round_once(Vnew - Vn_hi);
        O += P_lo * Vn_hi;  // zero unless splits.p
        for (int i = 0; i < c; ++i)
          for (int x = 0; x < V; ++x) out.o[((start + i) * HV + j) * V + x] = scale * O(i, x);

        // S_end = decay S0 + K^T diag(e_end r_k) Vnew, Vnew_d hi (+ lo).
        Matrix<float> Vd(c, V);
        for (int i = 0; i < c; ++i) Vd.row(i) = (e_end[i] * r_k[i]) * Vnew.row(i);
        const Matrix<float> Vd_hi = round_once(Vd), Vd_lo = residue(splits.vnew_d, Vd, Vd_hi);
        S *= decay;
        S += Kv.transpose() * Vd_hi;
        S += Kv.transpose() * Vd_lo;
        if (unscale != 1.f) S *= unscale;
      }
      if (problem.has_hT) store_state(problem, S, row, j, out.hT.data());
    }
  }
  Outputs<double> result = out.cast<double>();
  round_in_place(dtype, result.o);
  round_stored_states(problem, result);
  return result;
}

}  // namespace gdn::reference
