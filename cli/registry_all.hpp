#pragma once
#include <string>

#include "oracle/registry.hpp"

namespace gdn::cli {

// The references (oracle::register_references) and, when this binary is built with CUDA, the
// CUDA layer's kernels (its gdn::cuda::register_implementations(Registry&) when cuda/register.hpp
// exists, else the adapters of cuda/implementations.hpp). GPU entries report SKIPPED without a
// device.
oracle::Registry& default_registry();

// The fault-injection campaign (cuda/faults/planted_faults.hpp): switches the named kernel
// fault on for this process. Throws std::invalid_argument naming the rule in a binary without
// the CUDA kernels or built without -DGDN_KERNEL_FAULTS=ON, and for an unknown name (listing
// the known ones).
void plant_kernel_fault(const std::string& name);
// The planted kernel faults of this binary as "name\tkind\tkernels\tdescription" lines (empty
// without the CUDA kernels or in a build without -DGDN_KERNEL_FAULTS=ON).
std::string planted_kernel_faults();

}  // namespace gdn::cli
