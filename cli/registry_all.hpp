#pragma once
#include "oracle/registry.hpp"

namespace gdn::cli {

// The references (oracle::register_references) and, when this binary is built with CUDA, the
// CUDA layer's kernels (its gdn::cuda::register_implementations(Registry&) when cuda/register.hpp
// exists, else the adapters of cuda/implementations.hpp). GPU entries report SKIPPED without a
// device.
oracle::Registry& default_registry();

}  // namespace gdn::cli
