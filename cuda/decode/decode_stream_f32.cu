// Instantiations of the streamed decode kernel for f32 inputs (one file per dtype: parallel builds).
#include "cuda/decode/decode_stream_kernel.cuh"

namespace gdn::cuda::detail {

bool launch_decode_stream_f32(int column_lanes, int rows_per_lane, const RecurrentParams& params,
                             const StreamParams& stream_params, cudaStream_t stream) {
  return launch_stream_for_type<float>(column_lanes, rows_per_lane, params, stream_params, stream);
}

}  // namespace gdn::cuda::detail
