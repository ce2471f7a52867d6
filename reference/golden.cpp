#include "reference/golden.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>

#include <cstdlib>
#include <sstream>

#include <nlohmann/json.hpp>

#include "reference/golden_embedded.hpp"

namespace gdn::reference {

namespace {

using nlohmann::json;

// Every error names the file, the case (when known) and the field.
class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}
  void set_case(std::string name) { case_ = std::move(name); }

  [[noreturn]] void fail(const std::string& field, const std::string& rule) const {
    std::string where = "golden file '" + file_ + "'";
    if (!case_.empty()) where += ", case '" + case_ + "'";
    throw std::runtime_error(where + ", field '" + field + "': " + rule);
  }

  static std::string path(const std::string& field, const std::string& key) {
    return field.empty() ? key : field + "." + key;
  }

  const json& member(const json& object, const std::string& key, const std::string& field) const {
    if (!object.is_object()) fail(field, "must be a JSON object");
    const auto it = object.find(key);
    if (it == object.end()) fail(path(field, key), "is missing");
    return *it;
  }

  std::string string(const json& object, const std::string& key, const std::string& field) const {
    const json& value = member(object, key, field);
    if (!value.is_string()) fail(path(field, key), "must be a string");
    return value.get<std::string>();
  }

  bool boolean(const json& object, const std::string& key, const std::string& field) const {
    const json& value = member(object, key, field);
    if (!value.is_boolean()) fail(path(field, key), "must be true or false");
    return value.get<bool>();
  }

  std::int64_t integer(const json& object, const std::string& key, const std::string& field) const {
    const json& value = member(object, key, field);
    if (!value.is_number_integer()) fail(path(field, key), "must be an integer");
    return value.get<std::int64_t>();
  }

  int small_integer(const json& object, const std::string& key, const std::string& field) const {
    const std::int64_t value = integer(object, key, field);
    if (value < 0 || value > (1 << 20)) fail(path(field, key), "must be in [0, 2^20], got " + std::to_string(value));
    return static_cast<int>(value);
  }

  // A tensor {"shape": [...], "data": [...]} whose every value is a float32, written in
  // float32-shortest form: parsed as a double, then rounded to float (see cases.py).
  HostTensor<double> tensor(const json& object, const std::string& key, const std::string& field,
                            const Shape& expected) const {
    const std::string name = path(field, key);
    const json& t = member(object, key, field);
    const json& shape_json = member(t, "shape", name);
    if (!shape_json.is_array()) fail(name + ".shape", "must be an array of extents");
    Shape shape;
    for (const json& d : shape_json) {
      if (!d.is_number_integer() || d.get<std::int64_t>() < 0)
        fail(name + ".shape", "must hold non-negative integers");
      shape.push_back(d.get<std::int64_t>());
    }
    if (shape != expected)
      fail(name + ".shape", "must be " + shape_string(expected) + " for this problem, got " + shape_string(shape));
    const json& data = member(t, "data", name);
    if (!data.is_array()) fail(name + ".data", "must be an array of numbers");
    if (static_cast<std::int64_t>(data.size()) != shape_numel(shape))
      fail(name + ".data", "must hold " + std::to_string(shape_numel(shape)) + " numbers (shape " +
                               shape_string(shape) + "), got " + std::to_string(data.size()));
    HostTensor<double> out(shape);
    for (std::int64_t i = 0; i < out.numel(); ++i) {
      const json& x = data[static_cast<std::size_t>(i)];
      if (!x.is_number()) fail(name + ".data", "element " + std::to_string(i) + " is not a number");
      const double parsed = x.get<double>();
      // Rounding to the nearest float32 recovers the stored value exactly (the generator
      // checks it for every number it writes); beyond float's range it would be infinite.
      if (!std::isfinite(parsed) || std::abs(parsed) > double(std::numeric_limits<float>::max()))
        fail(name + ".data", "element " + std::to_string(i) + " (" + std::to_string(parsed) +
                                 ") is outside float32's finite range");
      out[i] = static_cast<double>(static_cast<float>(parsed));
    }
    return out;
  }

 private:
  std::string file_;
  std::string case_;
};

Problem read_problem(const Reader& r, const json& p) {
  Problem problem;
  const json& cu = r.member(p, "cu_seqlens", "problem");
  if (!cu.is_array()) r.fail("problem.cu_seqlens", "must be an array of integers");
  problem.cu_seqlens.clear();
  for (const json& x : cu) {
    if (!x.is_number_integer()) r.fail("problem.cu_seqlens", "must hold integers");
    problem.cu_seqlens.push_back(x.get<std::int64_t>());
  }
  problem.T = r.integer(p, "T", "problem");
  problem.H = r.small_integer(p, "H", "problem");
  problem.HV = r.small_integer(p, "HV", "problem");
  problem.K = r.small_integer(p, "K", "problem");
  problem.V = r.small_integer(p, "V", "problem");
  const json& scale = r.member(p, "scale", "problem");
  if (!scale.is_null()) {
    if (!scale.is_number()) r.fail("problem.scale", "must be null (default 1/sqrt(K)) or a number");
    problem.scale = scale.get<double>();
  }
  problem.use_qk_l2norm = r.boolean(p, "use_qk_l2norm", "problem");
  problem.has_h0 = r.boolean(p, "has_h0", "problem");
  problem.has_hT = r.boolean(p, "has_hT", "problem");
  if (!problem.has_hT) r.fail("problem.has_hT", "must be true: every golden case stores the final state");
  try {
    problem.validate();
  } catch (const ProblemError& e) {
    r.fail("problem", e.what());
  }
  return problem;
}

// Per (sequence, value head) block: max |x - golden| / max |golden|, maximised over blocks.
double block_error(const Problem& problem, const HostTensor<double>& golden, const HostTensor<double>& x,
                   bool state, const char* what) {
  if (x.shape() != golden.shape())
    throw std::invalid_argument(std::string("golden_error: ") + what + " must have shape " +
                                shape_string(golden.shape()) + ", got " + shape_string(x.shape()));
  double worst = 0;
  for (int n = 0; n < problem.N(); ++n)
    for (int j = 0; j < problem.HV; ++j) {
      double diff = 0, size = 0;
      auto visit = [&](std::int64_t i) {
        diff = std::max(diff, std::abs(x[i] - golden[i]));
        if (!(std::abs(x[i] - golden[i]) <= diff)) diff = INFINITY;  // NaN in x
        size = std::max(size, std::abs(golden[i]));
      };
      if (state) {
        const std::int64_t base = (std::int64_t(n) * problem.HV + j) * problem.K * problem.V;
        for (std::int64_t i = 0; i < std::int64_t(problem.K) * problem.V; ++i) visit(base + i);
      } else {
        for (std::int64_t t = problem.seq_begin(n); t < problem.seq_begin(n) + problem.seq_len(n); ++t)
          for (int v = 0; v < problem.V; ++v) visit((t * problem.HV + j) * problem.V + v);
      }
      worst = std::max(worst, size > 0 ? diff / size : diff);
    }
  return worst;
}

}  // namespace

double golden_tolerance(const Problem& problem, const Inputs& inputs, Formulation formulation,
                        int chunk_size) {
  constexpr double u = 0x1p-24;
  std::int64_t longest = 1;
  for (int n = 0; n < problem.N(); ++n) longest = std::max(longest, problem.seq_len(n));
  double gamma_max = 0;
  if (formulation == Formulation::chunked) {
    if (chunk_size < 1) throw std::invalid_argument("golden_tolerance: chunk_size must be >= 1 for a chunk peer");
    for (int n = 0; n < problem.N(); ++n)
      for (int j = 0; j < problem.HV; ++j) {
        double gamma = 0;
        for (std::int64_t i = 0; i < problem.seq_len(n); ++i) {
          if (i % chunk_size == 0) gamma = 0;
          gamma += inputs.g[(problem.seq_begin(n) + i) * problem.HV + j];
          gamma_max = std::max(gamma_max, std::abs(gamma));
        }
      }
  }
  return 8 * u * (std::sqrt(double(longest) * (problem.K + 8)) + gamma_max);
}

double golden_error_o(const GoldenCase& golden, const HostTensor<double>& o) {
  return block_error(golden.problem, golden.o, o, false, "o");
}

double golden_error_hT(const GoldenCase& golden, const HostTensor<double>& hT) {
  return block_error(golden.problem, golden.hT, hT, true, "hT");
}

std::vector<GoldenFile> embedded_golden_files() {
  std::vector<GoldenFile> out;
  for (std::size_t f = 0; f < embedded::file_count; ++f) {
    const embedded::EmbeddedFile& e = embedded::files[f];
    GoldenFile file{e.name, {}};
    file.text.reserve(e.size);
    for (std::size_t c = 0; c < e.chunk_count && file.text.size() < e.size; ++c)
      file.text.append(e.chunks[c], std::min(e.chunk_bytes, e.size - file.text.size()));
    if (file.text.size() != e.size)
      throw std::logic_error(std::string("embedded golden file '") + e.name + "' holds " +
                             std::to_string(file.text.size()) + " bytes, its table says " + std::to_string(e.size));
    out.push_back(std::move(file));
  }
  std::sort(out.begin(), out.end(), [](const GoldenFile& a, const GoldenFile& b) { return a.name < b.name; });
  return out;
}

std::vector<std::string> golden_files(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code error;
  if (!std::filesystem::is_directory(dir, error))
    throw std::runtime_error("golden data directory '" + dir + "' does not exist or is not a directory");
  std::filesystem::directory_iterator it(dir, error);
  if (error) throw std::runtime_error("golden data directory '" + dir + "' cannot be read: " + error.message());
  for (const auto& entry : it)
    if (entry.is_regular_file(error) && entry.path().extension() == ".json") files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<GoldenCase> load_all_golden(std::string* origin) {
  std::vector<GoldenCase> out;
  const char* dir = std::getenv(kGoldenDirVariable);
  if (dir != nullptr) {
    if (*dir == '\0')
      throw std::runtime_error(std::string(kGoldenDirVariable) + " is set but empty: unset it to use the golden "
                               "files built into this binary, or name a folder of *.json golden files");
    const std::vector<std::string> files = golden_files(dir);
    if (files.empty())
      throw std::runtime_error("golden data directory '" + std::string(dir) + "' (" + kGoldenDirVariable +
                               ") holds no *.json file");
    for (const std::string& file : files)
      for (GoldenCase& g : load_golden(file)) out.push_back(std::move(g));
    if (origin) *origin = "folder " + std::string(dir) + " (" + kGoldenDirVariable + ")";
    return out;
  }
  for (const GoldenFile& file : embedded_golden_files())
    for (GoldenCase& g : parse_golden(file.text, file.name)) out.push_back(std::move(g));
  if (origin) *origin = "built into this binary";
  return out;
}

std::vector<GoldenCase> load_golden(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Reader(path).fail("(file)", "cannot be opened");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) Reader(path).fail("(file)", "cannot be read");
  return parse_golden(text.str(), path);
}

std::vector<GoldenCase> parse_golden(const std::string& text, const std::string& path) {
  Reader r(path);
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    r.fail("(file)", std::string("is not valid JSON: ") + e.what());
  }
  const std::string format = r.string(doc, "format", "");
  if (format != "gdn-golden/1") r.fail("format", "must be \"gdn-golden/1\", got \"" + format + "\"");
  if (r.string(doc, "encoding", "") != "float32-shortest")
    r.fail("encoding", "must be \"float32-shortest\"");
  const json& cases = r.member(doc, "cases", "");
  if (!cases.is_array() || cases.empty()) r.fail("cases", "must be a non-empty array");

  std::vector<GoldenCase> out;
  for (const json& c : cases) {
    r.set_case("");
    const std::string name = r.string(c, "name", "cases[]");
    r.set_case(name);
    const Problem problem = read_problem(r, r.member(c, "problem", "case"));
    const json& in_json = r.member(c, "inputs", "case");
    Inputs inputs;
    inputs.q = r.tensor(in_json, "q", "inputs", problem.q_shape());
    inputs.k = r.tensor(in_json, "k", "inputs", problem.q_shape());
    inputs.v = r.tensor(in_json, "v", "inputs", problem.v_shape());
    inputs.g = r.tensor(in_json, "g", "inputs", problem.gate_shape());
    inputs.beta = r.tensor(in_json, "beta", "inputs", problem.gate_shape());
    if (problem.has_h0) inputs.h0 = r.tensor(in_json, "h0", "inputs", problem.state_shape());
    else if (in_json.contains("h0")) r.fail("inputs.h0", "is given but problem.has_h0 is false");
    try {
      validate(problem, inputs);
    } catch (const ProblemError& e) {
      r.fail("inputs", e.what());
    }
    const json& results = r.member(c, "results", "case");
    if (!results.is_array() || results.empty()) r.fail("results", "must be a non-empty array");
    for (const json& res : results) {
      GoldenCase g;
      g.name = name;
      g.file = path;
      g.source = r.string(res, "source", "results[]");
      g.call = r.string(res, "call", "results[]");
      const std::string formulation = r.string(res, "formulation", "results[]");
      if (formulation == "recurrent") g.formulation = Formulation::sequential;
      else if (formulation == "chunk") g.formulation = Formulation::chunked;
      else r.fail("results[].formulation", "must be \"recurrent\" or \"chunk\", got \"" + formulation + "\"");
      g.chunk_size = r.small_integer(res, "chunk_size", "results[]");
      if ((g.formulation == Formulation::chunked) != (g.chunk_size > 0))
        r.fail("results[].chunk_size", "must be > 0 exactly for a chunk formulation");
      g.problem = problem;
      g.inputs = inputs;
      g.o = r.tensor(res, "o", "results[" + g.source + "]", problem.v_shape());
      g.hT = r.tensor(res, "hT", "results[" + g.source + "]", problem.state_shape());
      g.tolerance_o = g.tolerance_hT = golden_tolerance(problem, inputs, g.formulation, g.chunk_size);
      out.push_back(std::move(g));
    }
  }
  return out;
}

}  // namespace gdn::reference
