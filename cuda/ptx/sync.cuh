#pragma once
// Shared-memory addresses, named barriers, proxy fences and the shared-memory atomic of the
// kernels (sm_90a). Every wrapper is one PTX instruction with a "memory" clobber, so the compiler
// neither moves memory accesses across it nor drops it; the contract of each is the PTX ISA's,
// restated where a caller relies on it.
namespace gdn::cuda::ptx {

// The 32-bit shared-window address of a generic pointer into this block's shared memory, as the
// shared-state-space operands of the PTX instructions below and in the other ptx/ headers take it.
__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Named barrier `id` (1 to 15: 0 is __syncthreads) over kThreads threads (a multiple of 32):
// bar.sync waits for all of them and orders their shared-memory accesses as __syncthreads does;
// bar.arrive counts the caller's warp without waiting (a producer signalling consumers that sync
// on the same id). The id is an immediate (kId) where the caller knows it, a register otherwise.
template <int kThreads>
__device__ __forceinline__ void bar_sync(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}
template <int kId, int kThreads>
__device__ __forceinline__ void bar_sync() {
  asm volatile("bar.sync %0, %1;" ::"n"(kId), "n"(kThreads) : "memory");
}
template <int kId, int kThreads>
__device__ __forceinline__ void bar_arrive() {
  asm volatile("bar.arrive %0, %1;" ::"n"(kId), "n"(kThreads) : "memory");
}

// Warpgroup register reallocation (setmaxnreg; all 128 threads of the warpgroup execute it,
// sm_90a): dec gives the warpgroup's registers above kRegisters back to the block's pool, inc
// waits until the pool holds enough and takes them. ptxas allocates the code after it within
// that count; it needs the kernel's entry count, so the kernel has __launch_bounds__ with a
// minimum of blocks. kRegisters: a multiple of 8 in [24, 256].
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg's range");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg's range");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

// Orders this thread's earlier generic-proxy accesses to shared memory before its later
// async-proxy ones: a bulk or tensor copy that overwrites what the thread wrote or read, or a
// wgmma that reads what it stored. A barrier must still follow where other threads' accesses
// are to be ordered.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// Atomically adds 1 to the shared-memory counter *p and returns its value before, with
// acquire-release semantics at block scope: the caller's earlier accesses happen before those
// of any thread that later reads the incremented value through the same kind of atomic.
__device__ __forceinline__ unsigned atomic_inc_acq_rel_block(unsigned* p) {
  unsigned before;
  asm volatile("atom.acq_rel.cta.shared::cta.add.u32 %0, [%1], 1;" : "=r"(before) : "r"(smem_address(p)) : "memory");
  return before;
}

// The global timer (%globaltimer), in nanoseconds: wall-clock time, comparable across SMs but
// updated far less often than the SM clock; for waiting a given time, not for timing instructions.
__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

}  // namespace gdn::cuda::ptx
