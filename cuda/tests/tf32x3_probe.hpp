#pragma once
// A device probe of cuda/backward/tf32x3.cuh for the GPU suite (tf32x3_test.cpp): one block of 8
// warps computes a 64 x 128 product with the chunked backward's warp tiling (row tile warp % 4,
// four column tiles from 64 (warp / 4)), operands in global memory.
#include <vector>

namespace gdn::cuda::testbed {

// C = A B in 3xTF32, K = depth (a multiple of 8, at most 128), every matrix row-major with
// leading dimension 132: A [64][132], C [64][132]; B is read either as B [depth][132] (row-major)
// or as the column-major view of Bt [128][132] (B[k][n] = Bt[n][k]), the two ways the kernel
// reads its B operands. Returns C, or throws gdn::cuda::CudaError on a CUDA error.
std::vector<float> tf32x3_probe_product(const std::vector<float>& A, const std::vector<float>& B, int depth,
                                        bool b_column_major);

}  // namespace gdn::cuda::testbed
