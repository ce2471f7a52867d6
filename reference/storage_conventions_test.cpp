// The storage conventions of serving kernels (docs/semantics.md §3, §7): linear-space gates
// (alpha = exp(g) given) and reduced-precision states (Problem::state_dtype). The references
// define both through the existing operator: a linear gate is g = log(alpha) in the reference's
// scalar, and a bf16/fp16 state is rounded only where a kernel stores it (hT, per-token
// states), never inside the recurrence; the exact references ignore the state dtype.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "fuzz/generators.hpp"
#include "fuzz/sample.hpp"
#include "oracle/budget.hpp"
#include "reference/chunked.hpp"
#include "reference/emulate.hpp"
#include "reference/precision.hpp"
#include "reference/sequential.hpp"

namespace {

using namespace gdn;

// A log-space case turned into its linear-space twin: alpha = exp(g) in double, the gates in
// f64 so that alpha is exact (f64 inputs allow an f64 gate dtype).
struct Twins {
  Problem log, linear;
  Inputs log_in, linear_in;
};

Twins twins(std::uint64_t seed) {
  fuzz::CaseSpace space = fuzz::CaseSpace::everything();
  space.fused_gates = false;
  space.input_dtypes = {DType::f64};
  space.max_work = 2e5;
  fuzz::Case c = fuzz::draw_case(seed, space);
  c.problem.gate_dtype = DType::f64;
  Twins t;
  t.linear = c.problem;
  t.linear.gate_space = GateSpace::linear;
  t.linear_in = c.inputs();
  for (std::int64_t i = 0; i < t.linear_in.g.numel(); ++i) t.linear_in.g[i] = std::exp(t.linear_in.g[i]);
  t.log = c.problem;
  t.log_in = t.linear_in;
  for (std::int64_t i = 0; i < t.log_in.g.numel(); ++i) t.log_in.g[i] = std::log(t.linear_in.g[i]);
  return t;
}

}  // namespace

TEST_CASE("linear gates are g = log(alpha) in the reference's scalar", "[reference][gate_space]") {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    const Twins t = twins(seed);
    INFO(t.linear.describe());
    // The double reference takes log(alpha) in double: exactly the log-space problem with those g.
    const auto a = reference::sequential<double>(t.linear, t.linear_in);
    const auto b = reference::sequential<double>(t.log, t.log_in);
    CHECK(a.o == b.o);
    CHECK(a.hT == b.hT);
    CHECK(a.intermediate == b.intermediate);
    // The chunked form and long double agree with it to the references' accuracy.
    if (!t.linear.store_intermediate_states) {
      const auto c = reference::chunked<double>(t.linear, t.linear_in, 16);
      CHECK(oracle::difference(a.o, c.o).max_abs <= 1e-11 * std::max(1.0, oracle::max_abs(a.o)));
    }
    const auto l = reference::sequential<long double>(t.linear, t.linear_in).cast<double>();
    CHECK(oracle::difference(a.o, l.o).max_abs <= 1e-11 * std::max(1.0, oracle::max_abs(a.o)));
  }
}

TEST_CASE("alpha = 0 is the hard reset g = -inf, alpha = 1 no decay", "[reference][gate_space]") {
  Problem p = Problem::packed({5, 3}, 1, 2, 4, 3);
  p.has_h0 = p.has_hT = true;
  fuzz::InputOptions options;
  Inputs log_in = fuzz::make_inputs(p, options, 7);
  Problem linear = p;
  linear.gate_space = GateSpace::linear;
  Inputs linear_in = log_in;
  for (std::int64_t i = 0; i < log_in.g.numel(); ++i) {
    const bool reset = i % 5 == 2;
    log_in.g[i] = reset ? -std::numeric_limits<double>::infinity() : 0.0;
    linear_in.g[i] = reset ? 0.0 : 1.0;
  }
  for (int C : {1, 2, 3, 64}) {
    CHECK(reference::chunked<double>(linear, linear_in, C).o == reference::chunked<double>(p, log_in, C).o);
    CHECK(reference::chunked<double>(linear, linear_in, C).hT == reference::chunked<double>(p, log_in, C).hT);
  }
  CHECK(reference::sequential<double>(linear, linear_in).hT == reference::sequential<double>(p, log_in).hT);
  // The fp32 emulation reads alpha through the same log.
  CHECK(reference::emulate(linear, linear_in, Formulation::sequential).o ==
        reference::emulate(p, log_in, Formulation::sequential).o);
}

TEST_CASE("state_dtype: exact references unchanged, emulation rounds what is stored", "[reference][state_dtype]") {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    fuzz::CaseSpace space = fuzz::CaseSpace::everything();
    space.max_work = 2e5;
    space.state_dtypes = {DType::bf16, DType::f16};
    const fuzz::Case c = fuzz::draw_case(seed, space);
    const Problem& p = c.problem;
    REQUIRE(p.state_dtype != DType::f32);
    const Inputs in = c.inputs();
    INFO(p.describe());
    if (in.h0.defined()) CHECK(reference::representable(p.state_dtype, in.h0));
    Problem f32_state = p;
    f32_state.state_dtype = DType::f32;
    const auto exact = reference::sequential<double>(p, in);
    const auto exact_f32 = reference::sequential<double>(f32_state, in);
    CHECK(exact.o == exact_f32.o);
    CHECK(exact.hT == exact_f32.hT);
    CHECK(exact.intermediate == exact_f32.intermediate);
    // The emulation keeps its running state in fp32 (o is unchanged) and rounds each stored
    // state once: it equals the fp32-state emulation rounded to the state dtype.
    const auto emulated = reference::emulate(p, in, Formulation::sequential);
    auto expected = reference::emulate(f32_state, in, Formulation::sequential);
    CHECK(emulated.o == expected.o);
    reference::round_in_place(p.state_dtype, expected.hT);
    reference::round_in_place(p.state_dtype, expected.intermediate);
    CHECK(emulated.hT == expected.hT);
    CHECK(emulated.intermediate == expected.intermediate);
    CHECK(reference::representable(p.state_dtype, emulated.hT));
  }
}
