#include "cli/registry_all.hpp"

#if GDN_HAVE_CUDA_IMPLEMENTATIONS
#if __has_include("cuda/register.hpp")
#include "cuda/register.hpp"
#define GDN_CUDA_REGISTERS_ITSELF 1
#else
#include "cuda/implementations.hpp"
#endif
#endif

namespace gdn::cli {

namespace {

#if GDN_HAVE_CUDA_IMPLEMENTATIONS && !GDN_CUDA_REGISTERS_ITSELF
template <class Kernel>
void add_kernel(oracle::Registry& registry, const char* description) {
  oracle::RegistryEntry e;
  e.name = Kernel().name();
  e.description = description;
  e.make = [] { return std::make_unique<Kernel>(); };
  e.gpu = true;
  registry.add(std::move(e));
}
#endif

oracle::Registry build() {
  oracle::Registry registry;
  oracle::register_references(registry);
#if GDN_HAVE_CUDA_IMPLEMENTATIONS
#if GDN_CUDA_REGISTERS_ITSELF
  gdn::cuda::register_implementations(registry);
#else
  add_kernel<gdn::cuda::RecurrentPrefillKernel>(registry, "CUDA recurrent prefill kernel");
  add_kernel<gdn::cuda::DecodeKernel>(registry, "CUDA decode kernel (state cache)");
#endif
#endif
  return registry;
}

}  // namespace

oracle::Registry& default_registry() {
  static oracle::Registry registry = build();
  return registry;
}

}  // namespace gdn::cli
