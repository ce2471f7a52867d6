// libFuzzer target over merge's reading of shard results: bytes -> JSON -> merge_results, alone
// and next to a valid shard. The contract under test: a file either merges or is rejected with
// std::invalid_argument naming it; nlohmann's type errors, out-of-range reads (ASan) and every
// other exception are bugs. Build and run: cli/fuzz_cli.sh.
#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "cli/campaign.hpp"
#include "cli/output.hpp"

namespace {

const nlohmann::json& valid_shard() {
  static const nlohmann::json j = nlohmann::json::parse(R"({"format": "gdn-fuzz-results/1", "seed": "1",
    "shard": {"index": 0, "count": 2}, "device": -1, "implementations": ["reference.chunked.f64"],
    "budget": "per implementation", "cases_limit": 10, "cases": 5, "seconds": 0.5, "interrupted": false,
    "failures_total": 0, "failures_not_saved": 0, "failures": [],
    "tallies": {"reference.chunked.f64": {"pass": 5, "fail": 0, "error": 0, "skipped": 0, "worst_margin": 0.1,
                                          "worst_case": "fuzz/2"}}})");
  return j;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(data, data + size);
  } catch (const nlohmann::json::exception&) {
    return 0;  // not JSON (or a number out of range): merge reports "is not JSON" before merge_results
  }
  for (const std::vector<nlohmann::json>& shards :
       {std::vector<nlohmann::json>{j}, std::vector<nlohmann::json>{valid_shard(), j}}) {
    try {
      const nlohmann::json merged = gdn::cli::merge_results(shards, {"a.json", "b.json"});
      (void)gdn::cli::dump_json(merged);
    } catch (const std::invalid_argument&) {
    }
  }
  return 0;
}
