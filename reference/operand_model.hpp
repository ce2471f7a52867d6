#pragma once
// A model of what the chunked GPU kernel's design computes (cuda/chunked/chunked_kernel.cuh, header):
// the chunked form (§4, C = 64) in fp32, with every computed tensor-core operand rounded to the
// input dtype where the kernel rounds it, either split hi + lo (the kernel, split_all: S0 in
// K S0 and Q S0, T and X in T X, the decayed Vnew in the state update, Vnew and P in P Vnew)
// or rounded once (every one of them, as kernels that single-round their
// operands do, fla's among them). The raw q, k, v are exact operands; the norms, gates and
// decays are fp32 scales as in the kernel; o is rounded once at the end. fp32 inputs are never
// rounded (the kernel's fp32 path has no tensor-core operands).
//
// Its sums run in fp32 in Eigen's order, not the tensor cores', so it predicts the kernel's
// error, not its bits. What it is for: deciding on the CPU whether a precision trade (fewer
// hi + lo passes, half the tensor work of the forward) keeps the conformance budgets and the
// accuracy claims, before a kernel is written for it (registry: model.chunked.split,
// model.chunked.single, model.chunked.split_state, .split_state_pv and .s0_once, outside `all`;
// model.chunked.split_all, the kernel's design, in it).
#include "core/problem.hpp"

namespace gdn::reference {

// split: the kernel's earlier design: every computed operand of the state path hi + lo, S0 in
// Q S0 too, Vnew once in P Vnew for bf16 (hi + lo for fp16). On rare cases where P Vnew
// cancels, its bf16 o exceeds the GPU suite's conformance budget; the model reproduces those
// failures, which is why the kernel moved to split_state_pv.
// single: every computed operand rounded once. split_state: hi + lo only where the operand
// feeds the state (K S0, T X, the state update); Q S0, which feeds only o, takes S0 rounded
// once (an eighth of the forward's tensor work, off its serial chain).
// split_state_pv: the kernel's design before split_all: split_state with Vnew hi + lo
// in P Vnew for bf16 too: hT as split's, o safer where P Vnew cancels (60 wgmma a warpgroup per
// chunk at K 128 instead of 64).
// s0_once: S0 rounded once in both S0 products, Vnew hi + lo in P Vnew (52 wgmma; the state
// keeps about 12 bits, not 16): a design studied, not built.
// single_qk: single, with the l2-normalised q and k stored in the input dtype and used as the
// operands of every q and k product (K S0, K K^T, Q K^T, Q S0, the state update) instead of the
// raw q, k with fp32 norm scales. This is what fla's chunk kernels (Triton and its FlashQLA
// backend) and FlashQLA do: they normalise q and k in a pass of their own (x * rstd in fp32,
// stored in x's dtype: fla/modules/norm/l2norm.py, flash_qla/utils/math.py) before the chunk
// kernels run. Where q . k cancels, the stored vectors' rounding is most of o's error. Without
// use_qk_l2norm it is single (for fp32 inputs the normalised vectors are the fp32 operands).
// split_all: the kernel's design now. Every computed operand hi + lo wherever it enters a
// product (S0 in both S0 products, T and X, the decayed Vnew, Vnew and P in P Vnew):
// split_state_pv with S0 lo back in Q S0 and P split. The CLI fuzz found bf16 cases (K 16) where
// split_state_pv's S0 rounded once in Q S0 took o past its budget, and an fp16 one and later a
// bf16 one (K 16, beta up to 2, no decay) where P rounded once did; split_all passes them
// (python/tests/test_peer_findings.py).
// split_all_p_once: the design before, split_all with bf16's P rounded once in P Vnew (fp16's
// split). It reproduces the kernel's error on that bf16 case; it stays to show why P is split.
enum class OperandRounding { split, single, split_state, split_state_pv, s0_once, single_qk, split_all, split_all_p_once };

// How T = (I + A)^-1 is formed (bf16 / fp16 inputs). fp32: forward substitution in fp32, as the
// kernel's prepass does on the CUDA cores. The others model a kernel that inverts on the tensor
// cores: the 16 x 16 diagonal blocks by fp32 forward substitution, then the off-diagonal blocks by
// distance from the diagonal, T_IJ = -T_II (sum_{K = J}^{I - 1} A_IK T_KJ), every product's two
// operands rounded as named, accumulated in fp32: once (to the input dtype), split (hi + lo in
// the input dtype, three products), tf32 (TF32 once, cvt.rna). The issue 32 question: can a fused
// forward move T off the CUDA cores and keep the budgets (experimental/chunked_model_study).
enum class TMerge { fp32, once, split, tf32 };
const char* t_merge_name(TMerge merge);

// Which computed operands go in as hi + lo (bf16 / fp16 inputs; the rest are rounded once).
struct OperandSplits {
  bool s0_in_ks = true;   // S0 in X = K S0 (the state's chain)
  bool s0_in_qs = true;   // S0 in O = Q S0 (o only)
  bool t = true;          // T in T X: T lo X hi
  bool x = true;          // X in T X: T hi X lo
  bool vnew_d = true;     // the decayed Vnew in the state update
  bool vnew_in_pv = false;  // Vnew in P Vnew (split: fp16 only)
  bool p = false;           // P in P Vnew: P lo Vnew hi after P Vnew hi + lo
  // Not a split: the l2-normalised q, k rounded to the input dtype and used as the operands
  // (single_qk); false: raw q, k operands with the norms as fp32 scales, as our kernel does.
  bool qk_stored = false;
  // fp16 only, not a split: the state update's exponent, as the kernel's prepass sets it
  // (cuda/chunked/chunked_kernel.cuh, rescale_state_update): e_end and the chunk decay at 2^m,
  // m bringing the largest e_end of a nonzero key into [1, 2), zero keys' rows at 0 when m > 0,
  // the updated state times 2^-m. Without it the decayed Vnew flushes below fp16's range where
  // the chunk's last keys are zero after strong decays, and the state with it (the kernel's
  // fp16 defect before the fix). On in the presets of our kernel's designs (split, split_state,
  // split_state_pv, s0_once, split_all); single and single_qk model other kernels and keep the
  // flush.
  bool scaled_state_update = false;
  // Not a split of an operand: how T is formed (TMerge above); fp32 in every preset.
  TMerge t_merge = TMerge::fp32;
  // The presets: split (vnew_in_pv for fp16 only), every operand once, split with S0 hi only
  // in Q S0, that with Vnew split in P Vnew (the kernel's design), s0_once, and single_qk
  // (every operand once, q and k normalised and stored).
  static OperandSplits of(OperandRounding rounding, DType dtype);
};

Outputs<double> emulate_operands(const Problem& problem, const Inputs& inputs, OperandRounding rounding);
Outputs<double> emulate_operands(const Problem& problem, const Inputs& inputs, const OperandSplits& splits);

}  // namespace gdn::reference
