#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>
#include <rapidcheck.h>

#include "fuzz/catch_properties.hpp"
#include "fuzz/inputs.hpp"
#include "oracle/arithmetic_floor.hpp"
#include "oracle/budget.hpp"
#include "oracle/case_file.hpp"
#include "oracle/implementations.hpp"
#include "oracle/registry.hpp"
#include "reference/chunked.hpp"
#include "reference/emulate.hpp"
#include "reference/operand_model.hpp"
#include "reference/precision.hpp"
#include "reference/sequential.hpp"

using namespace gdn;
using namespace gdn::oracle;

namespace {

Problem f32_problem() {
  Problem p = Problem::packed({150, 7, 90}, 2, 4, 32, 16);
  p.has_h0 = true;
  p.has_hT = true;
  return p;
}

// exact + s * (emulation - exact): an implementation whose error is exactly s times the
// emulation's, element by element.
Outputs<double> scaled_error(const Outputs<double>& exact, const Outputs<double>& emulated, double s) {
  Outputs<double> out = exact;
  for (std::int64_t i = 0; i < out.o.numel(); ++i) out.o[i] = exact.o[i] + s * (emulated.o[i] - exact.o[i]);
  for (std::int64_t i = 0; i < out.hT.numel(); ++i) out.hT[i] = exact.hT[i] + s * (emulated.hT[i] - exact.hT[i]);
  return out;
}

}  // namespace

// The rel_rms check of tensor o.
const Check& rel_rms_check(const Verdict& v) {
  for (const Check& c : v.checks)
    if (c.tensor == OutputTensor::o && c.metric == "rel_rms") return c;
  FAIL("no o.rel_rms check");
  return v.checks.front();
}

TEST_CASE("calibrated: equal to the emulation passes, 1.5x passes, 3x worse fails", "[oracle][budget]") {
  const Problem p = f32_problem();
  const Inputs in = fuzz::make_inputs(p, {}, 11);
  const Outputs<double> exact = reference::sequential<double>(p, in);
  const Outputs<double> emulated = reference::emulate(p, in, Formulation::sequential);
  BudgetOptions options;  // calibrated, factor 2, floor 1 u
  const Verdict baseline = judge(p, &in, exact, emulated, &emulated, Formulation::sequential, options);
  REQUIRE(baseline.baseline_metrics.size() == 2);
  // fp32 emulation is accurate (a few u): the budget is 2 e + 1 u, the margins follow from it.
  const double e = baseline.baseline_metrics[0].rel_rms, u = unit_roundoff(DType::f32);
  REQUIRE(e > 2 * u);  // otherwise 3x the error could hide under the floor
  CHECK(baseline.status == Status::pass);
  CHECK(rel_rms_check(baseline).margin == Approx(e / (2 * e + u)).epsilon(1e-9));
  CHECK(baseline.worst_margin() <= 0.5);

  const Verdict better = judge(p, &in, exact, scaled_error(exact, emulated, 1.5), &emulated,
                               Formulation::sequential, options);
  CHECK(better.status == Status::pass);
  CHECK(rel_rms_check(better).margin == Approx(1.5 * e / (2 * e + u)).epsilon(1e-6));

  const Verdict worse = judge(p, &in, exact, scaled_error(exact, emulated, 3.0), &emulated,
                              Formulation::sequential, options);
  INFO(worse.details());
  CHECK(worse.status == Status::fail);
  // A failing check gets the arithmetic floor added (weighted by 1 / sqrt(15808) here): it
  // raises the budget a little and still fails 3x the emulation's error.
  CHECK(rel_rms_check(worse).margin > 1.0);
  CHECK(rel_rms_check(worse).margin < 3 * e / (2 * e + u));
  CHECK(rel_rms_check(worse).basis.find("arithmetic") != std::string::npos);
  CHECK(worse.details().find("OVER") != std::string::npos);
  BudgetOptions without_floor;
  without_floor.arithmetic_units = 0;
  const Verdict worse_plain = judge(p, &in, exact, scaled_error(exact, emulated, 3.0), &emulated,
                                    Formulation::sequential, without_floor);
  CHECK(rel_rms_check(worse_plain).margin == Approx(3 * e / (2 * e + u)).epsilon(1e-6));
}

TEST_CASE("calibrated arithmetic floor: one-element outputs judged by analysis, not by one draw", "[oracle][budget]") {
  // K = V = 1, one sequence of 64 tokens, no decay: o has 64 elements, hT one. The emulation's
  // error on hT is one rounding-error draw; a correct fp32 computation in another order may
  // land several u away (the shape of the GPU fuzz failures this floor exists for).
  Problem p = Problem::packed({64}, 1, 1, 1, 1);
  p.has_hT = true;
  fuzz::InputOptions options;
  options.regime = fuzz::GateRegime::no_decay;
  const Inputs in = fuzz::make_inputs(p, options, 7);
  const Outputs<double> exact = reference::sequential<double>(p, in);
  const Outputs<double> emulated = reference::emulate(p, in, Formulation::sequential);
  const Outputs<double> floor = arithmetic_floor(p, in, unit_roundoff(DType::f32)).independent;
  REQUIRE(floor.hT.numel() == 1);
  REQUIRE(floor.o.numel() == 64);
  CHECK(floor.hT[0] > unit_roundoff(DType::f32) * std::fabs(exact.hT[0]));
  // Without decay and with weak writes (beta = 0.01: the state barely contracts along k) the
  // errors accumulate: the floor grows along the sequence; with beta ~ U(0, 1) and K = 1 the
  // state forgets within a few tokens and so do its errors.
  Inputs weak = in;
  for (std::int64_t i = 0; i < weak.beta.numel(); ++i) weak.beta[i] = 0.01;
  weak.h0 = HostTensor<double>(p.state_shape(), 1.0);
  Problem weak_p = p;
  weak_p.has_h0 = true;
  const Outputs<double> weak_floor = arithmetic_floor(weak_p, weak, unit_roundoff(DType::f32)).independent;
  const double weak_hT = reference::sequential<double>(weak_p, weak).hT[0];
  // 64 steps of ~3 u^2 each (decay, sum, delta): about 14 u; one step would be under 2 u.
  CHECK(weak_floor.hT[0] > 8 * unit_roundoff(DType::f32) * std::fabs(weak_hT));
  // An underflowing gate at the last token erases the history: the floor is one step's.
  Inputs reset = in;
  reset.g[63] = -1e4;
  const Outputs<double> reset_floor = arithmetic_floor(p, reset, unit_roundoff(DType::f32)).independent;
  CHECK(reset_floor.hT[0] < 0.5 * floor.hT[0]);
  // An hT 4 u off (relative) passes; one 1e-4 off (a lost decay of exp(-1e-4), or a real bug) fails.
  for (double relative : {4 * unit_roundoff(DType::f32), 1e-4}) {
    Outputs<double> actual = emulated;
    actual.hT[0] = exact.hT[0] * (1 + relative);
    const Verdict v = judge(p, &in, exact, actual, &emulated, Formulation::sequential, BudgetOptions{});
    INFO(v.details());
    CHECK((v.status == Status::pass) == (relative < 1e-5));
  }
}

TEST_CASE("calibrated floor: an exact implementation passes where the emulation is exact too", "[oracle][budget]") {
  // beta = 0 and no h0: the state stays zero, o is exactly 0 in every precision.
  Problem p = Problem::packed({5}, 1, 1, 8, 8);
  Inputs in = fuzz::make_inputs(p, {}, 3);
  for (std::int64_t i = 0; i < in.beta.numel(); ++i) in.beta[i] = 0;
  const Outputs<double> exact = reference::sequential<double>(p, in);
  const Outputs<double> emulated = reference::emulate(p, in, Formulation::sequential);
  const Verdict v = judge(p, &in, exact, exact, &emulated, Formulation::sequential, BudgetOptions{});
  CHECK(v.status == Status::pass);
  CHECK(v.worst_margin() == 0);
  // ...and anything non-zero fails: the floor scales with max|ref| = 0.
  Outputs<double> off = exact;
  off.o[0] = 1e-30;
  CHECK(judge(p, &in, exact, off, &emulated, Formulation::sequential, BudgetOptions{}).status == Status::fail);
}

TEST_CASE("fixed thresholds depend on the formulation", "[oracle][budget]") {
  Problem p = Problem::packed({10}, 1, 1, 4, 4);
  const Inputs in = fuzz::make_inputs(p, {}, 5);
  const Outputs<double> exact = reference::sequential<double>(p, in);
  Outputs<double> x = exact;
  // rel RMS 0.004: scale every element by 1.004
  for (std::int64_t i = 0; i < x.o.numel(); ++i) x.o[i] *= 1.004;
  BudgetOptions fixed;
  fixed.model = BudgetModel::fixed;
  const Verdict chunked = judge(p, &in, exact, x, nullptr, Formulation::chunked, fixed);
  const Verdict recurrent = judge(p, &in, exact, x, nullptr, Formulation::sequential, fixed);
  CHECK(chunked.status == Status::pass);
  CHECK(chunked.worst_margin() == Approx(0.004 / 0.005).epsilon(1e-6));
  CHECK(recurrent.status == Status::fail);
  CHECK(recurrent.worst_margin() == Approx(0.004 / 0.002).epsilon(1e-6));
}

TEST_CASE("fixed with an absolute allowance: cancellation to near zero passes, real errors fail", "[oracle][budget]") {
  Problem p = Problem::packed({3}, 1, 1, 2, 2);
  const Inputs in = fuzz::make_inputs(p, {}, 5);
  Outputs<double> ref = reference::sequential<double>(p, in);
  for (std::int64_t i = 0; i < ref.o.numel(); ++i) ref.o[i] = 1e-6;  // outputs that cancelled
  Outputs<double> x = ref;
  for (std::int64_t i = 0; i < x.o.numel(); ++i) x.o[i] *= 1 + 1e-11;  // rel 1e-11, abs 1e-17
  BudgetOptions b;
  std::string error;
  REQUIRE(parse_budget("fixed(rel_rms=1e-12)", &b, &error));
  CHECK(judge(p, &in, ref, x, nullptr, Formulation::chunked, b).status == Status::fail);
  REQUIRE(parse_budget("fixed(rel_rms=1e-12,abs=1e-14)", &b, &error));
  const Verdict v = judge(p, &in, ref, x, nullptr, Formulation::chunked, b);
  CHECK(v.status == Status::pass);
  CHECK(v.checks[0].metric == "rms_error");
  CHECK(v.checks[0].budget == Approx(1e-12 * 1e-6 + 1e-14));
  for (std::int64_t i = 0; i < x.o.numel(); ++i) x.o[i] = 1e-6 + 1e-13;  // abs 1e-13: over
  CHECK(judge(p, &in, ref, x, nullptr, Formulation::chunked, b).status == Status::fail);
}

TEST_CASE("fixed: a single NaN among many correct values fails", "[oracle][budget]") {
  Problem p = Problem::packed({50}, 1, 1, 16, 16);
  const Inputs in = fuzz::make_inputs(p, {}, 5);
  const Outputs<double> exact = reference::sequential<double>(p, in);
  Outputs<double> x = exact;
  x.o[17] = NAN;
  BudgetOptions fixed;
  fixed.model = BudgetModel::fixed;
  const Verdict v = judge(p, &in, exact, x, nullptr, Formulation::chunked, fixed);
  CHECK(v.status == Status::fail);
  CHECK(v.metrics[0].nan_count == 1);
}

TEST_CASE("bitwise: one flipped last bit fails, identical passes", "[oracle][budget]") {
  Problem p = Problem::packed({6}, 1, 1, 4, 4);
  p.has_hT = true;
  const Inputs in = fuzz::make_inputs(p, {}, 5);
  const Outputs<double> a = reference::sequential<double>(p, in);
  Outputs<double> b = a;
  BudgetOptions bitwise;
  bitwise.model = BudgetModel::bitwise;
  CHECK(judge(p, &in, a, b, nullptr, Formulation::chunked, bitwise).status == Status::pass);
  b.hT[3] = std::nextafter(b.hT[3], 1e300);
  const Verdict v = judge(p, &in, a, b, nullptr, Formulation::chunked, bitwise);
  CHECK(v.status == Status::fail);
  REQUIRE(v.worst_check());
  CHECK(v.worst_check()->tensor == OutputTensor::hT);
  CHECK(v.worst_check()->error == 1);
}

TEST_CASE("missing output tensor is an ERROR verdict naming it", "[oracle][budget]") {
  Problem p = Problem::packed({6}, 1, 1, 4, 4);
  p.has_hT = true;
  const Inputs in = fuzz::make_inputs(p, {}, 5);
  const Outputs<double> a = reference::sequential<double>(p, in);
  Outputs<double> b = a;
  b.hT = HostTensor<double>();
  BudgetOptions fixed;
  fixed.model = BudgetModel::fixed;
  const Verdict v = judge(p, &in, a, b, nullptr, Formulation::chunked, fixed);
  CHECK(v.status == Status::error);
  CHECK(v.message.find("hT") != std::string::npos);
}

TEST_CASE("budget descriptions parse back", "[oracle][budget]") {
  for (const char* text : {"calibrated", "calibrated(factor=3,floor=0.5)", "calibrated(arith=0,state_unit=input)",
                           "calibrated(state_unit=output)", "calibrated(state_unit=input,baseline=operands_single)",
                           "calibrated(state_unit=input,baseline=operands_single_qk)", "calibrated(baseline=emulation)", "fixed", "fixed(rel_rms=1e-12)",
                           "fixed(rel_rms=1e-12,abs=1e-14)", "fixed(abs=1e-9)", "bitwise"}) {
    BudgetOptions b;
    std::string error;
    REQUIRE(parse_budget(text, &b, &error));
    BudgetOptions again;
    REQUIRE(parse_budget(b.describe(), &again, &error));
    CHECK(again.describe() == b.describe());
  }
  BudgetOptions b;
  std::string error;
  CHECK_FALSE(parse_budget("calibrated(rel_rms=1)", &b, &error));
  CHECK(error.find("rel_rms") != std::string::npos);
  CHECK_FALSE(parse_budget("calibrated(baseline=fla)", &b, &error));
  CHECK(error.find("baseline") != std::string::npos);
  CHECK_FALSE(parse_budget("strict", &b, &error));
  CHECK_FALSE(parse_budget("fixed(rel_rms=-1)", &b, &error));
}

TEST_CASE("evaluate: references pass their budgets, planted faults fail theirs", "[oracle][budget]") {
  Problem p = Problem::packed({130, 70}, 1, 2, 16, 16);
  p.has_h0 = true;
  p.has_hT = true;
  CaseContext context("two sequences past a chunk boundary", p, fuzz::make_inputs(p, {}, 21));
  Registry registry;
  register_references(registry);
  for (const RegistryEntry* e : registry.select("reference.*")) {
    auto impl = e->make();
    const Verdict v = evaluate(*impl, context, e->default_budget);
    INFO(v.details());
    CHECK(v.status == Status::pass);
  }
  // Faults of features this case lacks (l2norm of small-norm rows, per-token states) show on a
  // second case that has them: every fault fails at least one of the two, by far.
  Problem features = Problem::packed({70, 9}, 1, 2, 16, 16);
  features.has_h0 = true;
  features.has_hT = true;
  features.use_qk_l2norm = true;
  features.store_intermediate_states = true;
  fuzz::InputOptions small;
  small.small_norms = true;
  CaseContext featured("l2norm of small-norm rows, per-token states", features, fuzz::make_inputs(features, small, 22));
  for (const RegistryEntry* e : registry.select("fault.*")) {
    // Faults that no budget can see, only a rerun (run_to_run_bits; cli/suite_test.cpp tests
    // them through conformance's reproducibility checks), and the backward's faults, whose
    // forward is correct (cli/backward_cli_test.cpp judges their backward).
    if (e->check_reproducibility || e->name.rfind("fault.backward_", 0) == 0) continue;
    auto impl = e->make();
    double worst = 0;
    for (CaseContext* c : {&context, &featured}) {
      const Verdict v = evaluate(*impl, *c, e->default_budget);
      INFO(v.details());
      CHECK(v.status != Status::error);
      if (v.status == Status::fail) worst = std::max(worst, v.worst_margin());
    }
    INFO(e->name);
    CHECK(worst > 10);
  }
}

TEST_CASE("evaluate: the chunked reference cannot serve per-token states and says so", "[oracle][budget]") {
  Problem p = Problem::packed({4}, 1, 1, 4, 4);
  p.store_intermediate_states = true;
  CaseContext context("intermediate", p, fuzz::make_inputs(p, {}, 2));
  auto impl = make_reference(Formulation::chunked, ReferencePrecision::f64);
  const Verdict v = evaluate(*impl, context, BudgetOptions{});
  CHECK(v.status == Status::skipped);
  CHECK(v.message.find("store_intermediate_states") != std::string::npos);
}

TEST_CASE("calibrated state_unit=input: hT of bf16 inputs floored at 1 u of bf16, o unchanged", "[oracle][budget]") {
  Problem p = Problem::packed({40}, 1, 2, 16, 16);
  p.has_h0 = true;
  p.has_hT = true;
  p.input_dtype = DType::bf16;
  const Inputs in = fuzz::make_inputs(p, {}, 9);
  const Outputs<double> exact = reference::sequential<double>(p, in);
  const Outputs<double> emulated = reference::emulate(p, in, Formulation::sequential);
  // hT 1e-4 off (relative): far above fp32's rounding, well inside 1 u of bf16 (3.9e-3).
  Outputs<double> actual = emulated;
  for (std::int64_t i = 0; i < actual.hT.numel(); ++i) actual.hT[i] = exact.hT[i] * (1 + 1e-4);
  BudgetOptions output_unit, input_unit;
  output_unit.arithmetic_units = input_unit.arithmetic_units = 0;
  input_unit.state_unit_input = true;
  CHECK(judge(p, &in, exact, actual, &emulated, Formulation::sequential, output_unit).status == Status::fail);
  const Verdict v = judge(p, &in, exact, actual, &emulated, Formulation::sequential, input_unit);
  INFO(v.details());
  CHECK(v.status == Status::pass);
  CHECK(v.budget == "calibrated(arith=0,state_unit=input)");
  // o is still held to its own dtype's unit: a 2e-2 error of o fails either way.
  for (std::int64_t i = 0; i < actual.o.numel(); ++i) actual.o[i] = exact.o[i] * (1 + 2e-2);
  CHECK(judge(p, &in, exact, actual, &emulated, Formulation::sequential, input_unit).status == Status::fail);
}

TEST_CASE("calibrated baseline=operands_single: the single-rounding design's emulation sets the budget",
          "[oracle][budget]") {
  Problem p = Problem::packed({70, 130}, 1, 2, 32, 32);
  p.has_h0 = true;
  p.has_hT = true;
  p.use_qk_l2norm = true;
  p.input_dtype = DType::bf16;
  CaseContext context("single-rounding design", p, fuzz::make_inputs(p, {}, 5));
  const Outputs<double> design =
      reference::emulate_operands(p, context.inputs(), reference::OperandRounding::single);
  BudgetOptions options;
  options.state_unit_input = true;
  options.baseline = BudgetBaseline::operands_single;
  CHECK(options.describe() == "calibrated(state_unit=input,baseline=operands_single)");
  // The design itself sits at or below margin 0.5 of a budget it sets, and the verdict says
  // which baseline formed the budget and carries that baseline's metrics.
  const Verdict v = evaluate_outputs("design", Formulation::chunked, 64, context, design, options);
  INFO(v.details());
  CHECK(v.status == Status::pass);
  CHECK(v.worst_margin() <= 0.5);
  REQUIRE(!v.checks.empty());
  CHECK(v.checks.front().basis.find("operands single") != std::string::npos);
  REQUIRE(v.baseline_metrics.size() == v.metrics.size());
  CHECK(v.baseline_metrics.front().rel_rms == v.metrics.front().rel_rms);
  // The default baseline is the plain emulation, whose o is more accurate than the design's:
  // the same outputs then sit at a larger margin.
  BudgetOptions plain = options;
  plain.baseline = BudgetBaseline::emulation;
  const Verdict w = evaluate_outputs("design", Formulation::chunked, 64, context, design, plain);
  CHECK(w.checks.front().basis.find("operands single") == std::string::npos);
  CHECK(w.worst_margin() > v.worst_margin());
  // A fault far outside both: o off by 5 %.
  Outputs<double> fault = design;
  for (std::int64_t i = 0; i < fault.o.numel(); ++i) fault.o[i] *= 1.05;
  CHECK(evaluate_outputs("fault", Formulation::chunked, 64, context, fault, options).status == Status::fail);
  // The operand model is the chunked form at C = 64: any other formulation is refused.
  CHECK_THROWS_AS(evaluate_outputs("design", Formulation::sequential, 64, context, design, options),
                  std::invalid_argument);
}

// ----- analytic, and the max-abs form of the budgets (what the property suite sums) ---------

TEST_CASE("analytic: parsed and described, f64 and f80", "[oracle][budget][analytic]") {
  BudgetOptions options;
  std::string error;
  REQUIRE(parse_budget("analytic", &options, &error));
  CHECK(options.model == BudgetModel::analytic);
  CHECK_FALSE(options.analytic_long_double);
  CHECK(options.describe() == "analytic");
  REQUIRE(parse_budget("analytic(precision=f80)", &options, &error));
  CHECK(options.analytic_long_double);
  CHECK(options.describe() == "analytic(precision=f80)");
  CHECK_FALSE(parse_budget("analytic(precision=f32)", &options, &error));
  CHECK_FALSE(parse_budget("analytic(factor=2)", &options, &error));
}

TEST_CASE("analytic: u (64 sqrt((L+1)(K+V)) + 16 Gamma_C) times the magnitudes", "[oracle][budget][analytic]") {
  Problem p = Problem::packed({70, 5}, 1, 2, 24, 12);
  p.has_h0 = true;
  p.has_hT = true;
  fuzz::InputOptions strong;
  strong.regime = fuzz::GateRegime::strong;
  const Inputs in = fuzz::make_inputs(p, strong, 4);
  const Outputs<double> exact = reference::sequential<double>(p, in);
  BudgetOptions options;
  options.model = BudgetModel::analytic;
  const double u = 0x1p-53, work = std::sqrt(71.0 * (24 + 12));
  const double gamma = chunk_log_decay(p, in, 16);
  REQUIRE(gamma > 1);  // strong decay: the chunked term is there
  CHECK(analytic_relative_bound(p, in, Formulation::sequential, 0, false) == 64 * u * work);
  CHECK(analytic_relative_bound(p, in, Formulation::chunked, 16, false) == 64 * u * work + 16 * u * gamma);
  CHECK(analytic_relative_bound(p, in, Formulation::sequential, 0, true) == 64 * 0x1p-64 * work);
  const Allowance m = magnitudes(p, in);
  const Allowance a = max_abs_allowance(options, p, in, exact, Formulation::chunked, 16);
  const double relative = analytic_relative_bound(p, in, Formulation::chunked, 16, false);
  CHECK(a.o == std::max(max_abs(exact.o), m.o) * relative);
  CHECK(a.hT == std::max(max_abs(exact.hT), m.hT) * relative);
  // judge: the chunked double reference against the recurrence passes; an error of 1e-9
  // (far above any double rounding here) fails.
  const Outputs<double> chunked = reference::chunked<double>(p, in, 16);
  const Verdict pass = judge(p, &in, exact, chunked, nullptr, Formulation::chunked, options, 16);
  CHECK(pass.status == Status::pass);
  Outputs<double> wrong = chunked;
  wrong.o[3] += 1e-9;
  CHECK(judge(p, &in, exact, wrong, nullptr, Formulation::chunked, options, 16).status == Status::fail);
  CHECK_THROWS_AS(judge(p, &in, exact, chunked, nullptr, Formulation::chunked, options), std::invalid_argument);
  CHECK_THROWS_AS(judge(p, nullptr, exact, chunked, nullptr, Formulation::sequential, options), std::invalid_argument);
}

TEST_CASE("max-abs allowance: calibrated is floor x magnitudes + factor x the emulation's error",
          "[oracle][budget][allowance]") {
  Problem p = Problem::packed({40, 9}, 1, 2, 16, 8);
  p.input_dtype = DType::bf16;
  p.has_h0 = true;
  p.has_hT = true;
  const Inputs in = fuzz::make_inputs(p, {}, 8);
  const Outputs<double> exact = reference::sequential<double>(p, in);
  const Outputs<double> emulated = reference::emulate(p, in, Formulation::chunked, 64);
  const Allowance m = magnitudes(p, in);
  const double scale_o = std::max(max_abs(exact.o), m.o), scale_hT = std::max(max_abs(exact.hT), m.hT);
  BudgetOptions options;  // calibrated: factor 2, floor 1 u; states in fp32's unit
  Allowance a = max_abs_allowance(options, p, in, exact, Formulation::chunked, 64);
  CHECK(a.o == scale_o * unit_roundoff(DType::bf16) + 2 * difference(exact.o, emulated.o).max_abs);
  CHECK(a.hT == scale_hT * unit_roundoff(DType::f32) + 2 * difference(exact.hT, emulated.hT).max_abs);
  options.state_unit_input = true;  // the chunked kernel's: states in the input dtype's unit
  a = max_abs_allowance(options, p, in, exact, Formulation::chunked, 64);
  CHECK(a.hT == scale_hT * unit_roundoff(DType::bf16) + 2 * difference(exact.hT, emulated.hT).max_abs);
  // The single-rounding design's baseline.
  options.baseline = BudgetBaseline::operands_single;
  const Outputs<double> single = reference::emulate_operands(p, in, reference::OperandRounding::single);
  a = max_abs_allowance(options, p, in, exact, Formulation::chunked, 64);
  CHECK(a.o == scale_o * unit_roundoff(DType::bf16) + 2 * difference(exact.o, single.o).max_abs);
  CHECK_THROWS_AS(max_abs_allowance(options, p, in, exact, Formulation::sequential, 0), std::invalid_argument);
  // bitwise: nothing; fixed: no max-abs form.
  BudgetOptions bitwise;
  bitwise.model = BudgetModel::bitwise;
  a = max_abs_allowance(bitwise, p, in, exact, Formulation::chunked, 64);
  CHECK(a.o == 0);
  CHECK(a.hT == 0);
  BudgetOptions fixed;
  fixed.model = BudgetModel::fixed;
  CHECK_THROWS_AS(max_abs_allowance(fixed, p, in, exact, Formulation::chunked, 64), std::invalid_argument);
}

TEST_CASE("difference: max-abs error, non-finite and shape mismatches are infinite", "[oracle][budget][allowance]") {
  HostTensor<double> a({3}), b({3});
  a[0] = 1;
  b[0] = 1.5;
  a[1] = -0.0;  // +0 == -0
  a[2] = b[2] = NAN;
  Difference d = difference(a, b);
  CHECK(d.max_abs == 0.5);
  CHECK(d.worst == 0);
  b[1] = INFINITY;
  CHECK(std::isinf(difference(a, b).max_abs));
  CHECK(std::isinf(difference(a, HostTensor<double>({2})).max_abs));
  CHECK(max_abs(b) == 1.5);
}

// ----- non-finite errors and budgets (docs/budgets.md, "Non-finite errors and budgets") ----

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

const Check* find_check(const Verdict& v, OutputTensor tensor, const std::string& metric) {
  for (const Check& c : v.checks)
    if (c.tensor == tensor && c.metric == metric) return &c;
  return nullptr;
}

// The repro sample: fp16 inputs, contractive (unit key, beta = 1, g = 0), q = v = 60000, so the
// exact o reaches 3.6e9, far above fp16's largest value: the emulation's o overflows to inf.
CaseFile f16_overflow_case() {
  return read_case_file(std::string(GDN_REPRO_DIR) + "/f16_overflow_zero_o.safetensors");
}

}  // namespace

TEST_CASE("non-finite: an emulation that overflows gives no infinite budget (repro f16_overflow_zero_o)",
          "[oracle][budget][nonfinite]") {
  const CaseFile c = f16_overflow_case();
  REQUIRE(c.outputs);
  REQUIRE(c.problem.input_dtype == DType::f16);
  for (const int chunk_size : {0, 64}) {
    const Formulation formulation = chunk_size ? Formulation::chunked : Formulation::sequential;
    CaseContext context("f16 overflow", c.problem, c.inputs);
    const Outputs<double>& exact = context.exact();
    REQUIRE(max_abs(exact.o) > 3e9);
    REQUIRE(std::isinf(difference(exact.o, context.emulation(formulation, chunk_size).o).max_abs));
    // out.o all zeros: it passed with budget inf. Now every budget is finite and o fails by far.
    const Verdict zero = evaluate_outputs("ext.zero", formulation, chunk_size, context, *c.outputs, BudgetOptions{});
    INFO(zero.details());
    CHECK(zero.status == Status::fail);
    for (const Check& check : zero.checks) CHECK(std::isfinite(check.budget));
    const Check* o_abs = find_check(zero, OutputTensor::o, "max_abs");
    REQUIRE(o_abs);
    CHECK_FALSE(o_abs->pass);
    CHECK(o_abs->margin > 100);
    CHECK(contains(o_abs->basis, "the emulation is NaN or inf where the reference is finite: 3 elements of o"));
    CHECK(contains(o_abs->basis, "term dropped"));
    CHECK(contains(zero.message, "emulation"));
    // What remains is the analysis: one ulp of fp16 at max|ref| (2^21) and the arithmetic
    // floor. The exact o passes under it, o 1e-3 off (two fp16 ulps) fails.
    const Verdict right = evaluate_outputs("exact", formulation, chunk_size, context, exact, BudgetOptions{});
    INFO(right.details());
    CHECK(right.status == Status::pass);
    Outputs<double> off = exact;
    for (std::int64_t i = 0; i < off.o.numel(); ++i) off.o[i] *= 1 + 1e-3;
    const Verdict near = evaluate_outputs("near", formulation, chunk_size, context, off, BudgetOptions{});
    INFO(near.details());
    CHECK(near.status == Status::fail);
    // The emulation's own outputs (o = inf): error inf, margin inf (not NaN), and it says why.
    const Verdict emulated = evaluate_outputs("emulation", formulation, chunk_size, context,
                                              context.emulation(formulation, chunk_size), BudgetOptions{});
    INFO(emulated.details());
    CHECK(emulated.status == Status::fail);
    CHECK(std::isinf(emulated.worst_margin()));
    REQUIRE(emulated.worst_check());
    CHECK(contains(emulated.worst_check()->basis, "error is inf"));
    CHECK(contains(emulated.worst_check()->basis, "inf in o"));
  }
  // The arithmetic floor's model applies here: its fp32 computation stays finite (3.6e9).
  CHECK(arithmetic_floor(c.problem, c.inputs, unit_roundoff(DType::f32)).applies());
}

TEST_CASE("non-finite: the same with g = 80, where no analysis applies, fails and says why",
          "[oracle][budget][nonfinite]") {
  CaseFile c = f16_overflow_case();
  REQUIRE(c.outputs);
  for (std::int64_t i = 0; i < c.inputs.g.numel(); ++i) c.inputs.g[i] = 80;
  // exp(80) = 5.5e34 times the state (6e4) exceeds fp32's range: the emulation's state and o are
  // NaN, and the fp32 computation the arithmetic floor models overflows too. With that floor
  // (about 1e37 here) the zero o would pass: it must not be used.
  const ArithmeticFloor floor = arithmetic_floor(c.problem, c.inputs, unit_roundoff(DType::f32));
  CHECK_FALSE(floor.applies());
  CHECK(floor.largest > 1e38);
  CaseContext context("f16 overflow, g = 80", c.problem, c.inputs);
  const Verdict v = evaluate_outputs("ext.zero", Formulation::sequential, 0, context, *c.outputs, BudgetOptions{});
  INFO(v.details());
  CHECK(v.status == Status::fail);
  for (const Check& check : v.checks) CHECK(std::isfinite(check.budget));
  const Check* o_abs = find_check(v, OutputTensor::o, "max_abs");
  REQUIRE(o_abs);
  CHECK_FALSE(o_abs->pass);
  CHECK(contains(o_abs->basis, "arithmetic floor not added"));
  CHECK(contains(o_abs->basis, "fp32 overflows"));
}

TEST_CASE("non-finite: an unwritten (NaN) output row fails under every budget with margin inf, not NaN",
          "[oracle][budget][nonfinite]") {
  Problem p = Problem::packed({20, 13}, 1, 2, 8, 8);
  p.has_h0 = true;
  p.has_hT = true;
  const Inputs in = fuzz::make_inputs(p, {}, 17);
  const Outputs<double> exact = reference::sequential<double>(p, in);
  const Outputs<double> emulated = reference::emulate(p, in, Formulation::sequential);
  Outputs<double> actual = emulated;
  const std::int64_t row = 19;  // the first sequence's last token, every head and element
  for (std::int64_t e = 0; e < std::int64_t(p.HV) * p.V; ++e) actual.o[row * p.HV * p.V + e] = NAN;
  for (const char* budget : {"calibrated", "calibrated(arith=0)", "fixed", "fixed(rel_rms=1e-12,abs=1e-14)", "analytic",
                             "bitwise"}) {
    BudgetOptions options;
    std::string error;
    REQUIRE(parse_budget(budget, &options, &error));
    const Verdict v = options.model == BudgetModel::bitwise
                          ? judge(p, &in, emulated, actual, nullptr, Formulation::sequential, options)
                          : judge(p, &in, exact, actual, &emulated, Formulation::sequential, options);
    INFO(budget << "\n" << v.details());
    CHECK(v.status == Status::fail);
    CHECK(std::isinf(v.worst_margin()));
    for (const Check& c : v.checks) CHECK_FALSE(std::isnan(c.margin));
    CHECK(to_json(v)["worst_margin"] == "inf");
    if (options.model != BudgetModel::bitwise) {
      CHECK(contains(v.message, "NaN or inf where the reference is finite"));
      CHECK(contains(v.message, "16 elements of o (16 NaN, 0 inf in o)"));
      CHECK(contains(v.worst_check()->basis, "error is inf"));
      CHECK(contains(v.worst_check()->basis, "16 NaN"));
    }
  }
}

TEST_CASE("non-finite: an infinite or NaN budget passes nothing, not even an exact output; inf / inf is margin inf",
          "[oracle][budget][nonfinite]") {
  Problem p = Problem::packed({9}, 1, 1, 4, 4);
  p.has_hT = true;
  const Inputs in = fuzz::make_inputs(p, {}, 4);
  const Outputs<double> exact = reference::sequential<double>(p, in);
  const Outputs<double> emulated = reference::emulate(p, in, Formulation::sequential);
  Outputs<double> nan_row = exact;
  nan_row.o[0] = NAN;
  // parse_budget refuses non-finite parameters; a program can still set them.
  for (const double bad : {double(INFINITY), double(NAN)}) {
    BudgetOptions options;
    options.floor_units = bad;
    const Verdict same = judge(p, &in, exact, exact, &emulated, Formulation::sequential, options);
    INFO(same.details());
    CHECK(same.status == Status::fail);
    for (const Check& c : same.checks) {
      CHECK_FALSE(c.pass);
      CHECK(std::isinf(c.margin));
      CHECK(contains(c.basis, "budget not finite"));
    }
    CHECK(contains(same.message, "budget not finite"));
    const Verdict both = judge(p, &in, exact, nan_row, &emulated, Formulation::sequential, options);
    INFO(both.details());
    const Check* o_abs = find_check(both, OutputTensor::o, "max_abs");
    REQUIRE(o_abs);
    CHECK(std::isinf(o_abs->error));
    CHECK(std::isinf(o_abs->margin));  // inf / inf was NaN
    CHECK(contains(o_abs->basis, "error is inf"));
    CHECK(contains(o_abs->basis, "budget not finite"));
  }
}

TEST_CASE("non-finite: an exact reference that is not finite passes nothing", "[oracle][budget][nonfinite]") {
  Problem p = Problem::packed({6}, 1, 1, 4, 4);
  p.has_hT = true;
  const Inputs in = fuzz::make_inputs(p, {}, 6);
  Outputs<double> exact = reference::sequential<double>(p, in);
  exact.o[2] = INFINITY;  // the oracle overflowed; the implementation reproduces it
  exact.hT[1] = NAN;
  for (const char* budget : {"calibrated", "fixed", "fixed(rel_rms=1e-12,abs=1e-14)", "analytic"}) {
    BudgetOptions options;
    std::string error;
    REQUIRE(parse_budget(budget, &options, &error));
    const Verdict v = judge(p, &in, exact, exact, &exact, Formulation::sequential, options);
    INFO(budget << "\n" << v.details());
    CHECK(v.status == Status::fail);
    const Check* o_ref = find_check(v, OutputTensor::o, "reference");
    const Check* hT_ref = find_check(v, OutputTensor::hT, "reference");
    REQUIRE(o_ref);
    REQUIRE(hT_ref);
    CHECK_FALSE(o_ref->pass);
    CHECK(std::isinf(o_ref->margin));
    CHECK(contains(o_ref->basis, "0 NaN, 1 inf elements of o"));
    CHECK(contains(hT_ref->basis, "1 NaN, 0 inf elements of hT"));
    CHECK(contains(v.message, "exact reference is not finite"));
  }
}

TEST_CASE("max-abs allowance: a baseline that overflowed is dropped, not summed as inf", "[oracle][budget][nonfinite]") {
  const CaseFile c = f16_overflow_case();
  const Outputs<double> exact = reference::sequential<double>(c.problem, c.inputs);
  const Allowance a = max_abs_allowance(BudgetOptions{}, c.problem, c.inputs, exact, Formulation::sequential, 0);
  CHECK(std::isfinite(a.o));
  CHECK(std::isfinite(a.hT));
  // The floor alone: 1 u of fp16 times the scale (>= max|exact o| = 3.6e9).
  CHECK(a.o >= unit_roundoff(DType::f16) * max_abs(exact.o));
  CHECK(a.o < 2 * unit_roundoff(DType::f16) * std::max(max_abs(exact.o), magnitudes(c.problem, c.inputs).o));
}

// Property: whatever is NaN or infinite, in the implementation's outputs, the oracle's, the
// emulation's, or in the budget's own parameters, no verdict is PASS while any of its checks
// has an error or a budget that is not finite; no margin is NaN; and a non-finite output
// element where the oracle is finite, or a non-finite oracle, never passes.
TEST_CASE("property: no PASS with a non-finite error, budget or reference", "[oracle][budget][nonfinite][property]") {
  fuzz::rc_section("verdicts with NaN and inf planted at random", [] {
    const int K = *rc::gen::inRange(1, 5);
    const int V = *rc::gen::inRange(1, 5);
    const int T1 = *rc::gen::inRange(1, 7), T2 = *rc::gen::inRange(0, 5);
    Problem p = Problem::packed({T1, T2}, 1, 1, K, V);
    p.has_h0 = *rc::gen::arbitrary<bool>();
    p.has_hT = *rc::gen::arbitrary<bool>();
    p.input_dtype = *rc::gen::element(DType::f32, DType::bf16, DType::f16);
    const std::uint64_t seed = *rc::gen::inRange<std::uint64_t>(0, 1000000);
    Inputs in = fuzz::make_inputs(p, {}, seed);
    // Inputs that overflow the emulation: a huge q and v (fp16's largest value is 65504), a
    // growing gate.
    if (*rc::gen::arbitrary<bool>()) {
      const double big = p.input_dtype == DType::f16 ? 60000.0 : std::ldexp(1.0, 100);  // exact in the dtype
      for (std::int64_t i = 0; i < in.q.numel(); ++i) in.q[i] = big;
      for (std::int64_t i = 0; i < in.v.numel(); ++i) in.v[i] = big;
    }
    if (*rc::gen::arbitrary<bool>())
      for (std::int64_t i = 0; i < in.g.numel(); ++i) in.g[i] = *rc::gen::element(0.0, 5.0, 80.0);
    const Formulation formulation = *rc::gen::element(Formulation::sequential, Formulation::chunked);
    const int chunk_size = formulation == Formulation::chunked ? *rc::gen::element(1, 2, 64) : 0;
    Outputs<double> exact = reference::sequential<double>(p, in);
    Outputs<double> baseline = reference::emulate(p, in, formulation, chunk_size);
    Outputs<double> actual = *rc::gen::arbitrary<bool>() ? exact : baseline;
    const std::vector<double> specials{NAN, INFINITY, -INFINITY, 1e300, -1e300, 0.0, 3.4e38};
    auto plant = [&](HostTensor<double>& t) {
      if (t.numel() == 0) return;
      const int count = *rc::gen::inRange(0, 3);
      for (int i = 0; i < count; ++i)
        t[*rc::gen::inRange<std::int64_t>(0, t.numel())] = *rc::gen::elementOf(specials);
    };
    for (Outputs<double>* outputs : {&actual, &exact, &baseline}) {
      if (*rc::gen::arbitrary<bool>()) plant(outputs->o);
      if (*rc::gen::arbitrary<bool>()) plant(outputs->hT);
    }
    std::string text = *rc::gen::element(std::string("calibrated"), std::string("calibrated(arith=0)"),
                                         std::string("calibrated(factor=1,floor=0)"), std::string("fixed"),
                                         std::string("fixed(rel_rms=1e-12,abs=1e-14)"), std::string("analytic"),
                                         std::string("bitwise"));
    BudgetOptions options;
    std::string error;
    RC_ASSERT(parse_budget(text, &options, &error));
    if (*rc::gen::arbitrary<bool>()) {  // parameters only a program can set
      const double bad = *rc::gen::element(double(INFINITY), double(NAN), -1.0);
      switch (*rc::gen::inRange(0, 3)) {
        case 0: options.factor = bad; break;
        case 1: options.floor_units = bad; break;
        default: options.fixed_abs_rms = bad; break;
      }
    }
    const Verdict v = judge(p, &in, exact, actual, &baseline, formulation, options, std::max(chunk_size, 1));
    RC_LOG() << text << " (" << options.describe() << ")\n" << v.details();
    const nlohmann::json json = to_json(v);
    RC_ASSERT(json["worst_margin"] != "nan");
    bool any_nonfinite_check = false;
    for (const Check& c : v.checks) {
      RC_ASSERT(!std::isnan(c.margin));
      if (!std::isfinite(c.error) || !std::isfinite(c.budget)) {
        any_nonfinite_check = true;
        RC_ASSERT(!c.pass);
        RC_ASSERT(std::isinf(c.margin));
      }
    }
    if (v.status != Status::pass) return;
    RC_ASSERT(!any_nonfinite_check);
    for (const Check& c : v.checks) RC_ASSERT(c.pass && c.margin <= 1.0);
    // A PASS never hides a non-finite element: not in the output where the oracle (for
    // bitwise: the other run) is finite, and not in the oracle itself.
    std::vector<std::pair<const HostTensor<double>*, const HostTensor<double>*>> pairs{{&exact.o, &actual.o}};
    if (p.has_hT) pairs.push_back({&exact.hT, &actual.hT});
    for (const auto& [r, x] : pairs)
      for (std::int64_t i = 0; i < r->numel(); ++i) {
        if (options.model != BudgetModel::bitwise) RC_ASSERT(std::isfinite((*r)[i]));
        if (std::isfinite((*r)[i])) RC_ASSERT(std::isfinite((*x)[i]));
      }
  });
}

TEST_CASE("state_dtype bf16: a kernel that stores its states in bf16 passes, one rounding more fails",
          "[oracle][budget][state_dtype]") {
  for (DType state : {DType::bf16, DType::f16}) {
    Problem p = Problem::packed({40, 0, 17}, 1, 2, 16, 16);
    p.has_h0 = true;
    p.has_hT = true;
    p.store_intermediate_states = true;
    p.state_dtype = state;
    const Inputs in = fuzz::make_inputs(p, {}, 9);
    const Outputs<double> exact = reference::sequential<double>(p, in);
    const Outputs<double> emulated = reference::emulate(p, in, Formulation::sequential);
    // A correct kernel with such a pool: fp32 arithmetic, each stored state rounded once.
    Outputs<double> kernel = reference::sequential<float>(p, in).cast<double>();
    reference::round_in_place(p.input_dtype, kernel.o);
    reference::round_stored_states(p, kernel);
    BudgetOptions options;
    options.arithmetic_units = 0;
    const Verdict v = judge(p, &in, exact, kernel, &emulated, Formulation::sequential, options);
    INFO(v.details());
    CHECK(v.status == Status::pass);
    for (const Check& c : v.checks)
      if (c.tensor != OutputTensor::o) CHECK_THAT(c.basis, Catch::Contains(std::string(" ") + dtype_name(state)));
    // The same states with fp32 storage declared: the rounding is an error there.
    Problem f32_state = p;
    f32_state.state_dtype = DType::f32;
    const Outputs<double> emulated32 = reference::emulate(f32_state, in, Formulation::sequential);
    CHECK(judge(f32_state, &in, exact, kernel, &emulated32, Formulation::sequential, options).status == Status::fail);
    // Three units of the state dtype off (relative) on every state: beyond one storage rounding.
    Outputs<double> wrong = kernel;
    for (std::int64_t i = 0; i < wrong.hT.numel(); ++i) wrong.hT[i] = exact.hT[i] * (1 + 3 * unit_roundoff(state));
    CHECK(judge(p, &in, exact, wrong, &emulated, Formulation::sequential, options).status == Status::fail);
    // The max-abs form uses the same unit.
    const Allowance m = magnitudes(p, in);
    const Allowance a = max_abs_allowance(BudgetOptions{}, p, in, exact, Formulation::sequential, 0);
    CHECK(a.hT == std::max(max_abs(exact.hT), m.hT) * unit_roundoff(state) +
                      2 * difference(exact.hT, emulated.hT).max_abs);
  }
}

TEST_CASE("linear gates: the same oracle and budget as their log-space twin", "[oracle][budget][gate_space]") {
  Problem p = Problem::packed({70, 5}, 1, 2, 16, 8);
  p.input_dtype = DType::bf16;
  p.has_h0 = p.has_hT = true;
  Problem linear = p;
  linear.gate_space = GateSpace::linear;
  const Inputs in = fuzz::make_inputs(linear, {}, 4);
  CaseContext context("linear", linear, in);
  // The emulation and the planted faults go through log(alpha): the references pass, a dropped
  // decay fails (docs/semantics.md §3).
  Outputs<double> exact = context.exact();
  const Verdict pass = evaluate_outputs("exact", Formulation::sequential, 0, context, exact, BudgetOptions{});
  CHECK(pass.status == Status::pass);
  Inputs no_decay = in;
  for (std::int64_t i = 0; i < no_decay.g.numel(); ++i) no_decay.g[i] = 1.0;
  const Outputs<double> dropped = reference::sequential<double>(linear, no_decay);
  CHECK(evaluate_outputs("dropped", Formulation::sequential, 0, context, dropped, BudgetOptions{}).status ==
        Status::fail);
}
