#pragma once
// The GPU conformance testbed: one set of properties, instantiated per kernel adapter
// (RecurrentPrefillKernel, DecodeKernel) through KernelTraits. Cases are drawn from seeded
// random problems in the space each kernel supports; results are tallied per kernel and
// property and written as conformance.json by the test main.
#include <cstdint>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "cuda/implementations.hpp"
#include "fuzz/inputs.hpp"

namespace gdn::cuda::testbed {

struct KernelCase {
  Problem problem;
  fuzz::InputOptions options;
  std::uint64_t seed = 0;
  Inputs inputs() const { return fuzz::make_inputs(problem, options, seed); }
  std::string describe() const;
};

// Random cases: prefill draws packed varlen batches with every option; decode draws
// fixed-length batches (Ts in 1..4) against a state cache. Work T*HV*K*V is capped so that a
// thousand cases stay within a minute or two of CPU reference time.
KernelCase random_prefill_case(std::mt19937_64& rng);
KernelCase random_decode_case(std::mt19937_64& rng);

template <class Kernel>
struct KernelTraits;
template <>
struct KernelTraits<RecurrentPrefillKernel> {
  static const char* name() { return "cuda.recurrent_prefill"; }
  static KernelCase random_case(std::mt19937_64& rng) { return random_prefill_case(rng); }
};
template <>
struct KernelTraits<DecodeKernel> {
  static const char* name() { return "cuda.decode"; }
  static KernelCase random_case(std::mt19937_64& rng) { return random_decode_case(rng); }
};
template <>
struct KernelTraits<StreamedDecodeKernel> {
  static const char* name() { return "cuda.decode_streamed"; }
  static KernelCase random_case(std::mt19937_64& rng) { return random_decode_case(rng); }
};

// The problem restricted to (and reordered as) the given sequences, with the inputs sliced to
// match; state-cache slots keep their numbers, dense states move with their sequence.
void select_sequences(const Problem& problem, const Inputs& inputs, const std::vector<int>& order,
                      Problem* out_problem, Inputs* out_inputs);

// Bitwise comparison of sequence `n` of (p, out) with sequence `m` of (q, other): o rows,
// intermediate rows and its final state (dense row or cache slot). Empty when equal, else a
// description of the first difference.
std::string compare_sequence_bits(const Problem& p, const Inputs& in, const Outputs<double>& out, int n,
                                  const Problem& q, const Inputs& qin, const Outputs<double>& other, int m);

// Exact checks beyond the tolerance: padding sequences output exactly zero (o and intermediate)
// and cache slots no sequence names come back bit for bit as they went in.
std::string check_exact_rules(const Problem& problem, const Inputs& inputs, const Outputs<double>& out);

// Tally of cases per kernel and property.
struct Count {
  std::int64_t run = 0, failed = 0, skipped = 0;
  double worst_margin = 0;  // largest error / budget seen (calibrated checks)
};
class Tally {
 public:
  static Tally& instance();
  void add(const std::string& kernel, const std::string& property, bool ran, bool failed,
           double margin = 0);
  std::map<std::string, std::map<std::string, Count>> snapshot();

 private:
  std::mutex mutex_;
  std::map<std::string, std::map<std::string, Count>> counts_;
};

// Number of random cases per property: GDN_CASES (default 50: CI runs few; the H200 run sets
// 1000 or more).
int case_count();
// Base seed: GDN_SEED (default 20261202).
std::uint64_t base_seed();
// The seed of one property of one kernel's suite: the base seed mixed with "kernel/property",
// so that each property draws its own cases and a GDN_SEED moves them all.
std::uint64_t property_seed(const std::string& kernel, const std::string& property);

}  // namespace gdn::cuda::testbed
