// The chunked kernel's f32 instances (see chunked_dispatch.cu).
#include "cuda/chunked_kernel.cuh"

namespace gdn::cuda::detail {

cudaError_t launch_chunked_f32(int key_pad, int value_tile, const ChunkedParams& p, std::int64_t blocks,
                               cudaStream_t stream, bool* instantiated) {
  using E = float;
  *instantiated = true;
  if (key_pad == 64 && value_tile == 16) return chunked::launch_instance<E, 64, 16>(p, blocks, stream);
  if (key_pad == 64 && value_tile == 32) return chunked::launch_instance<E, 64, 32>(p, blocks, stream);
  if (key_pad == 128 && value_tile == 16) return chunked::launch_instance<E, 128, 16>(p, blocks, stream);
  if (key_pad == 128 && value_tile == 32) return chunked::launch_instance<E, 128, 32>(p, blocks, stream);
  *instantiated = false;
  return cudaSuccess;
}

std::size_t chunked_shared_bytes_f32(int key_pad, int value_tile) {
  using E = float;
  if (key_pad == 64 && value_tile == 16) return chunked::Plan<E, 64, 16>::bytes;
  if (key_pad == 64 && value_tile == 32) return chunked::Plan<E, 64, 32>::bytes;
  if (key_pad == 128 && value_tile == 16) return chunked::Plan<E, 128, 16>::bytes;
  if (key_pad == 128 && value_tile == 32) return chunked::Plan<E, 128, 32>::bytes;
  return 0;
}

}  // namespace gdn::cuda::detail
