// The backward through the CLI's machinery: fuzz --backward finds and shrinks the planted
// backward faults and the saved case reproduces them; conformance --backward judges the
// references' backward and SKIPS implementations without one; the backward's reproducibility
// checks catch a backward whose bits change between runs or with the pack.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstring>
#include <iostream>
#include <memory>

#include "cli/campaign.hpp"
#include "cli/judge_file.hpp"
#include "cli/registry_all.hpp"
#include "cli/suite.hpp"
#include "fuzz/backward_properties.hpp"
#include "oracle/backward_budget.hpp"
#include "oracle/case_file.hpp"
#include "oracle/implementations.hpp"
#include "oracle/reproducibility.hpp"
#include "reference/backward.hpp"

using namespace gdn;
using namespace gdn::cli;

namespace {

std::string temp_dir() {
  char pattern[] = "/tmp/gdn_backward_cli.XXXXXX";
  const char* made = mkdtemp(pattern);
  REQUIRE(made != nullptr);
  return made;
}

const oracle::Check* failing_check(const oracle::Verdict& v) {
  for (const oracle::Check& c : v.checks)
    if (!c.pass) return &c;
  return nullptr;
}

// The sequential double reference whose backward changes its bits: every second run flips the
// last bit of dv's last element (a race's signature), or, with `pack_dependent`, dq of the
// first token of the pack gets one more ulp (a batch-dependent reduction).
class UnsteadyBackward final : public Implementation {
 public:
  explicit UnsteadyBackward(bool pack_dependent) : pack_dependent_(pack_dependent) {}
  std::string name() const override { return pack_dependent_ ? "test.pack_dependent" : "test.run_to_run"; }
  Formulation formulation() const override { return Formulation::sequential; }
  Outputs<double> run(const Problem&, const Inputs&) override { throw std::logic_error("backward only"); }
  bool has_backward() const override { return true; }
  Gradients<double> backward(const Problem& p, const Inputs& in, const BackwardInputs& b) override {
    Gradients<double> g = reference::sequential_backward<double>(p, in, b);
    if (pack_dependent_) {
      if (g.dq.numel() > 0) g.dq[0] = std::nextafter(g.dq[0], 1e300);
    } else if (runs_++ % 2 == 1 && g.dv.numel() > 0) {
      double& last = g.dv.data()[g.dv.numel() - 1];
      std::uint64_t bits;
      std::memcpy(&bits, &last, sizeof bits);
      bits ^= 1u;
      std::memcpy(&last, &bits, sizeof bits);
    }
    return g;
  }

 private:
  bool pack_dependent_;
  int runs_ = 0;
};

}  // namespace

TEST_CASE("fuzz --backward finds, shrinks and replays the planted backward faults", "[cli][fuzz][backward][fault]") {
  const oracle::Registry& registry = default_registry();
  for (const char* fault : {"fault.backward_dg_sign", "fault.backward_dk_last_token"}) {
    DYNAMIC_SECTION(fault) {
      const oracle::RegistryEntry* entry = registry.find(fault);
      REQUIRE(entry != nullptr);
      CHECK_FALSE(entry->in_conformance);
      FuzzOptions options;
      options.implementations = {entry};
      options.backward = true;
      options.seed = 2024;
      options.seconds = 60;
      options.stop_at_first_failure = true;
      options.out_dir = temp_dir();
      const fuzz::CaseSpace space = fuzz::backward_space(fuzz::CaseSpace::chunked(64));
      options.generator = [space](std::uint64_t seed) { return sample_case(seed, space); };
      const FuzzResult result = run_fuzz(options);
      REQUIRE(result.failures.size() == 1);
      const FuzzFailure& f = result.failures.front();
      std::cout << fault << ": found after " << result.cases << " cases, shrunk from [" << f.original_problem
                << "] to [" << f.shrunk_problem << "] in " << f.shrink_evaluations << " evaluations\n";
      CHECK(f.verdict.status == oracle::Status::fail);
      CHECK_FALSE(f.nondeterministic);
      CHECK(result.to_json(options)["backward"] == true);

      // Small, and a backward case: cotangents drawn from the case's seed and the gradients that
      // failed, judged by the backward's formulation.
      const oracle::CaseFile saved = oracle::read_case_file(f.file);
      const Problem& p = saved.problem;
      INFO("shrunk case: " << p.describe());
      CHECK(p.HV == 1);
      CHECK(p.K == 1);
      CHECK(p.V == 1);
      CHECK(p.T <= 3);
      // The failing check names the tensor the fault breaks.
      const oracle::Check* failed = failing_check(f.verdict);
      REQUIRE(failed != nullptr);
      const bool dg_sign = std::string(fault) == "fault.backward_dg_sign";
      CHECK(oracle::output_tensor_name(failed->tensor) ==
            std::string(!dg_sign ? "dk" : p.gate_mode == GateMode::fused ? "da" : "dg"));
      REQUIRE(saved.backward.has_value());
      REQUIRE(saved.gradients.has_value());
      CHECK_FALSE(saved.outputs.has_value());
      CHECK(saved.meta("gdn.implementation") == fault);
      CHECK(saved.meta("gdn.formulation") == "sequential");
      CHECK(saved.meta("gdn.backward").find(std::to_string(f.case_seed)) != std::string::npos);
      CHECK(saved.meta("gdn.replay").find("replay " + f.file) != std::string::npos);
      const reference::BackwardInputs redrawn = fuzz::make_backward_inputs(p, f.case_seed);
      CHECK(saved.backward->dO == redrawn.dO);

      // The saved case fails again with the same gradients; the correct reference passes on it.
      oracle::BackwardContext context("replay", saved.problem, saved.inputs, *saved.backward);
      auto impl = entry->make();
      Gradients<double> again;
      CHECK(oracle::evaluate_backward(*impl, context, oracle::backward_budget_of(*entry), &again).status ==
            oracle::Status::fail);
      CHECK(again.dk == saved.gradients->dk);
      CHECK(again.dg == saved.gradients->dg);
      auto correct = oracle::make_reference(Formulation::sequential, oracle::ReferencePrecision::f64);
      CHECK(oracle::evaluate_backward(*correct, context, oracle::backward_budget_of(*registry.find(
                                                                "reference.sequential.f64")))
                .status == oracle::Status::pass);
      // verify's judge of the stored gradients agrees.
      const oracle::Verdict judged =
          judge_case_file(f.file, std::nullopt, [&](const std::string& n) { return registry.find(n); });
      CHECK(judged.status == oracle::Status::fail);
    }
  }
}

TEST_CASE("conformance --backward: references pass, forward-only entries are SKIPPED", "[cli][backward]") {
  const oracle::Registry& registry = default_registry();
  const std::vector<const oracle::RegistryEntry*> entries = {
      registry.find("reference.sequential.f64"), registry.find("reference.chunked.f64.c37"),
      registry.find("reference.emulate.chunked"), registry.find("fault.dropped_decay")};
  for (const auto* e : entries) REQUIRE(e != nullptr);
  std::size_t out_of_scope = 0;
  const std::vector<BackwardCase> cases = backward_conformance_cases(&out_of_scope);
  CHECK(out_of_scope > 0);  // the state-cache and per-token-state cases
  REQUIRE(cases.size() >= 20);
  for (const BackwardCase& b : cases) CHECK(oracle::backward_in_scope(b.generated.problem));
  const std::vector<oracle::Verdict> verdicts = backward_conformance_verdicts(entries, std::nullopt);
  REQUIRE(verdicts.size() == cases.size() * entries.size());
  int passed = 0;
  for (const oracle::Verdict& v : verdicts) {
    INFO(v.summary());
    CHECK(v.case_name.size() > 9);
    CHECK(v.case_name.compare(v.case_name.size() - 9, 9, "/backward") == 0);
    if (v.implementation == "fault.dropped_decay") {
      CHECK(v.status == oracle::Status::skipped);
      CHECK(v.message.find("no backward") != std::string::npos);
      continue;
    }
    CHECK(v.status == oracle::Status::pass);
    passed += v.passed();
    // One check per gradient tensor the case has, under the entry's backward budget.
    CHECK(v.checks.size() == oracle::gradient_tensors(
                                 cases[static_cast<std::size_t>(&v - verdicts.data()) / entries.size()].generated.problem)
                                 .size());
    CHECK(v.budget == (v.implementation == "reference.emulate.chunked" ? "calibrated" : "analytic"));
  }
  CHECK(passed == static_cast<int>(3 * cases.size()));
}

TEST_CASE("conformance --backward fails a planted backward fault, naming the tensor", "[cli][backward][fault]") {
  const oracle::Registry& registry = default_registry();
  const std::vector<oracle::Verdict> verdicts =
      backward_conformance_verdicts({registry.find("fault.backward_dk_last_token")}, std::nullopt);
  int failed = 0;
  for (const oracle::Verdict& v : verdicts) {
    if (v.status != oracle::Status::fail) continue;
    ++failed;
    for (const oracle::Check& c : v.checks)
      if (!c.pass) CHECK(std::string(oracle::output_tensor_name(c.tensor)) == "dk");
  }
  // Every case with a token (the one with only empty sequences has no dk to drop).
  CHECK(failed >= static_cast<int>(verdicts.size()) - 1);
}

TEST_CASE("the backward's reproducibility checks catch changing bits", "[cli][backward]") {
  fuzz::CaseSpace space = fuzz::backward_space(fuzz::CaseSpace::chunked(64));
  space.max_work = 2e4;
  GeneratedCase c;
  // A case of two or more sequences with tokens (the repack check needs two).
  for (std::uint64_t seed = 1;; ++seed) {
    c = sample_case(seed, space);
    int nonempty = 0;
    for (int n = 0; n < c.problem.N(); ++n) nonempty += c.problem.seq_len(n) > 0;
    if (nonempty >= 2 && c.problem.seq_len(0) > 0) break;
  }
  const BackwardInputs b = fuzz::make_backward_inputs(c.problem, 5);
  {
    // A steady backward passes all of them.
    auto steady = oracle::make_reference(Formulation::chunked, oracle::ReferencePrecision::f64, 16);
    const Gradients<double> first = steady->backward(c.problem, c.inputs, b);
    for (const oracle::Check& check : oracle::backward_reproducibility_checks(*steady, c.problem, c.inputs, b, first))
      CHECK(check.pass);
  }
  {
    UnsteadyBackward racy(false);
    const Gradients<double> first = racy.backward(c.problem, c.inputs, b);
    const auto checks = oracle::backward_reproducibility_checks(racy, c.problem, c.inputs, b, first);
    int failed = 0;
    for (const oracle::Check& check : checks) {
      if (check.pass) continue;
      ++failed;
      CHECK(check.metric == "repeat_bits");
      CHECK(std::string(oracle::output_tensor_name(check.tensor)) == "dv");
      CHECK(check.error == 1.0);  // one bit
    }
    CHECK(failed == 1);
    // In a verdict: PASS turns into FAIL, and the message says to run the sanitizers.
    oracle::Verdict v;
    v.status = oracle::Status::pass;
    UnsteadyBackward racy_again(false);
    const Gradients<double> first_again = racy_again.backward(c.problem, c.inputs, b);
    oracle::add_backward_reproducibility_checks(v, racy_again, c.problem, c.inputs, b, first_again);
    CHECK(v.status == oracle::Status::fail);
    CHECK(v.message.find("compute-sanitizer") != std::string::npos);
  }
  {
    UnsteadyBackward batch_dependent(true);
    const Gradients<double> first = batch_dependent.backward(c.problem, c.inputs, b);
    bool repack_failed = false;
    for (const oracle::Check& check :
         oracle::backward_reproducibility_checks(batch_dependent, c.problem, c.inputs, b, first)) {
      if (check.metric == "repeat_bits") CHECK(check.pass);
      if (check.metric == "repack_bits") {
        repack_failed = !check.pass;
        CHECK(check.basis.find("dq") != std::string::npos);
      }
    }
    CHECK(repack_failed);
  }
}

TEST_CASE("conformance --backward reruns a kernel's backward and fails changing bits", "[cli][backward]") {
  // A registry entry posing as a kernel (check_reproducibility) whose backward flips a bit of dv
  // on every second run: its values stay within every budget, only the rerun sees it.
  oracle::RegistryEntry racy;
  racy.name = "test.run_to_run";
  racy.make = [] { return std::make_unique<UnsteadyBackward>(false); };
  racy.check_reproducibility = true;
  const std::vector<oracle::Verdict> verdicts = backward_conformance_verdicts({&racy}, std::nullopt);
  REQUIRE_FALSE(verdicts.empty());
  int failed = 0;
  for (const oracle::Verdict& v : verdicts) {
    INFO(v.summary());
    bool value_checks_pass = true, repeat_failed = false;
    for (const oracle::Check& c : v.checks) {
      if (c.metric == "rel_terms") value_checks_pass = value_checks_pass && c.pass;
      if (c.metric == "repeat_bits" && !c.pass) {
        repeat_failed = true;
        CHECK(std::string(oracle::output_tensor_name(c.tensor)) == "dv");
      }
    }
    CHECK(value_checks_pass);
    CHECK(v.status == (repeat_failed ? oracle::Status::fail : oracle::Status::pass));
    failed += repeat_failed;
  }
  // Every case with a value of dv (the case of only empty sequences has none to flip).
  CHECK(failed >= static_cast<int>(verdicts.size()) - 1);
}
