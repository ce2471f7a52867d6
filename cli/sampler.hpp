#pragma once
// The fuzz campaign's case source: a seed -> GeneratedCase function over a space of problems.
#include "cli/campaign.hpp"
#include "fuzz/inputs.hpp"

namespace gdn::cli {

struct SampleSpace {
  int max_K = 64, max_V = 64;
  int max_H = 2, max_group = 3;
  int max_sequences = 4;
  std::int64_t max_tokens = 400;
  int chunk_size = 64;                // lengths near multiples of it are drawn on purpose
  double max_work = 2.0e6;            // T * HV * K * V cap: keeps one case ~1 ms
  bool intermediate_states = false;   // per-token states: only sequential implementations serve them
};

nlohmann::json to_json(const fuzz::InputOptions& options);
fuzz::InputOptions input_options_from_json(const nlohmann::json& json);

// Deterministic in (seed, space).
GeneratedCase sample_case(std::uint64_t seed, const SampleSpace& space = {});

}  // namespace gdn::cli
