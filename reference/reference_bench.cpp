// Throughput of the references at sizes a fuzzer uses, against Eigen's own matrix-product
// rate measured in this binary (single thread, like the references).
//
// FLOP counts per token and value head (K = key size, V = value size, C = chunk size):
//   sequential: decay K*V + S^T k 2KV + rank-one 2KV + S^T q 2KV           = 7 K V
//   chunked:    K K^T 2CK + Q K^T 2CK + triangular solve C(K+V) + [W;Q] S0 4KV
//               + P Vnew 2CV + K^T Vnew 2KV                                  (§4; ~164k at 128/64)
#include <benchmark/benchmark.h>

#include <Eigen/Core>
#include <chrono>

#include "fuzz/inputs.hpp"
#include "reference/chunked.hpp"
#include "reference/sequential.hpp"

namespace {

using namespace gdn;

double sequential_flops_per_token(int K, int V) { return 7.0 * K * V; }
double chunked_flops_per_token(int K, int V, int C) {
  return 4.0 * C * K + double(C) * (K + V) + 4.0 * K * V + 2.0 * C * V + 2.0 * K * V;
}

// Eigen's rate on a square product large enough to reach its kernel's steady state.
template <class Scalar>
double eigen_gemm_gflops() {
  static const double rate = [] {
    using M = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic>;
    const int n = 512;
    M a = M::Random(n, n), b = M::Random(n, n), c(n, n);
    c.noalias() = a * b;  // warm-up
    double best = 0;
    for (int rep = 0; rep < 5; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      c.noalias() = a * b;
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      benchmark::DoNotOptimize(c.data());
      best = std::max(best, 2.0 * n * n * n / s * 1e-9);
    }
    return best;
  }();
  return rate;
}

struct Shape {
  std::int64_t T = 4096;
  int H = 4, HV = 4, K = 128, V = 128;
};

Problem bench_problem(const Shape& s) {
  Problem p = Problem::fixed_length(1, s.T, s.H, s.HV, s.K, s.V);
  p.use_qk_l2norm = true;
  p.has_h0 = p.has_hT = true;
  return p;
}

template <class Scalar>
void report(benchmark::State& state, const Problem& p, double flops_per_token) {
  const double tokens = double(p.T) * double(state.iterations());
  state.counters["tokens_per_s"] = benchmark::Counter(tokens, benchmark::Counter::kIsRate);
  state.counters["GFLOP_per_s"] =
      benchmark::Counter(tokens * p.HV * flops_per_token * 1e-9, benchmark::Counter::kIsRate);
  state.counters["eigen_gemm_GFLOP_per_s"] = eigen_gemm_gflops<Scalar>();
}

template <class Scalar>
void BM_sequential(benchmark::State& state) {
  Shape s;
  s.K = s.V = static_cast<int>(state.range(0));
  const Problem p = bench_problem(s);
  const Inputs in = fuzz::make_inputs(p, {}, 1);
  for (auto _ : state) benchmark::DoNotOptimize(reference::sequential<Scalar>(p, in).o.data());
  report<Scalar>(state, p, sequential_flops_per_token(s.K, s.V));
}

template <class Scalar>
void BM_chunked(benchmark::State& state) {
  Shape s;
  s.K = s.V = static_cast<int>(state.range(0));
  const int C = static_cast<int>(state.range(1));
  const Problem p = bench_problem(s);
  const Inputs in = fuzz::make_inputs(p, {}, 1);
  for (auto _ : state) benchmark::DoNotOptimize(reference::chunked<Scalar>(p, in, C).o.data());
  report<Scalar>(state, p, chunked_flops_per_token(s.K, s.V, C));
}

template <class Scalar>
void BM_eigen_gemm(benchmark::State& state) {
  using M = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic>;
  const int n = static_cast<int>(state.range(0));
  M a = M::Random(n, n), b = M::Random(n, n), c(n, n);
  for (auto _ : state) {
    c.noalias() = a * b;
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP_per_s"] =
      benchmark::Counter(2.0 * n * n * n * 1e-9 * double(state.iterations()), benchmark::Counter::kIsRate);
}

}  // namespace

BENCHMARK_TEMPLATE(BM_eigen_gemm, double)->Arg(128)->Arg(512)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_eigen_gemm, float)->Arg(128)->Arg(512)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_sequential, double)->Arg(128)->Arg(64)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_sequential, float)->Arg(128)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_chunked, double)->Args({128, 64})->Args({128, 32})->Args({64, 64})->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_chunked, float)->Args({128, 64})->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
