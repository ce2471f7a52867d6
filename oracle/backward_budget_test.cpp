// Gradient budgets and verdicts (oracle/backward_budget.hpp, docs/budgets.md "Gradients"): the
// exact references pass tight budgets, fp32 backwards pass their calibrated budgets, and planted
// gradient faults, non-finite gradients, missing or extra tensors and nondeterminism do not.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <random>
#include <string>

#include "fuzz/backward_properties.hpp"
#include "fuzz/inputs.hpp"
#include "fuzz/sample.hpp"
#include "oracle/backward_budget.hpp"
#include "reference/backward_chunked.hpp"
#include "reference/precision.hpp"
#include "reference/prepare.hpp"
#include "reference/sequential.hpp"

namespace {

using namespace gdn;
using oracle::OutputTensor;

oracle::BudgetOptions budget(const std::string& text) {
  oracle::BudgetOptions b;
  std::string error;
  REQUIRE(oracle::parse_budget(text, &b, &error));
  return b;
}

struct Sample {
  Problem problem;
  Inputs inputs;
  BackwardInputs backward;
};

// Generated cases of the backward's space, moderate sizes (the property suite's).
Sample sample(std::uint64_t seed) {
  fuzz::CaseSpace s = fuzz::backward_space(fuzz::CaseSpace::chunked(64));
  s.max_K = 64;
  s.max_V = 64;
  s.max_work = 1.5e5;
  fuzz::GeneratedCase g = fuzz::sample_case(seed, s);
  return {g.problem, g.inputs, fuzz::make_backward_inputs(g.problem, seed)};
}

// A hand-made case with every gradient of the direct gates: 3 sequences (one empty), GVA 2,
// h0 and hT, K = 16, V = 8, bf16 inputs, fp32 gates.
Sample direct_case(bool l2norm) {
  Problem p = Problem::packed({37, 0, 70}, 2, 4, 16, 8);
  p.input_dtype = DType::bf16;
  p.has_h0 = true;
  p.has_hT = true;
  p.use_qk_l2norm = l2norm;
  fuzz::InputOptions o;
  Inputs in = fuzz::make_inputs(p, o, 11);
  return {p, in, fuzz::make_backward_inputs(p, 5)};
}

const oracle::Check* check_of(const oracle::Verdict& v, OutputTensor t) {
  for (const auto& c : v.checks)
    if (c.tensor == t) return &c;
  return nullptr;
}

}  // namespace

TEST_CASE("gradients: the tensors judged follow the problem", "[backward][budget]") {
  Sample d = direct_case(false);
  CHECK(oracle::gradient_tensors(d.problem) ==
        std::vector<OutputTensor>{OutputTensor::dq, OutputTensor::dk, OutputTensor::dv, OutputTensor::dg,
                                  OutputTensor::dbeta, OutputTensor::dh0});
  Problem fused = d.problem;
  fused.gate_mode = GateMode::fused;
  fused.has_h0 = false;
  CHECK(oracle::gradient_tensors(fused) ==
        std::vector<OutputTensor>{OutputTensor::dq, OutputTensor::dk, OutputTensor::dv, OutputTensor::da,
                                  OutputTensor::db, OutputTensor::dA_log, OutputTensor::ddt_bias});
  CHECK(oracle::output_dtype(d.problem, OutputTensor::dq) == DType::bf16);
  CHECK(oracle::output_dtype(d.problem, OutputTensor::dg) == DType::f32);
  CHECK(oracle::output_dtype(d.problem, OutputTensor::dh0) == DType::f32);
  CHECK(std::string(oracle::output_tensor_name(OutputTensor::ddt_bias)) == "ddt_bias");
}

TEST_CASE("gradients: the double references pass tight budgets against long double", "[backward][budget]") {
  // analytic (the references' model, relative to the term magnitudes) and the forward's
  // reference thresholds fixed(rel_rms=1e-12,abs=1e-14), on generated cases of every kind.
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    Sample s = sample(seed);
    oracle::BackwardContext ctx("seed " + std::to_string(seed), s.problem, s.inputs, s.backward,
                                oracle::BackwardContext::Oracle::f80);
    const int C = 1 + static_cast<int>(seed % 70);
    const auto seq = [](const Problem& p, const Inputs& in, const BackwardInputs& b) {
      return reference::sequential_backward<double>(p, in, b);
    };
    const auto chunk = [C](const Problem& p, const Inputs& in, const BackwardInputs& b) {
      return reference::chunked_backward<double>(p, in, b, C);
    };
    for (const char* b : {"analytic", "fixed(rel_rms=1e-12,abs=1e-14)"}) {
      const oracle::Verdict vs = oracle::evaluate_backward("seq.f64", Formulation::sequential, 0, seq, ctx, budget(b));
      INFO(vs.details());
      CHECK(vs.passed());
      const oracle::Verdict vc = oracle::evaluate_backward("chunked.f64", Formulation::chunked, C, chunk, ctx, budget(b));
      INFO(vc.details());
      CHECK(vc.passed());
    }
  }
}

TEST_CASE("gradients: fp32 backwards pass the calibrated budget", "[backward][budget]") {
  // The emulation itself sits at margin 1 / factor; another fp32 backward in another order (the
  // chunked form at C = 16, judged as a C = 64 kernel; at C = 1, judged as a sequential one)
  // stays within the budget on these cases (docs/budgets.md, "Gradients": measured rates).
  const oracle::BudgetOptions calibrated;
  double worst = 0;
  for (std::uint64_t seed = 100; seed < 300; ++seed) {
    Sample s = sample(seed);
    oracle::BackwardContext ctx("seed " + std::to_string(seed), s.problem, s.inputs, s.backward);
    const oracle::Verdict own = oracle::evaluate_gradients("emulation", Formulation::chunked, 64, ctx,
                                                           ctx.emulation(Formulation::chunked, 64), calibrated);
    INFO(own.details());
    REQUIRE(own.passed());
    CHECK(own.worst_margin() <= 0.5 + 1e-12);
    for (int C : {1, 16}) {
      Gradients<double> x = reference::chunked_backward<float>(s.problem, s.inputs, s.backward, C).cast<double>();
      oracle::round_gradients(s.problem, x);
      const oracle::Verdict v =
          oracle::evaluate_gradients("chunked.f32.c" + std::to_string(C), C == 1 ? Formulation::sequential : Formulation::chunked,
                                     64, ctx, x, calibrated);
      INFO(v.details());
      CHECK(v.passed());
      worst = std::max(worst, v.worst_margin());
    }
  }
  CHECK(worst > 0.3);  // the budget is not loose: a different fp32 order uses a good part of it
}

TEST_CASE("gradients: tensor-core product models against the calibrated budget", "[backward][budget][products]") {
  // reference::chunked_backward_products: its fp32 model is the emulation itself (the products as
  // written), and the split models decide what a tensor-core chunked backward needs (the study
  // on the GPU suite's cases and its measured rates: experimental/README.md,
  // "backward_products_study"). Here the study's finding as bounds on this file's cases: TF32
  // rounded once fails at least half of them, 3xTF32 and bf16x3 never.
  const oracle::BudgetOptions calibrated;
  int ran = 0, tf32_failed = 0;
  for (std::uint64_t seed = 100; seed < 160; ++seed) {
    Sample s = sample(seed);
    oracle::BackwardContext ctx("seed " + std::to_string(seed), s.problem, s.inputs, s.backward);
    // Widened to double (exact), so equal doubles are equal floats, bit for bit.
    const Gradients<double> emulation =
        reference::chunked_backward<float>(s.problem, s.inputs, s.backward, 64).cast<double>();
    const Gradients<double> fp32 = reference::chunked_backward_products(s.problem, s.inputs, s.backward, 64,
                                                                        reference::BackwardProducts::fp32)
                                       .cast<double>();
    for (OutputTensor t : oracle::gradient_tensors(s.problem)) {
      const HostTensor<double>& a = oracle::gradient_of(emulation, t);
      const HostTensor<double>& b = oracle::gradient_of(fp32, t);
      REQUIRE(a.numel() == b.numel());
      for (std::int64_t i = 0; i < a.numel(); ++i) REQUIRE(std::memcmp(&a[i], &b[i], sizeof(double)) == 0);
    }
    ++ran;
    for (auto products : {reference::BackwardProducts::tf32, reference::BackwardProducts::tf32x3,
                          reference::BackwardProducts::bf16x3}) {
      Gradients<double> x =
          reference::chunked_backward_products(s.problem, s.inputs, s.backward, 64, products).cast<double>();
      oracle::round_gradients(s.problem, x);
      const oracle::Verdict v = oracle::evaluate_gradients(reference::backward_products_name(products),
                                                           Formulation::chunked, 64, ctx, x, calibrated);
      if (products == reference::BackwardProducts::tf32) {
        tf32_failed += v.passed() ? 0 : 1;
      } else {
        INFO(v.details());
        CHECK(v.passed());
      }
    }
  }
  std::cout << "  TF32 products: " << tf32_failed << " of " << ran << " cases failed the gradient budget\n";
  CHECK(2 * tf32_failed >= ran);
}

TEST_CASE("gradients: the operand baseline judges a backward that stores its operands in the input dtype",
          "[backward][budget][products]") {
  // oracle::emulate_backward_operands, the gradient budget's baseline=operands_single: the
  // design of fla's and FlashQLA's backwards (every product's operand stored in bf16 / fp16). A
  // backward of that design fails the fp32 emulation's budget on most bf16 cases and passes its
  // own; the same backward with its error made 16 times larger fails its own; a sequential
  // formulation is judged on the emulation, and says so; fp32 inputs round nothing.
  const oracle::BudgetOptions calibrated;
  const oracle::BudgetOptions operands = budget("calibrated(baseline=operands_single)");
  const oracle::BudgetOptions operands_qk = budget("calibrated(baseline=operands_single_qk)");
  int ran = 0, failed_fp32_budget = 0;
  for (DType dtype : {DType::bf16, DType::f16})
    for (bool l2norm : {false, true}) {
      Sample s = direct_case(l2norm);
      s.problem.input_dtype = dtype;
      s.inputs = fuzz::make_inputs(s.problem, fuzz::InputOptions{}, 11);
      s.backward = fuzz::make_backward_inputs(s.problem, 5);
      oracle::BackwardContext ctx(std::string(dtype_name(dtype)) + (l2norm ? " l2norm" : ""), s.problem, s.inputs,
                                  s.backward);
      const Gradients<double> design = oracle::emulate_backward_operands(s.problem, s.inputs, s.backward, 64);
      // The context's baseline is that model, for both names.
      for (OutputTensor t : oracle::gradient_tensors(s.problem)) {
        const HostTensor<double>& a = oracle::gradient_of(design, t);
        const HostTensor<double>& b = oracle::gradient_of(ctx.baseline(operands_qk, Formulation::chunked, 64), t);
        for (std::int64_t i = 0; i < a.numel(); ++i) REQUIRE(std::memcmp(&a[i], &b[i], sizeof(double)) == 0);
      }
      ++ran;
      const oracle::Verdict under_fp32 = oracle::evaluate_gradients("design", Formulation::chunked, 64, ctx, design, calibrated);
      failed_fp32_budget += under_fp32.passed() ? 0 : 1;
      const oracle::Verdict own = oracle::evaluate_gradients("design", Formulation::chunked, 64, ctx, design, operands);
      INFO(own.details());
      CHECK(own.passed());
      CHECK(own.worst_margin() <= 0.5);
      CHECK(own.checks.front().basis.find("operands single: products in " + std::string(dtype_name(dtype))) !=
            std::string::npos);
      // Sixteen times the design's error, every gradient.
      Gradients<double> worse = design;
      const Gradients<double>& exact = ctx.exact().value;
      for (OutputTensor t : oracle::gradient_tensors(s.problem)) {
        HostTensor<double>& w = oracle::gradient_of(worse, t);
        const HostTensor<double>& e = oracle::gradient_of(exact, t);
        for (std::int64_t i = 0; i < w.numel(); ++i) w[i] = e[i] + 16 * (w[i] - e[i]);
      }
      const oracle::Verdict bad = oracle::evaluate_gradients("design x16", Formulation::chunked, 64, ctx, worse, operands);
      INFO(bad.details());
      CHECK(bad.status == oracle::Status::fail);
      // A sequential backward: the emulation, with a note.
      const oracle::Verdict sequential =
          oracle::evaluate_gradients("sequential", Formulation::sequential, 0, ctx, ctx.exact().value, operands);
      CHECK(sequential.passed());
      CHECK(sequential.budget == calibrated.describe());
      CHECK(sequential.message.find("operand model is of the chunked form") != std::string::npos);
      CHECK_THROWS_AS(ctx.baseline(operands, Formulation::sequential, 0), std::invalid_argument);
    }
  std::cout << "  operand design: " << failed_fp32_budget << " of " << ran << " cases failed the fp32 budget\n";
  CHECK(failed_fp32_budget >= ran / 2);
  // fp32 inputs: nothing is rounded, the model is the chunked emulation bit for bit.
  Sample s = direct_case(true);
  s.problem.input_dtype = DType::f32;
  s.inputs = fuzz::make_inputs(s.problem, fuzz::InputOptions{}, 11);
  s.backward = fuzz::make_backward_inputs(s.problem, 5);
  const Gradients<double> a = oracle::emulate_backward_operands(s.problem, s.inputs, s.backward, 64);
  const Gradients<double> b = oracle::emulate_backward(s.problem, s.inputs, s.backward, Formulation::chunked, 64);
  for (OutputTensor t : oracle::gradient_tensors(s.problem)) {
    const HostTensor<double>& x = oracle::gradient_of(a, t);
    const HostTensor<double>& y = oracle::gradient_of(b, t);
    for (std::int64_t i = 0; i < x.numel(); ++i) REQUIRE(std::memcmp(&x[i], &y[i], sizeof(double)) == 0);
  }
}

TEST_CASE("gradients: a backward in bf16 fails the fp32 formulation's budget", "[backward][budget]") {
  // The calibrated budget of an fp32 problem is fp32-sized: gradients that went through bf16
  // (what a kernel with bf16 operands in its fp32 path computes) fail it.
  Sample s = direct_case(true);
  s.problem.input_dtype = DType::f32;
  s.inputs = fuzz::make_inputs(s.problem, fuzz::InputOptions{}, 11);
  s.backward = fuzz::make_backward_inputs(s.problem, 5);
  oracle::BackwardContext ctx("f32", s.problem, s.inputs, s.backward);
  Gradients<double> x = ctx.exact().value;
  for (OutputTensor t : oracle::gradient_tensors(s.problem)) reference::round_in_place(DType::bf16, oracle::gradient_of(x, t));
  const oracle::Verdict v = oracle::evaluate_gradients("bf16", Formulation::sequential, 0, ctx, x, {});
  INFO(v.details());
  CHECK(v.status == oracle::Status::fail);
  CHECK(v.worst_margin() > 10);
}

TEST_CASE("gradients: planted faults fail the calibrated budget", "[backward][budget][faults]") {
  const oracle::BudgetOptions calibrated;
  // Each fault starts from the exact gradients (which pass: checked) and breaks one tensor.
  auto judge = [&](const Sample& s, const Gradients<double>& x) {
    return oracle::judge_backward(s.problem, s.inputs, s.backward, x, Formulation::sequential, 0, calibrated);
  };
  Sample d = direct_case(false);
  const Gradients<double> exact = reference::sequential_backward<double>(d.problem, d.inputs, d.backward);
  REQUIRE(judge(d, exact).passed());

  SECTION("dbeta scaled by 1.01") {
    Gradients<double> x = exact;
    for (std::int64_t i = 0; i < x.dbeta.numel(); ++i) x.dbeta[i] *= 1.01;
    const oracle::Verdict v = judge(d, x);
    INFO(v.details());
    CHECK(v.status == oracle::Status::fail);
    CHECK(!check_of(v, OutputTensor::dbeta)->pass);
    CHECK(check_of(v, OutputTensor::dg)->pass);
  }
  SECTION("dh0 zeroed") {
    Gradients<double> x = exact;
    for (std::int64_t i = 0; i < x.dh0.numel(); ++i) x.dh0[i] = 0;
    const oracle::Verdict v = judge(d, x);
    CHECK(v.status == oracle::Status::fail);
    CHECK(v.worst_check()->tensor == OutputTensor::dh0);
  }
  SECTION("dg missing the read of its own token") {
    // dg_t = <dSd, Sd_t> where dSd already holds the read's qs_t dO_t^T (§6); leaving that term
    // out changes dg_t by scale exp(g_t) dO_t . (S_{t-1}^T q_t). S_{t-1} from the forward's
    // per-token states.
    Problem with_states = d.problem;
    with_states.store_intermediate_states = true;
    const Outputs<double> f = reference::sequential<double>(with_states, d.inputs);
    Gradients<double> x = exact;
    const Problem& p = d.problem;
    for (int n = 0; n < p.N(); ++n)
      for (std::int64_t t = p.seq_begin(n); t < p.seq_begin(n) + p.seq_len(n); ++t)
        for (int j = 0; j < p.HV; ++j) {
          const int h = j / p.group_size();
          double term = 0;
          for (int a = 0; a < p.K; ++a)
            for (int b = 0; b < p.V; ++b) {
              const double prev = t == p.seq_begin(n) ? d.inputs.h0[((n * p.HV + j) * p.K + a) * p.V + b]
                                                      : f.intermediate[(((t - 1) * p.HV + j) * p.K + a) * p.V + b];
              term += d.inputs.q[(t * p.H + h) * p.K + a] * prev * d.backward.dO[(t * p.HV + j) * p.V + b];
            }
          x.dg[t * p.HV + j] -= p.effective_scale() * std::exp(d.inputs.g[t * p.HV + j]) * term;
        }
    const oracle::Verdict v = judge(d, x);
    INFO(v.details());
    CHECK(v.status == oracle::Status::fail);
    CHECK(v.worst_check()->tensor == OutputTensor::dg);
  }
  SECTION("dk without the l2norm chain") {
    // The gradient with respect to the normalised key returned as dk: the same backward run on
    // the normalised q and k with the l2norm off.
    Sample l = direct_case(true);
    const Gradients<double> ok = reference::sequential_backward<double>(l.problem, l.inputs, l.backward);
    REQUIRE(judge(l, ok).passed());
    Problem off = l.problem;
    off.use_qk_l2norm = false;
    Inputs normalised = l.inputs;
    for (HostTensor<double>* x : {&normalised.q, &normalised.k})
      for (std::int64_t row = 0; row < x->numel() / l.problem.K; ++row)
        reference::l2normalize(x->data() + row * l.problem.K, l.problem.K);
    Gradients<double> x = ok;
    x.dk = reference::sequential_backward<double>(off, normalised, l.backward).dk;
    const oracle::Verdict v = judge(l, x);
    INFO(v.details());
    CHECK(v.status == oracle::Status::fail);
    CHECK(v.worst_check()->tensor == OutputTensor::dk);
  }
  SECTION("fused gates: dA_log missing one token, db scaled") {
    Sample f = direct_case(false);
    f.problem.gate_mode = GateMode::fused;
    f.inputs = fuzz::make_inputs(f.problem, fuzz::InputOptions{}, 11);
    const Gradients<double> ok = reference::sequential_backward<double>(f.problem, f.inputs, f.backward);
    REQUIRE(judge(f, ok).passed());
    Gradients<double> x = ok;
    // dA_log_j = sum_t g_tj dg_tj: drop token 5 of head 0.
    const double a_log = f.inputs.A_log[0];
    const double xg = f.inputs.a[5 * f.problem.HV] + f.inputs.dt_bias[0];
    const double g5 = -std::exp(a_log) * reference::softplus(xg);
    const double dg5 = ok.da[5 * f.problem.HV] / (-std::exp(a_log) * (xg > 20 ? 1.0 : reference::sigmoid(xg)));
    x.dA_log[0] -= g5 * dg5;
    oracle::Verdict v = judge(f, x);
    INFO(v.details());
    CHECK(!check_of(v, OutputTensor::dA_log)->pass);
    x = ok;
    for (std::int64_t i = 0; i < x.db.numel(); ++i) x.db[i] *= 1.01;
    v = judge(f, x);
    CHECK(!check_of(v, OutputTensor::db)->pass);
  }
}

TEST_CASE("gradients: non-finite values never pass", "[backward][budget][nonfinite]") {
  Sample d = direct_case(false);
  oracle::BackwardContext ctx("nan", d.problem, d.inputs, d.backward);
  Gradients<double> x = ctx.exact().value;
  x.dv[3] = std::numeric_limits<double>::quiet_NaN();
  for (const char* b : {"calibrated", "fixed", "analytic", "calibrated(factor=1e300)"}) {
    const oracle::Verdict v = oracle::evaluate_gradients("nan", Formulation::sequential, 0, ctx, x, budget(b));
    INFO(v.details());
    CHECK(v.status == oracle::Status::fail);
    CHECK(std::isinf(v.worst_margin()));
    CHECK(v.message.find("dv") != std::string::npos);
  }
  // A non-finite exact gradient: reproducing it is no pass.
  oracle::ExactGradients e = ctx.exact();
  e.value.dq[0] = std::numeric_limits<double>::infinity();
  Gradients<double> same = e.value;
  const Gradients<double> emulation = ctx.emulation(Formulation::sequential, 0);
  const oracle::Verdict v =
      oracle::judge_gradients(d.problem, d.inputs, e, same, &emulation, Formulation::sequential, 0, {});
  CHECK(v.status == oracle::Status::fail);
  bool reference_check = false;
  for (const auto& c : v.checks) reference_check |= c.tensor == OutputTensor::dq && c.metric == "reference" && !c.pass;
  CHECK(reference_check);
  // Term magnitudes that are not finite: nothing is measured against them.
  e = ctx.exact();
  e.magnitudes.dg[0] = std::numeric_limits<double>::quiet_NaN();
  const oracle::Verdict w =
      oracle::judge_gradients(d.problem, d.inputs, e, e.value, &emulation, Formulation::sequential, 0, {});
  INFO(w.details());
  CHECK(w.status == oracle::Status::fail);
  // An all-zero gradient (beta = 0 with no h0: dk has no term at all) must be exactly zero.
  Sample z = direct_case(false);
  z.problem.has_h0 = false;
  z.inputs.h0 = HostTensor<double>();
  for (std::int64_t i = 0; i < z.inputs.beta.numel(); ++i) z.inputs.beta[i] = 0;
  oracle::BackwardContext zc("zero", z.problem, z.inputs, z.backward);
  Gradients<double> zx = zc.exact().value;
  REQUIRE(oracle::term_scale(zc.exact().magnitudes.dk) == 0);
  CHECK(oracle::evaluate_gradients("zero", Formulation::sequential, 0, zc, zx, {}).passed());
  zx.dk[0] = 1e-30;
  const oracle::Verdict zv = oracle::evaluate_gradients("zero", Formulation::sequential, 0, zc, zx, {});
  CHECK(zv.status == oracle::Status::fail);
  CHECK(zv.worst_check()->tensor == OutputTensor::dk);
}

TEST_CASE("gradients: missing, misshapen or extra tensors are errors", "[backward][budget]") {
  Sample d = direct_case(false);
  const Gradients<double> exact = reference::sequential_backward<double>(d.problem, d.inputs, d.backward);
  Gradients<double> x = exact;
  x.dh0 = HostTensor<double>();
  oracle::Verdict v = oracle::judge_backward(d.problem, d.inputs, d.backward, x, Formulation::sequential, 0, {});
  CHECK(v.status == oracle::Status::error);
  CHECK(v.message.find("dh0") != std::string::npos);
  x = exact;
  x.da = HostTensor<double>(d.problem.gate_shape());
  v = oracle::judge_backward(d.problem, d.inputs, d.backward, x, Formulation::sequential, 0, {});
  CHECK(v.status == oracle::Status::error);
  CHECK(v.message.find("'da'") != std::string::npos);
  x = exact;
  x.dq = HostTensor<double>({1, 2, 3});
  v = oracle::judge_backward(d.problem, d.inputs, d.backward, x, Formulation::sequential, 0, {});
  CHECK(v.status == oracle::Status::error);
}

TEST_CASE("gradients: cotangents must be representable, the backward's scope holds", "[backward][budget]") {
  Sample d = direct_case(false);
  BackwardInputs b = d.backward;
  b.dO[7] = 0.1;  // not a bf16 value
  CHECK_THROWS_WITH(oracle::validate_backward_inputs(d.problem, d.inputs, b),
                    Catch::Contains("dO") && Catch::Contains("bf16"));
  b = d.backward;
  REQUIRE(b.dhT.defined());
  b.dhT[0] = 0.1;  // not an fp32 value
  CHECK_THROWS_WITH(oracle::BackwardContext("x", d.problem, d.inputs, b), Catch::Contains("dhT"));
}

TEST_CASE("gradients: bitwise reruns catch nondeterminism", "[backward][budget]") {
  Sample d = direct_case(false);
  oracle::BackwardContext ctx("rerun", d.problem, d.inputs, d.backward);
  const auto deterministic = [](const Problem& p, const Inputs& in, const BackwardInputs& b) {
    return reference::chunked_backward<double>(p, in, b, 16);
  };
  int calls = 0;
  const auto flaky = [&calls](const Problem& p, const Inputs& in, const BackwardInputs& b) {
    Gradients<double> g = reference::chunked_backward<double>(p, in, b, 16);
    if (++calls % 2 == 0) g.dg[1] = std::nextafter(g.dg[1], 1e300);  // one bit on the second run
    return g;
  };
  const oracle::BudgetOptions bitwise = budget("bitwise");
  CHECK(oracle::evaluate_backward("det", Formulation::chunked, 16, deterministic, ctx, bitwise).passed());
  const oracle::Verdict v = oracle::evaluate_backward("flaky", Formulation::chunked, 16, flaky, ctx, bitwise);
  CHECK(v.status == oracle::Status::fail);
  CHECK(v.worst_check()->tensor == OutputTensor::dg);
  const auto throws = [](const Problem&, const Inputs&, const BackwardInputs&) -> Gradients<double> {
    throw std::runtime_error("kernel exploded");
  };
  const oracle::Verdict e = oracle::evaluate_backward("throws", Formulation::chunked, 16, throws, ctx, {});
  CHECK(e.status == oracle::Status::error);
  CHECK(e.message.find("kernel exploded") != std::string::npos);
}

TEST_CASE("gradients: fixed thresholds are fla's", "[backward][budget]") {
  const oracle::BudgetOptions fixed = budget("fixed");
  CHECK(oracle::fixed_gradient_threshold(fixed, OutputTensor::dq) == 0.008);
  CHECK(oracle::fixed_gradient_threshold(fixed, OutputTensor::dh0) == 0.008);
  CHECK(oracle::fixed_gradient_threshold(fixed, OutputTensor::dg) == 0.02);
  CHECK(oracle::fixed_gradient_threshold(fixed, OutputTensor::db) == 0.02);
  CHECK(oracle::fixed_gradient_threshold(budget("fixed(rel_rms=1e-3)"), OutputTensor::dg) == 1e-3);
  // A bf16 emulation's gradients sit well inside them; 3% off dbeta does not.
  Sample d = direct_case(false);
  oracle::BackwardContext ctx("fixed", d.problem, d.inputs, d.backward);
  const Gradients<double> emu = ctx.emulation(Formulation::sequential, 0);
  CHECK(oracle::evaluate_gradients("emu", Formulation::sequential, 0, ctx, emu, fixed).passed());
  Gradients<double> x = emu;
  for (std::int64_t i = 0; i < x.dbeta.numel(); ++i) x.dbeta[i] *= 1.03;
  const oracle::Verdict v = oracle::evaluate_gradients("off", Formulation::sequential, 0, ctx, x, fixed);
  CHECK(v.status == oracle::Status::fail);
  CHECK(v.worst_check()->tensor == OutputTensor::dbeta);
}

// The case on which the CUDA backward (an fp32 exp and log1p, fused gates, a strongly decaying
// token) measured dh0 47 u of M off, 1.22 x the budget without the decays' share of the
// arithmetic floor (reports/results/h100/conformance_backward.json, drawn by
// cuda/tests/backward_test.cpp from this seed). The decay is one fp32 exp of a g near -20: its
// relative error, about |g| u, scales all of dh0. A dh0 that far off now passes; one 40 times
// further off, or with a sign error, still fails.
TEST_CASE("gradients: the decays' fp32 error is in the arithmetic floor", "[backward][budget]") {
  // The suite's draws (cuda/tests/testbed.cpp property_seed, backward_test.cpp), up to the case
  // whose input seed the failure printed.
  std::mt19937_64 rng(20261202ull ^
                      (std::hash<std::string>{}("cuda.recurrent_prefill.backward/backward_conformance") & 0xffffffffull));
  const fuzz::CaseSpace space = fuzz::backward_space(fuzz::CaseSpace::recurrent_prefill());
  std::uint64_t seed = 0;
  fuzz::Case c;
  for (int i = 0; i < 1000 && c.seed != 303610320617262645ull; ++i) {
    seed = rng();
    c = fuzz::draw_case(seed, space);
  }
  REQUIRE(c.seed == 303610320617262645ull);
  REQUIRE(c.problem.T == 1);
  REQUIRE(c.problem.gate_mode == GateMode::fused);
  const Inputs inputs = c.inputs();
  const BackwardInputs cot = fuzz::make_backward_inputs(c.problem, seed ^ 0x9e3779b97f4a7c15ull);
  double g = 0, beta = 0;
  reference::load_gates<double>(c.problem, inputs, 0, 0, &g, &beta);
  INFO("g = " << g);
  CHECK(g < -5);
  const oracle::ExactGradients exact = oracle::exact_gradients(c.problem, inputs, cot);
  auto judged = [&](double relative) {
    Gradients<double> actual = exact.value;
    for (std::int64_t i = 0; i < actual.dh0.numel(); ++i) actual.dh0[i] *= 1 + relative;
    oracle::round_gradients(c.problem, actual);
    const Gradients<double> emulation =
        oracle::emulate_backward(c.problem, inputs, cot, Formulation::sequential, 64);
    return oracle::judge_gradients(c.problem, inputs, exact, actual, &emulation, Formulation::sequential, 64,
                                   oracle::BudgetOptions{});
  };
  const double u = std::ldexp(1.0, -24);
  const oracle::Verdict near = judged(47 * u);
  INFO(near.details());
  CHECK(near.status == oracle::Status::pass);
  CHECK(judged(40 * 47 * u).status == oracle::Status::fail);
  CHECK(judged(-2.0).status == oracle::Status::fail);
}
