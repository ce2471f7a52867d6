#pragma once
// Size limits of a case file: what a case will cost is estimated from its problem alone (the
// header), before any tensor is decoded or any reference runs, so that a small file describing
// a huge problem is refused at once instead of exhausting memory or time. The model and the
// defaults: docs/case_files.md, "Size limits".
#include <cstdint>
#include <string>

#include "core/implementation.hpp"
#include "core/problem.hpp"

namespace gdn::oracle {

struct CaseLimits {
  // Estimated peak memory, in bytes, of reading one case and judging it (the file, the inputs,
  // the outputs read, the double reference, the emulation and the passes beside them).
  std::uint64_t max_bytes = kDefaultMaxBytes;
  // Estimated work of one reference run, in state-element updates:
  // (T + states) * HV * K * V, plus T * HV * min(C, longest sequence) * (K + V) when chunked.
  std::uint64_t max_work = kDefaultMaxWork;

  // Defaults: far above every built-in, generated and fuzzed case (the largest, the chunked
  // accuracy study's, needs about 0.6 GB and 7.5e8 updates), well below what a workstation
  // can hold, and a reference run of a few seconds.
  static constexpr std::uint64_t kDefaultMaxBytes = std::uint64_t(4) << 30;  // 4 GiB
  static constexpr std::uint64_t kDefaultMaxWork = std::uint64_t(1) << 32;   // about 4.3e9
};

// Saturating estimates (a value that does not fit is UINT64_MAX: over any limit).
struct CaseCost {
  std::uint64_t bytes = 0;
  std::uint64_t work = 0;
};

// The cost of judging `problem` in `formulation` (chunk_size for chunked), from a file of
// file_bytes bytes; `backward`: the file holds the backward's inputs (in.dO), so the exact
// backward, its term magnitudes and the emulated backward are computed too. Needs a problem
// that passed Problem::validate().
CaseCost estimate_cost(const Problem& problem, Formulation formulation, int chunk_size, std::uint64_t file_bytes,
                       bool backward = false);

// Empty when `cost` is within `limits`; else why not: the estimate, the limit it exceeds, and
// how to raise it (CaseLimits::max_bytes / max_work; gdn-testbed's --max-case-bytes /
// --max-case-work).
std::string exceeded_limit(const CaseCost& cost, const CaseLimits& limits);

}  // namespace gdn::oracle
