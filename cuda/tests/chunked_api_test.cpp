// Host-side rules of the chunked prefill: every unsupported option is rejected before any CUDA
// call, with a ProblemError naming the argument. No GPU needed: validation never dereferences
// the pointers, so host addresses carved from one buffer stand in for device memory.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "cuda/api/chunked_prefill.hpp"

using namespace gdn;
using namespace gdn::cuda;

namespace {

// Disjoint, 256-byte aligned stand-in addresses for every tensor a problem uses.
struct FakeTensors {
  std::vector<unsigned char> arena;
  std::size_t used = 0;
  DeviceTensors t;

  void* take(std::int64_t bytes) {
    const std::size_t base = (reinterpret_cast<std::uintptr_t>(arena.data()) + 255) / 256 * 256 -
                             reinterpret_cast<std::uintptr_t>(arena.data());
    void* p = arena.data() + base + used;
    used += (static_cast<std::size_t>(bytes) + 255) / 256 * 256 + 256;
    REQUIRE(base + used <= arena.size());
    return p;
  }

  explicit FakeTensors(const Problem& p) : arena(std::size_t(64) << 20) {
    const std::int64_t in = static_cast<std::int64_t>(dtype_size(p.input_dtype));
    const std::int64_t gate = static_cast<std::int64_t>(dtype_size(p.gate_dtype));
    t.q = take(p.T * p.H * p.K * in);
    t.k = take(p.T * p.H * p.K * in);
    t.v = take(p.T * p.HV * p.V * in);
    if (p.gate_mode == GateMode::direct) {
      t.g = take(p.T * p.HV * gate);
      t.beta = take(p.T * p.HV * gate);
    } else {
      t.a = take(p.T * p.HV * gate);
      t.b = take(p.T * p.HV * gate);
      t.A_log = static_cast<const float*>(take(p.HV * 4));
      t.dt_bias = static_cast<const float*>(take(p.HV * 4));
    }
    const std::int64_t state = shape_numel(p.state_shape()) * 4;
    if (p.uses_state_cache()) {
      t.state_cache = static_cast<float*>(take(state));
      t.state_indices = static_cast<const std::int32_t*>(take(p.N() * 4));
    } else {
      if (p.has_h0) t.h0 = static_cast<const float*>(take(state));
      if (p.has_hT) t.hT = static_cast<float*>(take(state));
    }
    if (p.store_intermediate_states) t.intermediate = static_cast<float*>(take(shape_numel(p.intermediate_shape()) * 4));
    t.cu_seqlens = take((p.N() + 1) * 4);
    t.o = take(p.T * p.HV * p.V * in);
  }
};

Problem base() {
  Problem p = Problem::packed({5, 64, 0, 130}, 2, 4, 128, 128);
  p.input_dtype = DType::bf16;
  p.use_qk_l2norm = true;
  p.has_h0 = true;
  p.has_hT = true;
  return p;
}

void require_rejected(const Problem& p, const std::string& argument, const ChunkedOptions& options = {}) {
  FakeTensors f(p);
  try {
    validate_chunked_prefill(p, f.t, options);
    FAIL("accepted: " << p.describe());
  } catch (const ProblemError& e) {
    CHECK(e.argument() == argument);
  }
  // A problem rule (not an option's) also makes chunked_prefill_supports say no.
  if (options.value_tile == 0 && options.debug == nullptr && options.workspace == nullptr &&
      options.workspace_bytes == 0 && options.split_chunks == ChunkedOptions{}.split_chunks &&
      options.long_value_tile == ChunkedOptions{}.long_value_tile && options.long_above_chunks == 0 &&
      options.rounding == ChunkedOptions{}.rounding && options.schedule == ChunkedOptions{}.schedule) {
    std::string why;
    CHECK_FALSE(chunked_prefill_supports(p, &why));
    CHECK(why.find(argument) == 0);
  }
}

}  // namespace

TEST_CASE("chunked api: a supported problem passes the host checks", "[chunked][api]") {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    Problem p = base();
    p.input_dtype = dtype;
    FakeTensors f(p);
    CHECK_NOTHROW(validate_chunked_prefill(p, f.t));
    CHECK(chunked_prefill_supports(p));
  }
  Problem fused = base();
  fused.gate_mode = GateMode::fused;
  fused.allow_negative_eigenvalues = true;
  fused.K = 48;
  fused.V = 256;
  FakeTensors f(fused);
  CHECK_NOTHROW(validate_chunked_prefill(fused, f.t));
}

TEST_CASE("chunked api: unsupported options are rejected naming the argument", "[chunked][api]") {
  Problem cache = base();
  cache.state_slots = 6;
  require_rejected(cache, "state_slots");

  Problem vmajor = base();
  vmajor.state_layout = StateLayout::v_major;
  require_rejected(vmajor, "state_layout");

  Problem intermediate = base();
  intermediate.store_intermediate_states = true;
  require_rejected(intermediate, "store_intermediate_states");

  for (int K : {20, 8, 144, 256}) {
    Problem p = base();
    p.K = K;
    require_rejected(p, "K");
  }
  for (int V : {40, 8, 272}) {
    Problem p = base();
    p.V = V;
    require_rejected(p, "V");
  }
  Problem f64 = base();
  f64.input_dtype = DType::f64;
  f64.gate_dtype = DType::f64;
  {
    DeviceTensors none;
    try {
      validate_chunked_prefill(f64, none);
      FAIL("accepted f64");
    } catch (const ProblemError& e) {
      CHECK(e.argument() == "input_dtype");
    }
  }
}

TEST_CASE("chunked api: value tile and debug options are checked", "[chunked][api]") {
  ChunkedOptions odd;
  odd.value_tile = 48;
  require_rejected(base(), "value_tile", odd);

  Problem f32 = base();
  f32.input_dtype = DType::f32;
  ChunkedOptions wide;
  wide.value_tile = 64;  // fp32 operands: tiles of 16 and 32 only
  require_rejected(f32, "value_tile", wide);

  Problem narrow = base();
  narrow.V = 64;
  ChunkedOptions big;
  big.value_tile = 128;  // does not divide V
  require_rejected(narrow, "value_tile", big);

  Problem f16 = base();  // K = 128: fp16 has tile 128 too (the same plan as bf16)
  f16.input_dtype = DType::f16;
  {
    FakeTensors f(f16);
    CHECK_NOTHROW(validate_chunked_prefill(f16, f.t, big));
  }
  f16.input_dtype = DType::f32;
  require_rejected(f16, "value_tile", big);

  ChunkedDebug partial;
  ChunkedOptions debug;
  debug.debug = &partial;
  require_rejected(base(), "debug", debug);
}

TEST_CASE("chunked api: single rounding: named, bf16/fp16 only, not with the debug trace", "[chunked][api]") {
  CHECK(ChunkedOptions{}.rounding == ChunkedRounding::split);  // the default stays the accurate design
  ChunkedOptions single;
  single.rounding = ChunkedRounding::single;
  for (DType dtype : {DType::bf16, DType::f16}) {
    Problem p = base();
    p.input_dtype = dtype;
    FakeTensors f(p);
    CHECK_NOTHROW(validate_chunked_prefill(p, f.t, single));
    ChunkedOptions split_too = single;  // with the sequence split and with two V tiles
    split_too.split_chunks = 1;
    CHECK_NOTHROW(validate_chunked_prefill(p, f.t, split_too));
  }
  Problem f32 = base();
  f32.input_dtype = DType::f32;
  require_rejected(f32, "rounding", single);
  {
    FakeTensors f(f32);
    CHECK_NOTHROW(validate_chunked_prefill(f32, f.t, ChunkedOptions{}));
  }
  ChunkedDebug partial;
  ChunkedOptions traced = single;
  traced.debug = &partial;
  require_rejected(base(), "rounding", traced);
  ChunkedOptions bad;
  bad.rounding = static_cast<ChunkedRounding>(7);
  require_rejected(base(), "rounding", bad);
  // Same plan as split: the rounding changes the kernel's products, not its tiles or split.
  const Problem p = base();
  const ChunkedPlan a = chunked_plan(p, ChunkedOptions{}, 132), b = chunked_plan(p, single, 132);
  CHECK(a.value_tile == b.value_tile);
  CHECK(a.split_chunks == b.split_chunks);
  CHECK(a.long_value_tile == b.long_value_tile);
}

TEST_CASE("chunked api: the fused schedule: where the plan takes it, and a bad value rejected", "[chunked][api]") {
  CHECK(ChunkedOptions{}.schedule == ChunkedSchedule::automatic);
  // bf16, K 128 at value tile 128, unsplit: fused when asked for; the automatic schedule and
  // two_pass run the prepass (the fused producer is the slower for now).
  Problem p = base();
  ChunkedOptions automatic;
  automatic.value_tile = 128;
  automatic.split_chunks = 0;
  CHECK_FALSE(chunked_plan(p, automatic, 132).fused);
  ChunkedOptions wide = automatic;
  wide.schedule = ChunkedSchedule::fused;
  CHECK(chunked_plan(p, wide, 132).fused);
  ChunkedOptions separate = wide;
  separate.schedule = ChunkedSchedule::two_pass;
  CHECK_FALSE(chunked_plan(p, separate, 132).fused);
  ChunkedOptions single = wide;  // the single rounding has its fused instance too
  single.rounding = ChunkedRounding::single;
  CHECK(chunked_plan(p, single, 132).fused);
  // Not fused: fp16 and fp32 inputs, K <= 64, another value tile, the sequence split.
  for (DType dtype : {DType::f16, DType::f32}) {
    Problem other = p;
    other.input_dtype = dtype;
    ChunkedOptions o = wide;
    if (dtype == DType::f32) o.value_tile = 32;
    CHECK_FALSE(chunked_plan(other, o, 132).fused);
  }
  Problem narrow_keys = Problem::packed({5, 64, 0, 130}, 2, 4, 64, 128);
  narrow_keys.input_dtype = DType::bf16;
  CHECK_FALSE(chunked_plan(narrow_keys, wide, 132).fused);
  ChunkedOptions tile64 = wide;
  tile64.value_tile = 64;
  CHECK_FALSE(chunked_plan(p, tile64, 132).fused);
  ChunkedOptions split = wide;
  split.split_chunks = 1;
  CHECK_FALSE(chunked_plan(p, split, 132).fused);
  ChunkedOptions bad;
  bad.schedule = static_cast<ChunkedSchedule>(5);
  require_rejected(base(), "schedule", bad);
}

TEST_CASE("chunked api: the prepass workspace: size, alignment, rejection", "[chunked][api]") {
  // base(): 1 + 1 + 0 + 3 chunks, HV 4; (N + 1) int64 offsets padded to 256 bytes, then per
  // (chunk, head) 3 x 64 x 64 bf16 + 6 x 64 fp32 = 26112 bytes, then P lo (64 x 64 bf16) at the
  // next 1024 bytes: 34816 (fp32: 2 x 64 x 64 fp32 + the scalars, no P lo).
  const Problem p = base();
  // offsets | records | the long sequences' ranks of two V tiles (256 bytes each for N < 32).
  CHECK(chunked_workspace_bytes(p, 0) == 256 + 5 * 4 * 34816 + 256);
  // The one-argument size is the default options': base() (H 2 HV 4, V 128) is split by the
  // heads into segments of 32 chunks (one per sequence here): the split's offsets and maps.
  CHECK(chunked_split_by_heads(p) == 32);
  CHECK(chunked_workspace_bytes(p) == chunked_workspace_bytes(p, 32));
  CHECK(chunked_workspace_bytes(p) == 256 + 5 * 4 * 34816 + 256 + 4 * 4 * 128 * 256 * 4);
  Problem f32 = base();
  f32.input_dtype = DType::f32;
  CHECK(chunked_workspace_bytes(f32) == 256 + 5 * 4 * 34304 + 256);  // fp32: never split
  Problem empty = Problem::packed({0, 0}, 1, 1, 16, 16);
  CHECK(chunked_workspace_bytes(empty) == 2 * 256);

  FakeTensors f(p);
  std::vector<unsigned char> space(chunked_workspace_bytes(p) + 64);
  unsigned char* aligned = space.data() + (16 - reinterpret_cast<std::uintptr_t>(space.data()) % 16) % 16;
  ChunkedOptions given;
  given.workspace = aligned;
  given.workspace_bytes = chunked_workspace_bytes(p);
  CHECK_NOTHROW(validate_chunked_prefill(p, f.t, given));
  ChunkedOptions small = given;
  small.workspace_bytes -= 1;
  require_rejected(p, "workspace", small);
  ChunkedOptions misaligned = given;
  misaligned.workspace = aligned + 8;
  require_rejected(p, "workspace", misaligned);
  ChunkedOptions dangling;
  dangling.workspace_bytes = 1024;
  require_rejected(p, "workspace", dangling);
}

TEST_CASE("chunked api: blocks per SM of the state kernel's instances", "[chunked][api]") {
  Problem p = base();
  for (int tile : {16, 32, 64, 128}) CHECK(chunked_blocks_per_sm(p, tile) == 1);
  p.K = 64;
  CHECK(chunked_blocks_per_sm(p, 16) == 2);  // 99 KB of shared memory, <= 128 registers
  for (int tile : {32, 64, 128}) CHECK(chunked_blocks_per_sm(p, tile) == 1);
  p.input_dtype = DType::f32;
  for (int tile : {16, 32}) CHECK(chunked_blocks_per_sm(p, tile) == 1);
  CHECK(chunked_blocks_per_sm(p, 64) == 0);  // no fp32 instance
  // fp16: the same plans as bf16 (both split Vnew in P Vnew).
  p.input_dtype = DType::f16;
  CHECK(chunked_blocks_per_sm(p, 16) == 2);
  for (int tile : {32, 64, 128}) CHECK(chunked_blocks_per_sm(p, tile) == 1);
  p.K = 128;
  for (int tile : {16, 32, 64, 128}) CHECK(chunked_blocks_per_sm(p, tile) == 1);
}

TEST_CASE("chunked api: a null or misaligned tensor is caught by the shared rules", "[chunked][api]") {
  Problem p = base();
  FakeTensors f(p);
  DeviceTensors t = f.t;
  t.v = nullptr;
  try {
    validate_chunked_prefill(p, t);
    FAIL("accepted null v");
  } catch (const ProblemError& e) {
    CHECK(e.argument() == "v");
  }
  t = f.t;
  t.q = static_cast<const unsigned char*>(f.t.q) + 2;
  try {
    validate_chunked_prefill(p, t);
    FAIL("accepted misaligned q");
  } catch (const ProblemError& e) {
    CHECK(e.argument() == "q");
  }
}

TEST_CASE("chunked api: the V tile fills 132 SMs on the issue's shapes; counters", "[chunked][api]") {
  auto shape = [](int sequences, std::int64_t length, int H, int HV) {
    Problem p = Problem::fixed_length(sequences, length, H, HV, 128, 128);
    p.input_dtype = DType::bf16;
    return p;
  };
  // 128 (sequence, head) pairs: one wave of full-width blocks beats two waves of half ones.
  CHECK(chunked_value_tile(shape(4, 8192, 16, 32), 132) == 128);
  // 32 pairs: four tiles each (128 blocks); 8 pairs: eight tiles of 16 (64 blocks, the narrowest).
  CHECK(chunked_value_tile(shape(1, 32768, 16, 32), 132) == 32);
  CHECK(chunked_value_tile(shape(1, 32768, 2, 8), 132) == 16);
  // 256 pairs of 4096 tokens: two waves of full-width blocks.
  CHECK(chunked_value_tile(shape(8, 4096, 16, 32), 132) == 128);
  // Uneven lengths (the benchmark's varlen pack, 384 pairs): the 8192-token sequence's chain
  // at 128 columns (128 x 192) is longer than all block-chunks at 64 over 132 SMs (19115).
  Problem varlen = Problem::packed({1, 17, 64, 65, 300, 1000, 4000, 8192, 2048, 513, 3000, 129}, 16, 32, 128, 128);
  varlen.input_dtype = DType::bf16;
  CHECK(chunked_value_tile(varlen, 132) == 64);
  // The same 19329 tokens in 12 equal sequences keep the full width.
  CHECK(chunked_value_tile(shape(12, 1611, 16, 32), 132) == 128);
  Problem f32 = shape(1, 1000, 2, 8);
  f32.input_dtype = DType::f32;
  CHECK(chunked_value_tile(f32, 132) <= 32);
  // fp16 at K = 128: the same choice as bf16.
  Problem f16 = shape(4, 8192, 16, 32);
  f16.input_dtype = DType::f16;
  CHECK(chunked_value_tile(f16, 132) == 128);
  // 4 C (K + V) + 6 K V per token per value head at C = 64, K = V = 128.
  CHECK(chunked_flops(shape(1, 1, 1, 1)) == 163840.0);
  std::vector<std::int64_t> offsets;
  CHECK(chunked_chunk_offsets(Problem::packed({0, 1, 64, 65, 129}, 1, 1, 16, 16), &offsets) == 7);
  CHECK(offsets == std::vector<std::int64_t>{0, 0, 1, 2, 4});
}

TEST_CASE("chunked api: the sequence split: options, plan, segments, workspace", "[chunked][api]") {
  // Options: -1 is automatic, -2 by the heads, other negatives are rejected; fp32 has no split.
  ChunkedOptions bad;
  bad.split_chunks = -3;
  require_rejected(base(), "split_chunks", bad);
  Problem f32 = base();
  f32.input_dtype = DType::f32;
  ChunkedOptions four;
  four.split_chunks = 4;
  require_rejected(f32, "split_chunks", four);
  ChunkedOptions automatic;
  automatic.split_chunks = kChunkedSplitAuto;
  {
    FakeTensors f(f32);
    CHECK_NOTHROW(validate_chunked_prefill(f32, f.t, automatic));
  }
  CHECK(chunked_plan(f32, automatic, 132).split_chunks == 0);

  // Segments: max(1, ceil(chunks / split)) per sequence. base(): 1, 1, 0 and 3 chunks.
  const Problem p = base();
  CHECK(chunked_segments(p, 0) == 4);
  CHECK(chunked_segments(p, 1) == 6);
  CHECK(chunked_segments(p, 2) == 5);
  CHECK(chunked_segments(p, 4) == 4);
  // Workspace: + one more offsets array and a K x (K + V) fp32 map per (segment, head).
  // The split's segment offsets take the place of the ranks; its affine maps come on top.
  CHECK(chunked_workspace_bytes(p, 2) == chunked_workspace_bytes(p, 0) + 5 * 4 * 128 * 256 * 4);
  CHECK(chunked_workspace_bytes(p, 32) == chunked_workspace_bytes(p));  // the default: by the heads
  ChunkedOptions two;
  two.split_chunks = 2;
  {
    FakeTensors f(p);
    std::vector<unsigned char> space(chunked_workspace_bytes(p, 2) + 64);
    unsigned char* aligned = space.data() + (16 - reinterpret_cast<std::uintptr_t>(space.data()) % 16) % 16;
    two.workspace = aligned;
    two.workspace_bytes = chunked_workspace_bytes(p, 0);  // the unsplit size is too small
    require_rejected(p, "workspace", two);
    two.workspace_bytes = chunked_workspace_bytes(p, 2);
    CHECK_NOTHROW(validate_chunked_prefill(p, f.t, two));
  }

  // The plan: an explicit split is kept; the automatic one cuts only where SMs would idle.
  auto shape = [](int sequences, std::int64_t length, int H, int HV) {
    Problem q = Problem::fixed_length(sequences, length, H, HV, 128, 128);
    q.input_dtype = DType::bf16;
    return q;
  };
  ChunkedOptions eight;
  eight.split_chunks = 8;
  const ChunkedPlan kept = chunked_plan(shape(1, 32768, 2, 8), eight, 132);
  CHECK(kept.split_chunks == 8);
  CHECK(kept.segments == 64);
  // H 2, HV 8, 1 x 32768: 8 chains of 512 chunks on 132 SMs. Unsplit, the narrowest tile
  // (64 blocks) is one chain of 512 x 80; cut into segments of tens of chunks, both passes fill
  // the SMs and the model's cost is less than half.
  const ChunkedPlan low = chunked_plan(shape(1, 32768, 2, 8), automatic, 132);
  ChunkedOptions unsplit;
  unsplit.split_chunks = 0;
  const ChunkedPlan low_plain = chunked_plan(shape(1, 32768, 2, 8), unsplit, 132);
  CHECK(low_plain.split_chunks == 0);
  // The default options split it by the heads: segments of 32 chunks.
  CHECK(chunked_plan(shape(1, 32768, 2, 8), ChunkedOptions{}, 132).split_chunks == 32);
  CHECK(low_plain.value_tile == 16);
  CHECK(low.split_chunks >= 8);
  CHECK(low.split_chunks <= 64);
  CHECK(low.cost < 0.5 * low_plain.cost);
  CHECK(low.segments == (512 + low.split_chunks - 1) / low.split_chunks);
  // 4 x 8192 at HV 32 already fills the SMs with one wave of full tiles: no split, and the
  // automatic plan is the unsplit one (same tile as chunked_value_tile).
  for (const Problem& q : {shape(4, 8192, 16, 32), shape(8, 4096, 16, 32), shape(4, 8192, 16, 64)}) {
    const ChunkedPlan a = chunked_plan(q, automatic, 132);
    CHECK(a.split_chunks == 0);
    CHECK(a.value_tile == chunked_value_tile(q, 132));
    CHECK(a.segments == q.N());
  }
  // Short sequences are never cut automatically.
  CHECK(chunked_plan(shape(1, 64 * 4, 1, 1), automatic, 132).split_chunks == 0);
}

TEST_CASE("chunked api: the split by the heads depends on HV, V and the dtype alone", "[chunked][api]") {
  auto shape = [](std::vector<std::int64_t> lengths, int H, int HV) {
    Problem p = Problem::packed(lengths, H, HV, 128, 128);
    p.input_dtype = DType::bf16;
    return p;
  };
  ChunkedOptions heads;
  heads.split_chunks = kChunkedSplitByHeads;
  // H 2 HV 8: 8 x 8 blocks at BV 16, half of 132 SMs at most: segments of 32 chunks, whatever else is
  // in the batch (one sequence, or many: the same rule, so the same bits for each sequence).
  const Problem low = shape({32768}, 2, 8);
  CHECK(chunked_split_by_heads(low) == 32);
  CHECK(chunked_plan(low, heads, 132).split_chunks == 32);
  CHECK(chunked_split_by_heads(shape({32768, 100, 5000, 32768, 32768, 32768}, 2, 8)) == 32);
  CHECK(chunked_plan(low, heads, 20).split_chunks == 32);  // not the device's SM count either
  // H 16 HV 16: 128 blocks, almost one per SM: no split; H 16 HV 32: 256: none.
  CHECK(chunked_split_by_heads(shape({32768}, 16, 16)) == 0);
  const Problem qwen = shape({32768}, 16, 32);
  CHECK(chunked_split_by_heads(qwen) == 0);
  CHECK(chunked_plan(qwen, heads, 132).split_chunks == 0);
  // fp32 has no split.
  Problem f32 = low;
  f32.input_dtype = DType::f32;
  CHECK(chunked_split_by_heads(f32) == 0);
  // Accepted, and the caller's workspace is checked against the resolved split (two segments).
  const Problem two = shape({4096}, 2, 8);
  FakeTensors f(two);
  CHECK_NOTHROW(validate_chunked_prefill(two, f.t, heads));
  std::vector<unsigned char> space(chunked_workspace_bytes(two, 32) + 16);
  ChunkedOptions given = heads;
  given.workspace = space.data() + (16 - reinterpret_cast<std::uintptr_t>(space.data()) % 16) % 16;
  given.workspace_bytes = chunked_workspace_bytes(two, 0);  // the unsplit size: too small
  require_rejected(two, "workspace", given);
  given.workspace_bytes = chunked_workspace_bytes(two, 32);
  CHECK_NOTHROW(validate_chunked_prefill(two, f.t, given));
}

TEST_CASE("chunked api: two V tiles: the plan picks them for uneven packs only; options are checked",
          "[chunked][api]") {
  auto pack = [](std::vector<std::int64_t> lengths, int H, int HV, DType dtype = DType::bf16) {
    Problem p = Problem::packed(lengths, H, HV, 128, 128);
    p.input_dtype = dtype;
    return p;
  };
  // The benchmark's varlen pack: the 8192-token sequence (128 chunks) at BV 64 beside the rest
  // (63 chunks and fewer) at BV 128. Cost: max(128 x 128, 63 x 192, all block-chunks / 132 =
  // (128 x 32 x 2 x 128 + 180 x 32 x 192) / 132) = 16384 units against one tile's 19115 (BV 64).
  const Problem varlen = pack({1, 17, 64, 65, 300, 1000, 4000, 8192, 2048, 513, 3000, 129}, 16, 32);
  ChunkedOptions automatic;  // the default: long_value_tile 0
  CHECK(automatic.long_value_tile == 0);
  const ChunkedPlan two = chunked_plan(varlen, automatic, 132);
  CHECK(two.long_value_tile == 64);
  CHECK(two.long_above_chunks == 63);
  CHECK(two.value_tile == 128);
  CHECK(two.cost == Approx(16384.0));
  CHECK(two.split_chunks == 0);
  // Off (-1): the one tile of before.
  ChunkedOptions off;
  off.long_value_tile = -1;
  const ChunkedPlan single = chunked_plan(varlen, off, 132);
  CHECK(single.long_value_tile == 0);
  CHECK(single.value_tile == chunked_value_tile(varlen, 132));
  // Equal lengths, one sequence, a forced value_tile, fp32, debug: never two tiles.
  CHECK(chunked_plan(pack({8192, 8192, 8192, 8192}, 16, 32), automatic, 132).long_value_tile == 0);
  CHECK(chunked_plan(pack({32768}, 16, 32), automatic, 132).long_value_tile == 0);
  ChunkedOptions forced_tile = automatic;
  forced_tile.value_tile = 64;
  CHECK(chunked_plan(varlen, forced_tile, 132).long_value_tile == 0);
  CHECK(chunked_plan(pack({1, 17, 64, 65, 300, 1000, 4000, 8192}, 16, 32, DType::f32), automatic, 132)
            .long_value_tile == 0);
  // A gain under 10 % of the model is not taken: two long sequences and many short ones whose
  // blocks fill the GPU anyway.
  std::vector<std::int64_t> many(200, 1000);
  many.push_back(8192);
  CHECK(chunked_plan(pack(many, 16, 32), automatic, 132).long_value_tile == 0);
  // Forced: the given tile and threshold, the automatic tile for the others.
  ChunkedOptions forced;
  forced.long_value_tile = 32;
  forced.long_above_chunks = 10;
  forced.split_chunks = 0;  // small (below) is split by the heads by default
  const ChunkedPlan f = chunked_plan(varlen, forced, 132);
  CHECK(f.long_value_tile == 32);
  CHECK(f.long_above_chunks == 10);
  CHECK(f.value_tile == chunked_value_tile(varlen, 132));

  // Rejected naming the argument, before any launch (a small pack: fake tensors).
  const Problem small = pack({1, 700, 65}, 2, 4);
  FakeTensors t(small);
  CHECK_NOTHROW(validate_chunked_prefill(small, t.t, forced));
  ChunkedOptions bad = forced;
  bad.long_value_tile = -2;
  require_rejected(small, "long_value_tile", bad);
  bad.long_value_tile = 48;  // not a tile
  require_rejected(small, "long_value_tile", bad);
  bad = forced;
  bad.long_above_chunks = -1;
  require_rejected(small, "long_above_chunks", bad);
  bad = forced;
  bad.split_chunks = 32;
  require_rejected(small, "long_value_tile", bad);
  bad.split_chunks = kChunkedSplitByHeads;  // the default: splits small (HV 4), so rejected
  require_rejected(small, "long_value_tile", bad);
  // ... but not a problem it leaves unsplit (H 16 HV 32).
  {
    ChunkedOptions by_heads = forced;
    by_heads.split_chunks = kChunkedSplitByHeads;
    const Problem wide = pack({1, 700, 65}, 16, 32);
    FakeTensors w(wide);
    CHECK_NOTHROW(validate_chunked_prefill(wide, w.t, by_heads));
  }
  Problem f32 = small;
  f32.input_dtype = DType::f32;
  bad = forced;
  bad.long_value_tile = 16;
  require_rejected(f32, "long_value_tile", bad);
}
