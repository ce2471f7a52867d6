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

// Dynamic shared memory of the reverse-sweep kernel for `threads` threads.
std::size_t backward_sweep_shared_bytes(int threads);

}  // namespace gdn::cuda::detail
