// The GPU suite's random conformance cases (chunked_test.cpp, "random cases within the calibrated
// budget": the same generator, seed and judge) run on the CPU models of the kernel's operand
// roundings (reference/operand_model.hpp). What a rounding scheme would do on the GPU suite,
// before a kernel is written for it; no GPU is used.
//
//   chunked_model_study [CASES] [--models PIECE|PIECE...]
//
// CASES defaults to 1000; the seed is the suite's (GDN_SEED moves it, as there). --models,
// '|'-separated pieces of model names, runs only the models whose names contain one (the others
// cost most of the time). Prints per model the failures and the worst margin, and the first
// failures' cases.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/tests/chunked_testbed.hpp"
#include "cuda/implementations/chunked_implementation.hpp"
#include "cuda/tests/testbed.hpp"
#include "oracle/budget.hpp"
#include "reference/emulate.hpp"
#include "reference/operand_model.hpp"

using namespace gdn;

int main(int argc, char** argv) {
  int cases = 1000;
  std::string pieces;  // --models
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--models" && i + 1 < argc) {
      pieces = argv[++i];
    } else if (arg.rfind("--models=", 0) == 0) {
      pieces = arg.substr(9);
    } else if (!arg.empty() && arg[0] != '-') {
      cases = std::atoi(arg.c_str());
    } else {
      std::fprintf(stderr, "usage: %s [CASES] [--models PIECE|PIECE...]\n", argv[0]);
      return 2;
    }
  }
  // The seed of chunked_test.cpp's conformance property (GDN_SEED moves it, as there).
  const std::uint64_t seed = cuda::testbed::property_seed("cuda.chunked_prefill", "conformance");
  // The kernel's first design (split), the design with Vnew split in P Vnew for bf16 too (fp16
  // has it), the kernel's current design (split_state + Vnew hi + lo in P Vnew), then each lo
  // pass dropped on top of S0 hi in Q S0 (the wgmma instructions a warpgroup saves per chunk at
  // K 128: Q S0 lo 8, K S0 lo 8, T lo 4, X lo 4, Vnew_d lo 8), then single rounding everywhere.
  // Then the kernel's design now (split_all) with T = (I + A)^-1 formed as a fused kernel on the
  // tensor cores would (reference::TMerge): the 16 x 16 blocks' merges with operands rounded once,
  // split hi + lo, or in TF32. Per model also the median over the bf16 / fp16 cases of hT's and
  // o's largest error over split_all's on the same case (the accuracy a cheaper design gives up).
  struct Model {
    const char* name;
    std::function<void(reference::OperandSplits&)> drop;
    reference::OperandRounding base = reference::OperandRounding::split;
    int failures = 0;
    double worst = 0;
    bool wanted = true;  // --models
    std::vector<double> o_ratio, hT_ratio;
  };
  Model models[] = {
      {"split (the first design)", [](reference::OperandSplits&) {}},
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
      {"split_all (the kernel now)", [](reference::OperandSplits&) {}, reference::OperandRounding::split_all},
      {"split_all + T merges once", [](reference::OperandSplits& s) { s.t_merge = reference::TMerge::once; },
       reference::OperandRounding::split_all},
      {"split_all + T merges split", [](reference::OperandSplits& s) { s.t_merge = reference::TMerge::split; },
       reference::OperandRounding::split_all},
      {"split_all + T merges tf32", [](reference::OperandSplits& s) { s.t_merge = reference::TMerge::tf32; },
       reference::OperandRounding::split_all},
  };
  for (Model& m : models) {
    m.wanted = pieces.empty();
    for (std::string rest = pieces; !m.wanted && !rest.empty();) {
      const std::size_t bar = rest.find('|');
      const std::string piece = rest.substr(0, bar);
      m.wanted = !piece.empty() && std::string(m.name).find(piece) != std::string::npos;
      rest = bar == std::string::npos ? "" : rest.substr(bar + 1);
    }
  }
  // The GPU suite's budget for the chunked kernel (the default, split design).
  const oracle::BudgetOptions budget = cuda::chunked_budget(cuda::ChunkedRounding::split);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < cases; ++i) {
    const cuda::chunked_testbed::Case c = cuda::chunked_testbed::random_case(rng);
    // The oracle's outputs and the chunked emulation, computed once for every model.
    oracle::CaseContext context("case " + std::to_string(i), c.problem, c.inputs());
    const bool tensor = c.problem.input_dtype == DType::bf16 || c.problem.input_dtype == DType::f16;
    // split_all's largest errors of o and hT on this case (the ratios' denominators).
    auto errors = [&](const Outputs<double>& x) {
      const Outputs<double>& e = context.exact();
      double o = 0, h = 0;
      for (std::int64_t k = 0; k < e.o.numel(); ++k) o = std::max(o, std::fabs(x.o[k] - e.o[k]));
      if (c.problem.has_hT)
        for (std::int64_t k = 0; k < e.hT.numel(); ++k) h = std::max(h, std::fabs(x.hT[k] - e.hT[k]));
      return std::make_pair(o, h);
    };
    const auto kernel_errors =
        errors(reference::emulate_operands(c.problem, context.inputs(), reference::OperandRounding::split_all));
    for (Model& m : models) {
      if (!m.wanted) continue;
      reference::OperandSplits splits = reference::OperandSplits::of(m.base, c.problem.input_dtype);
      m.drop(splits);
      const Outputs<double> model = reference::emulate_operands(c.problem, context.inputs(), splits);
      if (tensor) {
        const auto e = errors(model);
        if (kernel_errors.first > 0) m.o_ratio.push_back(e.first / kernel_errors.first);
        if (kernel_errors.second > 0) m.hT_ratio.push_back(e.second / kernel_errors.second);
      }
      const oracle::Verdict v =
          oracle::evaluate_outputs(m.name, Formulation::chunked, 64, context, model, budget);
      m.worst = std::max(m.worst, v.worst_margin());
      if (!v.passed() && ++m.failures <= 2)
        std::printf("%s fails case %d: %s\n%s\n", m.name, i, c.describe().c_str(), v.details().c_str());
    }
  }
  std::printf("%d cases of the GPU suite's conformance generator (seed %llu)\n", cases,
              static_cast<unsigned long long>(seed));
  auto median = [](std::vector<double> r) {
    if (r.empty()) return 0.0;
    std::sort(r.begin(), r.end());
    return r[r.size() / 2];
  };
  std::printf("o, hT: median over the bf16 / fp16 cases of the largest error over split_all's\n");
  for (const Model& m : models)
    if (m.wanted)
      std::printf("%-40s %4d failed, worst margin %.3f, o %.3g, hT %.3g\n", m.name, m.failures, m.worst,
                  median(m.o_ratio), median(m.hT_ratio));
  return 0;
}
