#include "cuda/testbed.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>

namespace gdn::cuda::testbed {

namespace {

template <class T>
const T& pick(std::mt19937_64& rng, const std::vector<T>& options) {
  return options[std::uniform_int_distribution<std::size_t>(0, options.size() - 1)(rng)];
}

bool coin(std::mt19937_64& rng, double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; }

int uniform(std::mt19937_64& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

// Head sizes: the production ones, odd ones and the neighbours of multiples of 16 (where tiles
// and vector paths switch), and anything in [1, 256].
int head_size(std::mt19937_64& rng) {
  static const std::vector<int> common{16, 32, 64, 128, 128, 128, 256};
  static const std::vector<int> edges{1, 2, 3, 4, 5, 7, 8, 12, 15, 17, 31, 33, 63, 65, 96, 100, 127, 129, 192, 255};
  const double r = std::uniform_real_distribution<double>(0, 1)(rng);
  if (r < 0.4) return pick(rng, common);
  if (r < 0.8) return pick(rng, edges);
  return uniform(rng, 1, 256);
}

void draw_common(std::mt19937_64& rng, Problem& p, fuzz::InputOptions& o) {
  const DType dtype = pick(rng, std::vector<DType>{DType::f32, DType::bf16, DType::f16});
  p.input_dtype = dtype;
  p.gate_dtype = coin(rng, 0.5) ? DType::f32 : dtype;
  p.use_qk_l2norm = coin(rng, 0.5);
  if (coin(rng, 0.3)) p.scale = std::uniform_real_distribution<double>(0.05, 1.0)(rng);
  p.state_layout = coin(rng, 0.5) ? StateLayout::v_major : StateLayout::k_major;
  p.gate_mode = coin(rng, 0.4) ? GateMode::fused : GateMode::direct;
  if (p.gate_mode == GateMode::fused) p.allow_negative_eigenvalues = coin(rng, 0.3);
  o.regime = pick(rng, std::vector<fuzz::GateRegime>{fuzz::GateRegime::no_decay, fuzz::GateRegime::mild,
                                                      fuzz::GateRegime::strong, fuzz::GateRegime::underflow});
  o.beta_max = (p.gate_mode == GateMode::direct && coin(rng, 0.25)) ? 2.0 : 1.0;
  // Contractive cases only (unit keys or l2norm): growth has no error budget (§2).
  o.unit_keys = true;
  o.padding_fraction = 0.25;
}

// Shrinks lengths until T * HV * K * V fits the cap.
void cap_work(Problem& p, std::vector<std::int64_t>& lengths, double cap) {
  auto work = [&] {
    std::int64_t t = 0;
    for (auto l : lengths) t += l;
    return double(t) * p.HV * p.K * p.V;
  };
  while (work() > cap) {
    bool changed = false;
    for (auto& l : lengths)
      if (l > 1) {
        l = (l + 1) / 2;
        changed = true;
      }
    if (!changed) break;
  }
}

void set_lengths(Problem& p, const std::vector<std::int64_t>& lengths) {
  const Problem shape = Problem::packed(lengths, p.H, p.HV, p.K, p.V);
  p.cu_seqlens = shape.cu_seqlens;
  p.T = shape.T;
}

constexpr double kWorkCap = 4.0e6;

}  // namespace

std::string KernelCase::describe() const {
  std::ostringstream s;
  s << problem.describe() << " cu_seqlens=[";
  for (std::size_t i = 0; i < problem.cu_seqlens.size(); ++i) s << (i ? "," : "") << problem.cu_seqlens[i];
  s << "] regime=" << fuzz::gate_regime_name(options.regime) << " beta_max=" << options.beta_max
    << " seed=" << seed;
  return s.str();
}

KernelCase random_prefill_case(std::mt19937_64& rng) {
  KernelCase c;
  Problem& p = c.problem;
  p.H = pick(rng, std::vector<int>{1, 1, 2, 4});
  p.HV = p.H * pick(rng, std::vector<int>{1, 1, 2, 3, 4});
  p.K = head_size(rng);
  p.V = head_size(rng);
  const int N = uniform(rng, 1, 6);
  std::vector<std::int64_t> lengths(static_cast<std::size_t>(N));
  for (auto& l : lengths) {
    const double r = std::uniform_real_distribution<double>(0, 1)(rng);
    l = r < 0.15 ? 0 : r < 0.3 ? 1 : r < 0.9 ? uniform(rng, 2, 24) : uniform(rng, 25, 160);
  }
  cap_work(p, lengths, kWorkCap);
  set_lengths(p, lengths);
  draw_common(rng, p, c.options);
  if (coin(rng, 0.4)) {
    p.state_slots = N + uniform(rng, 0, 3);
    p.has_h0 = coin(rng, 0.8);
    p.has_hT = !p.has_h0 || coin(rng, 0.8);
  } else {
    p.has_h0 = coin(rng, 0.6);
    p.has_hT = coin(rng, 0.6);
  }
  p.store_intermediate_states = coin(rng, 0.25);
  c.seed = rng();
  return c;
}

KernelCase random_decode_case(std::mt19937_64& rng) {
  KernelCase c;
  Problem& p = c.problem;
  p.H = pick(rng, std::vector<int>{1, 1, 2, 4});
  p.HV = p.H * pick(rng, std::vector<int>{1, 1, 2, 3, 4});
  p.K = head_size(rng);
  p.V = head_size(rng);
  const int B = uniform(rng, 1, 8);
  std::int64_t ts = coin(rng, 0.5) ? 1 : uniform(rng, 2, 4);
  std::vector<std::int64_t> lengths(static_cast<std::size_t>(B), ts);
  cap_work(p, lengths, kWorkCap);
  set_lengths(p, lengths);
  draw_common(rng, p, c.options);
  p.state_slots = B + uniform(rng, 0, 4);
  p.has_h0 = coin(rng, 0.9);
  p.has_hT = !p.has_h0 || coin(rng, 0.9);
  p.store_intermediate_states = coin(rng, 0.3);
  c.seed = rng();
  return c;
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

int case_count() {
  const char* text = std::getenv("GDN_CASES");
  if (text == nullptr) return 50;
  const int n = std::atoi(text);
  return n > 0 ? n : 50;
}

std::uint64_t base_seed() {
  const char* text = std::getenv("GDN_SEED");
  return text ? std::strtoull(text, nullptr, 10) : 20261202ull;
}

std::uint64_t property_seed(const std::string& kernel, const std::string& property) {
  return base_seed() ^ (std::hash<std::string>{}(kernel + "/" + property) & 0xffffffffull);
}

}  // namespace gdn::cuda::testbed
