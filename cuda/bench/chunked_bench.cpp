// Chunked prefill benchmark on the peer shapes (those cuda/peers/fla_chunk.py times): bf16
// q/k/v (fp16 in the _f16 rows), fp32 g/beta, K = V = 128, in-kernel l2norm, dense fp32 h0 read and hT written.
// CUDA-event time of one chunked_prefill call (its kernels: offsets, prepass, [affine pass,
// combine,] output pass) per iteration (host-side checks included, as in the recurrent
// benchmarks), median-friendly repetitions via Google Benchmark's manual time. Counters:
// tokens/s, TFLOP/s (chunked_flops: 4 C (K + V) + 6 K V per token per value head) and its
// fraction_of_flop_ceiling (bench::flop_ceiling, tensor core), minimal bytes over time (GBps)
// and its fraction_of_copy (the device-to-device copy bandwidth measured by the same binary),
// the plan's V tile and split, and each kernel's time on its own (ms_offsets, ms_prepass,
// [ms_affine, ms_combine,] ms_forward: stage_times; --no-stage-times leaves them out).
// The prepass workspace is allocated once per benchmark and passed in
// (ChunkedOptions::workspace), as a serving framework would: the default pool's cudaMallocAsync
// would otherwise hand the memory back at every synchronisation and map it again in the timed
// call.
// Args: shape index (see bench::peer_shapes()), value tile (0: automatic), sequence split (0: off, -1:
// automatic, -2: by the heads, else chunks per segment; ChunkedOptions::split_chunks).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <vector>
#include <string>

#include "cuda/bench/bench_common.hpp"
#include "cuda/chunked/chunked_params.hpp"
#include "cuda/api/chunked_prefill.hpp"

#ifdef GDN_CHUNKED_PHASE_CLOCK
namespace gdn::cuda::detail {
cudaError_t chunked_phase_clock_bf16(long long* host);
cudaError_t chunked_fused_clock_bf16(long long* host);
}
#endif

namespace {

using namespace gdn;
using namespace gdn::cuda;

using bench::PeerShape;
using bench::peer_problem;
using bench::peer_shapes;

// Each kernel of one call on its own: the call captured into a graph (one stream's capture is a
// chain: chunk offsets, prepass, [affine pass, combine,] state kernel), then every kernel node
// replayed alone in a one-node graph with the same arguments, kStageReps times between the held
// events, mean per launch (a replay's launch overhead included: a few microseconds). What the
// end-to-end time splits into, shape by shape: the prepass's share decides where work pays.
// Replays rewrite the workspace and the outputs with what the call wrote (the combine's
// in-place chain excepted: its replays chain already-chained maps, the same work on other
// values); nothing after them reads those. Any CUDA failure leaves the counters out and says
// why on stderr: the row's end-to-end time stands either way.
// The flag --no-stage-times leaves them out (and the captures and replays with them).
constexpr int kStageReps = 10;
bool no_stage_times = false;

std::vector<std::pair<std::string, double>> stage_times(const Problem& p, const DeviceTensors& t,
                                                        const ChunkedOptions& options, cudaStream_t stream) {
  std::vector<std::pair<std::string, double>> times;
  cudaGraph_t graph = nullptr;
  auto failed = [&](const char* what, cudaError_t code) {
    std::fprintf(stderr, "stage times: %s: %s (counters left out)\n", what, cudaGetErrorString(code));
    cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    times.clear();
    return times;
  };
  cudaError_t code = cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed);
  if (code != cudaSuccess) return failed("cudaStreamBeginCapture", code);
  try {
    chunked_prefill(p, t, stream, options);
  } catch (const std::exception& e) {
    cudaStreamEndCapture(stream, &graph);
    std::fprintf(stderr, "stage times: capture: %s\n", e.what());
    return failed("chunked_prefill under capture", cudaErrorUnknown);
  }
  code = cudaStreamEndCapture(stream, &graph);
  if (code != cudaSuccess) return failed("cudaStreamEndCapture", code);
  std::size_t count = 0;
  if ((code = cudaGraphGetNodes(graph, nullptr, &count)) != cudaSuccess) return failed("cudaGraphGetNodes", code);
  std::vector<cudaGraphNode_t> nodes(count);
  if ((code = cudaGraphGetNodes(graph, nodes.data(), &count)) != cudaSuccess) return failed("cudaGraphGetNodes", code);
  // The kernels in dependency order (a chain, or with two V tiles the two output passes after
  // the prepass, side by side).
  std::vector<std::size_t> waiting(count, 0);
  for (std::size_t i = 0; i < count; ++i)
    if ((code = cudaGraphNodeGetDependencies(nodes[i], nullptr, nullptr, &waiting[i])) != cudaSuccess)
      return failed("cudaGraphNodeGetDependencies", code);
  std::vector<cudaKernelNodeParams> kernels;
  std::vector<std::string> names;
  std::vector<bool> done(count, false);
  for (std::size_t placed = 0; placed < count; ++placed) {
    std::size_t i = 0;
    while (i < count && (done[i] || waiting[i] != 0)) ++i;
    if (i == count) return failed("the captured call has a cycle", cudaErrorUnknown);
    done[i] = true;
    cudaGraphNodeType type;
    if ((code = cudaGraphNodeGetType(nodes[i], &type)) != cudaSuccess) return failed("cudaGraphNodeGetType", code);
    if (type == cudaGraphNodeTypeKernel) {
      cudaKernelNodeParams params{};
      if ((code = cudaGraphKernelNodeGetParams(nodes[i], &params)) != cudaSuccess)
        return failed("cudaGraphKernelNodeGetParams", code);
      kernels.push_back(params);
    }
    std::size_t next = 0;
    if ((code = cudaGraphNodeGetDependentNodes(nodes[i], nullptr, nullptr, &next)) != cudaSuccess)
      return failed("cudaGraphNodeGetDependentNodes", code);
    std::vector<cudaGraphNode_t> following(next);
    if (next > 0 && (code = cudaGraphNodeGetDependentNodes(nodes[i], following.data(), nullptr, &next)) != cudaSuccess)
      return failed("cudaGraphNodeGetDependentNodes", code);
    for (cudaGraphNode_t f : following)
      for (std::size_t j = 0; j < count; ++j)
        if (nodes[j] == f) --waiting[j];
  }
  if (kernels.size() == 2) names = {"offsets", "forward"};  // the fused forward
  if (kernels.size() == 3) names = {"offsets", "prepass", "forward"};
  if (kernels.size() == 5) names = {"offsets", "prepass", "affine", "combine", "forward"};
  if (kernels.size() == 4) {
    // Two V tiles: name the output passes by the sequences they serve (the kernel's only
    // argument is its ChunkedParams).
    names = {"offsets", "prepass", "", ""};
    for (std::size_t k = 2; k < 4; ++k)
      names[k] = static_cast<const detail::ChunkedParams*>(kernels[k].kernelParams[0])->served == 1 ? "forward_long"
                                                                                                     : "forward";
  }
  bench::EventTimer timer(stream);
  for (std::size_t k = 0; k < kernels.size(); ++k) {
    // The kernel's argument pointers belong to `graph`, which lives until the end: the new node
    // copies the arguments they point to.
    cudaGraph_t single = nullptr;
    cudaGraphExec_t exec = nullptr;
    cudaGraphNode_t added = nullptr;
    if ((code = cudaGraphCreate(&single, 0)) != cudaSuccess) return failed("cudaGraphCreate", code);
    code = cudaGraphAddKernelNode(&added, single, nullptr, 0, &kernels[k]);
    if (code == cudaSuccess) code = cudaGraphInstantiate(&exec, single, 0);
    if (code == cudaSuccess) code = cudaGraphLaunch(exec, stream);  // warm-up
    if (code == cudaSuccess) code = cudaStreamSynchronize(stream);
    double seconds = 0;
    if (code == cudaSuccess) {
      timer.start();
      for (int rep = 0; rep < kStageReps && code == cudaSuccess; ++rep) code = cudaGraphLaunch(exec, stream);
      seconds = timer.stop();
    }
    if (exec) cudaGraphExecDestroy(exec);
    cudaGraphDestroy(single);
    if (code != cudaSuccess) return failed("replaying a kernel node", code);
    times.emplace_back(k < names.size() ? names[k] : "kernel" + std::to_string(k), seconds / kStageReps);
  }
  cudaGraphDestroy(graph);
  return times;
}

void run_chunked(benchmark::State& state, ChunkedOptions options, DType dtype = DType::bf16);

// One V tile (long_value_tile -1) and the given tile and split (0: unsplit, -1 automatic, -2 by
// the heads): what each configuration is worth.
void BM_chunked(benchmark::State& state) {
  ChunkedOptions options;
  options.value_tile = static_cast<int>(state.range(1));
  options.split_chunks = static_cast<int>(state.range(2));
  options.long_value_tile = -1;
  run_chunked(state, options);
}

// ChunkedOptions{} untouched: what a caller gets (the split by the heads, two V tiles where the
// plan takes them). The speed report quotes these rows as ours.
void BM_chunked_default(benchmark::State& state) { run_chunked(state, ChunkedOptions{}); }
// The same shapes with fp16 q, k, v (fp16 has its own instances: V tiles up to 64 at K 128, Vnew
// split in P Vnew, the state update's exponent), default and single rounding.
void BM_chunked_f16_default(benchmark::State& state) { run_chunked(state, ChunkedOptions{}, DType::f16); }
void BM_chunked_f16_single(benchmark::State& state) {
  ChunkedOptions options;
  options.rounding = ChunkedRounding::single;
  run_chunked(state, options, DType::f16);
}

// ChunkedRounding::single (every computed operand rounded once, as fla's kernels do), else the
// defaults: the speed report quotes these rows as the single mode beside the default rows.
void BM_chunked_single(benchmark::State& state) {
  ChunkedOptions options;
  options.rounding = ChunkedRounding::single;
  run_chunked(state, options);
}
// The defaults and single rounding with ChunkedSchedule::fused where it runs (bf16 at value tile
// 128, unsplit: shapes 0, 2 and 5), beside the default rows (the prepass and the state kernel):
// what fusing is worth, in the same run.
ChunkedOptions fused_options(ChunkedRounding rounding) {
  ChunkedOptions options;
  options.rounding = rounding;
  options.schedule = ChunkedSchedule::fused;
  options.value_tile = 128;
  options.split_chunks = 0;
  options.long_value_tile = -1;
  return options;
}
void BM_chunked_fused(benchmark::State& state) { run_chunked(state, fused_options(ChunkedRounding::split)); }
void BM_chunked_single_fused(benchmark::State& state) { run_chunked(state, fused_options(ChunkedRounding::single)); }
// Single rounding with a given tile and split (0: unsplit), one V tile: where its shorter
// chain moves the best configuration of the long sequences.
void BM_chunked_single_at(benchmark::State& state) {
  ChunkedOptions options;
  options.rounding = ChunkedRounding::single;
  options.value_tile = static_cast<int>(state.range(1));
  options.split_chunks = static_cast<int>(state.range(2));
  options.long_value_tile = -1;
  run_chunked(state, options);
}

// Two V tiles, unsplit: long_value_tile 0 (the plan's choice) or forced with long_above and the
// value tile of the others (0: automatic).
void BM_chunked_two_tiles(benchmark::State& state) {
  ChunkedOptions options;
  options.split_chunks = 0;
  options.long_value_tile = static_cast<int>(state.range(1));
  options.long_above_chunks = state.range(2);
  options.value_tile = static_cast<int>(state.range(3));
  run_chunked(state, options);
}

void run_chunked(benchmark::State& state, ChunkedOptions options, DType dtype) {
  const PeerShape& shape = peer_shapes().at(static_cast<std::size_t>(state.range(0)));
  Problem p = peer_problem(shape);
  p.input_dtype = dtype;
  state.SetLabel(shape.name);
  // One shape's buffers at a time (the largest take gigabytes); rows of one shape are adjacent.
  static std::int64_t current = -1;
  static std::unique_ptr<bench::DeviceProblem> device;
  const std::int64_t key = state.range(0) * 8 + static_cast<std::int64_t>(dtype);
  if (current != key) {
    device.reset();
    device = std::make_unique<bench::DeviceProblem>(p, 7);
    current = key;
  }
  const DeviceTensors t = device->tensors();
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  int device_id = 0, sms = 0;
  check_cuda(cudaGetDevice(&device_id), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_id), "attribute");
  const ChunkedPlan plan = chunked_plan(p, options, sms);
  options.workspace_bytes = chunked_workspace_bytes(p, plan.split_chunks);
  check_cuda(cudaMalloc(&options.workspace, options.workspace_bytes), "cudaMalloc(workspace)");
  chunked_prefill(p, t, stream, options);  // warm-up
  check_cuda(cudaStreamSynchronize(stream), "warm-up");
  bench::EventTimer timer(stream);
  double total = 0;
  for (auto _ : state) {
    timer.start();
    chunked_prefill(p, t, stream, options);
    const double seconds = timer.stop();
    state.SetIterationTime(seconds);
    total += seconds;
  }
  const double per = total / double(std::max<std::int64_t>(state.iterations(), 1));
  state.counters["T"] = double(p.T);
  state.counters["ms"] = per * 1e3;
  state.counters["tokens_per_s"] = double(p.T) / per;
  state.counters["TFLOPs"] = chunked_flops(p) / per * 1e-12;
  if (const double ceiling = bench::flop_ceiling(bench::FlopUnit::tensor_core); ceiling > 0)
    state.counters["fraction_of_flop_ceiling"] = chunked_flops(p) / per / ceiling;
  state.counters["GBps"] = chunked_min_bytes(p) / per * 1e-9;
  state.counters["fraction_of_copy"] = chunked_min_bytes(p) / per / bench::copy_bandwidth();
  state.counters["value_tile"] = plan.value_tile;
  state.counters["split_chunks"] = plan.split_chunks;
  state.counters["long_value_tile"] = plan.long_value_tile;
  state.counters["long_above_chunks"] = double(plan.long_above_chunks);
  state.counters["model_cost"] = plan.cost;
  state.counters["workspace_MB"] = double(options.workspace_bytes) * 1e-6;
  state.counters["fused"] = plan.fused ? 1 : 0;
  if (!no_stage_times)
    for (const auto& [stage, seconds] : stage_times(p, t, options, stream)) state.counters["ms_" + stage] = seconds * 1e3;
#ifdef GDN_CHUNKED_PHASE_CLOCK
  // Profiling builds: block 0's phase stamps of the last call, mean cycles per phase over chunks
  // 4..min(chunks, 64) - 1 (the first chunks wait for cold loads), on stderr.
  {
    constexpr int chunks = 64, phases = 20;
    std::vector<long long> stamps(2 * chunks * phases);
    check_cuda(detail::chunked_phase_clock_bf16(stamps.data()), "phase clock");
    for (int group = 0; group < 2; ++group) {
      std::fprintf(stderr, "phase_clock %s tile %d group %d:", shape.name, plan.value_tile, group);
      double chunk_sum = 0;
      int used = 0;
      for (int c = 4; c + 1 < chunks; ++c) {
        const long long* a = &stamps[(group * chunks + c) * phases];
        const long long* b = &stamps[(group * chunks + c + 1) * phases];
        if (a[0] == 0 || b[0] == 0) break;
        chunk_sum += double(b[0] - a[0]);
        ++used;
      }
      for (int point = 1; point <= 18; ++point) {
        double sum = 0;
        for (int c = 4; c < 4 + used; ++c) {
          const long long* a = &stamps[(group * chunks + c) * phases];
          sum += double(a[point] - a[point - 1]);
        }
        std::fprintf(stderr, " %d:%.0f", point, used ? sum / used : 0.0);
      }
      std::fprintf(stderr, " chunk:%.0f (%d chunks)\n", used ? chunk_sum / used : 0.0, used);
    }
  }
  if (plan.fused) {
    // The fused forward's block 0: mean cycles of each step over chunks 4 .. 62, producer
    // (0 -> 8 wait, 8 -> 9 zero, 9 -> 1 .. 6 -> 7 prepare_chunk's phases, 7 -> 10 hand-over)
    // and first consumer (11 -> 12 Q K V, 12 -> 13 record, 13 -> 14 the chunk), and periods.
    constexpr int chunks = 64, points = 16;
    std::vector<long long> st(chunks * points);
    check_cuda(detail::chunked_fused_clock_bf16(st.data()), "fused clock");
    const int steps[][2] = {{0, 8}, {8, 9}, {9, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}, {5, 6}, {6, 7}, {7, 10},
                            {11, 12}, {12, 13}, {13, 14}};
    std::fprintf(stderr, "fused_clock %s rounding %d:", shape.name, int(options.rounding));
    int used = 0;
    for (int c = 4; c + 1 < chunks && st[(c + 1) * points] != 0; ++c) ++used;
    for (const auto& step : steps) {
      double sum = 0;
      for (int c = 4; c < 4 + used; ++c) sum += double(st[c * points + step[1]] - st[c * points + step[0]]);
      std::fprintf(stderr, " %d-%d:%.0f", step[0], step[1], used ? sum / used : 0.0);
    }
    double producer = 0, consumer = 0;
    for (int c = 4; c < 4 + used; ++c) {
      producer += double(st[(c + 1) * points] - st[c * points]);
      consumer += double(st[(c + 1) * points + 11] - st[c * points + 11]);
    }
    std::fprintf(stderr, " producer_period:%.0f consumer_period:%.0f (%d chunks)\n", used ? producer / used : 0.0,
                 used ? consumer / used : 0.0, used);
  }
#endif
  cudaFree(options.workspace);
  cudaStreamDestroy(stream);
}

void arguments(benchmark::internal::Benchmark* b) {
  b->ArgNames({"shape", "value_tile", "split"});
  // Each shape with the automatic V tile (no split: the default, batch invariant), then (same
  // buffers) a sweep of other tiles on the Qwen3-Next, low-parallelism and varlen shapes (what
  // the automatic choice is worth), then the automatic sequence split and fixed splits on the
  // shapes with few or uneven chains (what the split's cost model is worth).
  const std::map<std::int64_t, std::vector<int>> sweep{{0, {64, 32}}, {1, {16, 64}}, {3, {32}}, {4, {128, 64}}};
  const std::map<std::int64_t, std::vector<std::vector<int>>> splits{
      {1, {{0, -1}, {128, 128}}},
      {3, {{0, -1}, {0, -2}, {128, 16}, {128, 64}}},
      {4, {{0, -1}, {128, 32}}},
      {6, {{0, -1}, {0, -2}}}};
  for (std::size_t i = 0; i < peer_shapes().size(); ++i) {
    b->Args({std::int64_t(i), 0, 0});
    const auto it = sweep.find(std::int64_t(i));
    if (it != sweep.end())
      for (int tile : it->second) b->Args({std::int64_t(i), tile, 0});
    const auto sp = splits.find(std::int64_t(i));
    if (sp != splits.end())
      for (const auto& ts : sp->second) b->Args({std::int64_t(i), ts[0], ts[1]});
  }
}

// One row per peer shape, timed by CUDA events.
void every_shape(benchmark::internal::Benchmark* b) {
  b->ArgNames({"shape"})
      ->DenseRange(0, static_cast<int>(peer_shapes().size()) - 1)
      ->UseManualTime()
      ->MinTime(0.2)
      ->Unit(benchmark::kMillisecond);
}

// The shapes whose default runs value tile 128 unsplit (K = V = 128, bf16): where the fused
// forward applies.
void fused_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"shape"})->Arg(0)->Arg(2)->Arg(5)->UseManualTime()->MinTime(0.2)->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK(BM_chunked_default)->Apply(every_shape);
BENCHMARK(BM_chunked_single)->Apply(every_shape);
BENCHMARK(BM_chunked_fused)->Apply(fused_shapes);
BENCHMARK(BM_chunked_single_fused)->Apply(fused_shapes);
BENCHMARK(BM_chunked_f16_default)->Apply(every_shape);
BENCHMARK(BM_chunked_f16_single)->Apply(every_shape);
// 1 x 32768 (shape 1) and H2 HV8 1 x 32768 (shape 3) at other tiles and splits.
BENCHMARK(BM_chunked_single_at)
    ->ArgNames({"shape", "value_tile", "split"})
    ->Args({1, 16, 0})
    ->Args({1, 64, 0})
    ->Args({1, 128, 128})
    ->Args({3, 16, 0})
    ->Args({3, 32, 0})
    ->Args({3, 128, 16})
    ->Args({3, 128, 64})
    ->UseManualTime()
    ->MinTime(0.2)
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_chunked)->Apply(arguments)->UseManualTime()->MinTime(0.2)->Unit(benchmark::kMillisecond);
// Two V tiles on the varlen pack (lengths 1 to 8192; 4000 is 63 chunks, 3000 47, 2048 32): the
// plan's choice (BV 64 above 63 chunks beside BV 128), then other splits of the pack, against
// BM_chunked's one-tile rows of the same shape in the same run.
BENCHMARK(BM_chunked_two_tiles)
    ->ArgNames({"shape", "long_value_tile", "long_above", "value_tile"})
    ->Args({4, 0, 0, 0})
    ->Args({4, 32, 63, 128})
    ->Args({4, 64, 46, 128})
    ->Args({4, 64, 31, 128})
    ->Args({4, 32, 46, 64})
    ->UseManualTime()
    ->MinTime(0.2)
    ->Unit(benchmark::kMillisecond);
GDN_BENCHMARK_MAIN(gdn::cuda::bench::FlopUnit::tensor_core,
                   {{"--no-stage-times", "leave out each kernel's own time (ms_<stage> counters)", &no_stage_times}})
