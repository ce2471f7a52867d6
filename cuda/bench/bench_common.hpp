#pragma once
// Shared pieces of the CUDA benchmarks: device inputs for a problem, CUDA-event timing, the
// two ceilings a kernel's speed is read against (the device-to-device copy bandwidth the same
// binary measures, and the card's FLOP ceiling from its SM count and clock), and main().
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "cuda/api/api.hpp"
#include "cuda/api/device_buffer.hpp"

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

// The named shapes the chunked prefill and the backward are benchmarked at, the ones
// cuda/peers/peer_common.py's SHAPES times for the peers (the first six; the seventh is ours
// only): bf16 q/k/v, fp32 g and beta, K = V = 128, in-kernel l2norm, dense fp32 h0 and hT.
struct PeerShape {
  const char* name;
  int H, HV;
  std::vector<std::int64_t> lengths;
};
const std::vector<PeerShape>& peer_shapes();
Problem peer_problem(const PeerShape& shape);

// Bytes read + written per second of a cudaMemcpyAsync device-to-device copy of `bytes`
// (median of several timed copies after a warm-up). Measured once per process and cached.
double copy_bandwidth(std::size_t bytes = std::size_t(2) << 30);

// The arithmetic a kernel's FLOP count is compared with: dense bf16 / fp16 tensor-core products
// with fp32 accumulation (the chunked kernel), or fp32 FMAs on the CUDA cores (the recurrent
// and decode kernels).
enum class FlopUnit { tensor_core, fp32 };
// FLOP per second of the device's peak for that unit: SM count x the SM clock's maximum
// (cudaDevAttrClockRate) x FLOP per clock per SM of the compute capability (sm_80: 2048 tensor,
// 128 fp32; sm_90: 4096 tensor (4 tensor cores x 512 dense bf16 FMA), 256 fp32 (128 lanes x FMA)).
// 0 where the compute capability is not in that table or no device is there. Read once per
// process. NVIDIA's datasheet tensor-core figures use a boost clock below the maximum the
// device reports, so this ceiling can be above theirs.
double flop_ceiling(FlopUnit unit);
// FLOP of one recurrent or decode launch, for the fraction of the fp32 ceiling: per token and
// value head 7 K V (the decay K V, k^T S 2 K V, the rank-one update 2 K V, q^T S 2 K V); the
// O(K + V) terms (norms, gates, the delta) are left out.
double recurrent_flops(const Problem& problem);

// Event pair on a stream: elapsed seconds of the work enqueued between start() and stop().
// Held (the default): start() first enqueues a kernel that spins until stop() has recorded the
// end event (bench_hold.cu), so the pair times the device work alone, as the peers' do_bench
// timings do (its cache flush keeps the GPU busy while Python enqueues). Not held: the work
// starts from an idle GPU and the pair includes the host's submission of it (for latency).
// The flag --no-hold turns the hold off everywhere (for profilers, which serialise launches: a
// held stream would wait for the hold's timeout at every launch).
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

// Sets the counters every recurrent and decode benchmark reports from the total of the manual
// times: ms, tokens_per_s, state_GBps and its fraction_of_copy, flop_per_second and its
// fraction_of_flop_ceiling (fp32; left out where the ceiling is unknown).
void report(benchmark::State& state, double seconds, std::int64_t iterations, const Problem& problem,
            std::int64_t state_bytes);

// A boolean flag of one benchmark binary, beside the common ones: `name` (with its dashes)
// sets *value to true when given.
struct Flag {
  const char* name;
  const char* help;
  bool* value;
};

// main() of the benchmark binaries: Google Benchmark's (its --benchmark_* flags), then these:
//   --no-hold            EventTimer never holds the stream (see there)
//   --context KEY=VALUE  KEY: VALUE in the JSON output's context (repeatable; also
//                        --context=KEY=VALUE; the value may hold commas, which
//                        --benchmark_context splits on): the device script records device,
//                        date, commit and command this way
// and the binary's own `flags`. Anything else is an error. --help lists them all. The context
// also gets the device (cuda_device, cuda_sms), the measured copy bandwidth
// (copy_bytes_per_second) and the FLOP ceiling of `unit` (flop_ceiling_per_second, with
// flop_ceiling_basis), which the speed report reads.
int run_benchmarks(int argc, char** argv, FlopUnit unit, std::vector<Flag> flags = {});

}  // namespace gdn::cuda::bench

#define GDN_BENCHMARK_MAIN(...) \
  int main(int argc, char** argv) { return gdn::cuda::bench::run_benchmarks(argc, argv, __VA_ARGS__); }
