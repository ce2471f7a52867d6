// The chunked kernels' bf16 instances (see chunked_dispatch.cu and chunked_kernel.cuh).
#include "cuda/chunked/chunked_kernel.cuh"

namespace gdn::cuda::detail {

using Entry_bf16 = chunked::Entry<__nv_bfloat16>;

cudaError_t configure_chunked_bf16(int key_pad, int value_tile, bool* instantiated) {
  return Entry_bf16::configure(key_pad, value_tile, instantiated);
}

cudaError_t enqueue_chunked_bf16(int key_pad, int value_tile, const ChunkedParams& p, std::int64_t blocks,
                               std::int64_t prep_blocks, cudaStream_t stream, unsigned stages) {
  return Entry_bf16::enqueue(key_pad, value_tile, p, blocks, prep_blocks, stream, stages);
}

std::size_t chunked_shared_bytes_bf16(int key_pad, int value_tile) { return Entry_bf16::shared_bytes(key_pad, value_tile); }

int chunked_blocks_per_sm_bf16(int key_pad, int value_tile) { return Entry_bf16::blocks_per_sm(key_pad, value_tile); }

std::size_t chunked_prepare_shared_bytes_bf16(int key_pad) { return Entry_bf16::prepare_shared_bytes(key_pad); }

}  // namespace gdn::cuda::detail

#ifdef GDN_CHUNKED_PHASE_CLOCK
namespace gdn::cuda::detail {
// The bf16 output pass's phase stamps of its last launch (chunked_wgmma.cuh): 2 warpgroups x
// kPhaseChunks chunks x kPhases points, clock64 values (0 where not reached).
cudaError_t chunked_phase_clock_bf16(long long* host) {
  return cudaMemcpyFromSymbol(host, chunked::phase_clock, sizeof(chunked::phase_clock));
}
// The fused forward's stamps of its last launch (chunked_wgmma_transposed.cuh): kPhaseChunks
// chunks x kFusedClockPoints points.
cudaError_t chunked_fused_clock_bf16(long long* host) {
  return cudaMemcpyFromSymbol(host, chunked::fused_clock, sizeof(chunked::fused_clock));
}
}  // namespace gdn::cuda::detail
#endif
