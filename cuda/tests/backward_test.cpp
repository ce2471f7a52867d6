// The CUDA backward's GPU suite (cuda/api/backward.hpp, docs/cuda_backward.md), tallied with the
// forward's under the kernel "cuda.recurrent_prefill.backward":
//   backward_conformance  random cases of the backward's share of the recurrent prefill's space
//                         (fuzz::backward_space), cotangents from each case's seed
//                         (fuzz::make_backward_inputs), every gradient judged by the oracle's
//                         calibrated gradient budget (oracle/backward_budget.hpp) against the
//                         sequential backward's fp32 emulation;
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

const char* const kKernel = "cuda.recurrent_prefill.backward";

// A case of the backward's space with its cotangents.
struct BackwardCase {
  KernelCase c;
  BackwardInputs cotangents;
};

BackwardCase random_backward_case(std::mt19937_64& rng) {
  BackwardCase b;
  const std::uint64_t seed = rng();
  b.c = fuzz::draw_case(seed, fuzz::backward_space(fuzz::CaseSpace::recurrent_prefill()));
  b.cotangents = fuzz::make_backward_inputs(b.c.problem, seed ^ 0x9e3779b97f4a7c15ull);
  return b;
}

std::string describe(const BackwardCase& b) {
  return testbed::describe(b.c) + (b.cotangents.dhT.defined() ? " with dhT" : " without dhT");
}

template <class Check>
void each_case(const char* property, int cases, Check check) {
  std::mt19937_64 rng(property_seed(kKernel, property));
  int failures = 0, ran = 0;
  for (int i = 0; i < cases; ++i) {
    const BackwardCase b = random_backward_case(rng);
    RecurrentPrefillKernel kernel;
    if (!kernel.supports_backward(b.c.problem, nullptr)) {
      Tally::instance().add(kKernel, property, false, false);
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
    Tally::instance().add(kKernel, property, true, !failure.empty(), margin);
    if (!failure.empty() && ++failures <= 8)
      FAIL_CHECK(property << ": " << failure << "\n  case " << i << ": " << describe(b));
  }
  INFO(kKernel << " " << property << ": " << failures << " of " << ran << " cases failed");
  CHECK(ran > 0);
  CHECK(failures == 0);
}

}  // namespace

// (The test main exits 77, reported as skipped, before any test when there is no device.)
TEST_CASE("backward conformance - cuda.recurrent_prefill.backward", "[gpu][backward][conformance]") {
  each_case("backward_conformance", case_count(), [](const BackwardCase& b, RecurrentPrefillKernel& kernel, double* margin) {
    oracle::BackwardContext context(describe(b), b.c.problem, b.c.inputs(), b.cotangents);
    const oracle::BackwardRun run = [&](const Problem& p, const Inputs& in, const BackwardInputs& cot) {
      return kernel.backward(p, in, cot);
    };
    const oracle::Verdict v =
        oracle::evaluate_backward(kKernel, Formulation::sequential, 64, run, context, oracle::BudgetOptions{});
    if (v.status != oracle::Status::error) *margin = v.worst_margin();
    return v.failed() ? v.details() : std::string();
  });
}

TEST_CASE("backward determinism and batch invariance - cuda.recurrent_prefill.backward", "[gpu][backward][bitwise]") {
  // The oracle's reproducibility checks, the ones `conformance --backward` adds: a second run
  // bit for bit (repeat_bits) and, with two or more sequences, the reversed pack's bits per
  // sequence (repack_bits).
  each_case("backward_reproducibility", std::max(4, case_count() / 5),
            [](const BackwardCase& b, RecurrentPrefillKernel& kernel, double*) {
              const Inputs in = b.c.inputs();
              const Gradients<double> first = kernel.backward(b.c.problem, in, b.cotangents);
              std::string failure;
              for (const oracle::Check& check :
                   oracle::backward_reproducibility_checks(kernel, b.c.problem, in, b.cotangents, first))
                if (!check.pass) failure += (failure.empty() ? "" : "; ") + check.metric + ": " + check.basis;
              return failure;
            });
}
