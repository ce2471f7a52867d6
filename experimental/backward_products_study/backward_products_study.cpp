// The GPU suite's random chunked-backward conformance cases (cuda/tests/backward_test.cpp,
// "backward conformance", ChunkedBackward: the same space, seeds and judge) run on the CPU
// models of tensor-core products (reference::chunked_backward_products: each fp32 operand of the
// adjoint's 18 products split into TF32 or bf16 terms). Which precision would a tensor-core
// chunked backward need to keep the gradient budget, before one is written; no GPU is used.
//
//   backward_products_study [CASES] [SEED]
//
// CASES defaults to 250, SEED to the suite's default base seed (20261202; the GPU runs of the
// chunked backward used 20261202..05). Prints per model the failures, the worst margin and the
// median of its largest relative-to-terms error over the fp32 model's, and the first failures.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "fuzz/backward_properties.hpp"
#include "fuzz/sample.hpp"
#include "oracle/backward_budget.hpp"
#include "reference/backward_chunked.hpp"

using namespace gdn;

int main(int argc, char** argv) {
  const int cases = argc > 1 ? std::atoi(argv[1]) : 250;
  const std::uint64_t base = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 20261202ull;
  // cuda/tests/testbed.cpp, property_seed("cuda.chunked_prefill.backward", "backward_conformance").
  const std::uint64_t seed =
      base ^ (std::hash<std::string>{}("cuda.chunked_prefill.backward/backward_conformance") & 0xffffffffull);
  fuzz::CaseSpace space = fuzz::backward_space(fuzz::CaseSpace::recurrent_prefill());
  space.max_K = 128;
  space.long_chunks = 5;
  struct Model {
    reference::BackwardProducts products;
    int failures = 0, ran = 0;
    double worst = 0;
    std::vector<double> ratio;  // largest error over the fp32 model's, per case
  };
  std::vector<Model> models = {{reference::BackwardProducts::fp32},
                               {reference::BackwardProducts::tf32},
                               {reference::BackwardProducts::tf32x3},
                               {reference::BackwardProducts::bf16x2},
                               {reference::BackwardProducts::bf16x3}};
  const oracle::BudgetOptions budget{};  // the chunked backward's: the default gradient budget
  std::mt19937_64 rng(seed);
  for (int i = 0; i < cases; ++i) {
    const std::uint64_t s = rng();
    const fuzz::Case c = fuzz::draw_case(s, space);
    const reference::BackwardInputs cot = fuzz::make_backward_inputs(c.problem, s ^ 0x9e3779b97f4a7c15ull);
    if (!oracle::backward_in_scope(c.problem)) continue;
    oracle::BackwardContext context("case " + std::to_string(i), c.problem, c.inputs(), cot);
    double fp32_error = 0;
    for (Model& m : models) {
      Gradients<double> x =
          reference::chunked_backward_products(c.problem, context.inputs(), cot, 64, m.products).cast<double>();
      oracle::round_gradients(c.problem, x);
      const oracle::Verdict v = oracle::evaluate_gradients(std::string("model.backward.") +
                                                               reference::backward_products_name(m.products),
                                                           Formulation::chunked, 64, context, x, budget);
      double error = 0;  // the largest rel_terms error over the gradients
      for (const oracle::Check& check : v.checks) error = std::max(error, check.error);
      if (m.products == reference::BackwardProducts::fp32) fp32_error = error;
      if (fp32_error > 0) m.ratio.push_back(error / fp32_error);
      ++m.ran;
      m.worst = std::max(m.worst, v.worst_margin());
      if (!v.passed() && ++m.failures <= 2)
        std::printf("%s fails case %d: %s\n%s\n", reference::backward_products_name(m.products), i,
                    c.problem.describe().c_str(), v.details().c_str());
    }
  }
  std::printf("%d cases of the GPU suite's chunked-backward conformance generator (base seed %llu)\n", cases,
              static_cast<unsigned long long>(base));
  for (Model& m : models) {
    std::sort(m.ratio.begin(), m.ratio.end());
    const double median = m.ratio.empty() ? 0 : m.ratio[m.ratio.size() / 2];
    std::printf("%-8s %4d of %4d failed, worst margin %8.3f, median error / fp32's %8.2f\n",
                reference::backward_products_name(m.products), m.failures, m.ran, m.worst, median);
  }
  return 0;
}
