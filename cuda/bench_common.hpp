#pragma once
// Shared pieces of the CUDA benchmarks: device inputs for a problem, CUDA-event timing, and
// the device-to-device copy bandwidth the same binary measures (the ceiling that the decode's
// state traffic is compared with).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "core/problem.hpp"
#include "cuda/api.hpp"
#include "cuda/device_buffer.hpp"

namespace gdn::cuda::bench {

// All device buffers of one problem, filled from fuzz::make_inputs (bf16/f16 inputs converted
// exactly), outputs allocated; tensors() points at them.
class DeviceProblem {
 public:
  DeviceProblem(const Problem& problem, std::uint64_t seed);
  const DeviceTensors& tensors() const { return tensors_; }
  const Problem& problem() const { return problem_; }

 private:
  Problem problem_;
  std::vector<DeviceBuffer<unsigned char>> buffers_;
  std::vector<std::int32_t> host_indices_;
  std::vector<float> state_host_;
  DeviceTensors tensors_;
};

// Bytes read + written per second of a cudaMemcpyAsync device-to-device copy of `bytes`
// (median of several timed copies after a warm-up). Measured once per process and cached.
double copy_bandwidth(std::size_t bytes = std::size_t(2) << 30);

// Event pair on a stream: elapsed seconds of the work enqueued between start() and stop().
// Held (the default): start() first enqueues a kernel that spins until stop() has recorded the
// end event (bench_hold.cu), so the pair times the device work alone, as the peers' do_bench
// timings do (its cache flush keeps the GPU busy while Python enqueues). Not held: the work
// starts from an idle GPU and the pair includes the host's submission of it (for latency).
// GDN_BENCH_NO_HOLD set in the environment turns the hold off everywhere (for profilers, which
// serialise launches: a held stream would wait for the hold's timeout at every launch).
class EventTimer {
 public:
  explicit EventTimer(cudaStream_t stream, bool held = true);
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start();
  double stop();  // synchronises on the end event
  // Timed regions whose hold ran out before the host released it (their time then includes
  // host submission); a benchmark reports this so that such a row is not read as held.
  int hold_timeouts() const { return hold_timeouts_; }

 private:
  cudaStream_t stream_;
  cudaEvent_t begin_, end_;
  bool held_;
  int* flags_ = nullptr;  // mapped pinned: [0] release (host writes), [1] timed out (device writes)
  int hold_timeouts_ = 0;
};

cudaError_t launch_hold(const volatile int* release, int* timed_out, cudaStream_t stream);

// Sets the counters every benchmark reports from the total of the manual times.
void report(benchmark::State& state, double seconds, std::int64_t iterations, const Problem& problem,
            std::int64_t state_bytes);

}  // namespace gdn::cuda::bench

namespace gdn::cuda::bench {
// main() of the benchmark binaries: Google Benchmark's, plus the context keys device, commit
// and command (from GDN_DEVICE, GDN_COMMIT, GDN_COMMAND) in the JSON output, since this
// library version has no --benchmark_context flag.
int run_benchmarks(int argc, char** argv);
}  // namespace gdn::cuda::bench

#define GDN_BENCHMARK_MAIN() \
  int main(int argc, char** argv) { return gdn::cuda::bench::run_benchmarks(argc, argv); }
