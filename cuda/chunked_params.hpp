#pragma once
// Internal: what the chunked prefill's host side (chunked_launch.cpp) hands its kernel
// (chunked_kernel.cuh). Plain pointers and sizes, passed by value as the kernel's one parameter.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/recurrent_params.hpp"  // ElementType

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

  // Debug mode (all null when off): per-chunk intermediates, chunk index = chunk_offsets[n] + i.
  const std::int64_t* chunk_offsets;  // [N]
  float* debug_A;      // [chunks, HV, 64, 64]  (written by the first V tile)
  float* debug_T;      // [chunks, HV, 64, 64]
  float* debug_Vnew;   // [chunks, HV, 64, V]
  float* debug_S0;     // [chunks, HV, K, V]
  float* debug_S_end;  // [chunks, HV, K, V]
};

constexpr int kChunkedThreads = 256;
constexpr int kChunkedChunk = 64;

// Launches the chunked kernel instance for (input type, padded K, value tile); defined in
// chunked_dispatch.cu. *instantiated is false (and nothing is launched) when that combination
// does not exist; the return value is the error of raising the instance's shared-memory limit.
cudaError_t launch_chunked(ElementType input, int key_pad, int value_tile, const ChunkedParams& params,
                           std::int64_t blocks, cudaStream_t stream, bool* instantiated);
// Dynamic shared memory of an instance (0 when not instantiated), for tests and tuning notes.
std::size_t chunked_shared_bytes(ElementType input, int key_pad, int value_tile);

}  // namespace gdn::cuda::detail
