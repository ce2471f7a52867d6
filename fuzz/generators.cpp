#include "fuzz/generators.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>

namespace gdn::fuzz {

double Case::work() const {
  return double(problem.T) * problem.HV * double(problem.K) * problem.V;
}

std::int64_t Case::longest_sequence() const {
  std::int64_t longest = 0;
  for (int n = 0; n < problem.N(); ++n) longest = std::max(longest, problem.seq_len(n));
  return longest;
}

std::string describe(const InputOptions& options) {
  std::ostringstream s;
  s << "regime=" << gate_regime_name(options.regime) << " beta_max=" << options.beta_max
    << " unit_keys=" << (options.unit_keys ? "true" : "false") << " state_scale=" << options.state_scale
    << " padding_fraction=" << options.padding_fraction;
  if (options.small_norms) s << " small_norms=true";
  if (options.zero_key_tail != 0) s << " zero_key_tail=" << options.zero_key_tail;
  return s.str();
}

std::ostream& operator<<(std::ostream& out, const Case& c) {
  out << "Case{" << c.problem.describe() << " | cu_seqlens=[";
  for (std::size_t i = 0; i < c.problem.cu_seqlens.size(); ++i)
    out << (i ? "," : "") << c.problem.cu_seqlens[i];
  out << "] | " << describe(c.options) << " | seed=" << c.seed << "}";
  return out;
}

std::string Case::describe() const {
  std::ostringstream s;
  s << *this;
  return s.str();
}

CaseSpace CaseSpace::chunked(int chunk_size) {
  CaseSpace space;
  space.chunk_size = chunk_size;
  space.intermediate_states = false;  // the chunked form has none
  return space;
}

CaseSpace CaseSpace::recurrent_prefill() {
  CaseSpace space;
  space.max_H = 4;
  space.max_group = 4;
  space.max_sequences = 6;
  space.max_tokens = 1024;
  space.max_extra_slots = 3;
  space.intermediate_states = true;
  space.continuous_scale = true;
  // A GPU case is worth its launch: budgets log-uniform over the top two decades of the cap
  // rather than down to a few hundred, so most cases fill several blocks (small shapes and
  // lengths 0 and 1 are still drawn on purpose).
  space.max_work = 4.0e6;
  space.min_work = space.max_work / 64;
  return space;
}

CaseSpace CaseSpace::decode() {
  CaseSpace space = recurrent_prefill();
  space.max_sequences = 8;
  space.equal_lengths = true;
  space.min_length = 1;
  space.max_length = 4;
  space.state_cache = Feature::always;
  space.max_extra_slots = 4;
  return space;
}

CaseSpace CaseSpace::chunked_prefill() {
  CaseSpace space;
  space.max_H = 4;
  space.max_group = 4;
  space.max_K = 128;
  space.K_multiple = 16;
  space.V_multiple = 16;
  space.max_sequences = 5;
  space.chunk_size = 64;
  space.long_chunks = 5;
  space.v_major = false;
  space.state_cache = false;
  space.intermediate_states = false;
  space.continuous_scale = true;
  space.max_work = 1.2e7;
  space.min_work = space.max_work / 64;  // as recurrent_prefill()'s
  return space;
}

rc::Gen<int> gen_head_size(int limit) {
  limit = std::max(limit, 1);
  std::vector<int> special;
  for (int p : {16, 32, 64, 128, 256})
    for (int d : {p - 1, p, p + 1})
      if (d >= 1 && d <= limit) special.push_back(d);
  if (special.empty()) special.push_back(limit);
  return rc::gen::weightedOneOf<int>({
      {3, rc::gen::inRange(1, std::min(limit, 16) + 1)},  // small, mostly odd-or-tiny sizes
      {3, rc::gen::inRange(1, limit + 1)},                // anything up to the limit
      {2, rc::gen::elementOf(special)},                   // multiples of 16 and their neighbours
      {1, rc::gen::just(limit)},                          // the largest allowed
  });
}

rc::Gen<std::int64_t> gen_sequence_length(int chunk_size, std::int64_t limit, int long_chunks) {
  const std::int64_t C = std::max(chunk_size, 1);
  const std::int64_t longest = std::max<std::int64_t>(long_chunks, 2) * C;
  auto fit = [limit](std::int64_t x) { return std::min<std::int64_t>(std::max<std::int64_t>(x, 0), limit); };
  return rc::gen::weightedOneOf<std::int64_t>({
      {1, rc::gen::just<std::int64_t>(0)},
      {2, rc::gen::just(fit(1))},
      {2, rc::gen::just(fit(C - 1))},
      {2, rc::gen::just(fit(C))},
      {2, rc::gen::just(fit(C + 1))},
      {1, rc::gen::map(rc::gen::element<std::int64_t>(2 * C - 1, 2 * C, 2 * C + 1), fit)},  // the second boundary
      {2, rc::gen::map(rc::gen::inRange<std::int64_t>(2, std::max<std::int64_t>(C, 2) + 1), fit)},
      {2, rc::gen::map(rc::gen::inRange<std::int64_t>(2 * C, longest + 1), fit)},  // several chunks
      {1, rc::gen::map(rc::gen::inRange<std::int64_t>(0, 3 * C + 2), fit)},
  });
}

void check_space(const CaseSpace& space) {
  if (space.max_K < 1 || space.max_V < 1 || space.max_H < 1 || space.max_group < 1 ||
      space.max_sequences < 1 || space.chunk_size < 1 || space.max_tokens < 0)
    throw std::invalid_argument("CaseSpace: every maximum and chunk_size must be >= 1");
  if (space.K_multiple < 1 || space.K_multiple > space.max_K)
    throw std::invalid_argument("CaseSpace: K_multiple must be in [1, max_K]");
  if (space.V_multiple < 1 || space.V_multiple > space.max_V)
    throw std::invalid_argument("CaseSpace: V_multiple must be in [1, max_V]");
  if (space.input_dtypes.empty()) throw std::invalid_argument("CaseSpace: input_dtypes is empty");
  if (space.regimes.empty()) throw std::invalid_argument("CaseSpace: regimes is empty");
  if (space.state_dtypes.empty()) throw std::invalid_argument("CaseSpace: state_dtypes is empty");
  for (DType d : space.state_dtypes)
    if (d != DType::f32 && d != DType::bf16 && d != DType::f16)
      throw std::invalid_argument(std::string("CaseSpace: every state_dtypes must be f32, bf16 or f16, got ") +
                                  dtype_name(d));
  if (space.gate_spaces.empty()) throw std::invalid_argument("CaseSpace: gate_spaces is empty");
  if (space.fused_gates.mode == Feature::always &&
      std::find(space.gate_spaces.begin(), space.gate_spaces.end(), GateSpace::log) == space.gate_spaces.end())
    throw std::invalid_argument("CaseSpace: fused_gates always needs log in gate_spaces (fused gates compute g)");
  if (!(space.max_work >= space.min_work) || !(space.min_work >= 1))
    throw std::invalid_argument("CaseSpace: need 1 <= min_work <= max_work");
  if (space.min_length < 0 || space.max_length < 0 || (space.max_length > 0 && space.max_length < space.min_length))
    throw std::invalid_argument("CaseSpace: need 0 <= min_length <= max_length (0: no maximum)");
  if (space.equal_lengths && space.max_length == 0)
    throw std::invalid_argument("CaseSpace: equal_lengths needs max_length");
  if (space.max_extra_slots < 0) throw std::invalid_argument("CaseSpace: max_extra_slots must be >= 0");
  if (space.gva.mode == Feature::always && space.max_group < 2 && space.group_values.empty())
    throw std::invalid_argument("CaseSpace: gva always needs max_group >= 2");
  // The pinned sets: every value a Problem accepts (core/problem.cpp's bounds).
  auto check_ints = [](const char* name, const std::vector<int>& values, int low, int high) {
    for (int x : values)
      if (x < low || x > high)
        throw std::invalid_argument(std::string("CaseSpace: every ") + name + " must be in [" + std::to_string(low) +
                                    ", " + std::to_string(high) + "], got " + std::to_string(x));
  };
  check_ints("K_values", space.K_values, 1, 4096);
  check_ints("V_values", space.V_values, 1, 4096);
  check_ints("H_values", space.H_values, 1, 4096);
  check_ints("group_values", space.group_values, 1, 4096);
  for (int h : space.H_values)
    for (int g : space.group_values)
      if (std::int64_t(h) * g > 4096)
        throw std::invalid_argument("CaseSpace: H_values x group_values gives HV = " + std::to_string(h * g) +
                                    " > 4096");
  if (space.min_sequences < 1 || space.min_sequences > space.max_sequences)
    throw std::invalid_argument("CaseSpace: min_sequences must be in [1, max_sequences]");
  for (std::int64_t l : space.length_values)
    if (l < 0) throw std::invalid_argument("CaseSpace: every length_values must be >= 0, got " + std::to_string(l));
  for (double x : space.scale_values)
    if (!std::isfinite(x)) throw std::invalid_argument("CaseSpace: every scale_values must be finite");
}

namespace {

rc::Gen<bool> maybe(Feature feature, std::size_t weight_on = 1, std::size_t weight_off = 1) {
  if (feature.mode == Feature::off) return rc::gen::just(false);
  if (feature.mode == Feature::always) return rc::gen::just(true);
  return rc::gen::weightedElement<bool>({{weight_off, false}, {weight_on, true}});
}

// Value heads per key head: 1 half the time, else 2..max_group evenly (only 2..max_group when
// GVA is always on).
rc::Gen<int> gen_group(const CaseSpace& space) {
  if (!space.gva || space.max_group < 2) return rc::gen::just(1);
  std::vector<int> groups;  // each element equally likely
  if (space.gva.mode != Feature::always) groups.assign(static_cast<std::size_t>(space.max_group - 1), 1);
  for (int g = 2; g <= space.max_group; ++g) groups.push_back(g);
  return rc::gen::elementOf(groups);
}

// A size as a multiple of `multiple` in [multiple, limit]: rounded up (a free draw) or down (a
// size fitted to the work budget).
int round_up_to(int x, int multiple, int limit) {
  if (multiple <= 1) return x;
  return std::min((x + multiple - 1) / multiple * multiple, limit / multiple * multiple);
}
int round_down_to(int x, int multiple, int limit) {
  if (multiple <= 1) return x;
  return std::max(multiple, std::min(x / multiple * multiple, limit / multiple * multiple));
}

}  // namespace

rc::Gen<Case> gen_case(const CaseSpace& space) {
  check_space(space);
  return rc::gen::exec([space]() {
    using namespace rc;
    const int size = *gen::withSize([](int s) { return gen::just(s); });
    const double cap =
        std::max(space.min_work, space.max_work * (std::clamp(size, 0, 100) + 1) / 101.0);
    // Log-uniform work budget in [min_work, cap]; the exponent shrinks toward small cases.
    const int exponent = *gen::inRange(0, 1001);
    const double budget = space.min_work * std::pow(cap / space.min_work, exponent / 1000.0);

    // Either the shape is drawn first and the lengths fit the rest of the budget, or the
    // lengths first and the shape fits: large heads with short sequences and long sequences
    // with small heads both occur.
    const bool shape_first = *gen::arbitrary<bool>();
    int H = 1, group = 1, K = 1, V = 1;
    std::vector<std::int64_t> lengths;
    const int N = *gen::inRange(space.min_sequences, space.max_sequences + 1);
    auto draw_heads = [&]() {
      H = space.H_values.empty() ? *gen::inRange(1, space.max_H + 1) : *gen::elementOf(space.H_values);
      group = space.group_values.empty() ? *gen_group(space) : *gen::elementOf(space.group_values);
    };
    const std::int64_t length_cap = space.max_length > 0 ? space.max_length : space.max_tokens;
    auto draw_lengths = [&](std::int64_t token_budget) {
      lengths.clear();
      std::int64_t left = std::min(token_budget, space.max_tokens);
      if (!space.length_values.empty()) {
        // Pinned lengths: the work budget does not cut them, max_tokens does.
        left = space.max_tokens;
        const std::int64_t shared = space.equal_lengths ? *gen::elementOf(space.length_values) : 0;
        for (int n = 0; n < N; ++n) {
          const std::int64_t length = space.equal_lengths ? shared : *gen::elementOf(space.length_values);
          lengths.push_back(std::min(length, std::max<std::int64_t>(left, 0)));
          left -= lengths.back();
        }
        return;
      }
      if (space.equal_lengths) {
        // One length for the batch: min_length half the time, else any up to max_length; cut
        // to the budget, never below min_length.
        std::int64_t length = *gen::weightedOneOf<std::int64_t>(
            {{1, gen::just(space.min_length)}, {1, gen::inRange(space.min_length, space.max_length + 1)}});
        length = std::max(space.min_length, std::min(length, left / N));
        lengths.assign(static_cast<std::size_t>(N), length);
        return;
      }
      for (int n = 0; n < N; ++n) {
        const std::int64_t room = std::min(std::max<std::int64_t>(left, 0), length_cap);
        const std::int64_t length =
            std::max(space.min_length, *gen_sequence_length(space.chunk_size, room, space.long_chunks));
        lengths.push_back(length);
        left -= length;
      }
    };
    auto tokens_for = [&](double per_token) {
      return std::max<std::int64_t>(3, static_cast<std::int64_t>(std::min(budget / per_token, 1e15)));
    };
    // A pinned head size: any value of the set, or (fitting a budget) one of those <= fit.
    auto pinned = [](const std::vector<int>& values, std::optional<double> fit) {
      if (!fit) return *gen::elementOf(values);
      std::vector<int> fitting;
      for (int x : values)
        if (x <= *fit) fitting.push_back(x);
      if (fitting.empty()) return *std::min_element(values.begin(), values.end());
      return *gen::elementOf(fitting);
    };
    auto least = [](const std::vector<int>& values, int otherwise) {
      return values.empty() ? otherwise : *std::min_element(values.begin(), values.end());
    };
    if (shape_first) {
      K = space.K_values.empty() ? round_up_to(*gen_head_size(space.max_K), space.K_multiple, space.max_K)
                                 : pinned(space.K_values, std::nullopt);
      V = space.V_values.empty() ? round_up_to(*gen_head_size(space.max_V), space.V_multiple, space.max_V)
                                 : pinned(space.V_values, std::nullopt);
      draw_heads();
      draw_lengths(tokens_for(double(H) * group * K * V));
    } else {
      // The lengths fit the budget at the least head sizes; the head sizes fit what is left.
      draw_heads();
      draw_lengths(tokens_for(double(H) * group * least(space.K_values, space.K_multiple) *
                              least(space.V_values, space.V_multiple)));
      std::int64_t T = 0;
      for (std::int64_t l : lengths) T += l;
      const double kv = budget / (double(std::max<std::int64_t>(T, 1)) * H * group);
      if (space.K_values.empty())
        K = round_down_to(*gen_head_size(std::clamp(static_cast<int>(std::sqrt(kv)), 1, space.max_K)),
                          space.K_multiple, space.max_K);
      else
        K = pinned(space.K_values, std::sqrt(kv));
      if (space.V_values.empty())
        V = round_down_to(*gen_head_size(std::clamp(static_cast<int>(kv / K), 1, space.max_V)), space.V_multiple,
                          space.max_V);
      else
        V = pinned(space.V_values, kv / K);
    }

    Case c;
    Problem& p = c.problem;
    p = Problem::packed(lengths, H, H * group, K, V);
    p.use_qk_l2norm = *maybe(space.l2norm);
    p.has_h0 = *maybe(space.initial_state, 2, 1);
    p.has_hT = *maybe(space.final_state, 2, 1);
    p.state_layout = *maybe(space.v_major, 1, 3) ? StateLayout::v_major : StateLayout::k_major;
    if (*maybe(space.state_cache, 1, 2)) {
      // A cache with a few more slots than sequences; make_inputs gives each sequence its
      // own slot in random order and turns padding_fraction of them into -1 rows.
      p.state_slots = N + *gen::inRange(0, space.max_extra_slots + 1);
      if (!p.has_h0 && !p.has_hT) p.has_hT = true;
      c.options.padding_fraction = space.padding.mode == Feature::sometimes ? *gen::element(0.0, 0.25, 0.5)
                                   : space.padding.mode == Feature::always  ? *gen::element(0.25, 0.5)
                                                                            : 0.0;
    }
    p.store_intermediate_states = *maybe(space.intermediate_states, 1, 4);
    p.input_dtype = *gen::elementOf(space.input_dtypes);
    p.gate_dtype = p.input_dtype != DType::f32 && *maybe(space.gate_in_input_dtype, 1, 2) ? p.input_dtype
                                                                                         : DType::f32;
    p.gate_mode = *maybe(space.fused_gates, 1, 2) ? GateMode::fused : GateMode::direct;
    const bool negative = *maybe(space.negative_eigenvalues, 1, 2);
    if (p.gate_mode == GateMode::fused) p.allow_negative_eigenvalues = negative;
    if (*maybe(space.explicit_scale, 1, 3)) {
      p.scale = !space.scale_values.empty() ? *gen::elementOf(space.scale_values)
                : space.continuous_scale
                    ? *gen::weightedOneOf<double>(
                          {{3, gen::element(1.0, 0.5, 0.125)},
                           {1, gen::map(gen::inRange(50, 1001), [](int m) { return m / 1000.0; })}})
                    : *gen::element(1.0, 0.5, 0.125);
    }

    c.options.regime = *gen::elementOf(space.regimes);
    c.options.beta_max = (negative && p.gate_mode == GateMode::direct) ? 2.0 : 1.0;
    c.options.unit_keys = !*maybe(space.raw_keys, 1, 3);
    c.options.state_scale = *gen::element(0.5, 0.5, 0.0, 2.0);
    c.options.small_norms = p.use_qk_l2norm && *maybe(space.small_norms, 1, 3);
    c.seed = *gen::arbitrary<std::uint64_t>();
    // The storage conventions, drawn last and only from sets of more than one, so that a space
    // that leaves them at their defaults draws exactly the cases it drew before they existed.
    p.state_dtype = space.state_dtypes.size() == 1 ? space.state_dtypes.front() : *gen::elementOf(space.state_dtypes);
    const bool log_allowed =
        std::find(space.gate_spaces.begin(), space.gate_spaces.end(), GateSpace::log) != space.gate_spaces.end();
    if (!log_allowed && p.gate_mode == GateMode::fused) {
      p.gate_mode = GateMode::direct;  // linear gates only: direct gates with beta as drawn above
      p.allow_negative_eigenvalues = false;
      c.options.beta_max = negative ? 2.0 : 1.0;
    }
    if (p.gate_mode == GateMode::direct)
      p.gate_space = space.gate_spaces.size() == 1 ? space.gate_spaces.front() : *gen::elementOf(space.gate_spaces);
    p.validate();
    return c;
  });
}

}  // namespace gdn::fuzz
