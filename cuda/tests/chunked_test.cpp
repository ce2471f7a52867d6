// The chunked prefill's own properties, beside its instantiations of the GPU suite
// (gpu_test.cpp: conformance, determinism, batch invariance with every V tile, NaN isolation,
// the property suite of §2, int64 cu_seqlens, in-place state; for the default and the single
// rounding): the boundary pack, the transposed BV 128 pass, the debug trace against the
// chunked reference's intermediates, the sequence split, agreement with the recurrent kernel,
// and fp16 final states below fp16's range in every mode. Accuracy is the oracle's verdict with the kernel's budget (chunked_testbed.hpp);
// bitwise properties need no tolerance.
//
// Tags: [gpu][chunked] and [boundary], [transposed], [trace], [split], [agreement], [flush]. The device
// script runs compute-sanitizer on [trace], [split], [transposed] (and the suite's
// [chunked][invariance], [single][conformance]).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/implementations/chunked_implementation.hpp"
#include "cuda/implementations/implementations.hpp"
#include "cuda/tests/chunked_testbed.hpp"
#include "cuda/tests/testbed.hpp"
#include "oracle/budget.hpp"
#include "reference/chunked.hpp"
#include "reference/sequential.hpp"
#include "reference/precision.hpp"

using namespace gdn;
using namespace gdn::cuda;
using namespace gdn::cuda::testbed;

namespace {

constexpr const char* kName = "cuda.chunked_prefill";
constexpr int kMaxReported = 8;

std::uint64_t seed_for(const char* property) { return property_seed(kName, property); }

// The kernel's verdict on (p, inputs) with the chunked budget; *actual receives its outputs.
oracle::Verdict judge(ChunkedPrefillKernel& kernel, const std::string& name, const Problem& p, const Inputs& inputs,
                      Outputs<double>* actual) {
  oracle::CaseContext context(name, p, inputs);
  return oracle::evaluate(kernel, context, chunked_budget(ChunkedRounding::split), actual);
}

double margin_of(const oracle::Verdict& v) { return v.status == oracle::Status::error ? 0 : v.worst_margin(); }

Problem boundary_problem(DType dtype, int H, int HV, int K, int V) {
  Problem p = Problem::packed({0, 1, 63, 64, 65, 127, 128, 129, 200}, H, HV, K, V);
  p.input_dtype = dtype;
  p.gate_dtype = DType::f32;
  p.use_qk_l2norm = true;
  p.has_h0 = true;
  p.has_hT = true;
  return p;
}

// A random case on the split's dtypes (bf16, fp16): fp32 draws become bf16.
KernelCase split_case(std::mt19937_64& rng) {
  return KernelTraits<ChunkedSingleKernel>::half_precision(chunked_testbed::random_case(rng));
}

}  // namespace

TEST_CASE("chunked: sequences of 0, 1, 63, 64, 65, 127, 128, 129, 200 tokens in one pack", "[gpu][chunked][boundary]") {
  ChunkedPrefillKernel kernel;
  struct Shape {
    DType dtype;
    int H, HV, K, V;
    GateMode gates;
    fuzz::GateRegime regime;
  };
  const std::vector<Shape> shapes{
      {DType::bf16, 2, 4, 128, 128, GateMode::direct, fuzz::GateRegime::mild},
      {DType::f16, 2, 4, 128, 128, GateMode::direct, fuzz::GateRegime::mild},
      {DType::f32, 2, 4, 128, 128, GateMode::direct, fuzz::GateRegime::mild},
      {DType::bf16, 1, 3, 64, 32, GateMode::fused, fuzz::GateRegime::underflow},
      {DType::f32, 1, 2, 48, 80, GateMode::fused, fuzz::GateRegime::strong},
      {DType::bf16, 2, 2, 128, 256, GateMode::direct, fuzz::GateRegime::no_decay},
  };
  int failures = 0;
  for (const Shape& s : shapes) {
    Problem p = boundary_problem(s.dtype, s.H, s.HV, s.K, s.V);
    p.gate_mode = s.gates;
    fuzz::InputOptions options;
    options.regime = s.regime;
    const Inputs inputs = fuzz::make_inputs(p, options, 101);
    Outputs<double> actual;
    const oracle::Verdict v = judge(kernel, "boundary pack", p, inputs, &actual);
    Tally::instance().add(kName, "boundary_lengths", true, !v.passed(), margin_of(v));
    WARN("boundary pack " << p.describe() << " regime=" << fuzz::gate_regime_name(s.regime) << "\n" << v.details());
    if (!v.passed()) {
      ++failures;
      FAIL_CHECK(p.describe() << "\n" << v.details());
    }
  }
  CHECK(failures == 0);
}

// The bf16 K 128 x BV 128 output pass is its own kernel (chunked_wgmma_transposed.cuh). The
// random invariance cases reach it only when they draw bf16 with K > 64 and V % 128 == 0; this
// pins it: the boundary pack (every length class, h0 and hT, a reset and strong decay in the
// gates) through it must be within budget and give BV 64's bits, and it is the small target the
// device script runs compute-sanitizer on ("[transposed]").
TEST_CASE("chunked: the transposed BV 128 pass (bf16, K 128), fused and two-pass, within budget with BV 64's bits",
          "[gpu][chunked][transposed]") {
  int failures = 0;
  for (const fuzz::GateRegime regime : {fuzz::GateRegime::mild, fuzz::GateRegime::strong}) {
    Problem p = boundary_problem(DType::bf16, 2, 4, 128, 256);
    fuzz::InputOptions input_options;
    input_options.regime = regime;
    const Inputs inputs = fuzz::make_inputs(p, input_options, 202);
    ChunkedOptions wide, narrow;
    wide.value_tile = 128;
    narrow.value_tile = 64;
    // HV 4 x V 256 / 16 = 64 blocks: the default would split by the heads; this test is of the
    // unsplit output pass.
    wide.split_chunks = narrow.split_chunks = 0;
    // The fused forward (its producer warpgroup computes the records) and the two-pass one.
    ChunkedOptions two_pass = wide;
    wide.schedule = ChunkedSchedule::fused;
    two_pass.schedule = ChunkedSchedule::two_pass;
    ChunkedPrefillKernel transposed(wide), reference_tile(narrow), separate(two_pass);
    REQUIRE(transposed.supports(p, nullptr));
    Outputs<double> actual;
    const oracle::Verdict v = judge(transposed, "transposed BV 128", p, inputs, &actual);
    Tally::instance().add(kName, "transposed_bv128", true, !v.passed(), margin_of(v));
    WARN("transposed BV 128 " << p.describe() << " regime=" << fuzz::gate_regime_name(regime) << "\n" << v.details());
    if (!v.passed()) {
      ++failures;
      FAIL_CHECK(p.describe() << "\n" << v.details());
      continue;
    }
    if (!outputs_bits_equal(actual, reference_tile.run(p, inputs))) {
      ++failures;
      FAIL_CHECK("BV 128 (fused) and BV 64 differ in bits, regime " << fuzz::gate_regime_name(regime));
    }
    if (!outputs_bits_equal(actual, separate.run(p, inputs))) {
      ++failures;
      FAIL_CHECK("BV 128 fused and two-pass differ in bits, regime " << fuzz::gate_regime_name(regime));
    }
  }
  CHECK(failures == 0);
}

namespace {

// rel_rms over all records of one field, kernel vs double trace; and the fp32 reference's.
struct FieldError {
  double kernel = 0, float_reference = 0;
};

template <class Get>
FieldError field_error(const KernelTrace& kernel, const reference::ChunkTrace<double>& exact,
                       const reference::ChunkTrace<float>& single, Get get) {
  double ek = 0, ef = 0, ref = 0;
  for (std::size_t r = 0; r < exact.records.size(); ++r) {
    const auto& x = get(exact.records[r]);
    const auto& k = get(kernel.records[r]);
    const auto& f = get(single.records[r]);
    for (Eigen::Index i = 0; i < x.rows(); ++i)
      for (Eigen::Index c = 0; c < x.cols(); ++c) {
        const double e = x(i, c);
        ek += (double(k(i, c)) - e) * (double(k(i, c)) - e);
        ef += (double(f(i, c)) - e) * (double(f(i, c)) - e);
        ref += e * e;
      }
  }
  FieldError out;
  out.kernel = ek == 0 ? 0 : (ref == 0 ? INFINITY : std::sqrt(ek / ref));
  if (std::isnan(out.kernel)) out.kernel = INFINITY;
  out.float_reference = ef == 0 ? 0 : (ref == 0 ? INFINITY : std::sqrt(ef / ref));
  return out;
}

}  // namespace

TEST_CASE("chunked: debug intermediates A, T, Vnew, S0, S_end match the chunked reference per chunk",
          "[gpu][chunked][trace]") {
  // Budget per field: rel_rms <= 2 x the fp32 chunked reference's + a floor. A and T are formed
  // in fp32 from products of the exactly stored inputs (no operand rounding): floor 64 u_f32
  // (fp32 accumulation of K-long dot products and the exp of gamma differences). Vnew, S0 and
  // S_end go through operands rounded to the input dtype (T, X, the decayed Vnew): floor 2 u
  // of the input dtype (one rounding per operand of each product).
  ChunkedPrefillKernel kernel;
  for (DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    for (fuzz::GateRegime regime : {fuzz::GateRegime::mild, fuzz::GateRegime::underflow}) {
      Problem p = Problem::packed({1, 64, 65, 130, 0, 200}, 1, 2, 64, 32);
      p.input_dtype = dtype;
      p.use_qk_l2norm = true;
      p.has_h0 = true;
      p.has_hT = true;
      fuzz::InputOptions options;
      options.regime = regime;
      const Inputs inputs = fuzz::make_inputs(p, options, 202);
      reference::ChunkTrace<double> exact;
      reference::ChunkTrace<float> single;
      reference::chunked<double>(p, inputs, kChunkSize, &exact);
      reference::chunked<float>(p, inputs, kChunkSize, &single);
      KernelTrace traced;
      kernel.run_traced(p, inputs, &traced);
      REQUIRE(traced.records.size() == exact.records.size());
      for (std::size_t r = 0; r < exact.records.size(); ++r) {
        REQUIRE(traced.records[r].sequence == exact.records[r].sequence);
        REQUIRE(traced.records[r].head == exact.records[r].head);
        REQUIRE(traced.records[r].chunk == exact.records[r].chunk);
        REQUIRE(traced.records[r].length == exact.records[r].length);
      }
      const double fp32_floor = 64 * unit_roundoff(DType::f32);
      const double operand_floor = 2 * unit_roundoff(dtype);
      struct Field {
        const char* name;
        FieldError error;
        double floor;
      };
      const std::vector<Field> fields{
          {"A", field_error(traced, exact, single, [](const auto& rec) -> const auto& { return rec.A; }), fp32_floor},
          {"T", field_error(traced, exact, single, [](const auto& rec) -> const auto& { return rec.T; }), fp32_floor},
          {"Vnew", field_error(traced, exact, single, [](const auto& rec) -> const auto& { return rec.Vnew; }),
           dtype == DType::f32 ? fp32_floor : operand_floor},
          {"S0", field_error(traced, exact, single, [](const auto& rec) -> const auto& { return rec.S0; }),
           dtype == DType::f32 ? fp32_floor : operand_floor},
          {"S_end", field_error(traced, exact, single, [](const auto& rec) -> const auto& { return rec.S_end; }),
           dtype == DType::f32 ? fp32_floor : operand_floor},
      };
      std::ostringstream report;
      bool all = true;
      double margin = 0;
      for (const Field& f : fields) {
        const double budget = 2 * f.error.float_reference + f.floor;
        const bool ok = f.error.kernel <= budget;
        all = all && ok;
        margin = std::max(margin, f.error.kernel / budget);
        report << "  " << (ok ? "ok   " : "FAIL ") << f.name << " rel_rms " << f.error.kernel << " <= " << budget
               << " (fp32 reference " << f.error.float_reference << ")\n";
      }
      // The first record whose Vnew is off by more than the budget tells which chunk breaks.
      if (!all) {
        for (std::size_t r = 0; r < exact.records.size(); ++r) {
          const auto& e = exact.records[r];
          const auto& k = traced.records[r];
          const double dv = (k.Vnew - e.Vnew).norm() / std::max(e.Vnew.norm(), 1e-300);
          const double da = (k.A - e.A).norm() / std::max(e.A.norm(), 1e-300);
          const double dt = (k.T - e.T).norm() / std::max(e.T.norm(), 1e-300);
          const double ds = (k.S_end - e.S_end).norm() / std::max(e.S_end.norm(), 1e-300);
          report << "    record " << r << " (n " << e.sequence << ", head " << e.head << ", chunk " << e.chunk
                 << ", c " << e.length << "): A " << da << " T " << dt << " Vnew " << dv << " S_end " << ds << "\n";
        }
      }
      Tally::instance().add(kName, "trace_intermediates", true, !all, margin);
      WARN("trace " << dtype_name(dtype) << " regime " << fuzz::gate_regime_name(regime) << "\n" << report.str());
      CHECK(all);
    }
  }
}

namespace {

// The rel_rms budget the oracle held `tensor` to in the verdict (NaN when it has none).
double rel_rms_budget(const oracle::Verdict& v, oracle::OutputTensor tensor) {
  for (const oracle::Check& check : v.checks)
    if (check.tensor == tensor && check.metric == "rel_rms") return check.budget;
  return NAN;
}

// rms(x - y) / rms(ref) (0 when x == y; inf where that is not finite or ref is zero).
double distance(const HostTensor<double>& ref, const HostTensor<double>& x, const HostTensor<double>& y) {
  double d = 0, r = 0;
  for (std::int64_t e = 0; e < ref.numel(); ++e) {
    d += (x[e] - y[e]) * (x[e] - y[e]);
    r += ref[e] * ref[e];
  }
  if (d == 0) return 0.0;
  return r == 0 || !std::isfinite(d) ? INFINITY : std::sqrt(d / r);
}

}  // namespace

TEST_CASE("chunked: agrees with the recurrent kernel within the sum of their budgets", "[gpu][chunked][agreement]") {
  // Both kernels within their rel_rms budgets of the exact value, hence of each other within
  // the sum (triangle inequality). The budgets are the oracle's (each kernel's own options),
  // without the arithmetic floor: the calibrated rule alone.
  ChunkedPrefillKernel chunked;
  RecurrentPrefillKernel recurrent;
  oracle::BudgetOptions chunked_budget = KernelTraits<ChunkedPrefillKernel>::budget();
  oracle::BudgetOptions recurrent_budget = KernelTraits<RecurrentPrefillKernel>::budget();
  chunked_budget.arithmetic_units = recurrent_budget.arithmetic_units = 0;
  std::mt19937_64 rng(seed_for("recurrent_agreement"));
  const int cases = std::max(4, case_count() / 10);
  int failures = 0;
  for (int i = 0; i < cases; ++i) {
    const KernelCase c = chunked_testbed::random_case(rng);
    const Problem& p = c.problem;
    oracle::CaseContext context(describe(c), p, c.inputs());
    Outputs<double> a, b;
    const oracle::Verdict va = oracle::evaluate(chunked, context, chunked_budget, &a);
    const oracle::Verdict vb = oracle::evaluate(recurrent, context, recurrent_budget, &b);
    std::ostringstream s;
    bool ok = false;
    if (va.status == oracle::Status::pass || va.status == oracle::Status::fail) {
      if (vb.status == oracle::Status::pass || vb.status == oracle::Status::fail) {
        const Outputs<double>& exact = context.exact();
        const double o_diff = distance(exact.o, a.o, b.o);
        const double o_allow = rel_rms_budget(va, oracle::OutputTensor::o) + rel_rms_budget(vb, oracle::OutputTensor::o);
        ok = o_diff <= o_allow;
        s << "o: rel_rms(chunked - recurrent) " << o_diff << " <= " << o_allow;
        if (p.has_hT) {
          const double h_diff = distance(exact.hT, a.hT, b.hT);
          const double h_allow =
              rel_rms_budget(va, oracle::OutputTensor::hT) + rel_rms_budget(vb, oracle::OutputTensor::hT);
          ok = ok && h_diff <= h_allow;
          s << "; hT: " << h_diff << " <= " << h_allow;
        }
      } else {
        s << "recurrent: " << vb.summary();
      }
    } else {
      s << "chunked: " << va.summary();
    }
    Tally::instance().add(kName, "recurrent_agreement", true, !ok);
    if (!ok && ++failures <= kMaxReported) FAIL_CHECK(s.str() << "\n  " << describe(c));
  }
  CHECK(failures == 0);
}

TEST_CASE("chunked: the sequence split (segments of 1 to 3 chunks, automatic) within the calibrated budget",
          "[gpu][chunked][conformance][split]") {
  std::mt19937_64 rng(seed_for("split"));
  // As many cases as the default and single modes' conformance: the split is a mode of its own.
  const int cases = std::max(4, case_count());
  int failures = 0;
  for (int i = 0; i < cases; ++i) {
    const KernelCase c = split_case(rng);
    ChunkedOptions options;
    // Segments of 1 to 3 chunks cut the suite's sequences (up to 5 chunks) into up to 5 segments:
    // the combine runs (3 or more segments), segment 0's h0, last segments' hT, empty sequences.
    // (By the heads: 32-chunk segments where HV x V / 16 <= 66, so these sequences stay whole,
    // through the split's passes.)
    options.split_chunks = i % 8 == 7 ? kChunkedSplitByHeads : i % 4 == 3 ? kChunkedSplitAuto : 1 + i % 3;
    if (i % 5 == 4) options.value_tile = 16;  // transition tiles narrower than K
    ChunkedPrefillKernel kernel(options);
    if (!kernel.supports(c.problem, nullptr)) continue;
    Outputs<double> actual;
    const oracle::Verdict v = judge(kernel, describe(c), c.problem, c.inputs(), &actual);
    Tally::instance().add(kName, "split_conformance", true, !v.passed(), margin_of(v));
    if (!v.passed() && ++failures <= kMaxReported)
      FAIL_CHECK("case " << i << " split " << options.split_chunks << ": " << describe(c) << "\n" << v.details());
  }
  INFO(kName << " split: " << failures << " of " << cases << " cases failed");
  CHECK(failures == 0);
}

TEST_CASE("chunked: with a fixed split, launches are bitwise identical and sequences batch invariant",
          "[gpu][chunked]") {
  std::mt19937_64 rng(seed_for("split_invariance"));
  const int cases = std::max(4, case_count() / 10);
  int failures = 0;
  for (int i = 0; i < cases; ++i) {
    const KernelCase c = split_case(rng);
    const Inputs inputs = c.inputs();
    const Problem& p = c.problem;
    ChunkedOptions options;
    options.split_chunks = 1 + i % 2;
    ChunkedPrefillKernel kernel(options);
    std::string diff;
    try {
      const Outputs<double> packed = kernel.run(p, inputs);
      for (int r = 0; r < 2 && diff.empty(); ++r)
        if (!outputs_bits_equal(packed, kernel.run(p, inputs))) diff = "repeated launch changes bits";
      // (Always run: it draws the alone sequence from rng.)
      int alone = 0;
      std::string invariance = pack_diff(kernel, p, inputs, packed, rng, &alone);
      if (invariance.empty()) invariance = chunked_layout_diff(options, p, inputs, packed, p.seq_len(alone));
      if (diff.empty()) diff = invariance;
    } catch (const std::exception& e) {
      diff = std::string("threw: ") + e.what();
    }
    Tally::instance().add(kName, "split_invariance", true, !diff.empty());
    if (!diff.empty() && ++failures <= kMaxReported)
      FAIL_CHECK("split " << options.split_chunks << ": " << diff << "\n  " << describe(c));
  }
  CHECK(failures == 0);
}

// fp16's state update takes its exponent (chunked_kernel.cuh, rescale_state_update): where the
// last keys of a sequence are zero after strong decays, the rows that make the final state are
// decayed below fp16's range within their chunk. Before, the fp16 operand flushed them and hT
// came out exactly 0 against a reference of about 1e-12 (the fuzzer's failure, shrunk to the
// first case here: reports/results/h100/fuzz_chunked/failures). Every mode, each under its own
// budget; the final state must not be zero where the exact one is not.
TEST_CASE("chunked: fp16 zero keys after strong decays keep a final state below fp16's range, every mode",
          "[gpu][chunked][flush]") {
  struct FlushCase {
    std::string name;
    Problem problem;
    Inputs inputs;
  };
  std::vector<FlushCase> cases;
  {
    Problem p = Problem::packed({3}, 1, 1, 16, 16);
    p.input_dtype = DType::f16;
    p.gate_dtype = DType::f32;
    p.has_hT = true;
    Inputs in = fuzz::make_inputs(p, {}, 7);
    const double g[3] = {-21.0, -22.0, -28.5}, beta[3] = {1.5, 1.75, 0.75};
    for (int t = 0; t < 3; ++t) in.g[t] = g[t], in.beta[t] = beta[t];
    for (int x = 0; x < p.K; ++x) in.k[2 * p.K + x] = 0.0;
    cases.push_back({"fuzz case T=3 K=V=16", p, in});
  }
  for (int variant = 0; variant < 3; ++variant) {
    Problem p = Problem::packed({70, 9, 20, 130}, 2, 4, 128, 128);
    p.input_dtype = DType::f16;
    p.gate_dtype = DType::f32;
    p.has_h0 = p.has_hT = true;
    p.use_qk_l2norm = variant == 1;
    if (variant == 2) p.gate_mode = GateMode::fused;
    fuzz::InputOptions options;
    options.regime = fuzz::GateRegime::strong;
    // Fused gates decay faster (up to about -20 a token here): a short tail keeps the exact
    // final state within fp32's range, where the kernel's fp32 state can hold it.
    options.zero_key_tail = variant == 2 ? 2 : 8;
    cases.push_back({"zero key tail " + std::to_string(options.zero_key_tail) + " variant " + std::to_string(variant), p,
                     fuzz::make_inputs(p, options, 300 + variant)});
  }
  struct Mode {
    const char* name;
    ChunkedOptions options;
  };
  std::vector<Mode> modes(3);
  modes[0].name = "default";
  modes[1].name = "single";
  modes[1].options.rounding = ChunkedRounding::single;
  modes[2].name = "split1";
  modes[2].options.split_chunks = 1;
  int failures = 0;
  for (const FlushCase& c : cases) {
    const Outputs<double> exact = reference::sequential<double>(c.problem, c.inputs);
    for (const Mode& m : modes) {
      ChunkedPrefillKernel kernel(m.options);
      REQUIRE(kernel.supports(c.problem, nullptr));
      oracle::CaseContext context(c.name, c.problem, c.inputs);
      Outputs<double> actual;
      const oracle::Verdict v = oracle::evaluate(kernel, context, chunked_budget(m.options.rounding), &actual);
      Tally::instance().add(kName, "fp16_flush", true, !v.passed(), margin_of(v));
      // Per sequence and head: a final state that is exactly zero where the exact one is well
      // inside fp32's range (below it the fp32 emulation of the budget is zero as well).
      int zero_states = 0;
      const std::int64_t per = std::int64_t(c.problem.K) * c.problem.V;
      for (std::int64_t s = 0; s * per < exact.hT.numel(); ++s) {
        double e = 0, a = 0;
        for (std::int64_t i = s * per; i < (s + 1) * per; ++i) e = std::max(e, std::abs(exact.hT[i])), a = std::max(a, std::abs(actual.hT[i]));
        if (e > 1e-30 && a == 0) ++zero_states;
      }
      WARN(c.name << " " << m.name << ": " << zero_states << " flushed final states\n" << v.details());
      if (!v.passed() || zero_states > 0) {
        ++failures;
        FAIL_CHECK(c.name << " " << m.name << " " << c.problem.describe() << "\n" << v.details());
      }
    }
  }
  CHECK(failures == 0);
}
