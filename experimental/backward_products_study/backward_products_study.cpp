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
// ratio of its errors to the fp32 model's per input dtype, and the first failures.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
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
  // "operands": the operand model of the budget's baseline=operands_single (bf16 or f16 products
  // by the input dtype, none for fp32: oracle::emulate_backward_operands), the design of fla's and
  // FlashQLA's backwards; named by its first member.
  struct Model {
    reference::BackwardProducts products;
    bool operands = false;
    int failures = 0, ran = 0;
    double worst = 0;
    // Per case, by input dtype (bf16, f16, f32): the largest over the gradient tensors of the
    // tensor's error over the fp32 model's error of the same tensor (where that is not 0).
    std::map<DType, std::vector<double>> ratio;
  };
  std::vector<Model> models = {{reference::BackwardProducts::fp32},
                               {reference::BackwardProducts::tf32},
                               {reference::BackwardProducts::tf32x3},
                               {reference::BackwardProducts::bf16x2},
                               {reference::BackwardProducts::bf16x3},
                               {reference::BackwardProducts::bf16, true}};
  const oracle::BudgetOptions budget{};  // the chunked backward's: the default gradient budget
  std::mt19937_64 rng(seed);
  for (int i = 0; i < cases; ++i) {
    const std::uint64_t s = rng();
    const fuzz::Case c = fuzz::draw_case(s, space);
    const reference::BackwardInputs cot = fuzz::make_backward_inputs(c.problem, s ^ 0x9e3779b97f4a7c15ull);
    if (!oracle::backward_in_scope(c.problem)) continue;
    oracle::BackwardContext context("case " + std::to_string(i), c.problem, c.inputs(), cot);
    std::vector<double> fp32_errors;  // per check of the fp32 model, the first model
    for (Model& m : models) {
      const reference::BackwardProducts products =
          m.operands ? oracle::operand_products(c.problem.input_dtype) : m.products;
      Gradients<double> x =
          reference::chunked_backward_products(c.problem, context.inputs(), cot, 64, products).cast<double>();
      oracle::round_gradients(c.problem, x);
      const oracle::Verdict v = oracle::evaluate_gradients(std::string("model.backward.") +
                                                               (m.operands ? "operands" : reference::backward_products_name(m.products)),
                                                           Formulation::chunked, 64, context, x, budget);
      if (fp32_errors.empty())
        for (const oracle::Check& check : v.checks) fp32_errors.push_back(check.error);
      double ratio = 0;
      for (std::size_t k = 0; k < v.checks.size() && k < fp32_errors.size(); ++k)
        if (fp32_errors[k] > 0) ratio = std::max(ratio, v.checks[k].error / fp32_errors[k]);
      if (ratio > 0) m.ratio[c.problem.input_dtype].push_back(ratio);
      ++m.ran;
      m.worst = std::max(m.worst, v.worst_margin());
      if (!v.passed() && ++m.failures <= 2)
        std::printf("%s fails case %d: %s\n%s\n", (m.operands ? "operands" : reference::backward_products_name(m.products)), i,
                    c.problem.describe().c_str(), v.details().c_str());
    }
  }
  std::printf("%d cases of the GPU suite's chunked-backward conformance generator (base seed %llu)\n", cases,
              static_cast<unsigned long long>(base));
  std::printf("error / fp32's: per case the largest over the gradient tensors of the tensor's error over the fp32 "
              "model's; median and 90th percentile over the cases of each input dtype\n");
  for (Model& m : models) {
    std::printf("%-8s %4d of %4d failed, worst margin %8.3f, error / fp32's:",
                (m.operands ? "operands" : reference::backward_products_name(m.products)), m.failures, m.ran, m.worst);
    for (auto& [dtype, r] : m.ratio) {
      std::sort(r.begin(), r.end());
      std::printf("  %s %.3g / %.3g (%zu)", dtype_name(dtype), r[r.size() / 2], r[(r.size() * 9) / 10], r.size());
    }
    std::printf("\n");
  }
  return 0;
}
