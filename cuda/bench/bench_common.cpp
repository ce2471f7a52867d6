#include "cuda/bench/bench_common.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "core/dtype_codec.hpp"
#include "fuzz/inputs.hpp"

namespace gdn::cuda::bench {

namespace {

bool hold_off = false;          // --no-hold
std::vector<Flag> binary_flags;  // the binary's own flags, for --help

}  // namespace

DeviceProblem::DeviceProblem(const Problem& problem, std::uint64_t seed) : problem_(problem) {
  // The generator draws states in double: for gigabyte-sized caches that takes longer than the
  // benchmark. Inputs come from it; states from a fast generator (uniform, scale 0.5: the same
  // magnitude), slots a seeded permutation.
  Problem light = problem;
  light.state_slots = 0;
  light.has_h0 = false;
  light.has_hT = false;
  light.store_intermediate_states = false;
  Inputs in = fuzz::make_inputs(light, fuzz::InputOptions{}, seed);
  if (problem.has_h0 || problem.uses_state_cache()) {
    in.h0 = HostTensor<double>();
    std::vector<float> state(static_cast<std::size_t>(shape_numel(problem.state_shape())));
    std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (float& s : state) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      s = (float(x >> 40) / float(1 << 24) - 0.5f);
    }
    state_host_ = std::move(state);
  }
  if (problem.uses_state_cache()) {
    in.state_indices.resize(static_cast<std::size_t>(problem.N()));
    std::vector<std::int32_t> slots(static_cast<std::size_t>(problem.state_slots));
    for (std::size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<std::int32_t>(i);
    std::mt19937_64 rng(seed);
    std::shuffle(slots.begin(), slots.end(), rng);
    for (int n = 0; n < problem.N(); ++n) in.state_indices[static_cast<std::size_t>(n)] = slots[static_cast<std::size_t>(n) % slots.size()];
  }
  buffers_.reserve(20);
  auto add = [&](const HostTensor<double>& t, DType dtype) -> void* {
    const std::vector<unsigned char> bytes = encode_tensor(t, dtype);
    buffers_.emplace_back(bytes.size());
    buffers_.back().upload(bytes);
    return buffers_.back().data();
  };
  auto output = [&](std::size_t bytes) -> void* {
    buffers_.emplace_back(bytes);
    buffers_.back().fill_bytes(0);
    return buffers_.back().data();
  };
  auto add_state = [&]() -> void* {
    buffers_.emplace_back(state_host_.size() * 4);
    check_cuda(cudaMemcpy(buffers_.back().data(), state_host_.data(), state_host_.size() * 4, cudaMemcpyHostToDevice),
               "cudaMemcpy state");
    return buffers_.back().data();
  };
  const DType dt = problem.input_dtype, gt = problem.gate_dtype;
  tensors_.q = add(in.q, dt);
  tensors_.k = add(in.k, dt);
  tensors_.v = add(in.v, dt);
  if (problem.gate_mode == GateMode::direct) {
    tensors_.g = add(in.g, gt);
    tensors_.beta = add(in.beta, gt);
  } else {
    tensors_.a = add(in.a, gt);
    tensors_.b = add(in.b, gt);
    tensors_.A_log = static_cast<const float*>(add(in.A_log, DType::f32));
    tensors_.dt_bias = static_cast<const float*>(add(in.dt_bias, DType::f32));
  }
  const std::size_t state_bytes = static_cast<std::size_t>(shape_numel(problem.state_shape())) * 4;
  if (problem.uses_state_cache()) {
    tensors_.state_cache = static_cast<float*>(add_state());
    host_indices_ = in.state_indices;
    buffers_.emplace_back(host_indices_.size() * 4);
    std::vector<unsigned char> raw(host_indices_.size() * 4);
    std::memcpy(raw.data(), host_indices_.data(), raw.size());
    buffers_.back().upload(raw);
    tensors_.state_indices = reinterpret_cast<const std::int32_t*>(buffers_.back().data());
  } else {
    if (problem.has_h0) tensors_.h0 = static_cast<const float*>(add_state());
    if (problem.has_hT) tensors_.hT = static_cast<float*>(output(state_bytes));
    std::vector<std::int32_t> cu(problem.cu_seqlens.begin(), problem.cu_seqlens.end());
    buffers_.emplace_back(cu.size() * 4);
    std::vector<unsigned char> raw(cu.size() * 4);
    std::memcpy(raw.data(), cu.data(), raw.size());
    buffers_.back().upload(raw);
    tensors_.cu_seqlens = buffers_.back().data();
  }
  tensors_.o = output(static_cast<std::size_t>(shape_numel(problem.v_shape())) * dtype_size(dt));
  if (problem.store_intermediate_states)
    tensors_.intermediate = static_cast<float*>(output(static_cast<std::size_t>(shape_numel(problem.intermediate_shape())) * 4));
  state_host_ = std::vector<float>();
}

EventTimer::EventTimer(cudaStream_t stream, bool held)
    : stream_(stream), held_(held && !hold_off) {
  check_cuda(cudaEventCreate(&begin_), "cudaEventCreate");
  check_cuda(cudaEventCreate(&end_), "cudaEventCreate");
  if (held_) {
    check_cuda(cudaHostAlloc(reinterpret_cast<void**>(&flags_), 2 * sizeof(int), cudaHostAllocMapped),
               "cudaHostAlloc(hold flags)");
    flags_[0] = flags_[1] = 0;
  }
}
EventTimer::~EventTimer() {
  cudaEventDestroy(begin_);
  cudaEventDestroy(end_);
  if (flags_ != nullptr) cudaFreeHost(flags_);
}
void EventTimer::start() {
  if (held_) {
    volatile int* flags = flags_;
    flags[0] = 0;
    flags[1] = 0;
    check_cuda(launch_hold(flags_, flags_ + 1, stream_), "hold kernel launch");
  }
  check_cuda(cudaEventRecord(begin_, stream_), "cudaEventRecord");
}
double EventTimer::stop() {
  check_cuda(cudaEventRecord(end_, stream_), "cudaEventRecord");
  if (held_) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    reinterpret_cast<volatile int*>(flags_)[0] = 1;
  }
  check_cuda(cudaEventSynchronize(end_), "cudaEventSynchronize");
  if (held_ && reinterpret_cast<volatile int*>(flags_)[1] != 0) ++hold_timeouts_;
  float ms = 0;
  check_cuda(cudaEventElapsedTime(&ms, begin_, end_), "cudaEventElapsedTime");
  return ms * 1e-3;
}

double copy_bandwidth(std::size_t bytes) {
  static double cached = 0;
  if (cached > 0) return cached;
  DeviceBuffer<unsigned char> src(bytes), dst(bytes);
  src.fill_bytes(1);
  dst.fill_bytes(0);
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  EventTimer timer(stream);
  std::vector<double> times;
  for (int i = 0; i < 12; ++i) {
    timer.start();
    check_cuda(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
    const double t = timer.stop();
    if (i >= 2) times.push_back(t);  // two warm-ups
  }
  cudaStreamDestroy(stream);
  std::sort(times.begin(), times.end());
  cached = 2.0 * double(bytes) / times[times.size() / 2];
  return cached;
}

double flop_ceiling(FlopUnit unit) {
  static double cached[2] = {-1, -1};  // per unit, measured once per process
  double& ceiling = cached[unit == FlopUnit::tensor_core ? 0 : 1];
  if (ceiling >= 0) return ceiling;
  ceiling = 0;
  int device = 0, sms = 0, clock_khz = 0, major = 0, minor = 0;
  if (!device_available() || cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  double per_clock = 0;  // FLOP per clock per SM
  if (major == 8 && minor == 0) per_clock = unit == FlopUnit::tensor_core ? 2048 : 128;
  if (major == 9 && minor == 0) per_clock = unit == FlopUnit::tensor_core ? 4096 : 256;
  ceiling = double(sms) * double(clock_khz) * 1e3 * per_clock;
  return ceiling;
}

double recurrent_flops(const Problem& problem) {
  return double(problem.T) * problem.HV * 7.0 * problem.K * problem.V;
}

void report(benchmark::State& state, double seconds, std::int64_t iterations, const Problem& problem,
            std::int64_t state_bytes) {
  if (iterations == 0 || seconds <= 0) return;
  const double per_launch = seconds / double(iterations);
  const double bandwidth = double(state_bytes) / per_launch;
  state.counters["ms"] = per_launch * 1e3;
  state.counters["state_GBps"] = bandwidth * 1e-9;
  state.counters["copy_GBps"] = copy_bandwidth() * 1e-9;
  state.counters["fraction_of_copy"] = bandwidth / copy_bandwidth();
  state.counters["tokens_per_s"] = double(problem.T) / per_launch;
  state.counters["state_MB"] = double(state_bytes) * 1e-6;
  const double flops = recurrent_flops(problem) / per_launch;
  state.counters["flop_per_second"] = flops;
  if (const double ceiling = flop_ceiling(FlopUnit::fp32); ceiling > 0)
    state.counters["fraction_of_flop_ceiling"] = flops / ceiling;
}

namespace {

void print_help() {
  benchmark::PrintDefaultHelp();
  std::printf(
      "\nThis binary's flags (after Google Benchmark's):\n"
      "  --no-hold                 time without holding the stream (for profilers)\n"
      "  --context KEY=VALUE       add KEY: VALUE to the JSON output's context (repeatable; the\n"
      "                            value may hold commas and spaces, unlike in\n"
      "                            --benchmark_context; the device script records device, date,\n"
      "                            commit, command)\n");
  for (const Flag& flag : binary_flags) std::printf("  %-25s %s\n", flag.name, flag.help);
}

// The context entry of "KEY=VALUE", or false.
bool add_context(const std::string& entry) {
  const std::size_t eq = entry.find('=');
  if (eq == 0 || eq == std::string::npos) return false;
  benchmark::AddCustomContext(entry.substr(0, eq), entry.substr(eq + 1));
  return true;
}

}  // namespace

int run_benchmarks(int argc, char** argv, FlopUnit unit, std::vector<Flag> flags) {
  binary_flags = std::move(flags);
  // Google Benchmark first: it takes its own flags out of argv (and answers --help).
  benchmark::Initialize(&argc, argv, print_help);
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    bool known = true;
    if (arg == "--no-hold") {
      hold_off = true;
    } else if (arg == "--context" && i + 1 < argc) {
      known = add_context(argv[++i]);
    } else if (arg.rfind("--context=", 0) == 0) {
      known = add_context(arg.substr(10));
    } else {
      known = false;
      for (const Flag& flag : binary_flags)
        if (arg == flag.name) *flag.value = known = true;
    }
    if (!known) argv[kept++] = argv[i];  // left for ReportUnrecognizedArguments
  }
  argc = kept;
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  cudaDeviceProp prop{};
  if (device_available() && cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    benchmark::AddCustomContext("cuda_device", prop.name);
    benchmark::AddCustomContext("cuda_sms", std::to_string(prop.multiProcessorCount));
    benchmark::AddCustomContext("copy_bytes_per_second", std::to_string(copy_bandwidth()));
    if (const double ceiling = flop_ceiling(unit); ceiling > 0) {
      benchmark::AddCustomContext("flop_ceiling_per_second", std::to_string(ceiling));
      benchmark::AddCustomContext("flop_ceiling_basis",
                                  unit == FlopUnit::tensor_core
                                      ? "SMs x max SM clock x dense bf16 tensor-core FLOP per clock per SM"
                                      : "SMs x max SM clock x fp32 FMA FLOP per clock per SM");
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

const std::vector<PeerShape>& peer_shapes() {
  auto repeat = [](int n, std::int64_t length) { return std::vector<std::int64_t>(static_cast<std::size_t>(n), length); };
  static const std::vector<PeerShape> all{
      {"qwen3next_4x8192", 16, 32, repeat(4, 8192)},
      {"qwen3next_1x32768", 16, 32, repeat(1, 32768)},
      {"qwen35_4x8192", 16, 64, repeat(4, 8192)},
      {"lowpar_1x32768", 2, 8, repeat(1, 32768)},
      {"varlen_pack", 16, 32, {1, 17, 64, 65, 300, 1000, 4000, 8192, 2048, 513, 3000, 129}},
      {"qwen3next_8x4096", 16, 32, repeat(8, 4096)},
      // Not a peer shape: what the chunked prefill's default split by the heads costs or saves
      // where several long sequences of a few-head model already give more blocks than one.
      {"lowpar_4x8192", 2, 8, repeat(4, 8192)},
  };
  return all;
}

Problem peer_problem(const PeerShape& shape) {
  Problem p = Problem::packed(shape.lengths, shape.H, shape.HV, 128, 128);
  p.input_dtype = DType::bf16;
  p.gate_dtype = DType::f32;
  p.use_qk_l2norm = true;
  p.has_h0 = true;
  p.has_hT = true;
  return p;
}

}  // namespace gdn::cuda::bench
