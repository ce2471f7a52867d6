#pragma once
// fp32 products on the tensor cores in 3xTF32 (docs/cuda_backward.md, "Tensor cores"): each fp32
// operand x is split into two TF32 terms, hi = rna(x) and lo = rna(x - hi) (x - hi is exact in
// fp32), and a product tile accumulates lo.hi + hi.lo + hi.hi in fp32 on the tensor cores (the
// lo.lo term, below 2^-22 of the product, is dropped). Its error is about fp32's, where TF32
// rounded once keeps about 2^-11 of each operand, too little for the gradient budget
// (experimental/backward_products_study; its findings are in docs/cuda_backward.md).
//
// Warp-level (nvcuda::wmma, m16n16k8, the tf32 shape): every lane of the warp calls each function
// together. Operand tiles are 16 x 8 (A) and 8 x 16 (B) at any leading dimension that is a
// multiple of 4 floats, from shared or global memory, 32-byte aligned. The split is elementwise,
// so it needs no knowledge of the fragments' (unspecified) element layout. Deterministic: the
// same tiles give the same bits.
#include <mma.h>

namespace gdn::cuda::detail::tf32x3 {

namespace wmma = nvcuda::wmma;
using RowMajor = wmma::row_major;
using ColMajor = wmma::col_major;

// A 16 x 16 fp32 accumulator tile.
using Acc = wmma::fragment<wmma::accumulator, 16, 16, 8, float>;

// An fp32 operand tile as its two TF32 terms.
template <typename Use, typename Layout>
struct Split {
  using Fragment = wmma::fragment<Use, 16, 16, 8, wmma::precision::tf32, Layout>;
  Fragment hi, lo;
  __device__ __forceinline__ void load(const float* p, unsigned ld) {
    wmma::load_matrix_sync(hi, p, ld);
#pragma unroll
    for (int t = 0; t < hi.num_elements; ++t) {
      const float x = hi.x[t];
      const float h = wmma::__float_to_tf32(x);
      hi.x[t] = h;
      lo.x[t] = wmma::__float_to_tf32(x - h);
    }
  }
};
template <typename Layout>
using SplitA = Split<wmma::matrix_a, Layout>;
template <typename Layout>
using SplitB = Split<wmma::matrix_b, Layout>;

// d += a b, the small terms first.
template <typename LA, typename LB>
__device__ __forceinline__ void mma(Acc& d, const SplitA<LA>& a, const SplitB<LB>& b) {
  wmma::mma_sync(d, a.lo, b.hi, d);
  wmma::mma_sync(d, a.hi, b.lo, d);
  wmma::mma_sync(d, a.hi, b.hi, d);
}

// Where the tile starting at (row, column) of a matrix with leading dimension ld lies.
template <typename Layout>
__device__ __forceinline__ const float* at(const float* m, unsigned ld, int row, int column);
template <>
__device__ __forceinline__ const float* at<RowMajor>(const float* m, unsigned ld, int row, int column) {
  return m + static_cast<long long>(row) * ld + column;
}
template <>
__device__ __forceinline__ const float* at<ColMajor>(const float* m, unsigned ld, int row, int column) {
  return m + static_cast<long long>(column) * ld + row;
}

// acc[n] += A[r0 .. r0 + 16, 0 .. k_end) B[0 .. k_end, c0 + 16 n .. + 16) for n < N, over k in
// steps of 8 in order (k_end a multiple of 8; A, B zero where the product must not reach).
// Each A tile is split once for the N products that share it.
template <int N, typename LA, typename LB>
__device__ __forceinline__ void product(Acc (&acc)[N], const float* A, unsigned lda, const float* B, unsigned ldb,
                                        int r0, int c0, int k_end) {
  for (int k = 0; k < k_end; k += 8) {
    SplitA<LA> a;
    a.load(at<LA>(A, lda, r0, k), lda);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      SplitB<LB> b;
      b.load(at<LB>(B, ldb, k, c0 + 16 * n), ldb);
      mma(acc[n], a, b);
    }
  }
}

template <int N>
__device__ __forceinline__ void zero(Acc (&acc)[N]) {
#pragma unroll
  for (int n = 0; n < N; ++n) wmma::fill_fragment(acc[n], 0.f);
}
template <int N>
__device__ __forceinline__ void load(Acc (&acc)[N], const float* m, unsigned ld, int r0, int c0) {
#pragma unroll
  for (int n = 0; n < N; ++n) wmma::load_matrix_sync(acc[n], m + r0 * ld + c0 + 16 * n, ld, wmma::mem_row_major);
}
template <int N>
__device__ __forceinline__ void store(float* m, unsigned ld, int r0, int c0, const Acc (&acc)[N]) {
#pragma unroll
  for (int n = 0; n < N; ++n) wmma::store_matrix_sync(m + r0 * ld + c0 + 16 * n, acc[n], ld, wmma::mem_row_major);
}
template <int N>
__device__ __forceinline__ void negate(Acc (&acc)[N]) {
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int t = 0; t < acc[n].num_elements; ++t) acc[n].x[t] = -acc[n].x[t];
}

}  // namespace gdn::cuda::detail::tf32x3
