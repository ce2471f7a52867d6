#include "cli/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <random>

namespace gdn::cli {

nlohmann::json to_json(const fuzz::InputOptions& o) {
  return {{"regime", fuzz::gate_regime_name(o.regime)}, {"beta_max", o.beta_max}, {"unit_keys", o.unit_keys},
          {"state_scale", o.state_scale}, {"padding_fraction", o.padding_fraction}};
}

fuzz::InputOptions input_options_from_json(const nlohmann::json& j) {
  fuzz::InputOptions o;
  if (!fuzz::parse_gate_regime(j.at("regime").get<std::string>(), &o.regime))
    throw std::invalid_argument("input_options: unknown regime " + j.at("regime").dump());
  o.beta_max = j.at("beta_max").get<double>();
  o.unit_keys = j.at("unit_keys").get<bool>();
  o.state_scale = j.at("state_scale").get<double>();
  o.padding_fraction = j.at("padding_fraction").get<double>();
  return o;
}

namespace {

// Head sizes: small and odd ones, multiples of 16 and their neighbours.
int head_size(std::mt19937_64& rng, int limit) {
  static const int special[] = {1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 127, 128, 129};
  std::uniform_real_distribution<double> unit(0, 1);
  int x;
  if (unit(rng) < 0.6) {
    do x = special[std::uniform_int_distribution<int>(0, int(std::size(special)) - 1)(rng)];
    while (x > limit);
  } else {
    x = std::uniform_int_distribution<int>(1, limit)(rng);
  }
  return x;
}

std::int64_t sequence_length(std::mt19937_64& rng, int C, std::int64_t limit) {
  std::uniform_int_distribution<int> kind(0, 9);
  std::int64_t n = 0;
  switch (kind(rng)) {
    case 0: n = 0; break;
    case 1: n = 1; break;
    case 2: n = C - 1; break;
    case 3: n = C; break;
    case 4: n = C + 1; break;
    case 5:
    case 6: n = std::uniform_int_distribution<std::int64_t>(2, 12)(rng); break;
    case 7: n = std::uniform_int_distribution<std::int64_t>(2 * C - 2, 2 * C + 2)(rng); break;
    default: n = std::uniform_int_distribution<std::int64_t>(1, std::max<std::int64_t>(1, limit))(rng); break;
  }
  return std::clamp<std::int64_t>(n, 0, limit);
}

}  // namespace

GeneratedCase sample_case(std::uint64_t seed, const SampleSpace& space) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0, 1);
  auto chance = [&](double p) { return unit(rng) < p; };
  const int H = std::uniform_int_distribution<int>(1, space.max_H)(rng);
  const int group = std::uniform_int_distribution<int>(1, space.max_group)(rng);
  const int K = head_size(rng, space.max_K), V = head_size(rng, space.max_V);
  const int HV = H * group;
  // Tokens the work cap allows, then the sequences within it.
  const std::int64_t token_cap = std::max<std::int64_t>(
      1, std::min<std::int64_t>(space.max_tokens, std::int64_t(space.max_work / (double(HV) * K * V))));
  const int N = std::uniform_int_distribution<int>(1, space.max_sequences)(rng);
  std::vector<std::int64_t> lengths;
  std::int64_t total = 0;
  for (int n = 0; n < N; ++n) {
    const std::int64_t len = sequence_length(rng, space.chunk_size, token_cap - total);
    lengths.push_back(len);
    total += len;
  }
  Problem p = Problem::packed(lengths, H, HV, K, V);
  const DType dtypes[] = {DType::f32, DType::bf16, DType::f16};
  p.input_dtype = dtypes[std::uniform_int_distribution<int>(0, 2)(rng)];
  p.gate_dtype = chance(0.25) ? p.input_dtype : DType::f32;
  p.use_qk_l2norm = chance(0.5);
  p.has_h0 = chance(0.5);
  p.has_hT = chance(0.7);
  if (chance(0.2)) p.state_layout = StateLayout::v_major;
  if (chance(0.15)) {
    p.state_slots = N + std::uniform_int_distribution<int>(0, 3)(rng);
    p.has_h0 = true;
  }
  if (space.intermediate_states && chance(0.15)) p.store_intermediate_states = true;
  if (chance(0.2)) {
    p.gate_mode = GateMode::fused;
    p.allow_negative_eigenvalues = chance(0.3);
  }
  if (chance(0.15)) p.scale = 0.25 + unit(rng);
  fuzz::InputOptions options;
  const fuzz::GateRegime regimes[] = {fuzz::GateRegime::no_decay, fuzz::GateRegime::mild, fuzz::GateRegime::strong,
                                      fuzz::GateRegime::underflow};
  options.regime = regimes[std::uniform_int_distribution<int>(0, 3)(rng)];
  // Contractive inputs only (unit keys or l2norm, beta < 2): the budgets are for them (§2).
  options.beta_max = chance(0.25) ? 2.0 : 1.0;
  options.unit_keys = true;
  options.padding_fraction = p.uses_state_cache() ? 0.25 : 0.0;
  const std::uint64_t input_seed = rng();
  GeneratedCase c;
  c.problem = p;
  c.inputs = fuzz::make_inputs(p, options, input_seed);
  c.generator = {{"source", "gdn-testbed sample_case"}, {"case_seed", std::to_string(seed)},
                 {"seed", std::to_string(input_seed)}, {"input_options", to_json(options)}};
  return c;
}

}  // namespace gdn::cli
