// The GPU suite's random conformance cases (chunked_test.cpp, "random cases within the calibrated
// budget": the same generator, seed and judge) run on the CPU models of the kernel's operand
// roundings (reference/operand_model.hpp). What a rounding scheme would do on the H200 suite,
// before a kernel is written for it; no GPU is used.
//
//   cuda_chunked_model_study [CASES]     (default 1000; GDN_SEED as the suite's)
//
// GDN_STUDY_MODELS, '|'-separated pieces of model names, runs only the models whose names
// contain one (the others cost most of the time). Prints per model the failures and the worst
// margin, and the first failures' cases.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>

#include "cuda/chunked_testbed.hpp"
#include "cuda/testbed.hpp"
#include "reference/emulate.hpp"
#include "reference/operand_model.hpp"
#include "reference/sequential.hpp"

using namespace gdn;

int main(int argc, char** argv) {
  const int cases = argc > 1 ? std::atoi(argv[1]) : 1000;
  // The seed of chunked_test.cpp's conformance property (GDN_SEED moves it, as there).
  const std::uint64_t seed = cuda::testbed::property_seed("cuda.chunked_prefill", "conformance");
  // The kernel's design until 2026-12-05 (split), the design with Vnew split in P Vnew for bf16
  // too (fp16 has it), the kernel's design since (split_state + Vnew hi + lo in P Vnew), then
  // each lo pass dropped on top of S0 hi in Q S0 (wgmma a warpgroup saves per chunk at K 128:
  // Q S0 lo 8, K S0 lo 8, T lo 4, X lo 4, Vnew_d lo 8), then single rounding everywhere.
  struct Model {
    const char* name;
    std::function<void(reference::OperandSplits&)> drop;
    int failures = 0;
    double worst = 0;
    bool wanted = true;  // GDN_STUDY_MODELS
  };
  Model models[] = {
      {"split (the kernel until 12-05)", [](reference::OperandSplits&) {}},
      {"split + Vnew hi + lo in P Vnew", [](reference::OperandSplits& s) { s.vnew_in_pv = true; }},
      {"split_state: S0 hi in Q S0", [](reference::OperandSplits& s) { s.s0_in_qs = false; }},
      {"split_state + Vnew split (the kernel)", [](reference::OperandSplits& s) { s.s0_in_qs = false, s.vnew_in_pv = true; }},
      {"split_state + T hi only", [](reference::OperandSplits& s) { s.s0_in_qs = s.t = false; }},
      {"split_state + X hi only", [](reference::OperandSplits& s) { s.s0_in_qs = s.x = false; }},
      {"split_state + Vnew_d hi only", [](reference::OperandSplits& s) { s.s0_in_qs = s.vnew_d = false; }},
      {"S0 hi in K S0 and Q S0", [](reference::OperandSplits& s) { s.s0_in_qs = s.s0_in_ks = false; }},
      {"S0 hi in both + Vnew hi + lo in P Vnew", [](reference::OperandSplits& s) {
         s.s0_in_qs = s.s0_in_ks = false;
         s.vnew_in_pv = true;
       }},
      {"single", [](reference::OperandSplits& s) { s = reference::OperandSplits{false, false, false, false, false, false}; }},
  };
  const char* const pieces = std::getenv("GDN_STUDY_MODELS");
  for (Model& m : models) {
    m.wanted = pieces == nullptr || *pieces == '\0';
    for (std::string rest = pieces ? pieces : ""; !m.wanted && !rest.empty();) {
      const std::size_t bar = rest.find('|');
      const std::string piece = rest.substr(0, bar);
      m.wanted = !piece.empty() && std::string(m.name).find(piece) != std::string::npos;
      rest = bar == std::string::npos ? "" : rest.substr(bar + 1);
    }
  }
  std::mt19937_64 rng(seed);
  for (int i = 0; i < cases; ++i) {
    const cuda::chunked_testbed::Case c = cuda::chunked_testbed::random_case(rng);
    const Inputs inputs = c.inputs();
    const Outputs<double> exact = reference::sequential<double>(c.problem, inputs);
    const Outputs<double> emulation = reference::emulate(c.problem, inputs, Formulation::chunked, 64);
    for (Model& m : models) {
      if (!m.wanted) continue;
      reference::OperandSplits splits = reference::OperandSplits::of(reference::OperandRounding::split, c.problem.input_dtype);
      m.drop(splits);
      const auto j = cuda::chunked_testbed::judge(c.problem, inputs, exact, emulation,
                                                  reference::emulate_operands(c.problem, inputs, splits));
      m.worst = std::max(m.worst, j.margin);
      if (!j.pass && ++m.failures <= 2)
        std::printf("%s fails case %d: %s\n%s\n", m.name, i, c.describe().c_str(), j.details.c_str());
    }
  }
  std::printf("%d cases of the GPU suite's conformance generator (seed %llu)\n", cases,
              static_cast<unsigned long long>(seed));
  for (const Model& m : models)
    if (m.wanted) std::printf("%-32s %4d failed, worst margin %.3f\n", m.name, m.failures, m.worst);
  return 0;
}
