#pragma once
// The chunked prefill's case space and budgets, for its instantiations of the GPU suite
// (testbed.hpp: KernelTraits<ChunkedPrefillKernel>, KernelTraits<ChunkedSingleKernel>).
// Plain C++ (no nvcc).
//
// Budget (why): the oracle's calibrated model (oracle/budget.hpp, BUDGETS.md), through
// oracle::evaluate: per output, rel_rms <= 2 x the precision emulation's rel_rms + 1 u, max_abs
// <= 2 x the emulation's max_abs + 1 ulp at max|ref| (+ the arithmetic floor where that fails),
// the emulation being reference::emulate(chunked, C = 64): fp32 arithmetic, o rounded once to
// the input dtype. The unit u is the output's dtype for o (the input dtype) and for fp32
// inputs for hT too. For bf16/fp16 inputs hT is held to 1 u of the input dtype instead of
// fp32's (state_unit=input, also the CLI's default budget for cuda.chunked_prefill): the
// design the kernel implements (tensor cores on bf16/fp16 operands, like every peer) feeds the
// state products with operands in the input dtype. This kernel splits each computed operand of
// the state path into hi + lo (about 16 bits for bf16, 22 for fp16), well inside 1 u of the
// input dtype but not 1 u_f32: that would need every product emulated in fp32 (no tensor-core
// kernel does that).
// ChunkedRounding::single (a named fast mode) rounds each computed operand once, so the plain
// fp32 emulation is a better baseline than its design can meet (the CPU model of that design
// fails a few percent of such checks). Its budget takes the design's own emulation,
// reference::emulate_operands(single), as the baseline instead (baseline=operands_single):
// same rule, same factor and floors. What that certifies: the kernel computes its design as
// well as an fp32 evaluation of it would, within 2x; how far the design itself is from exact is
// what the accuracy tool reports (model.chunked.single and the .single kernel beside the peer).
#include <random>

#include "core/problem.hpp"
#include "fuzz/generators.hpp"
#include "oracle/budget.hpp"

namespace gdn::cuda::chunked_testbed {

using Case = fuzz::Case;

// A random case of the space the chunked kernel supports, fuzz::CaseSpace::chunked_prefill()
// (lengths 0, 1, 63, 64, 65, 127, 128, 129 on purpose, short and long ones, K and V multiples
// of 16, dense h0/hT; contractive inputs), drawn by the one generator (fuzz::draw_case), with
// its work T * HV * K * V capped at `work_cap` (CPU reference time).
Case random_case(std::mt19937_64& rng, double work_cap = 1.2e7);


}  // namespace gdn::cuda::chunked_testbed
