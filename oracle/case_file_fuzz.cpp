// libFuzzer target on the case-file reader (container and case level). The contract under
// test: any byte string either decodes or throws CaseFileError; nothing else escapes, and
// nothing reads out of bounds (ASan). A file that decodes must also encode again (it satisfies
// the Inputs contract, every input finite), its estimated cost must be within the limits it
// was read under, and a file that decodes under tight limits must decode under the defaults.
// Build and run: oracle/fuzz_case_reader.sh.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "oracle/case_file.hpp"

namespace {

[[noreturn]] void broken(const char* contract) {
  std::fprintf(stderr, "case_file_fuzz: %s\n", contract);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace gdn::oracle;
  // Tight limits, so that the size estimate and its refusal are on the fuzzed paths too.
  const CaseLimits tight{std::uint64_t(1) << 22, std::uint64_t(1) << 20};
  gdn::oracle::CaseFile c;
  try {
    c = decode_case(data, size, "<fuzz>", tight);
  } catch (const CaseFileError&) {
    try {
      (void)decode_case(data, size, "<fuzz>");  // the default limits: a refusal is fine too
    } catch (const CaseFileError&) {
    }
    return 0;
  }
  const CaseCost cost = estimate_cost(c.problem, c.settings.formulation, c.settings.chunk_size, size);
  if (cost.bytes > tight.max_bytes || cost.work > tight.max_work) broken("decoded a case over its limits");
  try {
    (void)decode_case(data, size, "<fuzz>");
  } catch (const CaseFileError&) {
    broken("decoded under tight limits but not under the defaults");
  }
  try {
    (void)encode_case(c);
  } catch (const CaseFileError&) {
    broken("a decoded case does not encode again");
  }
  return 0;
}
