// GPU conformance suite: every property is one template over the kernel adapter, instantiated
// for the recurrent prefill and the decode kernel. Tolerances are the oracle's calibrated
// budget (oracle/budget.hpp): per output tensor, rel_rms <= 2 x the precision emulation's
// rel_rms + 1 u of the output dtype, and max_abs <= 2 x the emulation's max_abs + 1 ulp of the
// output dtype at max|ref| (the emulation is reference::emulate, fp32 sequential, o rounded once
// to the input dtype: what a straightforward kernel in these precisions makes on this input).
// Bitwise properties (determinism, batch invariance, NaN isolation, decode == prefill, graph
// replay) need no tolerance: the kernel's reduction order depends on K and the tile alone.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cuda/device_buffer.hpp"
#include "cuda/implementations.hpp"
#include "cuda/testbed.hpp"
#include "oracle/budget.hpp"
#include "reference/precision.hpp"

using namespace gdn;
using namespace gdn::cuda;
using namespace gdn::cuda::testbed;

namespace {

std::uint64_t seed_for(const char* kernel, const char* property) { return property_seed(kernel, property); }

bool bits_equal(const HostTensor<double>& a, const HostTensor<double>& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.numel()) * sizeof(double)) == 0;
}

bool outputs_bits_equal(const Outputs<double>& a, const Outputs<double>& b) {
  return bits_equal(a.o, b.o) && bits_equal(a.hT, b.hT) && bits_equal(a.intermediate, b.intermediate);
}

constexpr int kMaxReported = 8;

}  // namespace

TEMPLATE_TEST_CASE("conformance: random cases within the calibrated budget", "[gpu][conformance]",
                   RecurrentPrefillKernel, DecodeKernel, StreamedDecodeKernel) {
  TestType kernel;
  const char* name = KernelTraits<TestType>::name();
  std::mt19937_64 rng(seed_for(name, "conformance"));
  int failures = 0;
  const int cases = case_count();
  for (int i = 0; i < cases; ++i) {
    const KernelCase c = KernelTraits<TestType>::random_case(rng);
    oracle::CaseContext context(c.describe(), c.problem, c.inputs());
    Outputs<double> actual;
    const oracle::Verdict v = oracle::evaluate(kernel, context, oracle::BudgetOptions{}, &actual);
    if (v.status == oracle::Status::skipped) {
      Tally::instance().add(name, "conformance", false, false);
      continue;
    }
    std::string exact;
    if (v.status == oracle::Status::pass) exact = check_exact_rules(c.problem, context.inputs(), actual);
    const bool failed = v.failed() || !exact.empty();
    Tally::instance().add(name, "conformance", true, failed, v.worst_margin());
    if (failed && ++failures <= kMaxReported) FAIL_CHECK("case " << i << ": " << c.describe() << "\n" << v.details() << exact);
  }
  INFO(name << ": " << failures << " of " << cases << " cases failed");
  CHECK(failures == 0);
}

TEMPLATE_TEST_CASE("determinism: repeated launches are bitwise identical", "[gpu]", RecurrentPrefillKernel,
                   DecodeKernel, StreamedDecodeKernel) {
  TestType kernel;
  const char* name = KernelTraits<TestType>::name();
  std::mt19937_64 rng(seed_for(name, "determinism"));
  const int cases = std::max(1, case_count() / 10);
  int failures = 0;
  for (int i = 0; i < cases; ++i) {
    const KernelCase c = KernelTraits<TestType>::random_case(rng);
    const Inputs inputs = c.inputs();
    const Outputs<double> first = kernel.run(c.problem, inputs);
    bool same = true;
    for (int r = 0; r < 3; ++r) same = same && outputs_bits_equal(first, kernel.run(c.problem, inputs));
    Tally::instance().add(name, "determinism", true, !same);
    if (!same && ++failures <= kMaxReported) FAIL_CHECK("not deterministic: " << c.describe());
  }
  CHECK(failures == 0);
}

TEMPLATE_TEST_CASE("batch invariance: a sequence's bits do not depend on its neighbours or position", "[gpu]",
                   RecurrentPrefillKernel, DecodeKernel, StreamedDecodeKernel) {
  TestType kernel;
  const char* name = KernelTraits<TestType>::name();
  std::mt19937_64 rng(seed_for(name, "batch_invariance"));
  const int cases = std::max(1, case_count() / 10);
  int failures = 0;
  for (int i = 0; i < cases; ++i) {
    const KernelCase c = KernelTraits<TestType>::random_case(rng);
    const Inputs inputs = c.inputs();
    const Outputs<double> packed = kernel.run(c.problem, inputs);
    // Reversed order (every sequence moves) and each sequence alone.
    std::vector<int> reversed(static_cast<std::size_t>(c.problem.N()));
    for (int n = 0; n < c.problem.N(); ++n) reversed[static_cast<std::size_t>(n)] = c.problem.N() - 1 - n;
    Problem rp;
    Inputs ri;
    select_sequences(c.problem, inputs, reversed, &rp, &ri);
    const Outputs<double> rev = kernel.run(rp, ri);
    std::string diff;
    for (int n = 0; n < c.problem.N() && diff.empty(); ++n) {
      diff = compare_sequence_bits(c.problem, inputs, packed, n, rp, ri, rev, c.problem.N() - 1 - n);
      if (!diff.empty()) diff = "reversed pack, sequence " + std::to_string(n) + ": " + diff;
    }
    const int alone = std::uniform_int_distribution<int>(0, c.problem.N() - 1)(rng);
    Problem ap;
    Inputs ai;
    select_sequences(c.problem, inputs, {alone}, &ap, &ai);
    const Outputs<double> single = kernel.run(ap, ai);
    if (diff.empty()) {
      diff = compare_sequence_bits(c.problem, inputs, packed, alone, ap, ai, single, 0);
      if (!diff.empty()) diff = "sequence " + std::to_string(alone) + " alone: " + diff;
    }
    Tally::instance().add(name, "batch_invariance", true, !diff.empty());
    if (!diff.empty() && ++failures <= kMaxReported) FAIL_CHECK(diff << "\n  " << c.describe());
  }
  CHECK(failures == 0);
}

TEMPLATE_TEST_CASE("isolation: a NaN in one sequence never reaches another", "[gpu]", RecurrentPrefillKernel,
                   DecodeKernel, StreamedDecodeKernel) {
  TestType kernel;
  const char* name = KernelTraits<TestType>::name();
  std::mt19937_64 rng(seed_for(name, "nan_isolation"));
  const int cases = std::max(1, case_count() / 10);
  int failures = 0, ran = 0;
  for (int i = 0; i < cases * 4 && ran < cases; ++i) {
    const KernelCase c = KernelTraits<TestType>::random_case(rng);
    if (c.problem.N() < 2 || c.problem.T == 0) continue;
    // A victim sequence with at least one token.
    int victim = -1;
    for (int n = 0; n < c.problem.N(); ++n)
      if (c.problem.seq_len(n) > 0) victim = n;
    if (victim < 0) continue;
    ++ran;
    const Inputs clean = c.inputs();
    Inputs poisoned = clean;
    const std::int64_t t = c.problem.seq_begin(victim);
    for (int h = 0; h < c.problem.H; ++h) poisoned.k[(t * c.problem.H + h) * c.problem.K] = NAN;
    for (std::int64_t e = 0; e < std::int64_t(c.problem.HV) * c.problem.V; ++e) poisoned.v[t * c.problem.HV * c.problem.V + e] = NAN;
    const Outputs<double> a = kernel.run(c.problem, clean);
    const Outputs<double> b = kernel.run(c.problem, poisoned);
    std::string diff;
    for (int n = 0; n < c.problem.N() && diff.empty(); ++n) {
      if (n == victim) continue;
      diff = compare_sequence_bits(c.problem, clean, a, n, c.problem, clean, b, n);
      if (!diff.empty()) diff = "sequence " + std::to_string(n) + " changed by a NaN in sequence " + std::to_string(victim) + ": " + diff;
    }
    Tally::instance().add(name, "nan_isolation", true, !diff.empty());
    if (!diff.empty() && ++failures <= kMaxReported) FAIL_CHECK(diff << "\n  " << c.describe());
  }
  CHECK(failures == 0);
}

// The prefill runs with the decode's default tile (default_column_lanes; today both defaults are
// the same), so the same per-tile arithmetic must give the same bits.
TEST_CASE("decode over T steps equals the prefill over the same T tokens, bit for bit", "[gpu]") {
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
    if (!same && ++failures <= kMaxReported) FAIL_CHECK("decode steps != prefill: " << c.describe() << " steps=" << steps);
  }
  CHECK(failures == 0);
}

TEST_CASE("the streamed decode at the default tile gives the general kernel's bits", "[gpu]") {
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
    if (!same && ++failures <= kMaxReported) FAIL_CHECK("streamed != general kernel: " << c.describe());
  }
  CHECK(failures == 0);
}

TEST_CASE("the one-token decode kernel gives the general kernel's bits", "[gpu]") {
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
    if (!same && ++failures <= kMaxReported) FAIL_CHECK("one-token kernel != general kernel: " << c.describe());
  }
  CHECK(failures == 0);
}

TEST_CASE("the K = V = 128 instances (standard and narrow tile) give the runtime-size instances' bits", "[gpu]") {
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
      if (!same && ++failures <= kMaxReported) FAIL_CHECK("fixed-size prefill != runtime-size: " << c.describe());
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
      if (!same && ++failures <= kMaxReported) FAIL_CHECK("fixed-size decode != runtime-size: " << c.describe());
    }
  }
  CHECK(failures == 0);
}

TEST_CASE("int64 cu_seqlens give the same bits as int32", "[gpu]") {
  RecurrentPrefillKernel narrow(IndexType::i32), wide(IndexType::i64);
  std::mt19937_64 rng(seed_for("cuda.recurrent_prefill", "cu_seqlens_int64"));
  int failures = 0;
  for (int i = 0; i < std::max(2, case_count() / 10); ++i) {
    const KernelCase c = random_prefill_case(rng);
    const Inputs inputs = c.inputs();
    const bool same = outputs_bits_equal(narrow.run(c.problem, inputs), wide.run(c.problem, inputs));
    Tally::instance().add("cuda.recurrent_prefill", "cu_seqlens_int64", true, !same);
    if (!same && ++failures <= kMaxReported) FAIL_CHECK("int64 cu_seqlens differ: " << c.describe());
  }
  CHECK(failures == 0);
}

namespace {

// Device copies of one decode case's inputs, rewritten in place between graph replays.
struct DecodeDevice {
  Problem problem;
  DeviceBuffer<std::uint16_t> q, k, v;
  DeviceBuffer<float> g, beta, cache, intermediate;
  DeviceBuffer<std::uint16_t> o;
  DeviceBuffer<std::int32_t> indices;
  DeviceBuffer<int> status;
  DeviceTensors tensors;

  explicit DecodeDevice(const Problem& p)
      : problem(p),
        q(static_cast<std::size_t>(shape_numel(p.q_shape()))),
        k(static_cast<std::size_t>(shape_numel(p.q_shape()))),
        v(static_cast<std::size_t>(shape_numel(p.v_shape()))),
        g(static_cast<std::size_t>(shape_numel(p.gate_shape()))),
        beta(static_cast<std::size_t>(shape_numel(p.gate_shape()))),
        cache(static_cast<std::size_t>(shape_numel(p.state_shape()))),
        intermediate(static_cast<std::size_t>(shape_numel(p.intermediate_shape()))),
        o(static_cast<std::size_t>(shape_numel(p.v_shape()))),
        indices(static_cast<std::size_t>(p.N())),
        status(1) {
    tensors.q = q.data();
    tensors.k = k.data();
    tensors.v = v.data();
    tensors.g = g.data();
    tensors.beta = beta.data();
    tensors.state_cache = cache.data();
    tensors.state_indices = indices.data();
    tensors.status = status.data();
    tensors.o = o.data();
    tensors.intermediate = intermediate.data();
  }

  static std::vector<std::uint16_t> bf16(const HostTensor<double>& t) {
    std::vector<std::uint16_t> out(static_cast<std::size_t>(t.numel()));
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      const float x = static_cast<float>(t[i]);
      std::uint32_t bits;
      std::memcpy(&bits, &x, 4);
      out[static_cast<std::size_t>(i)] = static_cast<std::uint16_t>(bits >> 16);  // exact: x is a bf16 value
    }
    return out;
  }
  static std::vector<float> f32(const HostTensor<double>& t) {
    return std::vector<float>(t.storage().begin(), t.storage().end());
  }

  void upload(const Inputs& in) {
    q.upload(bf16(in.q));
    k.upload(bf16(in.k));
    v.upload(bf16(in.v));
    g.upload(f32(in.g));
    beta.upload(f32(in.beta));
    cache.upload(f32(in.h0));
    indices.upload(in.state_indices);
    o.fill_bytes(0xFF);
    intermediate.fill_bytes(0xFF);
  }

  Outputs<double> download() const {
    Outputs<double> out;
    out.o = HostTensor<double>(problem.v_shape());
    const std::vector<std::uint16_t> ob = o.download();
    for (std::size_t i = 0; i < ob.size(); ++i) {
      const std::uint32_t bits = std::uint32_t(ob[i]) << 16;
      float x;
      std::memcpy(&x, &bits, 4);
      out.o[static_cast<std::int64_t>(i)] = x;
    }
    const std::vector<float> c = cache.download(), s = intermediate.download();
    out.hT = HostTensor<double>(problem.state_shape());
    std::copy(c.begin(), c.end(), out.hT.data());
    out.intermediate = HostTensor<double>(problem.intermediate_shape());
    std::copy(s.begin(), s.end(), out.intermediate.data());
    return out;
  }
};

}  // namespace

namespace {

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
  const std::vector<std::uint16_t> o_bits = device.o.download();
  bool untouched = std::all_of(o_bits.begin(), o_bits.end(), [](std::uint16_t x) { return x == 0xFFFF; });
  untouched = untouched && bits_equal(after.hT, bad.h0);
  Tally::instance().add("cuda.decode", std::string("graph_bad_index_writes_nothing") + suffix, true, !untouched);
  CHECK(untouched);
  CHECK(failures == 0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace

TEST_CASE("CUDA graph: capture decode once, change device data, replay", "[gpu]") {
  // A small batch runs the general kernel by default; the streamed kernel is forced too.
  check_graph_replay(LaunchOptions{}, "");
  LaunchOptions streamed;
  streamed.streamed_decode = true;
  check_graph_replay(streamed, "_streamed");
}

TEST_CASE("in-place dense state (h0 == hT) gives the same bits as separate buffers", "[gpu]") {
  Problem p = Problem::packed({5, 0, 17, 3}, 2, 4, 100, 36);
  p.has_h0 = true;
  p.has_hT = true;
  p.state_layout = StateLayout::v_major;
  const Inputs inputs = fuzz::make_inputs(p, {}, 11);
  RecurrentPrefillKernel kernel;
  const Outputs<double> separate = kernel.run(p, inputs);

  std::vector<float> q(inputs.q.storage().begin(), inputs.q.storage().end());
  std::vector<float> k(inputs.k.storage().begin(), inputs.k.storage().end());
  std::vector<float> v(inputs.v.storage().begin(), inputs.v.storage().end());
  std::vector<float> g(inputs.g.storage().begin(), inputs.g.storage().end());
  std::vector<float> beta(inputs.beta.storage().begin(), inputs.beta.storage().end());
  std::vector<float> h(inputs.h0.storage().begin(), inputs.h0.storage().end());
  std::vector<std::int32_t> cu(p.cu_seqlens.begin(), p.cu_seqlens.end());
  DeviceBuffer<float> dq(q), dk(k), dv(v), dg(g), dbeta(beta), dh(h), o(static_cast<std::size_t>(shape_numel(p.v_shape())));
  DeviceBuffer<std::int32_t> dcu(cu);
  DeviceTensors t;
  t.q = dq.data();
  t.k = dk.data();
  t.v = dv.data();
  t.g = dg.data();
  t.beta = dbeta.data();
  t.h0 = dh.data();
  t.hT = dh.data();
  t.o = o.data();
  t.cu_seqlens = dcu.data();
  recurrent_prefill(p, t, nullptr);
  check_cuda(cudaDeviceSynchronize(), "in-place run");
  const std::vector<float> state = dh.download();
  HostTensor<double> hT(p.state_shape());
  std::copy(state.begin(), state.end(), hT.data());
  CHECK(bits_equal(hT, separate.hT));
}
