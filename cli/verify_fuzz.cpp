// libFuzzer target over the whole verify path: bytes -> case file (oracle::decode_case) ->
// judgment (judge_case: budget rule, formulation, references, verdict) -> the --json and
// --junit outputs. The contract under test: any byte string gives exactly one verdict or a
// CaseFileError from the reader, nothing else escapes, nothing reads out of bounds (ASan), a
// verdict is never PASS with a non-finite error or budget, and both outputs are well-formed
// (the JSON parses back strictly; the XML is valid UTF-8 without a raw control character).
// Build and run: cli/fuzz_cli.sh.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstdio>

#include "cli/judge_file.hpp"
#include "cli/output.hpp"
#include "oracle/case_file.hpp"

namespace {

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "verify_fuzz: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gdn;
  // Small limits keep each input fast; the limits' own logic is part of what is fuzzed.
  oracle::CaseLimits limits;
  limits.max_bytes = std::uint64_t(64) << 20;
  limits.max_work = std::uint64_t(1) << 20;
  oracle::Verdict v;
  try {
    const oracle::CaseFile c = oracle::decode_case(data, size, "fuzz.safetensors", limits);
    v = cli::judge_case(c, "fuzz.safetensors", std::nullopt,
                        [](const std::string&) -> const oracle::RegistryEntry* { return nullptr; });
  } catch (const oracle::CaseFileError& e) {
    v = cli::error_verdict("fuzz.safetensors", "(unreadable)", e.what());
  }
  if (v.status == oracle::Status::pass)
    for (const oracle::Check& check : v.checks)
      require(std::isfinite(check.error) && std::isfinite(check.budget), "PASS with a non-finite error or budget");
  const std::vector<oracle::Verdict> verdicts = {v};
  const std::string json = cli::dump_json(cli::verdicts_json("gdn-testbed verify fuzz.safetensors", verdicts));
  (void)nlohmann::json::parse(json);  // throws (and fails the run) on malformed JSON
  const std::string xml = cli::junit_xml("gdn-testbed verify", verdicts);
  require(cli::valid_utf8(xml) == xml, "JUnit XML is not valid UTF-8");
  for (const char ch : xml)
    require(static_cast<unsigned char>(ch) >= 0x20 || ch == '\n', "JUnit XML holds a raw control character");
  return 0;
}
