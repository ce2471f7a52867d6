// The built-in conformance cases (cli/suite.cpp) against what the registered implementations
// support: every feature an implementation supports is given to it by at least two cases of
// different shapes, no implementation skips most of the cases, and the planted faults of the
// features the newer cases cover (small-norm l2norm, per-token states, fp32 accuracy) fail
// conformance. The test reads whatever the registry holds: in a CUDA build the kernels are
// checked too, through their supports().
#include <catch2/catch.hpp>

#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cli/registry_all.hpp"
#include "cli/suite.hpp"
#include "oracle/budget.hpp"

using namespace gdn;
using namespace gdn::cli;

namespace {

const std::vector<GeneratedCase>& cases() {
  static const std::vector<GeneratedCase> all = conformance_cases();
  return all;
}

// A feature: which cases have it, and problems that ask for it (probes). An implementation
// supports the feature when it supports at least one probe.
struct Feature {
  std::string name;
  std::function<bool(const Problem&, const Inputs&)> present;
  std::vector<Problem> probes;
};

bool any_padding(const Inputs& in, std::size_t from, std::size_t to) {
  for (std::size_t n = from; n < to && n < in.state_indices.size(); ++n)
    if (in.state_indices[n] < 0) return true;
  return false;
}

// Probe problems: every input dtype, small and mid head sizes, dense states or a cache (with or
// without write-back), each edited by `edit` and kept when valid. Lengths from `lengths`.
std::vector<Problem> probes(const std::vector<std::vector<std::int64_t>>& lengths, bool dense, bool cache,
                            const std::function<void(Problem&)>& edit) {
  std::vector<Problem> out;
  for (const auto& ls : lengths)
    for (DType dtype : {DType::f32, DType::bf16, DType::f16})
      for (int size : {16, 64})
        for (int storage = 0; storage < 3; ++storage) {
          if (storage == 0 && !dense) continue;
          if (storage > 0 && !cache) continue;
          Problem p = Problem::packed(ls, 1, 2, size, size);
          p.input_dtype = dtype;
          p.has_h0 = true;
          p.has_hT = storage != 2;  // 2: a read-only cache
          if (storage > 0) p.state_slots = p.N() + 1;
          edit(p);
          try {
            p.validate();
            out.push_back(p);
          } catch (const ProblemError&) {
          }
        }
  return out;
}

std::vector<Feature> features(int C) {
  const auto none = [](Problem&) {};
  const std::vector<std::vector<std::int64_t>> short_ones{{2, 2, 2}, {1, 1, 1}};
  std::vector<Feature> f;
  f.push_back({"state cache", [](const Problem& p, const Inputs&) { return p.uses_state_cache(); },
               probes(short_ones, false, true, none)});
  f.push_back({"padding row at the start",
               [](const Problem& p, const Inputs& in) { return p.uses_state_cache() && any_padding(in, 0, 1); },
               probes(short_ones, false, true, none)});
  f.push_back({"padding row in the middle",
               [](const Problem& p, const Inputs& in) {
                 return p.uses_state_cache() && p.N() >= 3 && any_padding(in, 1, std::size_t(p.N() - 1));
               },
               probes(short_ones, false, true, none)});
  f.push_back({"padding row at the end",
               [](const Problem& p, const Inputs& in) {
                 return p.uses_state_cache() && p.N() >= 2 && any_padding(in, std::size_t(p.N() - 1), std::size_t(p.N()));
               },
               probes(short_ones, false, true, none)});
  f.push_back({"shared slots (read-only cache)",
               [](const Problem& p, const Inputs& in) {
                 std::set<std::int32_t> seen;
                 for (std::int32_t s : in.state_indices)
                   if (s >= 0 && !seen.insert(s).second) return p.uses_state_cache();
                 return false;
               },
               probes(short_ones, false, true, [](Problem& p) { p.has_hT = false; })});
  f.push_back({"slots out of order",
               [](const Problem& p, const Inputs& in) {
                 std::int32_t last = -1;
                 for (std::int32_t s : in.state_indices) {
                   if (s < 0) continue;
                   if (s < last) return p.uses_state_cache();
                   last = s;
                 }
                 return false;
               },
               probes(short_ones, false, true, none)});
  f.push_back({"per-token states", [](const Problem& p, const Inputs&) { return p.store_intermediate_states; },
               probes(short_ones, true, true, [](Problem& p) { p.store_intermediate_states = true; })});
  f.push_back({"fused gates", [](const Problem& p, const Inputs&) { return p.gate_mode == GateMode::fused; },
               probes(short_ones, true, true, [](Problem& p) { p.gate_mode = GateMode::fused; })});
  f.push_back({"v_major states",
               [](const Problem& p, const Inputs&) {
                 return p.state_layout == StateLayout::v_major && (p.has_h0 || p.has_hT || p.store_intermediate_states);
               },
               probes(short_ones, true, true, [](Problem& p) { p.state_layout = StateLayout::v_major; })});
  f.push_back({"k_major states",
               [](const Problem& p, const Inputs&) {
                 return p.state_layout == StateLayout::k_major && (p.has_h0 || p.has_hT || p.store_intermediate_states);
               },
               probes(short_ones, true, true, none)});
  f.push_back({"initial state h0", [](const Problem& p, const Inputs&) { return p.has_h0; },
               probes(short_ones, true, true, none)});
  f.push_back({"final state hT", [](const Problem& p, const Inputs&) { return p.has_hT; },
               probes(short_ones, true, true, none)});
  // Lengths 0, 1, C - 1, C, C + 1 at the start, in the middle and at the end of a pack of two or
  // more sequences. Probes: the length there among sequences of 2 tokens, or all of that length
  // (a fixed-length decode batch).
  for (std::int64_t L : {std::int64_t(0), std::int64_t(1), std::int64_t(C - 1), std::int64_t(C), std::int64_t(C + 1)}) {
    if (L < 0) continue;
    const std::string l = std::to_string(L);
    f.push_back({"length " + l + " at the start",
                 [L](const Problem& p, const Inputs&) { return p.N() >= 2 && p.seq_len(0) == L; },
                 probes({{L, 2, 2}, {L, L, L}}, true, true, none)});
    f.push_back({"length " + l + " in the middle",
                 [L](const Problem& p, const Inputs&) {
                   for (int n = 1; n + 1 < p.N(); ++n)
                     if (p.seq_len(n) == L) return true;
                   return false;
                 },
                 probes({{2, L, 2}, {L, L, L}}, true, true, none)});
    f.push_back({"length " + l + " at the end",
                 [L](const Problem& p, const Inputs&) { return p.N() >= 2 && p.seq_len(p.N() - 1) == L; },
                 probes({{2, 2, L}, {L, L, L}}, true, true, none)});
  }
  return f;
}

using ShapeKey = std::tuple<std::vector<std::int64_t>, int, int, int, int>;
ShapeKey shape_of(const Problem& p) { return {p.cu_seqlens, p.H, p.HV, p.K, p.V}; }

}  // namespace

TEST_CASE("every feature an implementation supports is in two built-in cases of different shapes",
          "[cli][conformance][coverage]") {
  const oracle::Registry& registry = default_registry();
  int checked = 0;
  for (const oracle::RegistryEntry& entry : registry.entries()) {
    if (!entry.in_conformance) continue;
    const auto impl = entry.make();
    for (const Feature& feature : features(impl->chunk_size())) {
      bool supported = false;
      for (const Problem& probe : feature.probes) supported = supported || impl->supports(probe, nullptr);
      if (!supported) continue;
      std::set<ShapeKey> shapes;
      std::vector<std::string> names;
      for (const GeneratedCase& c : cases())
        if (feature.present(c.problem, c.inputs) && impl->supports(c.problem, nullptr)) {
          shapes.insert(shape_of(c.problem));
          names.push_back(c.name);
        }
      INFO(entry.name << " supports '" << feature.name << "' (chunk size " << impl->chunk_size()
                      << "); built-in cases that give it: " << names.size() << ", shapes " << shapes.size());
      CHECK(shapes.size() >= 2);
      ++checked;
    }
  }
  CHECK(checked > 20);
}

TEST_CASE("no implementation skips most built-in cases", "[cli][conformance][coverage]") {
  // A kernel for which most cases are skipped is hardly tested by conformance: it gets cases of
  // its own (the decode batches are the decode kernel's).
  for (const oracle::RegistryEntry& entry : default_registry().entries()) {
    if (!entry.in_conformance) continue;
    const auto impl = entry.make();
    int supported = 0;
    for (const GeneratedCase& c : cases()) supported += impl->supports(c.problem, nullptr) ? 1 : 0;
    INFO(entry.name << " supports " << supported << " of " << cases().size() << " built-in cases");
    CHECK(supported >= 12);
  }
}

TEST_CASE("built-in cases are valid, distinctly named and reproducible", "[cli][conformance]") {
  std::set<std::string> names;
  for (const GeneratedCase& c : cases()) {
    INFO(c.name);
    CHECK(names.insert(c.name).second);
    CHECK_NOTHROW(validate(c.problem, c.inputs));
  }
  const std::vector<GeneratedCase> again = conformance_cases();
  REQUIRE(again.size() == cases().size());
  for (std::size_t i = 0; i < again.size(); ++i) {
    CHECK(again[i].inputs.q == cases()[i].inputs.q);
    CHECK(again[i].inputs.state_indices == cases()[i].inputs.state_indices);
  }
}

namespace {

// The verdicts of one implementation on every built-in case, as `gdn-testbed conformance`
// gives them (the long double oracle), under `budget`.
std::map<std::string, oracle::Verdict> conformance_verdicts(const std::string& name, const oracle::BudgetOptions& budget) {
  const oracle::RegistryEntry* entry = default_registry().find(name);
  REQUIRE(entry != nullptr);
  std::map<std::string, oracle::Verdict> out;
  for (oracle::Verdict& v : cli::conformance_verdicts({entry}, budget)) out[v.case_name] = std::move(v);
  return out;
}

int count(const std::map<std::string, oracle::Verdict>& verdicts, oracle::Status status) {
  int n = 0;
  for (const auto& [name, v] : verdicts) n += v.status == status ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("conformance catches a misplaced l2norm epsilon on the small-norm cases", "[cli][conformance][fault]") {
  // x / (sqrt(sum x^2) + 1e-6) for x / sqrt(sum x^2 + 1e-6): on N(0, 1) rows the two differ by
  // about 1e-6 / |x|^2 relative, below fp32's rounding; on rows of norm 1e-3 by a factor of 1.4.
  const auto verdicts = conformance_verdicts("fault.l2norm_eps_outside_sqrt", oracle::BudgetOptions{});
  for (const char* name : {"conformance/small-norm-l2norm-f32", "conformance/small-norm-l2norm-bf16",
                           "conformance/small-norm-l2norm-decode-f32"}) {
    INFO(name << ": " << verdicts.at(name).summary());
    CHECK(verdicts.at(name).status == oracle::Status::fail);
  }
  // The cases drawn N(0, 1), l2norm on, do not see it: that was the blind spot.
  for (const char* name : {"conformance/gva-l2norm-bf16", "conformance/large-heads-bf16"}) {
    INFO(name << ": " << verdicts.at(name).summary());
    CHECK(verdicts.at(name).status == oracle::Status::pass);
  }
}

TEST_CASE("conformance catches per-token states stored before the write", "[cli][conformance][fault]") {
  const auto verdicts = conformance_verdicts("fault.states_before_write", oracle::BudgetOptions{});
  int with_states = 0, caught = 0;
  for (const GeneratedCase& c : cases()) {
    const oracle::Verdict& v = verdicts.at(c.name);
    if (!c.problem.store_intermediate_states || c.problem.T == 0) {
      INFO(c.name << ": " << v.summary());
      CHECK(v.status != oracle::Status::fail);  // the fault touches nothing else
      continue;
    }
    ++with_states;
    INFO(c.name << ": " << v.summary());
    CHECK(v.status == oracle::Status::fail);
    caught += v.status == oracle::Status::fail ? 1 : 0;
  }
  CHECK(with_states >= 5);
  CHECK(caught == with_states);
}

TEST_CASE("an fp32 accuracy loss fails conformance under the fp32 subject's calibrated budget",
          "[cli][conformance][fault]") {
  // The default set holds an fp32 subject under the calibrated budget (model.chunked.split_all).
  const oracle::RegistryEntry* subject = default_registry().find("model.chunked.split_all");
  REQUIRE(subject != nullptr);
  CHECK(subject->in_conformance);
  CHECK(subject->default_budget.model == oracle::BudgetModel::calibrated);
  // An fp32 path whose state keeps 11 of its 24 bits (an error about 8000 times fp32's):
  // within the fixed thresholds that judge the emulations, so a subject judged by those alone
  // passes it; the calibrated budget fails it.
  const auto fixed = conformance_verdicts("fault.state_loses_bits",
                                          default_registry().find("reference.emulate.chunked")->default_budget);
  const auto calibrated = conformance_verdicts("fault.state_loses_bits", subject->default_budget);
  CHECK(count(fixed, oracle::Status::fail) == 0);
  CHECK(count(calibrated, oracle::Status::fail) >= 5);
  for (const char* name : {"conformance/varlen-boundaries-f32", "conformance/underflow-reset-f32"}) {
    INFO(name << ": fixed " << fixed.at(name).summary() << "; calibrated " << calibrated.at(name).summary());
    CHECK(fixed.at(name).status == oracle::Status::pass);
    CHECK(calibrated.at(name).status == oracle::Status::fail);
  }
}

TEST_CASE("conformance reruns kernels: a run-to-run bit difference fails, the references pass", "[cli][conformance][fault]") {
  // fault.run_to_run_bits flips one bit of o every second run: within every budget, so only
  // the rerun sees it. It poses as a kernel (check_reproducibility).
  const auto flips = conformance_verdicts("fault.run_to_run_bits", oracle::BudgetOptions{});
  int failed = 0;
  for (const auto& [name, v] : flips) {
    if (v.status != oracle::Status::fail) continue;
    ++failed;
    bool repeat_failed = false;
    for (const oracle::Check& c : v.checks) repeat_failed = repeat_failed || (c.metric == "repeat_bits" && !c.pass);
    INFO(name << ": " << v.summary());
    CHECK(repeat_failed);
    CHECK(v.message.find("compute-sanitizer") != std::string::npos);
  }
  CHECK(failed >= 10);
  // An implementation that fails only some runs fails conformance too.
  CHECK(count(conformance_verdicts("fault.intermittent", oracle::BudgetOptions{}), oracle::Status::fail) >= 10);
  // The same checks on a deterministic, batch-invariant implementation all pass.
  oracle::RegistryEntry steady = *default_registry().find("reference.sequential.f64");
  steady.check_reproducibility = true;
  int with_checks = 0;
  for (const oracle::Verdict& v : cli::conformance_verdicts({&steady}, std::nullopt)) {
    INFO(v.case_name << ": " << v.summary());
    CHECK(v.status == oracle::Status::pass);
    for (const oracle::Check& c : v.checks) with_checks += c.metric == "repack_bits" ? 1 : 0;
  }
  CHECK(with_checks >= 20);
}
