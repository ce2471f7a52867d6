// Instantiations of the recurrent kernel for f32 inputs (one file per dtype: parallel builds).
#include "cuda/recurrent/recurrent_kernel.cuh"

namespace gdn::cuda::detail {

bool launch_recurrent_f32(int column_lanes, int rows_per_lane, const RecurrentParams& params,
                         cudaStream_t stream) {
  return launch_for_type<float>(column_lanes, rows_per_lane, params, stream);
}

}  // namespace gdn::cuda::detail
