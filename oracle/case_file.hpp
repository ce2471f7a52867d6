#pragma once
// Case files: one problem, its inputs, optionally an implementation's outputs, and metadata, in
// a safetensors container. Schema and the rules the reader enforces: docs/case_files.md.
// Two levels: the container (any safetensors file, parsed and checked byte for byte) and the
// case (the gdn-case/1 schema, gdn-case/2 with the backward's tensors, or gdn-case/3 with
// reduced-precision states and linear gates, on top of it, checked against the Problem).
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/gradients.hpp"
#include "core/implementation.hpp"
#include "core/problem.hpp"
#include "oracle/budget.hpp"
#include "oracle/limits.hpp"

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
// rules). `what` names the source in errors. The header must be exactly one JSON object, then
// only spaces (0x20): a NUL byte, any other trailing byte, or a key given twice in one object
// is an error (a second reader could see other data than this one).
SafetensorsFile parse_safetensors(const std::uint8_t* data, std::size_t size, const std::string& what = "<memory>");
std::vector<std::uint8_t> serialize_safetensors(const SafetensorsFile& file);

// Writes `bytes` to a temporary file beside `path`, flushes it, and renames it over `path`:
// readers never see a half-written file. Throws std::runtime_error naming the path.
void write_file_atomic(const std::string& path, const std::vector<std::uint8_t>& bytes);
// Reads a whole regular file. Anything else (a directory, a FIFO, a device, a socket) is refused
// from its stat() without being opened for reading, and a file larger than max_bytes is
// refused before it is read; the open itself never blocks (O_NONBLOCK, and fstat checks the
// opened file again). Throws CaseFileError naming the path and the rule.
std::vector<std::uint8_t> read_file_bytes(const std::string& path,
                                          std::uint64_t max_bytes = CaseLimits::kDefaultMaxBytes);

// ---- case level --------------------------------------------------------------------------

// gdn-case/1: the forward (inputs, out.o, out.hT, out.intermediate). gdn-case/2 adds the
// backward: in.dO, in.dhT and out.dq ... out.dh0. The writer names the oldest version that holds
// the file (gdn-case/1 unless it has backward tensors), so readers of gdn-case/1 keep reading
// every forward-only file; the reader takes both, and refuses backward tensors in a gdn-case/1
// file.
// gdn-case/3 adds the storage conventions of serving kernels: the problem's state_dtype (h0 and
// the stored states in bf16 or fp16) and gate_space (linear gates: the tensor 'alpha' instead of
// 'g'); it holds everything /2 holds. The writer names /3 only for a problem that uses one of
// them, so every other file stays readable by older readers, and a /1 or /2 file is read as
// fp32 states with log-space gates.
constexpr const char* kCaseFormat = "gdn-case/1";
constexpr const char* kCaseFormatBackward = "gdn-case/2";
constexpr const char* kCaseFormatStates = "gdn-case/3";

// Whether the problem needs gdn-case/3 (state_dtype other than f32 or linear gates).
bool needs_format_3(const Problem& problem);

// The keys state_dtype and gate_space are written only when needs_format_3 (both then), so the
// object of every other problem is the gdn-case/1 object.
nlohmann::json problem_to_json(const Problem& problem);
// Strict: every gdn-case/1 key required, types checked; state_dtype and gate_space optional
// (absent: f32, log) and checked when given; then Problem::validate(). Throws CaseFileError.
// Which keys a file of a given gdn.format may hold is decode_case's rule.
Problem problem_from_json(const nlohmann::json& json);

// How the file's metadata says its outputs are to be judged: gdn.formulation, gdn.chunk_size
// and gdn.budget, parsed and checked (a malformed value is an error naming the key, never
// replaced by a default). Whether a file's own budget may be used, or may loosen the
// implementation's default, is for the caller to decide: this only says what the file asks.
struct JudgeSettings {
  Formulation formulation = Formulation::chunked;  // gdn.formulation; chunked when absent
  int chunk_size = 64;                              // gdn.chunk_size; 64 when absent
  std::optional<BudgetOptions> budget;              // gdn.budget; nullopt when absent
};
// Throws CaseFileError (naming `what` and the key) when a value is malformed, or when the
// budget does not apply to the problem and formulation (baseline=operands_single needs
// gdn.formulation chunked, gdn.chunk_size 64 and no intermediate states).
JudgeSettings judge_settings(const std::map<std::string, std::string>& metadata, const Problem& problem,
                             const std::string& what = "<memory>");

struct CaseFile {
  Problem problem;
  Inputs inputs;
  // out.* tensors, widened to double. Absent for inputs-only files.
  std::optional<Outputs<double>> outputs;
  // The backward's inputs, in.dO (required) and in.dhT (only with has_hT; undefined when absent,
  // i.e. zero), widened to double (gdn-case/2). Only for problems the backward covers: no state
  // cache, no per-token states (docs/backward.md, "Scope").
  std::optional<BackwardInputs> backward;
  // out.dq ... out.dh0 widened to double (gdn-case/2): exactly the gradients the problem has
  // (a tensor defined iff the input it differentiates is used), only with `backward`.
  std::optional<Gradients<double>> gradients;
  // Everything in __metadata__, gdn.format and gdn.problem included (the writer sets those two
  // from `problem` and overrides whatever the map says).
  std::map<std::string, std::string> metadata;
  // judge_settings(metadata, problem), set by decode_case; ignored by encode_case (the writer
  // stores the metadata map as it is).
  JudgeSettings settings;

  std::string meta(const std::string& key, const std::string& fallback = "") const;
};

// Serialises the case: inputs in the dtypes the Problem names (h0 in the state dtype, dO in the
// input dtype, dhT in F32), outputs and gradients in the narrowest of (their storage dtype,
// oracle::output_dtype; F32; F64) that holds every value exactly, so nothing is lost. gdn.format
// is gdn-case/3 when needs_format_3, else gdn-case/2 when the case has backward tensors, else
// gdn-case/1. Throws CaseFileError when an input is not
// representable in its dtype (the Inputs contract) or not finite, or when the backward's
// tensors break a rule of the reader (what the reader refuses).
std::vector<std::uint8_t> encode_case(const CaseFile& case_file);
// Checks, in this order, each before the memory or work it guards: the container, gdn.format,
// gdn.problem, the judge settings, the backward's rules (backward tensors only in gdn-case/2;
// gradients and dhT only with dO; dhT only with has_hT; dO not with a state cache or per-token
// states), the estimated cost against `limits` (estimate_cost, the backward's included), then
// the tensors against the problem, and every input value finite (q, k, v, g, beta, a, b, A_log,
// dt_bias, h0, in.dO, in.dhT: the first bad element is named). Outputs and gradients may hold
// NaN or Inf: they are judged, not rejected. Throws CaseFileError naming `what` and the rule.
CaseFile decode_case(const std::uint8_t* data, std::size_t size, const std::string& what = "<memory>",
                     const CaseLimits& limits = {});

void write_case_file(const std::string& path, const CaseFile& case_file);
CaseFile read_case_file(const std::string& path, const CaseLimits& limits = {});

}  // namespace gdn::oracle
