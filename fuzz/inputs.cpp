#include "fuzz/inputs.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "reference/precision.hpp"

namespace gdn::fuzz {

const char* gate_regime_name(GateRegime regime) {
  switch (regime) {
    case GateRegime::no_decay: return "no_decay";
    case GateRegime::mild: return "mild";
    case GateRegime::strong: return "strong";
    case GateRegime::underflow: return "underflow";
  }
  return "?";
}

bool parse_gate_regime(const std::string& text, GateRegime* out) {
  for (GateRegime r : {GateRegime::no_decay, GateRegime::mild, GateRegime::strong, GateRegime::underflow})
    if (text == gate_regime_name(r)) {
      *out = r;
      return true;
    }
  return false;
}

namespace {

using reference::round_to;

HostTensor<double> normal_tensor(Shape shape, double sigma, DType dtype, std::mt19937_64& rng) {
  HostTensor<double> t(std::move(shape));
  std::normal_distribution<double> dist(0.0, sigma);
  for (std::int64_t i = 0; i < t.numel(); ++i) t[i] = round_to(dtype, dist(rng));
  return t;
}

}  // namespace

Inputs make_inputs(const Problem& problem, const InputOptions& options, std::uint64_t seed) {
  problem.validate();
  std::mt19937_64 rng(seed);
  Inputs in;
  const DType dt = problem.input_dtype, gdt = problem.gate_dtype;
  in.q = normal_tensor(problem.q_shape(), 1.0, dt, rng);
  in.k = normal_tensor(problem.q_shape(), 1.0, DType::f64, rng);
  if (!problem.use_qk_l2norm && options.unit_keys) {
    for (std::int64_t r = 0; r < problem.T * problem.H; ++r) {
      double* row = in.k.data() + r * problem.K;
      double sum = 0;
      for (int i = 0; i < problem.K; ++i) sum += row[i] * row[i];
      const double inv = sum > 0 ? 1.0 / std::sqrt(sum) : 0.0;
      for (int i = 0; i < problem.K; ++i) row[i] *= inv;
    }
  }
  if (options.small_norms && problem.use_qk_l2norm) {
    // Drawn from their own stream, so that switching the regime on leaves every other tensor
    // of the case as it was.
    std::mt19937_64 small_rng(seed ^ 0x5A110F0D0E5B11ull);
    std::uniform_real_distribution<double> draw(0.0, 1.0);
    for (HostTensor<double>* x : {&in.q, &in.k})
      for (std::int64_t r = 0; r < problem.T * problem.H; ++r) {
        const double which = draw(small_rng);
        const double norm_exponent = -5.0 + 3.0 * draw(small_rng);  // |x| in [1e-5, 1e-2]
        if (which >= 0.25 + 1.0 / 16) continue;
        double* row = x->data() + r * problem.K;
        double sum = 0;
        for (int i = 0; i < problem.K; ++i) sum += row[i] * row[i];
        const double factor = which < 1.0 / 16 || sum == 0 ? 0.0 : std::pow(10.0, norm_exponent) / std::sqrt(sum);
        for (int i = 0; i < problem.K; ++i) row[i] *= factor;
      }
    reference::round_in_place(dt, in.q);
  }
  reference::round_in_place(dt, in.k);
  in.v = normal_tensor(problem.v_shape(), 1.0, dt, rng);
  if (options.zero_key_tail > 0)
    for (int n = 0; n < problem.N(); ++n) {
      const std::int64_t end = problem.seq_begin(n) + problem.seq_len(n);
      const std::int64_t from = std::max(problem.seq_begin(n), end - options.zero_key_tail);
      std::fill(in.k.data() + from * problem.H * problem.K, in.k.data() + end * problem.H * problem.K, 0.0);
    }

  std::uniform_real_distribution<double> unit(0.0, 1.0);
  auto draw_g = [&]() -> double {
    switch (options.regime) {
      case GateRegime::no_decay: return 0.0;
      case GateRegime::mild: return std::log(0.9 + 0.1 * unit(rng));
      case GateRegime::strong: return -0.5 - 4.5 * unit(rng);
      case GateRegime::underflow: return unit(rng) < 0.125 ? -1e4 : std::log(0.9 + 0.1 * unit(rng));
    }
    return 0.0;
  };
  if (problem.gate_mode == GateMode::direct) {
    in.g = HostTensor<double>(problem.gate_shape());
    in.beta = HostTensor<double>(problem.gate_shape());
    for (std::int64_t i = 0; i < in.g.numel(); ++i) {
      // Linear gates: alpha = exp(g) of the same draw, rounded once (g = -1e4 gives alpha = 0).
      in.g[i] = problem.linear_gates() ? std::min(1.0, round_to(gdt, std::exp(draw_g())))
                                       : std::min(0.0, round_to(gdt, draw_g()));
      in.beta[i] = round_to(gdt, options.beta_max * unit(rng));
    }
  } else {
    // Raw projections as a model produces them; A_log as Megatron initialises it. The regime
    // shifts dt_bias: very negative a + dt_bias gives softplus -> 0 (no decay), large gives
    // strong decay; underflow is reached through a huge a on some tokens.
    in.A_log = HostTensor<double>(problem.head_param_shape());
    in.dt_bias = HostTensor<double>(problem.head_param_shape());
    const double bias = options.regime == GateRegime::no_decay ? -30.0
                        : options.regime == GateRegime::strong ? 1.0
                                                               : -4.0;
    for (int j = 0; j < problem.HV; ++j) {
      in.A_log[j] = round_to(DType::f32, std::log(1.0 + 15.0 * unit(rng)));
      in.dt_bias[j] = round_to(DType::f32, bias + 0.5 * (unit(rng) - 0.5));
    }
    in.a = HostTensor<double>(problem.gate_shape());
    in.b = HostTensor<double>(problem.gate_shape());
    std::normal_distribution<double> normal(0.0, 1.0);
    for (std::int64_t i = 0; i < in.a.numel(); ++i) {
      double a = normal(rng);
      if (options.regime == GateRegime::underflow && unit(rng) < 0.125) a = 1e4;
      in.a[i] = round_to(gdt, a);
      in.b[i] = round_to(gdt, 2.0 * normal(rng));
    }
  }

  if (problem.has_h0 || problem.uses_state_cache())
    in.h0 = normal_tensor(problem.state_shape(), options.state_scale, problem.state_dtype, rng);
  if (problem.uses_state_cache()) {
    // Distinct slots (one writer per slot), some sequences turned into padding rows.
    std::vector<std::int32_t> slots(static_cast<std::size_t>(problem.state_slots));
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    in.state_indices.resize(static_cast<std::size_t>(problem.N()));
    for (int n = 0; n < problem.N(); ++n) {
      const bool pad = unit(rng) < options.padding_fraction;
      in.state_indices[static_cast<std::size_t>(n)] =
          pad || n >= problem.state_slots ? -1 : slots[static_cast<std::size_t>(n)];
    }
  }
  return in;
}

}  // namespace gdn::fuzz
