#include "cuda/tests/tf32x3_probe.hpp"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

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

void check(cudaError_t code, const char* what) {
  if (code != cudaSuccess) throw std::runtime_error(std::string("tf32x3 probe: ") + what + ": " + cudaGetErrorString(code));
}

}  // namespace

std::vector<float> tf32x3_probe_product(const std::vector<float>& A, const std::vector<float>& B, int depth,
                                        bool b_column_major) {
  if (depth % 8 != 0 || depth <= 0 || depth > 128) throw std::invalid_argument("tf32x3 probe: depth");
  if (A.size() != 64u * kLd || B.size() != 128u * kLd) throw std::invalid_argument("tf32x3 probe: sizes");
  float *a = nullptr, *b = nullptr, *c = nullptr;
  check(cudaMalloc(&a, A.size() * sizeof(float)), "cudaMalloc");
  check(cudaMalloc(&b, B.size() * sizeof(float)), "cudaMalloc");
  check(cudaMalloc(&c, 64 * kLd * sizeof(float)), "cudaMalloc");
  std::vector<float> out(64 * kLd);
  try {
    check(cudaMemcpy(a, A.data(), A.size() * sizeof(float), cudaMemcpyHostToDevice), "copy A");
    check(cudaMemcpy(b, B.data(), B.size() * sizeof(float), cudaMemcpyHostToDevice), "copy B");
    check(cudaMemset(c, 0, 64 * kLd * sizeof(float)), "memset C");
    if (b_column_major) probe<detail::tf32x3::ColMajor><<<1, 256>>>(a, b, c, depth);
    else probe<detail::tf32x3::RowMajor><<<1, 256>>>(a, b, c, depth);
    check(cudaGetLastError(), "launch");
    check(cudaMemcpy(out.data(), c, out.size() * sizeof(float), cudaMemcpyDeviceToHost), "copy C");
  } catch (...) {
    cudaFree(a), cudaFree(b), cudaFree(c);
    throw;
  }
  cudaFree(a), cudaFree(b), cudaFree(c);
  return out;
}

}  // namespace gdn::cuda::testbed
