#include "cuda/tests/testbed.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <sstream>

#include "core/dtype_codec.hpp"
#include "fuzz/sample.hpp"

namespace gdn::cuda::testbed {

namespace {

void set_lengths(Problem& p, const std::vector<std::int64_t>& lengths) {
  const Problem shape = Problem::packed(lengths, p.H, p.HV, p.K, p.V);
  p.cu_seqlens = shape.cu_seqlens;
  p.T = shape.T;
}

}  // namespace

std::string describe(const KernelCase& c) {
  std::ostringstream s;
  s << c;
  return s.str();
}

KernelCase random_prefill_case(std::mt19937_64& rng) {
  return fuzz::draw_case(rng(), fuzz::CaseSpace::recurrent_prefill());
}

KernelCase random_decode_case(std::mt19937_64& rng) {
  return fuzz::draw_case(rng(), fuzz::CaseSpace::decode());
}

namespace {

// Copies rows [begin, begin + count) of a tensor whose first axis is tokens (or sequences).
void append_rows(const HostTensor<double>& from, std::int64_t begin, std::int64_t count, std::vector<double>& to) {
  const std::int64_t row = from.numel() / std::max<std::int64_t>(from.dim(0), 1);
  to.insert(to.end(), from.data() + begin * row, from.data() + (begin + count) * row);
}

HostTensor<double> with_rows(const HostTensor<double>& like, std::int64_t rows, const std::vector<double>& data) {
  Shape shape = like.shape();
  shape[0] = rows;
  HostTensor<double> t(shape);
  std::copy(data.begin(), data.end(), t.data());
  return t;
}

}  // namespace

void select_sequences(const Problem& problem, const Inputs& inputs, const std::vector<int>& order,
                      Problem* out_problem, Inputs* out_inputs) {
  Problem p = problem;
  std::vector<std::int64_t> lengths;
  for (int n : order) lengths.push_back(problem.seq_len(n));
  set_lengths(p, lengths);
  Inputs in;
  auto tokens = [&](const HostTensor<double>& t) {
    if (!t.defined()) return HostTensor<double>();
    std::vector<double> data;
    for (int n : order) append_rows(t, problem.seq_begin(n), problem.seq_len(n), data);
    return with_rows(t, p.T, data);
  };
  in.q = tokens(inputs.q);
  in.k = tokens(inputs.k);
  in.v = tokens(inputs.v);
  in.g = tokens(inputs.g);
  in.beta = tokens(inputs.beta);
  in.a = tokens(inputs.a);
  in.b = tokens(inputs.b);
  in.A_log = inputs.A_log;
  in.dt_bias = inputs.dt_bias;
  if (problem.uses_state_cache()) {
    in.h0 = inputs.h0;
    for (int n : order) in.state_indices.push_back(inputs.state_indices[static_cast<std::size_t>(n)]);
  } else if (inputs.h0.defined()) {
    std::vector<double> data;
    for (int n : order) append_rows(inputs.h0, n, 1, data);
    in.h0 = with_rows(inputs.h0, std::int64_t(order.size()), data);
  }
  *out_problem = p;
  *out_inputs = in;
}

namespace {

std::string compare_rows(const char* name, const HostTensor<double>& a, std::int64_t a_begin,
                         const HostTensor<double>& b, std::int64_t b_begin, std::int64_t count) {
  if (count == 0) return "";
  const std::int64_t row = a.numel() / std::max<std::int64_t>(a.dim(0), 1);
  const std::int64_t row_b = b.numel() / std::max<std::int64_t>(b.dim(0), 1);
  if (row != row_b) return std::string(name) + ": row sizes differ";
  for (std::int64_t i = 0; i < count * row; ++i) {
    const double x = a[a_begin * row + i], y = b[b_begin * row + i];
    if (std::memcmp(&x, &y, sizeof(double)) != 0) {
      std::ostringstream s;
      s << name << ": element " << i << " of the sequence's rows differs: " << x << " vs " << y;
      return s.str();
    }
  }
  return "";
}

}  // namespace

std::string compare_sequence_bits(const Problem& p, const Inputs& in, const Outputs<double>& out, int n,
                                  const Problem& q, const Inputs& qin, const Outputs<double>& other, int m) {
  if (p.seq_len(n) != q.seq_len(m)) return "sequence lengths differ";
  std::string d = compare_rows("o", out.o, p.seq_begin(n), other.o, q.seq_begin(m), p.seq_len(n));
  if (!d.empty()) return d;
  if (p.store_intermediate_states) {
    d = compare_rows("intermediate", out.intermediate, p.seq_begin(n), other.intermediate, q.seq_begin(m), p.seq_len(n));
    if (!d.empty()) return d;
  }
  if (p.has_hT) {
    std::int64_t rn = n, rm = m;
    if (p.uses_state_cache()) {
      rn = in.state_indices[static_cast<std::size_t>(n)];
      rm = qin.state_indices[static_cast<std::size_t>(m)];
      if (rn < 0 || rm < 0) return rn == rm ? "" : "padding differs";
    }
    d = compare_rows("hT", out.hT, rn, other.hT, rm, 1);
  }
  return d;
}

std::string check_exact_rules(const Problem& problem, const Inputs& inputs, const Outputs<double>& out) {
  if (!problem.uses_state_cache()) return "";
  std::vector<bool> named(static_cast<std::size_t>(problem.state_slots), false);
  const std::int64_t o_row = std::int64_t(problem.HV) * problem.V;
  const std::int64_t s_row = std::int64_t(problem.HV) * problem.K * problem.V;
  for (int n = 0; n < problem.N(); ++n) {
    const std::int32_t slot = inputs.state_indices[static_cast<std::size_t>(n)];
    if (slot >= 0) {
      named[static_cast<std::size_t>(slot)] = true;
      continue;
    }
    for (std::int64_t t = problem.seq_begin(n); t < problem.seq_begin(n) + problem.seq_len(n); ++t) {
      for (std::int64_t i = 0; i < o_row; ++i)
        if (out.o[t * o_row + i] != 0.0 || std::signbit(out.o[t * o_row + i]))
          return "padding sequence " + std::to_string(n) + ": o is not exactly +0 at token " + std::to_string(t);
      if (problem.store_intermediate_states)
        for (std::int64_t i = 0; i < s_row; ++i)
          if (out.intermediate[t * s_row + i] != 0.0)
            return "padding sequence " + std::to_string(n) + ": intermediate is not zero at token " + std::to_string(t);
    }
  }
  if (problem.has_hT) {
    for (std::int64_t slot = 0; slot < problem.state_slots; ++slot) {
      if (named[static_cast<std::size_t>(slot)]) continue;
      for (std::int64_t i = 0; i < s_row; ++i) {
        const double x = out.hT[slot * s_row + i], y = inputs.h0[slot * s_row + i];
        if (std::memcmp(&x, &y, sizeof(double)) != 0)
          return "cache slot " + std::to_string(slot) + " is named by no sequence but changed (element " +
                 std::to_string(i) + ")";
      }
    }
  }
  return "";
}

bool bits_equal(const HostTensor<double>& a, const HostTensor<double>& b) {
  if (a.shape() != b.shape()) return false;
  if (a.numel() == 0) return true;
  return std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.numel()) * sizeof(double)) == 0;
}

bool outputs_bits_equal(const Outputs<double>& a, const Outputs<double>& b) {
  return bits_equal(a.o, b.o) && bits_equal(a.hT, b.hT) && bits_equal(a.intermediate, b.intermediate);
}

std::string pack_diff(Implementation& kernel, const Problem& p, const Inputs& inputs, const Outputs<double>& packed,
                      std::mt19937_64& rng, int* alone) {
  std::vector<int> reversed(static_cast<std::size_t>(p.N()));
  for (int n = 0; n < p.N(); ++n) reversed[static_cast<std::size_t>(n)] = p.N() - 1 - n;
  Problem rp;
  Inputs ri;
  select_sequences(p, inputs, reversed, &rp, &ri);
  const Outputs<double> rev = kernel.run(rp, ri);
  std::string diff;
  for (int n = 0; n < p.N() && diff.empty(); ++n) {
    diff = compare_sequence_bits(p, inputs, packed, n, rp, ri, rev, p.N() - 1 - n);
    if (!diff.empty()) diff = "reversed pack, sequence " + std::to_string(n) + ": " + diff;
  }
  *alone = std::uniform_int_distribution<int>(0, p.N() - 1)(rng);
  Problem ap;
  Inputs ai;
  select_sequences(p, inputs, {*alone}, &ap, &ai);
  const Outputs<double> single = kernel.run(ap, ai);
  if (diff.empty()) {
    diff = compare_sequence_bits(p, inputs, packed, *alone, ap, ai, single, 0);
    if (!diff.empty()) diff = "sequence " + std::to_string(*alone) + " alone: " + diff;
  }
  return diff;
}

std::string chunked_layout_diff(const ChunkedOptions& options, const Problem& p, const Inputs& inputs,
                                const Outputs<double>& packed, std::int64_t long_after_tokens) {
  for (int tile : {16, 32, 64, 128}) {
    ChunkedOptions forced_options = options;
    forced_options.value_tile = tile;
    ChunkedPrefillKernel forced(forced_options);
    if (!forced.supports(p, nullptr)) continue;
    if (!outputs_bits_equal(packed, forced.run(p, inputs))) return "value tile " + std::to_string(tile) + " changes bits";
  }
  // Two V tiles (two output launches on two streams) need an unsplit launch (an explicit 0, or
  // the default split by the heads that leaves this problem whole); then they must give its bits.
  if (chunked_fixed_split(p, options.split_chunks) == 0 && options.debug == nullptr) {
    ChunkedOptions two_tiles = options;
    two_tiles.split_chunks = 0;
    two_tiles.value_tile = 0;
    two_tiles.long_value_tile = 16;
    two_tiles.long_above_chunks = (long_after_tokens + kChunkSize - 1) / kChunkSize;
    ChunkedPrefillKernel two(two_tiles);
    if (two.supports(p, nullptr) && !outputs_bits_equal(packed, two.run(p, inputs)))
      return "two V tiles (16 above " + std::to_string(two_tiles.long_above_chunks) + " chunks) change bits";
  }
  return "";
}

DeviceBuffer<std::uint8_t> to_device(const HostTensor<double>& tensor, DType dtype) {
  return DeviceBuffer<std::uint8_t>(encode_tensor(tensor, dtype));
}

HostTensor<double> from_device(const DeviceBuffer<std::uint8_t>& buffer, DType dtype, const Shape& shape) {
  const std::vector<std::uint8_t> bytes = buffer.download();
  return decode_tensor(bytes.data(), bytes.size(), dtype, shape);
}

Tally& Tally::instance() {
  static Tally tally;
  return tally;
}

void Tally::add(const std::string& kernel, const std::string& property, bool ran, bool failed, double margin) {
  std::lock_guard<std::mutex> lock(mutex_);
  Count& c = counts_[kernel][property];
  if (ran) ++c.run;
  else ++c.skipped;
  if (failed) ++c.failed;
  c.worst_margin = std::max(c.worst_margin, margin);
}

std::map<std::string, std::map<std::string, Count>> Tally::snapshot() {
  std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

SuiteOptions& suite_options() {
  static SuiteOptions options;
  return options;
}

int case_count() { return suite_options().cases; }

std::uint64_t base_seed() { return suite_options().seed; }

std::uint64_t property_seed(const std::string& kernel, const std::string& property) {
  return base_seed() ^ (std::hash<std::string>{}(kernel + "/" + property) & 0xffffffffull);
}

}  // namespace gdn::cuda::testbed
