#include <catch2/catch.hpp>

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <random>
#include <cmath>
#include <cstring>
#include <limits>
#include <fstream>
#include <functional>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "fuzz/inputs.hpp"
#include "oracle/case_file.hpp"
#include "reference/precision.hpp"
#include "reference/sequential.hpp"

using namespace gdn;
using namespace gdn::oracle;

namespace {

std::string temp_dir() {
  static std::string dir = [] {
    char pattern[] = "/tmp/gdn_case_file_test.XXXXXX";
    const char* made = mkdtemp(pattern);
    REQUIRE(made != nullptr);
    return std::string(made);
  }();
  return dir;
}

CaseFile make_case(const Problem& p, std::uint64_t seed, bool with_outputs) {
  CaseFile c;
  c.problem = p;
  c.inputs = fuzz::make_inputs(p, {}, seed);
  if (with_outputs) c.outputs = reference::sequential<double>(p, c.inputs);
  c.metadata["gdn.case_name"] = "test";
  c.metadata["gdn.generator"] = R"({"seed": "7"})";
  return c;
}

void check_same(const CaseFile& a, const CaseFile& b) {
  CHECK(problem_to_json(a.problem) == problem_to_json(b.problem));
  CHECK(a.inputs.q == b.inputs.q);
  CHECK(a.inputs.k == b.inputs.k);
  CHECK(a.inputs.v == b.inputs.v);
  CHECK(a.inputs.g == b.inputs.g);
  CHECK(a.inputs.beta == b.inputs.beta);
  CHECK(a.inputs.a == b.inputs.a);
  CHECK(a.inputs.b == b.inputs.b);
  CHECK(a.inputs.A_log == b.inputs.A_log);
  CHECK(a.inputs.dt_bias == b.inputs.dt_bias);
  CHECK(a.inputs.h0 == b.inputs.h0);
  CHECK(a.inputs.state_indices == b.inputs.state_indices);
  REQUIRE(a.outputs.has_value() == b.outputs.has_value());
  if (a.outputs) {
    CHECK(a.outputs->o == b.outputs->o);
    CHECK(a.outputs->hT == b.outputs->hT);
    CHECK(a.outputs->intermediate == b.outputs->intermediate);
  }
  for (const auto& kv : a.metadata) CHECK(b.meta(kv.first) == kv.second);
}

// A container from a header text and a buffer, to plant each malformation by hand.
std::vector<std::uint8_t> container(const std::string& header, std::size_t buffer_bytes, std::uint64_t claimed_length = 0) {
  const std::uint64_t length = claimed_length ? claimed_length : header.size();
  std::vector<std::uint8_t> out(8 + header.size() + buffer_bytes, 0);
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(length >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

std::string parse_error(const std::vector<std::uint8_t>& bytes) {
  try {
    parse_safetensors(bytes.data(), bytes.size());
  } catch (const CaseFileError& e) {
    return e.what();
  }
  return "(accepted)";
}

std::string decode_error(const std::vector<std::uint8_t>& bytes) {
  try {
    decode_case(bytes.data(), bytes.size());
  } catch (const CaseFileError& e) {
    return e.what();
  }
  return "(accepted)";
}

// Re-serialises a valid case after editing its container: the way to plant case-level errors.
std::vector<std::uint8_t> edited(const CaseFile& c, const std::function<void(SafetensorsFile&)>& edit) {
  const std::vector<std::uint8_t> bytes = encode_case(c);
  SafetensorsFile file = parse_safetensors(bytes.data(), bytes.size());
  edit(file);
  return serialize_safetensors(file);
}

RawTensor* find_mutable(SafetensorsFile& file, const std::string& name) {
  for (RawTensor& t : file.tensors)
    if (t.name == name) return &t;
  FAIL("no tensor " << name);
  return nullptr;
}

}  // namespace

TEST_CASE("case files round-trip every dtype and option exactly", "[oracle][case_file]") {
  std::vector<Problem> problems;
  {
    Problem p = Problem::packed({3, 0, 5}, 2, 4, 8, 6);
    p.has_h0 = p.has_hT = true;
    p.input_dtype = DType::bf16;
    problems.push_back(p);
    p.input_dtype = DType::f16;
    p.gate_dtype = DType::f16;
    p.state_layout = StateLayout::v_major;
    problems.push_back(p);
  }
  {
    Problem p = Problem::packed({4, 2}, 1, 1, 5, 3);
    p.gate_mode = GateMode::fused;
    p.allow_negative_eigenvalues = true;
    p.use_qk_l2norm = true;
    p.scale = 0.3;
    p.input_dtype = DType::f64;
    problems.push_back(p);
  }
  {
    Problem p = Problem::packed({1, 1, 1}, 1, 2, 4, 4);
    p.state_slots = 5;
    p.has_h0 = p.has_hT = true;
    p.store_intermediate_states = true;
    problems.push_back(p);
  }
  problems.push_back(Problem::packed({0}, 1, 1, 2, 2));  // T = 0: zero-byte tensors
  for (const Problem& p : problems) {
    for (bool outputs : {false, true}) {
      INFO(p.describe() << (outputs ? " with outputs" : ""));
      const CaseFile c = make_case(p, 42, outputs);
      const std::string path = temp_dir() + "/round_trip.safetensors";
      write_case_file(path, c);
      check_same(c, read_case_file(path));
    }
  }
}

TEST_CASE("outputs are stored without loss, in the output dtype when it suffices", "[oracle][case_file]") {
  Problem p = Problem::packed({6}, 1, 1, 4, 4);
  p.input_dtype = DType::bf16;
  p.has_hT = true;
  CaseFile c = make_case(p, 3, true);  // double outputs: need F64
  std::vector<std::uint8_t> bytes = encode_case(c);
  SafetensorsFile file = parse_safetensors(bytes.data(), bytes.size());
  CHECK(file.find("out.o")->dtype == "F64");
  for (std::int64_t i = 0; i < c.outputs->o.numel(); ++i)
    c.outputs->o[i] = reference::round_to(DType::bf16, c.outputs->o[i]);
  for (std::int64_t i = 0; i < c.outputs->hT.numel(); ++i) c.outputs->hT[i] = static_cast<float>(c.outputs->hT[i]);
  bytes = encode_case(c);
  file = parse_safetensors(bytes.data(), bytes.size());
  CHECK(file.find("out.o")->dtype == "BF16");
  CHECK(file.find("out.hT")->dtype == "F32");
  check_same(c, decode_case(bytes.data(), bytes.size()));
}

TEST_CASE("the container is what upstream safetensors writes", "[oracle][case_file]") {
  const CaseFile c = make_case(Problem::packed({2}, 1, 1, 2, 2), 1, false);
  const std::vector<std::uint8_t> bytes = encode_case(c);
  std::uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | bytes[static_cast<std::size_t>(i)];
  CHECK((8 + length) % 8 == 0);  // buffer 8-byte aligned
  const nlohmann::json header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(length));
  CHECK(header["__metadata__"]["gdn.format"] == "gdn-case/1");
  CHECK(header["q"]["dtype"] == "F32");
  CHECK(header["q"]["shape"] == nlohmann::json::array({2, 1, 2}));
  CHECK(header["beta"]["data_offsets"] == nlohmann::json::array({0, 8}));  // sorted by name
  CHECK(header["cu_seqlens"]["data_offsets"] == nlohmann::json::array({8, 24}));
}

TEST_CASE("writes are atomic: no temporary file is left behind, a rewrite replaces", "[oracle][case_file]") {
  const std::string dir = temp_dir() + "/atomic";
  REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
  const std::string path = dir + "/case.safetensors";
  write_case_file(path, make_case(Problem::packed({3}, 1, 1, 2, 2), 1, false));
  write_case_file(path, make_case(Problem::packed({5}, 1, 1, 2, 2), 1, false));
  CHECK(read_case_file(path).problem.T == 5);
  int entries = 0;
  DIR* d = ::opendir(dir.c_str());
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++entries;
  ::closedir(d);
  CHECK(entries == 1);
  CHECK_THROWS_WITH(write_file_atomic(dir + "/no/such/dir/x", {1, 2}), Catch::Contains("cannot create"));
}

TEST_CASE("container reader rejects malformed files with clear errors", "[oracle][case_file]") {
  const std::string ok_entry = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  REQUIRE(parse_error(container("{" + ok_entry + "}", 8)) == "(accepted)");

  CHECK_THAT(parse_error({1, 2, 3}), Catch::Contains("truncated"));
  CHECK_THAT(parse_error(container("{" + ok_entry + "}", 8, 1000)), Catch::Contains("truncated"));
  CHECK_THAT(parse_error(container("{" + ok_entry + "}", 8, std::uint64_t(1) << 40)), Catch::Contains("exceeds the limit"));
  CHECK_THAT(parse_error(container("{" + ok_entry + "}", 4)), Catch::Contains("past the end"));  // buffer truncated
  CHECK_THAT(parse_error(container("[1,2]", 0)), Catch::Contains("must start with '{'"));
  CHECK_THAT(parse_error(container("{\"t\":", 0)), Catch::Contains("not valid JSON"));
  CHECK_THAT(parse_error(container(R"({"t":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8)),
             Catch::Contains("unknown dtype 'F33'"));
  CHECK_THAT(parse_error(container(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)),
             Catch::Contains("needs 12"));  // shape/byte mismatch
  CHECK_THAT(parse_error(container(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8)),
             Catch::Contains("non-negative integers"));
  CHECK_THAT(parse_error(container(R"({"t":{"dtype":"F64","shape":[281474976710656,281474976710656],"data_offsets":[0,8]}})", 8)),
             Catch::Contains("overflows"));
  CHECK_THAT(parse_error(container(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8)),
             Catch::Contains("end before they begin"));
  CHECK_THAT(parse_error(container(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"u":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12)),
             Catch::Contains("overlaps"));
  CHECK_THAT(parse_error(container(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8)),
             Catch::Contains("gap"));
  CHECK_THAT(parse_error(container("{" + ok_entry + "}", 12)), Catch::Contains("trailing bytes"));
  CHECK_THAT(parse_error(container(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})", 8)),
             Catch::Contains("unknown key 'extra'"));
  CHECK_THAT(parse_error(container(R"({"t":{"dtype":"F32","shape":[2]}})", 8)), Catch::Contains("data_offsets"));
  CHECK_THAT(parse_error(container(R"({"__metadata__":{"a":1},)" + ok_entry + "}", 8)),
             Catch::Contains("must be a string"));
  CHECK_THAT(parse_error(container(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0.5,8]}})", 8)),
             Catch::Contains("non-negative integers"));
}

TEST_CASE("case reader rejects files that do not fit their problem", "[oracle][case_file]") {
  Problem p = Problem::packed({3, 2}, 1, 2, 4, 4);
  p.has_h0 = true;
  p.has_hT = true;
  p.input_dtype = DType::bf16;
  const CaseFile c = make_case(p, 5, true);
  REQUIRE(decode_error(encode_case(c)) == "(accepted)");

  CHECK_THAT(decode_error(edited(c, [](SafetensorsFile& f) { f.metadata.erase("gdn.format"); })),
             Catch::Contains("gdn.format"));
  CHECK_THAT(decode_error(edited(c, [](SafetensorsFile& f) { f.metadata["gdn.problem"] = "{"; })),
             Catch::Contains("not valid JSON"));
  CHECK_THAT(decode_error(edited(c, [&](SafetensorsFile& f) {
               nlohmann::json j = problem_to_json(p);
               j.erase("HV");
               f.metadata["gdn.problem"] = j.dump();
             })),
             Catch::Contains("missing key 'HV'"));
  CHECK_THAT(decode_error(edited(c, [&](SafetensorsFile& f) {
               nlohmann::json j = problem_to_json(p);
               j["HV"] = 3;  // not a multiple of H... H = 1 so use K = 0 instead
               j["K"] = 0;
               f.metadata["gdn.problem"] = j.dump();
             })),
             Catch::Contains("invalid problem"));
  CHECK_THAT(decode_error(edited(c, [](SafetensorsFile& f) {
               f.tensors.erase(std::remove_if(f.tensors.begin(), f.tensors.end(),
                                              [](const RawTensor& t) { return t.name == "h0"; }),
                               f.tensors.end());
             })),
             Catch::Contains("'h0' is missing"));
  CHECK_THAT(decode_error(edited(c, [](SafetensorsFile& f) { f.tensors.push_back({"stray", "F32", {1}, {0, 0, 0, 0}}); })),
             Catch::Contains("'stray' is not part of this problem"));
  CHECK_THAT(decode_error(edited(c, [](SafetensorsFile& f) {
               RawTensor* q = find_mutable(f, "q");
               q->dtype = "F16";  // same byte size, wrong dtype for a bf16 problem
             })),
             Catch::Contains("'q' must have dtype BF16"));
  CHECK_THAT(decode_error(edited(c, [](SafetensorsFile& f) {
               RawTensor* v = find_mutable(f, "v");
               v->shape = {v->shape[0] * v->shape[1], v->shape[2]};
             })),
             Catch::Contains("'v' must have shape"));
  CHECK_THAT(decode_error(edited(c, [](SafetensorsFile& f) {
               RawTensor* cu = find_mutable(f, "cu_seqlens");
               cu->bytes[8] = 4;  // cu[1] = 4 instead of 3
             })),
             Catch::Contains("disagrees with gdn.problem"));
  CHECK_THAT(decode_error(edited(c, [](SafetensorsFile& f) {
               RawTensor* g = find_mutable(f, "g");
               const float nan = NAN;
               std::memcpy(g->bytes.data(), &nan, 4);
             })),
             Catch::Contains("tensor 'g'[0, 0] (element 0) is NaN"));
  CHECK_THAT(decode_error(edited(c, [](SafetensorsFile& f) {
               f.tensors.erase(std::remove_if(f.tensors.begin(), f.tensors.end(),
                                              [](const RawTensor& t) { return t.name == "out.hT"; }),
                               f.tensors.end());
             })),
             Catch::Contains("'out.hT' is missing"));
}

TEST_CASE("encode refuses inputs that break the Inputs contract", "[oracle][case_file]") {
  Problem p = Problem::packed({2}, 1, 1, 2, 2);
  p.input_dtype = DType::bf16;
  CaseFile c = make_case(p, 1, false);
  c.inputs.q[0] = 1.0 + 1e-9;  // not a bf16 value
  CHECK_THROWS_WITH(encode_case(c), Catch::Contains("not representable in bf16"));
  c = make_case(p, 1, false);
  c.inputs.v = HostTensor<double>({1, 1, 2});
  CHECK_THROWS_WITH(encode_case(c), Catch::Contains("'v'"));
}

// ---- hardening: the defects of issue 29's samples (oracle/tests/repro) and the rules that
// close them ----------------------------------------------------------------------------------

namespace {

std::string repro(const std::string& name) { return std::string(GDN_REPRO_DIR) + "/" + name; }

std::string read_error(const std::string& path, const CaseLimits& limits = {}) {
  try {
    read_case_file(path, limits);
  } catch (const CaseFileError& e) {
    return e.what();
  }
  return "(accepted)";
}

// A valid case with every input tensor a case can have in one of its two gate modes.
Problem hardening_problem(GateMode mode) {
  Problem p = Problem::packed({3, 2}, 1, 2, 4, 3);
  p.has_h0 = p.has_hT = true;
  p.gate_mode = mode;
  return p;
}

void set_float(SafetensorsFile& f, const std::string& name, std::size_t element, float value) {
  RawTensor* t = find_mutable(f, name);
  REQUIRE(t->dtype == "F32");
  REQUIRE(4 * (element + 1) <= t->bytes.size());
  std::memcpy(t->bytes.data() + 4 * element, &value, 4);
}

std::vector<std::uint8_t> with_metadata(const CaseFile& c, const std::string& key, const std::string& value) {
  return edited(c, [&](SafetensorsFile& f) { f.metadata[key] = value; });
}

}  // namespace

TEST_CASE("repro: the valid sample reads, so the samples below are read from the right place", "[oracle][case_file]") {
  REQUIRE(read_error(repro("good.safetensors")) == "(accepted)");
  const CaseFile c = read_case_file(repro("good.safetensors"));
  CHECK(c.settings.formulation == Formulation::sequential);
  CHECK_FALSE(c.settings.budget.has_value());
}

TEST_CASE("repro nan_all: NaN inputs are an error naming the tensor and element, never judged",
          "[oracle][case_file]") {
  const std::string error = read_error(repro("nan_all.safetensors"));
  CHECK_THAT(error, Catch::Contains("nan_all.safetensors"));
  CHECK_THAT(error, Catch::Contains("tensor 'q'[0, 0, 0] (element 0) is NaN"));
  CHECK_THAT(error, Catch::Contains("inputs must be finite"));
}

TEST_CASE("repro nul_junk: a header padded with NUL and junk is refused", "[oracle][case_file]") {
  CHECK_THAT(read_error(repro("nul_junk.safetensors")), Catch::Contains("header holds a NUL byte at offset"));
}

TEST_CASE("repro budget_typo: a malformed gdn.budget is an error naming the key", "[oracle][case_file]") {
  const std::string error = read_error(repro("budget_typo.safetensors"));
  CHECK_THAT(error, Catch::Contains("'gdn.budget' = 'fixed(rel_rms=abc)' is malformed"));
  CHECK_THAT(error, Catch::Contains("needs a number"));
}

TEST_CASE("repro operands_single_meta: a budget that does not apply to the file's formulation is a clear error",
          "[oracle][case_file]") {
  const std::string error = read_error(repro("operands_single_meta.safetensors"));
  CHECK_THAT(error, Catch::Contains("'gdn.budget' = 'calibrated(baseline=operands_single)' needs gdn.formulation "
                                    "'chunked' with gdn.chunk_size 64"));
  CHECK_THAT(error, Catch::Contains("this file has gdn.formulation 'sequential'"));
  // The same budget on a chunked C = 64 file is valid, and the reader hands it on.
  CaseFile c = read_case_file(repro("good.safetensors"));
  c.metadata["gdn.formulation"] = "chunked";
  c.metadata["gdn.budget"] = "calibrated(baseline=operands_single)";
  const std::vector<std::uint8_t> bytes = encode_case(c);
  const CaseFile back = decode_case(bytes.data(), bytes.size());
  REQUIRE(back.settings.budget.has_value());
  CHECK(back.settings.budget->baseline == BudgetBaseline::operands_single);
  CHECK(back.settings.formulation == Formulation::chunked);
  CHECK(back.settings.chunk_size == 64);
}

TEST_CASE("repro tiny_5GB: a small file describing a huge problem is refused from its header, at once",
          "[oracle][case_file]") {
  const auto start = std::chrono::steady_clock::now();
  const std::string error = read_error(repro("tiny_5GB.safetensors"));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK_THAT(error, Catch::Contains("bytes of memory (estimated from gdn.problem), over the limit of 4294967296 bytes"));
  CHECK_THAT(error, Catch::Contains("--max-case-bytes"));
  CHECK(seconds < 0.5);
  // Raised limits let it through: the refusal is the limit's, not a malformation.
  CHECK(read_error(repro("tiny_5GB.safetensors"), {std::uint64_t(1) << 40, std::uint64_t(1) << 40}) == "(accepted)");
}

TEST_CASE("the reader refuses what is not a regular file, without opening or blocking on it", "[oracle][case_file]") {
  const std::string dir = temp_dir() + "/not_regular";
  REQUIRE(::mkdir(dir.c_str(), 0755) == 0);
  const std::string folder = dir + "/x.safetensors";
  REQUIRE(::mkdir(folder.c_str(), 0755) == 0);
  CHECK_THAT(read_error(folder), Catch::Contains("is a directory, not a regular file"));
  // A FIFO with no writer: opening it for reading would wait forever.
  const std::string fifo = dir + "/fifo.safetensors";
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  CHECK_THAT(read_error(fifo), Catch::Contains("is a FIFO, not a regular file"));
  CHECK_THAT(read_error("/dev/zero"), Catch::Contains("is a character device"));
  CHECK_THAT(read_error(dir + "/missing.safetensors"), Catch::Contains("cannot open"));
  // A symbolic link to a regular file is read as the file.
  const std::string link = dir + "/link.safetensors";
  REQUIRE(::symlink(repro("good.safetensors").c_str(), link.c_str()) == 0);
  CHECK(read_error(link) == "(accepted)");
  // The file's size is checked against the limit before it is read.
  CHECK_THAT(read_error(repro("good.safetensors"), {1000, CaseLimits::kDefaultMaxWork}),
             Catch::Contains("holds 2096 bytes, over the limit of 1000 bytes"));
}

TEST_CASE("every input tensor is checked for NaN and Inf, the first bad element named", "[oracle][case_file]") {
  struct Plant {
    GateMode mode;
    const char* tensor;
    std::size_t element;
    float value;
    const char* expected;
  };
  const float nan = NAN, inf = INFINITY;
  const Plant plants[] = {
      {GateMode::direct, "q", 5, nan, "tensor 'q'[1, 0, 1] (element 5) is NaN"},
      {GateMode::direct, "k", 0, inf, "tensor 'k'[0, 0, 0] (element 0) is +Inf"},
      {GateMode::direct, "v", 29, -inf, "tensor 'v'[4, 1, 2] (element 29) is -Inf"},
      {GateMode::direct, "g", 3, nan, "tensor 'g'[1, 1] (element 3) is NaN"},
      {GateMode::direct, "g", 2, inf, "tensor 'g'[1, 0] (element 2) is +Inf"},
      {GateMode::direct, "beta", 9, inf, "tensor 'beta'[4, 1] (element 9) is +Inf"},
      {GateMode::direct, "h0", 47, nan, "tensor 'h0'[1, 1, 3, 2] (element 47) is NaN"},
      {GateMode::fused, "a", 1, inf, "tensor 'a'[0, 1] (element 1) is +Inf"},
      {GateMode::fused, "b", 4, nan, "tensor 'b'[2, 0] (element 4) is NaN"},
      {GateMode::fused, "A_log", 1, nan, "tensor 'A_log'[1] (element 1) is NaN"},
      {GateMode::fused, "dt_bias", 0, -inf, "tensor 'dt_bias'[0] (element 0) is -Inf"},
  };
  for (const Plant& plant : plants) {
    INFO(plant.tensor << "[" << plant.element << "] = " << plant.value);
    const CaseFile c = make_case(hardening_problem(plant.mode), 11, true);
    REQUIRE(decode_error(encode_case(c)) == "(accepted)");
    const std::string error =
        decode_error(edited(c, [&](SafetensorsFile& f) { set_float(f, plant.tensor, plant.element, plant.value); }));
    CHECK_THAT(error, Catch::Contains(plant.expected));
    CHECK_THAT(error, Catch::Contains("inputs must be finite"));
  }
}

TEST_CASE("g = -inf, the operator's hard reset, is a valid case-file input", "[oracle][case_file]") {
  const CaseFile c = make_case(hardening_problem(GateMode::direct), 11, true);
  const std::string error = decode_error(
      edited(c, [&](SafetensorsFile& f) { set_float(f, "g", 2, -INFINITY); }));
  CHECK(error == "(accepted)");
}

TEST_CASE("outputs may hold NaN and Inf: they are judged, not rejected", "[oracle][case_file]") {
  const CaseFile c = make_case(hardening_problem(GateMode::direct), 12, true);
  const std::vector<std::uint8_t> bytes = edited(c, [](SafetensorsFile& f) {
    RawTensor* o = find_mutable(f, "out.o");
    const double nan = NAN, inf = INFINITY;
    REQUIRE(o->dtype == "F64");
    std::memcpy(o->bytes.data(), &nan, 8);
    std::memcpy(o->bytes.data() + 8, &inf, 8);
  });
  const CaseFile back = decode_case(bytes.data(), bytes.size());
  REQUIRE(back.outputs.has_value());
  CHECK(std::isnan(back.outputs->o[0]));
  CHECK(std::isinf(back.outputs->o[1]));
}

TEST_CASE("encode refuses non-finite inputs: it never writes a file the reader refuses", "[oracle][case_file]") {
  CaseFile c = make_case(hardening_problem(GateMode::direct), 13, false);
  c.inputs.beta[3] = NAN;
  CHECK_THROWS_WITH(encode_case(c), Catch::Contains("input 'beta'[1, 1] is NaN"));
  c = make_case(hardening_problem(GateMode::direct), 13, false);
  c.inputs.h0[0] = -INFINITY;
  CHECK_THROWS_WITH(encode_case(c), Catch::Contains("input 'h0'[0, 0, 0, 0] is -Inf"));
}

TEST_CASE("the header is one JSON object padded with spaces only, each key once", "[oracle][case_file]") {
  const std::string ok_entry = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  REQUIRE(parse_error(container("{" + ok_entry + "}    ", 8)) == "(accepted)");
  CHECK_THAT(parse_error(container("{" + ok_entry + "}\n   ", 8)), Catch::Contains("followed by nothing but spaces"));
  CHECK_THAT(parse_error(container("{" + ok_entry + "}\t", 8)), Catch::Contains("followed by nothing but spaces"));
  CHECK_THAT(parse_error(container("{" + ok_entry + std::string("}\0\0\0", 4), 8)),
             Catch::Contains("NUL byte at offset " + std::to_string(ok_entry.size() + 2)));
  CHECK_THAT(parse_error(container("{" + ok_entry + "} junk", 8)), Catch::Contains("not valid JSON"));
  CHECK_THAT(parse_error(container("{" + ok_entry + "}{}", 8)), Catch::Contains("not valid JSON"));
  CHECK_THAT(parse_error(container("{" + ok_entry + "," + ok_entry + "}", 8)),
             Catch::Contains("has the key 't' twice"));
  CHECK_THAT(parse_error(container(R"({"__metadata__":{"a":"1","a":"2"},)" + ok_entry + "}", 8)),
             Catch::Contains("has the key 'a' twice"));
  CHECK_THAT(parse_error(container(R"({"t":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8)),
             Catch::Contains("has the key 'dtype' twice"));
}

TEST_CASE("gdn.problem is strict JSON too: no NUL, no junk, no key twice", "[oracle][case_file]") {
  const CaseFile c = make_case(Problem::packed({3}, 1, 1, 2, 2), 1, false);
  const std::string text = problem_to_json(c.problem).dump();
  CHECK(decode_error(with_metadata(c, "gdn.problem", text + "  ")) == "(accepted)");
  CHECK_THAT(decode_error(with_metadata(c, "gdn.problem", text + std::string("\0{junk", 6))),
             Catch::Contains("'gdn.problem' holds a NUL byte"));
  CHECK_THAT(decode_error(with_metadata(c, "gdn.problem", text + "x")), Catch::Contains("'gdn.problem' is not valid JSON"));
  CHECK_THAT(decode_error(with_metadata(c, "gdn.problem", "{\"T\":3," + text.substr(1))),
             Catch::Contains("'gdn.problem' has the key 'T' twice"));
}

TEST_CASE("gdn.formulation, gdn.chunk_size and gdn.budget are parsed or refused by name, never defaulted",
          "[oracle][case_file]") {
  const CaseFile c = make_case(hardening_problem(GateMode::direct), 14, true);
  {
    const std::vector<std::uint8_t> bytes = encode_case(c);
    const CaseFile back = decode_case(bytes.data(), bytes.size());
    CHECK(back.settings.formulation == Formulation::chunked);  // the documented defaults
    CHECK(back.settings.chunk_size == 64);
    CHECK_FALSE(back.settings.budget);
  }
  {
    CaseFile set = c;
    set.metadata["gdn.formulation"] = "chunked";
    set.metadata["gdn.chunk_size"] = "32";
    set.metadata["gdn.budget"] = "fixed(rel_rms=1e-12)";
    const std::vector<std::uint8_t> bytes = encode_case(set);
    const CaseFile back = decode_case(bytes.data(), bytes.size());
    CHECK(back.settings.chunk_size == 32);
    REQUIRE(back.settings.budget);
    CHECK(back.settings.budget->model == BudgetModel::fixed);
    CHECK(*back.settings.budget->fixed_rel_rms == 1e-12);
  }
  for (const char* bad : {"Chunked", "", "recurrent", "chunked "})
    CHECK_THAT(decode_error(with_metadata(c, "gdn.formulation", bad)),
               Catch::Contains("'gdn.formulation' must be 'sequential' or 'chunked'"));
  for (const char* bad : {"", "0", "-1", "+64", " 64", "64x", "0x40", "1e2", "2097152", "99999999999999999999"})
    CHECK_THAT(decode_error(with_metadata(c, "gdn.chunk_size", bad)),
               Catch::Contains("'gdn.chunk_size' must be a decimal integer in [1, 1048576]"));
  for (const char* bad : {"calibrated(factor=)", "calibrated(factor=nan)", "fixed(rel_rms=-1)", "magic", "calibrated(typo=1)"})
    CHECK_THAT(decode_error(with_metadata(c, "gdn.budget", bad)), Catch::Contains("'gdn.budget' = '"));
  // Control characters in a quoted value are escaped, long values cut.
  CHECK_THAT(decode_error(with_metadata(c, "gdn.formulation", std::string("a\nb\x01", 4))), Catch::Contains("'a\\x0Ab\\x01'"));
  CHECK_THAT(decode_error(with_metadata(c, "gdn.formulation", std::string(200, 'x'))), Catch::Contains("... (200 bytes)"));
}

TEST_CASE("the cost estimate bounds memory and work before anything is decoded", "[oracle][case_file]") {
  // The largest case the project reads (cuda/tests/chunked_accuracy's varlen case) is within
  // the defaults, with room to spare.
  Problem big = Problem::packed({1, 64, 65, 300, 1000}, 16, 32, 128, 128);
  big.has_h0 = big.has_hT = true;
  big.input_dtype = DType::bf16;
  const CaseCost cost = estimate_cost(big, Formulation::chunked, 64, 50'000'000);
  CHECK(cost.bytes < CaseLimits::kDefaultMaxBytes / 2);
  CHECK(cost.work < CaseLimits::kDefaultMaxWork / 2);
  CHECK(cost.work >= std::uint64_t(1430 + 5) * 32 * 128 * 128);
  CHECK(exceeded_limit(cost, {}).empty());
  // Per-token states multiply the outputs by K: over the default memory limit.
  big.store_intermediate_states = true;
  CHECK_THAT(exceeded_limit(estimate_cost(big, Formulation::sequential, 64, 0), {}),
             Catch::Contains("over the limit of 4294967296 bytes"));
  // The work limit is named when it is the one exceeded.
  CHECK_THAT(exceeded_limit(cost, {CaseLimits::kDefaultMaxBytes, 1000}),
             Catch::Contains("state-element updates (estimated from gdn.problem), over the limit of 1000"));
  CHECK_THAT(exceeded_limit(cost, {CaseLimits::kDefaultMaxBytes, 1000}), Catch::Contains("--max-case-work"));
  // Sizes whose products overflow 64 bits saturate: refused, never wrapped to something small.
  Problem huge = Problem::packed({1 << 20}, 1 << 20, 1 << 20, 1 << 20, 1 << 20);
  const CaseCost saturated = estimate_cost(huge, Formulation::chunked, 64, 0);
  CHECK(saturated.bytes == std::numeric_limits<std::uint64_t>::max());
  CHECK(saturated.work == std::numeric_limits<std::uint64_t>::max());
  CHECK_THAT(exceeded_limit(saturated, {}), Catch::Contains("more than 2^64"));
  // decode_case applies the limits it is given, with the file's own formulation.
  const CaseFile c = make_case(hardening_problem(GateMode::direct), 15, true);
  const std::vector<std::uint8_t> bytes = encode_case(c);
  const CaseCost small = estimate_cost(c.problem, Formulation::chunked, 64, bytes.size());
  CHECK_NOTHROW(decode_case(bytes.data(), bytes.size(), "<memory>", {small.bytes, small.work}));
  CHECK_THROWS_WITH(decode_case(bytes.data(), bytes.size(), "<memory>", {small.bytes - 1, small.work}),
                    Catch::Contains("over the limit of " + std::to_string(small.bytes - 1) + " bytes"));
  CHECK_THROWS_WITH(decode_case(bytes.data(), bytes.size(), "<memory>", {small.bytes, small.work - 1}),
                    Catch::Contains("over the limit of " + std::to_string(small.work - 1)));
}

// ---- gdn-case/2: the backward's tensors (in.dO, in.dhT, out.dq ... out.dh0) -----------------

namespace {

// Cotangents and gradients of any values the storage dtypes hold (the reader checks shapes,
// dtypes and rules, not whether gradients are right: verify judges that).
BackwardInputs make_cotangents(const Problem& p, std::uint64_t seed, bool with_dhT) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  BackwardInputs b;
  b.dO = HostTensor<double>(p.v_shape());
  for (std::int64_t i = 0; i < b.dO.numel(); ++i) b.dO[i] = reference::round_to(p.input_dtype, normal(rng));
  if (with_dhT) {
    b.dhT = HostTensor<double>(p.state_shape());
    for (std::int64_t i = 0; i < b.dhT.numel(); ++i) b.dhT[i] = reference::round_to(DType::f32, normal(rng));
  }
  return b;
}

// Every gradient the inputs call for, shaped like its input; double values (stored as F64)
// unless `dtype` rounds them.
Gradients<double> make_gradients(const Inputs& in, std::uint64_t seed, std::optional<DType> dtype = std::nullopt) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  Gradients<double> g;
  const HostTensor<double>* sources[] = {&in.q, &in.k, &in.v, &in.g, &in.beta, &in.a, &in.b, &in.A_log, &in.dt_bias, &in.h0};
  std::size_t i = 0;
  g.for_each([&](const char*, HostTensor<double>& t) {
    const HostTensor<double>& x = *sources[i++];
    if (!x.defined()) return;
    t = HostTensor<double>(x.shape());
    for (std::int64_t e = 0; e < t.numel(); ++e) t[e] = dtype ? reference::round_to(*dtype, normal(rng)) : normal(rng);
  });
  return g;
}

CaseFile make_backward_case(const Problem& p, std::uint64_t seed, bool outputs, bool gradients, bool dhT = true) {
  CaseFile c = make_case(p, seed, outputs);
  c.backward = make_cotangents(p, seed + 1, dhT && p.has_hT);
  if (gradients) c.gradients = make_gradients(c.inputs, seed + 2);
  return c;
}

void check_same_backward(const CaseFile& a, const CaseFile& b) {
  check_same(a, b);
  REQUIRE(a.backward.has_value() == b.backward.has_value());
  if (a.backward) {
    CHECK(a.backward->dO == b.backward->dO);
    CHECK(a.backward->dhT.defined() == b.backward->dhT.defined());
    CHECK(a.backward->dhT == b.backward->dhT);
  }
  REQUIRE(a.gradients.has_value() == b.gradients.has_value());
  if (a.gradients) {
    std::vector<const HostTensor<double>*> theirs;
    b.gradients->for_each([&](const char*, const HostTensor<double>& t) { theirs.push_back(&t); });
    std::size_t i = 0;
    a.gradients->for_each([&](const char* name, const HostTensor<double>& t) {
      INFO(name);
      CHECK(t.defined() == theirs[i]->defined());
      CHECK(t == *theirs[i++]);
    });
  }
}

std::string format_of(const std::vector<std::uint8_t>& bytes) {
  return parse_safetensors(bytes.data(), bytes.size()).metadata.at("gdn.format");
}

void remove_tensor(SafetensorsFile& f, const std::string& name) {
  const std::size_t before = f.tensors.size();
  f.tensors.erase(std::remove_if(f.tensors.begin(), f.tensors.end(), [&](const RawTensor& t) { return t.name == name; }),
                  f.tensors.end());
  REQUIRE(f.tensors.size() + 1 == before);
}

RawTensor f32_tensor(const std::string& name, const Shape& shape) {
  RawTensor t{name, "F32", shape, {}};
  t.bytes.assign(static_cast<std::size_t>(shape_numel(shape)) * 4, 0);
  return t;
}

std::vector<std::string> corpus_files() {
  std::vector<std::string> files;
  const std::string dir = std::string(GDN_REPRO_DIR) + "/../../fuzz_corpus";
  DIR* d = ::opendir(dir.c_str());
  REQUIRE(d != nullptr);
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0) files.push_back(dir + "/" + n);
  }
  ::closedir(d);
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

TEST_CASE("gdn-case/2 round-trips the backward's inputs and gradients bit for bit", "[oracle][case_file][backward]") {
  std::vector<Problem> problems;
  {
    Problem p = Problem::packed({3, 0, 5}, 2, 4, 8, 6);  // GVA, a zero-length sequence
    p.has_h0 = p.has_hT = true;
    p.input_dtype = DType::bf16;
    problems.push_back(p);
    p.input_dtype = DType::f16;
    p.gate_dtype = DType::f16;
    p.state_layout = StateLayout::v_major;
    problems.push_back(p);
  }
  {
    Problem p = Problem::packed({4, 2}, 1, 1, 5, 3);
    p.gate_mode = GateMode::fused;
    p.use_qk_l2norm = true;
    p.has_h0 = true;
    p.input_dtype = DType::f64;
    problems.push_back(p);
  }
  problems.push_back(Problem::packed({0}, 1, 1, 2, 2));  // T = 0: zero-byte tensors
  for (const Problem& p : problems) {
    for (int variant = 0; variant < 4; ++variant) {
      const bool outputs = variant & 1, gradients = variant & 2;
      for (bool dhT : {true, false}) {
        INFO(p.describe() << " outputs " << outputs << " gradients " << gradients << " dhT " << dhT);
        const CaseFile c = make_backward_case(p, 21, outputs, gradients, dhT);
        const std::string path = temp_dir() + "/backward_round_trip.safetensors";
        write_case_file(path, c);
        const CaseFile back = read_case_file(path);
        check_same_backward(c, back);
        // Bit for bit: the file written from what was read is the file that was read.
        const std::vector<std::uint8_t> first = encode_case(c), second = encode_case(back);
        CHECK(first == second);
        CHECK(format_of(first) == "gdn-case/2");
      }
    }
  }
  // Without backward tensors the writer names gdn-case/1, readable by every older reader.
  CHECK(format_of(encode_case(make_case(problems[0], 21, true))) == "gdn-case/1");
}

TEST_CASE("gradients are stored without loss, in their storage dtype when it suffices", "[oracle][case_file][backward]") {
  Problem p = Problem::packed({6}, 1, 1, 4, 4);
  p.input_dtype = DType::bf16;
  p.has_h0 = p.has_hT = true;
  CaseFile c = make_backward_case(p, 3, false, false);
  c.gradients = make_gradients(c.inputs, 4, DType::bf16);  // bf16 values fit every storage dtype
  std::vector<std::uint8_t> bytes = encode_case(c);
  SafetensorsFile file = parse_safetensors(bytes.data(), bytes.size());
  CHECK(file.find("in.dO")->dtype == "BF16");
  CHECK(file.find("in.dhT")->dtype == "F32");
  CHECK(file.find("out.dq")->dtype == "BF16");
  CHECK(file.find("out.dg")->dtype == "F32");  // gate dtype f32
  CHECK(file.find("out.dh0")->dtype == "F32");
  check_same_backward(c, decode_case(bytes.data(), bytes.size()));
  c.gradients = make_gradients(c.inputs, 4);  // doubles: F64
  bytes = encode_case(c);
  file = parse_safetensors(bytes.data(), bytes.size());
  CHECK(file.find("out.dq")->dtype == "F64");
  check_same_backward(c, decode_case(bytes.data(), bytes.size()));
}

TEST_CASE("old files read unchanged: the fuzz corpus and the repro samples", "[oracle][case_file][backward]") {
  std::vector<std::string> files = corpus_files();
  REQUIRE(files.size() >= 7);
  for (const char* sample : {"good.safetensors", "f16_overflow_zero_o.safetensors", "budget_typo.safetensors"})
    files.push_back(repro(sample));
  int read = 0;
  for (const std::string& path : files) {
    INFO(path);
    const std::vector<std::uint8_t> bytes = read_file_bytes(path);
    const SafetensorsFile container = parse_safetensors(bytes.data(), bytes.size());
    if (container.metadata.at("gdn.format") != "gdn-case/1") continue;  // newer seeds of the corpus
    if (path.find("budget_typo") != std::string::npos) {
      // Refused as before, for the same reason.
      CHECK_THAT(read_error(path), Catch::Contains("'gdn.budget' = 'fixed(rel_rms=abc)' is malformed"));
      continue;
    }
    const CaseFile c = read_case_file(path);
    ++read;
    // Older formats are read as fp32 states with log-space gates.
    CHECK(c.problem.state_dtype == DType::f32);
    CHECK(c.problem.gate_space == GateSpace::log);
    CHECK_FALSE(c.backward.has_value());
    CHECK_FALSE(c.gradients.has_value());
    CHECK(c.outputs.has_value() == (container.find("out.o") != nullptr));
    // What was read writes back as gdn-case/1 with the same tensors, and reads back the same.
    const std::vector<std::uint8_t> again = encode_case(c);
    CHECK(format_of(again) == "gdn-case/1");
    const SafetensorsFile rewritten = parse_safetensors(again.data(), again.size());
    CHECK(rewritten.tensors.size() == container.tensors.size());
    CaseFile expected = c;  // the writer spells gdn.problem its own way (Python's differs)
    expected.metadata["gdn.problem"] = problem_to_json(c.problem).dump();
    check_same(expected, decode_case(again.data(), again.size()));
  }
  CHECK(read >= 9);
}

TEST_CASE("the backward's reader rules: each broken by a file, each named", "[oracle][case_file][backward]") {
  const Problem p = hardening_problem(GateMode::direct);  // has_h0, has_hT, f32
  const CaseFile c = make_backward_case(p, 31, true, true);
  REQUIRE(decode_error(encode_case(c)) == "(accepted)");
  auto broken = [&](const CaseFile& base, const std::function<void(SafetensorsFile&)>& edit) {
    return decode_error(edited(base, edit));
  };
  // Backward tensors need gdn-case/2.
  CHECK_THAT(broken(c, [](SafetensorsFile& f) { f.metadata["gdn.format"] = "gdn-case/1"; }),
             Catch::Contains("tensor 'in.dO' is a backward tensor, which gdn.format 'gdn-case/1' does not hold"));
  CHECK_THAT(broken(make_case(p, 31, true), [&](SafetensorsFile& f) {
               f.tensors.push_back(f32_tensor("out.dq", p.q_shape()));
             }),
             Catch::Contains("tensor 'out.dq' is a backward tensor"));
  CHECK_THAT(broken(c, [](SafetensorsFile& f) { f.metadata["gdn.format"] = "gdn-case/4"; }),
             Catch::Contains("'gdn.format' must be 'gdn-case/1', 'gdn-case/2' or 'gdn-case/3', got 'gdn-case/4'"));
  // Gradients only with dO; dhT only with dO.
  CHECK_THAT(broken(c, [](SafetensorsFile& f) { remove_tensor(f, "in.dO"); }),
             Catch::Contains("tensor 'out.dq' needs 'in.dO'"));
  CHECK_THAT(broken(make_backward_case(p, 31, true, false), [](SafetensorsFile& f) { remove_tensor(f, "in.dO"); }),
             Catch::Contains("tensor 'in.dhT' needs 'in.dO'"));
  // dhT only when the problem outputs hT.
  {
    Problem no_hT = p;
    no_hT.has_hT = false;
    CHECK_THAT(broken(make_backward_case(no_hT, 31, false, true), [&](SafetensorsFile& f) {
                 f.tensors.push_back(f32_tensor("in.dhT", no_hT.state_shape()));
               }),
               Catch::Contains("tensor 'in.dhT' needs has_hT"));
  }
  // Not with a state cache, not with per-token states (the backward's scope).
  {
    Problem cache = Problem::packed({1, 1, 1}, 1, 2, 4, 4);
    cache.state_slots = 5;
    cache.has_h0 = cache.has_hT = true;
    CHECK_THAT(broken(make_case(cache, 31, false), [&](SafetensorsFile& f) {
                 f.metadata["gdn.format"] = "gdn-case/2";
                 f.tensors.push_back(f32_tensor("in.dO", cache.v_shape()));
               }),
               Catch::Contains("tensor 'in.dO': the backward does not cover state caches (state_slots = 5"));
    Problem per_token = Problem::packed({3}, 1, 1, 2, 2);
    per_token.store_intermediate_states = true;
    CHECK_THAT(broken(make_case(per_token, 31, false), [&](SafetensorsFile& f) {
                 f.metadata["gdn.format"] = "gdn-case/2";
                 f.tensors.push_back(f32_tensor("in.dO", per_token.v_shape()));
               }),
               Catch::Contains("tensor 'in.dO': the backward does not cover per-token states"));
  }
  // Dtypes and shapes against the problem.
  {
    Problem bf16 = p;
    bf16.input_dtype = DType::bf16;
    CHECK_THAT(broken(make_backward_case(bf16, 31, false, true), [](SafetensorsFile& f) {
                 find_mutable(f, "in.dO")->dtype = "F16";
               }),
               Catch::Contains("tensor 'in.dO' must have dtype BF16, got F16"));
  }
  CHECK_THAT(broken(c, [](SafetensorsFile& f) {
               RawTensor* t = find_mutable(f, "in.dO");
               t->shape = {t->shape[0] * t->shape[1], t->shape[2]};
             }),
             Catch::Contains("tensor 'in.dO' must have shape"));
  CHECK_THAT(broken(c, [](SafetensorsFile& f) {
               RawTensor* t = find_mutable(f, "in.dhT");
               t->dtype = "F64";
               t->bytes.resize(t->bytes.size() * 2);
             }),
             Catch::Contains("tensor 'in.dhT' must have dtype F32, got F64"));
  CHECK_THAT(broken(c, [](SafetensorsFile& f) {
               RawTensor* t = find_mutable(f, "out.dv");
               t->shape = {t->shape[0] * t->shape[1], t->shape[2]};
             }),
             Catch::Contains("tensor 'out.dv' must have shape"));
  CHECK_THAT(broken(c, [](SafetensorsFile& f) {
               RawTensor* t = find_mutable(f, "out.dg");
               t->dtype = "I64";
             }),
             Catch::Contains("tensor 'out.dg' must have dtype F64 or F32 or BF16 or F16, got I64"));
  // Every gradient the problem has, and no other.
  CHECK_THAT(broken(c, [](SafetensorsFile& f) { remove_tensor(f, "out.dk"); }),
             Catch::Contains("tensor 'out.dk' is missing"));
  CHECK_THAT(broken(c, [&](SafetensorsFile& f) { f.tensors.push_back(f32_tensor("out.da", p.gate_shape())); }),
             Catch::Contains("tensor 'out.da' is not part of this problem (its gradients are those of the inputs it "
                             "uses: dq, dk, dv, dg, dbeta, dh0)"));
  {
    Problem no_h0 = p;
    no_h0.has_h0 = false;
    CHECK_THAT(broken(make_backward_case(no_h0, 31, false, true), [&](SafetensorsFile& f) {
                 f.tensors.push_back(f32_tensor("out.dh0", no_h0.state_shape()));
               }),
               Catch::Contains("tensor 'out.dh0' is not part of this problem"));
  }
  CHECK_THAT(broken(c, [](SafetensorsFile& f) { f.tensors.push_back(f32_tensor("in.dq", {1})); }),
             Catch::Contains("tensor 'in.dq' is not part of this problem (the backward's inputs are in.dO and in.dhT)"));
  // The cotangents are inputs: finite, the first bad element named (no -inf exception).
  CHECK_THAT(broken(c, [](SafetensorsFile& f) { set_float(f, "in.dO", 7, NAN); }),
             Catch::Contains("tensor 'in.dO'[1, 0, 1] (element 7) is NaN: inputs must be finite"));
  CHECK_THAT(broken(c, [](SafetensorsFile& f) { set_float(f, "in.dhT", 0, -INFINITY); }),
             Catch::Contains("tensor 'in.dhT'[0, 0, 0, 0] (element 0) is -Inf: inputs must be finite"));
  // Gradients are results: NaN and Inf are judged, not refused.
  {
    const std::vector<std::uint8_t> bytes = edited(c, [](SafetensorsFile& f) {
      RawTensor* t = find_mutable(f, "out.dbeta");
      REQUIRE(t->dtype == "F64");
      const double nan = NAN;
      std::memcpy(t->bytes.data(), &nan, 8);
    });
    const CaseFile back = decode_case(bytes.data(), bytes.size());
    REQUIRE(back.gradients.has_value());
    CHECK(std::isnan(back.gradients->dbeta[0]));
  }
  // gdn-case/2 without backward tensors is a forward file like any other.
  CHECK(broken(make_case(p, 31, true), [](SafetensorsFile& f) { f.metadata["gdn.format"] = "gdn-case/2"; }) ==
        "(accepted)");
}

TEST_CASE("encode refuses the backward's tensors the reader would refuse", "[oracle][case_file][backward]") {
  const Problem p = hardening_problem(GateMode::direct);
  CaseFile c = make_backward_case(p, 41, false, true);
  c.backward.reset();
  CHECK_THROWS_WITH(encode_case(c), Catch::Contains("gradients need the backward's inputs (dO)"));
  {
    Problem no_hT = p;
    no_hT.has_hT = false;
    CaseFile d = make_backward_case(no_hT, 41, false, false);
    d.backward->dhT = HostTensor<double>(no_hT.state_shape());
    CHECK_THROWS_WITH(encode_case(d), Catch::Contains("dhT needs has_hT"));
  }
  {
    Problem cache = Problem::packed({1, 1, 1}, 1, 2, 4, 4);
    cache.state_slots = 5;
    cache.has_h0 = true;
    CaseFile d = make_case(cache, 41, false);
    d.backward = make_cotangents(cache, 42, false);
    CHECK_THROWS_WITH(encode_case(d), Catch::Contains("the backward does not cover state caches"));
  }
  c = make_backward_case(p, 41, false, true);
  c.gradients->dk = HostTensor<double>();
  CHECK_THROWS_WITH(encode_case(c), Catch::Contains("gradient 'dk' has shape (missing)"));
  c = make_backward_case(p, 41, false, true);
  c.gradients->da = HostTensor<double>(p.gate_shape());
  CHECK_THROWS_WITH(encode_case(c), Catch::Contains("gradient 'da' is not one of this problem's (dq, dk, dv, dg, dbeta, dh0)"));
  c = make_backward_case(p, 41, false, true);
  c.backward->dO[3] = INFINITY;
  CHECK_THROWS_WITH(encode_case(c), Catch::Contains("input 'in.dO'[0, 1, 0] is +Inf"));
  {
    Problem bf16 = p;
    bf16.input_dtype = DType::bf16;
    CaseFile d = make_backward_case(bf16, 41, false, false);
    d.backward->dO[0] = 1.0 + 1e-9;
    CHECK_THROWS_WITH(encode_case(d), Catch::Contains("not representable in bf16"));
  }
}

TEST_CASE("the cost estimate counts the backward of a file with dO", "[oracle][case_file][backward]") {
  Problem p = Problem::packed({1, 64, 65, 300, 1000}, 16, 32, 128, 128);
  p.has_h0 = p.has_hT = true;
  const CaseCost forward = estimate_cost(p, Formulation::chunked, 64, 0);
  const CaseCost backward = estimate_cost(p, Formulation::chunked, 64, 0, true);
  CHECK(backward.bytes > forward.bytes);
  CHECK(backward.work >= forward.work + 3 * std::uint64_t(1430 + 5) * 32 * 128 * 128);
  // A backward costs several forwards: the largest case the project reads fits the memory limit
  // but needs the work limit raised (docs/case_files.md, "Size limits").
  CHECK(backward.bytes < CaseLimits::kDefaultMaxBytes);
  CHECK_THAT(exceeded_limit(backward, {}), Catch::Contains("--max-case-work"));
  CHECK(exceeded_limit(backward, {CaseLimits::kDefaultMaxBytes, std::uint64_t(1) << 34}).empty());
  // A file whose forward fits a limit its backward exceeds is refused from its header.
  const CaseFile c = make_backward_case(hardening_problem(GateMode::direct), 51, false, true);
  const std::vector<std::uint8_t> bytes = encode_case(c);
  const CaseCost f = estimate_cost(c.problem, Formulation::chunked, 64, bytes.size());
  const CaseCost b = estimate_cost(c.problem, Formulation::chunked, 64, bytes.size(), true);
  REQUIRE(b.work > f.work);
  CHECK_NOTHROW(decode_case(bytes.data(), bytes.size(), "<memory>", {b.bytes, b.work}));
  CHECK_THROWS_WITH(decode_case(bytes.data(), bytes.size(), "<memory>", {b.bytes, f.work}),
                    Catch::Contains("state-element updates (estimated from gdn.problem)"));
}

// ---- gdn-case/3: state dtypes and linear gates ---------------------------------------------

namespace {
const char* st_name(DType d) {
  return d == DType::f32 ? "F32" : d == DType::bf16 ? "BF16" : d == DType::f16 ? "F16" : "F64";
}

Problem storage_problem(DType state, GateSpace gates, bool cache) {
  Problem p = Problem::packed({4, 0, 3}, 1, 2, 5, 3);
  p.input_dtype = DType::bf16;
  p.has_h0 = p.has_hT = true;
  p.store_intermediate_states = true;
  p.state_dtype = state;
  p.gate_space = gates;
  if (cache) p.state_slots = 4;
  p.validate();
  return p;
}
}  // namespace

TEST_CASE("gdn-case/3 round-trips state dtypes and linear gates bit for bit", "[oracle][case_file][format3]") {
  for (DType state : {DType::f32, DType::bf16, DType::f16})
    for (GateSpace gates : {GateSpace::log, GateSpace::linear})
      for (bool cache : {false, true}) {
        const Problem p = storage_problem(state, gates, cache);
        INFO(p.describe());
        CaseFile c = make_case(p, 11, true);
        if (p.linear_gates()) REQUIRE(oracle::max_abs(c.inputs.g) <= 1.0);
        if (state != DType::f32) REQUIRE(reference::representable(state, c.inputs.h0));
        // A kernel's stored states, rounded to the state dtype (fp32 included).
        reference::round_in_place(state, c.outputs->hT);
        reference::round_in_place(state, c.outputs->intermediate);
        const std::vector<std::uint8_t> bytes = encode_case(c);
        const SafetensorsFile file = parse_safetensors(bytes.data(), bytes.size());
        const bool v3 = state != DType::f32 || gates == GateSpace::linear;
        CHECK(format_of(bytes) == (v3 ? "gdn-case/3" : "gdn-case/1"));
        const nlohmann::json problem = nlohmann::json::parse(file.metadata.at("gdn.problem"));
        CHECK(problem.contains("state_dtype") == v3);
        CHECK(problem.contains("gate_space") == v3);
        // The decay is 'alpha' with linear gates, 'g' otherwise; h0 and out.hT in the state dtype.
        CHECK((file.find("alpha") != nullptr) == p.linear_gates());
        CHECK((file.find("g") != nullptr) == !p.linear_gates());
        CHECK(file.find("h0")->dtype == st_name(state));
        CHECK(file.find("out.hT")->dtype == st_name(state));
        CHECK(file.find("out.intermediate")->dtype == st_name(state));
        const CaseFile back = decode_case(bytes.data(), bytes.size());
        CHECK(back.problem.state_dtype == state);
        CHECK(back.problem.gate_space == gates);
        check_same(c, back);
      }
}

TEST_CASE("gdn-case/3's reader rules: each broken by a file, each named", "[oracle][case_file][format3]") {
  const CaseFile bf16 = make_case(storage_problem(DType::bf16, GateSpace::linear, false), 3, false);
  const CaseFile plain = make_case(storage_problem(DType::f32, GateSpace::log, false), 3, false);
  auto set_meta = [](const std::string& key, const std::string& value) {
    return [key, value](SafetensorsFile& f) { f.metadata[key] = value; };
  };
  // The new keys in an older format: refused, never read as something else.
  CHECK_THAT(decode_error(edited(bf16, set_meta("gdn.format", "gdn-case/1"))),
             Catch::Contains("gdn.problem key 'state_dtype' needs gdn.format 'gdn-case/3'"));
  CHECK_THAT(decode_error(edited(bf16, set_meta("gdn.format", "gdn-case/2"))),
             Catch::Contains("needs gdn.format 'gdn-case/3'"));
  // A /3 file states both keys.
  CHECK_THAT(decode_error(edited(plain, set_meta("gdn.format", "gdn-case/3"))),
             Catch::Contains("file must give 'state_dtype'"));
  {
    nlohmann::json j = problem_to_json(plain.problem);
    j["state_dtype"] = "f32";
    j["gate_space"] = "log";
    auto edit = [&](SafetensorsFile& f) {
      f.metadata["gdn.format"] = "gdn-case/3";
      f.metadata["gdn.problem"] = j.dump();
    };
    CHECK_THAT(decode_error(edited(plain, edit)), Catch::Contains("this one has neither"));
    j["state_dtype"] = "f64";
    CHECK_THAT(decode_error(edited(plain, edit)), Catch::Contains("invalid argument 'state_dtype'"));
    j["state_dtype"] = "bf8";
    CHECK_THAT(decode_error(edited(plain, edit)), Catch::Contains("'state_dtype' must be f32, bf16 or f16"));
    j["state_dtype"] = "bf16";
    j["gate_space"] = "exp";
    CHECK_THAT(decode_error(edited(plain, edit)), Catch::Contains("'gate_space' must be log or linear"));
  }
  // h0 in the state dtype only; the decay under its name.
  CHECK_THAT(decode_error(edited(bf16, [](SafetensorsFile& f) {
               RawTensor* h0 = find_mutable(f, "h0");
               std::vector<std::uint8_t> wide;
               for (std::size_t i = 0; i < h0->bytes.size(); i += 2) {
                 const std::uint8_t zero[2] = {0, 0};
                 wide.insert(wide.end(), zero, zero + 2);
                 wide.insert(wide.end(), h0->bytes.begin() + i, h0->bytes.begin() + i + 2);
               }
               h0->dtype = "F32";
               h0->bytes = wide;
             })),
             Catch::Contains("tensor 'h0' must have dtype BF16"));
  CHECK_THAT(decode_error(edited(bf16, [](SafetensorsFile& f) { find_mutable(f, "alpha")->name = "g"; })),
             Catch::Contains("tensor 'alpha' is missing"));
  // alpha < 0 and alpha = inf are no exp(g): refused by name (alpha = 0 is the reset).
  for (float bad : {-0.5f, std::numeric_limits<float>::infinity()}) {
    CHECK_THAT(decode_error(edited(bf16, [bad](SafetensorsFile& f) {
                 RawTensor* alpha = find_mutable(f, "alpha");
                 const float value = bad;  // gate dtype f32 in storage_problem
                 REQUIRE(alpha->dtype == "F32");
                 std::memcpy(alpha->bytes.data(), &value, 4);
               })),
               Catch::Contains("alpha"));
  }
  CaseFile reset = bf16;
  reset.inputs.g[0] = 0.0;
  const std::vector<std::uint8_t> reset_bytes = encode_case(reset);
  CHECK_NOTHROW(decode_case(reset_bytes.data(), reset_bytes.size()));
  // The backward's scope: reduced-precision states and linear gates carry no dO.
  CaseFile backward = bf16;
  backward.problem.store_intermediate_states = false;
  backward.backward = BackwardInputs{};
  backward.backward->dO = HostTensor<double>(backward.problem.v_shape(), 0.5);
  CHECK_THROWS_WITH(encode_case(backward), Catch::Contains("fp32 states only"));
}
