#pragma once
// gen_case (fuzz/generators.hpp) sampled deterministically from a seed, outside RapidCheck's
// runner: the fuzz campaign, `generate` and the GPU suites draw their cases this way, so they
// explore the same distribution as the property suite and a case is reproducible from its seed
// and space alone.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "fuzz/generators.hpp"

namespace gdn::fuzz {

nlohmann::json to_json(const InputOptions& options);
InputOptions input_options_from_json(const nlohmann::json& json);

// A CaseSpace as JSON (format gdn-case-space/1): the Python package's CaseSpace and the CLI's
// `--space FILE` (fuzz, generate) read and write this one form. to_json writes every field;
// case_space_from_json starts from the preset the optional "preset" key names (everything,
// chunked, recurrent_prefill, decode, chunked_prefill; default everything; chunked at the file's
// chunk_size) and sets the fields the object gives. Strict: an unknown key, a value of the
// wrong type or out of range, or an unknown dtype, regime or feature mode throws
// std::invalid_argument naming the key; the result passes check_space. Features are "off",
// "sometimes" or "always" (true and false read as sometimes and off).
constexpr const char* kCaseSpaceFormat = "gdn-case-space/1";
nlohmann::json to_json(const CaseSpace& space);
CaseSpace case_space_from_json(const nlohmann::json& json);
const char* feature_mode_name(Feature feature);

// The case of `seed` in `space`. The RapidCheck size of the draw (0..100) is taken from the
// seed too: most cases are moderate, and the size ramp that rc::check performs is spread over
// the seeds.
Case draw_case(std::uint64_t seed, const CaseSpace& space);

// A case with its tensors made, ready to judge, and how it was made (for the metadata).
struct GeneratedCase {
  std::string name;
  Problem problem;
  Inputs inputs;
  nlohmann::json generator;  // {"seed": "...", "input_options": {...}, "source": "..."}
};

// draw_case with the inputs made and the draw recorded in `generator`.
GeneratedCase sample_case(std::uint64_t seed, const CaseSpace& space = CaseSpace::chunked(64));

}  // namespace gdn::fuzz
