#pragma once
// gdn::Implementation adapters over the CUDA kernels: the property suite, the conformance run
// and the fuzzer see the kernels through these. run() uploads the Inputs in the problem's
// dtypes, launches, downloads and widens to double. Every device buffer is surrounded by
// canary bytes checked after the launch, outputs are pre-filled with NaN (an element the kernel
// does not write stays NaN and fails any comparison), and with a state cache that is not written
// back (has_hT false) the cache is checked unchanged bit for bit. A violated check throws
// std::runtime_error.
#include <string>

#include "core/implementation.hpp"
#include "cuda/api/api.hpp"
#include "cuda/api/backward.hpp"

namespace gdn::cuda {

enum class Entry { recurrent_prefill, decode };

// A CUDA backward (cuda/api/backward.hpp) on host inputs, with the adapters' guards: every
// gradient and the workspace start as NaN (0xFF bytes), canaries around every buffer. Shared by
// the recurrent prefill's adapter (sequential) and the chunked prefill's (chunked).
bool device_backward_supports(const Problem& problem, BackwardAlgorithm algorithm, std::string* why);
Gradients<double> run_device_backward(const Problem& problem, const Inputs& inputs, const BackwardInputs& cotangents,
                                      IndexType cu_seqlens_type, BackwardAlgorithm algorithm);

class KernelAdapter : public Implementation {
 public:
  explicit KernelAdapter(Entry entry, IndexType cu_seqlens_type = IndexType::i32,
                         LaunchOptions options = {})
      : entry_(entry), cu_seqlens_type_(cu_seqlens_type), options_(options) {}
  std::string name() const override;
  Formulation formulation() const override { return Formulation::sequential; }
  bool available(std::string* why) const override { return device_available(why); }
  bool supports(const Problem& problem, std::string* why) const override;
  Outputs<double> run(const Problem& problem, const Inputs& inputs) override;

  // The recurrent prefill's backward (cuda/api/backward.hpp): the sequential adjoint, so its
  // calibrated baseline is the sequential backward's fp32 emulation. Decode has none.
  bool has_backward() const override { return entry_ == Entry::recurrent_prefill; }
  Formulation backward_formulation() const override { return Formulation::sequential; }
  bool supports_backward(const Problem& problem, std::string* why) const override;
  Gradients<double> backward(const Problem& problem, const Inputs& inputs, const BackwardInputs& cotangents) override;

 private:
  Entry entry_;
  IndexType cu_seqlens_type_;
  LaunchOptions options_;
};

// Distinct types so that test templates can be instantiated per kernel.
class RecurrentPrefillKernel : public KernelAdapter {
 public:
  explicit RecurrentPrefillKernel(IndexType cu_seqlens_type = IndexType::i32, LaunchOptions options = {})
      : KernelAdapter(Entry::recurrent_prefill, cu_seqlens_type, options) {}
};

class DecodeKernel : public KernelAdapter {
 public:
  DecodeKernel() : KernelAdapter(Entry::decode) {}
};

// Decode with the streamed kernel wherever it applies (LaunchOptions::streamed_decode): the
// random cases' small batches would otherwise run the general kernel.
class StreamedDecodeKernel : public KernelAdapter {
 public:
  StreamedDecodeKernel() : KernelAdapter(Entry::decode, IndexType::i32, streamed_options()) {}

 private:
  static LaunchOptions streamed_options() {
    LaunchOptions options;
    options.streamed_decode = true;
    return options;
  }
};

}  // namespace gdn::cuda
