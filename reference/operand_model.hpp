#pragma once
// A model of what the chunked GPU kernel's design computes (cuda/chunked_kernel.cuh, header):
// the chunked form (§4, C = 64) in fp32, with every computed tensor-core operand rounded to the
// input dtype where the kernel rounds it, either split hi + lo (the kernel: S0 in K S0 and Q S0,
// T and X in T X, the decayed Vnew in the state update; P once; Vnew once for bf16 and split
// for fp16 in P Vnew) or rounded once (every one of them, as kernels that single-round their
// operands do, fla's among them). The raw q, k, v are exact operands; the norms, gates and
// decays are fp32 scales as in the kernel; o is rounded once at the end. fp32 inputs are never
// rounded (the kernel's fp32 path has no tensor-core operands).
//
// Its sums run in fp32 in Eigen's order, not the tensor cores', so it predicts the kernel's
// error, not its bits. What it is for: deciding on the CPU whether a precision trade (fewer
// hi + lo passes, half the tensor work of the forward) keeps the conformance budgets and the
// accuracy claims, before a kernel is written for it (registry: model.chunked.split,
// model.chunked.single and model.chunked.split_state, outside `all`).
#include "core/problem.hpp"

namespace gdn::reference {

// split: the kernel's design. single: every computed operand rounded once. split_state: hi + lo
// only where the operand feeds the state (K S0, T X, the state update); Q S0, which feeds only
// o, takes S0 rounded once (a quarter of the forward's tensor work, off its serial chain).
enum class OperandRounding { split, single, split_state };

Outputs<double> emulate_operands(const Problem& problem, const Inputs& inputs, OperandRounding rounding);

}  // namespace gdn::reference
