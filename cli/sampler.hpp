#pragma once
// The fuzz campaign's case source: fuzz::gen_case (the property suite's RapidCheck generator,
// fuzz/generators.hpp) sampled deterministically from a seed, so the fuzzer explores the same
// distribution as the properties and a case is reproducible from its seed alone.
#include "cli/campaign.hpp"
#include "fuzz/generators.hpp"

namespace gdn::cli {

nlohmann::json to_json(const fuzz::InputOptions& options);
fuzz::InputOptions input_options_from_json(const nlohmann::json& json);

// The RapidCheck size of the draw (0..100) is taken from the seed too: most cases are
// moderate, and the size ramp that rc::check performs is spread over the campaign.
GeneratedCase sample_case(std::uint64_t seed, const fuzz::CaseSpace& space = fuzz::CaseSpace::chunked(64));

}  // namespace gdn::cli
