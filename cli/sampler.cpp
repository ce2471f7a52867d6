#include "cli/sampler.hpp"

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

GeneratedCase sample_case(std::uint64_t seed, const fuzz::CaseSpace& space) {
  const int size = static_cast<int>((seed >> 11) % 101);
  const fuzz::Case c = fuzz::gen_case(space)(rc::Random(seed), size).value();
  GeneratedCase g;
  g.problem = c.problem;
  g.inputs = c.inputs();
  g.generator = {{"source", "fuzz::gen_case"}, {"case_seed", std::to_string(seed)}, {"rc_size", size},
                 {"seed", std::to_string(c.seed)}, {"input_options", to_json(c.options)}};
  return g;
}

}  // namespace gdn::cli
