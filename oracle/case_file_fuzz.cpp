// libFuzzer target on the case-file reader (container and case level). The contract under
// test: any byte string either decodes or throws CaseFileError; nothing else escapes, and
// nothing reads out of bounds (ASan). Build and run: oracle/fuzz_case_reader.sh.
#include <cstddef>
#include <cstdint>

#include "oracle/case_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const gdn::oracle::CaseFile c = gdn::oracle::decode_case(data, size);
    // A file that decodes must encode again (it satisfies the Inputs contract).
    (void)gdn::oracle::encode_case(c);
  } catch (const gdn::oracle::CaseFileError&) {
  }
  return 0;
}
