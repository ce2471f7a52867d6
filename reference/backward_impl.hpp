#pragma once
// What the sequential and the chunked backward share (internal to reference/): the per-token
// gradients with respect to the quantities the recurrence itself uses (the scaled normalised
// query qs = scale q^, the normalised key k^, v, g, beta, per value head), and the chain rules
// of §6 that turn them into the gradients of the operator's inputs: the scale, the l2norm,
// the GVA sum over the value heads of a group, and the fused gates of §3.
#include <cmath>
#include <vector>

#include "reference/backward.hpp"
#include "reference/prepare.hpp"

namespace gdn::reference::detail {

// Per (token, value head) gradients of the recurrence's own quantities.
template <class Scalar>
struct RecurrenceGradients {
  std::vector<Scalar> dqs, dk;    // [T, HV, K]: w.r.t. scale q^ and k^ as the value head reads them
  std::vector<Scalar> dv;         // [T, HV, V]
  std::vector<Scalar> dg, dbeta;  // [T, HV]
  HostTensor<Scalar> dh0;         // state_shape(), when has_h0

  explicit RecurrenceGradients(const Problem& p)
      : dqs(static_cast<std::size_t>(p.T * p.HV * p.K)),
        dk(static_cast<std::size_t>(p.T * p.HV * p.K)),
        dv(static_cast<std::size_t>(p.T * p.HV * p.V)),
        dg(static_cast<std::size_t>(p.T * p.HV)),
        dbeta(static_cast<std::size_t>(p.T * p.HV)) {
    if (p.has_h0) dh0 = HostTensor<Scalar>(p.state_shape());
  }
};

// The chain rules of §6 from the recurrence's gradients to the inputs'. With magnitudes
// non-null, `magnitude` holds the term magnitudes of `raw` (sequential_backward's
// term_magnitudes) and the same chain is applied to them with every factor in absolute value.
template <class Scalar>
Gradients<Scalar> finish_gradients(const Problem& p, const Inputs& in, const RecurrenceGradients<Scalar>& raw,
                                   const RecurrenceGradients<Scalar>* magnitude,
                                   Gradients<Scalar>* magnitudes) {
  using std::abs;
  using std::exp;
  using std::sqrt;
  const int H = p.H, HV = p.HV, K = p.K, group = p.group_size();
  const Scalar scale = static_cast<Scalar>(p.effective_scale());
  const bool with_m = magnitude != nullptr && magnitudes != nullptr;

  Gradients<Scalar> out;
  Gradients<Scalar> m;
  out.dq = HostTensor<Scalar>(p.q_shape());
  out.dk = HostTensor<Scalar>(p.q_shape());
  out.dv = HostTensor<Scalar>(p.v_shape());
  if (with_m) {
    m.dq = HostTensor<Scalar>(p.q_shape());
    m.dk = HostTensor<Scalar>(p.q_shape());
    m.dv = HostTensor<Scalar>(p.v_shape());
  }
  std::copy(raw.dv.begin(), raw.dv.end(), out.dv.data());
  if (with_m) std::copy(magnitude->dv.begin(), magnitude->dv.end(), m.dv.data());

  // q and k: sum over the group's value heads (the l2norm Jacobian depends on x only, so the
  // sum may come first), then the scale (q only), then the l2norm.
  std::vector<Scalar> x(static_cast<std::size_t>(K)), dx(static_cast<std::size_t>(K)),
      mx(static_cast<std::size_t>(K));
  auto chain = [&](const std::vector<Scalar>& d, const std::vector<Scalar>* md, const HostTensor<double>& input,
                   Scalar factor, std::int64_t t, int h, HostTensor<Scalar>& target, HostTensor<Scalar>* mtarget) {
    for (int i = 0; i < K; ++i) {
      Scalar sum = 0, msum = 0;
      for (int j = h * group; j < (h + 1) * group; ++j) {
        sum += d[static_cast<std::size_t>((t * HV + j) * K + i)];
        if (md) msum += (*md)[static_cast<std::size_t>((t * HV + j) * K + i)];
      }
      dx[static_cast<std::size_t>(i)] = factor * sum;
      mx[static_cast<std::size_t>(i)] = abs(factor) * msum;
    }
    const std::int64_t base = (t * H + h) * K;
    if (p.use_qk_l2norm) {
      // x^ = x / r, r = sqrt(|x|^2 + 1e-6): dx = (dx^ - x^ (x^ . dx^)) / r (exact with the epsilon).
      Scalar sum = 0;
      for (int i = 0; i < K; ++i) {
        x[static_cast<std::size_t>(i)] = static_cast<Scalar>(input[base + i]);
        sum += x[static_cast<std::size_t>(i)] * x[static_cast<std::size_t>(i)];
      }
      const Scalar r = sqrt(sum + Scalar(1e-6));
      Scalar dot = 0, mdot = 0;
      for (int i = 0; i < K; ++i) {
        x[static_cast<std::size_t>(i)] /= r;
        dot += x[static_cast<std::size_t>(i)] * dx[static_cast<std::size_t>(i)];
        mdot += abs(x[static_cast<std::size_t>(i)]) * mx[static_cast<std::size_t>(i)];
      }
      for (int i = 0; i < K; ++i) {
        const Scalar xi = x[static_cast<std::size_t>(i)];
        target[base + i] = (dx[static_cast<std::size_t>(i)] - xi * dot) / r;
        if (mtarget) (*mtarget)[base + i] = (mx[static_cast<std::size_t>(i)] + abs(xi) * mdot) / r;
      }
    } else {
      for (int i = 0; i < K; ++i) {
        target[base + i] = dx[static_cast<std::size_t>(i)];
        if (mtarget) (*mtarget)[base + i] = mx[static_cast<std::size_t>(i)];
      }
    }
  };
  for (std::int64_t t = 0; t < p.T; ++t)
    for (int h = 0; h < H; ++h) {
      chain(raw.dqs, with_m ? &magnitude->dqs : nullptr, in.q, scale, t, h, out.dq, with_m ? &m.dq : nullptr);
      chain(raw.dk, with_m ? &magnitude->dk : nullptr, in.k, Scalar(1), t, h, out.dk, with_m ? &m.dk : nullptr);
    }

  const Shape gates = p.gate_shape();
  if (p.gate_mode == GateMode::direct) {
    out.dg = HostTensor<Scalar>(gates);
    out.dbeta = HostTensor<Scalar>(gates);
    std::copy(raw.dg.begin(), raw.dg.end(), out.dg.data());
    std::copy(raw.dbeta.begin(), raw.dbeta.end(), out.dbeta.data());
    if (with_m) {
      m.dg = HostTensor<Scalar>(gates);
      m.dbeta = HostTensor<Scalar>(gates);
      std::copy(magnitude->dg.begin(), magnitude->dg.end(), m.dg.data());
      std::copy(magnitude->dbeta.begin(), magnitude->dbeta.end(), m.dbeta.data());
    }
  } else {
    // g = -exp(A_log) softplus(x), x = a + dt_bias: dg/da = dg/ddt_bias = -exp(A_log) sigmoid(x)
    // (-exp(A_log) where softplus is the identity, x > 20), dg/dA_log = g.
    // beta = c sigmoid(b): dbeta/db = c sigmoid(b) (1 - sigmoid(b)).
    out.da = HostTensor<Scalar>(gates);
    out.db = HostTensor<Scalar>(gates);
    out.dA_log = HostTensor<Scalar>(p.head_param_shape());
    out.ddt_bias = HostTensor<Scalar>(p.head_param_shape());
    if (with_m) {
      m.da = HostTensor<Scalar>(gates);
      m.db = HostTensor<Scalar>(gates);
      m.dA_log = HostTensor<Scalar>(p.head_param_shape());
      m.ddt_bias = HostTensor<Scalar>(p.head_param_shape());
    }
    const Scalar c = p.allow_negative_eigenvalues ? Scalar(2) : Scalar(1);
    for (std::int64_t t = 0; t < p.T; ++t)
      for (int j = 0; j < HV; ++j) {
        const std::int64_t i = t * HV + j;
        const Scalar A_log = static_cast<Scalar>(in.A_log[j]);
        const Scalar xg = static_cast<Scalar>(in.a[i]) + static_cast<Scalar>(in.dt_bias[j]);
        const Scalar dsoftplus = xg > Scalar(20) ? Scalar(1) : sigmoid(xg);
        const Scalar g = -exp(A_log) * softplus(xg);
        const Scalar sb = sigmoid(static_cast<Scalar>(in.b[i]));
        const Scalar dg = raw.dg[static_cast<std::size_t>(i)];
        const Scalar da = -exp(A_log) * dsoftplus * dg;
        out.da[i] = da;
        out.db[i] = raw.dbeta[static_cast<std::size_t>(i)] * c * sb * (Scalar(1) - sb);
        out.ddt_bias[j] += da;
        out.dA_log[j] += g * dg;
        if (with_m) {
          const Scalar mg = magnitude->dg[static_cast<std::size_t>(i)];
          m.da[i] = exp(A_log) * dsoftplus * mg;
          // 1 - sb is a sum formed here: it enters with its terms' magnitude 1 + sb, not its
          // value, which cancels for large b (b = 6: 1 - sb = 2.5e-3 carries sb's rounding, u).
          m.db[i] = magnitude->dbeta[static_cast<std::size_t>(i)] * c * sb * (Scalar(1) + sb);
          m.ddt_bias[j] += m.da[i];
          m.dA_log[j] += abs(g) * mg;
        }
      }
  }
  if (p.has_h0) {
    out.dh0 = raw.dh0;
    if (with_m) m.dh0 = magnitude->dh0;
  }
  if (with_m) *magnitudes = std::move(m);
  return out;
}

}  // namespace gdn::reference::detail
