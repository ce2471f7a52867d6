// Decode benchmark (§5): one token per request (Ts = 1) against a state cache, Qwen3-Next's
// linear-attention head shape: H = 16 query/key heads, HV = 32 value heads, K = V = 128,
// bf16 q/k/v, fp32 g and beta, in-kernel l2norm, fp32 state updated in place. The state is
// 2 MiB per request; traffic counted is state read + state written (q/k/v/o are < 0.2%).
// Each iteration is timed with CUDA events around one launch (mode "launch": decode() with its
// host-side checks), or around the replay of a CUDA graph holding the launch (mode "graph").
// held (1, every row but the latency rows): the stream is held until the launch is enqueued
// (bench::EventTimer), so the time is the device's alone, as in the peer's do_bench timing;
// held 0: the launch starts from an idle GPU and the time includes its host submission.
// Args: batch, column_lanes (0 = default tile), status (1: the graph-safe state-index check
// kernel runs first), graph (1: replay a captured graph), general (0: the default choice, the
// general kernel up to 4096 (request, head) items, the streamed one above where it applies;
// 1: force the general kernel; 2: force the streamed kernel; counter "streamed" says which ran), v_major (1: the
// [N, HV, V, K] state layout of FlashInfer and recent vLLM / SGLang, docs/semantics.md §1 and §7), wide (1:
// LaunchOptions::wide_stream_tile, same bits), held, runtime_sizes (1: the runtime-size instances
// of the default tile, LaunchOptions::runtime_size_kernels, same bits), narrow (0: automatic,
// 1: off, 2: on; LaunchOptions::narrow_tile, same bits).
#include <benchmark/benchmark.h>

#include <map>
#include <memory>

#include "cuda/bench/bench_common.hpp"

namespace gdn::cuda::bench {
cudaError_t launch_stream_probe(float* cache, std::int64_t items, int write_mode, int multiprocessors,
                                cudaStream_t stream);
}

namespace {

using namespace gdn;
using namespace gdn::cuda;

Problem decode_problem(int batch, bool v_major) {
  Problem p = Problem::fixed_length(batch, 1, 16, 32, 128, 128);
  p.state_layout = v_major ? StateLayout::v_major : StateLayout::k_major;
  p.input_dtype = DType::bf16;
  p.gate_dtype = DType::f32;
  p.use_qk_l2norm = true;
  p.state_slots = batch;
  p.has_h0 = true;
  p.has_hT = true;
  return p;
}

void BM_copy(benchmark::State& state) {
  const double bw = bench::copy_bandwidth();
  const double bytes = double(std::size_t(2) << 30) * 2.0;
  for (auto _ : state) state.SetIterationTime(bytes / bw);
  state.counters["copy_GBps"] = bw * 1e-9;
}

void BM_decode(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  LaunchOptions options;
  options.column_lanes = static_cast<int>(state.range(1));
  const bool with_status = state.range(2) != 0;
  const bool graph_mode = state.range(3) != 0;
  options.general_decode = state.range(4) == 1;
  options.streamed_decode = state.range(4) == 2;
  const bool v_major = state.range(5) != 0;
  options.wide_stream_tile = state.range(6) != 0;
  const bool held = state.range(7) != 0;
  options.runtime_size_kernels = state.range(8) != 0;
  options.narrow_tile = state.range(9) == 1   ? LaunchOptions::NarrowTile::off
                        : state.range(9) == 2 ? LaunchOptions::NarrowTile::on
                                              : LaunchOptions::NarrowTile::automatic;
  const Problem p = decode_problem(batch, v_major);
  // One device problem per (batch, layout) for the whole process (a 1024-request cache is
  // 2 GiB; all of them ~9 GiB); the state keeps evolving from launch to launch, which is what decode does.
  static std::map<std::pair<int, bool>, std::unique_ptr<bench::DeviceProblem>> devices;
  auto& device = devices[{batch, v_major}];
  if (!device) device = std::make_unique<bench::DeviceProblem>(p, 42);
  DeviceTensors t = device->tensors();
  DeviceBuffer<int> status(1);
  if (with_status) t.status = status.data();
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaGraphExec_t exec = nullptr;
  cudaGraph_t graph = nullptr;
  if (graph_mode) {
    check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "capture");
    decode(p, t, stream, options);
    check_cuda(cudaStreamEndCapture(stream, &graph), "capture");
    check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  }
  auto once = [&] {
    if (graph_mode) check_cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
    else decode(p, t, stream, options);
  };
  for (int i = 0; i < 3; ++i) once();  // warm-up
  check_cuda(cudaStreamSynchronize(stream), "warm-up");
  bench::EventTimer timer(stream, held);
  double total = 0;
  for (auto _ : state) {
    timer.start();
    once();
    const double seconds = timer.stop();
    state.SetIterationTime(seconds);
    total += seconds;
  }
  bench::report(state, total, state.iterations(), p, state_traffic_bytes(p));
  state.counters["batch"] = batch;
  state.counters["v_major"] = v_major ? 1 : 0;
  state.counters["wide"] = decode_uses_wide_stream_tile(p, options) ? 1 : 0;
  state.counters["streamed"] = decode_uses_stream_kernel(p, options) ? 1 : 0;
  state.counters["narrow"] = uses_narrow_tile(p, options, /*decode=*/true) ? 1 : 0;
  state.counters["token_kernel"] = decode_uses_token_kernel(p, options) ? 1 : 0;
  state.counters["held"] = held ? 1 : 0;
  state.counters["hold_timeouts"] = timer.hold_timeouts();
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// The streamed kernel's data movement without its math (bench_stream_probe.cu): items of 64 KiB
// (256 requests x 32 heads = 8192, 1024 requests = 32768), write_mode 0 loads only, 1 the decode
// kernel's per-lane write-back, 2 full-line copies out of the stage.
void BM_stream_probe(benchmark::State& state) {
  const std::int64_t items = state.range(0);
  const int write_mode = static_cast<int>(state.range(1));
  const std::size_t floats = std::size_t(items) * 128 * 128;
  static std::map<std::int64_t, std::unique_ptr<DeviceBuffer<float>>> caches;
  if (!caches[items]) {
    caches[items] = std::make_unique<DeviceBuffer<float>>(floats);
    caches[items]->fill_bytes(0);
  }
  float* cache = caches[items]->data();
  int device = 0, multiprocessors = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device), "SM count");
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  for (int i = 0; i < 3; ++i) check_cuda(bench::launch_stream_probe(cache, items, write_mode, multiprocessors, stream), "probe");
  check_cuda(cudaStreamSynchronize(stream), "warm-up");
  bench::EventTimer timer(stream);
  double total = 0;
  for (auto _ : state) {
    timer.start();
    check_cuda(bench::launch_stream_probe(cache, items, write_mode, multiprocessors, stream), "probe");
    const double seconds = timer.stop();
    state.SetIterationTime(seconds);
    total += seconds;
  }
  const double bytes = double(floats) * 4 * (write_mode == 0 ? 1 : 2);
  const double per_launch = total / double(state.iterations());
  state.counters["ms"] = per_launch * 1e3;
  state.counters["GBps"] = bytes / per_launch * 1e-9;
  state.counters["fraction_of_copy"] = bytes / per_launch / bench::copy_bandwidth();
  cudaStreamDestroy(stream);
}

}  // namespace

BENCHMARK(BM_stream_probe)
    ->ArgNames({"items", "write_mode"})
    ->ArgsProduct({{8192, 32768}, {0, 1, 2}})
    ->UseManualTime()
    ->MinTime(0.2);
BENCHMARK(BM_copy)->UseManualTime()->Iterations(1);
// The default tile at every batch, plain and with the status check, launch and graph modes,
// the streamed kernel and the general one.
BENCHMARK(BM_decode)
    ->ArgNames({"batch", "column_lanes", "status", "graph", "general", "v_major", "wide", "held", "runtime_sizes", "narrow"})
    ->ArgsProduct({{1, 64, 256, 1024}, {0}, {0, 1}, {0, 1}, {0, 1, 2}, {0}, {0}, {1}, {0}, {0}})
    ->UseManualTime()
    ->MinTime(0.2);
// The V-major layout at the default tile, streamed kernel, launch and graph modes.
BENCHMARK(BM_decode)
    ->ArgNames({"batch", "column_lanes", "status", "graph", "general", "v_major", "wide", "held", "runtime_sizes", "narrow"})
    ->ArgsProduct({{1, 64, 256, 1024}, {0}, {0}, {0, 1}, {0}, {1}, {0}, {1}, {0}, {0}})
    ->UseManualTime()
    ->MinTime(0.2);
// The streamed kernel's wide tile (K-major), launch and graph modes.
BENCHMARK(BM_decode)
    ->ArgNames({"batch", "column_lanes", "status", "graph", "general", "v_major", "wide", "held", "runtime_sizes", "narrow"})
    ->ArgsProduct({{1, 64, 256, 1024}, {0}, {0}, {0, 1}, {2}, {0}, {1}, {1}, {0}, {0}})
    ->UseManualTime()
    ->MinTime(0.2);
// Other tiles at the bandwidth-bound batches (tuning data; they change the bits).
BENCHMARK(BM_decode)
    ->ArgNames({"batch", "column_lanes", "status", "graph", "general", "v_major", "wide", "held", "runtime_sizes", "narrow"})
    ->ArgsProduct({{1, 256, 1024}, {2, 8}, {0}, {1}, {0}, {0}, {0}, {1}, {0}, {0}})
    ->UseManualTime()
    ->MinTime(0.2);
// The general kernel's runtime-size instance of the default tile (LaunchOptions::
// runtime_size_kernels, same bits) against its K = V = 128 one above (the streamed kernel has
// only runtime sizes).
BENCHMARK(BM_decode)
    ->ArgNames({"batch", "column_lanes", "status", "graph", "general", "v_major", "wide", "held", "runtime_sizes", "narrow"})
    ->ArgsProduct({{1, 64, 256, 1024}, {0}, {0}, {1}, {1}, {0}, {0}, {1}, {1}, {0}})
    ->UseManualTime()
    ->MinTime(0.2);
// Where the general and the streamed kernel cross over (graph mode, held).
BENCHMARK(BM_decode)
    ->ArgNames({"batch", "column_lanes", "status", "graph", "general", "v_major", "wide", "held", "runtime_sizes", "narrow"})
    ->ArgsProduct({{2, 8, 32, 128}, {0}, {0}, {1}, {1, 2}, {0}, {0}, {1}, {0}, {0}})
    ->UseManualTime()
    ->MinTime(0.2);
// The streamed kernel's fixed cost per launch (graph mode, held): batches around 256 and 512
// requests, some of whose (request, head) items divide evenly over the H200's 132 SMs
// (264 and 528 requests: 64 and 128 items per block) and some not (256: 62.06), to separate
// the round-robin tail from the launch and the pipeline's fill and drain.
BENCHMARK(BM_decode)
    ->ArgNames({"batch", "column_lanes", "status", "graph", "general", "v_major", "wide", "held", "runtime_sizes", "narrow"})
    ->ArgsProduct({{248, 264, 512, 528, 768}, {0}, {0}, {1}, {0}, {0}, {0}, {1}, {0}, {0}})
    ->UseManualTime()
    ->MinTime(0.2);
// The general kernel's narrow tile (same bits) against its standard tile where latency bounds
// it (graph mode, held; narrow 1 = off, 2 = on).
BENCHMARK(BM_decode)
    ->ArgNames({"batch", "column_lanes", "status", "graph", "general", "v_major", "wide", "held", "runtime_sizes", "narrow"})
    ->ArgsProduct({{1, 2, 4, 8, 16, 32, 64}, {0}, {0}, {1}, {1}, {0}, {0}, {1}, {0}, {1, 2}})
    ->UseManualTime()
    ->MinTime(0.2);
// Latency as a caller sees it: the default tile launched from an idle GPU (host submission,
// and in launch mode the host-side checks, included), with and without the status check.
BENCHMARK(BM_decode)
    ->ArgNames({"batch", "column_lanes", "status", "graph", "general", "v_major", "wide", "held", "runtime_sizes", "narrow"})
    ->ArgsProduct({{1, 64, 256, 1024}, {0}, {0, 1}, {0, 1}, {0}, {0}, {0}, {0}, {0}, {0}})
    ->UseManualTime()
    ->MinTime(0.2);

GDN_BENCHMARK_MAIN(gdn::cuda::bench::FlopUnit::fp32)
