// The chunked kernels' f32 instances (see chunked_dispatch.cu and chunked_kernel.cuh).
#include "cuda/chunked/chunked_kernel.cuh"

namespace gdn::cuda::detail {

using Entry_f32 = chunked::Entry<float>;

cudaError_t configure_chunked_f32(int key_pad, int value_tile, bool* instantiated) {
  return Entry_f32::configure(key_pad, value_tile, instantiated);
}

cudaError_t enqueue_chunked_f32(int key_pad, int value_tile, const ChunkedParams& p, std::int64_t blocks,
                               std::int64_t prep_blocks, cudaStream_t stream, unsigned stages) {
  return Entry_f32::enqueue(key_pad, value_tile, p, blocks, prep_blocks, stream, stages);
}

std::size_t chunked_shared_bytes_f32(int key_pad, int value_tile) { return Entry_f32::shared_bytes(key_pad, value_tile); }

int chunked_blocks_per_sm_f32(int key_pad, int value_tile) { return Entry_f32::blocks_per_sm(key_pad, value_tile); }

std::size_t chunked_prepare_shared_bytes_f32(int key_pad) { return Entry_f32::prepare_shared_bytes(key_pad); }

}  // namespace gdn::cuda::detail
