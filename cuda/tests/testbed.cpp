#include "cuda/tests/testbed.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <sstream>

#include "core/dtype_codec.hpp"
#include "fuzz/sample.hpp"

namespace gdn::cuda::testbed {

std::string describe(const KernelCase& c) {
  std::ostringstream s;
  s << c;
  return s.str();
}

KernelCase random_prefill_case(std::mt19937_64& rng) {
  return fuzz::draw_case(rng(), fuzz::CaseSpace::recurrent_prefill());
}

KernelCase random_decode_case(std::mt19937_64& rng) {
  return fuzz::draw_case(rng(), fuzz::CaseSpace::decode());
}

std::string pack_diff(Implementation& kernel, const Problem& p, const Inputs& inputs, const Outputs<double>& packed,
                      std::mt19937_64& rng, int* alone) {
  std::string diff = oracle::reversed_pack_diff(kernel, p, inputs, packed);
  if (!diff.empty()) diff = "reversed pack, " + diff;
  *alone = std::uniform_int_distribution<int>(0, p.N() - 1)(rng);
  Problem ap;
  Inputs ai;
  select_sequences(p, inputs, {*alone}, &ap, &ai);
  const Outputs<double> single = kernel.run(ap, ai);
  if (diff.empty()) {
    diff = compare_sequence_bits(p, inputs, packed, *alone, ap, ai, single, 0);
    if (!diff.empty()) diff = "sequence " + std::to_string(*alone) + " alone: " + diff;
  }
  return diff;
}

std::string chunked_layout_diff(const ChunkedOptions& options, const Problem& p, const Inputs& inputs,
                                const Outputs<double>& packed, std::int64_t long_after_tokens) {
  for (int tile : {16, 32, 64, 128}) {
    // Tile 128 twice where the fused forward runs it (ChunkedSchedule): as given, then fused.
    for (const ChunkedSchedule schedule : {options.schedule, ChunkedSchedule::fused}) {
      if (schedule == ChunkedSchedule::fused && (tile != 128 || options.schedule == ChunkedSchedule::fused)) continue;
      ChunkedOptions forced_options = options;
      forced_options.value_tile = tile;
      forced_options.schedule = schedule;
      ChunkedPrefillKernel forced(forced_options);
      if (!forced.supports(p, nullptr)) continue;
      if (!outputs_bits_equal(packed, forced.run(p, inputs)))
        return "value tile " + std::to_string(tile) + (schedule == ChunkedSchedule::fused ? " (fused)" : "") +
               " changes bits";
    }
  }
  // Two V tiles (two output launches on two streams) need an unsplit launch (an explicit 0, or
  // the default split by the heads that leaves this problem whole); then they must give its bits.
  if (chunked_fixed_split(p, options.split_chunks) == 0 && options.debug == nullptr) {
    ChunkedOptions two_tiles = options;
    two_tiles.split_chunks = 0;
    two_tiles.value_tile = 0;
    two_tiles.long_value_tile = 16;
    two_tiles.long_above_chunks = (long_after_tokens + kChunkSize - 1) / kChunkSize;
    ChunkedPrefillKernel two(two_tiles);
    if (two.supports(p, nullptr) && !outputs_bits_equal(packed, two.run(p, inputs)))
      return "two V tiles (16 above " + std::to_string(two_tiles.long_above_chunks) + " chunks) change bits";
  }
  return "";
}

DeviceBuffer<std::uint8_t> to_device(const HostTensor<double>& tensor, DType dtype) {
  return DeviceBuffer<std::uint8_t>(encode_tensor(tensor, dtype));
}

HostTensor<double> from_device(const DeviceBuffer<std::uint8_t>& buffer, DType dtype, const Shape& shape) {
  const std::vector<std::uint8_t> bytes = buffer.download();
  return decode_tensor(bytes.data(), bytes.size(), dtype, shape);
}

Tally& Tally::instance() {
  static Tally tally;
  return tally;
}

void Tally::add(const std::string& kernel, const std::string& property, bool ran, bool failed, double margin) {
  std::lock_guard<std::mutex> lock(mutex_);
  Count& c = counts_[kernel][property];
  if (ran) ++c.run;
  else ++c.skipped;
  if (failed) ++c.failed;
  c.worst_margin = std::max(c.worst_margin, margin);
}

std::map<std::string, std::map<std::string, Count>> Tally::snapshot() {
  std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

SuiteOptions& suite_options() {
  static SuiteOptions options;
  return options;
}

int case_count() { return suite_options().cases; }

std::uint64_t base_seed() { return suite_options().seed; }

std::uint64_t property_seed(const std::string& kernel, const std::string& property) {
  return base_seed() ^ (std::hash<std::string>{}(kernel + "/" + property) & 0xffffffffull);
}

}  // namespace gdn::cuda::testbed
