#pragma once
// Hopper bulk asynchronous copies (cp.async.bulk, global -> shared) completing on shared-memory
// mbarriers as transaction bytes, and the barrier operations around them. Shared by the
// streamed decode kernel and the chunked prefill's forward.
// Contract (PTX ISA): a barrier is initialised by one thread, then fence_barrier_init() before
// any copy completes on it; a phase completes when its expected arrivals have arrived and the
// bytes announced by arrive_expect_tx have landed; wait(bar, parity) returns once the phase of
// that parity is complete, and the data of the copies that completed on it are then visible to
// the waiting thread. A thread whose earlier shared-memory accesses a copy overwrites orders
// them first with ptx::fence_proxy_async_shared() (cuda/ptx/sync.cuh).
#include <cstdint>

#include "cuda/ptx/sync.cuh"

namespace gdn::cuda::ptx::bulk {

__device__ __forceinline__ void barrier_init(std::uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bar)), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the async proxy (the bulk copies' completions).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void arrive(std::uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_address(bar)) : "memory");
}
__device__ __forceinline__ void arrive_expect_tx(std::uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void wait(std::uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n\t.reg .pred done;\n"
      "WAIT_LOOP:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
      "@!done bra WAIT_LOOP;\n}" ::"r"(smem_address(bar)),
      "r"(parity)
      : "memory");
}
// global -> shared bulk copy of `bytes` (multiple of 16, both addresses 16-byte aligned),
// completing on *bar as transaction bytes.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, std::uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_address(dst)),
               "l"(src), "r"(bytes), "r"(smem_address(bar))
               : "memory");
}

// global -> shared tensor copy of one box of a 3D tensor map (coordinates innermost first),
// completing on *bar as transaction bytes (the whole box: elements outside the tensor are
// written as zeros and counted). The map must live in kernel parameter, constant or global
// memory (a __grid_constant__ parameter here).
__device__ __forceinline__ void tensor_load_3d(void* dst, const void* map, int c0, int c1, int c2, std::uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(
          smem_address(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_address(bar))
      : "memory");
}

}  // namespace gdn::cuda::ptx::bulk
