#include "cuda/tests/tf32x3_probe.hpp"

#include <cuda_runtime.h>

#include <stdexcept>

#include "cuda/api/device_buffer.hpp"
#include "cuda/backward/tf32x3.cuh"

namespace gdn::cuda::testbed {
namespace {

constexpr int kLd = 132;

template <typename LB>
__global__ void probe(const float* A, const float* B, float* C, int depth) {
  namespace tc = detail::tf32x3;
  const int warp = threadIdx.x >> 5;
  const int r0 = 16 * (warp & 3), c0 = 64 * (warp >> 2);
  tc::Acc acc[4];
  tc::zero(acc);
  tc::product<4, tc::RowMajor, LB>(acc, A, kLd, B, kLd, r0, c0, depth);
  tc::store(C, kLd, r0, c0, acc);
}

}  // namespace

std::vector<float> tf32x3_probe_product(const std::vector<float>& A, const std::vector<float>& B, int depth,
                                        bool b_column_major) {
  if (depth % 8 != 0 || depth <= 0 || depth > 128) throw std::invalid_argument("tf32x3 probe: depth");
  if (A.size() != 64u * kLd || B.size() != 128u * kLd) throw std::invalid_argument("tf32x3 probe: sizes");
  DeviceBuffer<float> a(A), b(B), c(64 * kLd);
  c.fill_bytes(0);
  if (b_column_major) probe<detail::tf32x3::ColMajor><<<1, 256>>>(a.data(), b.data(), c.data(), depth);
  else probe<detail::tf32x3::RowMajor><<<1, 256>>>(a.data(), b.data(), c.data(), depth);
  check_cuda(cudaGetLastError(), "tf32x3 probe launch");
  return c.download();
}

}  // namespace gdn::cuda::testbed
