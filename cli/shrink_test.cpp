#include <catch2/catch.hpp>

#include <cmath>

#include "cli/shrink.hpp"
#include "fuzz/inputs.hpp"
#include "reference/precision.hpp"
#include "reference/sequential.hpp"

using namespace gdn;
using namespace gdn::cli;

namespace {

ConcreteCase make(Problem p, std::uint64_t seed) {
  return {p, fuzz::make_inputs(p, {}, seed)};
}

}  // namespace

TEST_CASE("apply(select_all) is the identity", "[cli][shrink]") {
  Problem p = Problem::packed({3, 0, 5}, 2, 4, 5, 3);
  p.has_h0 = p.has_hT = true;
  p.state_layout = StateLayout::v_major;
  const ConcreteCase c = make(p, 1);
  const ConcreteCase same = apply(c, select_all(p));
  CHECK(same.problem.cu_seqlens == p.cu_seqlens);
  CHECK(same.inputs.q == c.inputs.q);
  CHECK(same.inputs.v == c.inputs.v);
  CHECK(same.inputs.g == c.inputs.g);
  CHECK(same.inputs.h0 == c.inputs.h0);
}

TEST_CASE("selected sequences and heads compute what they computed inside the whole case", "[cli][shrink]") {
  // Varlen independence and GVA head mapping make this exact: the slice's outputs are the
  // corresponding rows of the whole case's outputs, bit for bit (same arithmetic per head).
  Problem p = Problem::packed({4, 6, 3}, 2, 6, 4, 3);  // group 3
  p.has_h0 = p.has_hT = true;
  const ConcreteCase c = make(p, 2);
  const Outputs<double> whole = reference::sequential<double>(c.problem, c.inputs);
  Selection s = select_all(p);
  s.sequences = {{2, 3}, {1, 4}};  // sequence 2 whole, then the first 4 tokens of sequence 1
  s.query_heads = {0};
  s.value_heads = {0, 1};  // value heads 0 and 1 of query head 0
  const ConcreteCase part = apply(c, s);
  REQUIRE(part.problem.T == 7);
  REQUIRE(part.problem.HV == 2);
  const Outputs<double> sliced = reference::sequential<double>(part.problem, part.inputs);
  const int V = p.V;
  for (int t = 0; t < 7; ++t) {
    const int original_token = t < 3 ? 10 + t : 4 + (t - 3);
    for (int j = 0; j < 2; ++j)
      for (int v = 0; v < V; ++v)
        CHECK(sliced.o[(t * 2 + j) * V + v] == whole.o[(original_token * p.HV + j) * V + v]);
  }
  // hT of new sequence 0 is hT of original sequence 2 (it kept all its tokens).
  const std::int64_t block = std::int64_t(p.K) * p.V;
  for (int j = 0; j < 2; ++j)
    for (std::int64_t e = 0; e < block; ++e)
      CHECK(sliced.hT[j * block + e] == whole.hT[(2 * p.HV + j) * block + e]);
}

TEST_CASE("state cache slices keep every slot and the chosen indices", "[cli][shrink]") {
  Problem p = Problem::packed({2, 1, 3}, 1, 2, 3, 3);
  p.state_slots = 5;
  p.has_h0 = p.has_hT = true;
  ConcreteCase c = make(p, 3);
  c.inputs.state_indices = {4, -1, 0};
  Selection s = select_all(p);
  s.sequences = {{2, 3}};
  const ConcreteCase part = apply(c, s);
  CHECK(part.problem.state_slots == 5);
  CHECK(part.inputs.state_indices == std::vector<std::int32_t>{0});
  CHECK(part.inputs.h0.shape() == Shape{5, 2, 3, 3});
}

TEST_CASE("a single value head of the second group keeps its own query head", "[cli][shrink]") {
  Problem p = Problem::packed({5}, 2, 4, 3, 2);  // group 2: value head 3 reads query head 1
  const ConcreteCase c = make(p, 8);
  const Outputs<double> whole = reference::sequential<double>(c.problem, c.inputs);
  Selection s = select_all(p);
  s.query_heads = {1};
  s.value_heads = {3};
  const ConcreteCase part = apply(c, s);
  const Outputs<double> sliced = reference::sequential<double>(part.problem, part.inputs);
  for (int t = 0; t < 5; ++t)
    for (int v = 0; v < 2; ++v) CHECK(sliced.o[t * 2 + v] == whole.o[(t * 4 + 3) * 2 + v]);
  s.value_heads = {1};  // belongs to query head 0, not 1
  CHECK_THROWS_AS(apply(c, s), ProblemError);
}

TEST_CASE("a bad selection is a ProblemError", "[cli][shrink]") {
  const ConcreteCase c = make(Problem::packed({2}, 1, 1, 2, 2), 4);
  Selection s = select_all(c.problem);
  s.K = 3;
  CHECK_THROWS_AS(apply(c, s), ProblemError);
  s = select_all(c.problem);
  s.sequences = {{0, 5}};
  CHECK_THROWS_AS(apply(c, s), ProblemError);
}

TEST_CASE("shrinking reaches the smallest case a known predicate fails on", "[cli][shrink]") {
  // A synthetic failure: any case with a sequence of >= 10 tokens and K >= 3 "fails".
  Problem p = Problem::packed({7, 40, 25}, 2, 4, 16, 9);
  p.has_h0 = p.has_hT = true;
  p.use_qk_l2norm = true;
  p.input_dtype = DType::bf16;
  const ConcreteCase c = make(p, 5);
  auto fails = [](const ConcreteCase& x) {
    std::int64_t longest = 0;
    for (int n = 0; n < x.problem.N(); ++n) longest = std::max(longest, x.problem.seq_len(n));
    return longest >= 10 && x.problem.K >= 3;
  };
  REQUIRE(fails(c));
  const ShrinkResult r = shrink(c, fails);
  const Problem& s = r.smallest.problem;
  INFO(s.describe());
  CHECK(s.N() == 1);
  CHECK(s.T == 10);
  CHECK(s.K == 3);
  CHECK(s.V == 1);
  CHECK(s.H == 1);
  CHECK(s.HV == 1);
  CHECK_FALSE(s.has_h0);
  CHECK_FALSE(s.has_hT);
  CHECK_FALSE(s.use_qk_l2norm);
  CHECK(s.input_dtype == DType::f32);
  CHECK_FALSE(r.stopped_early);
  CHECK(r.accepted == static_cast<int>(r.steps.size()));
  CHECK(case_size(r.smallest) < case_size(c) / 50);
}

TEST_CASE("shrinking stops at its evaluation limit with the best case so far", "[cli][shrink]") {
  const ConcreteCase c = make(Problem::packed({50, 50}, 1, 1, 8, 8), 6);
  ShrinkOptions options;
  options.max_evaluations = 3;
  const ShrinkResult r = shrink(c, [](const ConcreteCase&) { return true; }, options);
  CHECK(r.evaluations == 3);
  CHECK(r.stopped_early);
  CHECK(case_size(r.smallest) < case_size(c));
}

TEST_CASE("dropping l2norm keeps q and k as the l2norm made them, so the case stays contractive",
          "[cli][shrink]") {
  // Under l2norm the sampler draws raw N(0, 1) keys (|k|^2 ~ K); a shrink step that dropped the
  // l2norm and kept them would hand on a growing recurrence, a different failure. The predicate
  // accepts every candidate without l2norm, so the step is taken.
  Problem p = Problem::packed({6}, 1, 1, 16, 8);
  p.input_dtype = DType::bf16;
  p.use_qk_l2norm = true;
  p.has_hT = true;
  const ConcreteCase c = make(p, 5);
  const Outputs<double> before = reference::sequential<double>(p, c.inputs);
  // Every other candidate is refused: the shapes and the dtype stay.
  const ShrinkResult r = shrink(c, [](const ConcreteCase& x) {
    const Problem& q = x.problem;
    return !q.use_qk_l2norm && q.T == 6 && q.K == 16 && q.V == 8 && q.has_hT && q.input_dtype == DType::bf16;
  });
  REQUIRE_FALSE(r.smallest.problem.use_qk_l2norm);
  REQUIRE(r.smallest.inputs.q.numel() == c.inputs.q.numel());
  for (const HostTensor<double>* t : {&r.smallest.inputs.q, &r.smallest.inputs.k})
    for (std::int64_t row = 0; row < 6; ++row) {
      double sum = 0;
      for (int i = 0; i < 16; ++i) sum += (*t)[row * 16 + i] * (*t)[row * 16 + i];
      CHECK(std::abs(std::sqrt(sum) - 1.0) < 0x1p-6);  // unit, up to bf16 rounding
      for (int i = 0; i < 16; ++i) CHECK(reference::round_to(DType::bf16, (*t)[row * 16 + i]) == (*t)[row * 16 + i]);
    }
  // The same outputs up to the rounding of the normalised vectors.
  const Outputs<double> after = reference::sequential<double>(r.smallest.problem, r.smallest.inputs);
  REQUIRE(after.o.numel() == before.o.numel());
  for (std::int64_t i = 0; i < before.o.numel(); ++i) CHECK(std::abs(after.o[i] - before.o[i]) < 0.05 * (1 + std::abs(before.o[i])));
}
