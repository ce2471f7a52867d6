// Host side of the chunked prefill: the common checks of the recurrent kernels
// (validate_prefill), the chunked kernel's own rules, then the workspace (given or allocated
// stream-ordered) and the three launches (offsets, prepass, state kernel).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/chunked/chunked_params.hpp"
#include "cuda/api/check.hpp"
#include "cuda/api/chunked_prefill.hpp"
#include "cuda/faults/planted_faults.hpp"

namespace gdn::cuda {

namespace {

using detail::element_type;
using detail::fail;
using detail::unsupported_storage;
using detail::str;
using detail::ChunkedParams;
using detail::ElementType;

// The rules of the chunked kernel beyond a valid problem, as (argument, rule); empty when fine.
std::pair<std::string, std::string> unsupported(const Problem& p) {
  const std::string fallback = " (recurrent_prefill supports it)";
  if (p.input_dtype == DType::f64) return {"input_dtype", "must be f32, bf16 or f16 for the CUDA kernels, got f64"};
  if (auto rule = unsupported_storage(p); !rule.first.empty()) return rule;
  if (p.K % 16 != 0 || p.K > 128)
    return {"K", "must be a multiple of 16 in [16, 128] for the chunked prefill, got " + str(p.K) + fallback};
  if (p.V % 16 != 0 || p.V > 256)
    return {"V", "must be a multiple of 16 in [16, 256] for the chunked prefill, got " + str(p.V) + fallback};
  if (p.uses_state_cache())
    return {"state_slots", "must be 0: the chunked prefill reads and writes dense h0/hT only, got a state cache of " +
                               str(p.state_slots) + " slots" + fallback};
  if (p.state_layout != StateLayout::k_major)
    return {"state_layout", "must be k_major for the chunked prefill, got v_major" + fallback};
  if (p.store_intermediate_states)
    return {"store_intermediate_states", "is a per-token option the chunked form does not produce" + fallback};
  return {};
}

// The V tiles the kernel has for the problem's dtype and K (chunked_kernel.cuh, for_instance),
// widest first. fp32: 32 and 16, its fp32 operands need twice the shared memory. bf16 and fp16:
// 128 to 16 (both split Vnew in P Vnew; at K 128, BV 128 the plan with that tile takes 223 KB of
// the 227).
std::vector<int> tile_sizes(const Problem& p) {
  if (p.input_dtype == DType::f32) return {32, 16};
  return {128, 64, 32, 16};
}

std::vector<int> tile_candidates(const Problem& p) {
  std::vector<int> out;
  for (int bv : tile_sizes(p))
    if (p.V % bv == 0) out.push_back(bv);
  return out;
}

int multiprocessor_count() {
  int device = 0, count = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return count;
}

}  // namespace

bool chunked_prefill_supports(const Problem& problem, std::string* why) {
  const auto rule = unsupported(problem);
  if (rule.first.empty()) return true;
  if (why) *why = rule.first + ": " + rule.second;
  return false;
}

int chunked_blocks_per_sm(const Problem& p, int value_tile) {
  return detail::chunked_instance_blocks_per_sm(element_type(p.input_dtype), p.K <= 64 ? 64 : 128, value_tile);
}

int chunked_value_tile(const Problem& p, int multiprocessors) {
  // Per-chunk time of one block, in units of 16 K x V columns: a fixed part worth 64 columns
  // plus BV (192 : 128 : 96 : 80 for BV 128, 64, 32, 16), fitted to the wgmma kernel's measured
  // per-chunk times (bf16, K = V = 128).
  // A batch takes at least its longest sequence's chain of chunks, and at least all its
  // block-chunks spread over the resident blocks (one per SM, two for the instances that fit
  // twice: chunked_blocks_per_sm). The first bound is why a pack of uneven lengths wants
  // narrower tiles than equal sequences of the same total (in the benchmark's varlen pack,
  // BV 128's chain of 128 chunks is the whole kernel).
  const std::vector<int> candidates = tile_candidates(p);
  std::int64_t total_chunks = 0, longest = 0;
  for (int n = 0; n < p.N(); ++n) {
    const std::int64_t chunks = (p.seq_len(n) + kChunkSize - 1) / kChunkSize;
    total_chunks += chunks;
    longest = std::max(longest, chunks);
  }
  int best = candidates.empty() ? 16 : candidates.back();
  double best_cost = -1;
  for (int bv : candidates) {
    const double per_chunk = 64.0 + bv;
    const double slots = double(std::max(multiprocessors, 1)) * std::max(chunked_blocks_per_sm(p, bv), 1);
    const double chain = double(longest) * per_chunk;
    const double spread = double(total_chunks) * p.HV * (p.V / bv) * per_chunk / slots;
    const double cost = std::max(chain, spread);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best = bv;
    }
  }
  return best;
}

std::int64_t chunked_chunk_offsets(const Problem& p, std::vector<std::int64_t>* offsets) {
  std::int64_t total = 0;
  if (offsets) offsets->assign(static_cast<std::size_t>(p.N()), 0);
  for (int n = 0; n < p.N(); ++n) {
    if (offsets) (*offsets)[static_cast<std::size_t>(n)] = total;
    total += (p.seq_len(n) + kChunkSize - 1) / kChunkSize;
  }
  return total;
}

std::int64_t chunked_segments(const Problem& p, int split_chunks) {
  if (split_chunks <= 0) return p.N();
  std::int64_t segments = 0;
  for (int n = 0; n < p.N(); ++n) {
    const std::int64_t chunks = (p.seq_len(n) + kChunkSize - 1) / kChunkSize;
    segments += chunks == 0 ? 1 : (chunks + split_chunks - 1) / split_chunks;
  }
  return segments;
}

std::size_t chunked_workspace_bytes(const Problem& p, int split_chunks) {
  const std::size_t records = static_cast<std::size_t>(chunked_chunk_offsets(p, nullptr)) * static_cast<std::size_t>(p.HV);
  std::size_t bytes = detail::chunked_offsets_bytes(p.N()) + records * detail::chunked_record_bytes(element_type(p.input_dtype));
  if (split_chunks > 0)
    bytes += detail::chunked_offsets_bytes(p.N()) + static_cast<std::size_t>(chunked_segments(p, split_chunks)) *
                                                        static_cast<std::size_t>(p.HV) * p.K * (p.K + p.V) * sizeof(float);
  else
    bytes += detail::chunked_offsets_bytes(p.N());  // two V tiles: the long sequences' ranks (served_offsets)
  return bytes;
}

std::size_t chunked_workspace_bytes(const Problem& p) {
  return chunked_workspace_bytes(p, chunked_fixed_split(p, ChunkedOptions{}.split_chunks));
}

int chunked_split_by_heads(const Problem& p) {
  constexpr std::int64_t kHalfBlocks = 66;  // half of 132 SMs (a constant: see the header)
  constexpr int kSegmentChunks = 32;
  if (p.input_dtype == DType::f32) return 0;
  return std::int64_t(p.HV) * (p.V / 16) <= kHalfBlocks ? kSegmentChunks : 0;
}

int chunked_fixed_split(const Problem& p, int split_chunks) {
  return split_chunks == kChunkedSplitByHeads ? chunked_split_by_heads(p) : split_chunks;
}

ChunkedPlan chunked_plan(const Problem& p, const ChunkedOptions& given, int multiprocessors) {
  ChunkedOptions options = given;
  options.split_chunks = chunked_fixed_split(p, options.split_chunks);
  // The cost model of chunked_value_tile, per pass, in units of one block's fixed per-chunk
  // work (64 + BV per chunk):
  //   output pass: max(longest chain (a segment's chunks), all block-chunks / resident blocks);
  //   affine pass: its blocks (every segment but a sequence's last; V / BV value tiles, plus
  //     ceil(K / BV) transition tiles but for segment 0) in waves of resident blocks, each a
  //     chain of split chunks, at 0.8 of a chunk's cost (no O products, no O stores);
  //   combine: 90 units a step, one step per segment of the longest sequence (fitted to the
  //     combine kernel's measured time per step, the benchmark's ms_combine, at several splits).
  ChunkedPlan best;
  const std::vector<int> candidates = tile_candidates(p);
  if (candidates.empty()) return best;
  std::vector<std::int64_t> chunks(static_cast<std::size_t>(p.N()));
  std::int64_t total_chunks = 0, longest = 0;
  for (int n = 0; n < p.N(); ++n) {
    chunks[static_cast<std::size_t>(n)] = (p.seq_len(n) + kChunkSize - 1) / kChunkSize;
    total_chunks += chunks[static_cast<std::size_t>(n)];
    longest = std::max(longest, chunks[static_cast<std::size_t>(n)]);
  }
  const double sms = double(std::max(multiprocessors, 1));
  auto cost_of = [&](int bv, int split) {
    const double per_chunk = 64.0 + bv;
    const double slots = sms * std::max(chunked_blocks_per_sm(p, bv), 1);
    const double tiles = double(p.V / bv);
    const double chain = double(split > 0 ? std::min<std::int64_t>(longest, split) : longest);
    double cost = std::max(chain, double(total_chunks) * p.HV * tiles / slots) * per_chunk;
    if (split > 0) {
      const double transition = double((p.K + bv - 1) / bv);
      double blocks = 0, steps = 0;
      for (std::int64_t c : chunks) {
        const std::int64_t segments = c == 0 ? 1 : (c + split - 1) / split;
        if (segments > 1) blocks += p.HV * (tiles * double(segments - 1) + transition * double(segments - 2));
        steps = std::max(steps, double(segments - 2));
      }
      cost += 0.8 * std::ceil(blocks / slots) * split * per_chunk + 90.0 * steps;
    }
    return cost;
  };
  const bool can_split = p.input_dtype != DType::f32;
  std::vector<int> splits;
  if (options.split_chunks > 0)
    splits = {options.split_chunks};
  else if (options.split_chunks == kChunkedSplitAuto && can_split)
    splits = {0, 4, 8, 16, 32, 64, 128};
  else
    splits = {0};
  std::vector<int> tiles;
  if (options.value_tile != 0)
    tiles = {options.value_tile};
  else
    tiles = candidates;
  // Unsplit with the automatic tile is chunked_value_tile's choice exactly; a split must win by
  // 10% (the model's error) to be chosen automatically.
  const bool automatic = options.split_chunks == kChunkedSplitAuto;
  auto rank = [&](int split, double cost) { return split > 0 && automatic ? cost / 0.9 : cost; };
  for (int split : splits)
    for (int bv : tiles) {
      if (automatic && split >= longest) continue;  // nothing to cut
      const double cost = cost_of(bv, split);
      if (best.value_tile == 0 || rank(split, cost) < rank(best.split_chunks, best.cost)) {
        best.value_tile = bv;
        best.split_chunks = split;
        best.cost = cost;
      }
    }
  if (options.value_tile == 0 && best.split_chunks == 0) best.value_tile = chunked_value_tile(p, multiprocessors);
  best.segments = chunked_segments(p, best.split_chunks);

  // Two V tiles (ChunkedOptions::long_value_tile): the sequences of more than `above` chunks at
  // a narrower tile than the others. The same model per group: the longer of the two groups'
  // chains, or all block-chunks over the resident blocks (the groups share the SMs). Chosen
  // where it saves 10 % (the model's error) against the one tile. In the benchmark's varlen
  // pack (H 16 HV 32, lengths 1 to 8192) it runs the 8192-token sequence at BV 64 beside BV 128
  // for the rest.
  const bool two_tiles = best.split_chunks == 0 && p.input_dtype != DType::f32 && !options.debug;
  if (two_tiles && options.long_value_tile > 0) {
    best.long_value_tile = options.long_value_tile;
    best.long_above_chunks = options.long_above_chunks;
  } else if (two_tiles && options.long_value_tile == 0 && options.value_tile == 0) {
    std::vector<std::int64_t> counts = chunks;
    std::sort(counts.begin(), counts.end());
    counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
    std::vector<std::int64_t> longer_total(counts.size(), 0);  // chunks of the sequences longer than counts[c]
    for (std::size_t c = 0; c < counts.size(); ++c)
      for (std::int64_t n : chunks) longer_total[c] += n > counts[c] ? n : 0;
    const double one_tile = cost_of(best.value_tile, 0);
    double best_two = -1;
    for (std::size_t c = 0; c + 1 < counts.size(); ++c)
      for (int narrow : candidates)
        for (int wide : candidates) {
          if (narrow >= wide) continue;
          const double per_narrow = 64.0 + narrow, per_wide = 64.0 + wide;
          const double slots =
              sms * std::max(1, std::min(chunked_blocks_per_sm(p, narrow), chunked_blocks_per_sm(p, wide)));
          const double work = (double(longer_total[c]) * p.HV * (p.V / narrow) * per_narrow +
                               double(total_chunks - longer_total[c]) * p.HV * (p.V / wide) * per_wide) /
                              slots;
          const double cost = std::max({double(counts.back()) * per_narrow, double(counts[c]) * per_wide, work});
          if (best_two < 0 || cost < best_two) {
            best_two = cost;
            best.long_value_tile = narrow;
            best.long_above_chunks = counts[c];
            best.value_tile = wide;
          }
        }
    if (best_two >= 0 && best_two < 0.9 * one_tile) {
      best.cost = best_two;
    } else {
      best.long_value_tile = 0;
      best.long_above_chunks = 0;
      best.value_tile = chunked_value_tile(p, multiprocessors);
    }
  }
  // The fused forward is the transposed instance with a producer warpgroup (ChunkedSchedule).
  const bool fusable = p.input_dtype == DType::bf16 && p.K > 64 && best.value_tile == 128 && best.split_chunks == 0 &&
                       best.long_value_tile == 0 && !options.debug;
  // Not the automatic choice yet: its producer is slower than the prepass (ChunkedSchedule).
  best.fused = fusable && options.schedule == ChunkedSchedule::fused;
  return best;
}

double chunked_flops(const Problem& p) {
  const double C = kChunkSize, K = p.K, V = p.V;
  return double(p.T) * p.HV * (4.0 * C * (K + V) + 6.0 * K * V);
}

double chunked_min_bytes(const Problem& p) {
  const double in = double(dtype_size(p.input_dtype)), gate = double(dtype_size(p.gate_dtype));
  const double state = double(p.N()) * p.HV * p.K * p.V * 4.0;
  double bytes = double(p.T) * (2.0 * p.H * p.K + 2.0 * p.HV * p.V) * in;  // q, k, v, o
  bytes += double(p.T) * p.HV * 2.0 * gate;                              // g, beta or a, b
  if (p.has_h0) bytes += state;
  if (p.has_hT) bytes += state;
  return bytes;
}

namespace {
void check_workspace(const Problem& problem, const ChunkedOptions& options, int split_chunks) {
  const std::size_t need = chunked_workspace_bytes(problem, split_chunks);
  if (options.workspace_bytes < need)
    fail("workspace", "must hold chunked_workspace_bytes = " + std::to_string(need) + " bytes for this batch" +
                          (split_chunks > 0 ? " and split_chunks = " + str(split_chunks) : std::string()) + ", got " +
                          std::to_string(options.workspace_bytes));
}
}  // namespace

void validate_chunked_prefill(const Problem& problem, const DeviceTensors& t, const ChunkedOptions& options) {
  problem.validate();
  const auto rule = unsupported(problem);
  if (!rule.first.empty()) fail(rule.first, rule.second);
  validate_prefill(problem, t);  // pointers, sizes, alignment, overlap: the recurrent kernels' rules
  if (options.value_tile != 0) {
    const std::vector<int> candidates = tile_candidates(problem);
    bool ok = false;
    for (int bv : candidates) ok = ok || bv == options.value_tile;
    if (!ok) {
      std::string sizes;
      for (int bv : tile_sizes(problem)) sizes = str(bv) + (sizes.empty() ? "" : ", ") + sizes;
      fail("value_tile", "must be 0 (automatic) or one of " + sizes + " that divides V = " + str(problem.V) +
                             ", got " + str(options.value_tile));
    }
  }
  if (options.rounding != ChunkedRounding::split && options.rounding != ChunkedRounding::single)
    fail("rounding", "must be ChunkedRounding::split or ChunkedRounding::single, got " +
                         str(static_cast<int>(options.rounding)));
  if (options.rounding == ChunkedRounding::single && problem.input_dtype == DType::f32)
    fail("rounding", "single rounding is for bf16/fp16 inputs (the fp32 kernel has no tensor-core operands); fp32 "
                     "inputs need ChunkedRounding::split");
  if (options.rounding == ChunkedRounding::single && options.debug)
    fail("rounding", "the debug intermediates trace the split design only; use ChunkedRounding::split with debug");
  if (options.debug) {
    const ChunkedDebug& d = *options.debug;
    if (!d.chunk_offsets || !d.A || !d.T || !d.Vnew || !d.S0 || !d.S_end)
      fail("debug", "needs every buffer (chunk_offsets, A, T, Vnew, S0, S_end) when given");
    if (d.total_chunks != chunked_chunk_offsets(problem, nullptr))
      fail("debug", "total_chunks must be " + str(chunked_chunk_offsets(problem, nullptr)) + " for this batch, got " +
                        str(d.total_chunks));
  }
  if (options.schedule != ChunkedSchedule::automatic && options.schedule != ChunkedSchedule::two_pass &&
      options.schedule != ChunkedSchedule::fused)
    fail("schedule", "must be ChunkedSchedule::automatic, two_pass or fused, got " +
                         str(static_cast<int>(options.schedule)));
  if (options.split_chunks < kChunkedSplitByHeads)
    fail("split_chunks", "must be 0 (off), kChunkedSplitAuto (-1), kChunkedSplitByHeads (-2) or a positive number "
                         "of chunks, got " + str(options.split_chunks));
  if (options.split_chunks > 0 && problem.input_dtype == DType::f32)
    fail("split_chunks", "the sequence split runs on the bf16/fp16 kernel only; fp32 inputs need 0, got " +
                             str(options.split_chunks));
  if (options.long_value_tile < -1)
    fail("long_value_tile", "must be 0 (automatic), -1 (one tile) or a V tile, got " + str(options.long_value_tile));
  if (options.long_value_tile > 0) {
    const std::vector<int> candidates = tile_candidates(problem);
    if (std::find(candidates.begin(), candidates.end(), options.long_value_tile) == candidates.end())
      fail("long_value_tile", "must be a V tile the kernel has for this problem that divides V = " + str(problem.V) +
                                  ", got " + str(options.long_value_tile));
    if (problem.input_dtype == DType::f32)
      fail("long_value_tile", "two V tiles run on the bf16/fp16 kernel only; fp32 inputs need 0 or -1, got " +
                                  str(options.long_value_tile));
    const int split = chunked_fixed_split(problem, options.split_chunks);
    if (split != 0 && options.split_chunks == kChunkedSplitByHeads)
      fail("long_value_tile", "two V tiles need an unsplit launch, but split_chunks = kChunkedSplitByHeads (the "
                              "default) splits this problem (HV x V / 16 <= 66) into segments of " +
                                  str(split) + " chunks: set split_chunks = 0");
    if (split != 0)
      fail("long_value_tile", "two V tiles need split_chunks = 0, got split_chunks = " + str(options.split_chunks));
    if (options.debug) fail("long_value_tile", "two V tiles cannot run with the debug intermediates");
    if (options.long_above_chunks < 0)
      fail("long_above_chunks", "must be >= 0, got " + str(options.long_above_chunks));
  }
  const std::int64_t blocks = std::int64_t(problem.N()) * problem.HV * (problem.V / 16);
  if (blocks > 0x7fffffff) fail("cu_seqlens", "N * HV * V tiles is too large for one launch");
  if (chunked_fixed_split(problem, options.split_chunks) != 0 && problem.input_dtype != DType::f32) {
    // The most segments any split can make: one per chunk (and one per empty sequence).
    const std::int64_t most = chunked_segments(problem, 1);
    if (most * problem.HV * (problem.K / 16 + problem.V / 16) > 0x7fffffff)
      fail("cu_seqlens", "segments * HV * tiles is too large for one launch of the sequence split");
  }
  const std::int64_t chunks = chunked_chunk_offsets(problem, nullptr);
  if (chunks * problem.HV > 0x7fffffff) fail("cu_seqlens", "chunks * HV is too large for one prepass launch");
  if (options.workspace) {
    if (reinterpret_cast<std::uintptr_t>(options.workspace) % 16 != 0) fail("workspace", "must be 16-byte aligned");
    // (kChunkedSplitAuto: checked by chunked_prefill once the split is chosen, still before any launch.)
    if (options.split_chunks != kChunkedSplitAuto)
      check_workspace(problem, options, chunked_fixed_split(problem, options.split_chunks));
  } else if (options.workspace_bytes != 0) {
    fail("workspace", "is null but workspace_bytes is " + std::to_string(options.workspace_bytes));
  }
}

namespace {
// cuTensorMapEncodeTiled through the runtime's driver entry point (the binaries link the static
// runtime only, not the driver library).
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiled encode_tiled() {
  static const EncodeTiled function = [] {
    void* found = nullptr;
    cudaDriverEntryPointQueryResult status{};
    const cudaError_t code =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &found, 12000, cudaEnableDefault, &status);
    if (code != cudaSuccess) cudaGetLastError();  // not sticky
    return code == cudaSuccess && status == cudaDriverEntryPointSuccess ? reinterpret_cast<EncodeTiled>(found)
                                                                        : EncodeTiled(nullptr);
  }();
  return function;
}

// The map of a [T, heads, width] tensor of a 2-byte type (q, k or v) for boxes of 64 tokens x 1
// head x box_width elements, swizzled by the box's row (32, 64 or 128 bytes). Elements past
// `width` and tokens past T come as zeros (the kernel relies on it for K < its padding).
CUtensorMap encode_rows(const char* name, const void* base, DType dtype, std::int64_t T, int heads, int width,
                        int box_width) {
  const EncodeTiled encode = encode_tiled();
  if (!encode) fail(name, "needs the driver's cuTensorMapEncodeTiled (CUDA 12 or later), which was not found");
  const cuuint64_t dims[3] = {cuuint64_t(width), cuuint64_t(heads), cuuint64_t(T)};
  const cuuint64_t strides[2] = {cuuint64_t(width) * 2, cuuint64_t(heads) * width * 2};  // bytes, dims 1 and 2
  const cuuint32_t box[3] = {cuuint32_t(box_width), 1, 64};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const int row_bytes = box_width * 2;
  const CUtensorMapSwizzle swizzle = row_bytes == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                                     : row_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                       : CU_TENSOR_MAP_SWIZZLE_32B;
  CUtensorMap map{};
  const CUresult code =
      encode(&map, dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3,
             const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
             CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (code != CUDA_SUCCESS)
    fail(name, "cannot be described to the tensor memory accelerator (cuTensorMapEncodeTiled returned " +
                   str(static_cast<int>(code)) + ")");
  return map;
}
}  // namespace

namespace {
// The second stream of two-V-tile launches, one per device and thread (so that two threads'
// launches never share events), at the device's highest priority, with its fork and join
// events; made once, on first use, and kept for the thread's life. Created with the thread's
// capture mode relaxed: a first use inside a stream capture must not invalidate it.
struct SideStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t prepared = nullptr, finished = nullptr;
};
SideStream side_stream() {
  thread_local std::vector<std::pair<int, SideStream>> made;
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  for (const auto& entry : made)
    if (entry.first == device) return entry.second;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  check_cuda(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode");
  SideStream s;
  int least = 0, greatest = 0;
  cudaError_t code = cudaDeviceGetStreamPriorityRange(&least, &greatest);
  if (code == cudaSuccess) code = cudaStreamCreateWithPriority(&s.stream, cudaStreamNonBlocking, greatest);
  if (code == cudaSuccess) code = cudaEventCreateWithFlags(&s.prepared, cudaEventDisableTiming);
  if (code == cudaSuccess) code = cudaEventCreateWithFlags(&s.finished, cudaEventDisableTiming);
  cudaThreadExchangeStreamCaptureMode(&mode);
  check_cuda(code, "creating the two-V-tile side stream and its events");
  made.emplace_back(device, s);
  return s;
}
}  // namespace

void chunked_prefill(const Problem& p, const DeviceTensors& t, cudaStream_t stream, const ChunkedOptions& options) {
  validate_chunked_prefill(p, t, options);
  const ChunkedPlan plan = chunked_plan(p, options, multiprocessor_count());
  if (options.workspace && options.split_chunks == kChunkedSplitAuto) check_workspace(p, options, plan.split_chunks);
  const int value_tile = plan.value_tile;
  const int key_pad = p.K <= 64 ? 64 : 128;
  if (options.schedule == ChunkedSchedule::fused && !plan.fused)
    fail("schedule", "fused runs bf16 inputs with K > 64 at value tile 128, unsplit, without debug or two V tiles; "
                     "this launch resolves to " + std::string(dtype_name(p.input_dtype)) + ", K = " + str(p.K) +
                         ", value tile " + str(value_tile) + ", split_chunks " + str(plan.split_chunks) +
                         (plan.long_value_tile ? ", two V tiles" : "") + (options.debug ? ", debug" : ""));

  ChunkedParams r{};
#if GDN_KERNEL_FAULTS
  r.planted_fault = static_cast<int>(planted_fault());
#endif
  r.q = t.q;
  r.k = t.k;
  r.v = t.v;
  r.g = t.g;
  r.beta = t.beta;
  r.a = t.a;
  r.b = t.b;
  r.A_log = t.A_log;
  r.dt_bias = t.dt_bias;
  r.h0 = p.has_h0 ? t.h0 : nullptr;
  r.hT = p.has_hT ? t.hT : nullptr;
  r.cu_seqlens = t.cu_seqlens;
  r.cu_seqlens_64 = t.cu_seqlens_type == IndexType::i64;
  r.o = t.o;
  r.N = p.N();
  r.H = p.H;
  r.HV = p.HV;
  r.K = p.K;
  r.V = p.V;
  r.group = p.group_size();
  r.scale = static_cast<float>(p.effective_scale());
  r.has_h0 = p.has_h0;
  r.has_hT = p.has_hT;
  r.l2norm = p.use_qk_l2norm;
  r.fused_gates = p.gate_mode == GateMode::fused;
  r.negative_eigenvalues = p.allow_negative_eigenvalues;
  r.gate_type = static_cast<int>(element_type(p.gate_dtype));
  r.value_tiles = p.V / value_tile;
  r.split_chunks = plan.split_chunks;
  r.single_rounding = options.rounding == ChunkedRounding::single ? 1 : 0;
  r.fused = plan.fused ? 1 : 0;
  r.affine_tiles = (p.K + value_tile - 1) / value_tile;
  r.segments = plan.segments;
  if (options.debug) {
    r.chunk_offsets = options.debug->chunk_offsets;
    r.debug_A = options.debug->A;
    r.debug_T = options.debug->T;
    r.debug_Vnew = options.debug->Vnew;
    r.debug_S0 = options.debug->S0;
    r.debug_S_end = options.debug->S_end;
  }
  const std::int64_t blocks = plan.segments * p.HV * r.value_tiles;
  if (blocks == 0 || p.N() == 0) return;
  const ElementType input = element_type(p.input_dtype);
  for (int tile : {value_tile, plan.long_value_tile}) {
    if (tile == 0) continue;
    bool instantiated = false;
    const cudaError_t code = detail::configure_chunked(input, key_pad, tile, &instantiated);
    if (!instantiated)
      fail("value_tile", "no chunked kernel instance for K padded to " + str(key_pad) + ", value tile " + str(tile));
    check_cuda(code, "cudaFuncSetAttribute(chunked kernel shared memory)");
  }
  // The wgmma forward's tensor copies (validate_prefill checked the alignment). With T = 0 every
  // sequence is empty: the kernels only write hT = h0 and copy nothing (and q may be null).
  if (input != ElementType::f32 && p.T > 0) {
    r.tmap_q = encode_rows("q", t.q, p.input_dtype, p.T, p.H, p.K, 64);
    r.tmap_k = encode_rows("k", t.k, p.input_dtype, p.T, p.H, p.K, 64);
    r.tmap_v = encode_rows("v", t.v, p.input_dtype, p.T, p.HV, p.V, value_tile < 64 ? value_tile : 64);
  }

  // Two V tiles: the side stream first (made on first use; it may throw), before any allocation.
  const SideStream side = plan.long_value_tile != 0 ? side_stream() : SideStream{};
  // Workspace: the caller's, or one stream-ordered allocation freed after the last kernel.
  const std::int64_t chunks = chunked_chunk_offsets(p, nullptr);
  // The fused forward reads no records: the chunk offsets alone.
  const std::size_t workspace_bytes =
      plan.fused ? detail::chunked_offsets_bytes(p.N()) : chunked_workspace_bytes(p, plan.split_chunks);
  void* workspace = options.workspace;
  if (!workspace) {
    const std::string what = "cudaMallocAsync(chunked prefill workspace of " + std::to_string(workspace_bytes) + " bytes)";
    const cudaError_t allocated = cudaMallocAsync(&workspace, workspace_bytes, stream);
    if (allocated != cudaSuccess) cudaGetLastError();  // not sticky: leave no error for the next call
    check_cuda(allocated, what.c_str());
  }
  r.ws_offsets = static_cast<std::int64_t*>(workspace);
  r.ws_records = static_cast<unsigned char*>(workspace) + detail::chunked_offsets_bytes(p.N());
  r.ws_chunks = chunks;
  if (plan.split_chunks > 0) {
    r.seg_offsets = reinterpret_cast<std::int64_t*>(r.ws_records + static_cast<std::size_t>(chunks) * p.HV *
                                                                      detail::chunked_record_bytes(input));
    r.ws_affine = reinterpret_cast<float*>(reinterpret_cast<unsigned char*>(r.seg_offsets) +
                                           detail::chunked_offsets_bytes(p.N()));
  }
  cudaError_t launched = cudaSuccess;
  if (plan.long_value_tile == 0) {
    launched = detail::enqueue_chunked(input, key_pad, value_tile, r, blocks, chunks * p.HV, stream);
  } else {
    // Two V tiles: the prepass, then the long sequences' output pass on the side stream (the
    // higher priority, so that its blocks, the batch's critical path, are placed first) beside
    // the others' on the caller's stream, joined by events (capturable: the side stream joins a
    // capture through the first event).
    ChunkedParams longer = r;
    longer.value_tiles = p.V / plan.long_value_tile;
    longer.affine_tiles = (p.K + plan.long_value_tile - 1) / plan.long_value_tile;
    longer.served = 1;
    longer.served_above_chunks = plan.long_above_chunks;
    if (p.T > 0)
      longer.tmap_v = encode_rows("v", t.v, p.input_dtype, p.T, p.HV, p.V,
                                  plan.long_value_tile < 64 ? plan.long_value_tile : 64);
    r.served = 2;
    r.served_above_chunks = plan.long_above_chunks;
    r.served_offsets = reinterpret_cast<std::int64_t*>(r.ws_records + static_cast<std::size_t>(chunks) * p.HV *
                                                                        detail::chunked_record_bytes(input));
    longer.served_offsets = r.served_offsets;
    std::int64_t long_sequences = 0;
    for (int n = 0; n < p.N(); ++n) long_sequences += (p.seq_len(n) + kChunkSize - 1) / kChunkSize > plan.long_above_chunks;
    launched = detail::enqueue_chunked(input, key_pad, value_tile, r, 0, chunks * p.HV, stream, detail::kChunkedPrepare);
    if (launched == cudaSuccess) launched = cudaEventRecord(side.prepared, stream);
    if (launched == cudaSuccess) launched = cudaStreamWaitEvent(side.stream, side.prepared, 0);
    if (launched == cudaSuccess && long_sequences > 0)
      launched = detail::enqueue_chunked(input, key_pad, plan.long_value_tile, longer, long_sequences * p.HV * longer.value_tiles,
                                         0, side.stream, detail::kChunkedForward);
    if (launched == cudaSuccess)
      launched = detail::enqueue_chunked(input, key_pad, value_tile, r, blocks, 0, stream, detail::kChunkedForward);
    if (launched == cudaSuccess) launched = cudaEventRecord(side.finished, side.stream);
    if (launched == cudaSuccess) launched = cudaStreamWaitEvent(stream, side.finished, 0);
  }
  const cudaError_t freed = options.workspace ? cudaSuccess : cudaFreeAsync(workspace, stream);
  check_cuda(launched, "chunked kernel launch");
  check_cuda(freed, "cudaFreeAsync(chunked prefill workspace)");
}

}  // namespace gdn::cuda
