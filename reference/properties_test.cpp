// The property suite (fuzz/properties.hpp) instantiated for the double references: the
// sequential one and the chunked one at C = 1, 2, 3, 7, 16, 63, 64, 65 and a random C per case,
// plus what only the references can be asked: sequential == chunked for every C to ~1e-12,
// long double agreement, the chunked intermediates against their definitions (§4), the fused
// gates against §3, and hard resets with g = -inf.
//
// Case counts: 300 random cases per property per implementation (fuzz/catch_properties.hpp),
// 200 to 400 for the reference-only checks;
// RC_PARAMS="max_success=N" overrides it (the sanitizer job uses 25), RC_PARAMS="seed=S"
// replays a run, and a failure prints the seed, the shrunk Case and the failing checks.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "fuzz/catch_properties.hpp"
#include "fuzz/generators.hpp"
#include "fuzz/properties.hpp"
#include "oracle/budget.hpp"
#include "reference/chunked.hpp"
#include "reference/prepare.hpp"
#include "reference/sequential.hpp"

namespace {

using namespace gdn;
using fuzz::Case;
using fuzz::CaseSpace;

constexpr double kU = 0x1p-53;

// The double references' budget (docs/budgets.md, "(d) analytic").
oracle::BudgetOptions analytic() {
  oracle::BudgetOptions budget;
  budget.model = oracle::BudgetModel::analytic;
  return budget;
}

// The double references as Implementations (test-local: the registry of named
// implementations lives in oracle/).
class SequentialDouble : public Implementation {
 public:
  std::string name() const override { return "reference.sequential.f64"; }
  Formulation formulation() const override { return Formulation::sequential; }
  Outputs<double> run(const Problem& p, const Inputs& in) override { return reference::sequential<double>(p, in); }
};

class ChunkedDouble : public Implementation {
 public:
  explicit ChunkedDouble(int chunk_size) : chunk_size_(chunk_size) {}
  std::string name() const override { return "reference.chunked.f64.c" + std::to_string(chunk_size_); }
  Formulation formulation() const override { return Formulation::chunked; }
  int chunk_size() const override { return chunk_size_; }
  bool supports(const Problem& p, std::string* why) const override {
    if (!p.store_intermediate_states) return true;
    if (why) *why = "per-token intermediate states (a sequential-only option)";
    return false;
  }
  Outputs<double> run(const Problem& p, const Inputs& in) override {
    return reference::chunked<double>(p, in, chunk_size_);
  }

 private:
  int chunk_size_;
};

// The generic suite's cases: four times the default cost cap, so that K = V = 256 cases reach
// C + 1 tokens (4.3e6 work); the largest cases stay a small share of the suite.
CaseSpace reference_space(int chunk_size) {
  CaseSpace space = CaseSpace::chunked(chunk_size);
  space.max_work = 1.2e7;
  return space;
}

// Normwise relative difference max|x - r| / max|r| (0 when both vanish).
double relative(const HostTensor<double>& reference, const HostTensor<double>& x) {
  const double scale = oracle::max_abs(reference);
  const double error = oracle::difference(reference, x).max_abs;
  return error == 0 ? 0 : error / scale;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The generic property suite. Each TEST_CASE is one implementation (a separate ctest entry).

TEST_CASE("property suite: sequential double reference", "[properties]") {
  SequentialDouble impl;
  CaseSpace space = reference_space(64);
  space.intermediate_states = true;
  const oracle::BudgetOptions budget = analytic();
  for (const fuzz::Property& property : fuzz::all_properties())
    fuzz::rc_section(impl.name() + ": " + property.name, [&]() {
      const Case c = *fuzz::gen_case(space);
      fuzz::rc_require(property.check(impl, c, budget));
    });
}

#define GDN_CHUNKED_SUITE(C)                                                                 \
  TEST_CASE("property suite: chunked double reference, C = " #C, "[properties][chunked]") { \
    ChunkedDouble impl(C);                                                                   \
    const CaseSpace space = reference_space(C);                                              \
    const oracle::BudgetOptions budget = analytic();                            \
    for (const fuzz::Property& property : fuzz::all_properties())                            \
      fuzz::rc_section(impl.name() + ": " + property.name, [&]() {                           \
        const Case c = *fuzz::gen_case(space);                                               \
        fuzz::rc_require(property.check(impl, c, budget));                               \
      });                                                                                    \
  }
GDN_CHUNKED_SUITE(1)
GDN_CHUNKED_SUITE(2)
GDN_CHUNKED_SUITE(3)
GDN_CHUNKED_SUITE(7)
GDN_CHUNKED_SUITE(16)
GDN_CHUNKED_SUITE(63)
GDN_CHUNKED_SUITE(64)
GDN_CHUNKED_SUITE(65)

TEST_CASE("property suite: chunked double reference, random C per case", "[properties][chunked]") {
  const oracle::BudgetOptions budget = analytic();
  for (const fuzz::Property& property : fuzz::all_properties())
    fuzz::rc_section("reference.chunked.f64.random_C: " + property.name, [&]() {
      const int C = *rc::gen::inRange(1, 130);
      ChunkedDouble impl(C);
      const Case c = *fuzz::gen_case(reference_space(C));
      fuzz::rc_require(property.check(impl, c, budget));
    });
}

// ---------------------------------------------------------------------------------------------
// What only the references are asked.

// The references' contract as a flat bound: for every C, on contractive inputs, chunked and
// sequential agree to 1e-12 normwise relative (o and hT). The analytic budget
// u (64 sqrt((L + 1)(K + V)) + 16 Gamma_C) is about 2.6e-12 at its largest for the generated
// sizes; measured differences stay near 1e-14 (docs/budgets.md, "(d) analytic"), so the flat
// 1e-12 holds with a wide margin.
TEST_CASE("sequential equals chunked for every C to 1e-12 relative", "[reference][chunked]") {
  double worst = 0;
  fuzz::rc_section("sequential == chunked (C in 1..129)", [&worst]() {
    const int C = *rc::gen::element(1, 2, 3, 7, 16, 63, 64, 65, *rc::gen::inRange(1, 130));
    const Case c = *fuzz::gen_case(CaseSpace::chunked(C));
    const Inputs in = c.inputs();
    const auto s = reference::sequential<double>(c.problem, in);
    const auto k = reference::chunked<double>(c.problem, in, C);
    const double error = std::max(relative(s.o, k.o), c.problem.has_hT ? relative(s.hT, k.hT) : 0.0);
    worst = std::max(worst, error);
    RC_ASSERT(error <= 1e-12);
  }, 400);
  std::cout << "  worst sequential vs chunked relative difference: " << worst << "\n";
}

// Long double certifies double: both double references within the double allowance of the
// long double recurrence (matches_long_double above); here the long double chunked form
// against the long double recurrence, compared in long double, under the same error model at
// long double's own u = 2^-64 (the analytic budget at precision f80).
TEST_CASE("long double chunked equals long double sequential", "[reference][long_double]") {
  fuzz::rc_section("chunked<long double> == sequential<long double>", []() {
    const int C = *rc::gen::inRange(1, 80);
    CaseSpace space = CaseSpace::chunked(C);
    space.max_work = 4e5;  // long double has no SIMD: keep it quick
    const Case c = *fuzz::gen_case(space);
    const Inputs in = c.inputs();
    const auto s = reference::sequential<long double>(c.problem, in);
    const auto k = reference::chunked<long double>(c.problem, in, C);
    const long double allowed =
        oracle::analytic_relative_bound(c.problem, in, Formulation::chunked, C, /*long_double=*/true);
    auto relative_ld = [](const HostTensor<long double>& r, const HostTensor<long double>& x) {
      long double scale = 0, error = 0;
      for (std::int64_t i = 0; i < r.numel(); ++i) {
        scale = std::max(scale, std::fabs(r[i]));
        error = std::max(error, std::fabs(r[i] - x[i]));
      }
      return error == 0 ? 0.0L : error / scale;
    };
    RC_ASSERT(relative_ld(s.o, k.o) <= allowed);
    if (c.problem.has_hT) RC_ASSERT(relative_ld(s.hT, k.hT) <= allowed);
  }, 200);
}

// The chunked intermediates against the definitions of §4, each recomputed in long double from
// the record and the inputs, and each chunk's S_end against the sequential state at its last
// token (the sequential reference's per-token intermediate states).
TEST_CASE("chunked intermediates follow their definitions", "[reference][chunked][trace]") {
  fuzz::rc_section("A, T, W, U, Vnew, S0, S_end of every chunk", []() {
    const int C = *rc::gen::element(1, 2, 3, 7, 16, 63, 64, 65, *rc::gen::inRange(1, 100));
    CaseSpace space = CaseSpace::chunked(C);
    space.max_work = 1e6;
    Case c = *fuzz::gen_case(space);
    Problem& p = c.problem;
    const Inputs in = c.inputs();
    reference::ChunkTrace<double> trace;
    reference::chunked<double>(p, in, C, &trace);
    Problem with_states = p;
    with_states.store_intermediate_states = true;
    const auto states = reference::sequential<double>(with_states, in);
    using LMatrix = Eigen::Matrix<long double, Eigen::Dynamic, Eigen::Dynamic>;
    const reference::ChunkRecord<double>* previous = nullptr;
    for (const auto& r : trace.records) {
      const int c_len = r.length, K = p.K, V = p.V, h = r.head / p.group_size();
      RC_ASSERT(c_len >= 1);
      RC_ASSERT(c_len <= C);
      // Inputs of the chunk in long double: k^, q^ (scale folded in), g, beta.
      LMatrix Kh(c_len, K), Qh(c_len, K), Vc(c_len, V);
      std::vector<long double> g(static_cast<std::size_t>(c_len)), beta(static_cast<std::size_t>(c_len));
      for (int i = 0; i < c_len; ++i) {
        std::vector<long double> q(static_cast<std::size_t>(K)), k(static_cast<std::size_t>(K));
        reference::load_qk(p, in, r.begin + i, h, q.data(), k.data());
        reference::load_gates(p, in, r.begin + i, r.head, &g[static_cast<std::size_t>(i)], &beta[static_cast<std::size_t>(i)]);
        for (int d = 0; d < K; ++d) {
          Kh(i, d) = k[static_cast<std::size_t>(d)];
          Qh(i, d) = q[static_cast<std::size_t>(d)];
        }
        for (int d = 0; d < V; ++d) Vc(i, d) = in.v[((r.begin + i) * p.HV + r.head) * V + d];
      }
      // decay(i, j) = exp(g_{j+1} + ... + g_i), summed directly (no cumulative-sum difference).
      auto decay = [&](int i, int j) {
        long double sum = 0;
        for (int t = j + 1; t <= i; ++t) sum += g[static_cast<std::size_t>(t)];
        return std::exp(sum);
      };
      auto decay_from_start = [&](int i) { return decay(i, -1); };
      // The reference forms decays from differences of running sums gamma_i = g_1 + ... + g_i:
      // each sum carries up to c u max|gamma| of absolute error, a difference twice that, and
      // exp turns an absolute error e of its argument into a relative error e.
      long double max_gamma = 0;
      for (int i = 0; i < c_len; ++i) max_gamma = std::max<long double>(max_gamma, std::fabs(r.gamma(i)));
      const long double gamma_error = 2 * c_len * kU * max_gamma;
      // A: strictly lower, A_ij = beta_i decay(i, j) k^_i . k^_j. |A_ij| <= 2 |k_i||k_j|; a K-term
      // dot product (K u), beta, exp and the products (8 u), and the decay's exponent.
      for (int i = 0; i < c_len; ++i)
        for (int j = 0; j < c_len; ++j) {
          if (j >= i) {
            RC_ASSERT(r.A(i, j) == 0.0);
            continue;
          }
          const long double exact = beta[static_cast<std::size_t>(i)] * decay(i, j) * Kh.row(i).dot(Kh.row(j));
          const long double bound = ((K + 8) * kU + gamma_error) * 2 * Kh.row(i).norm() * Kh.row(j).norm() + 1e-300;
          RC_ASSERT(std::fabs(static_cast<long double>(r.A(i, j)) - exact) <= bound);
        }
      // T (I + A) = I and (I + A) T = I: forward substitution is backward stable,
      // |residual| <= c u |T| |I + A| elementwise; we allow 4 c u max(|T||I+A|).
      const LMatrix IA = LMatrix::Identity(c_len, c_len) + r.A.cast<long double>();
      const LMatrix T = r.T.cast<long double>();
      const long double scale = (T.cwiseAbs() * IA.cwiseAbs()).maxCoeff();
      RC_ASSERT(((T * IA) - LMatrix::Identity(c_len, c_len)).cwiseAbs().maxCoeff() <= 4 * (c_len + 1) * kU * scale);
      RC_ASSERT(((IA * T) - LMatrix::Identity(c_len, c_len)).cwiseAbs().maxCoeff() <= 4 * (c_len + 1) * kU * scale);
      for (int i = 0; i < c_len; ++i) RC_ASSERT(r.T(i, i) == 1.0);  // unit lower triangular
      // W = T diag(beta e^gamma) K^ and U = T diag(beta) V: W and U were solved, T computed by a
      // separate solve, so they agree to the solves' errors, c u |T| |rhs| each (W's right-hand
      // side also carries the decays' error).
      LMatrix RW(c_len, K), RU(c_len, V);
      for (int i = 0; i < c_len; ++i) {
        RW.row(i) = beta[static_cast<std::size_t>(i)] * decay_from_start(i) * Kh.row(i);
        RU.row(i) = beta[static_cast<std::size_t>(i)] * Vc.row(i);
      }
      const long double w_scale = (T.cwiseAbs() * RW.cwiseAbs()).maxCoeff() + 1e-300;
      const long double u_scale = (T.cwiseAbs() * RU.cwiseAbs()).maxCoeff() + 1e-300;
      RC_ASSERT((r.W.cast<long double>() - T * RW).cwiseAbs().maxCoeff() <=
                (8 * (c_len + 1) * kU + gamma_error) * w_scale);
      RC_ASSERT((r.U.cast<long double>() - T * RU).cwiseAbs().maxCoeff() <= 8 * (c_len + 1) * kU * u_scale);
      // Vnew = U - W S0 (a K-term product).
      const LMatrix S0 = r.S0.cast<long double>();
      const long double v_scale = r.U.cwiseAbs().maxCoeff() + (r.W.cast<long double>().cwiseAbs() * S0.cwiseAbs()).maxCoeff() + 1e-300;
      RC_ASSERT((r.Vnew.cast<long double>() - (r.U.cast<long double>() - r.W.cast<long double>() * S0)).cwiseAbs().maxCoeff() <=
                2 * (K + 2) * kU * v_scale);
      // S0 is the previous chunk's S_end (same sequence and head) or h0, exactly.
      if (r.chunk > 0) {
        RC_ASSERT(previous != nullptr);
        RC_ASSERT(previous->sequence == r.sequence);
        RC_ASSERT(previous->head == r.head);
        RC_ASSERT(previous->S_end == r.S0);
      }
      // S_end equals the sequential state after the chunk's last token, within the double
      // references' allowance.
      Eigen::MatrixXd expected(K, V);
      const std::int64_t t_last = r.begin + c_len - 1;
      const double* state = states.intermediate.data() + (t_last * p.HV + r.head) * std::int64_t(K) * V;
      for (int kk = 0; kk < K; ++kk)
        for (int vv = 0; vv < V; ++vv)
          expected(kk, vv) = p.state_layout == StateLayout::k_major ? state[std::int64_t(kk) * V + vv]
                                                                    : state[std::int64_t(vv) * K + kk];
      const double allowed =
          oracle::analytic_relative_bound(p, in, Formulation::sequential, 0, /*long_double=*/false) *
              std::max(expected.cwiseAbs().maxCoeff(), oracle::max_abs(states.intermediate)) +
          1e-300;
      RC_ASSERT((r.S_end - expected).cwiseAbs().maxCoeff() <= allowed);
      previous = &r;
    }
  }, 200);
}

// §3 against the references: fused gates equal direct gates computed from the formula in long
// double and passed at full precision (f64 inputs, so nothing is rounded on the way). The
// references evaluate the formula in double: u relative in g and beta, far below the allowance.
TEST_CASE("fused gates equal direct gates from the formula of section 3", "[reference][gates]") {
  fuzz::rc_section("fused == direct(g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b))", []() {
    CaseSpace space;
    space.fused_gates = true;
    space.max_work = 1e6;
    Case c = *fuzz::gen_case(space);
    Problem fused = c.problem;
    fused.gate_mode = GateMode::fused;
    fused.allow_negative_eigenvalues = *rc::gen::arbitrary<bool>();
    const Inputs in_fused = fuzz::make_inputs(fused, c.options, c.seed);
    Problem direct = fused;
    direct.gate_mode = GateMode::direct;
    direct.allow_negative_eigenvalues = false;
    direct.input_dtype = DType::f64;
    direct.gate_dtype = DType::f64;
    Inputs in_direct = in_fused;
    in_direct.a = in_direct.b = in_direct.A_log = in_direct.dt_bias = HostTensor<double>();
    in_direct.g = HostTensor<double>(direct.gate_shape());
    in_direct.beta = HostTensor<double>(direct.gate_shape());
    for (std::int64_t i = 0; i < in_direct.g.numel(); ++i) {
      const int j = static_cast<int>(i % fused.HV);
      const long double x = static_cast<long double>(in_fused.a[i]) + in_fused.dt_bias[j];
      const long double softplus = x > 20 ? x : std::log1p(std::exp(x));
      in_direct.g[i] = static_cast<double>(-std::exp(static_cast<long double>(in_fused.A_log[j])) * softplus);
      const long double sigmoid = 1.0L / (1.0L + std::exp(-static_cast<long double>(in_fused.b[i])));
      in_direct.beta[i] = static_cast<double>(sigmoid * (fused.allow_negative_eigenvalues ? 2 : 1));
    }
    const auto a = reference::sequential<double>(fused, in_fused);
    const auto b = reference::sequential<double>(direct, in_direct);
    // Allowance: twice the double references' (two runs), plus g and beta differing by a few u:
    // a relative change d in the decay or write strength changes o and hT by at most about
    // L d relative (one factor per token), L * 8 u.
    const double allowed =
        2 * oracle::analytic_relative_bound(c.problem, in_fused, Formulation::sequential, 0, /*long_double=*/false) +
        8 * kU * double(c.longest_sequence() + 1);
    RC_ASSERT(relative(b.o, a.o) <= allowed);
    if (fused.has_hT) RC_ASSERT(relative(b.hT, a.hT) <= allowed);
  }, 200);
}

// g = -inf is a legal hard reset (validate() accepts it). The chunked form must not form
// -inf - (-inf) = NaN inside a chunk (it did before the segment restart in chunked.cpp), and a
// reset by -inf must be the same as by -1e4 (exp = 0 for both).
TEST_CASE("g = -inf resets like g = -1e4 in every formulation", "[reference][chunked][reset]") {
  fuzz::rc_section("-inf gates", []() {
    const int C = *rc::gen::element(1, 2, 3, 7, 16, 64, *rc::gen::inRange(1, 100));
    CaseSpace space = CaseSpace::chunked(C);
    space.fused_gates = false;
    space.max_work = 1e6;
    const Case c = *fuzz::gen_case(space);
    Inputs minus_inf = c.inputs();
    Inputs minus_1e4 = minus_inf;
    const int resets = *rc::gen::inRange(1, 4);
    for (int r = 0; r < resets && minus_inf.g.numel() > 0; ++r) {
      const std::int64_t i = *rc::gen::inRange<std::int64_t>(0, minus_inf.g.numel());
      minus_inf.g[i] = -std::numeric_limits<double>::infinity();
      minus_1e4.g[i] = -1e4;
    }
    const auto s_inf = reference::sequential<double>(c.problem, minus_inf);
    const auto s_1e4 = reference::sequential<double>(c.problem, minus_1e4);
    const auto k_inf = reference::chunked<double>(c.problem, minus_inf, C);
    const auto k_1e4 = reference::chunked<double>(c.problem, minus_1e4, C);
    // exp(-inf) = exp(-1e4) = 0 exactly: the two gates give bit-identical results.
    RC_ASSERT(s_inf.o == s_1e4.o);
    RC_ASSERT(k_inf.o == k_1e4.o);
    RC_ASSERT(s_inf.hT == s_1e4.hT);
    RC_ASSERT(k_inf.hT == k_1e4.hT);
    RC_ASSERT(relative(s_inf.o, k_inf.o) <= 1e-12);
    if (c.problem.has_hT) RC_ASSERT(relative(s_inf.hT, k_inf.hT) <= 1e-12);
  }, 200);
}

TEST_CASE("the references reject what they cannot do", "[reference][negative]") {
  Problem p = Problem::packed({3, 2}, 1, 1, 4, 4);
  const Inputs in = fuzz::make_inputs(p, {}, 1);
  for (int bad : {0, -1}) {
    try {
      reference::chunked<double>(p, in, bad);
      FAIL("chunk_size " << bad << " accepted");
    } catch (const ProblemError& e) {
      CHECK(e.argument() == "chunk_size");
      CHECK_THAT(e.rule(), Catch::Matchers::Contains("must be >= 1"));
    }
  }
  p.store_intermediate_states = true;
  try {
    reference::chunked<double>(p, in, 4);
    FAIL("intermediate states accepted by the chunked reference");
  } catch (const ProblemError& e) {
    CHECK(e.argument() == "store_intermediate_states");
  }
  // Both validate before computing: a malformed input is reported, not computed on.
  Problem bad = Problem::packed({3, 2}, 1, 1, 4, 4);
  Inputs wrong = in;
  wrong.v = HostTensor<double>({5, 1, 3});
  CHECK_THROWS_AS(reference::sequential<double>(bad, wrong), ProblemError);
  CHECK_THROWS_AS(reference::chunked<double>(bad, wrong, 2), ProblemError);
}

namespace {

// Tokens [t0, t1) of a one-sequence problem's inputs (q, k, v, direct gates), with h0 as given.
// v_columns != V: v is zero with that many columns (the transition map of the CUDA split).
Inputs token_range(const Problem& p, const Inputs& in, std::int64_t t0, std::int64_t t1, int v_columns,
                   const HostTensor<double>& h0) {
  const std::int64_t T = t1 - t0;
  Inputs out;
  auto rows = [&](const HostTensor<double>& x, std::int64_t per_token) {
    Shape shape = x.shape();
    shape[0] = T;
    HostTensor<double> y(shape);
    for (std::int64_t i = 0; i < T * per_token; ++i) y[i] = x[t0 * per_token + i];
    return y;
  };
  out.q = rows(in.q, std::int64_t(p.H) * p.K);
  out.k = rows(in.k, std::int64_t(p.H) * p.K);
  out.v = v_columns == p.V ? rows(in.v, std::int64_t(p.HV) * p.V) : HostTensor<double>(Shape{T, p.HV, v_columns});
  out.g = rows(in.g, p.HV);
  out.beta = rows(in.beta, p.HV);
  out.h0 = h0;
  return out;
}

}  // namespace

// The CUDA chunked prefill's sequence split (cuda/chunked_prefill.hpp, split_chunks) rests on
// this: a segment's end state is affine in its start state, S_end = M S_start + B, with M the end
// state from the identity and v = 0 (a K x K problem) and B the end state from zero. Chaining
// the segments' maps must give the unsplit end state; here in double, through the chunked
// reference with the kernel's C = 64 and a cut at a chunk boundary.
TEST_CASE("a segment's state map is affine, and chaining the maps gives the unsplit state", "[reference][chunked][split]") {
  const int H = 1, HV = 2, K = 16, V = 8;
  const std::int64_t L = 200, cut = 128;
  for (fuzz::GateRegime regime : {fuzz::GateRegime::no_decay, fuzz::GateRegime::mild, fuzz::GateRegime::strong}) {
    Problem full = Problem::packed({L}, H, HV, K, V);
    full.input_dtype = DType::f64;
    full.gate_dtype = DType::f64;
    full.use_qk_l2norm = true;
    full.has_h0 = true;
    full.has_hT = true;
    fuzz::InputOptions options;
    options.regime = regime;
    const Inputs in = fuzz::make_inputs(full, options, 1234);
    auto end_state = [](Problem shape, const Inputs& inputs) {
      return reference::chunked<double>(shape, inputs, 64).hT;
    };
    auto like = [&](std::int64_t length, int v) {
      Problem q = Problem::packed({length}, H, HV, K, v);
      q.input_dtype = full.input_dtype;
      q.gate_dtype = full.gate_dtype;
      q.use_qk_l2norm = true;
      q.has_h0 = true;
      q.has_hT = true;
      return q;
    };
    const HostTensor<double> expected = end_state(full, in);
    // Segment 0 from h0: its end state is segment 1's start.
    const HostTensor<double> s1 = end_state(like(cut, V), token_range(full, in, 0, cut, V, in.h0));
    // Segment 1's map: M from the identity with v = 0, B from zero.
    HostTensor<double> identity(Shape{1, HV, K, K});
    for (int j = 0; j < HV; ++j)
      for (int r = 0; r < K; ++r) identity[(std::int64_t(j) * K + r) * K + r] = 1.0;
    const HostTensor<double> M = end_state(like(L - cut, K), token_range(full, in, cut, L, K, identity));
    const HostTensor<double> B = end_state(like(L - cut, V), token_range(full, in, cut, L, V, HostTensor<double>(Shape{1, HV, K, V})));
    double err = 0, ref = 0;
    for (int j = 0; j < HV; ++j)
      for (int r = 0; r < K; ++r)
        for (int c = 0; c < V; ++c) {
          double x = B[(std::int64_t(j) * K + r) * V + c];
          for (int m = 0; m < K; ++m) x += M[(std::int64_t(j) * K + r) * K + m] * s1[(std::int64_t(j) * K + m) * V + c];
          const double e = expected[(std::int64_t(j) * K + r) * V + c];
          err += (x - e) * (x - e);
          ref += e * e;
        }
    INFO("regime " << fuzz::gate_regime_name(regime));
    REQUIRE(ref > 0);
    CHECK(std::sqrt(err / ref) < 1e-12);
    // M is not the identity (the map does something) and B is not zero.
    double off = 0;
    for (int r = 0; r < K; ++r)
      for (int m = 0; m < K; ++m) off += std::abs(M[std::int64_t(r) * K + m] - (r == m ? 1.0 : 0.0));
    CHECK(off > 1e-3);
  }
}
