// Instantiations of the recurrent kernel for f16 inputs (one file per dtype: parallel builds).
#include "cuda/recurrent/recurrent_kernel.cuh"

namespace gdn::cuda::detail {

bool launch_recurrent_f16(int column_lanes, int rows_per_lane, const RecurrentParams& params,
                         cudaStream_t stream) {
  return launch_for_type<__half>(column_lanes, rows_per_lane, params, stream);
}

}  // namespace gdn::cuda::detail
