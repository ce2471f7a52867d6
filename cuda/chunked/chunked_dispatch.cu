// Instances of the chunked kernels: bf16 and fp16 with K padded to 64 or 128 and value tiles of
// 16 to 128 columns (fp16 at K 128: up to 64, see for_instance); fp32 with value tiles of 16 and
// 32 (its fp32 operands need twice the shared memory). One translation unit per input type keeps
// rebuilds of one path short.
#include "cuda/chunked/chunked_params.hpp"

namespace gdn::cuda::detail {

#define GDN_CHUNKED_DECLARE(T)                                                                        \
  cudaError_t configure_chunked_##T(int key_pad, int value_tile, bool* instantiated);               \
  cudaError_t enqueue_chunked_##T(int key_pad, int value_tile, const ChunkedParams& p, std::int64_t blocks, \
                                  std::int64_t prep_blocks, cudaStream_t stream, unsigned stages);                     \
  std::size_t chunked_shared_bytes_##T(int key_pad, int value_tile);                                 \
  std::size_t chunked_prepare_shared_bytes_##T(int key_pad);                                          \
  int chunked_blocks_per_sm_##T(int key_pad, int value_tile);
GDN_CHUNKED_DECLARE(bf16)
GDN_CHUNKED_DECLARE(f16)
GDN_CHUNKED_DECLARE(f32)
#undef GDN_CHUNKED_DECLARE

std::size_t chunked_shared_bytes(ElementType input, int key_pad, int value_tile) {
  switch (input) {
    case ElementType::bf16: return chunked_shared_bytes_bf16(key_pad, value_tile);
    case ElementType::f16: return chunked_shared_bytes_f16(key_pad, value_tile);
    case ElementType::f32: return chunked_shared_bytes_f32(key_pad, value_tile);
  }
  return 0;
}

std::size_t chunked_prepare_shared_bytes(ElementType input, int key_pad) {
  switch (input) {
    case ElementType::bf16: return chunked_prepare_shared_bytes_bf16(key_pad);
    case ElementType::f16: return chunked_prepare_shared_bytes_f16(key_pad);
    case ElementType::f32: return chunked_prepare_shared_bytes_f32(key_pad);
  }
  return 0;
}

int chunked_instance_blocks_per_sm(ElementType input, int key_pad, int value_tile) {
  switch (input) {
    case ElementType::bf16: return chunked_blocks_per_sm_bf16(key_pad, value_tile);
    case ElementType::f16: return chunked_blocks_per_sm_f16(key_pad, value_tile);
    case ElementType::f32: return chunked_blocks_per_sm_f32(key_pad, value_tile);
  }
  return 0;
}

cudaError_t configure_chunked(ElementType input, int key_pad, int value_tile, bool* instantiated) {
  switch (input) {
    case ElementType::bf16: return configure_chunked_bf16(key_pad, value_tile, instantiated);
    case ElementType::f16: return configure_chunked_f16(key_pad, value_tile, instantiated);
    case ElementType::f32: return configure_chunked_f32(key_pad, value_tile, instantiated);
  }
  *instantiated = false;
  return cudaSuccess;
}

cudaError_t enqueue_chunked(ElementType input, int key_pad, int value_tile, const ChunkedParams& params,
                            std::int64_t blocks, std::int64_t prep_blocks, cudaStream_t stream, unsigned stages) {
  switch (input) {
    case ElementType::bf16: return enqueue_chunked_bf16(key_pad, value_tile, params, blocks, prep_blocks, stream, stages);
    case ElementType::f16: return enqueue_chunked_f16(key_pad, value_tile, params, blocks, prep_blocks, stream, stages);
    case ElementType::f32: return enqueue_chunked_f32(key_pad, value_tile, params, blocks, prep_blocks, stream, stages);
  }
  return cudaErrorInvalidValue;
}

}  // namespace gdn::cuda::detail
