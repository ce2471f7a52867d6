// The GPU suite: every property is one function template over the kernel adapter, registered
// for each kernel (KernelTraits, testbed.hpp): the recurrent prefill, the decode (general and
// streamed), the chunked prefill and its single-rounding mode. Accuracy is the oracle's
// verdict (oracle::evaluate with the kernel's BudgetOptions): per output tensor, rel_rms <= 2 x
// the precision emulation's rel_rms + 1 u of the output dtype, and max_abs <= 2 x the
// emulation's max_abs + 1 ulp of the output dtype at max|ref| (the emulation is what a
// straightforward kernel in these precisions makes on this input; the chunked kernels' units
// and baselines: chunked_testbed.hpp). Bitwise properties (determinism, batch invariance, NaN
// isolation, int64 cu_seqlens, in-place state) need no tolerance: a kernel's reduction order
// depends on its sizes and tile alone, never on the batch.
// Properties that only one kernel family has follow the suite here (recurrent and decode) and
// in chunked_test.cpp (the chunked prefill).
//
// Tags: [gpu]; the kernel: [recurrent], [decode], [decode_streamed], [chunked] (the single
// mode also [single]); the property: [conformance], [determinism], [invariance], [isolation],
// [properties], [cu64], [inplace]. A test's name ends in " - " and the kernel's tally name.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/dtype_codec.hpp"
#include "cuda/api/device_buffer.hpp"
#include "cuda/implementations/implementations.hpp"
#include "cuda/tests/testbed.hpp"
#include "fuzz/properties.hpp"
#include "oracle/budget.hpp"

using namespace gdn;
using namespace gdn::cuda;
using namespace gdn::cuda::testbed;

namespace {

std::uint64_t seed_for(const char* kernel, const char* property) { return property_seed(kernel, property); }

constexpr int kMaxReported = 8;

// "" when f runs through, else what it threw.
template <class F>
std::string guarded(F f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return std::string("threw: ") + e.what();
  }
}

// The cases of one property of one kernel: each tallied, the first failures reported.
class Outcome {
 public:
  Outcome(std::string kernel, std::string property) : kernel_(std::move(kernel)), property_(std::move(property)) {}
  void skip() { Tally::instance().add(kernel_, property_, false, false); }
  // failure: "" when the case passed.
  void record(const std::string& failure, const std::string& what, double margin = 0) {
    ++ran_;
    const bool failed = !failure.empty();
    Tally::instance().add(kernel_, property_, true, failed, margin);
    if (failed && ++failures_ <= kMaxReported) FAIL_CHECK(property_ << ": " << failure << "\n  " << what);
  }
  int ran() const { return ran_; }
  // Every case passed, and at least min_ran ran (the others being unsupported).
  void finish(int min_ran) {
    INFO(kernel_ << " " << property_ << ": " << failures_ << " of " << ran_ << " cases failed");
    CHECK(ran_ >= min_ran);
    CHECK(failures_ == 0);
  }

 private:
  std::string kernel_, property_;
  int ran_ = 0, failures_ = 0;
};

// The loop of the bitwise properties: `cases` random cases of the kernel's space, each run
// through check(i, case, kernel) ("" or a failure) when the kernel supports it and tallied as
// skipped when not; at least Traits::min_supported(cases) must run.
template <class Kernel, class Check>
void each_supported_case(const char* property, int cases, std::mt19937_64& rng, Check check) {
  using Traits = KernelTraits<Kernel>;
  Outcome outcome(Traits::name(), property);
  for (int i = 0; i < cases; ++i) {
    const KernelCase c = Traits::random_case(rng);
    Kernel kernel = Traits::make(i);
    if (!kernel.supports(c.problem, nullptr)) {
      outcome.skip();
      continue;
    }
    outcome.record(guarded([&]() -> std::string { return check(i, c, kernel); }), describe(c));
  }
  outcome.finish(Traits::min_supported(cases));
}

// ----- the suite ------------------------------------------------------------------------------

// Random cases of the kernel's space within its budget; for a state cache, padding sequences
// output exact zeros and slots nobody names come back unchanged.
template <class Kernel>
void conformance() {
  using Traits = KernelTraits<Kernel>;
  Outcome outcome(Traits::name(), "conformance");
  std::mt19937_64 rng(seed_for(Traits::name(), "conformance"));
  const int cases = case_count();
  for (int i = 0; i < cases; ++i) {
    const KernelCase c = Traits::random_case(rng);
    Kernel kernel = Traits::make(i);
    oracle::CaseContext context(describe(c), c.problem, c.inputs());
    Outputs<double> actual;
    const oracle::Verdict v = oracle::evaluate(kernel, context, Traits::budget(), &actual);
    if (v.status == oracle::Status::skipped) {
      outcome.skip();
      continue;
    }
    std::string failure = v.failed() ? v.details() : "";
    if (v.status == oracle::Status::pass) failure = check_exact_rules(c.problem, context.inputs(), actual);
    outcome.record(failure, "case " + std::to_string(i) + ": " + describe(c),
                   v.status == oracle::Status::error ? 0 : v.worst_margin());
  }
  outcome.finish(Traits::min_supported(cases));
}

// Four launches on the same case give the same bits.
template <class Kernel>
void determinism() {
  using Traits = KernelTraits<Kernel>;
  std::mt19937_64 rng(seed_for(Traits::name(), "determinism"));
  each_supported_case<Kernel>("determinism", Traits::bitwise_cases(case_count()), rng,
                              [](int, const KernelCase& c, Kernel& kernel) -> std::string {
                                const Inputs inputs = c.inputs();
                                const Outputs<double> first = kernel.run(c.problem, inputs);
                                for (int r = 0; r < 3; ++r)
                                  if (!outputs_bits_equal(first, kernel.run(c.problem, inputs)))
                                    return "not deterministic";
                                return "";
                              });
}

// A sequence's bits depend neither on its neighbours nor its position (the pack reversed, one
// sequence alone), nor on the kernel's own layout choices (the chunked kernels' V tiles).
template <class Kernel>
void batch_invariance() {
  using Traits = KernelTraits<Kernel>;
  std::mt19937_64 rng(seed_for(Traits::name(), "batch_invariance"));
  each_supported_case<Kernel>("batch_invariance", Traits::bitwise_cases(case_count()), rng,
                              [&rng](int i, const KernelCase& c, Kernel& kernel) {
                                const Inputs inputs = c.inputs();
                                const Outputs<double> packed = kernel.run(c.problem, inputs);
                                int alone = 0;
                                std::string diff = pack_diff(kernel, c.problem, inputs, packed, rng, &alone);
                                if (diff.empty())
                                  diff = Traits::layout_diff(i, c.problem, inputs, packed, c.problem.seq_len(alone));
                                return diff;
                              });
}

// A NaN in one sequence's k and v never reaches another sequence's outputs.
template <class Kernel>
void nan_isolation() {
  using Traits = KernelTraits<Kernel>;
  Outcome outcome(Traits::name(), "nan_isolation");
  std::mt19937_64 rng(seed_for(Traits::name(), "nan_isolation"));
  const int cases = Traits::bitwise_cases(case_count());
  for (int i = 0; i < cases * 6 && outcome.ran() < cases; ++i) {
    const KernelCase c = Traits::random_case(rng);
    const Problem& p = c.problem;
    if (p.N() < 2 || p.T == 0) continue;
    // A victim sequence with at least one token.
    int victim = -1;
    for (int n = 0; n < p.N(); ++n)
      if (p.seq_len(n) > 0) victim = n;
    if (victim < 0) continue;
    Kernel kernel = Traits::make(i);
    if (!kernel.supports(p, nullptr)) continue;
    outcome.record(guarded([&] {
                     const Inputs clean = c.inputs();
                     Inputs poisoned = clean;
                     const std::int64_t t = p.seq_begin(victim);
                     for (int h = 0; h < p.H; ++h) poisoned.k[(t * p.H + h) * p.K] = NAN;
                     for (std::int64_t e = 0; e < std::int64_t(p.HV) * p.V; ++e) poisoned.v[t * p.HV * p.V + e] = NAN;
                     const Outputs<double> a = kernel.run(p, clean);
                     const Outputs<double> b = kernel.run(p, poisoned);
                     std::string diff;
                     for (int n = 0; n < p.N() && diff.empty(); ++n) {
                       if (n == victim) continue;
                       diff = compare_sequence_bits(p, clean, a, n, p, clean, b, n);
                       if (!diff.empty())
                         diff = "sequence " + std::to_string(n) + " changed by a NaN in sequence " +
                                std::to_string(victim) + ": " + diff;
                     }
                     return diff;
                   }),
                   describe(c));
  }
  outcome.finish(0);
}

// The property suite of §2 (fuzz/properties.hpp): state carry, packing, GVA, l2norm, linearity,
// pure decay, reset, exact store, and accuracy against the double reference. The floor's unit is the input dtype (the unit of o; for the chunked kernel the
// unit of hT too).
template <class Kernel>
void property_suite() {
  using Traits = KernelTraits<Kernel>;
  std::mt19937_64 rng(seed_for(Traits::name(), "properties"));
  const int cases = std::max(3, case_count() / 10);
  for (const fuzz::Property& property : fuzz::all_properties()) {
    if (property.name == "matches_long_double") continue;  // the conformance property's oracle
    Outcome outcome(Traits::name(), "property." + property.name);
    for (int i = 0; i < cases * 4 && outcome.ran() < cases; ++i) {
      const KernelCase c = Traits::property_case(rng);
      Kernel kernel = Traits::make(i);
      oracle::BudgetOptions tol;  // calibrated; the floor in the input dtype for states too
      tol.state_unit_input = true;
      fuzz::PropertyResult result;
      try {
        result = property.check(kernel, c, tol);
      } catch (const std::exception& e) {
        result.status = fuzz::PropertyStatus::fail;
        result.message = std::string("threw: ") + e.what();
      }
      if (result.status == fuzz::PropertyStatus::unsupported) continue;
      outcome.record(result.status == fuzz::PropertyStatus::fail ? result.message : "", describe(c),
                     result.worst_margin);
    }
    outcome.finish(0);
  }
}

// int64 cu_seqlens give the same bits as int32 (one kernel configuration, make(0), against its
// int64 twin: the chunked kernels' per-case options change their sum order).
template <class Kernel>
void cu_seqlens_int64() {
  using Traits = KernelTraits<Kernel>;
  Outcome outcome(Traits::name(), "cu_seqlens_int64");
  std::mt19937_64 rng(seed_for(Traits::name(), "cu_seqlens_int64"));
  const int cases = std::max(3, case_count() / 10);
  Kernel narrow = Traits::make(0);
  Kernel wide = Traits::make_i64();
  for (int i = 0; i < cases; ++i) {
    const KernelCase c = Traits::random_case(rng);
    if (!narrow.supports(c.problem, nullptr)) {
      outcome.skip();
      continue;
    }
    outcome.record(guarded([&]() -> std::string {
                     const Inputs inputs = c.inputs();
                     if (outputs_bits_equal(narrow.run(c.problem, inputs), wide.run(c.problem, inputs))) return "";
                     return "int64 cu_seqlens differ";
                   }),
                   describe(c));
  }
  outcome.finish(Traits::min_supported(cases));
}

// A dense state updated in place (h0 and hT the same buffer) gives the bits of separate buffers.
template <class Kernel>
void inplace_dense_state() {
  using Traits = KernelTraits<Kernel>;
  const Problem p = Traits::inplace_problem();
  const Inputs inputs = fuzz::make_inputs(p, {}, 11);
  Kernel kernel = Traits::make(0);
  const Outputs<double> separate = kernel.run(p, inputs);

  DeviceBuffer<std::uint8_t> q = to_device(inputs.q, p.input_dtype), k = to_device(inputs.k, p.input_dtype),
                             v = to_device(inputs.v, p.input_dtype), g = to_device(inputs.g, p.gate_dtype),
                             beta = to_device(inputs.beta, p.gate_dtype), h = to_device(inputs.h0, DType::f32);
  DeviceBuffer<std::uint8_t> o(static_cast<std::size_t>(shape_numel(p.v_shape())) * dtype_size(p.input_dtype));
  DeviceBuffer<std::int32_t> cu(std::vector<std::int32_t>(p.cu_seqlens.begin(), p.cu_seqlens.end()));
  DeviceTensors t;
  t.q = q.data();
  t.k = k.data();
  t.v = v.data();
  t.g = g.data();
  t.beta = beta.data();
  t.h0 = reinterpret_cast<const float*>(h.data());
  t.hT = reinterpret_cast<float*>(h.data());
  t.o = o.data();
  t.cu_seqlens = cu.data();
  Traits::launch(p, t);
  check_cuda(cudaDeviceSynchronize(), "in-place run");
  const bool same = bits_equal(from_device(h, DType::f32, p.state_shape()), separate.hT);
  Tally::instance().add(Traits::name(), "inplace_dense_state", true, !same);
  CHECK(same);
}

}  // namespace

#define GDN_PROPERTIES_TITLE "properties of §2: state carry, packing, GVA, l2norm, linearity, decay, reset, store"

// Registration: one test case per property and kernel, tagged with both.
#define GDN_ON_RECURRENT(title, tags, property) \
  TEST_CASE(title " - cuda.recurrent_prefill", "[gpu][recurrent]" tags) { property<RecurrentPrefillKernel>(); }
#define GDN_ON_DECODE(title, tags, property) \
  TEST_CASE(title " - cuda.decode", "[gpu][decode]" tags) { property<DecodeKernel>(); }
#define GDN_ON_STREAMED_DECODE(title, tags, property) \
  TEST_CASE(title " - cuda.decode_streamed", "[gpu][decode_streamed]" tags) { property<StreamedDecodeKernel>(); }
#define GDN_ON_CHUNKED(title, tags, property) \
  TEST_CASE(title " - cuda.chunked_prefill", "[gpu][chunked]" tags) { property<ChunkedPrefillKernel>(); }
#define GDN_ON_CHUNKED_SINGLE(title, tags, property)                                         \
  TEST_CASE(title " - cuda.chunked_prefill.single", "[gpu][chunked][single]" tags) { \
    property<ChunkedSingleKernel>();                                                          \
  }
#define GDN_ON_EVERY_KERNEL(title, tags, property) \
  GDN_ON_RECURRENT(title, tags, property)          \
  GDN_ON_DECODE(title, tags, property)             \
  GDN_ON_STREAMED_DECODE(title, tags, property)    \
  GDN_ON_CHUNKED(title, tags, property)            \
  GDN_ON_CHUNKED_SINGLE(title, tags, property)
// The kernels with a dense h0 / hT and cu_seqlens (KernelTraits::dense_state).
#define GDN_ON_VARLEN_KERNELS(title, tags, property) \
  GDN_ON_RECURRENT(title, tags, property)            \
  GDN_ON_CHUNKED(title, tags, property)              \
  GDN_ON_CHUNKED_SINGLE(title, tags, property)

GDN_ON_EVERY_KERNEL("conformance: random cases within the calibrated budget", "[conformance]", conformance)
GDN_ON_EVERY_KERNEL("determinism: repeated launches are bitwise identical", "[determinism]", determinism)
GDN_ON_EVERY_KERNEL("batch invariance: a sequence's bits do not depend on its neighbours or position",
                    "[invariance]", batch_invariance)
GDN_ON_EVERY_KERNEL("isolation: a NaN in one sequence never reaches another", "[isolation]", nan_isolation)
// Not for the single mode: the property suite's tolerance is calibrated on the plain fp32
// emulation, a baseline that design misses by construction on a few percent of checks
// (chunked_testbed.hpp); its relations are covered by the bitwise properties above.
GDN_ON_RECURRENT(GDN_PROPERTIES_TITLE,
                 "[properties]", property_suite)
GDN_ON_DECODE(GDN_PROPERTIES_TITLE,
              "[properties]", property_suite)
GDN_ON_STREAMED_DECODE(GDN_PROPERTIES_TITLE,
                       "[properties]", property_suite)
GDN_ON_CHUNKED(GDN_PROPERTIES_TITLE,
               "[properties]", property_suite)
GDN_ON_VARLEN_KERNELS("int64 cu_seqlens give the same bits as int32", "[cu64]", cu_seqlens_int64)
GDN_ON_VARLEN_KERNELS("in-place dense state (h0 == hT) gives the same bits as separate buffers", "[inplace]",
                      inplace_dense_state)

// ----- the recurrent and decode kernels' own properties ---------------------------------------

// The prefill runs with the decode's default tile (default_column_lanes; both defaults are
// the same), so the same per-tile arithmetic must give the same bits.
TEST_CASE("decode over T steps equals the prefill over the same T tokens, bit for bit", "[gpu][decode]") {
  DecodeKernel decode;
  std::mt19937_64 rng(seed_for("cuda.decode", "decode_equals_prefill"));
  const int cases = std::max(2, case_count() / 10);
  int failures = 0;
  for (int i = 0; i < cases; ++i) {
    KernelCase c = random_decode_case(rng);
    Problem& p = c.problem;
    const int B = p.N();
    const std::int64_t steps = std::uniform_int_distribution<std::int64_t>(1, 6)(rng);
    p = [&] {
      Problem q = p;
      const Problem shape = Problem::fixed_length(B, steps, p.H, p.HV, p.K, p.V);
      q.cu_seqlens = shape.cu_seqlens;
      q.T = shape.T;
      q.has_h0 = true;
      q.has_hT = true;
      q.store_intermediate_states = false;
      return q;
    }();
    const Inputs inputs = c.inputs();
    LaunchOptions same_tile;
    same_tile.column_lanes = default_column_lanes(p, /*decode=*/true);
    RecurrentPrefillKernel prefill(IndexType::i32, same_tile);
    const Outputs<double> whole = prefill.run(p, inputs);
    // Step by step: token s of every request, the cache carried from step to step.
    Problem step = p;
    const Problem step_shape = Problem::fixed_length(B, 1, p.H, p.HV, p.K, p.V);
    step.cu_seqlens = step_shape.cu_seqlens;
    step.T = step_shape.T;
    HostTensor<double> cache = inputs.h0;
    HostTensor<double> o(p.v_shape());
    for (std::int64_t s = 0; s < steps; ++s) {
      std::vector<int> all(static_cast<std::size_t>(B));
      Inputs in;
      auto token_rows = [&](const HostTensor<double>& t) {
        if (!t.defined()) return HostTensor<double>();
        Shape shape = t.shape();
        shape[0] = B;
        HostTensor<double> out(shape);
        const std::int64_t row = t.numel() / t.dim(0);
        for (int b = 0; b < B; ++b)
          std::copy(t.data() + (b * steps + s) * row, t.data() + (b * steps + s + 1) * row, out.data() + b * row);
        return out;
      };
      in.q = token_rows(inputs.q);
      in.k = token_rows(inputs.k);
      in.v = token_rows(inputs.v);
      in.g = token_rows(inputs.g);
      in.beta = token_rows(inputs.beta);
      in.a = token_rows(inputs.a);
      in.b = token_rows(inputs.b);
      in.A_log = inputs.A_log;
      in.dt_bias = inputs.dt_bias;
      in.h0 = cache;
      in.state_indices = inputs.state_indices;
      const Outputs<double> out = decode.run(step, in);
      cache = out.hT;
      const std::int64_t row = std::int64_t(p.HV) * p.V;
      for (int b = 0; b < B; ++b)
        std::copy(out.o.data() + b * row, out.o.data() + (b + 1) * row, o.data() + (b * steps + s) * row);
    }
    const bool same = bits_equal(o, whole.o) && bits_equal(cache, whole.hT);
    Tally::instance().add("cuda.decode", "decode_equals_prefill", true, !same);
    if (!same && ++failures <= kMaxReported) FAIL_CHECK("decode steps != prefill: " << describe(c) << " steps=" << steps);
  }
  CHECK(failures == 0);
}

TEST_CASE("the streamed decode at the default tile gives the general kernel's bits", "[gpu][decode]") {
  // decode_stream_kernel.cuh: the (4, 16) tile in the streamed kernel, and its wide tile
  // (LaunchOptions::wide_stream_tile: 32 columns per warp computing the sums of the (4, 16) tile
  // in that tile's order; K-major, one token per request), both compared with the general kernel
  // at the default tile (options.general_decode) over K in (64, 128], V <= 128: every third case
  // K-major with one token (where the wide tile applies), the others V-major or 2-3 tokens
  // (where the wide option must fall back to the (4, 16) tile); padding slots, missing h0 / hT
  // and intermediate states as the random decode cases draw them.
  LaunchOptions streamed_options;
  streamed_options.streamed_decode = true;  // whatever the batch (small ones run the general kernel)
  KernelAdapter streamed(Entry::decode, IndexType::i32, streamed_options);
  LaunchOptions wide_options = streamed_options;
  wide_options.wide_stream_tile = true;
  KernelAdapter wide(Entry::decode, IndexType::i32, wide_options);
  LaunchOptions general_options;
  general_options.general_decode = true;
  KernelAdapter general(Entry::decode, IndexType::i32, general_options);
  std::mt19937_64 rng(seed_for("cuda.decode", "streamed_default_tile_equals_general"));
  const int cases = std::max(6, case_count() / 10);
  int failures = 0;
  for (int i = 0; i < cases; ++i) {
    KernelCase c = random_decode_case(rng);
    Problem& p = c.problem;
    p.K = std::vector<int>{68, 96, 100, 124, 128, 128, 128}[rng() % 7];
    p.V = std::vector<int>{4, 32, 60, 64, 100, 128, 128, 128}[rng() % 8];
    const bool wide_case = i % 3 == 0;
    p.state_layout = wide_case || rng() % 2 == 0 ? StateLayout::k_major : StateLayout::v_major;
    const std::int64_t tokens = wide_case || p.state_layout == StateLayout::v_major ? 1 : 2 + std::int64_t(rng() % 2);
    const Problem shape = Problem::fixed_length(p.N(), tokens, p.H, p.HV, p.K, p.V);
    p.cu_seqlens = shape.cu_seqlens;
    p.T = shape.T;
    REQUIRE(decode_uses_stream_kernel(p, streamed_options));
    REQUIRE_FALSE(decode_uses_wide_stream_tile(p, streamed_options));
    REQUIRE(decode_uses_wide_stream_tile(p, wide_options) == wide_case);
    const Inputs inputs = c.inputs();
    const Outputs<double> reference = general.run(p, inputs);
    const bool same = outputs_bits_equal(streamed.run(p, inputs), reference) &&
                      outputs_bits_equal(wide.run(p, inputs), reference);
    Tally::instance().add("cuda.decode", "streamed_default_tile_equals_general", true, !same);
    if (!same && ++failures <= kMaxReported) FAIL_CHECK("streamed != general kernel: " << describe(c));
  }
  CHECK(failures == 0);
}

TEST_CASE("the one-token decode kernel gives the general kernel's bits", "[gpu][decode]") {
  // decode_token_kernel (LaunchOptions::token_decode_kernel) runs the general kernel's Tile on
  // another schedule; the bits must be the general kernel's, with what random_decode_case draws:
  // padding slots, both layouts, fused and separate gates, GVA, no h0 or no hT.
  LaunchOptions token_options, general_options;
  general_options.token_decode_kernel = false;
  KernelAdapter token(Entry::decode, IndexType::i32, token_options);
  KernelAdapter general(Entry::decode, IndexType::i32, general_options);
  std::mt19937_64 rng(seed_for("cuda.decode", "token_kernel_equals_general"));
  const int cases = std::max(6, case_count() / 10);
  int failures = 0;
  for (int i = 0; i < cases; ++i) {
    KernelCase c = random_decode_case(rng);
    Problem& p = c.problem;
    p.K = p.V = 128;
    p.store_intermediate_states = false;
    const Problem shape = Problem::fixed_length(p.N(), 1, p.H, p.HV, p.K, p.V);
    p.cu_seqlens = shape.cu_seqlens;
    p.T = shape.T;
    REQUIRE(decode_uses_token_kernel(p, token_options));
    REQUIRE_FALSE(decode_uses_token_kernel(p, general_options));
    const Inputs inputs = c.inputs();
    const bool same = outputs_bits_equal(token.run(p, inputs), general.run(p, inputs));
    Tally::instance().add("cuda.decode", "token_kernel_equals_general", true, !same);
    if (!same && ++failures <= kMaxReported) FAIL_CHECK("one-token kernel != general kernel: " << describe(c));
  }
  CHECK(failures == 0);
}

TEST_CASE("the K = V = 128 instances (standard and narrow tile) give the runtime-size instances' bits",
          "[gpu][recurrent][decode]") {
  // Tile's KF / VF: at K = V = 128 the general kernel (prefill and decode) runs the default
  // tile's instance with both sizes fixed at compile time; LaunchOptions::runtime_size_kernels
  // runs the runtime-size one. Prefill over random packed batches; decode with 1-3 tokens, both
  // layouts, the fixed-size general kernel and the streamed kernel (runtime sizes only) against
  // the runtime-size general kernel. The fixed-size instance runs both its tiles: the standard
  // one (narrow_tile off) and the narrow one (on), which must give the same bits.
  LaunchOptions runtime_options;
  runtime_options.runtime_size_kernels = true;
  LaunchOptions general_options, general_runtime_options = runtime_options;
  general_options.general_decode = general_runtime_options.general_decode = true;
  general_options.narrow_tile = LaunchOptions::NarrowTile::off;
  LaunchOptions general_narrow_options = general_options, prefill_options, prefill_narrow_options;
  general_narrow_options.narrow_tile = LaunchOptions::NarrowTile::on;
  prefill_options.narrow_tile = LaunchOptions::NarrowTile::off;
  prefill_narrow_options.narrow_tile = LaunchOptions::NarrowTile::on;
  RecurrentPrefillKernel prefill(IndexType::i32, prefill_options), prefill_runtime(IndexType::i32, runtime_options);
  RecurrentPrefillKernel prefill_narrow(IndexType::i32, prefill_narrow_options);
  KernelAdapter general_narrow(Entry::decode, IndexType::i32, general_narrow_options);
  LaunchOptions streamed_options;
  streamed_options.streamed_decode = true;
  KernelAdapter streamed(Entry::decode, IndexType::i32, streamed_options);
  KernelAdapter general(Entry::decode, IndexType::i32, general_options);
  KernelAdapter general_runtime(Entry::decode, IndexType::i32, general_runtime_options);
  std::mt19937_64 rng(seed_for("cuda.recurrent_prefill", "fixed_size_instances"));
  const int cases = std::max(6, case_count() / 10);
  int failures = 0;
  for (int i = 0; i < cases; ++i) {
    if (i % 2 == 0) {
      KernelCase c = random_prefill_case(rng);
      c.problem.K = c.problem.V = 128;
      const Inputs inputs = c.inputs();
      const Outputs<double> reference = prefill_runtime.run(c.problem, inputs);
      const bool same = outputs_bits_equal(prefill.run(c.problem, inputs), reference) &&
                        outputs_bits_equal(prefill_narrow.run(c.problem, inputs), reference);
      Tally::instance().add("cuda.recurrent_prefill", "fixed_size_instances", true, !same);
      if (!same && ++failures <= kMaxReported) FAIL_CHECK("fixed-size prefill != runtime-size: " << describe(c));
    } else {
      KernelCase c = random_decode_case(rng);
      Problem& p = c.problem;
      p.K = p.V = 128;
      p.state_layout = rng() % 2 == 0 ? StateLayout::k_major : StateLayout::v_major;
      const Problem shape = Problem::fixed_length(p.N(), 1 + std::int64_t(rng() % 3), p.H, p.HV, p.K, p.V);
      p.cu_seqlens = shape.cu_seqlens;
      p.T = shape.T;
      const Inputs inputs = c.inputs();
      const Outputs<double> reference = general_runtime.run(p, inputs);
      const bool same = outputs_bits_equal(general.run(p, inputs), reference) &&
                        outputs_bits_equal(general_narrow.run(p, inputs), reference) &&
                        outputs_bits_equal(streamed.run(p, inputs), reference);
      Tally::instance().add("cuda.decode", "fixed_size_instances", true, !same);
      if (!same && ++failures <= kMaxReported) FAIL_CHECK("fixed-size decode != runtime-size: " << describe(c));
    }
  }
  CHECK(failures == 0);
}

namespace {

// Device copies of one decode case's inputs (bf16 q, k, v; fp32 gates and cache), rewritten in
// place between graph replays.
struct DecodeDevice {
  Problem problem;
  DeviceBuffer<std::uint8_t> q, k, v, g, beta, cache, intermediate, o;
  DeviceBuffer<std::int32_t> indices;
  DeviceBuffer<int> status;
  DeviceTensors tensors;

  static std::size_t bytes(const Shape& shape, DType dtype) {
    return static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
  }

  explicit DecodeDevice(const Problem& p)
      : problem(p),
        q(bytes(p.q_shape(), DType::bf16)),
        k(bytes(p.q_shape(), DType::bf16)),
        v(bytes(p.v_shape(), DType::bf16)),
        g(bytes(p.gate_shape(), DType::f32)),
        beta(bytes(p.gate_shape(), DType::f32)),
        cache(bytes(p.state_shape(), DType::f32)),
        intermediate(bytes(p.intermediate_shape(), DType::f32)),
        o(bytes(p.v_shape(), DType::bf16)),
        indices(static_cast<std::size_t>(p.N())),
        status(1) {
    tensors.q = q.data();
    tensors.k = k.data();
    tensors.v = v.data();
    tensors.g = g.data();
    tensors.beta = beta.data();
    tensors.state_cache = reinterpret_cast<float*>(cache.data());
    tensors.state_indices = indices.data();
    tensors.status = status.data();
    tensors.o = o.data();
    tensors.intermediate = reinterpret_cast<float*>(intermediate.data());
  }

  void upload(const Inputs& in) {
    q.upload(encode_tensor(in.q, DType::bf16));
    k.upload(encode_tensor(in.k, DType::bf16));
    v.upload(encode_tensor(in.v, DType::bf16));
    g.upload(encode_tensor(in.g, DType::f32));
    beta.upload(encode_tensor(in.beta, DType::f32));
    cache.upload(encode_tensor(in.h0, DType::f32));
    indices.upload(in.state_indices);
    o.fill_bytes(0xFF);
    intermediate.fill_bytes(0xFF);
    // The copies and fills run on the legacy default stream, which a non-blocking stream does
    // not wait for: without this, a replay could start before them (a race of the test, seen
    // with the GPU shared by ten processes).
    check_cuda(cudaDeviceSynchronize(), "upload");
  }

  Outputs<double> download() const {
    Outputs<double> out;
    out.o = from_device(o, DType::bf16, problem.v_shape());
    out.hT = from_device(cache, DType::f32, problem.state_shape());
    out.intermediate = from_device(intermediate, DType::f32, problem.intermediate_shape());
    return out;
  }
};

// One graph-replay check of decode with the given options (suffix: the tally property's).
void check_graph_replay(const LaunchOptions& launch_options, const char* suffix) {
  Problem p = Problem::fixed_length(6, 2, 2, 4, 64, 96);
  p.input_dtype = DType::bf16;
  p.gate_dtype = DType::f32;
  p.use_qk_l2norm = true;
  p.state_slots = 9;
  p.has_h0 = true;
  p.has_hT = true;
  p.store_intermediate_states = true;
  fuzz::InputOptions options;
  options.padding_fraction = 0.3;
  DecodeDevice device(p);

  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  device.upload(fuzz::make_inputs(p, options, 1));
  cudaGraph_t graph;
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  decode(p, device.tensors, stream, launch_options);
  check_cuda(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec;
  check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");

  KernelAdapter direct(Entry::decode, IndexType::i32, launch_options);
  int failures = 0;
  for (std::uint64_t seed = 2; seed < 6; ++seed) {
    // New data in the same buffers, including new slot assignments and padding rows.
    const Inputs inputs = fuzz::make_inputs(p, options, seed);
    device.upload(inputs);
    check_cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
    check_cuda(cudaStreamSynchronize(stream), "replay");
    const Outputs<double> replayed = device.download();
    const Outputs<double> expected = direct.run(p, inputs);
    const bool same = outputs_bits_equal(replayed, expected);
    Tally::instance().add("cuda.decode", std::string("graph_replay") + suffix, true, !same);
    if (!same) {
      ++failures;
      FAIL_CHECK("graph replay differs from a direct launch, seed " << seed << suffix);
    }
    const std::vector<int> status = device.status.download();
    CHECK(status[0] == kStatusOk);
  }
  // An out-of-range slot in device data: the replay reports it and writes nothing.
  Inputs bad = fuzz::make_inputs(p, options, 7);
  bad.state_indices[2] = static_cast<std::int32_t>(p.state_slots);  // one past the end
  device.upload(bad);
  check_cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
  check_cuda(cudaStreamSynchronize(stream), "replay");
  CHECK(device.status.download()[0] == kStatusBadStateIndex);
  const Outputs<double> after = device.download();
  const std::vector<std::uint8_t> o_bytes = device.o.download();
  bool untouched = std::all_of(o_bytes.begin(), o_bytes.end(), [](std::uint8_t x) { return x == 0xFF; });
  untouched = untouched && bits_equal(after.hT, bad.h0);
  Tally::instance().add("cuda.decode", std::string("graph_bad_index_writes_nothing") + suffix, true, !untouched);
  CHECK(untouched);
  CHECK(failures == 0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace

TEST_CASE("CUDA graph: capture decode once, change device data, replay", "[gpu][decode]") {
  // A small batch runs the general kernel by default; the streamed kernel is forced too.
  check_graph_replay(LaunchOptions{}, "");
  LaunchOptions streamed;
  streamed.streamed_decode = true;
  check_graph_replay(streamed, "_streamed");
}

