// Backward benchmark (cuda/api/backward.hpp), both algorithms (BM_backward: sequential,
// BM_backward_chunked: chunked), on the six peer shapes (bench::peer_shapes(), those
// cuda/peers/backward_peers.py times for fla and FlashQLA): bf16 q/k/v and dO, fp32 g and beta,
// in-kernel l2norm, dense fp32 h0 and hT with a dhT cotangent, K = V = 128. CUDA-event time of
// one backward per iteration (its host-side checks included), median reported by the script.
// Counters: ms, tokens_per_s, the fraction of the fp32 ceiling, and the workspace it needs (GB).
// Arithmetic per token and value head: sequential about 30 K V FLOP (3 forward passes of 7 K V
// and the adjoint's 9 K V); chunked about 27 K V at C = 64, K = V = 128 (the chunk's products
// counted in docs/cuda_backward.md).
#include <benchmark/benchmark.h>


#include "cuda/api/backward.hpp"
#include "cuda/bench/bench_common.hpp"

namespace {

using namespace gdn;
using namespace gdn::cuda;

// The backward's buffers beside the forward's inputs (DeviceProblem).
struct BackwardBuffers {
  DeviceBuffer<unsigned char> dO, dhT, dq, dk, dv, dg, dbeta, dh0, workspace;
  BackwardBuffers(const Problem& p, BackwardAlgorithm algorithm)
      : dO(shape_numel(p.v_shape()) * 2),
        dhT(shape_numel(p.state_shape()) * 4),
        dq(shape_numel(p.q_shape()) * 2),
        dk(shape_numel(p.q_shape()) * 2),
        dv(shape_numel(p.v_shape()) * 2),
        dg(shape_numel(p.gate_shape()) * 4),
        dbeta(shape_numel(p.gate_shape()) * 4),
        dh0(shape_numel(p.state_shape()) * 4),
        workspace(backward_workspace_bytes(p, algorithm)) {
    dO.fill_bytes(0x3c);  // bf16 0x3c3c, about 0.0115: finite, normal
    dhT.fill_bytes(0);
  }
};

void run_backward(benchmark::State& state, BackwardAlgorithm algorithm) {
  const bench::PeerShape& shape = bench::peer_shapes().at(static_cast<std::size_t>(state.range(0)));
  const Problem p = bench::peer_problem(shape);
  state.SetLabel(shape.name);
  bench::DeviceProblem device(p, 7);
  BackwardBuffers buffers(p, algorithm);
  BackwardTensors t;
  t.forward = device.tensors();
  t.forward.o = nullptr;
  t.forward.hT = nullptr;
  t.dO = buffers.dO.data();
  t.dhT = reinterpret_cast<const float*>(buffers.dhT.data());
  t.dq = buffers.dq.data();
  t.dk = buffers.dk.data();
  t.dv = buffers.dv.data();
  t.dg = buffers.dg.data();
  t.dbeta = buffers.dbeta.data();
  t.dh0 = reinterpret_cast<float*>(buffers.dh0.data());
  t.workspace = buffers.workspace.data();
  t.workspace_bytes = buffers.workspace.bytes();
  cudaStream_t stream;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const auto launch = [&] {
    if (algorithm == BackwardAlgorithm::chunked) chunked_backward(p, t, stream);
    else recurrent_backward(p, t, stream);
  };
  launch();  // warm-up
  check_cuda(cudaStreamSynchronize(stream), "warm-up");
  bench::EventTimer timer(stream);
  double total = 0;
  for (auto _ : state) {
    timer.start();
    launch();
    const double seconds = timer.stop();
    state.SetIterationTime(seconds);
    total += seconds;
  }
  const double per = total / static_cast<double>(state.iterations());
  state.counters["ms"] = per * 1e3;
  state.counters["tokens_per_s"] = static_cast<double>(p.T) / per;
  const double per_token = algorithm == BackwardAlgorithm::chunked ? 27.0 : 30.0;
  const double flops = per_token * static_cast<double>(p.T) * p.HV * p.K * p.V;
  const double ceiling = bench::flop_ceiling(bench::FlopUnit::fp32);
  if (ceiling > 0) state.counters["fraction_of_flop_ceiling"] = flops / per / ceiling;
  state.counters["workspace_GB"] = static_cast<double>(backward_workspace_bytes(p, algorithm)) * 1e-9;
  state.counters["hold_timeouts"] = timer.hold_timeouts();
  cudaStreamDestroy(stream);
}

void BM_backward(benchmark::State& state) { run_backward(state, BackwardAlgorithm::sequential); }
void BM_backward_chunked(benchmark::State& state) { run_backward(state, BackwardAlgorithm::chunked); }

}  // namespace

BENCHMARK(BM_backward_chunked)
    ->ArgNames({"shape"})
    ->DenseRange(0, 5)
    ->UseManualTime()
    ->MinTime(0.1)
    ->Unit(benchmark::kMillisecond);

BENCHMARK(BM_backward)
    ->ArgNames({"shape"})
    ->DenseRange(0, 5)
    ->UseManualTime()
    ->MinTime(0.1)
    ->Unit(benchmark::kMillisecond);

GDN_BENCHMARK_MAIN(gdn::cuda::bench::FlopUnit::fp32)
