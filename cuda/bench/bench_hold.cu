// The stream hold of bench::EventTimer: a one-thread kernel that spins until the host sets a
// flag in mapped pinned memory, so that the timed launches are all enqueued behind it before
// the GPU reaches the start event (nvbench's "blocking kernel"). Without it a timed launch
// starts from an idle GPU and the event pair also measures the host's submission (the launch
// call, the host-side checks): microseconds that the kernel does not spend. A bound on the
// spin (globaltimer) keeps a host that never releases it from hanging the device; the kernel
// then reports the timeout so that the measurement can say it was not held.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/ptx/sync.cuh"

namespace gdn::cuda::bench {

namespace {

__global__ void hold_kernel(const volatile int* release, int* timed_out, unsigned long long timeout_ns) {
  const unsigned long long start = ptx::globaltimer();
  while (*release == 0) {
    if (ptx::globaltimer() - start > timeout_ns) {
      *timed_out = 1;
      return;
    }
    __nanosleep(500);
  }
}

}  // namespace

cudaError_t launch_hold(const volatile int* release, int* timed_out, cudaStream_t stream) {
  hold_kernel<<<1, 1, 0, stream>>>(release, timed_out, 200ull * 1000 * 1000);  // 200 ms
  return cudaGetLastError();
}

}  // namespace gdn::cuda::bench
