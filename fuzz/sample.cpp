#include "fuzz/sample.hpp"

#include <stdexcept>

namespace gdn::fuzz {

nlohmann::json to_json(const InputOptions& o) {
  return {{"regime", gate_regime_name(o.regime)}, {"beta_max", o.beta_max}, {"unit_keys", o.unit_keys},
          {"state_scale", o.state_scale}, {"padding_fraction", o.padding_fraction}, {"small_norms", o.small_norms}};
}

InputOptions input_options_from_json(const nlohmann::json& j) {
  InputOptions o;
  if (!parse_gate_regime(j.at("regime").get<std::string>(), &o.regime))
    throw std::invalid_argument("input_options: unknown regime " + j.at("regime").dump());
  o.beta_max = j.at("beta_max").get<double>();
  o.unit_keys = j.at("unit_keys").get<bool>();
  o.state_scale = j.at("state_scale").get<double>();
  o.padding_fraction = j.at("padding_fraction").get<double>();
  // Absent in files written before the small-norm regime existed: those cases were drawn without it.
  o.small_norms = j.contains("small_norms") ? j.at("small_norms").get<bool>() : false;
  return o;
}

namespace {
int size_of_seed(std::uint64_t seed) { return static_cast<int>((seed >> 11) % 101); }
}  // namespace

Case draw_case(std::uint64_t seed, const CaseSpace& space) {
  return gen_case(space)(rc::Random(seed), size_of_seed(seed)).value();
}

GeneratedCase sample_case(std::uint64_t seed, const CaseSpace& space) {
  const Case c = draw_case(seed, space);
  GeneratedCase g;
  g.problem = c.problem;
  g.inputs = c.inputs();
  g.generator = {{"source", "fuzz::gen_case"}, {"case_seed", std::to_string(seed)}, {"rc_size", size_of_seed(seed)},
                 {"seed", std::to_string(c.seed)}, {"input_options", to_json(c.options)}};
  return g;
}

}  // namespace gdn::fuzz
