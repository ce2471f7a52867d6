// The case generator covers what the property suite promises to explore:
// K and V from 1 to 256 including odd sizes, lengths 0, 1, C-1, C, C+1 and long ones, every
// gate regime, beta in [0, 1] and [0, 2), every feature and dtype; and its cost stays bounded
// by RapidCheck's size. Sampled without RapidCheck's runner, from fixed seeds.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <set>

#include "fuzz/generators.hpp"
#include "fuzz/sample.hpp"
#include "reference/precision.hpp"

namespace {

using namespace gdn;
using fuzz::Case;
using fuzz::CaseSpace;

std::vector<Case> sample(const CaseSpace& space, int count, std::uint64_t seed) {
  const auto generator = fuzz::gen_case(space);
  std::mt19937_64 rng(seed);
  std::vector<Case> cases;
  for (int i = 0; i < count; ++i)
    cases.push_back(generator(rc::Random(rng()), static_cast<int>(i % 101)).value());
  return cases;
}

}  // namespace

TEST_CASE("generated cases cover sizes, lengths, regimes and features", "[generators]") {
  for (int C : {1, 7, 64, 65}) {
    INFO("chunk size " << C);
    const CaseSpace space = CaseSpace::chunked(C);
    const std::vector<Case> cases = sample(space, 3000, 1000 + C);
    std::set<int> Ks, Vs;
    std::set<std::int64_t> lengths;
    std::set<fuzz::GateRegime> regimes;
    std::set<DType> dtypes;
    bool gva = false, l2norm = false, h0 = false, hT = false, v_major = false, cache = false, padding = false,
         fused = false, negative_fused = false, beta2 = false, gate_in_dtype = false, scale = false, multi = false;
    std::int64_t longest = 0;
    for (const Case& c : cases) {
      const Problem& p = c.problem;
      REQUIRE_NOTHROW(p.validate());
      Ks.insert(p.K);
      Vs.insert(p.V);
      for (int n = 0; n < p.N(); ++n) {
        lengths.insert(p.seq_len(n));
        longest = std::max(longest, p.seq_len(n));
      }
      regimes.insert(c.options.regime);
      dtypes.insert(p.input_dtype);
      gva |= p.HV > p.H;
      l2norm |= p.use_qk_l2norm;
      h0 |= p.has_h0;
      hT |= p.has_hT;
      v_major |= p.state_layout == StateLayout::v_major;
      cache |= p.uses_state_cache();
      padding |= p.uses_state_cache() && c.options.padding_fraction > 0;
      fused |= p.gate_mode == GateMode::fused;
      negative_fused |= p.allow_negative_eigenvalues;
      beta2 |= p.gate_mode == GateMode::direct && c.options.beta_max == 2.0;
      gate_in_dtype |= p.gate_dtype != DType::f32;
      scale |= p.scale.has_value();
      multi |= p.N() >= 3;
      CHECK(p.K <= 256);
      CHECK(p.V <= 256);
      CHECK(p.T <= space.max_tokens);
    }
    for (int d : {1, 2, 3, 15, 16, 17, 63, 64, 65, 127, 128, 129, 255, 256}) {
      CHECK(Ks.count(d) == 1);
      CHECK(Vs.count(d) == 1);
    }
    int odd_K = 0;
    for (int d : Ks) odd_K += d % 2;
    CHECK(odd_K >= 20);
    for (std::int64_t l : {std::int64_t(0), std::int64_t(1), std::int64_t(C - 1), std::int64_t(C), std::int64_t(C + 1)})
      CHECK(lengths.count(l) == 1);
    CHECK(longest >= 2 * C);
    CHECK(regimes.size() == 4);
    CHECK(dtypes.size() == 3);
    CHECK(gva);
    CHECK(l2norm);
    CHECK(h0);
    CHECK(hT);
    CHECK(v_major);
    CHECK(cache);
    CHECK(padding);
    CHECK(fused);
    CHECK(negative_fused);
    CHECK(beta2);
    CHECK(gate_in_dtype);
    CHECK(scale);
    CHECK(multi);
  }
}

TEST_CASE("the cost of a case is bounded by RapidCheck's size", "[generators]") {
  CaseSpace space;
  space.max_work = 1e6;
  const auto generator = fuzz::gen_case(space);
  std::mt19937_64 rng(5);
  for (int size : {0, 10, 50, 100}) {
    for (int i = 0; i < 300; ++i) {
      const Case c = generator(rc::Random(rng()), size).value();
      // The budget is max_work (size + 1) / 101; lengths are fitted to it, except that a case
      // may hold up to 3 tokens and one C+1-long sequence when heads alone exceed it.
      const double cap = std::max(space.min_work, space.max_work * (size + 1) / 101.0);
      const double per_token = double(c.problem.HV) * c.problem.K * c.problem.V;
      INFO(c);
      CHECK(c.work() <= cap + per_token * (space.chunk_size + 4));
    }
  }
}

TEST_CASE("restricted spaces are respected", "[generators]") {
  CaseSpace space;
  space.max_K = 64;
  space.max_V = 32;
  space.gva = false;
  space.l2norm = false;
  space.state_cache = false;
  space.fused_gates = false;
  space.negative_eigenvalues = false;
  space.v_major = false;
  space.input_dtypes = {DType::bf16};
  space.gate_in_input_dtype = false;
  space.regimes = {fuzz::GateRegime::strong};
  for (const Case& c : sample(space, 500, 9)) {
    const Problem& p = c.problem;
    CHECK(p.K <= 64);
    CHECK(p.V <= 32);
    CHECK(p.HV == p.H);
    CHECK_FALSE(p.use_qk_l2norm);
    CHECK_FALSE(p.uses_state_cache());
    CHECK(p.gate_mode == GateMode::direct);
    CHECK(c.options.beta_max == 1.0);
    CHECK(p.state_layout == StateLayout::k_major);
    CHECK(p.input_dtype == DType::bf16);
    CHECK(p.gate_dtype == DType::f32);
    CHECK(c.options.regime == fuzz::GateRegime::strong);
  }
  CaseSpace empty;
  empty.input_dtypes.clear();
  CHECK_THROWS_AS(fuzz::gen_case(empty), std::invalid_argument);
}

TEST_CASE("K_multiple: every K is a multiple within max_K, V stays free", "[generators]") {
  CaseSpace space;  // the chunked prefill's space: K in {16, 32, ..., 128}
  space.max_K = 128;
  space.K_multiple = 16;
  std::set<int> Ks, odd_Vs;
  for (const Case& c : sample(space, 500, 13)) {
    CHECK(c.problem.K % 16 == 0);
    CHECK(c.problem.K >= 16);
    CHECK(c.problem.K <= 128);
    Ks.insert(c.problem.K);
    if (c.problem.V % 2 == 1) odd_Vs.insert(c.problem.V);
  }
  CHECK(Ks.count(16) == 1);
  CHECK(Ks.count(128) == 1);
  CHECK(odd_Vs.size() > 3);
  CaseSpace bad;
  bad.max_K = 8;
  bad.K_multiple = 16;
  CHECK_THROWS_AS(fuzz::gen_case(bad), std::invalid_argument);
}

TEST_CASE("a case prints everything needed to rebuild it", "[generators]") {
  Case c;
  c.problem = Problem::packed({3, 0, 5}, 1, 2, 4, 3);
  c.options.regime = fuzz::GateRegime::underflow;
  c.seed = 12345;
  std::ostringstream s;
  s << c;
  CHECK_THAT(s.str(), Catch::Matchers::Contains("cu_seqlens=[0,3,3,8]"));
  CHECK_THAT(s.str(), Catch::Matchers::Contains("regime=underflow"));
  CHECK_THAT(s.str(), Catch::Matchers::Contains("seed=12345"));
  CHECK_THAT(s.str(), Catch::Matchers::Contains("K=4"));
  // Deterministic data.
  CHECK(c.inputs().q == c.inputs().q);
  CHECK(c.inputs().v == c.inputs().v);
}

TEST_CASE("the second chunk boundary is drawn on purpose", "[generators]") {
  for (int C : {7, 64}) {
    std::set<std::int64_t> lengths;
    for (const Case& c : sample(CaseSpace::chunked(C), 2000, 77 + C))
      for (int n = 0; n < c.problem.N(); ++n) lengths.insert(c.problem.seq_len(n));
    for (std::int64_t l : {2 * C - 1, 2 * C, 2 * C + 1}) CHECK(lengths.count(l) == 1);
  }
}

TEST_CASE("Feature: off never, always always", "[generators]") {
  CaseSpace space;
  space.state_cache = fuzz::Feature::always;
  space.l2norm = fuzz::Feature::always;
  space.gva = fuzz::Feature::always;
  space.fused_gates = false;
  for (const Case& c : sample(space, 300, 21)) {
    CHECK(c.problem.uses_state_cache());
    CHECK(c.problem.use_qk_l2norm);
    CHECK(c.problem.HV > c.problem.H);
    CHECK(c.problem.gate_mode == GateMode::direct);
  }
  CaseSpace bad;
  bad.max_group = 1;
  bad.gva = fuzz::Feature::always;
  CHECK_THROWS_AS(fuzz::gen_case(bad), std::invalid_argument);
}

// What the GPU suites drew with their own generators, each still drawn from the presets (and
// each restriction of the kernel's space respected), through draw_case as the suites call it.
namespace {
struct Seen {
  std::set<int> H, group, K, V, N, extra_slots;
  std::set<std::int64_t> lengths;
  std::set<fuzz::GateRegime> regimes;
  std::set<DType> dtypes;
  bool l2norm = false, no_l2norm = false, h0 = false, no_h0 = false, hT = false, no_hT = false, v_major = false,
       k_major = false, cache = false, dense = false, padding = false, fused = false, negative_fused = false,
       beta2 = false, gate_in_dtype = false, gate_f32 = false, scale_fraction = false, intermediate = false,
       equal_lengths = true;
};
Seen draw(const CaseSpace& space, int count) {
  Seen s;
  for (int i = 0; i < count; ++i) {
    const Case c = fuzz::draw_case(std::uint64_t(i) * 0x9E3779B97F4A7C15ull + 3, space);
    const Problem& p = c.problem;
    REQUIRE_NOTHROW(p.validate());
    CHECK(c.work() <= space.max_work + double(p.HV) * p.K * p.V * (space.chunk_size + 4));
    s.H.insert(p.H);
    s.group.insert(p.group_size());
    s.K.insert(p.K);
    s.V.insert(p.V);
    s.N.insert(p.N());
    for (int n = 0; n < p.N(); ++n) {
      s.lengths.insert(p.seq_len(n));
      s.equal_lengths = s.equal_lengths && p.seq_len(n) == p.seq_len(0);
    }
    s.regimes.insert(c.options.regime);
    s.dtypes.insert(p.input_dtype);
    (p.use_qk_l2norm ? s.l2norm : s.no_l2norm) = true;
    (p.has_h0 ? s.h0 : s.no_h0) = true;
    (p.has_hT ? s.hT : s.no_hT) = true;
    (p.state_layout == StateLayout::v_major ? s.v_major : s.k_major) = true;
    (p.uses_state_cache() ? s.cache : s.dense) = true;
    if (p.uses_state_cache()) {
      s.extra_slots.insert(static_cast<int>(p.state_slots - p.N()));
      for (std::int32_t slot : c.inputs().state_indices) s.padding |= slot < 0;
    }
    s.fused |= p.gate_mode == GateMode::fused;
    s.negative_fused |= p.allow_negative_eigenvalues;
    s.beta2 |= p.gate_mode == GateMode::direct && c.options.beta_max == 2.0;
    (p.gate_dtype != DType::f32 ? s.gate_in_dtype : s.gate_f32) = true;
    if (p.scale) s.scale_fraction |= *p.scale != 1.0 && *p.scale != 0.5 && *p.scale != 0.125;
    s.intermediate |= p.store_intermediate_states;
    CHECK(c.options.unit_keys);  // contractive inputs only
  }
  return s;
}
template <class T>
bool has_all(const std::set<T>& seen, std::initializer_list<T> wanted) {
  for (const T& x : wanted)
    if (!seen.count(x)) return false;
  return true;
}
void common_features(const Seen& s) {
  CHECK(has_all(s.H, {1, 2, 4}));
  CHECK(has_all(s.group, {1, 2, 3, 4}));
  CHECK(s.regimes.size() == 4);
  CHECK(s.dtypes.size() == 3);
  CHECK((s.l2norm && s.no_l2norm));
  CHECK((s.fused && s.negative_fused && s.beta2));
  CHECK((s.gate_in_dtype && s.gate_f32));
  CHECK(s.scale_fraction);
}
}  // namespace

TEST_CASE("preset recurrent_prefill: what the recurrent kernel's suite drew", "[generators][presets]") {
  const Seen s = draw(CaseSpace::recurrent_prefill(), 3000);
  common_features(s);
  CHECK(has_all(s.N, {1, 2, 3, 4, 5, 6}));
  CHECK(*s.N.rbegin() <= 6);
  CHECK(has_all(s.K, {1, 2, 3, 15, 16, 17, 31, 33, 63, 65, 127, 128, 129, 255, 256}));
  CHECK(has_all(s.V, {1, 2, 3, 15, 16, 17, 31, 33, 63, 65, 127, 128, 129, 255, 256}));
  CHECK(has_all<std::int64_t>(s.lengths, {0, 1, 2, 24, 63, 64, 65, 128, 129}));
  CHECK(*s.lengths.rbegin() >= 160);
  CHECK((s.h0 && s.no_h0 && s.hT && s.no_hT && s.v_major && s.k_major));
  CHECK((s.cache && s.dense && s.padding && s.intermediate));
  CHECK(has_all(s.extra_slots, {0, 1, 2, 3}));
}

TEST_CASE("preset decode: equal lengths 1..4 against a state cache", "[generators][presets]") {
  const Seen s = draw(CaseSpace::decode(), 3000);
  common_features(s);
  CHECK(s.equal_lengths);
  CHECK(s.lengths == std::set<std::int64_t>{1, 2, 3, 4});
  CHECK(has_all(s.N, {1, 2, 3, 4, 5, 6, 7, 8}));
  CHECK(*s.N.rbegin() <= 8);
  CHECK(has_all(s.K, {1, 15, 16, 17, 64, 128, 255, 256}));
  CHECK((s.cache && !s.dense && s.padding));
  CHECK(has_all(s.extra_slots, {0, 1, 2, 3, 4}));
  CHECK((s.h0 && s.no_h0 && s.hT && s.no_hT && s.v_major && s.k_major && s.intermediate));
}

TEST_CASE("preset chunked_prefill: K, V multiples of 16, dense k_major states, two chunk boundaries",
          "[generators][presets]") {
  const Seen s = draw(CaseSpace::chunked_prefill(), 3000);
  common_features(s);
  for (int k : s.K) CHECK((k % 16 == 0 && k >= 16 && k <= 128));
  for (int v : s.V) CHECK((v % 16 == 0 && v >= 16 && v <= 256));
  CHECK(has_all(s.K, {16, 32, 48, 64, 80, 96, 112, 128}));
  CHECK(has_all(s.V, {16, 32, 48, 64, 96, 128, 144, 192, 256}));
  CHECK(has_all<std::int64_t>(s.lengths, {0, 1, 2, 62, 63, 64, 65, 127, 128, 129}));
  CHECK(*s.lengths.rbegin() >= 300);
  CHECK(has_all(s.N, {1, 2, 3, 4, 5}));
  CHECK((s.h0 && s.no_h0 && s.hT && s.no_hT));
  CHECK((s.dense && !s.cache && s.k_major && !s.v_major && !s.intermediate));
}

TEST_CASE("state dtypes and gate spaces: drawn only from sets of two or more", "[generators][storage]") {
  const CaseSpace base = CaseSpace::everything();
  CaseSpace bf16 = base;
  bf16.state_dtypes = {DType::bf16};
  CaseSpace linear = base;
  linear.gate_spaces = {GateSpace::linear};
  linear.fused_gates = false;
  CaseSpace direct = base;
  direct.fused_gates = false;
  // A set of one draws nothing: the same cases as without the axis, but for the pinned field.
  for (std::uint64_t seed = 1; seed <= 200; ++seed) {
    const Case a = fuzz::draw_case(seed, base), b = fuzz::draw_case(seed, bf16);
    CHECK(b.problem.state_dtype == DType::bf16);
    Problem expected = a.problem;
    expected.state_dtype = DType::bf16;
    CHECK(b.describe() == Case{expected, a.options, a.seed}.describe());
    const Case c = fuzz::draw_case(seed, direct), d = fuzz::draw_case(seed, linear);
    CHECK(d.problem.gate_space == GateSpace::linear);
    CHECK(d.seed == c.seed);
    // The inputs: h0 representable in the state dtype; alpha = round(exp(g)) of the same draw.
    const Inputs in_b = b.inputs();
    if (in_b.h0.defined()) CHECK(reference::representable(DType::bf16, in_b.h0));
    const Inputs in_c = c.inputs(), in_d = d.inputs();
    for (std::int64_t i = 0; i < in_d.g.numel(); ++i) {
      CHECK(in_d.g[i] >= 0.0);
      CHECK(in_d.g[i] <= 1.0);
      // Both rounded once from the same raw draw: alpha is exp(g) to one rounding of each
      // (g = -1e4, the underflow regime's reset, gives alpha = 0).
      const double g = in_c.g[i], u = unit_roundoff(d.problem.gate_dtype);
      if (g <= -1e4) CHECK(in_d.g[i] == 0.0);
      else CHECK(std::fabs(in_d.g[i] - std::exp(g)) <= (2 + std::fabs(g)) * u * std::exp(g));
    }
  }
  // Sets of two give both values; linear gates only with direct gates.
  CaseSpace both = base;
  both.state_dtypes = {DType::f32, DType::bf16, DType::f16};
  both.gate_spaces = {GateSpace::log, GateSpace::linear};
  std::set<DType> states;
  std::set<GateSpace> gates;
  for (const Case& c : sample(both, 300, 5)) {
    states.insert(c.problem.state_dtype);
    if (c.problem.gate_mode == GateMode::direct) gates.insert(c.problem.gate_space);
    CHECK((c.problem.gate_mode == GateMode::direct || c.problem.gate_space == GateSpace::log));
  }
  CHECK(states.size() == 3);
  CHECK(gates.size() == 2);
  // Without log in the set, every case has direct gates.
  CaseSpace only_linear = base;
  only_linear.gate_spaces = {GateSpace::linear};
  for (const Case& c : sample(only_linear, 100, 6)) CHECK(c.problem.linear_gates());
}

TEST_CASE("state dtypes and gate spaces in the space's JSON and its checks", "[generators][storage]") {
  CaseSpace s = CaseSpace::decode();
  s.state_dtypes = {DType::f32, DType::bf16};
  s.gate_spaces = {GateSpace::linear};
  const nlohmann::json j = fuzz::to_json(s);
  CHECK(j.at("state_dtypes") == nlohmann::json::array({"f32", "bf16"}));
  CHECK(j.at("gate_spaces") == nlohmann::json::array({"linear"}));
  const CaseSpace back = fuzz::case_space_from_json(j);
  CHECK(back.state_dtypes == s.state_dtypes);
  CHECK(back.gate_spaces == s.gate_spaces);
  // The defaults: f32 states, log gates.
  CHECK(fuzz::to_json(CaseSpace{}).at("state_dtypes") == nlohmann::json::array({"f32"}));
  CHECK(fuzz::to_json(CaseSpace{}).at("gate_spaces") == nlohmann::json::array({"log"}));
  auto error = [](nlohmann::json space) {
    try {
      fuzz::case_space_from_json(space);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  CHECK_THAT(error({{"state_dtypes", {"f64"}}}), Catch::Contains("state_dtypes must be f32, bf16 or f16"));
  CHECK_THAT(error({{"state_dtypes", nlohmann::json::array()}}), Catch::Contains("state_dtypes is empty"));
  CHECK_THAT(error({{"gate_spaces", {"exp"}}}), Catch::Contains("'gate_spaces' must hold gate spaces"));
  CHECK_THAT(error({{"gate_spaces", {"linear"}}, {"fused_gates", "always"}}),
             Catch::Contains("fused_gates always needs log in gate_spaces"));
}
