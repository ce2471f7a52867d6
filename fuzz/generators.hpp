#pragma once
// RapidCheck generators of whole test cases: a Problem, the options of make_inputs and a seed.
// The property suite, the fuzzer and `generate` (through sample_case, fuzz/sample.hpp) and the
// GPU suites (through draw_case) all draw their cases from gen_case(CaseSpace): a kernel
// restricts the space to what it supports (sizes, dtypes, features) instead of writing its own
// generator, so every consumer explores the same distribution. A Case is small (the tensors are made from the seed on demand), prints as one
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

// One generated test case: the one case type of the project's generated tests (the property
// suite, the fuzzer, `generate` and the GPU suites). Deterministic: inputs() always returns the
// same tensors.
struct Case {
  Problem problem;
  InputOptions options;
  std::uint64_t seed = 0;

  Inputs inputs() const { return make_inputs(problem, options, seed); }
  // Work of one pass of the recurrence, T * HV * K * V: what the generator's cost cap bounds.
  double work() const;
  std::int64_t longest_sequence() const;
  // operator<<'s line.
  std::string describe() const;
};

// problem.describe(), cu_seqlens, the input options and the seed on one line: a failure report
// is enough to rebuild the case (Case{problem, options, seed}.inputs()).
std::ostream& operator<<(std::ostream& out, const Case& c);
std::string describe(const InputOptions& options);

// One optional feature of the space: never drawn, drawn on or off per case, or always on.
// Converts from bool (true: sometimes, false: off), so a space reads as a set of switches and
// a feature is pinned with Feature::always.
struct Feature {
  enum Mode { off, sometimes, always };
  Mode mode = sometimes;
  constexpr Feature(bool allowed = true) : mode(allowed ? sometimes : off) {}
  constexpr Feature(Mode m) : mode(m) {}
  // Whether the feature may appear.
  constexpr explicit operator bool() const { return mode != off; }
};

// The knobs of the case distribution. Every axis is a range or a set to draw from, or a
// Feature. Defaults: everything the references support. The presets below state the spaces of
// the project's kernels; a consumer restricts a space instead of writing its own generator, so
// every consumer explores the same distribution.
struct CaseSpace {
  // Sizes. K and V are drawn from 1 to the maximum, with weight on small and odd sizes, on
  // multiples of 16 and on their neighbours (15, 17, 63, 65, 127, 129, 255, 256, ...).
  int max_K = 256;
  int max_V = 256;
  // K (V) is a multiple of this (rounded up, at most the largest multiple <= max_K): for kernels
  // that take only some head sizes (the chunked prefill: multiples of 16), so that their cases
  // are not almost all SKIPPED. 1: any size.
  int K_multiple = 1;
  int V_multiple = 1;
  int max_H = 3;              // query/key heads, 1..max_H
  int max_group = 3;          // value heads per query/key head (GVA), HV = H * group, 1..max_group
  int max_sequences = 5;      // N, 1..max_sequences
  std::int64_t max_tokens = 2048;  // T, hard cap
  // The chunk size of the implementation under test: sequence lengths 0, 1, C-1, C, C+1,
  // 2C-1, 2C, 2C+1 and long ones (2C to long_chunks * C) are drawn on purpose, since chunk
  // boundaries are where kernels break.
  int chunk_size = 64;
  int long_chunks = 4;
  // Every sequence of a case gets the same length, drawn from [min_length, max_length] (half
  // the cases min_length): a decode batch of N sequences of a few tokens each.
  bool equal_lengths = false;
  std::int64_t min_length = 0;  // also the least length of a varied sequence
  std::int64_t max_length = 0;  // 0: no per-sequence cap beyond max_tokens and the work budget
  // Cost bound: T * HV * K * V is at most max_work * (size + 1) / 101 for RapidCheck's size
  // (0..100), drawn log-uniformly below that, so a run of hundreds of cases is dominated by
  // a few large ones and stays fast, while small sizes give the shrinker small cases.
  double max_work = 3.0e6;
  double min_work = 256.0;

  // Features.
  Feature l2norm = true;
  // With l2norm, a quarter of the cases in the small-norm regime (InputOptions::small_norms:
  // q/k rows of norm 1e-5 to 1e-2 and exactly zero, where the l2norm epsilon decides).
  Feature small_norms = true;
  Feature initial_state = true;        // has_h0
  Feature final_state = true;          // has_hT
  Feature v_major = true;              // state layout (off: k_major only)
  Feature state_cache = true;          // slots with -1 padding instead of dense states
  int max_extra_slots = 2;             // a cache holds N + 0..max_extra_slots slots
  // Per-token states (sequential formulation only): on by default, so that every consumer whose
  // implementation produces them tests them; the chunked presets switch them off.
  Feature intermediate_states = true;
  Feature fused_gates = true;          // A_log, dt_bias, a, b
  Feature negative_eigenvalues = true; // beta in [0, 2): direct beta_max = 2, or fused 2 sigmoid
  Feature gva = true;                  // HV > H
  // Scale other than 1/sqrt(K): 1, 1/2, 1/8, and with continuous_scale any of [0.05, 1] too
  // (not a power of two: a kernel that applies the scale in a narrow dtype shows it).
  Feature explicit_scale = true;
  bool continuous_scale = false;
  // Raw N(0,1) keys without l2norm: |k|^2 ~ K, the recurrence can grow (valid input, but no
  // contractive error budget applies). Off by default.
  Feature raw_keys = false;
  std::vector<DType> input_dtypes{DType::f32, DType::bf16, DType::f16};
  Feature gate_in_input_dtype = true;  // gate_dtype may be the input dtype (else always f32)
  std::vector<GateRegime> regimes{GateRegime::no_decay, GateRegime::mild, GateRegime::strong,
                                  GateRegime::underflow};
  // Storage dtype of the states (Problem::state_dtype): f32, bf16, f16. A set of one (the
  // default, f32) draws nothing, so the cases of every other space are unchanged bit for bit.
  std::vector<DType> state_dtypes{DType::f32};
  // What direct gates hold (Problem::gate_space): log (g) and/or linear (alpha = exp(g), drawn
  // as round(exp(g)) from the same regimes). Fused gates are always log space; a set without
  // log gives every case direct gates. A set of one draws nothing.
  std::vector<GateSpace> gate_spaces{GateSpace::log};

  // Pinned axes: a kernel's support matrix stated as sets (K = V = 128 only, H in {2, 4}, ...).
  // Each set, when not empty, replaces the draw of its axis by a uniform choice from the set;
  // empty (the default) leaves the draw above unchanged, bit for bit.
  // K_values (V_values) replaces max_K and K_multiple (max_V, V_multiple): when the lengths are
  // drawn first, only the values that fit the case's work budget are chosen from (the smallest
  // value when none fits).
  std::vector<int> K_values, V_values;
  std::vector<int> H_values;      // replaces max_H
  std::vector<int> group_values;  // HV / H; replaces max_group and gva
  int min_sequences = 1;          // N in [min_sequences, max_sequences]
  // Every sequence length drawn from this set (with equal_lengths, one draw for the batch);
  // replaces the chunk-boundary lengths, min_length, max_length and the work budget's cut
  // (max_tokens still caps T: lengths beyond what is left become what is left).
  std::vector<std::int64_t> length_values;
  // The explicit scales to draw from when explicit_scale draws one; replaces 1, 1/2, 1/8 and
  // continuous_scale.
  std::vector<double> scale_values;
  // Padding sequences (state_indices -1) in a state cache: sometimes draws a padding fraction
  // of 0, 1/4 or 1/2, always 1/4 or 1/2, off 0.
  Feature padding = true;

  // Presets.
  static CaseSpace everything() { return {}; }
  // What reference::chunked supports (everything but per-token intermediate states).
  static CaseSpace chunked(int chunk_size);
  // The CUDA kernels' spaces (their GPU suites draw from these):
  // cuda.recurrent_prefill: packed varlen batches of up to 6 sequences (0 to a few hundred
  // tokens), H up to 4, group up to 4, K and V in [1, 256], dense states or a cache with
  // padding, per-token states, every dtype, gate and scale option; contractive inputs.
  static CaseSpace recurrent_prefill();
  // cuda.decode (and its streamed variant): N in 1..8 sequences of one length in 1..4 against a
  // state cache (N + 0..4 slots, padding rows), per-token states, the rest as the prefill's.
  static CaseSpace decode();
  // cuda.chunked_prefill: K a multiple of 16 up to 128, V a multiple of 16 up to 256, lengths
  // around 1, 2 chunks of 64 and up to 5 chunks, dense k_major h0/hT only, no per-token states.
  static CaseSpace chunked_prefill();
};

// Throws std::invalid_argument naming the field when the space is empty or inconsistent (no
// dtype, no regime, maxima below 1, a pinned value out of range).
void check_space(const CaseSpace& space);

// Generates cases from the space. Throws std::invalid_argument for an empty space (no dtype,
// no regime, maxima below 1): check_space.
rc::Gen<Case> gen_case(const CaseSpace& space);

// A dimension (K or V) in [1, limit] with the weighting described at CaseSpace.
rc::Gen<int> gen_head_size(int limit);

// Sequence lengths for chunk size C: 0, 1, C-1, C, C+1, 2C-1, 2C, 2C+1, short, long
// (2C..long_chunks C), any; clamped to [0, limit].
rc::Gen<std::int64_t> gen_sequence_length(int chunk_size, std::int64_t limit, int long_chunks = 4);

}  // namespace gdn::fuzz
