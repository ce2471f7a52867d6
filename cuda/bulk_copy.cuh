#pragma once
// Hopper bulk asynchronous copies (cp.async.bulk, global -> shared) completing on shared-memory
// mbarriers as transaction bytes, and the barrier operations around them. Shared by the
// streamed decode kernel and the chunked prefill's forward.
#include <cstdint>

namespace gdn::cuda::detail::bulk {

__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
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
// The same with an L2 evict-first policy: a state is read once per launch.
__device__ __forceinline__ void bulk_load_evict_first(void* dst, const void* src, unsigned bytes, std::uint64_t* bar) {
  asm volatile(
      "{\n\t.reg .b64 policy;\n\t"
      "createpolicy.fractional.L2::evict_first.b64 policy, 1.0;\n\t"
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], policy;\n}" ::"r"(
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
// Orders this thread's earlier generic-proxy accesses to shared memory before later async-proxy
// ones (a bulk or tensor copy that overwrites what the thread wrote).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

}  // namespace gdn::cuda::detail::bulk
