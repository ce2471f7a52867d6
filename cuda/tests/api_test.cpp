// Host-side argument checks of the CUDA API: they run before any CUDA call, so these tests run
// (and must pass) on machines without a GPU. The pointers are fake, aligned addresses: a check
// that let one through would reach the launch and fail differently.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/api/api.hpp"
#include "cuda/recurrent/recurrent_params.hpp"

using namespace gdn;
using namespace gdn::cuda;

namespace {

// Distinct, 256-aligned fake device addresses far enough apart for any test shape.
template <class T = void>
T* fake(int slot) {
  return reinterpret_cast<T*>(std::uintptr_t(1) << 40 | std::uintptr_t(slot) << 28);
}

Problem small_problem() {
  Problem p = Problem::packed({3, 0, 5}, 2, 4, 32, 48);
  p.has_h0 = true;
  p.has_hT = true;
  return p;
}

DeviceTensors tensors_for(const Problem& p) {
  DeviceTensors t;
  t.q = fake(1);
  t.k = fake(2);
  t.v = fake(3);
  t.g = fake(4);
  t.beta = fake(5);
  if (p.uses_state_cache()) {
    t.state_cache = fake<float>(6);
    t.state_indices = fake<const std::int32_t>(7);
  } else {
    if (p.has_h0) t.h0 = fake<const float>(6);
    if (p.has_hT) t.hT = fake<float>(8);
  }
  t.cu_seqlens = fake(9);
  t.o = fake(10);
  return t;
}

// Runs check and requires a ProblemError naming `argument` with `fragment` in its rule.
template <class F>
void require_error(F check, const std::string& argument, const std::string& fragment) {
  try {
    check();
    FAIL("expected ProblemError for '" << argument << "'");
  } catch (const ProblemError& e) {
    INFO(e.what());
    CHECK(e.argument() == argument);
    CHECK(e.rule().find(fragment) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("a well-formed problem passes the host checks") {
  const Problem p = small_problem();
  CHECK_NOTHROW(validate_prefill(p, tensors_for(p)));
}

TEST_CASE("Problem::validate rules are enforced") {
  Problem p = small_problem();
  p.HV = 3;  // not a multiple of H = 2
  require_error([&] { validate_prefill(p, tensors_for(p)); }, "HV", "multiple of H");
  p = small_problem();
  p.cu_seqlens = {0, 5, 3, 8};
  require_error([&] { recurrent_prefill(p, tensors_for(p), nullptr); }, "cu_seqlens", "non-decreasing");
}

TEST_CASE("sizes and dtypes the kernels do not support are rejected") {
  Problem p = small_problem();
  p.K = 257;
  require_error([&] { validate_prefill(p, tensors_for(p)); }, "K", "<= 256");
  p = small_problem();
  p.V = 300;
  require_error([&] { validate_prefill(p, tensors_for(p)); }, "V", "<= 256");
  p = small_problem();
  p.input_dtype = DType::f64;
  p.gate_dtype = DType::f64;
  require_error([&] { validate_prefill(p, tensors_for(p)); }, "input_dtype", "f64");
  p = small_problem();
  LaunchOptions bad;
  bad.column_lanes = 3;
  require_error([&] { recurrent_prefill(p, tensors_for(p), nullptr, bad); }, "column_lanes", "2, 4 or 8");
  p = small_problem();
  p.K = 256;
  bad.column_lanes = 8;
  require_error([&] { recurrent_prefill(p, tensors_for(p), nullptr, bad); }, "column_lanes", "K <= 128");
}

TEST_CASE("missing, superfluous and misaligned pointers are rejected") {
  const Problem p = small_problem();
  DeviceTensors t = tensors_for(p);
  t.v = nullptr;
  require_error([&] { validate_prefill(p, t); }, "v", "required");
  t = tensors_for(p);
  t.a = fake(11);  // fused-gate input with direct gates
  require_error([&] { validate_prefill(p, t); }, "a", "must be null");
  t = tensors_for(p);
  t.o = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(t.o) + 8);
  require_error([&] { validate_prefill(p, t); }, "o", "16-byte aligned");
  t = tensors_for(p);
  t.cu_seqlens = nullptr;
  require_error([&] { validate_prefill(p, t); }, "cu_seqlens", "required");
  t = tensors_for(p);
  t.cu_seqlens_type = IndexType::i64;
  t.cu_seqlens = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(t.cu_seqlens) + 4);
  require_error([&] { validate_prefill(p, t); }, "cu_seqlens", "8-byte aligned");
  Problem empty = Problem::packed({0, 0}, 1, 1, 8, 8);
  DeviceTensors none;
  none.cu_seqlens = fake(9);
  CHECK_NOTHROW(validate_prefill(empty, none));  // no tokens, no states: nothing else needed
}

TEST_CASE("outputs may not overlap other buffers, except dense h0 == hT") {
  const Problem p = small_problem();
  DeviceTensors t = tensors_for(p);
  t.o = const_cast<void*>(t.q);
  require_error([&] { validate_prefill(p, t); }, "o", "overlap");
  t = tensors_for(p);
  t.hT = const_cast<float*>(t.h0);
  CHECK_NOTHROW(validate_prefill(p, t));
  t.hT = const_cast<float*>(t.h0) + 4;
  require_error([&] { validate_prefill(p, t); }, "hT", "overlap");
}

TEST_CASE("decode needs a fixed-length batch against a state cache") {
  Problem p = Problem::fixed_length(4, 1, 2, 4, 64, 64);
  p.state_slots = 6;
  p.has_h0 = true;
  p.has_hT = true;
  DeviceTensors t = tensors_for(p);
  t.cu_seqlens = nullptr;
  CHECK_NOTHROW(validate_decode(p, t));
  t.cu_seqlens = fake(9);
  require_error([&] { validate_decode(p, t); }, "cu_seqlens", "must be null");
  t.cu_seqlens = nullptr;
  Problem ragged = p;
  ragged.cu_seqlens = {0, 1, 2, 4, 5};
  ragged.T = 5;
  require_error([&] { validate_decode(ragged, t); }, "cu_seqlens", "fixed-length");
  Problem dense = Problem::fixed_length(4, 1, 2, 4, 64, 64);
  dense.has_h0 = true;
  require_error([&] { validate_decode(dense, tensors_for(dense)); }, "state_slots", "state cache");
  Problem zero = p;
  const Problem shape = Problem::fixed_length(4, 0, 2, 4, 64, 64);
  zero.cu_seqlens = shape.cu_seqlens;
  zero.T = 0;
  require_error([&] { validate_decode(zero, t); }, "cu_seqlens", "Ts >= 1");
}

TEST_CASE("state indices: a host copy is checked for range and duplicates before the launch") {
  Problem p = Problem::fixed_length(4, 1, 2, 4, 64, 64);
  p.state_slots = 6;
  p.has_h0 = true;
  p.has_hT = true;
  DeviceTensors t = tensors_for(p);
  t.cu_seqlens = nullptr;
  const std::int32_t good[4] = {5, -1, 0, 2};
  t.host_state_indices = good;
  CHECK_NOTHROW(validate_decode(p, t));
  const std::int32_t out_of_range[4] = {5, -1, 6, 2};
  t.host_state_indices = out_of_range;
  require_error([&] { decode(p, t, nullptr); }, "state_indices", "-1 (padding) or in [0, state_slots = 6)");
  const std::int32_t negative[4] = {5, -2, 0, 2};
  t.host_state_indices = negative;
  require_error([&] { decode(p, t, nullptr); }, "state_indices", "got state_indices[1] = -2");
  const std::int32_t twice[4] = {5, 1, 1, 2};
  t.host_state_indices = twice;
  require_error([&] { decode(p, t, nullptr); }, "state_indices", "twice");
  p.has_hT = false;  // read-only: sharing a slot is fine
  CHECK_NOTHROW(validate_decode(p, t));
}

TEST_CASE("the narrow tile runs only where it applies", "[cuda][api]") {
  // Automatic: prefill at K = V = 128 with the default tile and at most 512 default-tile warps
  // (N * HV * 8 <= 512); never decode unless asked; never the runtime-size instances.
  auto prefill_problem = [](int sequences, int HV, int K, int V) {
    Problem p = Problem::fixed_length(sequences, 16, HV / 4, HV, K, V);
    p.has_h0 = p.has_hT = true;
    return p;
  };
  using Narrow = LaunchOptions::NarrowTile;
  LaunchOptions on, off, runtime;
  on.narrow_tile = Narrow::on;
  off.narrow_tile = Narrow::off;
  runtime.runtime_size_kernels = true;
  CHECK(uses_narrow_tile(prefill_problem(2, 32, 128, 128), {}, false));       // 512 warps
  CHECK(uses_narrow_tile(prefill_problem(3, 32, 128, 128), {}, false));       // T = 3 max_len
  CHECK_FALSE(uses_narrow_tile(prefill_problem(4, 32, 128, 128), {}, false)); // 1024 warps, T = 4 max_len
  auto packed = [](std::vector<std::int64_t> lengths) {
    Problem p = Problem::packed(lengths, 8, 32, 128, 128);
    p.has_h0 = p.has_hT = true;
    return p;
  };
  CHECK(uses_narrow_tile(packed({8192, 256, 256, 256, 256, 0}), {}, false));    // one long sequence
  CHECK_FALSE(uses_narrow_tile(packed({1000, 1000, 999, 1000, 0}), {}, false)); // T > 3 max_len
  CHECK_FALSE(uses_narrow_tile(packed({0, 0, 0, 0, 0}), {}, false));           // no tokens, 1280 warps
  CHECK(uses_narrow_tile(prefill_problem(3, 32, 128, 128), on, false));
  CHECK_FALSE(uses_narrow_tile(prefill_problem(2, 32, 128, 128), off, false));
  CHECK_FALSE(uses_narrow_tile(prefill_problem(2, 32, 128, 128), runtime, false));
  CHECK_FALSE(uses_narrow_tile(prefill_problem(1, 32, 64, 128), on, false));   // only K = V = 128
  CHECK_FALSE(uses_narrow_tile(prefill_problem(1, 32, 128, 64), on, false));
  LaunchOptions two_lanes = on;
  two_lanes.column_lanes = 2;  // only the default (4, 16) tile
  CHECK_FALSE(uses_narrow_tile(prefill_problem(1, 32, 128, 128), two_lanes, false));
  Problem decode = Problem::fixed_length(1, 1, 8, 32, 128, 128);
  decode.state_slots = 4;
  decode.has_h0 = decode.has_hT = true;
  CHECK_FALSE(uses_narrow_tile(decode, {}, true));
  CHECK(uses_narrow_tile(decode, on, true));
  LaunchOptions streamed = on;
  streamed.streamed_decode = true;  // the streamed kernel has no narrow tile
  CHECK_FALSE(uses_narrow_tile(decode, streamed, true));
}

TEST_CASE("decode picks the streamed kernel only where it applies", "[cuda][api]") {
  auto decode_problem = [](int K, int V) {
    Problem p = Problem::fixed_length(4, 1, 2, 4, K, V);
    p.state_slots = 8;
    p.has_h0 = true;
    p.has_hT = true;
    return p;
  };
  // Small batches (at most 4096 (request, value head) items) run the general kernel unless
  // options.streamed_decode; the shape rules below are checked with it.
  LaunchOptions streamed;
  streamed.streamed_decode = true;
  CHECK_FALSE(decode_uses_stream_kernel(decode_problem(128, 128)));
  Problem large = decode_problem(128, 128);
  const Problem large_shape = Problem::fixed_length(1025, 1, 2, 4, 128, 128);  // 4100 items
  large.cu_seqlens = large_shape.cu_seqlens;
  large.T = large_shape.T;
  large.state_slots = 1025;
  CHECK(decode_uses_stream_kernel(large));
  large.HV = 2;  // 2050 items
  large.H = 2;
  CHECK_FALSE(decode_uses_stream_kernel(large));
  // The benchmark shape: a 64 KiB state, 8 tiles of 16 columns, 16 rows per lane.
  CHECK(decode_uses_stream_kernel(decode_problem(128, 128), streamed));
  LaunchOptions general = streamed;
  general.general_decode = true;
  CHECK_FALSE(decode_uses_stream_kernel(decode_problem(128, 128), general));
  // Odd sizes are fine while K * V is a multiple of 4 (one aligned bulk copy per state).
  CHECK(decode_uses_stream_kernel(decode_problem(3, 4), streamed));
  CHECK(decode_uses_stream_kernel(decode_problem(100, 36), streamed));
  CHECK_FALSE(decode_uses_stream_kernel(decode_problem(3, 5), streamed));
  // Over 64 KiB, over 8 tiles (V > 128 at 16 columns), or K > 128 with V > 64.
  CHECK_FALSE(decode_uses_stream_kernel(decode_problem(256, 256), streamed));
  CHECK_FALSE(decode_uses_stream_kernel(decode_problem(64, 192), streamed));
  CHECK(decode_uses_stream_kernel(decode_problem(256, 64), streamed));
  CHECK_FALSE(decode_uses_stream_kernel(decode_problem(129, 128), streamed));
  // 32 rows per lane (8 column lanes at K = 128) would spill: the general kernel runs.
  LaunchOptions eight_lanes = streamed;
  eight_lanes.column_lanes = 8;
  CHECK_FALSE(decode_uses_stream_kernel(decode_problem(128, 128), eight_lanes));
  CHECK(decode_uses_stream_kernel(decode_problem(64, 128), eight_lanes));
  // A dense-state problem (no cache) is never a decode.
  Problem dense = decode_problem(128, 128);
  dense.state_slots = 0;
  CHECK_FALSE(decode_uses_stream_kernel(dense, streamed));

  // The wide tile: opt-in, where the streamed kernel runs the default tile at K in (64, 128],
  // K-major, V <= 128, K and V multiples of 4, one token per request.
  LaunchOptions wide = streamed;
  wide.wide_stream_tile = true;
  CHECK_FALSE(decode_uses_wide_stream_tile(decode_problem(128, 128), streamed));
  LaunchOptions wide_small_batch;
  wide_small_batch.wide_stream_tile = true;  // a small batch runs the general kernel
  CHECK_FALSE(decode_uses_wide_stream_tile(decode_problem(128, 128), wide_small_batch));
  CHECK(decode_uses_wide_stream_tile(decode_problem(128, 128), wide));
  CHECK(decode_uses_wide_stream_tile(decode_problem(68, 4), wide));
  CHECK_FALSE(decode_uses_wide_stream_tile(decode_problem(64, 128), wide));   // 8 rows per lane
  CHECK_FALSE(decode_uses_wide_stream_tile(decode_problem(100, 37), wide));   // V % 4 != 0
  CHECK_FALSE(decode_uses_wide_stream_tile(decode_problem(256, 64), wide));   // 2 column lanes
  LaunchOptions wide_general = wide;
  wide_general.general_decode = true;
  CHECK_FALSE(decode_uses_wide_stream_tile(decode_problem(128, 128), wide_general));
  LaunchOptions wide_two_lanes = wide;
  wide_two_lanes.column_lanes = 2;
  CHECK_FALSE(decode_uses_wide_stream_tile(decode_problem(128, 128), wide_two_lanes));
  Problem v_major = decode_problem(128, 128);
  v_major.state_layout = StateLayout::v_major;  // its (4, 16) stores are whole lines already
  CHECK_FALSE(decode_uses_wide_stream_tile(v_major, wide));
  Problem two_tokens = decode_problem(128, 128);
  const Problem shape = Problem::fixed_length(two_tokens.N(), 2, two_tokens.H, two_tokens.HV, 128, 128);
  two_tokens.cu_seqlens = shape.cu_seqlens;
  two_tokens.T = shape.T;
  CHECK_FALSE(decode_uses_wide_stream_tile(two_tokens, wide));
}

TEST_CASE("the one-token decode kernel runs only where it applies", "[cuda][api]") {
  // HV = 32, K = V = 128, one token per request: up to 16 requests (4096 warps of the default
  // tile) take the one-token kernel; 32 do not, nor do 2 tokens per request, intermediate
  // states, another K, the narrow or runtime-size instances, or LaunchOptions::token_decode_kernel off.
  const auto decode_problem = [](int requests, std::int64_t tokens) {
    Problem p = Problem::fixed_length(requests, tokens, 16, 32, 128, 128);
    p.state_slots = requests;
    p.has_h0 = p.has_hT = true;
    return p;
  };
  const LaunchOptions automatic;
  CHECK(decode_uses_token_kernel(decode_problem(1, 1), automatic));
  CHECK(decode_uses_token_kernel(decode_problem(16, 1), automatic));
  CHECK_FALSE(decode_uses_token_kernel(decode_problem(17, 1), automatic));
  CHECK_FALSE(decode_uses_token_kernel(decode_problem(1, 2), automatic));
  Problem intermediate = decode_problem(1, 1);
  intermediate.store_intermediate_states = true;
  CHECK_FALSE(decode_uses_token_kernel(intermediate, automatic));
  Problem other_k = decode_problem(1, 1);
  other_k.K = 64;
  CHECK_FALSE(decode_uses_token_kernel(other_k, automatic));
  LaunchOptions off, narrow, runtime, streamed;
  off.token_decode_kernel = false;
  narrow.narrow_tile = LaunchOptions::NarrowTile::on;
  runtime.runtime_size_kernels = true;
  streamed.streamed_decode = true;
  CHECK_FALSE(decode_uses_token_kernel(decode_problem(1, 1), off));
  CHECK_FALSE(decode_uses_token_kernel(decode_problem(1, 1), narrow));
  CHECK_FALSE(decode_uses_token_kernel(decode_problem(1, 1), runtime));
  CHECK_FALSE(decode_uses_token_kernel(decode_problem(1, 1), streamed));
}

// The kernels' multiply-high division// The kernels' multiply-high division (recurrent_params.hpp): exact for every x < 2^31, which
// the host guarantees (items and head indices stay below 2^31). The host path of divide() is
// the device's __umulhi written out, so a wrong multiplier or shift fails here.
TEST_CASE("FastDivisor divides exactly below 2^31", "[cuda][api]") {
  std::vector<unsigned> divisors;
  for (unsigned d = 1; d <= 1100; ++d) divisors.push_back(d);
  for (unsigned d : {4095u, 4096u, 4097u, 65535u, 65536u, 65537u, 1000003u, (1u << 30) - 1, 1u << 30, (1u << 30) + 1,
                     0x7ffffffeu, 0x7fffffffu})
    divisors.push_back(d);
  std::uint64_t state = 0x9e3779b97f4a7c15ull;
  const auto next = [&state] {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return static_cast<unsigned>(state) & 0x7fffffffu;
  };
  std::int64_t wrong = 0;
  for (const unsigned d : divisors) {
    const detail::FastDivisor f = detail::FastDivisor::of(d);
    std::vector<unsigned> xs = {0u, 1u, d - 1, d, d + 1, 2 * d - 1, 2 * d, 0x7fffffffu, 0x7ffffffeu};
    for (unsigned m : {3u, 1000u, 123457u}) {
      const std::uint64_t multiple = std::uint64_t(d) * m;
      if (multiple < 0x80000000ull) xs.insert(xs.end(), {unsigned(multiple - 1), unsigned(multiple)});
    }
    for (int i = 0; i < 2000; ++i) xs.push_back(next());
    for (const unsigned x : xs) {
      if (x >= 0x80000000u) continue;
      if (f.divide(x) != x / d) ++wrong;
    }
  }
  REQUIRE(wrong == 0);
}
