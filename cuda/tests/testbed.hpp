#pragma once
// The GPU testbed: one suite of properties (gpu_test.cpp), each a function template over the
// kernel adapter, instantiated for every kernel through KernelTraits: the recurrent prefill,
// the decode (general and streamed), the chunked prefill and its single-rounding mode. A
// kernel's traits say what it is named in the tally, which cases it is tested on (its case
// space), which budget the oracle holds it to, and which features it has (a dense h0 / hT,
// int64 cu_seqlens, layouts of its own whose bits must not matter). Cases are seeded random
// problems in that space; accuracy is judged by the oracle (oracle::evaluate with the
// kernel's BudgetOptions); results are tallied per kernel and property and written as one
// conformance JSON by the test main.
#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "core/problem.hpp"
#include "cuda/api/chunked_prefill.hpp"
#include "cuda/api/device_buffer.hpp"
#include "cuda/implementations/chunked_implementation.hpp"
#include "cuda/implementations/implementations.hpp"
#include "cuda/tests/chunked_testbed.hpp"
#include "fuzz/generators.hpp"
#include "oracle/budget.hpp"
#include "oracle/reproducibility.hpp"

namespace gdn::cuda::testbed {

// The one case type (problem, input options, seed; inputs made on demand).
using KernelCase = fuzz::Case;
// One line: enough to rebuild the case.
std::string describe(const KernelCase& c);

// Random cases, drawn from the one generator (fuzz::draw_case) in the kernels' spaces:
// fuzz::CaseSpace::recurrent_prefill() (packed varlen batches with every option) and
// CaseSpace::decode() (equal-length batches, Ts in 1..4, against a state cache). The space's
// work cap bounds the CPU reference time of a case.
KernelCase random_prefill_case(std::mt19937_64& rng);
KernelCase random_decode_case(std::mt19937_64& rng);

// ----- options of the suite (command-line options of cuda_gpu_tests) -------------------------

struct SuiteOptions {
  int cases = 50;                    // --cases: random cases per property (CI runs few)
  std::uint64_t seed = 20261202ull;  // --seed: base seed of every property's cases
  std::string json;                  // --json: where the conformance tally goes ("" none)
  std::string commit;                // --commit: what was built (recorded in the JSON)
  std::string command;               // --command: how it was run (recorded in the JSON)
};
SuiteOptions& suite_options();

int case_count();
std::uint64_t base_seed();
// The seed of one property of one kernel's suite: the base seed mixed with "kernel/property",
// so that each property draws its own cases and --seed moves them all.
std::uint64_t property_seed(const std::string& kernel, const std::string& property);

// ----- the kernels ---------------------------------------------------------------------------

// The chunked prefill in its named fast mode (ChunkedRounding::single) as a type of its own, so
// that the suite's templates instantiate for it.
class ChunkedSingleKernel : public ChunkedPrefillKernel {
 public:
  explicit ChunkedSingleKernel(ChunkedOptions options = {}, IndexType cu_seqlens_type = IndexType::i32)
      : ChunkedPrefillKernel(single(options), cu_seqlens_type) {}
  static ChunkedOptions single(ChunkedOptions options) {
    options.rounding = ChunkedRounding::single;
    return options;
  }
};

// What a layout choice of the kernel's own (V tiles, two V tiles) changes in the bits of a run
// with `options` on (p, inputs) that gave `packed`: "" when nothing. Every V tile the kernel
// has for this V is forced; where the launch is unsplit, two V tiles (BV 16 for the sequences
// longer than `long_after_tokens`, the automatic tile for the rest) too.
std::string chunked_layout_diff(const ChunkedOptions& options, const Problem& p, const Inputs& inputs,
                                const Outputs<double>& packed, std::int64_t long_after_tokens);

// The traits of one kernel:
//   name()                   the tally's kernel name
//   random_case(rng)         a case of its space (conformance and the bitwise properties)
//   property_case(rng)       a case for the property suite of §2 (a smaller work cap)
//   budget()                 the oracle's budget it is held to
//   make(i)                  the kernel for the i-th case of a property (options that vary
//                            per case, e.g. the single mode's sequence split)
//   make_i64()               the kernel with int64 cu_seqlens (varlen kernels)
//   bitwise_cases(n)         cases of each bitwise property at --cases n
//   min_supported(n)         of n conformance cases, how many it must support (the rest are
//                            tallied as skipped)
//   layout_diff(i, ...)      chunked_layout_diff for the chunked kernels, "" otherwise
//   dense_state              it takes a dense h0 / hT (in-place and int64 properties apply)
//   inplace_problem()        the problem of the in-place property (dense_state kernels)
//   launch(p, tensors)       its host API entry with make(0)'s options (in-place property)
//   property_tolerance_dtype the unit of the property suite's floor (the oracle's calibrated budget, state_unit=input)
template <class Kernel>
struct KernelTraits;

struct RecurrentFamilyTraits {
  static oracle::BudgetOptions budget() { return {}; }
  static int bitwise_cases(int n) { return std::max(1, n / 10); }
  static int min_supported(int) { return 0; }
  static std::string layout_diff(int, const Problem&, const Inputs&, const Outputs<double>&, std::int64_t) {
    return "";
  }
};

template <>
struct KernelTraits<RecurrentPrefillKernel> : RecurrentFamilyTraits {
  static constexpr bool dense_state = true;
  static const char* name() { return "cuda.recurrent_prefill"; }
  static KernelCase random_case(std::mt19937_64& rng) { return random_prefill_case(rng); }
  static KernelCase property_case(std::mt19937_64& rng) { return random_prefill_case(rng); }
  static RecurrentPrefillKernel make(int) { return RecurrentPrefillKernel(); }
  static RecurrentPrefillKernel make_i64() { return RecurrentPrefillKernel(IndexType::i64); }
  static Problem inplace_problem() {
    Problem p = Problem::packed({5, 0, 17, 3}, 2, 4, 100, 36);
    p.has_h0 = true;
    p.has_hT = true;
    p.state_layout = StateLayout::v_major;
    return p;
  }
  static void launch(const Problem& p, const DeviceTensors& t) { recurrent_prefill(p, t, nullptr); }
};
template <>
struct KernelTraits<DecodeKernel> : RecurrentFamilyTraits {
  static constexpr bool dense_state = false;
  static const char* name() { return "cuda.decode"; }
  static KernelCase random_case(std::mt19937_64& rng) { return random_decode_case(rng); }
  static KernelCase property_case(std::mt19937_64& rng) { return random_decode_case(rng); }
  static DecodeKernel make(int) { return DecodeKernel(); }
};
template <>
struct KernelTraits<StreamedDecodeKernel> : RecurrentFamilyTraits {
  static constexpr bool dense_state = false;
  static const char* name() { return "cuda.decode_streamed"; }
  static KernelCase random_case(std::mt19937_64& rng) { return random_decode_case(rng); }
  static KernelCase property_case(std::mt19937_64& rng) { return random_decode_case(rng); }
  static StreamedDecodeKernel make(int) { return StreamedDecodeKernel(); }
};

// The chunked prefill, default (split) rounding: every case of its space must be supported.
template <>
struct KernelTraits<ChunkedPrefillKernel> {
  static constexpr bool dense_state = true;
  static const char* name() { return "cuda.chunked_prefill"; }
  static KernelCase random_case(std::mt19937_64& rng) { return chunked_testbed::random_case(rng); }
  static KernelCase property_case(std::mt19937_64& rng) { return chunked_testbed::random_case(rng, 4e6); }
  static oracle::BudgetOptions budget() { return chunked_budget(ChunkedRounding::split); }
  static ChunkedOptions options(int) { return {}; }
  static ChunkedPrefillKernel make(int i) { return ChunkedPrefillKernel(options(i)); }
  static ChunkedPrefillKernel make_i64() { return ChunkedPrefillKernel({}, IndexType::i64); }
  static int bitwise_cases(int n) { return std::max(4, n / 10); }
  static int min_supported(int n) { return n; }
  static std::string layout_diff(int i, const Problem& p, const Inputs& in, const Outputs<double>& packed,
                                 std::int64_t long_after_tokens) {
    return chunked_layout_diff(options(i), p, in, packed, long_after_tokens);
  }
  static Problem inplace_problem() {
    Problem p = Problem::packed({70, 0, 17, 130}, 2, 4, 64, 64);
    p.input_dtype = DType::f32;
    p.has_h0 = true;
    p.has_hT = true;
    return p;
  }
  static void launch(const Problem& p, const DeviceTensors& t) { chunked_prefill(p, t, nullptr, options(0)); }
};

// ChunkedRounding::single: bf16 / fp16 only (fp32 draws of the chunked space become bf16),
// budget baseline operands_single (chunked_testbed.hpp). Every fourth case (1, 5, 9, ...) runs
// the sequence split (segments of 1 to 3 chunks) through its single-rounding affine pass; the
// bitwise properties run on a fifth of the cases.
template <>
struct KernelTraits<ChunkedSingleKernel> {
  static constexpr bool dense_state = true;
  static const char* name() { return "cuda.chunked_prefill.single"; }
  static KernelCase random_case(std::mt19937_64& rng) { return half_precision(chunked_testbed::random_case(rng)); }
  static KernelCase property_case(std::mt19937_64& rng) {
    return half_precision(chunked_testbed::random_case(rng, 4e6));
  }
  static oracle::BudgetOptions budget() { return chunked_budget(ChunkedRounding::single); }
  static ChunkedOptions options(int i) {
    ChunkedOptions o = ChunkedSingleKernel::single({});
    if (i % 4 == 1) o.split_chunks = 1 + i % 3;
    return o;
  }
  static ChunkedSingleKernel make(int i) { return ChunkedSingleKernel(options(i)); }
  static ChunkedSingleKernel make_i64() { return ChunkedSingleKernel({}, IndexType::i64); }
  static int bitwise_cases(int n) { return std::max(4, n / 5); }
  static int min_supported(int n) { return n / 2 + 1; }
  static std::string layout_diff(int i, const Problem& p, const Inputs& in, const Outputs<double>& packed,
                                 std::int64_t long_after_tokens) {
    return chunked_layout_diff(options(i), p, in, packed, long_after_tokens);
  }
  static Problem inplace_problem() {
    Problem p = KernelTraits<ChunkedPrefillKernel>::inplace_problem();
    p.input_dtype = DType::bf16;
    return p;
  }
  static void launch(const Problem& p, const DeviceTensors& t) { chunked_prefill(p, t, nullptr, options(0)); }
  static KernelCase half_precision(KernelCase c) {
    if (c.problem.input_dtype == DType::f32) c.problem.input_dtype = DType::bf16;
    return c;
  }
};

// ----- helpers of the properties --------------------------------------------------------------

// The bitwise helpers are the oracle's (oracle/reproducibility.hpp), which conformance uses too.
using oracle::bits_equal;
using oracle::check_exact_rules;
using oracle::compare_sequence_bits;
using oracle::outputs_bits_equal;
using oracle::select_sequences;

// Batch invariance of a run that gave `packed`: the pack reversed (every sequence moves) and
// one sequence alone (drawn from rng; *alone receives it) must give each sequence's bits.
// "" when they do, else the first difference.
std::string pack_diff(Implementation& kernel, const Problem& p, const Inputs& inputs, const Outputs<double>& packed,
                      std::mt19937_64& rng, int* alone);

// Device copies of a tensor in a dtype through the one codec (core/dtype_codec.hpp), and back.
DeviceBuffer<std::uint8_t> to_device(const HostTensor<double>& tensor, DType dtype);
HostTensor<double> from_device(const DeviceBuffer<std::uint8_t>& buffer, DType dtype, const Shape& shape);

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

}  // namespace gdn::cuda::testbed
