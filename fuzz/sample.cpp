#include "fuzz/sample.hpp"

#include <climits>
#include <cmath>
#include <cstdint>
#include <map>
#include <stdexcept>

namespace gdn::fuzz {

nlohmann::json to_json(const InputOptions& o) {
  nlohmann::json j = {{"regime", gate_regime_name(o.regime)}, {"beta_max", o.beta_max}, {"unit_keys", o.unit_keys},
                      {"state_scale", o.state_scale}, {"padding_fraction", o.padding_fraction},
                      {"small_norms", o.small_norms}};
  if (o.zero_key_tail != 0) j["zero_key_tail"] = o.zero_key_tail;  // absent: 0, as files written before it
  return j;
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
  o.zero_key_tail = j.contains("zero_key_tail") ? j.at("zero_key_tail").get<int>() : 0;
  if (o.zero_key_tail < 0)
    throw std::invalid_argument("input_options: zero_key_tail must be >= 0, got " + std::to_string(o.zero_key_tail));
  return o;
}

const char* feature_mode_name(Feature feature) {
  switch (feature.mode) {
    case Feature::off: return "off";
    case Feature::sometimes: return "sometimes";
    case Feature::always: return "always";
  }
  return "?";
}

namespace {

// The fields of CaseSpace, each once: its JSON key, how to write it and how to read it.
template <class Visit>
void visit_space(CaseSpace& s, Visit&& visit) {
  visit("max_K", s.max_K);
  visit("max_V", s.max_V);
  visit("K_multiple", s.K_multiple);
  visit("V_multiple", s.V_multiple);
  visit("K_values", s.K_values);
  visit("V_values", s.V_values);
  visit("max_H", s.max_H);
  visit("H_values", s.H_values);
  visit("max_group", s.max_group);
  visit("group_values", s.group_values);
  visit("gva", s.gva);
  visit("min_sequences", s.min_sequences);
  visit("max_sequences", s.max_sequences);
  visit("max_tokens", s.max_tokens);
  visit("chunk_size", s.chunk_size);
  visit("long_chunks", s.long_chunks);
  visit("equal_lengths", s.equal_lengths);
  visit("min_length", s.min_length);
  visit("max_length", s.max_length);
  visit("length_values", s.length_values);
  visit("max_work", s.max_work);
  visit("min_work", s.min_work);
  visit("input_dtypes", s.input_dtypes);
  visit("gate_in_input_dtype", s.gate_in_input_dtype);
  visit("regimes", s.regimes);
  visit("state_dtypes", s.state_dtypes);
  visit("gate_spaces", s.gate_spaces);
  visit("fused_gates", s.fused_gates);
  visit("negative_eigenvalues", s.negative_eigenvalues);
  visit("l2norm", s.l2norm);
  visit("small_norms", s.small_norms);
  visit("raw_keys", s.raw_keys);
  visit("initial_state", s.initial_state);
  visit("final_state", s.final_state);
  visit("v_major", s.v_major);
  visit("state_cache", s.state_cache);
  visit("max_extra_slots", s.max_extra_slots);
  visit("padding", s.padding);
  visit("intermediate_states", s.intermediate_states);
  visit("explicit_scale", s.explicit_scale);
  visit("continuous_scale", s.continuous_scale);
  visit("scale_values", s.scale_values);
}

nlohmann::json field_to_json(const Feature& f) { return feature_mode_name(f); }
nlohmann::json field_to_json(const std::vector<DType>& v) {
  nlohmann::json j = nlohmann::json::array();
  for (DType d : v) j.push_back(dtype_name(d));
  return j;
}
nlohmann::json field_to_json(const std::vector<GateSpace>& v) {
  nlohmann::json j = nlohmann::json::array();
  for (GateSpace g : v) j.push_back(gate_space_name(g));
  return j;
}
nlohmann::json field_to_json(const std::vector<GateRegime>& v) {
  nlohmann::json j = nlohmann::json::array();
  for (GateRegime r : v) j.push_back(gate_regime_name(r));
  return j;
}
template <class T>
nlohmann::json field_to_json(const T& x) {
  return x;
}

[[noreturn]] void bad(const std::string& key, const std::string& rule, const nlohmann::json& got) {
  std::string text = got.dump();
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  throw std::invalid_argument("case space: '" + key + "' " + rule + ", got " + text);
}

void field_from_json(const std::string& key, const nlohmann::json& j, bool* out) {
  if (!j.is_boolean()) bad(key, "must be true or false", j);
  *out = j.get<bool>();
}
void field_from_json(const std::string& key, const nlohmann::json& j, int* out) {
  if (!j.is_number_integer() || j.get<std::int64_t>() < INT32_MIN || j.get<std::int64_t>() > INT32_MAX)
    bad(key, "must be an integer", j);
  *out = static_cast<int>(j.get<std::int64_t>());
}
void field_from_json(const std::string& key, const nlohmann::json& j, std::int64_t* out) {
  if (!j.is_number_integer() || (j.is_number_unsigned() && j.get<std::uint64_t>() > std::uint64_t(INT64_MAX)))
    bad(key, "must be an integer", j);
  *out = j.get<std::int64_t>();
}
void field_from_json(const std::string& key, const nlohmann::json& j, double* out) {
  if (!j.is_number()) bad(key, "must be a number", j);
  *out = j.get<double>();
  if (!std::isfinite(*out)) bad(key, "must be finite", j);
}
void field_from_json(const std::string& key, const nlohmann::json& j, Feature* out) {
  if (j.is_boolean()) {
    *out = Feature(j.get<bool>());
    return;
  }
  const std::string text = j.is_string() ? j.get<std::string>() : "";
  if (text == "off") *out = Feature::off;
  else if (text == "sometimes") *out = Feature::sometimes;
  else if (text == "always") *out = Feature::always;
  else bad(key, "must be \"off\", \"sometimes\" or \"always\"", j);
}
void field_from_json(const std::string& key, const nlohmann::json& j, DType* out) {
  if (!j.is_string() || !parse_dtype(j.get<std::string>(), out)) bad(key, "must hold dtypes (f64, f32, bf16, f16)", j);
}
void field_from_json(const std::string& key, const nlohmann::json& j, GateRegime* out) {
  if (!j.is_string() || !parse_gate_regime(j.get<std::string>(), out))
    bad(key, "must hold gate regimes (no_decay, mild, strong, underflow)", j);
}
void field_from_json(const std::string& key, const nlohmann::json& j, GateSpace* out) {
  if (!j.is_string() || !parse_gate_space(j.get<std::string>(), out)) bad(key, "must hold gate spaces (log, linear)", j);
}
template <class T>
void field_from_json(const std::string& key, const nlohmann::json& j, std::vector<T>* out) {
  if (!j.is_array()) bad(key, "must be a list", j);
  out->clear();
  for (const nlohmann::json& x : j) {
    T value{};
    field_from_json(key, x, &value);
    out->push_back(value);
  }
}

CaseSpace preset(const std::string& name, const nlohmann::json& j) {
  if (name == "everything") return CaseSpace::everything();
  if (name == "chunked") {
    int chunk = 64;
    if (j.contains("chunk_size")) field_from_json("chunk_size", j.at("chunk_size"), &chunk);
    if (chunk < 1) bad("chunk_size", "must be >= 1", j.at("chunk_size"));
    return CaseSpace::chunked(chunk);
  }
  if (name == "recurrent_prefill") return CaseSpace::recurrent_prefill();
  if (name == "decode") return CaseSpace::decode();
  if (name == "chunked_prefill") return CaseSpace::chunked_prefill();
  bad("preset", "must be everything, chunked, recurrent_prefill, decode or chunked_prefill", name);
}

}  // namespace

nlohmann::json to_json(const CaseSpace& space) {
  nlohmann::json j = nlohmann::json::object();
  j["format"] = kCaseSpaceFormat;
  CaseSpace copy = space;
  visit_space(copy, [&](const char* key, const auto& field) { j[key] = field_to_json(field); });
  return j;
}

CaseSpace case_space_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw std::invalid_argument("case space: must be a JSON object, got " + j.dump().substr(0, 80));
  if (j.contains("format") && j.at("format") != kCaseSpaceFormat)
    bad("format", std::string("must be \"") + kCaseSpaceFormat + "\"", j.at("format"));
  std::string preset_name = "everything";
  if (j.contains("preset")) {
    if (!j.at("preset").is_string()) bad("preset", "must be a string", j.at("preset"));
    preset_name = j.at("preset").get<std::string>();
  }
  CaseSpace space = preset(preset_name, j);
  std::map<std::string, bool> known{{"format", true}, {"preset", true}};
  visit_space(space, [&](const char* key, auto& field) {
    known[key] = true;
    if (j.contains(key)) field_from_json(key, j.at(key), &field);
  });
  for (const auto& item : j.items())
    if (!known.count(item.key())) bad(item.key(), "is not a case-space field", item.value());
  check_space(space);
  return space;
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
