#pragma once
// Case files: one problem, its inputs, optionally an implementation's outputs, and metadata, in
// a safetensors container. Schema and the rules the reader enforces: docs/case_files.md.
// Two levels: the container (any safetensors file, parsed and checked byte for byte) and the
// case (the gdn-case/1 schema on top of it, checked against the Problem).
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/problem.hpp"

namespace gdn::oracle {

// Every malformed file: what() names the file (or "<memory>") and the rule it breaks.
class CaseFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// ---- container level ---------------------------------------------------------------------

struct RawTensor {
  std::string name;
  std::string dtype;  // safetensors spelling: "F32", "BF16", "I64", ...
  Shape shape;
  std::vector<std::uint8_t> bytes;  // row-major, little-endian
};

struct SafetensorsFile {
  std::map<std::string, std::string> metadata;
  std::vector<RawTensor> tensors;  // sorted by name
  const RawTensor* find(const std::string& name) const;
};

// The largest header the reader accepts: the upstream cap (safetensors' MAX_HEADER_SIZE).
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

// Bytes per element of a safetensors dtype name; 0 for a name it does not know.
std::size_t safetensors_dtype_size(const std::string& dtype);

// Parses and checks a whole container (docs/case_files.md, "What the reader rejects", container
// rules). `what` names the source in errors.
SafetensorsFile parse_safetensors(const std::uint8_t* data, std::size_t size, const std::string& what = "<memory>");
std::vector<std::uint8_t> serialize_safetensors(const SafetensorsFile& file);

// Writes `bytes` to a temporary file beside `path`, flushes it, and renames it over `path`:
// readers never see a half-written file. Throws std::runtime_error naming the path.
void write_file_atomic(const std::string& path, const std::vector<std::uint8_t>& bytes);
std::vector<std::uint8_t> read_file_bytes(const std::string& path);

// ---- case level --------------------------------------------------------------------------

constexpr const char* kCaseFormat = "gdn-case/1";

nlohmann::json problem_to_json(const Problem& problem);
// Strict: every key required, types checked; then Problem::validate(). Throws CaseFileError.
Problem problem_from_json(const nlohmann::json& json);

struct CaseFile {
  Problem problem;
  Inputs inputs;
  // out.* tensors, widened to double. Absent for inputs-only files.
  std::optional<Outputs<double>> outputs;
  // Everything in __metadata__, gdn.format and gdn.problem included (the writer sets those two
  // from `problem` and overrides whatever the map says).
  std::map<std::string, std::string> metadata;

  std::string meta(const std::string& key, const std::string& fallback = "") const;
};

// Serialises the case: inputs in the dtypes the Problem names, outputs in the narrowest of
// (the output's dtype, F32, F64) that holds every value exactly, so nothing is lost.
// Throws CaseFileError when an input is not representable in its dtype (the Inputs contract).
std::vector<std::uint8_t> encode_case(const CaseFile& case_file);
CaseFile decode_case(const std::uint8_t* data, std::size_t size, const std::string& what = "<memory>");

void write_case_file(const std::string& path, const CaseFile& case_file);
CaseFile read_case_file(const std::string& path);

}  // namespace gdn::oracle
