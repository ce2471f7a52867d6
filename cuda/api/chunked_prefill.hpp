#pragma once
// Chunked tensor-core prefill (docs/semantics.md §4). Plain C++ header: g++-compiled tests, tools and
// benchmarks include it; the kernel lives in chunked_kernel.cuh.
//
// The same entry conventions as the recurrent kernels (cuda/api/api.hpp): the shared gdn::Problem,
// a DeviceTensors of device pointers (cu_seqlens required), a stream; every check runs on the
// host before anything is enqueued (gdn::ProblemError naming the argument and the rule), CUDA
// failures throw gdn::cuda::CudaError.
//
// Supported (everything else is rejected with a ProblemError; recurrent_prefill serves every
// valid shape and option and is the fallback):
//   - packed varlen batches, chunks of 64 tokens restarting at every sequence, empty sequences;
//   - GVA, in-kernel l2norm, explicit scale, direct or fused gates (negative eigenvalues too),
//     gates in fp32 or the input dtype;
//   - q, k, v in bf16 or fp16 (tensor cores, fp32 accumulation, fp32 state) or fp32 (plain fp32
//     arithmetic throughout, no TF32);
//   - K a multiple of 16 up to 128, V a multiple of 16 up to 256;
//   - dense h0 / hT [N, HV, K, V] in the K-major layout (h0 == hT in place allowed).
// Rejected: a state cache (state_slots > 0), the V-major layout, per-token intermediate states.
//
// Batch invariance: the V tile is chosen from the batch shape (to fill the GPU), but no output
// bit depends on it: each output element is reduced in one fixed order (see the kernel header).
// The sequence split (ChunkedOptions::split_chunks; by default chosen from the heads alone)
// keeps that with a fixed segment length; its automatic mode (kChunkedSplitAuto) does not, and
// says so.
//
// One call enqueues three kernels on the stream: the chunk offsets, a prepass over every
// (chunk, value head) (gates, A, P, T: what does not depend on the state) into a workspace, and
// the sequential state kernel that reads it (ChunkedOptions::workspace, chunked_workspace_bytes).
// With two V tiles (ChunkedOptions::long_value_tile) the state kernel runs as two launches, the
// second on a side stream forked from and joined to the caller's by events.
// With the sequence split, two more before the state kernel: its affine pass over the segments
// and the combine that chains their maps. ChunkedSchedule::fused enqueues two: the chunk offsets
// and one state kernel that computes the records itself (no prepass, no records in the workspace).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "cuda/api/api.hpp"

namespace gdn::cuda {

constexpr int kChunkSize = 64;
// ChunkedOptions::split_chunks: choose the sequence split from the batch shape (chunked_plan).
constexpr int kChunkedSplitAuto = -1;
// ChunkedOptions::split_chunks: choose it from the heads alone (chunked_split_by_heads): batch
// invariant.
constexpr int kChunkedSplitByHeads = -2;

// Debug mode: per-chunk intermediates of the kernel, in fp32, for comparison with
// reference::ChunkTrace. Chunk index = chunk_offsets[n] + (chunk within sequence n), i.e. chunks
// numbered in sequence order (chunked_chunk_offsets gives the host copy). All device pointers.
struct ChunkedDebug {
  const std::int64_t* chunk_offsets = nullptr;  // [N]
  std::int64_t total_chunks = 0;
  float* A = nullptr;      // [chunks, HV, 64, 64]: A of §4 (rows/cols past the chunk's length are 0)
  float* T = nullptr;      // [chunks, HV, 64, 64]: (I + A)^-1 (identity past the chunk's length)
  float* Vnew = nullptr;   // [chunks, HV, 64, V]
  float* S0 = nullptr;     // [chunks, HV, K, V]: state at the chunk's start
  float* S_end = nullptr;  // [chunks, HV, K, V]
};

// How the bf16 / fp16 kernel rounds the operands it computes (the state S0, X, T, Vnew) for
// the tensor cores.
//   split (default): every computed operand hi + lo where it enters a product, P included
//     (the kernel header; 72 wgmma a warpgroup per chunk at K 128; the CPU model
//     is reference::emulate_operands(split_all)): bf16 o more accurate than fla's, and within
//     the calibrated budget of the plain fp32 emulation (docs/budgets.md).
//   single: each computed operand rounded once to the input dtype, as fla's kernels do
//     (32 wgmma, 20 of them on the state's chain instead of 44): faster. Its error is that of
//     reference::emulate_operands(single) (the CPU model, model.chunked.single): larger than the
//     split design's on o, of the order of fla's, and hT keeps about fla's precision where
//     split keeps the state to about 16 bits. It does not fit the plain fp32 emulation's
//     budget, so its conformance budget takes that model as the baseline (the oracle's
//     BudgetOptions::baseline; the chunked testbed). Measured accuracy and speed against split
//     and fla: reports/. Named, not the default: the default keeps the state to about 16 bits.
//     No debug mode (the trace follows the split design); fp32 inputs have no tensor-core
//     operands and take split only.
enum class ChunkedRounding { split, single };

// How the launch is scheduled.
//   automatic (default): the faster of the two where both run. For now two_pass everywhere: the
//     fused forward's producer takes longer per chunk than the state warpgroups (measured:
//     reports/results/h100/fused_forward), so fused is named, not chosen.
//   two_pass: the prepass kernel writes each (chunk, value head)'s record (T, P, the gate
//     scalars, P lo: 34 KB at bf16; single rounding writes 17.5 KB of it, no T lo and no P lo)
//     to the workspace, and the state kernel reads it back.
//   fused: one state kernel whose third warpgroup computes each chunk's record in shared memory
//     while the other two run the chunk before it (chunked_wgmma_transposed.cuh): no prepass and
//     no records in the workspace. The same records bit for bit, so the same outputs as
//     two_pass. Runs bf16 inputs with K > 64 (padded to 128) at value tile 128, unsplit, without
//     debug or two V tiles; elsewhere fused is rejected (ProblemError naming "schedule").
enum class ChunkedSchedule { automatic, two_pass, fused };

struct ChunkedOptions {
  // Columns of V per block: 0 picks from the batch shape (see chunked_value_tile); else 16, 32,
  // 64 or 128 (bf16, fp16 at K <= 64), 16 to 64 (fp16 at K > 64) or 16, 32 (fp32), dividing V.
  // Changes the speed, never the bits.
  int value_tile = 0;
  const ChunkedDebug* debug = nullptr;
  // Device workspace of the prepass (the per-chunk T, P and gate scalars the state kernel
  // reads): at least chunked_workspace_bytes(problem, resolved split) bytes (the one-argument
  // overload: the default options' size), 16-byte aligned, used by this
  // launch until its kernels finish (stream order) and not by another launch meanwhile. Null:
  // each launch allocates it on its stream with cudaMallocAsync and frees it with cudaFreeAsync
  // (stream-ordered, no host synchronisation, capturable in a CUDA graph).
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  // Sequence split (bf16 / fp16 inputs), for batches whose sequences x heads cannot fill the
  // GPU (one long sequence, few heads): every sequence is cut into segments of split_chunks
  // chunks that run in parallel, with the exact state fix-up of docs/semantics.md §4's chunk recurrence (a
  // segment's end state is affine in its start state, S_end = M S_start + B: one pass computes
  // [M | B] per segment, a small kernel chains them, a second pass computes o from each
  // segment's true start state). Costs about (2 K + V) / V times the state work of the unsplit
  // kernel, so it only pays where most SMs would idle.
  //   0: off.
  //   > 0: segments of that many chunks. A sequence's bits then depend on it and split_chunks
  //        alone (batch invariant and deterministic for a fixed value); they differ from the
  //        unsplit bits within the budget (the products of M are rounded differently).
  //   kChunkedSplitAuto: chosen with the V tile from the batch shape (chunked_plan); fastest,
  //        but whether and where a sequence is cut then depends on the rest of the batch, so
  //        this mode is not batch invariant.
  //   kChunkedSplitByHeads (default): chosen from the problem's heads and V alone
  //        (chunked_split_by_heads): segments of 32 chunks where one sequence's blocks at the
  //        narrowest V tile fill at most half of a 132-SM GPU, else none (so none for
  //        Qwen3-Next's H 16 HV 32). Nothing of the batch enters, so it is batch invariant and
  //        deterministic like a fixed value. It is for few-head models (H 2 HV 8, one long
  //        sequence), where the unsplit kernel leaves most SMs idle. A sequence of at most 32
  //        chunks is one segment and has no affine pass. The default because long single
  //        sequences should be fast without a flag, and this is the batch-invariant way.
  // fp32 inputs: 0 only (the fp32 kernel has no split; kChunkedSplitAuto and
  // kChunkedSplitByHeads mean 0 there).
  int split_chunks = kChunkedSplitByHeads;
  // Two V tiles (bf16 / fp16, unsplit, no debug): where a batch's longest sequences set its time
  // (their chain of chunks) while the rest fill the GPU, the sequences of more than
  // long_above_chunks chunks run at a narrower V tile (more blocks, each a shorter chain) beside
  // the others at a wider one: one prepass, then two output launches on two streams (the long
  // sequences' first, at the higher priority), joined again on the caller's stream. The V tile
  // changes no bit, so neither does this: batch invariant and deterministic either way.
  //   -1: never, one V tile for every sequence;
  //   0 (default): chunked_plan decides from the batch shape (with value_tile 0 and a resolved
  //        split of 0 only); it takes two tiles where its model saves 10 % (the model's
  //        error);
  //   > 0: this tile for the sequences of more than long_above_chunks chunks, the automatic or
  //        the given value_tile for the others (needs a resolved split of 0: set split_chunks
  //        = 0 where kChunkedSplitByHeads would split).
  // On by default: the GPU suite and the forced invariance test pass with it, and the
  // benchmark's varlen pack runs faster with it than with one tile (reports/).
  int long_value_tile = 0;
  std::int64_t long_above_chunks = 0;
  ChunkedRounding rounding = ChunkedRounding::split;
  ChunkedSchedule schedule = ChunkedSchedule::automatic;
};

// kChunkedSplitByHeads resolved: 32 chunks for bf16 / fp16 when HV x V / 16 (one sequence's
// blocks at the narrowest V tile) is at most 66, half of a 132-SM H100 / H200, else 0. The
// split's affine pass about doubles the state work, so it pays only where most SMs would idle;
// the bound is a constant so that no bit depends on the device. 32 chunks was the fastest
// segment length measured at H 2 HV 8 (64 blocks), one 32768-token sequence (the benchmark's
// lowpar shape; numbers in reports/). Host-side, no CUDA call.
int chunked_split_by_heads(const Problem& problem);
// ChunkedOptions::split_chunks with kChunkedSplitByHeads resolved (chunked_split_by_heads); any
// other value as given (kChunkedSplitAuto stays: chunked_plan resolves it with the V tile). The
// one place the launcher, its checks and the tests turn the option into a split. Host-side.
int chunked_fixed_split(const Problem& problem, int split_chunks);

// What a launch runs: the V tile and the resolved sequence split (0 = none), with the number of
// units (segments, or sequences when not split) and the cost model's estimate in units of one
// block's fixed per-chunk work (see chunked_value_tile).
struct ChunkedPlan {
  int value_tile = 0;
  int split_chunks = 0;
  std::int64_t segments = 0;
  double cost = 0;
  // Two V tiles (ChunkedOptions::long_value_tile): 0 when one tile serves every sequence; else
  // the tile of the sequences of more than long_above_chunks chunks (value_tile: the others').
  int long_value_tile = 0;
  std::int64_t long_above_chunks = 0;
  // The fused forward (ChunkedSchedule): resolved from options.schedule and the plan above.
  bool fused = false;
};
// Resolves options.value_tile (0: automatic), options.split_chunks (kChunkedSplitAuto: the
// cheaper of no split and segments of 4 to 128 chunks by the cost model) and
// options.long_value_tile (0: two tiles where the cost model says they save 10 %) for
// `multiprocessors` SMs. Host-side, no CUDA call; the options must be valid
// (validate_chunked_prefill).
ChunkedPlan chunked_plan(const Problem& problem, const ChunkedOptions& options, int multiprocessors);

// Whether the chunked kernel supports the (valid) problem; fills *why when not.
bool chunked_prefill_supports(const Problem& problem, std::string* why = nullptr);

// The host-side checks alone (no CUDA call): what chunked_prefill runs first.
void validate_chunked_prefill(const Problem& problem, const DeviceTensors& tensors,
                              const ChunkedOptions& options = {});

// The forward over a packed varlen batch: o, and hT when has_hT.
void chunked_prefill(const Problem& problem, const DeviceTensors& tensors, cudaStream_t stream,
                     const ChunkedOptions& options = {});

// The V tile the default picks for `multiprocessors` SMs, from the candidates that divide V:
// the one that minimises max(longest sequence's chunks, all block-chunks / resident blocks) x
// (fixed per-chunk work + BV); resident blocks are two per SM for the instances built for two
// (chunked_blocks_per_sm).
int chunked_value_tile(const Problem& problem, int multiprocessors);

// Bytes of the workspace a launch for `problem` needs (ChunkedOptions::workspace): the chunk
// offsets ((N + 1) int64, padded to 256 bytes), then one record per (chunk, value head) of
// 3 x 64 x 64 elements of the input dtype + 6 x 64 fp32 (2 x 64 x 64 for fp32 inputs), then
// (N + 1) int64 padded to 256 bytes for the ranks of two V tiles' long sequences; plus what the
// overload below adds for the split ChunkedOptions{} resolves to (chunked_fixed_split). Enough
// for the default options, and for any whose resolved split is 0 or that one.
std::size_t chunked_workspace_bytes(const Problem& problem);
// With the sequence split of split_chunks > 0 chunks (a resolved value, see chunked_plan): also
// the segment offsets (in place of the ranks) and one K x (K + V) fp32 affine map per (segment,
// value head).
std::size_t chunked_workspace_bytes(const Problem& problem, int split_chunks);
// Segments of the batch with that split: the sum over sequences of max(1, ceil(chunks / split)).
std::int64_t chunked_segments(const Problem& problem, int split_chunks);

// Blocks of the state kernel one SM holds for (problem's input dtype and K, value tile): 1, or
// 2 where shared memory and registers allow (bf16/fp16, K <= 64, tile 16); 0 when there is no
// such instance. Host-side, no CUDA call.
int chunked_blocks_per_sm(const Problem& problem, int value_tile);

// First chunk index of each sequence and the total (the debug buffers' leading extent).
std::int64_t chunked_chunk_offsets(const Problem& problem, std::vector<std::int64_t>* offsets);

// Floating-point operations of the chunked form, for throughput counters: the matrix products
// per value head (KK^T, QK^T: 2 C K each; K S0, Q S0, K^T Vnew: 2 K V each; T X, P Vnew: 2 C V
// each, per token), 4 C (K + V) + 6 K V per token per value head at full chunks of C = 64:
// 163840 at K = V = 128. The 16x16 inverse and merges are not counted.
double chunked_flops(const Problem& problem);

// Minimal bytes one launch must move (inputs read once, outputs written once).
double chunked_min_bytes(const Problem& problem);

}  // namespace gdn::cuda
