#pragma once
// RapidCheck generators of whole test cases: a Problem, the options of make_inputs and a seed.
// The property suite of the references, the fuzzer and the GPU conformance suite all draw their
// cases from gen_case(CaseSpace): a kernel restricts the space to what it supports (sizes,
// dtypes, features) instead of writing its own generator, so every consumer explores the same
// distribution. A Case is small (the tensors are made from the seed on demand), prints as one
// readable line, and shrinks: RapidCheck reduces sizes, lengths and features toward the
// simplest case that still fails.
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include <rapidcheck.h>

#include "core/problem.hpp"
#include "fuzz/inputs.hpp"

namespace gdn::fuzz {

// One generated test case. Deterministic: inputs() always returns the same tensors.
struct Case {
  Problem problem;
  InputOptions options;
  std::uint64_t seed = 0;

  Inputs inputs() const { return make_inputs(problem, options, seed); }
  // Work of one pass of the recurrence, T * HV * K * V: what the generator's cost cap bounds.
  double work() const;
  std::int64_t longest_sequence() const;
};

// problem.describe(), cu_seqlens, the input options and the seed on one line: a failure report
// is enough to rebuild the case (Case{problem, options, seed}.inputs()).
std::ostream& operator<<(std::ostream& out, const Case& c);
std::string describe(const InputOptions& options);

// The knobs of the case distribution. Defaults: everything the references support.
struct CaseSpace {
  // Sizes. K and V are drawn from 1 to the maximum, with weight on small and odd sizes, on
  // multiples of 16 and on their neighbours (15, 17, 63, 65, 127, 129, 255, 256, ...).
  int max_K = 256;
  int max_V = 256;
  // K is a multiple of this (rounded up, at most the largest multiple <= max_K): for kernels
  // that take only some head sizes (the chunked prefill: multiples of 16), so that their fuzz
  // cases are not almost all SKIPPED. 1: any K.
  int K_multiple = 1;
  int max_H = 3;              // query/key heads
  int max_group = 3;          // value heads per query/key head (GVA), HV = H * group
  int max_sequences = 5;      // N
  std::int64_t max_tokens = 2048;  // T, hard cap
  // The chunk size of the implementation under test: sequence lengths 0, 1, C-1, C, C+1 and
  // long ones (2C to 4C) are drawn on purpose, since chunk boundaries are where kernels break.
  int chunk_size = 64;
  // Cost bound: T * HV * K * V is at most max_work * (size + 1) / 101 for RapidCheck's size
  // (0..100), drawn log-uniformly below that, so a run of hundreds of cases is dominated by
  // a few large ones and stays fast, while small sizes give the shrinker small cases.
  double max_work = 3.0e6;
  double min_work = 256.0;

  // Features that may appear (each is drawn on or off per case when allowed).
  bool l2norm = true;
  bool initial_state = true;        // has_h0
  bool final_state = true;          // has_hT
  bool v_major = true;              // state layout
  bool state_cache = true;          // slots with -1 padding instead of dense states
  bool intermediate_states = false; // per-token states (sequential formulation only)
  bool fused_gates = true;          // A_log, dt_bias, a, b
  bool negative_eigenvalues = true; // beta in [0, 2): direct beta_max = 2, or fused 2 sigmoid
  bool gva = true;                  // HV > H
  bool explicit_scale = true;       // scale other than 1/sqrt(K)
  // Raw N(0,1) keys without l2norm: |k|^2 ~ K, the recurrence can grow (valid input, but no
  // contractive error budget applies). Off by default.
  bool raw_keys = false;
  std::vector<DType> input_dtypes{DType::f32, DType::bf16, DType::f16};
  bool gate_in_input_dtype = true;  // gate_dtype may be the input dtype (else always f32)
  std::vector<GateRegime> regimes{GateRegime::no_decay, GateRegime::mild, GateRegime::strong,
                                  GateRegime::underflow};

  // Presets.
  static CaseSpace everything() { return {}; }
  // What reference::chunked supports (everything but per-token intermediate states).
  static CaseSpace chunked(int chunk_size);
};

// Generates cases from the space. Throws std::invalid_argument for an empty space (no dtype,
// no regime, maxima below 1).
rc::Gen<Case> gen_case(const CaseSpace& space);

// A dimension (K or V) in [1, limit] with the weighting described at CaseSpace.
rc::Gen<int> gen_head_size(int limit);

// Sequence lengths for chunk size C: 0, 1, C-1, C, C+1, short, long (2C..4C), any.
rc::Gen<std::int64_t> gen_sequence_length(int chunk_size, std::int64_t limit);

}  // namespace gdn::fuzz
