#pragma once
// Ampere-style asynchronous copies (cp.async, global -> shared, 16 bytes per thread) and their
// groups. Contract (PTX ISA): a thread's copies since its last commit form one group; after
// cp_async_wait_group<N>() all but its newest N groups have landed in shared memory, after
// cp_async_wait_all() all of them. The wait covers only the calling thread's copies: a barrier
// must follow before other threads read the data.
#include <cstdint>

#include "cuda/ptx/sync.cuh"

namespace gdn::cuda::ptx {

// 16 bytes from src (16-byte aligned, global) to dst (16-byte aligned, shared); with valid false
// nothing is read and dst is zero-filled (src must still be a valid address expression).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const unsigned d = smem_address(dst);
  const int bytes = valid ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait_group() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

}  // namespace gdn::cuda::ptx
