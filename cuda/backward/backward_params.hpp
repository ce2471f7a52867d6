#pragma once
// Internal: what the host side (api/backward_launch.cpp) hands the backward's kernels
// (backward_kernel.cu). Plain pointers and sizes, passed by value.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace gdn::cuda::detail {

// The reverse sweep's tiling (backward_kernel.cu says why these values).
constexpr int kBackwardTileColumns = 16;    // V columns of the state per block
constexpr int kBackwardChunk = 8;           // tokens whose states a block holds in registers
constexpr int kBackwardSegment = 64;        // tokens between two checkpoints in the workspace
constexpr int kBackwardMaxThreads = 256;    // one thread per row of K, K <= 256

// The chunked backward's tiling (chunked_backward_kernel.cu says why these values).
constexpr int kChunkedBackwardChunk = 64;       // tokens per chunk (the chunked forward's C)
constexpr int kChunkedBackwardMaxK = 128;       // K <= 128: a chunk's q, k rows fit shared memory
constexpr int kChunkedBackwardStateColumns = 32;  // V columns per block of the chunk-to-chunk sweeps
constexpr int kChunkedBackwardThreads = 256;
constexpr int kChunkedBackwardScalars = 5;      // per chunk and value head: gamma, a, b, segment, beta

struct BackwardParams {
  // Forward inputs (dtypes: input_type for q, k, v, dO; gate_type for g, beta or a, b).
  const void* q;
  const void* k;
  const void* v;
  const void* g;
  const void* beta;
  const void* a;
  const void* b;
  const float* A_log;
  const float* dt_bias;
  const float* h0;   // dense [N, HV, K, V] (or V-major), or null (zero)
  const void* cu_seqlens;
  int cu_seqlens_64;  // 1: int64 boundaries, else int32
  // Cotangents.
  const void* dO;    // [T, HV, V] input_type
  const float* dhT;  // dense state shape, or null (zero)
  // Gradients.
  void* dq;          // [T, H, K] input_type
  void* dk;          // [T, H, K] input_type
  void* dv;          // [T, HV, V] input_type
  void* dg;          // [T, HV] gate_type (direct gates)
  void* dbeta;       // [T, HV] gate_type (direct gates)
  void* da;          // [T, HV] gate_type (fused gates)
  void* db;          // [T, HV] gate_type (fused gates)
  float* dA_log;     // [HV] (fused gates)
  float* dt_bias_grad;  // [HV] (fused gates): ddt_bias
  float* dh0;        // dense state shape (has_h0), or null
  // Workspace (floats), carved by the host (backward_launch.cpp, BackwardWorkspace).
  float* inv_norm_q;   // [T, H]: 1 / sqrt(|q|^2 + 1e-6), or 1 without l2norm
  float* inv_norm_k;   // [T, H]
  float* gate_g;       // [T, HV]: g in fp32 (given, or the fused gates' value)
  float* gate_beta;    // [T, HV]
  float* part_dq;      // [tiles, T, HV, K]: per V tile, gradient w.r.t. scale q^ of one value head
  float* part_dk;      // [tiles, T, HV, K]
  float* part_dbeta;   // [tiles, T, HV]
  float* part_dg;      // [tiles, T, HV]
  float* total_dg;     // [T, HV]: dg summed over the tiles (fused gates: for the head sums)
  float* total_da;     // [T, HV]: da in fp32 (fused gates: for the head sums)
  float* checkpoints;  // [T / kBackwardSegment, HV, K, V]: states at segment starts (K-major)
  // The chunked backward's workspace (null for the sequential one). Chunks are numbered in
  // order of (sequence, chunk); a per-chunk tensor is [chunks, HV, ...] with C = 64 rows, rows
  // past the chunk's length written as zeros.
  long long* chunk_begin;  // [max_chunks]: first token of the chunk
  int* chunk_length;       // [max_chunks]
  int* sequence_chunk;     // [N + 1]: first chunk of each sequence; [N] = the number of chunks
  int max_chunks;          // T / C + N: an upper bound of the number of chunks
  float* chunk_scalars;    // [chunks, HV, 5, C]: gamma, a, b, segment (as float), beta
  float* chunk_T;          // [chunks, HV, C, C]: (I + A)^-1
  float* chunk_P;          // [chunks, HV, C, C]: Mask . (Q K^T) . E
  float* chunk_W;          // [chunks, HV, C, K]
  float* chunk_U;          // [chunks, HV, C, V]
  float* chunk_Vnew;       // [chunks, HV, C, V]
  float* chunk_dVnew;      // [chunks, HV, C, V]
  float* chunk_S0;         // [chunks, HV, K, V]: the state at the chunk's start
  float* chunk_dS;         // [chunks, HV, K, V]: the gradient w.r.t. the state at its end
  std::int64_t T;
  int N, H, HV, K, V, group;
  int tiles;           // ceil(V / kBackwardTileColumns)
  int threads;         // 32 * ceil(K / 32)
  float scale;
  int l2norm;
  int fused_gates;
  int negative_eigenvalues;
  int v_major;         // state layout of h0, dhT, dh0
  int input_type;      // ElementType
  int gate_type;       // ElementType
};

// Launches the backward's kernels on `stream` (the host has validated everything).
void launch_backward_kernels(const BackwardParams& params, cudaStream_t stream);

// The chunked backward: the same prepare and finish kernels around four chunked stages
// (chunked_backward_kernel.cu), with tiles = 1.
void launch_chunked_backward_kernels(const BackwardParams& params, cudaStream_t stream);

// The prepare and finish kernels the two backwards share (backward_kernel.cu).
void launch_backward_prepare(const BackwardParams& params, cudaStream_t stream);
void launch_backward_finish(const BackwardParams& params, cudaStream_t stream);

// Dynamic shared memory of the reverse-sweep kernel for `threads` threads.
std::size_t backward_sweep_shared_bytes(int threads);

}  // namespace gdn::cuda::detail
