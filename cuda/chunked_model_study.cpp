// The GPU suite's random conformance cases (chunked_test.cpp, "random cases within the calibrated
// budget": the same generator, seed and judge) run on the CPU models of the kernel's operand
// roundings (reference/operand_model.hpp). What a rounding scheme would do on the H200 suite,
// before a kernel is written for it; no GPU is used.
//
//   cuda_chunked_model_study [CASES]     (default 1000; GDN_SEED as the suite's)
//
// Prints per model the failures and the worst margin, and the first failures' cases.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>

#include "cuda/chunked_testbed.hpp"
#include "reference/emulate.hpp"
#include "reference/operand_model.hpp"
#include "reference/sequential.hpp"

using namespace gdn;

int main(int argc, char** argv) {
  const int cases = argc > 1 ? std::atoi(argv[1]) : 1000;
  const char* seed_text = std::getenv("GDN_SEED");
  const std::uint64_t base = seed_text ? std::strtoull(seed_text, nullptr, 10) : 20261202ull;
  // chunked_test.cpp's seed_for("conformance") for the kernel's name.
  const std::uint64_t seed =
      base ^ (std::hash<std::string>{}(std::string("cuda.chunked_prefill") + "/" + "conformance") & 0xffffffffull);
  struct Model {
    const char* name;
    reference::OperandRounding rounding;
    int failures = 0;
    double worst = 0;
  };
  Model models[] = {{"model.chunked.split", reference::OperandRounding::split},
                    {"model.chunked.split_state", reference::OperandRounding::split_state},
                    {"model.chunked.single", reference::OperandRounding::single}};
  std::mt19937_64 rng(seed);
  for (int i = 0; i < cases; ++i) {
    const cuda::chunked_testbed::Case c = cuda::chunked_testbed::random_case(rng);
    const Inputs inputs = c.inputs();
    const Outputs<double> exact = reference::sequential<double>(c.problem, inputs);
    const Outputs<double> emulation = reference::emulate(c.problem, inputs, Formulation::chunked, 64);
    for (Model& m : models) {
      const auto j = cuda::chunked_testbed::judge(c.problem, inputs, exact, emulation,
                                                  reference::emulate_operands(c.problem, inputs, m.rounding));
      m.worst = std::max(m.worst, j.margin);
      if (!j.pass && ++m.failures <= 3)
        std::printf("%s fails case %d: %s\n%s\n", m.name, i, c.describe().c_str(), j.details.c_str());
    }
  }
  std::printf("%d cases of the GPU suite's conformance generator (seed %llu)\n", cases,
              static_cast<unsigned long long>(seed));
  for (const Model& m : models)
    std::printf("%-26s %4d failed, worst margin %.3f\n", m.name, m.failures, m.worst);
  return 0;
}
