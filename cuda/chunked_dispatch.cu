// Instances of the chunked kernel: bf16 and fp16 with K padded to 64 or 128 and value tiles of
// 16 to 128 columns; fp32 with value tiles of 16 and 32 (its fp32 operands need twice the
// shared memory). One translation unit per input type keeps rebuilds of one path short.
#include "cuda/chunked_params.hpp"

namespace gdn::cuda::detail {

cudaError_t launch_chunked_bf16(int key_pad, int value_tile, const ChunkedParams& p, std::int64_t blocks,
                                cudaStream_t stream, bool* instantiated);
cudaError_t launch_chunked_f16(int key_pad, int value_tile, const ChunkedParams& p, std::int64_t blocks,
                               cudaStream_t stream, bool* instantiated);
cudaError_t launch_chunked_f32(int key_pad, int value_tile, const ChunkedParams& p, std::int64_t blocks,
                               cudaStream_t stream, bool* instantiated);

std::size_t chunked_shared_bytes_bf16(int key_pad, int value_tile);
std::size_t chunked_shared_bytes_f16(int key_pad, int value_tile);
std::size_t chunked_shared_bytes_f32(int key_pad, int value_tile);

std::size_t chunked_shared_bytes(ElementType input, int key_pad, int value_tile) {
  switch (input) {
    case ElementType::bf16: return chunked_shared_bytes_bf16(key_pad, value_tile);
    case ElementType::f16: return chunked_shared_bytes_f16(key_pad, value_tile);
    case ElementType::f32: return chunked_shared_bytes_f32(key_pad, value_tile);
  }
  return 0;
}

cudaError_t launch_chunked(ElementType input, int key_pad, int value_tile, const ChunkedParams& params,
                           std::int64_t blocks, cudaStream_t stream, bool* instantiated) {
  switch (input) {
    case ElementType::bf16: return launch_chunked_bf16(key_pad, value_tile, params, blocks, stream, instantiated);
    case ElementType::f16: return launch_chunked_f16(key_pad, value_tile, params, blocks, stream, instantiated);
    case ElementType::f32: return launch_chunked_f32(key_pad, value_tile, params, blocks, stream, instantiated);
  }
  *instantiated = false;
  return cudaSuccess;
}

}  // namespace gdn::cuda::detail
