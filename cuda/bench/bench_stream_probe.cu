// A probe of the streamed decode kernel's data movement without its math, for
// cuda_bench_decode: the same persistent grid (one block per SM), the same producer warp
// streaming each item's state into a ring of shared-memory stages with bulk async copies, the
// same consumer warps copying their V-tile slice (4 column lanes x 16 rows per lane, K = V = 128)
// into registers and releasing the stage at once; then, instead of the recurrence, the slice is
// written back to the item's slot. What it answers: how much of the copy bandwidth this way of
// moving the state can reach at all, so that the decode kernel's fraction of copy can be read
// against it (a kernel bound by its loads' depth, by its write pattern, or by its math).
//   write_mode 0: no write (loads only; traffic counted = reads)
//   write_mode 1: each lane stores its slice (the decode kernel's direct write-back)
//   write_mode 2: each consumer warp copies a contiguous 1/consumers of the stage to the slot
//                 (full-line stores), releasing the stage after its copy
// Not a kernel of the product: it computes nothing and lives only in the benchmark binary.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/decode/decode_stream_kernel.cuh"

namespace gdn::cuda::bench {

namespace {

constexpr int kProbeConsumers = 8;  // V tiles of 16 columns at V = 128
constexpr int kProbeRowsPerLane = 16;

__global__ void __launch_bounds__((kProbeConsumers + 1) * 32, 1)
    stream_probe_kernel(float* cache, std::int64_t items, int state_floats, int stages, int write_mode) {
  using namespace gdn::cuda::detail;
  extern __shared__ __align__(128) unsigned char smem[];
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(smem);
  std::uint64_t* empty = full + kStreamMaxStages;
  float* ring = reinterpret_cast<float*>(smem + kStreamHeaderBytes);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const unsigned state_bytes = unsigned(state_floats) * 4u;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      ptx::bulk::barrier_init(&full[s], 1);
      ptx::bulk::barrier_init(&empty[s], kProbeConsumers);
    }
    ptx::bulk::fence_barrier_init();
  }
  __syncthreads();
  if (warp == kProbeConsumers) {
    if (lane == 0) {
      int i = 0;
      for (std::int64_t item = blockIdx.x; item < items; item += gridDim.x, ++i) {
        const int s = i % stages;
        if (i >= stages) ptx::bulk::wait(&empty[s], unsigned((i / stages) - 1) & 1u);
        ptx::bulk::arrive_expect_tx(&full[s], state_bytes);
        ptx::bulk::bulk_load(ring + std::int64_t(s) * state_floats, cache + item * state_floats, state_bytes, &full[s]);
      }
    }
    return;
  }
  // The decode tile's lane mapping at 4 column lanes: row group rg = lane / 4 (8 of them), column
  // group cg = lane % 4; rows 4 (rg + 8 m) + e, columns 16 warp + 4 cg .. + 3; row length 128.
  const int rg = lane / 4, cg = lane % 4;
  const int v0 = 16 * warp + 4 * cg;
  int i = 0;
  for (std::int64_t item = blockIdx.x; item < items; item += gridDim.x, ++i) {
    const int s = i % stages;
    ptx::bulk::wait(&full[s], unsigned(i / stages) & 1u);
    const float* stage = ring + std::int64_t(s) * state_floats;
    float* slot = cache + item * state_floats;
    if (write_mode == 2) {
      const float4* from = reinterpret_cast<const float4*>(stage);
      float4* to = reinterpret_cast<float4*>(slot);
      for (int x = warp * 32 + lane; x < state_floats / 4; x += kProbeConsumers * 32) to[x] = from[x];
      __syncwarp();
      if (lane == 0) ptx::bulk::arrive(&empty[s]);
      continue;
    }
    float4 st[kProbeRowsPerLane];
#pragma unroll
    for (int m = 0; m < kProbeRowsPerLane / 4; ++m)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        st[4 * m + e] = *reinterpret_cast<const float4*>(stage + (4 * (rg + 8 * m) + e) * 128 + v0);
    __syncwarp();
    if (lane == 0) ptx::bulk::arrive(&empty[s]);
    if (write_mode == 1) {
#pragma unroll
      for (int m = 0; m < kProbeRowsPerLane / 4; ++m)
#pragma unroll
        for (int e = 0; e < 4; ++e) *reinterpret_cast<float4*>(slot + (4 * (rg + 8 * m) + e) * 128 + v0) = st[4 * m + e];
    } else {
      // Keep the loads live without writing: a sum no lane can predict, stored only if absurd.
      float sum = 0.f;
#pragma unroll
      for (int r = 0; r < kProbeRowsPerLane; ++r) sum += st[r].x + st[r].y + st[r].z + st[r].w;
      if (sum == 1.2345e-30f) slot[lane] = sum;
    }
  }
}

}  // namespace

// Moves `items` states of 128 x 128 fp32 (64 KiB) stored back to back in `cache` through the
// probe (see the header); returns the launch's error code. Grid: one block per SM.
cudaError_t launch_stream_probe(float* cache, std::int64_t items, int write_mode, int multiprocessors,
                                cudaStream_t stream) {
  using namespace gdn::cuda::detail;
  constexpr int state_floats = 128 * 128;
  constexpr int stages = int(kStreamSmemBudget / (state_floats * 4));
  const std::size_t smem = kStreamHeaderBytes + std::size_t(stages) * state_floats * 4;
  static const cudaError_t attribute =
      cudaFuncSetAttribute(stream_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (attribute != cudaSuccess) return attribute;
  const unsigned blocks = unsigned(items < multiprocessors ? items : multiprocessors);
  stream_probe_kernel<<<blocks, (kProbeConsumers + 1) * 32, smem, stream>>>(cache, items, state_floats, stages,
                                                                              write_mode);
  return cudaGetLastError();
}

}  // namespace gdn::cuda::bench
