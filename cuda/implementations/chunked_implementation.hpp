#pragma once
// gdn::Implementation adapter over the chunked prefill (the conformance suite, the properties
// and the fuzzer see the kernel through it), with the same guards as the recurrent adapters
// (cuda/implementations.hpp): canary bytes around every device buffer, outputs pre-filled with
// NaN (0xFF bytes) so an element the kernel does not write fails any comparison. A violated
// guard throws std::runtime_error.
#include <string>

#include "core/implementation.hpp"
#include "oracle/budget.hpp"
#include "cuda/api/chunked_prefill.hpp"
#include "reference/chunked.hpp"

namespace gdn::cuda {

// The kernel's debug intermediates of one run, laid out as the reference's ChunkTrace (records
// in order of sequence, value head, chunk; each trimmed to the chunk's length c). Only the
// fields the kernel forms are filled: A, T, Vnew, S0, S_end (W and U are never formed: the
// kernel computes Vnew = T X with X = diag(beta)(V - diag(e^gamma) K S0), the same algebra).
using KernelTrace = reference::ChunkTrace<double>;

// The budget this kernel is judged by, wherever it is judged (the CLI's registry, the GPU
// testbed): the oracle's calibrated model (docs/budgets.md) with hT's floor in 1 u of the input
// dtype (state_unit=input), because its state products take tensor-core operands in the input
// dtype, as every peer's do. ChunkedRounding::single rounds each computed operand once, by
// design; its baseline is that design's own emulation (baseline=operands_single), so the budget
// certifies the kernel computes its design as well as an fp32 evaluation of it would.
oracle::BudgetOptions chunked_budget(ChunkedRounding rounding);

class ChunkedPrefillKernel : public Implementation {
 public:
  explicit ChunkedPrefillKernel(ChunkedOptions options = {}, IndexType cu_seqlens_type = IndexType::i32)
      : options_(options), cu_seqlens_type_(cu_seqlens_type) {}
  std::string name() const override;
  Formulation formulation() const override { return Formulation::chunked; }
  int chunk_size() const override { return kChunkSize; }
  bool available(std::string* why) const override { return device_available(why); }
  bool supports(const Problem& problem, std::string* why) const override;
  Outputs<double> run(const Problem& problem, const Inputs& inputs) override;
  // The chunked backward (cuda/api/backward.hpp, BackwardAlgorithm::chunked): the adjoint of
  // the WY form in chunks of 64, so its calibrated baseline is the chunked backward's fp32
  // emulation at chunk size 64. It does not depend on the forward's rounding mode or tiling;
  // only the default entry (cuda.chunked_prefill, and its .cu64 twin) carries it, so that a
  // conformance run of every entry judges it once.
  bool has_backward() const override;
  Formulation backward_formulation() const override { return Formulation::chunked; }
  bool supports_backward(const Problem& problem, std::string* why) const override;
  Gradients<double> backward(const Problem& problem, const Inputs& inputs, const BackwardInputs& cotangents) override;
  // run() with the debug mode on: *trace receives the kernel's per-chunk intermediates.
  Outputs<double> run_traced(const Problem& problem, const Inputs& inputs, KernelTrace* trace);

 private:
  Outputs<double> run_impl(const Problem& problem, const Inputs& inputs, KernelTrace* trace);
  ChunkedOptions options_;
  IndexType cu_seqlens_type_;
};

}  // namespace gdn::cuda
