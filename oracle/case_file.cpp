#include "oracle/case_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>

#include <Eigen/Core>
#include <nlohmann/json.hpp>

#include "core/dtype_codec.hpp"
#include "oracle/metrics.hpp"
#include "reference/precision.hpp"

static_assert(sizeof(float) == 4 && sizeof(double) == 8, "IEEE binary32/binary64 expected");

namespace gdn::oracle {

namespace {

[[noreturn]] void fail(const std::string& what, const std::string& rule) {
  throw CaseFileError("case file " + what + ": " + rule);
}

bool host_is_little_endian() {
  const std::uint16_t one = 1;
  std::uint8_t first;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

// Parses [begin, end) as one JSON value with nothing after it but JSON whitespace, and refuses
// what nlohmann would otherwise let through: a NUL byte (its lexer takes NUL for the end of the
// input and ignores whatever follows) and a key given twice in one object (it keeps the last
// silently, another reader may keep the first). `label` names the text in errors.
nlohmann::json parse_json_strict(const char* begin, const char* end, const std::string& what, const std::string& label) {
  if (const void* nul = std::memchr(begin, 0, static_cast<std::size_t>(end - begin)))
    fail(what, label + " holds a NUL byte at offset " +
                   std::to_string(static_cast<const char*>(nul) - begin) + " (JSON text has none)");
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  const nlohmann::json::parser_callback_t track = [&](int, nlohmann::json::parse_event_t event,
                                                      nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) open_objects.emplace_back();
    else if (event == E::object_end && !open_objects.empty()) open_objects.pop_back();
    else if (event == E::key && !open_objects.empty() && duplicate.empty() && parsed.is_string() &&
             !open_objects.back().insert(parsed.get<std::string>()).second)
      duplicate = parsed.get<std::string>();
    return true;
  };
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(begin, end, track);
  } catch (const nlohmann::json::exception& e) {
    fail(what, label + " is not valid JSON: " + e.what());
  }
  if (!duplicate.empty()) fail(what, label + " has the key '" + duplicate + "' twice in one object");
  return value;
}

nlohmann::json parse_json_strict(const std::string& text, const std::string& what, const std::string& label) {
  return parse_json_strict(text.data(), text.data() + text.size(), what, label);
}

// Safetensors dtypes and their sizes (upstream's list, minus the 8-bit floats no kernel here uses).
const std::map<std::string, std::size_t>& dtype_sizes() {
  static const std::map<std::string, std::size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"U16", 2}, {"I16", 2},  {"U32", 4},  {"I32", 4},
      {"U64", 8},  {"I64", 8}, {"F16", 2}, {"BF16", 2}, {"F32", 4}, {"F64", 8}};
  return sizes;
}

}  // namespace

std::size_t safetensors_dtype_size(const std::string& dtype) {
  const auto it = dtype_sizes().find(dtype);
  return it == dtype_sizes().end() ? 0 : it->second;
}

const RawTensor* SafetensorsFile::find(const std::string& name) const {
  for (const RawTensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

SafetensorsFile parse_safetensors(const std::uint8_t* data, std::size_t size, const std::string& what) {
  if (!host_is_little_endian()) fail(what, "this reader supports little-endian hosts only");
  if (size < 8) fail(what, "truncated: " + std::to_string(size) + " bytes, the 8-byte header length is missing");
  std::uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | data[i];
  if (header_length > kMaxHeaderBytes)
    fail(what, "header length " + std::to_string(header_length) + " exceeds the limit of " +
                   std::to_string(kMaxHeaderBytes) + " bytes");
  if (header_length > size - 8)
    fail(what, "truncated: header length " + std::to_string(header_length) + " but only " +
                   std::to_string(size - 8) + " bytes follow the length field");
  if (header_length < 2) fail(what, "header of " + std::to_string(header_length) + " bytes cannot hold a JSON object");
  const char* header_begin = reinterpret_cast<const char*>(data + 8);
  if (header_begin[0] != '{') fail(what, "header must start with '{' (a JSON object)");
  // The format pads the header with spaces (0x20) only: the object must end at the last byte
  // that is not a space.
  const char* header_end = header_begin + header_length;
  if (const void* nul = std::memchr(header_begin, 0, header_length))
    fail(what, "header holds a NUL byte at offset " + std::to_string(static_cast<const char*>(nul) - header_begin) +
                   " (the header is JSON padded with spaces only; a NUL would hide what follows it from this reader)");
  const nlohmann::json header = parse_json_strict(header_begin, header_end, what, "header");
  if (!header.is_object()) fail(what, "header must be a JSON object");
  // JSON allows any whitespace after the object; the format only spaces.
  while (header_end > header_begin && header_end[-1] == ' ') --header_end;
  if (header_end[-1] != '}')
    fail(what, "header must be one JSON object followed by nothing but spaces (0x20), found byte " +
                   std::to_string(static_cast<unsigned char>(header_end[-1])) + " at offset " +
                   std::to_string(header_end - 1 - header_begin));

  const std::uint8_t* buffer = data + 8 + header_length;
  const std::uint64_t buffer_size = size - 8 - header_length;
  SafetensorsFile file;
  struct Span {
    std::uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(what, "__metadata__ must be an object of strings");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) fail(what, "__metadata__ value of '" + m.key() + "' must be a string");
        file.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!entry.is_object()) fail(what, where + " must be an object {dtype, shape, data_offsets}");
    for (auto k = entry.begin(); k != entry.end(); ++k)
      if (k.key() != "dtype" && k.key() != "shape" && k.key() != "data_offsets")
        fail(what, where + " has unknown key '" + k.key() + "'");
    if (!entry.contains("dtype") || !entry["dtype"].is_string()) fail(what, where + " needs a string 'dtype'");
    if (!entry.contains("shape") || !entry["shape"].is_array()) fail(what, where + " needs an array 'shape'");
    if (!entry.contains("data_offsets") || !entry["data_offsets"].is_array() || entry["data_offsets"].size() != 2)
      fail(what, where + " needs 'data_offsets' [begin, end]");
    RawTensor t;
    t.name = name;
    t.dtype = entry["dtype"].get<std::string>();
    const std::size_t element_size = safetensors_dtype_size(t.dtype);
    if (element_size == 0) fail(what, where + " has unknown dtype '" + t.dtype + "'");
    if (entry["shape"].size() > 16) fail(what, where + " has rank " + std::to_string(entry["shape"].size()) + " > 16");
    // Element count with an overflow check: a lying shape must not wrap around to match the bytes.
    std::uint64_t numel = 1;
    for (const nlohmann::json& d : entry["shape"]) {
      if (!d.is_number_integer() || d.get<std::int64_t>() < 0)
        fail(what, where + " shape must hold non-negative integers, got " + d.dump());
      const std::uint64_t extent = d.get<std::uint64_t>();
      if (extent > (std::uint64_t(1) << 48)) fail(what, where + " extent " + std::to_string(extent) + " is too large");
      if (extent != 0 && numel > (std::numeric_limits<std::uint64_t>::max() / element_size) / extent)
        fail(what, where + " shape " + entry["shape"].dump() + " overflows the element count");
      numel *= extent;
      t.shape.push_back(static_cast<std::int64_t>(extent));
    }
    std::uint64_t offsets[2];
    for (int i = 0; i < 2; ++i) {
      const nlohmann::json& o = entry["data_offsets"][static_cast<std::size_t>(i)];
      if (!o.is_number_integer() || o.get<std::int64_t>() < 0)
        fail(what, where + " data_offsets must be non-negative integers, got " + o.dump());
      offsets[i] = o.get<std::uint64_t>();
    }
    if (offsets[1] < offsets[0])
      fail(what, where + " data_offsets [" + std::to_string(offsets[0]) + ", " + std::to_string(offsets[1]) +
                     "] end before they begin");
    if (offsets[1] > buffer_size)
      fail(what, where + " data_offsets end at " + std::to_string(offsets[1]) + " past the end of the " +
                     std::to_string(buffer_size) + "-byte buffer (truncated or lying offsets)");
    if (offsets[1] - offsets[0] != numel * element_size)
      fail(what, where + " holds " + std::to_string(offsets[1] - offsets[0]) + " bytes but shape " +
                     entry["shape"].dump() + " of " + t.dtype + " needs " + std::to_string(numel * element_size));
    t.bytes.assign(buffer + offsets[0], buffer + offsets[1]);
    spans.push_back({offsets[0], offsets[1], name});
    file.tensors.push_back(std::move(t));
  }
  // The buffer must be covered exactly once, in one piece: upstream rejects gaps and overlaps
  // alike, and a gap is where hidden or stale data would live.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t cursor = 0;
  for (const Span& s : spans) {
    if (s.begin < cursor) fail(what, "tensor '" + s.name + "' overlaps the tensor before it (data_offsets begin at " +
                                         std::to_string(s.begin) + " < " + std::to_string(cursor) + ")");
    if (s.begin > cursor) fail(what, "gap in the buffer before tensor '" + s.name + "' (bytes " + std::to_string(cursor) +
                                         " to " + std::to_string(s.begin) + " belong to no tensor)");
    cursor = s.end;
  }
  if (cursor != buffer_size)
    fail(what, "the buffer has " + std::to_string(buffer_size - cursor) + " trailing bytes that belong to no tensor");
  std::sort(file.tensors.begin(), file.tensors.end(), [](const RawTensor& a, const RawTensor& b) { return a.name < b.name; });
  return file;
}

std::vector<std::uint8_t> serialize_safetensors(const SafetensorsFile& file) {
  std::vector<const RawTensor*> order;
  for (const RawTensor& t : file.tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const RawTensor* a, const RawTensor* b) { return a->name < b->name; });
  nlohmann::json header = nlohmann::json::object();
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  std::uint64_t offset = 0;
  std::set<std::string> names;
  for (const RawTensor* t : order) {
    if (t->name == "__metadata__" || !names.insert(t->name).second)
      throw CaseFileError("serialize_safetensors: duplicate or reserved tensor name '" + t->name + "'");
    const std::size_t element_size = safetensors_dtype_size(t->dtype);
    if (element_size == 0) throw CaseFileError("serialize_safetensors: unknown dtype '" + t->dtype + "'");
    if (static_cast<std::uint64_t>(shape_numel(t->shape)) * element_size != t->bytes.size())
      throw CaseFileError("serialize_safetensors: tensor '" + t->name + "' has " + std::to_string(t->bytes.size()) +
                          " bytes for shape " + shape_string(t->shape));
    header[t->name] = {{"dtype", t->dtype}, {"shape", t->shape}, {"data_offsets", {offset, offset + t->bytes.size()}}};
    offset += t->bytes.size();
  }
  std::string text = header.dump();
  // Pad with spaces so the buffer starts 8-byte aligned (what upstream's writer does).
  while ((8 + text.size()) % 8 != 0) text += ' ';
  std::vector<std::uint8_t> out(8 + text.size() + offset);
  const std::uint64_t length = text.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(length >> (8 * i));
  std::memcpy(out.data() + 8, text.data(), text.size());
  std::uint8_t* cursor = out.data() + 8 + text.size();
  for (const RawTensor* t : order) {
    if (!t->bytes.empty()) std::memcpy(cursor, t->bytes.data(), t->bytes.size());
    cursor += t->bytes.size();
  }
  return out;
}

void write_file_atomic(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  static std::atomic<unsigned> counter{0};
  const std::string temp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create " + temp + ": " + std::strerror(errno));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why = std::strerror(errno);
      ::close(fd);
      ::unlink(temp.c_str());
      throw std::runtime_error("cannot write " + temp + ": " + why);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(temp.c_str());
    throw std::runtime_error("cannot flush " + temp + ": " + why);
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(temp.c_str());
    throw std::runtime_error("cannot rename " + temp + " to " + path + ": " + why);
  }
}

namespace {

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Closes the descriptor on every path out of read_file_bytes.
struct FileDescriptor {
  int fd;
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::vector<std::uint8_t> read_file_bytes(const std::string& path, std::uint64_t max_bytes) {
  auto refuse = [&](const std::string& rule) -> void { throw CaseFileError("case file " + path + ": " + rule); };
  // stat() first: a FIFO is never opened (opening one for reading waits for a writer), nor a
  // directory (its "size" would be read as the file's), nor a device.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) refuse(std::string("cannot open: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) refuse(std::string("is ") + file_kind(st.st_mode) + ", not a regular file");
  // O_NONBLOCK: should the path have been replaced by a FIFO since the stat(), the open
  // returns at once instead of waiting; fstat() then checks what was actually opened.
  FileDescriptor file{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY)};
  if (file.fd < 0) refuse(std::string("cannot open: ") + std::strerror(errno));
  if (::fstat(file.fd, &st) != 0) refuse(std::string("cannot stat: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) refuse(std::string("is ") + file_kind(st.st_mode) + ", not a regular file");
  const std::uint64_t size = static_cast<std::uint64_t>(st.st_size);
  if (size > max_bytes)
    refuse("holds " + std::to_string(size) + " bytes, over the limit of " + std::to_string(max_bytes) +
           " bytes; raise the limit if this is meant (CaseLimits::max_bytes; gdn-testbed --max-case-bytes)");
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(size));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(file.fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) refuse(std::string("read failed: ") + std::strerror(errno));
    if (n == 0) refuse("shrank while being read (" + std::to_string(done) + " of " + std::to_string(size) + " bytes)");
    done += static_cast<std::size_t>(n);
  }
  return bytes;
}

// ---- problem JSON --------------------------------------------------------------------------

nlohmann::json problem_to_json(const Problem& p) {
  nlohmann::json j;
  j["cu_seqlens"] = p.cu_seqlens;
  j["T"] = p.T;
  j["H"] = p.H;
  j["HV"] = p.HV;
  j["K"] = p.K;
  j["V"] = p.V;
  j["scale"] = p.scale ? nlohmann::json(*p.scale) : nlohmann::json(nullptr);
  j["use_qk_l2norm"] = p.use_qk_l2norm;
  j["has_h0"] = p.has_h0;
  j["has_hT"] = p.has_hT;
  j["state_layout"] = state_layout_name(p.state_layout);
  j["state_slots"] = p.state_slots;
  j["store_intermediate_states"] = p.store_intermediate_states;
  j["input_dtype"] = dtype_name(p.input_dtype);
  j["gate_dtype"] = dtype_name(p.gate_dtype);
  j["gate_mode"] = p.gate_mode == GateMode::direct ? "direct" : "fused";
  j["allow_negative_eigenvalues"] = p.allow_negative_eigenvalues;
  if (needs_format_3(p)) {
    j["state_dtype"] = dtype_name(p.state_dtype);
    j["gate_space"] = gate_space_name(p.gate_space);
  }
  return j;
}

bool needs_format_3(const Problem& p) { return p.state_dtype != DType::f32 || p.gate_space != GateSpace::log; }

Problem problem_from_json(const nlohmann::json& j) {
  const std::string what = "gdn.problem";
  if (!j.is_object()) fail(what, "must be a JSON object");
  static const std::set<std::string> keys = {"cu_seqlens", "T", "H", "HV", "K", "V", "scale", "use_qk_l2norm",
                                             "has_h0", "has_hT", "state_layout", "state_slots",
                                             "store_intermediate_states", "input_dtype", "gate_dtype", "gate_mode",
                                             "allow_negative_eigenvalues"};
  static const std::set<std::string> optional_keys = {"state_dtype", "gate_space"};  // gdn-case/3
  for (const std::string& k : keys)
    if (!j.contains(k)) fail(what, "missing key '" + k + "'");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!keys.count(it.key()) && !optional_keys.count(it.key())) fail(what, "unknown key '" + it.key() + "'");
  auto integer = [&](const char* key, std::int64_t lo, std::int64_t hi) -> std::int64_t {
    const nlohmann::json& v = j[key];
    if (!v.is_number_integer()) fail(what, std::string("'") + key + "' must be an integer");
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > std::uint64_t(std::numeric_limits<std::int64_t>::max()))
      fail(what, std::string("'") + key + "' is out of range");
    const std::int64_t x = v.get<std::int64_t>();
    if (x < lo || x > hi) fail(what, std::string("'") + key + "' = " + std::to_string(x) + " is out of range");
    return x;
  };
  auto boolean = [&](const char* key) {
    if (!j[key].is_boolean()) fail(what, std::string("'") + key + "' must be true or false");
    return j[key].get<bool>();
  };
  auto text = [&](const char* key) {
    if (!j[key].is_string()) fail(what, std::string("'") + key + "' must be a string");
    return j[key].get<std::string>();
  };
  Problem p;
  if (!j["cu_seqlens"].is_array()) fail(what, "'cu_seqlens' must be an array of integers");
  if (j["cu_seqlens"].size() > (std::size_t(1) << 24)) fail(what, "'cu_seqlens' is implausibly long");
  p.cu_seqlens.clear();
  for (const nlohmann::json& c : j["cu_seqlens"]) {
    if (!c.is_number_integer() || (c.is_number_unsigned() && c.get<std::uint64_t>() > (std::uint64_t(1) << 62)))
      fail(what, "'cu_seqlens' must hold integers");
    p.cu_seqlens.push_back(c.get<std::int64_t>());
  }
  constexpr std::int64_t big = std::int64_t(1) << 62;
  p.T = integer("T", -big, big);
  const std::int64_t int_max = std::numeric_limits<int>::max(), int_min = std::numeric_limits<int>::min();
  p.H = static_cast<int>(integer("H", int_min, int_max));
  p.HV = static_cast<int>(integer("HV", int_min, int_max));
  p.K = static_cast<int>(integer("K", int_min, int_max));
  p.V = static_cast<int>(integer("V", int_min, int_max));
  if (j["scale"].is_null()) p.scale.reset();
  else if (j["scale"].is_number()) p.scale = j["scale"].get<double>();
  else fail(what, "'scale' must be a number or null");
  p.use_qk_l2norm = boolean("use_qk_l2norm");
  p.has_h0 = boolean("has_h0");
  p.has_hT = boolean("has_hT");
  const std::string layout = text("state_layout");
  if (layout == "k_major") p.state_layout = StateLayout::k_major;
  else if (layout == "v_major") p.state_layout = StateLayout::v_major;
  else fail(what, "'state_layout' must be k_major or v_major, got '" + layout + "'");
  p.state_slots = integer("state_slots", -big, big);
  p.store_intermediate_states = boolean("store_intermediate_states");
  if (!parse_dtype(text("input_dtype"), &p.input_dtype)) fail(what, "'input_dtype' must be f64, f32, bf16 or f16");
  if (!parse_dtype(text("gate_dtype"), &p.gate_dtype)) fail(what, "'gate_dtype' must be f64, f32, bf16 or f16");
  const std::string mode = text("gate_mode");
  if (mode == "direct") p.gate_mode = GateMode::direct;
  else if (mode == "fused") p.gate_mode = GateMode::fused;
  else fail(what, "'gate_mode' must be direct or fused, got '" + mode + "'");
  p.allow_negative_eigenvalues = boolean("allow_negative_eigenvalues");
  if (j.contains("state_dtype") && !parse_dtype(text("state_dtype"), &p.state_dtype))
    fail(what, "'state_dtype' must be f32, bf16 or f16, got '" + text("state_dtype") + "'");
  if (j.contains("gate_space") && !parse_gate_space(text("gate_space"), &p.gate_space))
    fail(what, "'gate_space' must be log or linear, got '" + text("gate_space") + "'");
  try {
    p.validate();
  } catch (const ProblemError& e) {
    fail(what, std::string("describes an invalid problem: ") + e.what());
  }
  return p;
}

// ---- case level ----------------------------------------------------------------------------

namespace {

// A metadata value quoted in an error: at most 80 bytes (cut at a UTF-8 character boundary),
// control characters escaped, so that a message stays one readable line.
std::string quoted(const std::string& text) {
  std::size_t cut = std::min<std::size_t>(text.size(), 80);
  while (cut > 0 && cut < text.size() && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  std::string out = "'";
  for (std::size_t i = 0; i < cut; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7F) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02X", c);
      out += escaped;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + (cut < text.size() ? "'... (" + std::to_string(text.size()) + " bytes)" : "'");
}

// The largest chunk size a file may name: beyond any kernel's, and the chunked emulation's
// cost is bounded by the longest sequence anyway.
constexpr long kMaxChunkSize = 1 << 20;

}  // namespace

JudgeSettings judge_settings(const std::map<std::string, std::string>& metadata, const Problem& problem,
                             const std::string& what) {
  JudgeSettings settings;
  if (const auto it = metadata.find("gdn.formulation"); it != metadata.end()) {
    if (it->second == "sequential") settings.formulation = Formulation::sequential;
    else if (it->second == "chunked") settings.formulation = Formulation::chunked;
    else fail(what, "__metadata__ 'gdn.formulation' must be 'sequential' or 'chunked', got " + quoted(it->second));
  }
  if (const auto it = metadata.find("gdn.chunk_size"); it != metadata.end()) {
    const std::string& text = it->second;
    const bool digits = !text.empty() && text.size() <= 7 &&
                        std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
    const long value = digits ? std::stol(text) : 0;
    if (!digits || value < 1 || value > kMaxChunkSize)
      fail(what, "__metadata__ 'gdn.chunk_size' must be a decimal integer in [1, " + std::to_string(kMaxChunkSize) +
                     "], got " + quoted(text));
    settings.chunk_size = static_cast<int>(value);
  }
  if (const auto it = metadata.find("gdn.budget"); it != metadata.end()) {
    BudgetOptions budget;
    std::string error;
    if (!parse_budget(it->second, &budget, &error))
      fail(what, "__metadata__ 'gdn.budget' = " + quoted(it->second) + " is malformed: " + error);
    // The operand model exists for the chunked form at C = 64 with o and hT only
    // (CaseContext::baseline): a file asking for it elsewhere asks for a budget that does not
    // exist, which is the file's error, found before any work.
    if (budget.model == BudgetModel::calibrated && budget.baseline != BudgetBaseline::emulation &&
        (settings.formulation != Formulation::chunked || settings.chunk_size != 64 ||
         problem.store_intermediate_states))
      fail(what, "__metadata__ 'gdn.budget' = " + quoted(it->second) +
                     " needs gdn.formulation 'chunked' with gdn.chunk_size 64 and no intermediate states; this file has "
                     "gdn.formulation '" + (settings.formulation == Formulation::chunked ? "chunked" : "sequential") +
                     "', gdn.chunk_size " + std::to_string(settings.chunk_size) + ", store_intermediate_states " +
                     (problem.store_intermediate_states ? "true" : "false"));
    settings.budget = budget;
  }
  return settings;
}

std::string CaseFile::meta(const std::string& key, const std::string& fallback) const {
  const auto it = metadata.find(key);
  return it == metadata.end() ? fallback : it->second;
}

namespace {

const char* safetensors_name(DType dtype) {
  switch (dtype) {
    case DType::f64: return "F64";
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
  }
  return "?";
}

bool float_dtype(const std::string& name, DType* out) {
  if (name == "F64") *out = DType::f64;
  else if (name == "F32") *out = DType::f32;
  else if (name == "BF16") *out = DType::bf16;
  else if (name == "F16") *out = DType::f16;
  else return false;
  return true;
}


std::string value_string(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "+Inf" : "-Inf";
  return std::to_string(x);
}

// Case files hold finite inputs only (docs/case_files.md): a NaN or Inf input would make the
// exact result NaN, and NaN outputs compared with NaN references say nothing. The one exception
// is g = -inf, the operator's hard reset (docs/semantics.md section 2): exp(-inf) = 0 is well
// defined, and the references (sequential and chunked) keep every result finite there.
// Returns the flat index of the first element that breaks the rule, or -1.
std::int64_t first_nonfinite(const HostTensor<double>& t, bool minus_infinity_allowed = false) {
  for (std::int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(t[i]) && !(minus_infinity_allowed && std::isinf(t[i]) && t[i] < 0)) return i;
  return -1;
}

RawTensor encode_floats(const std::string& name, DType dtype, const HostTensor<double>& t, bool input = false) {
  if (input) {
    const std::int64_t bad = first_nonfinite(t, name == "g");
    if (bad >= 0)
      throw CaseFileError("encode_case: input '" + name + "'" + index_string(t.shape(), bad) + " is " +
                          value_string(t[bad]) + ": case files hold finite inputs only (g may be -inf)");
  }
  // Outputs and inputs are stored exactly: a value the dtype cannot hold is the writer's error,
  // not something to round silently.
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const double x = t[i];
    if (!std::isnan(x) && reference::round_to(dtype, x) != x)
      throw CaseFileError("encode_case: " + name + "[" + std::to_string(i) + "] = " + std::to_string(x) +
                          " is not representable in " + dtype_name(dtype));
  }
  RawTensor raw;
  raw.name = name;
  raw.dtype = safetensors_name(dtype);
  raw.shape = t.shape();
  raw.bytes = encode_tensor(t, dtype);
  return raw;
}

HostTensor<double> decode_floats(const RawTensor& raw, DType dtype) {
  return decode_tensor(raw.bytes.data(), raw.bytes.size(), dtype, raw.shape);
}

RawTensor encode_ints64(const std::string& name, const std::vector<std::int64_t>& values) {
  RawTensor raw{name, "I64", {static_cast<std::int64_t>(values.size())}, {}};
  raw.bytes.resize(values.size() * 8);
  if (!values.empty()) std::memcpy(raw.bytes.data(), values.data(), raw.bytes.size());
  return raw;
}

RawTensor encode_ints32(const std::string& name, const std::vector<std::int32_t>& values) {
  RawTensor raw{name, "I32", {static_cast<std::int64_t>(values.size())}, {}};
  raw.bytes.resize(values.size() * 4);
  if (!values.empty()) std::memcpy(raw.bytes.data(), values.data(), raw.bytes.size());
  return raw;
}

// The narrowest of (preferred, F32, F64) that holds every value of t exactly.
DType lossless_dtype(DType preferred, const HostTensor<double>& t) {
  for (DType d : {preferred, DType::f32, DType::f64})
    if (reference::representable(d, t)) return d;
  return DType::f64;
}

// The backward's tensors in a file (gdn-case/2): the cotangents and the gradients, named after
// the forward's tensors. The gradients are those of core/gradients.hpp, in its order.
constexpr const char* kDO = "in.dO";
constexpr const char* kDhT = "in.dhT";

// The forward input a gradient differentiates ("dq" -> q): Gradients' contract is that a
// gradient is defined exactly when that input is used, so the inputs decide which gradients a
// case has.
const HostTensor<double>& input_of_gradient(const Inputs& in, const std::string& gradient) {
  static const HostTensor<double> none;
  const std::string x = gradient.substr(1);
  if (x == "q") return in.q;
  if (x == "k") return in.k;
  if (x == "v") return in.v;
  if (x == "g") return in.g;
  if (x == "beta") return in.beta;
  if (x == "a") return in.a;
  if (x == "b") return in.b;
  if (x == "A_log") return in.A_log;
  if (x == "dt_bias") return in.dt_bias;
  if (x == "h0") return in.h0;
  return none;
}

// The metrics' name of a gradient ("dq" -> OutputTensor::dq): its storage dtype and shape come
// from oracle::output_dtype / output_shape.
OutputTensor gradient_tensor(const std::string& name) {
  for (OutputTensor t : {OutputTensor::dq, OutputTensor::dk, OutputTensor::dv, OutputTensor::dg, OutputTensor::dbeta,
                         OutputTensor::da, OutputTensor::db, OutputTensor::dA_log, OutputTensor::ddt_bias,
                         OutputTensor::dh0})
    if (name == output_tensor_name(t)) return t;
  throw std::logic_error("case_file: '" + name + "' is not a gradient");
}

// "out.dq", "out.dk", ...: every gradient name a file may hold, whatever the problem.
std::vector<std::string> gradient_file_names() {
  std::vector<std::string> names;
  Gradients<double>{}.for_each([&](const char* name, const HostTensor<double>&) { names.push_back(std::string("out.") + name); });
  return names;
}

// The gradients the problem has, "dq, dk, dv, dg, dbeta, dh0": for errors.
std::string gradient_list(const Inputs& in) {
  std::string list;
  Gradients<double>{}.for_each([&](const char* name, const HostTensor<double>&) {
    if (input_of_gradient(in, name).defined()) list += (list.empty() ? "" : ", ") + std::string(name);
  });
  return list;
}

// The backward's scope (docs/backward.md, "Scope"), as a case file states it: the reason the
// problem cannot carry dO, or "" when it can. The same words for the reader and the writer.
std::string backward_out_of_scope(const Problem& p) {
  if (p.uses_state_cache())
    return "the backward does not cover state caches (state_slots = " + std::to_string(p.state_slots) +
           "; docs/backward.md, Scope)";
  if (p.store_intermediate_states)
    return "the backward does not cover per-token states (store_intermediate_states; docs/backward.md, Scope)";
  if (p.state_dtype != DType::f32)
    return std::string("the backward covers fp32 states only (state_dtype = ") + dtype_name(p.state_dtype) +
           "; docs/backward.md, Scope)";
  if (p.linear_gates()) return "the backward covers log-space gates only (gate_space = linear; docs/backward.md, Scope)";
  return "";
}

}  // namespace

std::vector<std::uint8_t> encode_case(const CaseFile& c) {
  const Problem& p = c.problem;
  try {
    validate(p, c.inputs);
  } catch (const ProblemError& e) {
    throw CaseFileError(std::string("encode_case: the inputs do not fit the problem: ") + e.what());
  }
  SafetensorsFile file;
  file.metadata = c.metadata;
  file.metadata["gdn.format"] = kCaseFormat;
  file.metadata["gdn.problem"] = problem_to_json(p).dump();
  file.tensors.push_back(encode_ints64("cu_seqlens", p.cu_seqlens));
  file.tensors.push_back(encode_floats("q", p.input_dtype, c.inputs.q, true));
  file.tensors.push_back(encode_floats("k", p.input_dtype, c.inputs.k, true));
  file.tensors.push_back(encode_floats("v", p.input_dtype, c.inputs.v, true));
  if (p.gate_mode == GateMode::direct) {
    file.tensors.push_back(encode_floats(p.decay_name(), p.gate_dtype, c.inputs.g, true));
    file.tensors.push_back(encode_floats("beta", p.gate_dtype, c.inputs.beta, true));
  } else {
    file.tensors.push_back(encode_floats("a", p.gate_dtype, c.inputs.a, true));
    file.tensors.push_back(encode_floats("b", p.gate_dtype, c.inputs.b, true));
    file.tensors.push_back(encode_floats("A_log", DType::f32, c.inputs.A_log, true));
    file.tensors.push_back(encode_floats("dt_bias", DType::f32, c.inputs.dt_bias, true));
  }
  if (p.has_h0 || p.uses_state_cache()) file.tensors.push_back(encode_floats("h0", p.state_dtype, c.inputs.h0, true));
  if (p.uses_state_cache()) file.tensors.push_back(encode_ints32("state_indices", c.inputs.state_indices));
  if (c.outputs) {
    const Outputs<double>& o = *c.outputs;
    auto add = [&](const char* name, const HostTensor<double>& t, const Shape& shape, DType preferred) {
      if (t.shape() != shape)
        throw CaseFileError(std::string("encode_case: output ") + name + " has shape " + shape_string(t.shape()) +
                            ", the problem's is " + shape_string(shape));
      file.tensors.push_back(encode_floats(name, lossless_dtype(preferred, t), t));
    };
    add("out.o", o.o, p.v_shape(), p.input_dtype);
    if (p.has_hT) add("out.hT", o.hT, p.state_shape(), p.state_dtype);
    if (p.store_intermediate_states) add("out.intermediate", o.intermediate, p.intermediate_shape(), p.state_dtype);
  }
  // The backward's tensors, under the rules the reader enforces (it never reads back a file
  // this refuses, and this never writes one it refuses).
  if (c.gradients && !c.backward)
    throw CaseFileError("encode_case: gradients need the backward's inputs (dO) they were computed from");
  if (c.backward) {
    const BackwardInputs& b = *c.backward;
    if (const std::string why = backward_out_of_scope(p); !why.empty())
      throw CaseFileError("encode_case: the backward's inputs (dO): " + why);
    if (b.dO.shape() != p.v_shape())
      throw CaseFileError("encode_case: dO has shape " + (b.dO.defined() ? shape_string(b.dO.shape()) : "(missing)") +
                          ", the problem's is " + shape_string(p.v_shape()));
    file.tensors.push_back(encode_floats(kDO, p.input_dtype, b.dO, true));
    if (b.dhT.defined()) {
      if (!p.has_hT)
        throw CaseFileError("encode_case: dhT needs has_hT (the loss cannot depend on a final state the problem "
                            "does not output)");
      if (b.dhT.shape() != p.state_shape())
        throw CaseFileError("encode_case: dhT has shape " + shape_string(b.dhT.shape()) + ", the problem's is " +
                            shape_string(p.state_shape()));
      file.tensors.push_back(encode_floats(kDhT, DType::f32, b.dhT, true));
    }
    file.metadata["gdn.format"] = kCaseFormatBackward;
  }
  if (c.gradients) {
    c.gradients->for_each([&](const char* name, const HostTensor<double>& t) {
      const bool wanted = input_of_gradient(c.inputs, name).defined();
      if (!wanted && t.defined())
        throw CaseFileError(std::string("encode_case: gradient '") + name +
                            "' is not one of this problem's (" + gradient_list(c.inputs) + ")");
      if (!wanted) return;
      const OutputTensor tensor = gradient_tensor(name);
      if (t.shape() != output_shape(p, tensor))
        throw CaseFileError(std::string("encode_case: gradient '") + name + "' has shape " +
                            (t.defined() ? shape_string(t.shape()) : std::string("(missing)")) +
                            ", the problem's is " + shape_string(output_shape(p, tensor)));
      file.tensors.push_back(encode_floats(std::string("out.") + name, lossless_dtype(output_dtype(p, tensor), t), t));
    });
  }
  if (needs_format_3(p)) file.metadata["gdn.format"] = kCaseFormatStates;
  return serialize_safetensors(file);
}

CaseFile decode_case(const std::uint8_t* data, std::size_t size, const std::string& what, const CaseLimits& limits) {
  const SafetensorsFile file = parse_safetensors(data, size, what);
  CaseFile c;
  c.metadata = file.metadata;
  const std::string format = c.meta("gdn.format");
  if (format != kCaseFormat && format != kCaseFormatBackward && format != kCaseFormatStates)
    fail(what, "__metadata__ 'gdn.format' must be '" + std::string(kCaseFormat) + "', '" + kCaseFormatBackward +
                   "' or '" + kCaseFormatStates + "', got " + quoted(format));
  if (!file.metadata.count("gdn.problem")) fail(what, "__metadata__ has no 'gdn.problem'");
  const nlohmann::json problem_json = parse_json_strict(file.metadata.at("gdn.problem"), what, "'gdn.problem'");
  // The keys of gdn-case/3 belong to it: a /1 or /2 file is read as fp32 states with log-space
  // gates and may not say otherwise; a /3 file states both (one reading per file, whatever the
  // reader's version).
  for (const char* key : {"state_dtype", "gate_space"}) {
    const bool given = problem_json.is_object() && problem_json.contains(key);
    if (given && format != kCaseFormatStates)
      fail(what, std::string("gdn.problem key '") + key + "' needs gdn.format '" + kCaseFormatStates + "', got " +
                     quoted(format));
    if (!given && format == kCaseFormatStates)
      fail(what, std::string("gdn.problem of a '") + kCaseFormatStates + "' file must give '" + key + "'");
  }
  try {
    c.problem = problem_from_json(problem_json);
  } catch (const CaseFileError& e) {
    fail(what, e.what());
  }
  const Problem& p = c.problem;
  c.settings = judge_settings(c.metadata, p, what);
  // The backward's rules, from the tensor names alone (before the cost, which they change).
  const std::vector<std::string> gradient_names = gradient_file_names();
  std::string first_gradient;
  for (const std::string& name : gradient_names)
    if (first_gradient.empty() && file.find(name)) first_gradient = name;
  const bool has_dO = file.find(kDO) != nullptr, has_dhT = file.find(kDhT) != nullptr;
  if (format == kCaseFormatStates && !needs_format_3(c.problem))
    fail(what, std::string("gdn.format '") + kCaseFormatStates + "' is for problems with a state_dtype other than f32 "
               "or linear gates; this one has neither (write it as '" + kCaseFormat + "' or '" + kCaseFormatBackward + "')");
  if (format == kCaseFormat) {
    const std::string backward_tensor = has_dO ? kDO : has_dhT ? kDhT : first_gradient;
    if (!backward_tensor.empty())
      fail(what, "tensor '" + backward_tensor + "' is a backward tensor, which gdn.format '" + kCaseFormat +
                     "' does not hold (the backward's tensors need '" + kCaseFormatBackward + "')");
  }
  if (!first_gradient.empty() && !has_dO)
    fail(what, "tensor '" + first_gradient + "' needs 'in.dO': gradients are judged against the backward of the dO "
                   "they were computed from, which the file must hold");
  if (has_dhT && !has_dO)
    fail(what, "tensor 'in.dhT' needs 'in.dO' (the backward's dO is required, dhT optional)");
  if (has_dO) {
    if (const std::string why = backward_out_of_scope(p); !why.empty()) fail(what, "tensor 'in.dO': " + why);
  }
  if (has_dhT && !p.has_hT)
    fail(what, "tensor 'in.dhT' needs has_hT (the loss cannot depend on a final state the problem does not output)");
  // What the tensors hold is bounded by the file's size; what the problem makes the judge
  // compute (states, per-token states, references, the backward) is not: a header of a few
  // hundred bytes can describe gigabytes. Estimate it before anything is decoded or run.
  const std::string over =
      exceeded_limit(estimate_cost(p, c.settings.formulation, c.settings.chunk_size, size, has_dO), limits);
  if (!over.empty()) fail(what, over);
  std::set<std::string> used;
  auto tensor = [&](const std::string& name) -> const RawTensor& {
    const RawTensor* t = file.find(name);
    if (!t) fail(what, "tensor '" + name + "' is missing (the problem needs it)");
    used.insert(name);
    return *t;
  };
  auto floats = [&](const std::string& name, const Shape& shape, const std::vector<DType>& allowed) {
    const RawTensor& raw = tensor(name);
    DType dtype;
    std::string names;
    for (DType d : allowed) names += std::string(names.empty() ? "" : " or ") + safetensors_name(d);
    if (!float_dtype(raw.dtype, &dtype) || std::find(allowed.begin(), allowed.end(), dtype) == allowed.end())
      fail(what, "tensor '" + name + "' must have dtype " + names + ", got " + raw.dtype);
    if (raw.shape != shape)
      fail(what, "tensor '" + name + "' must have shape " + shape_string(shape) + ", got " + shape_string(raw.shape));
    return decode_floats(raw, dtype);
  };
  {
    const RawTensor& cu = tensor("cu_seqlens");
    if (cu.dtype != "I64" && cu.dtype != "I32")
      fail(what, "tensor 'cu_seqlens' must have dtype I64 or I32, got " + cu.dtype);
    const Shape expected{static_cast<std::int64_t>(p.cu_seqlens.size())};
    if (cu.shape != expected)
      fail(what, "tensor 'cu_seqlens' must have shape " + shape_string(expected) + ", got " + shape_string(cu.shape));
    for (std::size_t i = 0; i < p.cu_seqlens.size(); ++i) {
      std::int64_t value;
      if (cu.dtype == "I64") {
        std::memcpy(&value, cu.bytes.data() + 8 * i, 8);
      } else {
        std::int32_t v32;
        std::memcpy(&v32, cu.bytes.data() + 4 * i, 4);
        value = v32;
      }
      if (value != p.cu_seqlens[i])
        fail(what, "tensor 'cu_seqlens'[" + std::to_string(i) + "] = " + std::to_string(value) +
                       " disagrees with gdn.problem's " + std::to_string(p.cu_seqlens[i]));
    }
  }
  const std::vector<DType> input{p.input_dtype}, gate{p.gate_dtype}, f32{DType::f32};
  const std::vector<DType> any_float{DType::f64, DType::f32, DType::bf16, DType::f16};
  c.inputs.q = floats("q", p.q_shape(), input);
  c.inputs.k = floats("k", p.q_shape(), input);
  c.inputs.v = floats("v", p.v_shape(), input);
  if (p.gate_mode == GateMode::direct) {
    c.inputs.g = floats(p.decay_name(), p.gate_shape(), gate);
    c.inputs.beta = floats("beta", p.gate_shape(), gate);
  } else {
    c.inputs.a = floats("a", p.gate_shape(), gate);
    c.inputs.b = floats("b", p.gate_shape(), gate);
    c.inputs.A_log = floats("A_log", p.head_param_shape(), f32);
    c.inputs.dt_bias = floats("dt_bias", p.head_param_shape(), f32);
  }
  if (p.has_h0 || p.uses_state_cache()) c.inputs.h0 = floats("h0", p.state_shape(), {p.state_dtype});
  if (p.uses_state_cache()) {
    const RawTensor& idx = tensor("state_indices");
    if (idx.dtype != "I32") fail(what, "tensor 'state_indices' must have dtype I32, got " + idx.dtype);
    const Shape expected{p.N()};
    if (idx.shape != expected)
      fail(what, "tensor 'state_indices' must have shape " + shape_string(expected) + ", got " + shape_string(idx.shape));
    c.inputs.state_indices.resize(static_cast<std::size_t>(p.N()));
    if (p.N() > 0) std::memcpy(c.inputs.state_indices.data(), idx.bytes.data(), idx.bytes.size());
  }
  if (has_dO) {
    // dO in the input dtype (the gradient of o, exactly representable there: §6), dhT in fp32.
    BackwardInputs b;
    b.dO = floats(kDO, p.v_shape(), input);
    if (has_dhT) b.dhT = floats(kDhT, p.state_shape(), f32);
    c.backward = std::move(b);
  }
  static const HostTensor<double> absent;
  // Every input value must be finite: the first bad element is named.
  const std::pair<const char*, const HostTensor<double>*> inputs[] = {
      {"q", &c.inputs.q},         {"k", &c.inputs.k},          {"v", &c.inputs.v},      {p.decay_name(), &c.inputs.g},
      {"beta", &c.inputs.beta},   {"a", &c.inputs.a},          {"b", &c.inputs.b},      {"A_log", &c.inputs.A_log},
      {"dt_bias", &c.inputs.dt_bias}, {"h0", &c.inputs.h0},
      {kDO, c.backward ? &c.backward->dO : &absent}, {kDhT, c.backward ? &c.backward->dhT : &absent}};
  for (const auto& [name, tensor] : inputs) {
    const std::int64_t bad = first_nonfinite(*tensor, std::string(name) == "g");
    if (bad >= 0)
      fail(what, std::string("tensor '") + name + "'" + index_string(tensor->shape(), bad) + " (element " +
                     std::to_string(bad) + ") is " + value_string((*tensor)[bad]) +
                     ": inputs must be finite, but for g = -inf, the hard reset (alpha = 0 with linear gates; "
                     "outputs may hold NaN or Inf)");
  }
  if (file.find("out.o")) {
    Outputs<double> o;
    o.o = floats("out.o", p.v_shape(), any_float);
    if (p.has_hT) o.hT = floats("out.hT", p.state_shape(), any_float);
    if (p.store_intermediate_states) o.intermediate = floats("out.intermediate", p.intermediate_shape(), any_float);
    c.outputs = std::move(o);
  }
  if (!first_gradient.empty()) {
    // A file with gradients holds every gradient the problem has (one missing is an error, not
    // a tensor left unjudged), in any float dtype (normally output_dtype's).
    Gradients<double> g;
    g.for_each([&](const char* name, HostTensor<double>& t) {
      if (input_of_gradient(c.inputs, name).defined())
        t = floats(std::string("out.") + name, output_shape(p, gradient_tensor(name)), any_float);
    });
    c.gradients = std::move(g);
  }
  for (const RawTensor& t : file.tensors) {
    if (used.count(t.name)) continue;
    std::string hint;
    if (std::find(gradient_names.begin(), gradient_names.end(), t.name) != gradient_names.end())
      hint = " (its gradients are those of the inputs it uses: " + gradient_list(c.inputs) + ")";
    else if (t.name.rfind("out.", 0) == 0)
      hint = " (outputs need out.o, and out.hT / out.intermediate only when the problem asks for them)";
    else if (t.name.rfind("in.", 0) == 0)
      hint = " (the backward's inputs are in.dO and in.dhT)";
    fail(what, "tensor '" + t.name + "' is not part of this problem" + hint);
  }
  try {
    validate(p, c.inputs);
  } catch (const ProblemError& e) {
    fail(what, std::string("inputs rejected: ") + e.what());
  }
  return c;
}

void write_case_file(const std::string& path, const CaseFile& case_file) {
  write_file_atomic(path, encode_case(case_file));
}

CaseFile read_case_file(const std::string& path, const CaseLimits& limits) {
  const std::vector<std::uint8_t> bytes = read_file_bytes(path, limits.max_bytes);
  return decode_case(bytes.data(), bytes.size(), path, limits);
}

}  // namespace gdn::oracle
