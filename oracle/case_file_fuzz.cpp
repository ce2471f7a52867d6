// libFuzzer target on the case-file reader (container and case level). The contract under
// test: any byte string either decodes or throws CaseFileError; nothing else escapes, and
// nothing reads out of bounds (ASan). A file that decodes must also encode again (it satisfies
// the Inputs contract, every input finite, the backward's rules), and what that writes must
// read back and encode to the same bytes, its estimated cost must be within the limits it
// was read under, and a file that decodes under tight limits must decode under the defaults.
// Build and run: oracle/fuzz_case_reader.sh.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

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
  const CaseCost cost =
      estimate_cost(c.problem, c.settings.formulation, c.settings.chunk_size, size, c.backward.has_value());
  if (cost.bytes > tight.max_bytes || cost.work > tight.max_work) broken("decoded a case over its limits");
  try {
    (void)decode_case(data, size, "<fuzz>");
  } catch (const CaseFileError&) {
    broken("decoded under tight limits but not under the defaults");
  }
  std::vector<std::uint8_t> again;
  try {
    again = encode_case(c);
  } catch (const CaseFileError&) {
    broken("a decoded case does not encode again");
  }
  // What the writer wrote from a decoded case reads back (gdn-case/2 included) and writes the
  // same bytes again: the round trip is bit for bit.
  try {
    const CaseFile back = decode_case(again.data(), again.size(), "<fuzz re-encoded>");
    if (back.backward.has_value() != c.backward.has_value() || back.gradients.has_value() != c.gradients.has_value())
      broken("the backward's tensors did not survive a round trip");
    if (encode_case(back) != again) broken("a re-encoded case does not round-trip bit for bit");
  } catch (const CaseFileError&) {
    broken("the writer wrote a case the reader refuses");
  }
  return 0;
}
