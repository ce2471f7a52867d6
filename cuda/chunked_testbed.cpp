#include "cuda/chunked_testbed.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "oracle/metrics.hpp"

namespace gdn::cuda::chunked_testbed {

namespace {

template <class T>
const T& pick(std::mt19937_64& rng, const std::vector<T>& options) {
  return options[std::uniform_int_distribution<std::size_t>(0, options.size() - 1)(rng)];
}
bool coin(std::mt19937_64& rng, double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }
int uniform(std::mt19937_64& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }


}  // namespace

std::string Case::describe() const {
  std::ostringstream s;
  s << problem.describe() << " cu_seqlens=[";
  for (std::size_t i = 0; i < problem.cu_seqlens.size(); ++i) s << (i ? "," : "") << problem.cu_seqlens[i];
  s << "] regime=" << fuzz::gate_regime_name(options.regime) << " beta_max=" << options.beta_max << " seed=" << seed;
  return s.str();
}

Case random_case(std::mt19937_64& rng, double work_cap) {
  Case c;
  Problem& p = c.problem;
  p.H = pick(rng, std::vector<int>{1, 1, 2, 4});
  p.HV = p.H * pick(rng, std::vector<int>{1, 1, 2, 3, 4});
  p.K = pick(rng, std::vector<int>{16, 32, 48, 64, 64, 80, 96, 112, 128, 128, 128});
  p.V = pick(rng, std::vector<int>{16, 32, 48, 64, 96, 128, 128, 128, 144, 192, 256});
  const int N = uniform(rng, 1, 5);
  std::vector<std::int64_t> lengths(static_cast<std::size_t>(N));
  for (auto& l : lengths) {
    const double r = std::uniform_real_distribution<double>(0, 1)(rng);
    l = r < 0.1 ? 0 : r < 0.2 ? 1 : r < 0.35 ? pick(rng, std::vector<int>{63, 64, 65})
        : r < 0.45 ? pick(rng, std::vector<int>{127, 128, 129}) : r < 0.8 ? uniform(rng, 2, 62) : uniform(rng, 130, 300);
  }
  // Fit the work cap by dropping heads first, then by shortening the longest sequences.
  auto work = [&] {
    std::int64_t t = 0;
    for (auto l : lengths) t += l;
    return double(t) * p.HV * p.K * p.V;
  };
  while (work() > work_cap && p.HV > p.H) p.HV -= p.H;
  while (work() > work_cap && p.H > 1) p.HV = p.H = p.H / 2;  // HV == H here
  while (work() > work_cap) {
    auto longest = std::max_element(lengths.begin(), lengths.end());
    *longest = *longest / 2;
  }
  const Problem shape = Problem::packed(lengths, p.H, p.HV, p.K, p.V);
  p.cu_seqlens = shape.cu_seqlens;
  p.T = shape.T;

  const DType dtype = pick(rng, std::vector<DType>{DType::f32, DType::bf16, DType::bf16, DType::f16});
  p.input_dtype = dtype;
  p.gate_dtype = coin(rng, 0.5) ? DType::f32 : dtype;
  p.use_qk_l2norm = coin(rng, 0.6);
  if (coin(rng, 0.3)) p.scale = std::uniform_real_distribution<double>(0.05, 1.0)(rng);
  p.gate_mode = coin(rng, 0.4) ? GateMode::fused : GateMode::direct;
  if (p.gate_mode == GateMode::fused) p.allow_negative_eigenvalues = coin(rng, 0.3);
  p.has_h0 = coin(rng, 0.6);
  p.has_hT = coin(rng, 0.6);
  c.options.regime = pick(rng, std::vector<fuzz::GateRegime>{fuzz::GateRegime::no_decay, fuzz::GateRegime::mild,
                                                              fuzz::GateRegime::strong, fuzz::GateRegime::underflow});
  c.options.beta_max = (p.gate_mode == GateMode::direct && coin(rng, 0.25)) ? 2.0 : 1.0;
  c.options.unit_keys = true;  // contractive cases only: growth has no error budget (§2)
  c.seed = rng();
  return c;
}

DType state_floor_dtype(const Problem& problem) {
  return problem.input_dtype == DType::f32 ? DType::f32 : problem.input_dtype;
}

double rel_rms(const HostTensor<double>& reference, const HostTensor<double>& actual) {
  double err = 0, ref = 0;
  for (std::int64_t i = 0; i < reference.numel(); ++i) {
    const double d = actual[i] - reference[i];
    err += d * d;
    ref += reference[i] * reference[i];
  }
  if (err == 0) return 0;
  if (!std::isfinite(err)) return INFINITY;
  return ref == 0 ? INFINITY : std::sqrt(err / ref);
}

oracle::BudgetOptions budget() {
  oracle::BudgetOptions options;  // calibrated: factor 2, floor 1 u, arithmetic floor
  options.state_unit_input = true;
  return options;
}

oracle::BudgetOptions budget_single() {
  oracle::BudgetOptions options = budget();
  options.baseline = oracle::BudgetBaseline::operands_single;
  return options;
}

Judgement judge(const Problem& problem, const Inputs& inputs, const Outputs<double>& exact,
                const Outputs<double>& emulation, const Outputs<double>& actual) {
  return judge(problem, inputs, exact, emulation, actual, budget());
}

Judgement judge(const Problem& problem, const Inputs& inputs, const Outputs<double>& exact,
                const Outputs<double>& baseline, const Outputs<double>& actual, const oracle::BudgetOptions& options) {
  const oracle::Verdict v = oracle::judge(problem, &inputs, exact, actual, &baseline, Formulation::chunked, options);
  Judgement j;
  j.pass = v.passed();
  j.margin = v.status == oracle::Status::error ? INFINITY : v.worst_margin();
  j.details = v.details();
  return j;
}

}  // namespace gdn::cuda::chunked_testbed
