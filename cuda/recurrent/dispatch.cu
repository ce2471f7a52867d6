// Dtype dispatch of the recurrent kernel and of the streamed decode kernel, and the state-index check kernel.
#include <cuda_runtime.h>

#include "cuda/recurrent/recurrent_params.hpp"

namespace gdn::cuda::detail {

bool launch_recurrent_f32(int, int, const RecurrentParams&, cudaStream_t);
bool launch_recurrent_bf16(int, int, const RecurrentParams&, cudaStream_t);
bool launch_recurrent_f16(int, int, const RecurrentParams&, cudaStream_t);

bool launch_decode_stream_f32(int, int, const RecurrentParams&, const StreamParams&, cudaStream_t);
bool launch_decode_stream_bf16(int, int, const RecurrentParams&, const StreamParams&, cudaStream_t);
bool launch_decode_stream_f16(int, int, const RecurrentParams&, const StreamParams&, cudaStream_t);

bool launch_decode_stream(ElementType input, int column_lanes, int rows_per_lane, const RecurrentParams& params,
                          const StreamParams& sp, cudaStream_t stream) {
  switch (input) {
    case ElementType::f32: return launch_decode_stream_f32(column_lanes, rows_per_lane, params, sp, stream);
    case ElementType::bf16: return launch_decode_stream_bf16(column_lanes, rows_per_lane, params, sp, stream);
    case ElementType::f16: return launch_decode_stream_f16(column_lanes, rows_per_lane, params, sp, stream);
  }
  return false;
}

bool launch_recurrent(ElementType input, int column_lanes, int rows_per_lane,
                      const RecurrentParams& params, cudaStream_t stream) {
  switch (input) {
    case ElementType::f32: return launch_recurrent_f32(column_lanes, rows_per_lane, params, stream);
    case ElementType::bf16: return launch_recurrent_bf16(column_lanes, rows_per_lane, params, stream);
    case ElementType::f16: return launch_recurrent_f16(column_lanes, rows_per_lane, params, stream);
  }
  return false;
}

namespace {

constexpr int kCheckThreads = 1024;

// One block: any index that is neither -1 nor in [0, slots) makes the whole launch an error.
__global__ void __launch_bounds__(kCheckThreads)
    check_indices_kernel(const std::int32_t* indices, int N, std::int64_t slots, int* status) {
  int bad = 0;
  for (int i = threadIdx.x; i < N; i += blockDim.x) {
    const std::int32_t s = indices[i];
    if (s != -1 && (s < 0 || s >= slots)) bad = 1;
  }
  bad = __syncthreads_or(bad);
  if (threadIdx.x == 0) *status = bad ? 1 : 0;
}

}  // namespace

void launch_check_indices(const std::int32_t* indices, int N, std::int64_t slots, int* status,
                          cudaStream_t stream) {
  check_indices_kernel<<<1, kCheckThreads, 0, stream>>>(indices, N, slots, status);
}

}  // namespace gdn::cuda::detail
