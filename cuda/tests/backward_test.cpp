// The CUDA backwards' GPU suite (cuda/api/backward.hpp, docs/cuda_backward.md), one template over
// the two kernels, tallied with the forward's under "cuda.recurrent_prefill.backward" (the
// sequential adjoint) and "cuda.chunked_prefill.backward" (the chunked one):
//   backward_conformance  random cases of the backward's share of the recurrent prefill's space
//                         (fuzz::backward_space; K <= 128 for the chunked one), cotangents from
//                         each case's seed (fuzz::make_backward_inputs), every gradient judged by
//                         the oracle's calibrated gradient budget (oracle/backward_budget.hpp)
//                         against the backward's fp32 emulation in its own formulation
//                         (sequential, or chunked at chunk size 64);
//   backward_reproducibility  oracle::backward_reproducibility_checks: the same inputs again give
//                         the same bits, every gradient, and the pack reversed gives every
//                         sequence the same bits (dA_log and ddt_bias, sums over the whole
//                         batch by definition, left out).
// A failure prints the case (enough to rebuild it) and the verdict's checks.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "cuda/implementations/chunked_implementation.hpp"
#include "cuda/implementations/implementations.hpp"
#include "cuda/tests/testbed.hpp"
#include "fuzz/backward_properties.hpp"
#include "fuzz/sample.hpp"
#include "oracle/backward_budget.hpp"
#include "oracle/reproducibility.hpp"

using namespace gdn;
using namespace gdn::cuda;
using namespace gdn::cuda::testbed;

namespace {

// The two kernels under test: the adapter, its tally name and its case space.
struct SequentialBackward {
  using Kernel = RecurrentPrefillKernel;
  static constexpr const char* name = "cuda.recurrent_prefill.backward";
  static fuzz::CaseSpace space() { return fuzz::backward_space(fuzz::CaseSpace::recurrent_prefill()); }
};

struct ChunkedBackward {
  using Kernel = ChunkedPrefillKernel;
  static constexpr const char* name = "cuda.chunked_prefill.backward";
  static fuzz::CaseSpace space() {
    fuzz::CaseSpace s = fuzz::backward_space(fuzz::CaseSpace::recurrent_prefill());
    s.max_K = 128;
    s.long_chunks = 5;  // sequences of several chunks: the chunk-to-chunk sweeps
    return s;
  }
};

// A case of the backward's space with its cotangents.
struct BackwardCase {
  KernelCase c;
  BackwardInputs cotangents;
};

BackwardCase random_backward_case(std::mt19937_64& rng, const fuzz::CaseSpace& space) {
  BackwardCase b;
  const std::uint64_t seed = rng();
  b.c = fuzz::draw_case(seed, space);
  b.cotangents = fuzz::make_backward_inputs(b.c.problem, seed ^ 0x9e3779b97f4a7c15ull);
  return b;
}

std::string describe(const BackwardCase& b) {
  return testbed::describe(b.c) + (b.cotangents.dhT.defined() ? " with dhT" : " without dhT");
}

template <class Under, class Check>
void each_case(const char* property, int cases, Check check) {
  std::mt19937_64 rng(property_seed(Under::name, property));
  const fuzz::CaseSpace space = Under::space();
  int failures = 0, ran = 0;
  for (int i = 0; i < cases; ++i) {
    const BackwardCase b = random_backward_case(rng, space);
    typename Under::Kernel kernel;
    if (!kernel.supports_backward(b.c.problem, nullptr)) {
      Tally::instance().add(Under::name, property, false, false);
      continue;
    }
    double margin = 0;
    std::string failure;
    try {
      failure = check(b, kernel, &margin);
    } catch (const std::exception& e) {
      failure = std::string("threw: ") + e.what();
    }
    ++ran;
    Tally::instance().add(Under::name, property, true, !failure.empty(), margin);
    if (!failure.empty() && ++failures <= 8)
      FAIL_CHECK(property << ": " << failure << "\n  case " << i << ": " << describe(b));
  }
  INFO(Under::name << " " << property << ": " << failures << " of " << ran << " cases failed");
  CHECK(ran > 0);
  CHECK(failures == 0);
}

}  // namespace

// (The test main exits 77, reported as skipped, before any test when there is no device.)
TEMPLATE_TEST_CASE("backward conformance", "[gpu][backward][conformance]", SequentialBackward, ChunkedBackward) {
  using Kernel = typename TestType::Kernel;
  each_case<TestType>("backward_conformance", case_count(), [](const BackwardCase& b, Kernel& kernel, double* margin) {
    oracle::BackwardContext context(describe(b), b.c.problem, b.c.inputs(), b.cotangents);
    const oracle::BackwardRun run = [&](const Problem& p, const Inputs& in, const BackwardInputs& cot) {
      return kernel.backward(p, in, cot);
    };
    const oracle::Verdict v = oracle::evaluate_backward(TestType::name, kernel.backward_formulation(), 64, run,
                                                        context, oracle::BudgetOptions{});
    if (v.status != oracle::Status::error) *margin = v.worst_margin();
    return v.failed() ? v.details() : std::string();
  });
}

TEMPLATE_TEST_CASE("backward determinism and batch invariance", "[gpu][backward][bitwise]", SequentialBackward,
                   ChunkedBackward) {
  // The oracle's reproducibility checks, the ones `conformance --backward` adds: a second run
  // bit for bit (repeat_bits) and, with two or more sequences, the reversed pack's bits per
  // sequence (repack_bits).
  using Kernel = typename TestType::Kernel;
  each_case<TestType>("backward_reproducibility", std::max(4, case_count() / 5),
                      [](const BackwardCase& b, Kernel& kernel, double*) {
                        const Inputs in = b.c.inputs();
                        const Gradients<double> first = kernel.backward(b.c.problem, in, b.cotangents);
                        std::string failure;
                        for (const oracle::Check& check :
                             oracle::backward_reproducibility_checks(kernel, b.c.problem, in, b.cotangents, first))
                          if (!check.pass) failure += (failure.empty() ? "" : "; ") + check.metric + ": " + check.basis;
                        return failure;
                      });
}
