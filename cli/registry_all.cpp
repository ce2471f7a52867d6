#include "cli/registry_all.hpp"

#include <optional>
#include <stdexcept>

#if GDN_HAVE_CUDA_IMPLEMENTATIONS
#include "cuda/implementations/chunked_implementation.hpp"
#include "cuda/implementations/implementations.hpp"
#include "cuda/faults/planted_faults.hpp"
#endif

namespace gdn::cli {

namespace {

#if GDN_HAVE_CUDA_IMPLEMENTATIONS
template <class Kernel>
void add_kernel(oracle::Registry& registry, const char* description,
                oracle::BudgetOptions budget = oracle::BudgetOptions{},
                std::optional<oracle::BudgetOptions> backward_budget = std::nullopt) {
  oracle::RegistryEntry e;
  e.name = Kernel().name();
  e.description = description;
  e.default_budget = budget;
  e.backward_budget = backward_budget;
  e.make = [] { return std::make_unique<Kernel>(); };
  e.gpu = true;
  e.check_reproducibility = true;
  registry.add(std::move(e));
}
#endif

#if !GDN_HAVE_CUDA_IMPLEMENTATIONS
// Stands for the GPU kernels in a build without them, so that a CPU-only conformance run says
// in every table that they were not tested (SKIPPED), instead of leaving them out silently.
class NotBuiltKernels final : public Implementation {
 public:
  std::string name() const override { return "cuda (not built)"; }
  Formulation formulation() const override { return Formulation::chunked; }
  bool available(std::string* why) const override {
    if (why) *why = "this binary was built without the CUDA kernels (GDN_CUDA=OFF or no nvcc)";
    return false;
  }
  Outputs<double> run(const Problem&, const Inputs&) override {
    throw std::logic_error("cuda (not built): no kernels in this binary");
  }
};
#endif

oracle::Registry build() {
  oracle::Registry registry;
  oracle::register_references(registry);
#if !GDN_HAVE_CUDA_IMPLEMENTATIONS
  oracle::RegistryEntry placeholder;
  placeholder.name = NotBuiltKernels().name();
  placeholder.description = "the GPU kernels, absent from this build: reported SKIPPED";
  placeholder.make = [] { return std::make_unique<NotBuiltKernels>(); };
  placeholder.gpu = true;
  registry.add(std::move(placeholder));
#endif
#if GDN_HAVE_CUDA_IMPLEMENTATIONS
  add_kernel<gdn::cuda::RecurrentPrefillKernel>(registry, "CUDA recurrent prefill kernel");
  add_kernel<gdn::cuda::DecodeKernel>(registry, "CUDA decode kernel (state cache)");
  // Budgets: gdn::cuda::chunked_budget (the one the GPU testbed judges by too).
  const oracle::BudgetOptions chunked_budget = gdn::cuda::chunked_budget(gdn::cuda::ChunkedRounding::split);
  // Its backward (BackwardAlgorithm::chunked) is fp32 throughout: the default gradient budget,
  // not the forward's state_unit=input (which is for the forward's tensor-core operands).
  add_kernel<gdn::cuda::ChunkedPrefillKernel>(registry, "CUDA chunked tensor-core prefill (C = 64)", chunked_budget,
                                              oracle::BudgetOptions{});
  {
    // The sequence split (ChunkedOptions::split_chunks) with segments of one chunk: every chunk
    // boundary is a segment boundary, so every case with two or more chunks goes through the
    // affine pass and the fix-up. bf16/fp16 only (fp32 cases are reported unsupported).
    oracle::RegistryEntry e;
    gdn::cuda::ChunkedOptions split;
    split.split_chunks = 1;
    e.name = gdn::cuda::ChunkedPrefillKernel(split).name();
    e.description = "CUDA chunked prefill with the sequence split, segments of 1 chunk (bf16/fp16)";
    e.default_budget = chunked_budget;
    e.make = [split] { return std::make_unique<gdn::cuda::ChunkedPrefillKernel>(split); };
    e.gpu = true;
    e.check_reproducibility = true;
    registry.add(std::move(e));
  }
  {
    // The fused forward (ChunkedSchedule::fused, named: the default runs two passes): bf16 with
    // K > 64 at value tile 128, unsplit; other cases are reported unsupported.
    oracle::RegistryEntry e;
    gdn::cuda::ChunkedOptions fused;
    fused.value_tile = 128;
    fused.split_chunks = 0;
    fused.schedule = gdn::cuda::ChunkedSchedule::fused;
    e.name = gdn::cuda::ChunkedPrefillKernel(fused).name();
    e.description = "CUDA chunked prefill, fused forward (bf16, K > 64, V tile 128)";
    e.default_budget = chunked_budget;
    e.make = [fused] { return std::make_unique<gdn::cuda::ChunkedPrefillKernel>(fused); };
    e.gpu = true;
    e.check_reproducibility = true;
    // Not in the built-in conformance run: it takes 1 of its cases (bf16 with K > 64 and V a
    // multiple of 128 is one), too few to judge it there. Its checks are the GPU suite's: the
    // fused, two-pass and BV 64 bits on the boundary pack ([transposed]), the invariance
    // property forcing it as a layout; and the CLI fuzz by name (scripts/gpu_run.sh).
    e.in_conformance = false;
    registry.add(std::move(e));
  }
  {
    // ChunkedRounding::single, the named fast mode: every computed tensor-core operand rounded
    // once. Its budget's baseline is that design's emulation (docs/budgets.md; bf16/fp16 only, fp32
    // cases are reported unsupported).
    oracle::RegistryEntry e;
    gdn::cuda::ChunkedOptions single;
    single.rounding = gdn::cuda::ChunkedRounding::single;
    e.name = gdn::cuda::ChunkedPrefillKernel(single).name();
    e.description = "CUDA chunked prefill, single rounding (named fast mode, bf16/fp16)";
    e.default_budget = gdn::cuda::chunked_budget(gdn::cuda::ChunkedRounding::single);
    e.make = [single] { return std::make_unique<gdn::cuda::ChunkedPrefillKernel>(single); };
    e.gpu = true;
    e.check_reproducibility = true;
    registry.add(std::move(e));
  }
#endif
  return registry;
}

}  // namespace

oracle::Registry& default_registry() {
  static oracle::Registry registry = build();
  return registry;
}

void plant_kernel_fault(const std::string& name) {
#if GDN_HAVE_CUDA_IMPLEMENTATIONS
  gdn::cuda::plant_fault(name);
#else
  throw std::invalid_argument("--plant-fault " + name + ": this binary was built without the CUDA kernels");
#endif
}

std::string planted_kernel_faults() {
  std::string out;
#if GDN_HAVE_CUDA_IMPLEMENTATIONS
  if (!gdn::cuda::kernel_faults_built()) return out;
  for (const gdn::cuda::PlantedFaultInfo& f : gdn::cuda::planted_fault_list())
    out += std::string(f.name) + "\t" + f.kind + "\t" + f.kernels + "\t" + f.description + "\n";
#endif
  return out;
}

}  // namespace gdn::cli
