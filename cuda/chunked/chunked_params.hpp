#pragma once
// Internal: what the chunked prefill's host side (chunked_launch.cpp) hands its kernel
// (chunked_kernel.cuh). Plain pointers and sizes, passed by value as the kernel's one parameter.
#include <cuda.h>  // CUtensorMap (a type only: nothing links the driver library)
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cuda/recurrent/recurrent_params.hpp"  // ElementType

namespace gdn::cuda::detail {

struct ChunkedParams {
  const void* q;
  const void* k;
  const void* v;
  const void* g;      // direct gates (or null)
  const void* beta;
  const void* a;      // fused gates (or null)
  const void* b;
  const float* A_log;
  const float* dt_bias;
  const float* h0;    // dense [N, HV, K, V] (or null)
  float* hT;          // dense [N, HV, K, V] (or null)
  const void* cu_seqlens;
  int cu_seqlens_64;
  void* o;

  int N, H, HV, K, V;
  int group;  // HV / H
  float scale;
  int has_h0, has_hT, l2norm, fused_gates, negative_eigenvalues;
  int gate_type;    // ElementType of g/beta or a/b
  int value_tiles;  // V / value tile
  int single_rounding;  // ChunkedRounding::single: the host launches the kSingle instances
  // The fused forward (ChunkedSchedule::fused; bf16, K padded to 128, value tile 128, unsplit,
  // no debug): no prepass, and no records in the workspace (only the chunk offsets).
  int fused;

  // Debug mode (all null when off): per-chunk intermediates, chunk index = chunk_offsets[n] + i.
  const std::int64_t* chunk_offsets;  // [N]
  float* debug_A;      // [chunks, HV, 64, 64]  (A and T: written by the prepass)
  float* debug_T;      // [chunks, HV, 64, 64]
  float* debug_Vnew;   // [chunks, HV, 64, V]
  float* debug_S0;     // [chunks, HV, K, V]
  float* debug_S_end;  // [chunks, HV, K, V]

  // Sequence split (bf16/fp16 only; split_chunks 0 = off): each sequence is cut into segments
  // of split_chunks chunks (at least one per sequence), run as independent units in two forward
  // passes around chunked_combine (chunked_kernel.cuh):
  //   pass 1 (the forward's affine instance, WgMode::affine): per (segment that is not its
  //           sequence's last, value head): the affine map of the
  //           segment, S_end = M S_start + B, as the K x (K + V) matrix [M | B] (M: transition
  //           tiles starting from the identity with v = 0; B: value tiles starting from 0, or
  //           from h0 for segment 0, whose B is then S_start of segment 1 as it is);
  //   combine: S_start(s + 1) = M_s S_start(s) + B_s in segment order, over B_s;
  //   pass 0: o (and hT from each sequence's last segment), each segment starting from h0 or
  //           from the combined B of the segment before it.
  int split_chunks;
  int affine_tiles;          // pass 1: transition tiles (ceil(K / value tile)) before the value tiles
  std::int64_t segments;     // host count: sum over sequences of max(1, ceil(chunks / split_chunks))
  std::int64_t* seg_offsets; // [N + 1] (workspace): first segment of each sequence, total at [N]
  float* ws_affine;          // [segments, HV, K, K + V] (workspace)

  // Two V tiles in one call (unsplit bf16/fp16 only; chunked_plan's long_value_tile): the
  // prepass once, then two output launches side by side on two streams, each serving part of
  // the batch. served 1: the sequences of more than served_above_chunks chunks, one unit per
  // such sequence (served_offsets[n]: how many of sequences 0..n-1 are, total at [N], written by
  // the offsets kernel, so that the launch has no block for the others); 2: the others (a block
  // of a long sequence returns at once); 0: every sequence. The V tile changes no bit, so
  // neither does the grouping.
  int served;
  std::int64_t served_above_chunks;
  std::int64_t* served_offsets;  // [N + 1] (workspace, where the split's seg_offsets would be)

  // Workspace of the prepass (chunked_prepare writes it, chunked_forward reads it).
  std::int64_t* ws_offsets;   // [N + 1]: first global chunk of each sequence (total at [N]), from cu_seqlens
  unsigned char* ws_records;  // [ws_chunks, HV] records of chunked_record_bytes each
  std::int64_t ws_chunks;     // chunks of the batch, counted on the host from the Problem

  // bf16/fp16 forward (chunked_forward_wg): tensor maps of q and k ([T, H, K] as a 3D tensor,
  // boxes of 64 tokens x 1 head x 64 of K, 128-byte swizzle) and v ([T, HV, V], boxes of 64
  // tokens x 1 head x min(value tile, 64), swizzle of the box's row), encoded by the launcher.
  // Unused (zero) for fp32. The kernel takes ChunkedParams as a __grid_constant__ parameter,
  // so the maps stay in parameter memory, where the tensor copies read them.
  CUtensorMap tmap_q;
  CUtensorMap tmap_k;
  CUtensorMap tmap_v;
#if GDN_KERNEL_FAULTS
  int planted_fault;  // cuda/faults/planted_faults.hpp (fault-campaign builds only)
#endif
};

constexpr int kChunkedThreads = 256;
constexpr int kChunkedChunk = 64;

// One prepass record per (chunk, value head): T hi, T lo (bf16/fp16 only), P as 64 x 64 tiles of
// the input dtype (rows of 64, unpadded), then 6 x 64 fp32 scalars (beta, r_q, r_k, e_start,
// e_end, then the chunk decay, for fp16 the state update's 2^-m, and zeros; fp16's e_end and
// decay are taken at 2^m: chunked_kernel.cuh, rescale_state_update), and for bf16/fp16 P lo, at the
// next 1024 bytes (a swizzled tile's alignment, so that the record is still one bulk copy into
// the forward's buffer). A multiple of 128 bytes.
constexpr std::size_t chunked_record_bytes(std::size_t element_size, bool split, bool p_lo) {
  const std::size_t tile = std::size_t(kChunkedChunk) * kChunkedChunk * element_size;
  const std::size_t scalars_end = (split ? 3 : 2) * tile + 6 * kChunkedChunk * 4;
  return p_lo ? (scalars_end + 1023) / 1024 * 1024 + tile : scalars_end;
}
constexpr std::size_t chunked_record_bytes(ElementType input) {
  return chunked_record_bytes(input == ElementType::f32 ? 4 : 2, input != ElementType::f32, input != ElementType::f32);
}
// Workspace offsets array: (N + 1) int64, padded to 256 bytes; the records follow.
constexpr std::size_t chunked_offsets_bytes(int N) { return (std::size_t(N + 1) * 8 + 255) / 256 * 256; }

// Hopper: 228 KB of shared memory per SM, 1 KB of it reserved per resident block, at most
// 227 KB per block. Blocks of a kernel one SM can hold by shared memory (1 or 2); the
// instances' __launch_bounds__ also weigh registers (chunked_kernel.cuh, Plan::min_blocks).
constexpr std::size_t kChunkedSmemPerSM = 228 * 1024;
constexpr std::size_t kChunkedSmemReservedPerBlock = 1024;
constexpr int chunked_blocks_per_sm(std::size_t dynamic_shared_bytes) {
  return 2 * (dynamic_shared_bytes + kChunkedSmemReservedPerBlock) <= kChunkedSmemPerSM ? 2 : 1;
}

// Raises the shared-memory limits of the kernels of one instance (input type, padded K, value
// tile) once per process; defined in chunked_dispatch.cu. *instantiated is false (and nothing is
// done) when that combination does not exist. No launch.
cudaError_t configure_chunked(ElementType input, int key_pad, int value_tile, bool* instantiated);
// Enqueues, on `stream`, what `stages` names of a configured instance: kChunkedPrepare, the
// offsets kernel (params.ws_offsets from cu_seqlens) and the prepass (prep_blocks = ws_chunks *
// HV blocks, none when 0); kChunkedForward, the forward (`blocks` blocks, with the split's
// affine pass and combine before it). Returns cudaGetLastError() after the launches.
constexpr unsigned kChunkedPrepare = 1, kChunkedForward = 2, kChunkedAllStages = 3;
cudaError_t enqueue_chunked(ElementType input, int key_pad, int value_tile, const ChunkedParams& params,
                            std::int64_t blocks, std::int64_t prep_blocks, cudaStream_t stream,
                            unsigned stages = kChunkedAllStages);
// Dynamic shared memory of the forward kernel of an instance (0 when not instantiated), and of
// the prepass of (input type, padded K), for tests, tuning notes and the V-tile choice.
std::size_t chunked_shared_bytes(ElementType input, int key_pad, int value_tile);
std::size_t chunked_prepare_shared_bytes(ElementType input, int key_pad);
// Resident blocks per SM the forward instance is built for (its __launch_bounds__; 0 when not
// instantiated): what the host's V-tile choice counts per wave.
int chunked_instance_blocks_per_sm(ElementType input, int key_pad, int value_tile);

}  // namespace gdn::cuda::detail
