// The backward references (backward.hpp, backward_chunked.hpp; docs/backward.md):
// - a hand-computed one-token case and the rules of §6 that need no computation (zero-length
//   sequences, what the backward rejects);
// - certification of the long double backward against central finite differences of the long
//   double forward, every input element of small generated cases, each within the bound of
//   docs/backward.md "Finite differences" (truncation h^2 |f'''| / 6 plus rounding eps_L / h);
// - the double backward against the long double one within the analytic model;
// - the chunked backward against the sequential one, every C, to 1e-12 relative to the term
//   magnitudes, and its chunk intermediates: dS0 of every chunk is dh0 of the sequence's
//   suffix from that chunk on, run alone from the chunk's recorded start state.
// Case counts as in the other reference tests (fuzz/catch_properties.hpp; RC_PARAMS overrides).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "fuzz/backward_properties.hpp"
#include "fuzz/catch_properties.hpp"
#include "fuzz/generators.hpp"
#include "oracle/budget.hpp"
#include "reference/backward.hpp"
#include "reference/backward_chunked.hpp"
#include "reference/sequential.hpp"

namespace {

using namespace gdn;
using reference::BackwardInputs;
using reference::Gradients;
using LD = long double;

// Small cases for finite differences: every input element is perturbed (six forward runs each).
// The small-norm regime is left out: there the l2norm's derivatives scale like 1/|x|^3 at
// |x| ~ 1e-5, and no step that the long double forward resolves is in the Taylor regime.
fuzz::CaseSpace tiny_space() {
  fuzz::CaseSpace space = fuzz::backward_space(fuzz::CaseSpace::chunked(3));
  space.max_K = 4;
  space.max_V = 3;
  space.max_H = 2;
  space.max_group = 2;
  space.max_sequences = 3;
  space.max_tokens = 9;
  space.long_chunks = 2;
  space.max_work = 600;
  space.min_work = 16;
  space.small_norms = false;
  return space;
}

struct Prepared {
  Problem p;
  Inputs in;
  BackwardInputs b;
};

Prepared prepare(const fuzz::Case& c) {
  Prepared r{c.problem, c.inputs(), {}};
  r.b = fuzz::make_backward_inputs(r.p, c.seed);
  return r;
}

}  // namespace

TEST_CASE("one token by hand", "[reference][backward]") {
  // K = V = 1, scale 1, no l2norm: S0 = 1, q = 2, k = 1, v = 3, g = 0, beta = 1/2.
  // Sd = 1, p = 1, u = 1, S = 2, o = 4; with dO = 1: dq = S = 2, dk = q (beta (v - Sd k) - k beta Sd) = 1,
  // dv = q k beta = 1, dbeta = q k (v - Sd k) = 4, dg = q (1 - beta k^2) Sd = 1, dh0 = q (1 - beta k^2) = 1.
  Problem p = Problem::packed({1}, 1, 1, 1, 1);
  p.scale = 1.0;
  p.has_h0 = true;
  Inputs in;
  in.q = HostTensor<double>({1, 1, 1}, 2.0);
  in.k = HostTensor<double>({1, 1, 1}, 1.0);
  in.v = HostTensor<double>({1, 1, 1}, 3.0);
  in.g = HostTensor<double>({1, 1}, 0.0);
  in.beta = HostTensor<double>({1, 1}, 0.5);
  in.h0 = HostTensor<double>({1, 1, 1, 1}, 1.0);
  BackwardInputs b;
  b.dO = HostTensor<double>({1, 1, 1}, 1.0);
  for (int C : {0, 1}) {
    const Gradients<double> g = C == 0 ? reference::sequential_backward<double>(p, in, b)
                                       : reference::chunked_backward<double>(p, in, b, 1);
    CHECK(g.dq[0] == 2.0);
    CHECK(g.dk[0] == 1.0);
    CHECK(g.dv[0] == 1.0);
    CHECK(g.dbeta[0] == 4.0);
    CHECK(g.dg[0] == 1.0);
    CHECK(g.dh0[0] == 1.0);
    CHECK_FALSE(g.da.defined());
  }
}

TEST_CASE("a zero-length sequence passes dhT to dh0", "[reference][backward]") {
  Problem p = Problem::packed({0, 2, 0}, 1, 2, 2, 3);
  p.has_h0 = p.has_hT = true;
  const Inputs in = fuzz::make_inputs(p, {}, 7);
  BackwardInputs b;
  b.dO = HostTensor<double>(p.v_shape(), 1.0);
  b.dhT = HostTensor<double>(p.state_shape());
  for (std::int64_t i = 0; i < b.dhT.numel(); ++i) b.dhT[i] = 0.25 * double(i % 7) - 0.5;
  for (int C : {0, 1, 64}) {
    const Gradients<double> g = C == 0 ? reference::sequential_backward<double>(p, in, b)
                                       : reference::chunked_backward<double>(p, in, b, C);
    const std::int64_t block = std::int64_t(p.HV) * p.K * p.V;
    for (int n : {0, 2})
      for (std::int64_t i = 0; i < block; ++i) CHECK(g.dh0[n * block + i] == b.dhT[n * block + i]);
  }
}

// Term magnitudes are the magnitudes of the terms, never of a result that cancelled: rounding
// errors scale with the terms (docs/backward.md, "Comparing gradients"). Two exact
// cancellations by hand (K = 2, V = 1, scale 1, no l2norm, beta = 0, g = 0):
// - dh0 = dS_0 = dhT + q_1 dO_1 + q_0 dO_0, a sum over the whole reverse sweep: with dhT = (1, 1),
//   q_1 = (-2, 1), q_0 = (1, -2), dO = 1, dh0 = (0, 0) and its magnitude the sum of the terms'
//   magnitudes (4, 4). The last step's |dS| alone is 0 (the cancelled sum): every rounding of
//   the sweep would then be judged against 0 (the flaky pure-decay property, fuzz/backward).
// - dbeta_t = du . (v - p) with du = dS^T k: at token 1, dS = dhT + q_1 dO_1 = (-1, 2) and
//   k_1 = (2, 1) give du = 0, and its magnitude, the read's terms (|dhT| + |q_1| |dO_1|)^T |k_1|
//   = (3, 2) . (2, 1) = 8, times |v| = 3 (|dS|^T |k| = 4 would take the read's cancelled sum).
TEST_CASE("term magnitudes do not cancel with the gradient", "[reference][backward]") {
  Problem p = Problem::packed({2}, 1, 1, 2, 1);
  p.scale = 1.0;
  p.has_h0 = p.has_hT = true;
  Inputs in;
  in.q = HostTensor<double>({2, 1, 2});
  in.q[0] = 1, in.q[1] = -2, in.q[2] = -2, in.q[3] = 1;
  in.k = HostTensor<double>({2, 1, 2});
  in.k[0] = 1, in.k[1] = 0, in.k[2] = 2, in.k[3] = 1;
  in.v = HostTensor<double>({2, 1, 1}, 3.0);
  in.g = HostTensor<double>({2, 1}, 0.0);
  in.beta = HostTensor<double>({2, 1}, 0.0);
  in.h0 = HostTensor<double>(p.state_shape(), 0.0);
  BackwardInputs b;
  b.dO = HostTensor<double>({2, 1, 1}, 1.0);
  b.dhT = HostTensor<double>(p.state_shape(), 1.0);
  Gradients<double> m;
  const Gradients<double> g = reference::sequential_backward<double>(p, in, b, &m);
  CHECK(g.dh0[0] == 0.0);
  CHECK(g.dh0[1] == 0.0);
  CHECK(m.dh0[0] == 4.0);
  CHECK(m.dh0[1] == 4.0);
  CHECK(g.dbeta[1] == 0.0);
  CHECK(m.dbeta[1] == 24.0);
}

TEST_CASE("the backward rejects what it does not cover", "[reference][backward][negative]") {
  Problem p = Problem::packed({3, 2}, 1, 1, 2, 2);
  p.has_hT = true;
  const Inputs in = fuzz::make_inputs(p, {}, 3);
  BackwardInputs b;
  auto argument_of = [&](const Problem& problem, const Inputs& inputs, const BackwardInputs& backward) {
    try {
      reference::sequential_backward<double>(problem, inputs, backward);
    } catch (const ProblemError& e) {
      return e.argument();
    }
    return std::string("(accepted)");
  };
  CHECK(argument_of(p, in, b) == "dO");
  b.dO = HostTensor<double>({5, 1, 3});
  CHECK(argument_of(p, in, b) == "dO");
  b.dO = HostTensor<double>(p.v_shape());
  CHECK(argument_of(p, in, b) == "(accepted)");
  b.dhT = HostTensor<double>({1, 1, 2, 2});
  CHECK(argument_of(p, in, b) == "dhT");
  Problem no_final = p;
  no_final.has_hT = false;
  b.dhT = HostTensor<double>(p.state_shape());
  CHECK(argument_of(no_final, in, b) == "dhT");
  Problem per_token = p;
  per_token.store_intermediate_states = true;
  CHECK(argument_of(per_token, in, b) == "store_intermediate_states");
  Problem cache = p;
  cache.state_slots = 2;
  Inputs cache_in = in;
  cache_in.h0 = HostTensor<double>(cache.state_shape());
  cache_in.state_indices = {1, 0};
  BackwardInputs cache_b;
  cache_b.dO = b.dO;
  CHECK(argument_of(cache, cache_in, cache_b) == "state_slots");
  try {
    reference::chunked_backward<double>(p, in, b, 0);
    FAIL("chunk_size 0 accepted");
  } catch (const ProblemError& e) {
    CHECK(e.argument() == "chunk_size");
  }
}

// docs/backward.md, "Finite differences": for every input element x of the case, with the
// loss f(x) = <dO, o> + <dhT, hT> evaluated by the long double forward,
//   FD = (f(x + h) - f(x - h)) / 2h,  h = 2^-21 2^ceil(log2 max(|x|, 1))  (about cbrt(u_ld) max(|x|, 1)),
// and |FD - f'(x)| <= h^2 |f'''| / 6 + eps_L / h. f''' is estimated from a five-point third
// difference at H = 2^11 h (its own rounding error 3 eps_L / H^3 added), eps_L bounds the
// forward's rounding of f: the analytic relative bound at long double's u on every output
// times the cotangent's magnitude, plus the dot product's own rounding. The long double
// backward's own error is rel_ld x its term magnitude. Every element must lie within twice the
// sum (the factor covers the estimate of f''' over a wider interval than [x - h, x + h]).
TEST_CASE("finite differences of the long double forward certify the backward", "[reference][backward][fd]") {
  double worst_ratio = 0, worst_relative = 0;
  long coordinates = 0;
  fuzz::rc_section("central differences, every input element", [&]() {
    const fuzz::Case c = *fuzz::gen_case(tiny_space());
    Prepared r = prepare(c);
    const Problem& p = r.p;
    Gradients<LD> terms;
    const Gradients<LD> exact = reference::sequential_backward<LD>(p, r.in, r.b, &terms);
    const LD rel_ld = static_cast<LD>(oracle::analytic_relative_bound(p, r.in, Formulation::sequential, 64, true));
    const LD u_ld = std::numeric_limits<LD>::epsilon() / 2;
    // eps_L from the unperturbed outputs (a perturbation of 2^-10 relative changes them by as much).
    const Outputs<LD> out = reference::sequential<LD>(p, r.in);
    LD max_o = 0, max_hT = 0, sum_dO = 0, sum_dhT = 0, dot_terms = 0;
    for (std::int64_t i = 0; i < out.o.numel(); ++i) {
      max_o = std::max(max_o, std::fabs(out.o[i]));
      sum_dO += std::fabs(static_cast<LD>(r.b.dO[i]));
      dot_terms += std::fabs(static_cast<LD>(r.b.dO[i]) * out.o[i]);
    }
    if (r.b.dhT.defined())
      for (std::int64_t i = 0; i < out.hT.numel(); ++i) {
        max_hT = std::max(max_hT, std::fabs(out.hT[i]));
        sum_dhT += std::fabs(static_cast<LD>(r.b.dhT[i]));
        dot_terms += std::fabs(static_cast<LD>(r.b.dhT[i]) * out.hT[i]);
      }
    const LD terms_count = static_cast<LD>(out.o.numel() + out.hT.numel());
    // Outputs that a perturbation of x by 2H changes: allow 2x the unperturbed magnitudes.
    const LD eps_L = 2 * (rel_ld * (sum_dO * max_o + sum_dhT * max_hT) + terms_count * u_ld * dot_terms);

    LD case_error = 0, case_scale = 0;  // normwise over every gradient of the case
    auto loss = [&](const Inputs& in) {
      return reference::backward_loss<LD>(p, reference::sequential<LD>(p, in), r.b);
    };
    auto certify = [&](const char* name, HostTensor<double> Inputs::*tensor, const HostTensor<LD>& gradient,
                       const HostTensor<LD>& magnitude) {
      if (!(r.in.*tensor).defined()) return;
      RC_ASSERT(gradient.defined());
      LD largest_term = 0;
      for (std::int64_t i = 0; i < magnitude.numel(); ++i) largest_term = std::max(largest_term, magnitude[i]);
      const LD own = rel_ld * largest_term;
      LD worst_error = 0, largest = 0;
      for (std::int64_t i = 0; i < (r.in.*tensor).numel(); ++i) {
        const double x = (r.in.*tensor)[i];
        // The softplus of §3 switches to the identity at a + dt_bias = 20: no derivative
        // spans the switch. Elements within reach of it are skipped.
        if (p.gate_mode == GateMode::fused && (tensor == &Inputs::a || tensor == &Inputs::dt_bias)) {
          bool near = false;
          for (std::int64_t t = 0; t < p.T; ++t)
            for (int j = 0; j < p.HV; ++j) {
              if (tensor == &Inputs::a && t * p.HV + j != i) continue;
              if (tensor == &Inputs::dt_bias && j != i) continue;
              const double s = r.in.a[t * p.HV + j] + r.in.dt_bias[j];
              if (std::fabs(s - 20.0) < 0.01 * std::max(1.0, std::fabs(x))) near = true;
            }
          if (near) continue;
        }
        const double h = std::ldexp(1.0, -21 + std::max(0, std::ilogb(std::max(std::fabs(x), 1.0)) + 1));
        const double H = std::ldexp(h, 11);
        // Under l2norm a q or k row varies on the scale of its norm sqrt(sum x^2 + 1e-6): the
        // third difference at 2H, which bounds the truncation, is meaningful only where 2H is far
        // below it. Rows shorter than 64 H (small-norm rows, a K = 1 key near 0) are skipped, as
        // docs/backward.md says for the small-norm regime.
        if (p.use_qk_l2norm && (tensor == &Inputs::q || tensor == &Inputs::k)) {
          const std::int64_t row = i / p.K;
          double sum = 1e-6;
          for (int e = 0; e < p.K; ++e) sum += (r.in.*tensor)[row * p.K + e] * (r.in.*tensor)[row * p.K + e];
          if (std::sqrt(sum) < 64 * H) continue;
        }
        Inputs in = r.in;
        auto at = [&](double value) {
          (in.*tensor)[i] = value;
          return loss(in);
        };
        const LD fp = at(x + h), fm = at(x - h), fp2 = at(x + 2 * H), fp1 = at(x + H), fm1 = at(x - H),
                 fm2 = at(x - 2 * H);
        const LD step = static_cast<LD>(x + h) - static_cast<LD>(x - h);  // exact: x +- h are doubles
        const LD fd = (fp - fm) / step;
        const LD HH = static_cast<LD>(H);
        const LD third = std::fabs((fp2 - 2 * fp1 + 2 * fm1 - fm2) / (2 * HH * HH * HH)) + 3 * eps_L / (HH * HH * HH);
        const LD hh = static_cast<LD>(h);
        const LD bound = 2 * (hh * hh / 6 * third + eps_L / hh + own);
        const LD error = std::fabs(fd - gradient[i]);
        if (!(error <= bound)) {
          RC_FAIL(std::string(name) + "[" + std::to_string(i) + "]: finite difference " +
                  std::to_string(static_cast<double>(fd)) + " vs backward " +
                  std::to_string(static_cast<double>(gradient[i])) + ", error " +
                  std::to_string(static_cast<double>(error)) + " > bound " + std::to_string(static_cast<double>(bound)));
        }
        worst_ratio = std::max(worst_ratio, static_cast<double>(error / bound));
        worst_error = std::max(worst_error, error);
        largest = std::max(largest, std::fabs(gradient[i]));
        ++coordinates;
      }
      case_error = std::max(case_error, worst_error);
      case_scale = std::max(case_scale, largest);
    };
    certify("q", &Inputs::q, exact.dq, terms.dq);
    certify("k", &Inputs::k, exact.dk, terms.dk);
    certify("v", &Inputs::v, exact.dv, terms.dv);
    certify("g", &Inputs::g, exact.dg, terms.dg);
    certify("beta", &Inputs::beta, exact.dbeta, terms.dbeta);
    certify("a", &Inputs::a, exact.da, terms.da);
    certify("b", &Inputs::b, exact.db, terms.db);
    certify("A_log", &Inputs::A_log, exact.dA_log, terms.dA_log);
    certify("dt_bias", &Inputs::dt_bias, exact.ddt_bias, terms.ddt_bias);
    if (p.has_h0) certify("h0", &Inputs::h0, exact.dh0, terms.dh0);
    if (case_scale > 0) worst_relative = std::max(worst_relative, static_cast<double>(case_error / case_scale));
  }, 60);
  std::cout << "  finite differences: " << coordinates << " elements, worst error / bound " << worst_ratio
            << ", worst normwise relative error per case " << worst_relative << "\n";
}

// Long double certifies double: the double backward's normwise difference from the long double
// one (relative to the term magnitudes; `tensor`: the worst) and the analytic relative bound at
// double's u that it must stay within.
namespace {
struct LongDoubleCheck {
  double difference, allowed;
  std::string tensor;
};
LongDoubleCheck long_double_check(const fuzz::Case& c) {
  const Prepared r = prepare(c);
  const Gradients<double> d = reference::sequential_backward<double>(r.p, r.in, r.b);
  const Gradients<double> ld = reference::sequential_backward<LD>(r.p, r.in, r.b).cast<double>();
  LongDoubleCheck check{0, 0, {}};
  check.difference = fuzz::gradient_difference(ld, d, fuzz::gradient_scale(r.p, r.in, r.b), &check.tensor);
  check.allowed = oracle::analytic_relative_bound(r.p, r.in, Formulation::sequential, 64, false);
  return check;
}
}  // namespace

TEST_CASE("the double backward equals the long double backward", "[reference][backward][long_double]") {
  double worst = 0, worst_margin = 0;
  fuzz::rc_section("sequential_backward<double> == sequential_backward<long double>", [&]() {
    fuzz::CaseSpace space = fuzz::backward_space(fuzz::CaseSpace::chunked(64));
    space.max_work = 3e5;
    const LongDoubleCheck check = long_double_check(*fuzz::gen_case(space));
    worst = std::max(worst, check.difference);
    worst_margin = std::max(worst_margin, check.difference / check.allowed);
    RC_ASSERT(check.difference <= check.allowed);
  }, 200);
  std::cout << "  double vs long double backward: worst relative difference " << worst << ", worst margin "
            << worst_margin << "\n";
}

// Counterexamples of the test above, replayed as explicit cases (a RapidCheck reproduce string
// is tied to the generator's code; a Case is not): each failed by the factor given because a
// term magnitude took a value formed in the step, which cancelled, instead of its terms'
// magnitudes (reference/backward.hpp, docs/budgets.md "Gradients"). K = V = 1 and one or two
// tokens: nothing else enters the tensor's largest M.
// - db (19.9x): b = 8.6, 1 - sigmoid(b) = 1.8e-4 carries sigmoid(b)'s rounding, about u; its
//   magnitude is 1 + sigmoid(b);
// - dq (12.7x): K = 1, beta = 1.19, the state after the write S = (1 - beta) Sd + beta k v
//   cancels to 7.9e-5 from terms 0.036; dq = S dO took |S|, not |Sd| + |k| |u|;
// - dv (1.28x): one token, dS = dhT + qs dO cancels; dv = beta dS^T k took |dS|, not
//   |dhT| + |qs| |dO|;
// - da (1.18x): two tokens, strong decay (g = -16.3, -7.0), bf16: dg = <dSd, Sd> of the
//   in-step sums dS + qs dO^T, dSd = dS + k dp^T, whose values the magnitude took (the decay's
//   rounding alone, about 2 u |g| = 33 u, is below the bound, 157 u).
TEST_CASE("the double backward equals the long double backward: counterexamples", "[reference][backward][long_double]") {
  auto make = [](int T, DType dtype, DType gate, bool negeig, bool l2norm, bool hT, fuzz::GateRegime regime,
                 std::uint64_t seed) {
    fuzz::Case c;
    c.problem = Problem::packed({T}, 1, 1, 1, 1);
    c.problem.input_dtype = dtype;
    c.problem.gate_dtype = gate;
    c.problem.gate_mode = GateMode::fused;
    c.problem.allow_negative_eigenvalues = negeig;
    c.problem.use_qk_l2norm = l2norm;
    c.problem.has_h0 = true;
    c.problem.has_hT = hT;
    c.options.regime = regime;
    c.seed = seed;
    return c;
  };
  using R = fuzz::GateRegime;
  const std::vector<fuzz::Case> cases{
      make(1, DType::bf16, DType::bf16, true, false, true, R::strong, 12923635204846477126ull),  // db
      make(1, DType::bf16, DType::bf16, true, false, false, R::mild, 15425560400704433581ull),   // dq
      make(1, DType::f16, DType::f16, false, true, true, R::mild, 4794049988686216109ull),       // dv
      make(2, DType::bf16, DType::bf16, true, true, true, R::strong, 3543878866044761944ull),    // da
  };
  for (const fuzz::Case& c : cases) {
    const LongDoubleCheck check = long_double_check(c);
    INFO(c << ": worst " << check.tensor << ", margin " << check.difference / check.allowed);
    CHECK(check.difference <= check.allowed);
    CHECK(check.difference / check.allowed < 0.1);
  }
}

// The two routes: for every C, on contractive inputs, normwise relative to the term
// magnitudes within 1e-12 (the analytic bound of both formulations is at most about 3e-12 for
// the generated sizes; docs/backward.md gives the measured figures).
TEST_CASE("sequential and chunked backward agree for every C", "[reference][backward][chunked]") {
  double worst = 0;
  fuzz::rc_section("sequential_backward == chunked_backward (C in 1..129)", [&]() {
    const int C = *rc::gen::element(1, 2, 3, 7, 16, 63, 64, 65, *rc::gen::inRange(1, 130));
    fuzz::CaseSpace space = fuzz::backward_space(fuzz::CaseSpace::chunked(C));
    space.max_work = 1e6;
    const fuzz::Case c = *fuzz::gen_case(space);
    const Prepared r = prepare(c);
    const Gradients<double> s = reference::sequential_backward<double>(r.p, r.in, r.b);
    const Gradients<double> k = reference::chunked_backward<double>(r.p, r.in, r.b, C);
    const fuzz::GradientScale scale = fuzz::gradient_scale(r.p, r.in, r.b);
    std::string tensor;
    const double difference = fuzz::gradient_difference(s, k, scale, &tensor);
    worst = std::max(worst, difference);
    const double allowed = oracle::analytic_relative_bound(r.p, r.in, Formulation::sequential, C, false) +
                           oracle::analytic_relative_bound(r.p, r.in, Formulation::chunked, C, false);
    RC_ASSERT(difference <= std::min(allowed, 1e-12));
  }, 300);
  std::cout << "  worst sequential vs chunked backward relative difference: " << worst << "\n";
}

TEST_CASE("chunk intermediates: dS0 is the dh0 of the suffix", "[reference][backward][chunked][trace]") {
  fuzz::rc_section("dS0 of every chunk == dh0 of the suffix run alone", []() {
    const int C = *rc::gen::element(1, 2, 3, 7, 16, *rc::gen::inRange(1, 40));
    fuzz::CaseSpace space = fuzz::backward_space(fuzz::CaseSpace::chunked(C));
    space.max_work = 2e5;
    const fuzz::Case c = *fuzz::gen_case(space);
    const Prepared r = prepare(c);
    const Problem& p = r.p;
    reference::ChunkBackwardTrace<double> trace;
    reference::chunked_backward<double>(p, r.in, r.b, C, &trace);
    const double allowed_relative = 2 * (oracle::analytic_relative_bound(p, r.in, Formulation::sequential, C, false) +
                                         oracle::analytic_relative_bound(p, r.in, Formulation::chunked, C, false));
    for (const auto& record : trace.records) {
      const int n = record.forward.sequence, j = record.forward.head;
      RC_ASSERT(record.dS_end.rows() == p.K);
      RC_ASSERT(record.dA.rows() == record.forward.length);
      // The suffix of sequence n from this chunk on, value head j's state from the record.
      const std::int64_t t0 = record.forward.begin, t1 = p.seq_begin(n) + p.seq_len(n);
      Problem suffix = p;
      suffix.cu_seqlens = {0, t1 - t0};
      suffix.T = t1 - t0;
      suffix.has_h0 = true;
      Inputs in;
      auto rows = [](const HostTensor<double>& x, std::int64_t a, std::int64_t b) {
        if (!x.defined()) return HostTensor<double>();
        Shape shape = x.shape();
        const std::int64_t width = x.numel() / shape[0];
        shape[0] = b - a;
        HostTensor<double> out(shape);
        std::copy(x.data() + a * width, x.data() + b * width, out.data());
        return out;
      };
      in.q = rows(r.in.q, t0, t1);
      in.k = rows(r.in.k, t0, t1);
      in.v = rows(r.in.v, t0, t1);
      in.g = rows(r.in.g, t0, t1);
      in.beta = rows(r.in.beta, t0, t1);
      in.a = rows(r.in.a, t0, t1);
      in.b = rows(r.in.b, t0, t1);
      in.A_log = r.in.A_log;
      in.dt_bias = r.in.dt_bias;
      in.h0 = HostTensor<double>(suffix.state_shape());
      reference::store_state(suffix, record.forward.S0, 0, j, in.h0.data());
      BackwardInputs b;
      b.dO = rows(r.b.dO, t0, t1);
      if (r.b.dhT.defined()) b.dhT = rows(r.b.dhT, n, n + 1);
      // Measured against the term magnitudes of dh0 (docs/backward.md), not against |dh0|
      // itself: dh0 may cancel (small-norm rows under l2norm), its rounding error does not.
      Gradients<double> terms;
      const Gradients<double> g = reference::sequential_backward<double>(suffix, in, b, &terms);
      reference::Matrix<double> dh0(p.K, p.V), dh0_terms(p.K, p.V);
      reference::load_state<double>(suffix, g.dh0.data(), 0, j, dh0);
      reference::load_state<double>(suffix, terms.dh0.data(), 0, j, dh0_terms);
      const double scale = std::max({dh0.cwiseAbs().maxCoeff(), dh0_terms.cwiseAbs().maxCoeff(),
                                     record.dS_end.cwiseAbs().maxCoeff()});
      RC_ASSERT((dh0 - record.dS0).cwiseAbs().maxCoeff() <= allowed_relative * std::max(scale, 1e-300) * 4);
    }
  }, 200);
}
