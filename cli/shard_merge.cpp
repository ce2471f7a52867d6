// merge_results (cli/campaign.hpp): its own file so that the merge fuzz target (merge_fuzz.cpp)
// can build it without the campaign.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>

#include "cli/campaign.hpp"

namespace gdn::cli {

namespace {

// Checked reads of one shard's results: each throws std::invalid_argument naming the file and
// the key, so a missing or mistyped field rejects the file instead of reading past it.
struct ShardReader {
  const nlohmann::json& j;
  std::string name;
  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument("merge: " + name + ": " + what);
  }
  const nlohmann::json& at(const nlohmann::json& object, const char* key, const std::string& where) const {
    if (!object.is_object()) fail(where + " is not an object");
    const auto it = object.find(key);
    if (it == object.end()) fail("lacks '" + where + (where.empty() ? "" : ".") + key + "'");
    return *it;
  }
  std::string string(const nlohmann::json& object, const char* key, const std::string& where = "") const {
    const nlohmann::json& v = at(object, key, where);
    if (!v.is_string()) fail("'" + where + (where.empty() ? "" : ".") + key + "' is not a string");
    return v.get<std::string>();
  }
  std::int64_t integer(const nlohmann::json& object, const char* key, std::int64_t low, std::int64_t high,
                       const std::string& where = "") const {
    const nlohmann::json& v = at(object, key, where);
    const std::string full = where + (where.empty() ? "" : ".") + key;
    if (!v.is_number_integer()) fail("'" + full + "' is not an integer");
    const bool is_unsigned = v.is_number_unsigned();
    if (is_unsigned ? v.get<std::uint64_t>() > static_cast<std::uint64_t>(high) : v.get<std::int64_t>() < low ||
                                                                                      v.get<std::int64_t>() > high)
      fail("'" + full + "' = " + v.dump() + " is outside [" + std::to_string(low) + ", " + std::to_string(high) + "]");
    return v.get<std::int64_t>();
  }
  double seconds(const nlohmann::json& object, const char* key) const {
    const nlohmann::json& v = at(object, key, "");
    if (!v.is_number() || !(v.get<double>() >= 0) || !std::isfinite(v.get<double>()))
      fail(std::string("'") + key + "' is not a finite number >= 0");
    return v.get<double>();
  }
  const nlohmann::json& typed(const nlohmann::json& object, const char* key, nlohmann::json::value_t type,
                              const char* type_name) const {
    const nlohmann::json& v = at(object, key, "");
    if (v.type() != type) fail(std::string("'") + key + "' is not " + type_name);
    return v;
  }
};

constexpr std::int64_t kMaxCount = std::int64_t(1) << 53;  // exact in a double, far beyond any campaign

}  // namespace

nlohmann::json merge_results(const std::vector<nlohmann::json>& shards, const std::vector<std::string>& names) {
  if (shards.empty()) throw std::invalid_argument("merge: no shard results given");
  using value_t = nlohmann::json::value_t;
  nlohmann::json out;
  out["format"] = "gdn-fuzz-merged/1";
  out["shards"] = nlohmann::json::array();
  out["failures"] = nlohmann::json::array();
  out["tallies"] = nlohmann::json::object();
  std::int64_t cases = 0, failures_total = 0, failures_not_saved = 0, count = 0;
  double seconds = 0, max_seconds = 0;
  std::set<std::int64_t> seen;
  // What makes shards parts of one campaign: recorded from the first, compared with the rest.
  std::string seed, budget;
  nlohmann::json implementations, cases_limit;
  bool backward = false;
  for (std::size_t n = 0; n < shards.size(); ++n) {
    const ShardReader r{shards[n], n < names.size() ? names[n] : "shard result " + std::to_string(n + 1)};
    const nlohmann::json& s = shards[n];
    if (!s.is_object()) r.fail("is not a JSON object");
    if (r.string(s, "format") != "gdn-fuzz-results/1") r.fail("'format' is not gdn-fuzz-results/1");
    const nlohmann::json& shard = r.typed(s, "shard", value_t::object, "an object");
    const std::int64_t shard_count = r.integer(shard, "count", 1, 1000000, "shard");
    const std::int64_t index = r.integer(shard, "index", 0, 1000000, "shard");
    if (index >= shard_count)
      r.fail("shard index " + std::to_string(index) + " is outside [0, " + std::to_string(shard_count) + ")");
    const nlohmann::json& impls = r.typed(s, "implementations", value_t::array, "an array");
    for (const nlohmann::json& x : impls)
      if (!x.is_string()) r.fail("'implementations' holds a non-string");
    const nlohmann::json limit = s.contains("cases_limit") ? s["cases_limit"] : nlohmann::json();
    if (!limit.is_null() && !(limit.is_number_integer() && limit.get<std::int64_t>() >= 0))
      r.fail("'cases_limit' is not an integer >= 0");
    const std::string this_seed = r.string(s, "seed");
    const std::string this_budget = r.string(s, "budget");
    // fuzz --backward (absent in results of earlier versions, which fuzzed the forward only).
    bool this_backward = false;
    if (s.contains("backward")) this_backward = r.typed(s, "backward", value_t::boolean, "a boolean").get<bool>();
    if (n == 0) {
      backward = this_backward;
      seed = this_seed;
      budget = this_budget;
      implementations = impls;
      cases_limit = limit;
      count = shard_count;
    } else {
      if (this_seed != seed) r.fail("another campaign (seed " + this_seed + ", the first shard's is " + seed + ")");
      if (shard_count != count)
        r.fail("another shard count (" + std::to_string(shard_count) + ", the first shard's is " + std::to_string(count) + ")");
      if (impls != implementations)
        r.fail("other implementations (--impl " + impls.dump() + ", the first shard's are " + implementations.dump() + ")");
      if (this_budget != budget) r.fail("another budget (" + this_budget + ", the first shard's is " + budget + ")");
      if (this_backward != backward)
        r.fail(std::string("another campaign (") + (this_backward ? "the backward" : "the forward") +
               ", the first shard's fuzzed the " + (backward ? "backward" : "forward") + ")");
      if (limit != cases_limit)
        r.fail("another --cases (" + limit.dump() + ", the first shard's is " + cases_limit.dump() + ")");
    }
    if (!seen.insert(index).second) r.fail("shard " + std::to_string(index) + " given twice");
    const std::int64_t shard_cases = r.integer(s, "cases", 0, kMaxCount);
    const std::int64_t shard_failures = r.integer(s, "failures_total", 0, kMaxCount);
    const std::int64_t shard_not_saved = r.integer(s, "failures_not_saved", 0, kMaxCount);
    const double shard_seconds = r.seconds(s, "seconds");
    const nlohmann::json& interrupted = r.typed(s, "interrupted", value_t::boolean, "a boolean");
    const nlohmann::json& device = r.at(s, "device", "");
    if (!device.is_number_integer()) r.fail("'device' is not an integer");
    const nlohmann::json& failures = r.typed(s, "failures", value_t::array, "an array");
    for (const nlohmann::json& f : failures)
      if (!f.is_object()) r.fail("'failures' holds a non-object");
    const nlohmann::json& tallies = r.typed(s, "tallies", value_t::object, "an object");
    for (auto it = tallies.begin(); it != tallies.end(); ++it) {
      const std::string where = "tallies." + it.key();
      for (const char* key : {"pass", "fail", "error", "skipped"}) (void)r.integer(it.value(), key, 0, kMaxCount, where);
      const nlohmann::json& m = r.at(it.value(), "worst_margin", where);
      if (!m.is_number() && !(m.is_string() && (m == "nan" || m == "inf" || m == "-inf")))
        r.fail("'" + where + ".worst_margin' is neither a number nor nan/inf");
      (void)r.string(it.value(), "worst_case", where);
    }
    cases += shard_cases;
    failures_total += shard_failures;
    failures_not_saved += shard_not_saved;
    seconds += shard_seconds;
    max_seconds = std::max(max_seconds, shard_seconds);
    out["shards"].push_back({{"index", index}, {"cases", shard_cases}, {"seconds", shard_seconds},
                             {"interrupted", interrupted}, {"device", device}});
    for (const nlohmann::json& f : failures) out["failures"].push_back(f);
    // A NaN margin is the worst there is; a string "inf" is worse than any finite margin.
    const auto margin = [](const nlohmann::json& m) -> double {
      const double inf = std::numeric_limits<double>::infinity();
      if (m.is_number()) return m.get<double>();
      return m == "-inf" ? -inf : m == "inf" ? inf : std::numeric_limits<double>::quiet_NaN();
    };
    const auto worse = [&](const nlohmann::json& a, const nlohmann::json& b) {
      const double x = margin(a), y = margin(b);
      return std::isnan(x) ? !std::isnan(y) : x > y;
    };
    for (auto it = tallies.begin(); it != tallies.end(); ++it) {
      nlohmann::json& t = out["tallies"][it.key()];
      if (t.is_null()) t = nlohmann::json::object();
      for (const char* key : {"pass", "fail", "error", "skipped"})
        t[key] = t.value(key, std::int64_t(0)) + it.value()[key].get<std::int64_t>();
      if (!t.contains("worst_margin") || worse(it.value()["worst_margin"], t["worst_margin"])) {
        t["worst_margin"] = it.value()["worst_margin"];
        t["worst_case"] = it.value()["worst_case"];
      }
    }
  }
  out["seed"] = seed;
  out["shard_count"] = count;
  out["implementations"] = implementations;
  out["budget"] = budget;
  out["cases_limit"] = cases_limit;
  out["backward"] = backward;
  out["missing_shards"] = nlohmann::json::array();
  for (std::int64_t i = 0; i < count; ++i)
    if (!seen.count(i)) out["missing_shards"].push_back(i);
  out["cases"] = cases;
  out["failures_total"] = failures_total;
  out["failures_not_saved"] = failures_not_saved;
  out["cpu_seconds"] = seconds;
  out["wall_seconds"] = max_seconds;
  return out;
}

}  // namespace gdn::cli
