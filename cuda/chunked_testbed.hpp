#pragma once
// Cases and budgets of the chunked prefill's GPU suite, shared by its tests and its accuracy
// tool. Plain C++ (no nvcc).
//
// Budget (why): the oracle's calibrated model (oracle/budget.hpp, BUDGETS.md), through
// oracle::judge: per output, rel_rms <= 2 x the precision emulation's rel_rms + 1 u, max_abs <=
// 2 x the emulation's max_abs + 1 ulp at max|ref| (+ the arithmetic floor where that fails),
// the emulation being reference::emulate(chunked, C = 64): fp32 arithmetic, o rounded once to
// the input dtype. The unit u is the output's dtype for o (the input dtype) and for fp32
// inputs for hT too. For bf16/fp16 inputs hT is held to 1 u of the input dtype instead of
// fp32's (state_unit=input, also the CLI's default budget for cuda.chunked_prefill): the design the issue prescribes (tensor cores on bf16/fp16 operands, like every peer)
// feeds the state products with operands in the input dtype. This kernel splits each computed
// operand of the state path into hi + lo (about 16 bits for bf16, 22 for fp16), well inside
// 1 u of the input dtype but not 1 u_f32: that would need every product emulated in fp32 (no
// tensor-core kernel, fla's included, does that).
// ChunkedRounding::single (a named fast mode) rounds each computed operand once, so the plain
// fp32 emulation is a better baseline than its design can meet (the CPU model of that design
// fails about 2 % of such checks). Its test in chunked_test.cpp passes the design's own
// emulation, reference::emulate_operands(single), as the baseline instead: same rule, same
// factor and floors. What that certifies: the kernel computes its design as well as an fp32
// evaluation of it would, within 2x; how far the design itself is from exact is what the
// accuracy judge reports (model.chunked.single and the .single kernel beside fla).
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "oracle/budget.hpp"
#include "fuzz/inputs.hpp"

namespace gdn::cuda::chunked_testbed {

struct Case {
  Problem problem;
  fuzz::InputOptions options;
  std::uint64_t seed = 0;
  Inputs inputs() const { return fuzz::make_inputs(problem, options, seed); }
  std::string describe() const;
};

// Random problems in the space the chunked kernel supports: packed varlen batches (lengths 0, 1,
// 63, 64, 65, 127, 128, 129 on purpose, short and long ones), K a multiple of 16 up to 128,
// V up to 256, GVA, every dtype and gate option, dense h0/hT on or off; contractive inputs.
// Work T * HV * K * V capped at `work_cap` (CPU reference time).
Case random_case(std::mt19937_64& rng, double work_cap = 1.2e7);

// The budget of this suite: calibrated(state_unit=input) (see the header comment).
oracle::BudgetOptions budget();
// ChunkedRounding::single's: the same with baseline=operands_single (the header comment).
oracle::BudgetOptions budget_single();
// The unit of hT's budget floor (the input dtype for bf16/fp16, else fp32).
DType state_floor_dtype(const Problem& problem);

struct Judgement {
  bool pass = false;
  double margin = 0;     // largest error / budget over the checks
  std::string details;   // every check, one per line
};

// o (and hT when the problem has it) against the exact outputs, with the budget above (or
// `options`; `emulation` is then the baseline its options name).
Judgement judge(const Problem& problem, const Inputs& inputs, const Outputs<double>& exact,
                const Outputs<double>& emulation, const Outputs<double>& actual);
Judgement judge(const Problem& problem, const Inputs& inputs, const Outputs<double>& exact,
                const Outputs<double>& baseline, const Outputs<double>& actual, const oracle::BudgetOptions& options);

// rel_rms of `actual` against `reference` over all elements (0 when both are zero).
double rel_rms(const HostTensor<double>& reference, const HostTensor<double>& actual);

}  // namespace gdn::cuda::chunked_testbed
