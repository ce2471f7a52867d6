// Recurrent prefill benchmark: packed batches at Qwen3-Next's head shape (H = 16, HV = 32,
// K = V = 128), bf16 q/k/v, fp32 g and beta, in-kernel l2norm, dense fp32 h0 and hT. The
// recurrence is serial in t, so what matters is tokens/s at a given batch shape; the state
// traffic counter is reported for completeness (it is small here). CUDA-event time of one
// launch per iteration, host-side checks included.
// Args: sequences, tokens per sequence (0: the varlen mix below; -1: one 8192-token sequence, the
// others 256; -2: lengths spread from 64 to 4096), column_lanes (0: default), runtime_sizes, narrow.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <map>
#include <memory>

#include "cuda/bench/bench_common.hpp"

namespace {

using namespace gdn;
using namespace gdn::cuda;

Problem prefill_problem(int sequences, int length) {
  std::vector<std::int64_t> lengths;
  if (length > 0) {
    lengths.assign(static_cast<std::size_t>(sequences), length);
  } else if (length == -1) {
    // One long prompt among short ones: 8192 tokens, then 256 each.
    lengths.assign(static_cast<std::size_t>(sequences), 256);
    lengths[0] = 8192;
  } else if (length == -2) {
    // Lengths spread evenly from 64 to 4096.
    for (int n = 0; n < sequences; ++n) lengths.push_back(64 + (4096 - 64) * std::int64_t(n) / std::max(1, sequences - 1));
  } else {
    // A serving-like mix: short and long prompts, one empty.
    const std::int64_t mix[] = {4096, 17, 1000, 0, 2048, 333, 64, 1500};
    for (int n = 0; n < sequences; ++n) lengths.push_back(mix[n % 8]);
  }
  Problem p = Problem::packed(lengths, 16, 32, 128, 128);
  p.input_dtype = DType::bf16;
  p.gate_dtype = DType::f32;
  p.use_qk_l2norm = true;
  p.has_h0 = true;
  p.has_hT = true;
  return p;
}

void BM_prefill(benchmark::State& state) {
  const int sequences = static_cast<int>(state.range(0));
  const int length = static_cast<int>(state.range(1));
  LaunchOptions options;
  options.column_lanes = static_cast<int>(state.range(2));
  options.runtime_size_kernels = state.range(3) != 0;
  options.narrow_tile = state.range(4) == 1   ? LaunchOptions::NarrowTile::off
                        : state.range(4) == 2 ? LaunchOptions::NarrowTile::on
                                              : LaunchOptions::NarrowTile::automatic;
  const Problem p = prefill_problem(sequences, length);
  static std::map<std::pair<int, int>, std::unique_ptr<bench::DeviceProblem>> devices;
  auto& device = devices[{sequences, length}];
  if (!device) device = std::make_unique<bench::DeviceProblem>(p, 7);
  const DeviceTensors t = device->tensors();
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  recurrent_prefill(p, t, stream, options);  // warm-up
  check_cuda(cudaStreamSynchronize(stream), "warm-up");
  bench::EventTimer timer(stream);
  double total = 0;
  for (auto _ : state) {
    timer.start();
    recurrent_prefill(p, t, stream, options);
    const double seconds = timer.stop();
    state.SetIterationTime(seconds);
    total += seconds;
  }
  bench::report(state, total, state.iterations(), p, state_traffic_bytes(p));
  state.counters["T"] = double(p.T);
  state.counters["narrow"] = uses_narrow_tile(p, options, /*decode=*/false) ? 1 : 0;
  cudaStreamDestroy(stream);
}

}  // namespace

// {sequences, tokens per sequence}: one long sequence, a few, many short ones, a varlen mix;
// every shape with the default tile and with each instantiated column_lanes (2, 4, 8), so one
// run shows what the default leaves on the table.
// narrow: LaunchOptions::narrow_tile (0 automatic, 1 off, 2 on; same bits).
// runtime_sizes 1: LaunchOptions::runtime_size_kernels (the default tile's runtime-size
// instance instead of the K = V = 128 one; same bits).
BENCHMARK(BM_prefill)
    ->ArgNames({"sequences", "length", "column_lanes", "runtime_sizes", "narrow"})
    ->ArgsProduct({{1}, {8192}, {0}, {0, 1}, {0}})
    ->ArgsProduct({{4}, {4096}, {0}, {0, 1}, {0}})
    ->ArgsProduct({{16}, {1024}, {0}, {0, 1}, {0}})
    ->ArgsProduct({{64}, {256}, {0}, {0, 1}, {0}})
    ->ArgsProduct({{8}, {0}, {0}, {0, 1}, {0}})
    ->UseManualTime()
    ->MinTime(0.3);
BENCHMARK(BM_prefill)
    ->ArgNames({"sequences", "length", "column_lanes", "runtime_sizes", "narrow"})
    ->ArgsProduct({{1}, {8192}, {2, 8}, {0}, {0}})
    ->ArgsProduct({{4}, {4096}, {2, 8}, {0}, {0}})
    ->ArgsProduct({{16}, {1024}, {2, 8}, {0}, {0}})
    ->ArgsProduct({{64}, {256}, {2, 8}, {0}, {0}})
    ->ArgsProduct({{8}, {0}, {2, 8}, {0}, {0}})
    ->UseManualTime()
    ->MinTime(0.3);
// The narrow tile (same bits) off and on at every shape: where it pays beyond the automatic
// choice's small launches.
BENCHMARK(BM_prefill)
    ->ArgNames({"sequences", "length", "column_lanes", "runtime_sizes", "narrow"})
    ->ArgsProduct({{1}, {8192}, {0}, {0}, {1, 2}})
    ->ArgsProduct({{4}, {4096}, {0}, {0}, {1, 2}})
    ->ArgsProduct({{16}, {1024}, {0}, {0}, {1, 2}})
    ->ArgsProduct({{64}, {256}, {0}, {0}, {1, 2}})
    ->ArgsProduct({{8}, {0}, {0}, {0}, {1, 2}})
    ->UseManualTime()
    ->MinTime(0.3);
// Varlen packs, the narrow tile off and on: where the automatic rule should pick it beyond the
// small launches (one long sequence among short ones: the long one's chain sets the time).
BENCHMARK(BM_prefill)
    ->ArgNames({"sequences", "length", "column_lanes", "runtime_sizes", "narrow"})
    ->ArgsProduct({{16, 32, 64}, {0}, {0}, {0}, {1, 2}})
    ->ArgsProduct({{4, 16, 64}, {-1}, {0}, {0}, {1, 2}})
    ->ArgsProduct({{8, 32}, {-2}, {0}, {0}, {1, 2}})
    ->UseManualTime()
    ->MinTime(0.3);

GDN_BENCHMARK_MAIN(gdn::cuda::bench::FlopUnit::fp32)
