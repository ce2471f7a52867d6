#include <catch2/catch.hpp>

#include <dirent.h>
#include <unistd.h>

#include <cstring>
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
             Catch::Contains("inputs rejected"));
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
