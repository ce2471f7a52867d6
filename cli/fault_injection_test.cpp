// The fuzzer's own test: copies of the reference with planted bugs must be found
// within a minute, shrunk to a small case, and the saved case must reproduce the failure.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <iostream>
#include <set>

#include "cli/campaign.hpp"
#include "cli/registry_all.hpp"
#include "fuzz/sample.hpp"
#include "oracle/case_file.hpp"
#include "oracle/implementations.hpp"

using namespace gdn;
using namespace gdn::cli;

namespace {

std::string temp_dir() {
  char pattern[] = "/tmp/gdn_fault_injection.XXXXXX";
  const char* made = mkdtemp(pattern);
  REQUIRE(made != nullptr);
  return made;
}

}  // namespace

TEST_CASE("the fuzzer finds, shrinks and replays every planted fault", "[cli][fuzz][fault]") {
  const oracle::Registry& registry = default_registry();
  for (const char* fault : {"fault.cu_seqlens_off_by_one", "fault.dropped_decay", "fault.lost_state_carry"}) {
    DYNAMIC_SECTION(fault) {
      const oracle::RegistryEntry* entry = registry.find(fault);
      REQUIRE(entry != nullptr);
      FuzzOptions options;
      options.implementations = {entry};
      options.seed = 2024;
      options.seconds = 60;  // the bound the issue sets; the measured times are far below it
      options.stop_at_first_failure = true;
      options.out_dir = temp_dir();
      options.generator = [](std::uint64_t seed) { return sample_case(seed); };
      const FuzzResult result = run_fuzz(options);
      REQUIRE(result.failures.size() == 1);
      const FuzzFailure& f = result.failures.front();
      std::cout << fault << ": found after " << f.found_after_seconds << " s (" << result.cases
                << " cases), shrunk from [" << f.original_problem << "] to [" << f.shrunk_problem << "] in "
                << f.shrink_evaluations << " evaluations, " << f.shrink_seconds << " s\n";
      CHECK(f.found_after_seconds < 60);
      CHECK(f.verdict.status == oracle::Status::fail);

      // Small: one value head, K = V = 1, at most two sequences, and no longer than the fault
      // needs (the chunk faults need a token past the first chunk boundary at 64).
      const oracle::CaseFile saved = oracle::read_case_file(f.file);
      const Problem& p = saved.problem;
      INFO("shrunk case: " << p.describe() << " steps " << f.shrink_steps.size());
      CHECK(p.HV == 1);
      CHECK(p.K == 1);
      CHECK(p.V == 1);
      CHECK(p.N() <= 2);
      if (std::string(fault) == "fault.cu_seqlens_off_by_one") {
        CHECK(p.T <= 3);
      } else {
        CHECK(p.T == 65);  // exactly one token past the boundary
      }
      CHECK(saved.meta("gdn.implementation") == fault);
      CHECK(saved.meta("gdn.replay").find("replay " + f.file) != std::string::npos);

      // Replay: the saved inputs make the fault fail again, with the same outputs as saved...
      oracle::CaseContext context("replay", saved.problem, saved.inputs);
      auto impl = entry->make();
      Outputs<double> again;
      const oracle::Verdict replayed = oracle::evaluate(*impl, context, entry->default_budget, &again);
      CHECK(replayed.status == oracle::Status::fail);
      REQUIRE(saved.outputs.has_value());
      CHECK(saved.outputs->o == again.o);
      // ...and the correct reference passes on them: the case exposes the fault, not a bad input.
      auto correct = oracle::make_reference(Formulation::chunked, oracle::ReferencePrecision::f64);
      CHECK(oracle::evaluate(*correct, context, registry.find("reference.chunked.f64")->default_budget).status ==
            oracle::Status::pass);
    }
  }
}

TEST_CASE("every planted fault is found from any campaign seed, quickly", "[cli][fuzz][fault]") {
  // Not one lucky seed: eight campaigns per fault, each must find and shrink it.
  for (const char* fault : {"fault.cu_seqlens_off_by_one", "fault.dropped_decay", "fault.lost_state_carry"}) {
    double slowest = 0;
    std::int64_t most_cases = 0;
    for (std::uint64_t seed = 1; seed <= 8; ++seed) {
      FuzzOptions options;
      options.implementations = {default_registry().find(fault)};
      options.seed = seed;
      options.seconds = 60;
      options.stop_at_first_failure = true;
      options.out_dir = temp_dir();
      options.generator = [](std::uint64_t s) { return sample_case(s); };
      const FuzzResult result = run_fuzz(options);
      INFO(fault << " seed " << seed);
      REQUIRE(result.failures.size() == 1);
      const FuzzFailure& f = result.failures.front();
      CHECK(f.found_after_seconds < 60);
      const oracle::CaseFile saved = oracle::read_case_file(f.file);
      CHECK(saved.problem.K == 1);
      CHECK(saved.problem.V == 1);
      CHECK(saved.problem.HV == 1);
      CHECK(saved.problem.T <= 65);
      slowest = std::max(slowest, f.found_after_seconds + f.shrink_seconds);
      most_cases = std::max(most_cases, result.cases);
    }
    std::cout << fault << ": over 8 campaign seeds, at most " << most_cases << " cases and " << slowest
              << " s to find and shrink\n";
  }
}

TEST_CASE("an interrupted campaign keeps its failures and reports the interrupt", "[cli][fuzz]") {
  std::atomic<bool> interrupted{false};
  FuzzOptions options;
  options.implementations = {default_registry().find("fault.lost_state_carry")};
  options.seed = 7;
  options.seconds = 60;
  options.max_saved_failures = 1;
  options.out_dir = temp_dir();
  options.interrupted = &interrupted;
  int generated = 0;
  // The interrupt arrives once 200 cases were made (as a SIGINT handler would set the flag).
  options.generator = [&](std::uint64_t seed) {
    if (++generated == 200) interrupted = true;
    return sample_case(seed);
  };
  const FuzzResult result = run_fuzz(options);
  CHECK(result.interrupted);
  CHECK(result.stop_reason == "interrupted");
  CHECK(result.cases == 200);
  REQUIRE(result.failures_total >= 1);
  CHECK(result.failures.front().saved);
  CHECK(result.failures.size() == 1);  // max_saved_failures
  CHECK(result.failures_total == 1 + result.failures_not_saved);
  const nlohmann::json j = result.to_json(options);
  CHECK(j["interrupted"] == true);
  CHECK(j["failures"].size() == result.failures.size());
}

TEST_CASE("shards draw disjoint cases and merge back into one campaign", "[cli][fuzz]") {
  std::vector<nlohmann::json> shards;
  std::set<std::uint64_t> seeds;
  for (int i = 0; i < 3; ++i) {
    FuzzOptions options;
    options.implementations = {default_registry().find("reference.chunked.f64")};
    options.seed = 99;
    options.cases = 30;
    options.shard = {i, 3};
    options.out_dir = temp_dir();
    options.generator = [&](std::uint64_t seed) {
      CHECK(seeds.insert(seed).second);  // no seed twice, across shards
      return sample_case(seed);
    };
    const FuzzResult r = run_fuzz(options);
    CHECK(r.cases == 10);
    shards.push_back(r.to_json(options));
  }
  CHECK(seeds.size() == 30);
  const nlohmann::json merged = merge_results(shards);
  CHECK(merged["cases"] == 30);
  CHECK(merged["missing_shards"].empty());
  CHECK(merged["tallies"]["reference.chunked.f64"]["pass"] == 30);
  shards.pop_back();
  CHECK(merge_results(shards)["missing_shards"] == nlohmann::json::array({2}));
  shards.push_back(shards.front());
  CHECK_THROWS_WITH(merge_results(shards), Catch::Contains("given twice"));
}

TEST_CASE("shard from the scheduler's environment", "[cli][fuzz]") {
  std::string error;
  ::unsetenv("SLURM_ARRAY_TASK_ID");
  ::unsetenv("JOB_COMPLETION_INDEX");
  CHECK_FALSE(shard_from_environment(&error).has_value());
  CHECK(error.empty());
  ::setenv("SLURM_ARRAY_TASK_ID", "5", 1);
  ::setenv("SLURM_ARRAY_TASK_MIN", "4", 1);
  ::setenv("SLURM_ARRAY_TASK_COUNT", "3", 1);
  auto s = shard_from_environment(&error);
  REQUIRE(s.has_value());
  CHECK(s->index == 1);
  CHECK(s->count == 3);
  ::setenv("SLURM_ARRAY_TASK_ID", "9", 1);
  CHECK_FALSE(shard_from_environment(&error).has_value());
  CHECK(error.find("0 <= index < count") != std::string::npos);
  ::unsetenv("SLURM_ARRAY_TASK_ID");
  ::unsetenv("SLURM_ARRAY_TASK_MIN");
  ::unsetenv("SLURM_ARRAY_TASK_COUNT");
  ::setenv("JOB_COMPLETION_INDEX", "2", 1);
  error.clear();
  CHECK_FALSE(shard_from_environment(&error).has_value());
  CHECK(error.find("GDN_SHARD_COUNT") != std::string::npos);
  ::setenv("GDN_SHARD_COUNT", "4", 1);
  s = shard_from_environment(&error);
  REQUIRE(s.has_value());
  CHECK(s->index == 2);
  CHECK(s->count == 4);
  ::unsetenv("JOB_COMPLETION_INDEX");
  ::unsetenv("GDN_SHARD_COUNT");
  Shard parsed;
  CHECK(parse_shard("3/8", &parsed, &error));
  CHECK(parsed.index == 3);
  CHECK_FALSE(parse_shard("8/8", &parsed, &error));
  CHECK_FALSE(parse_shard("x", &parsed, &error));
}

TEST_CASE("a failure that does not repeat is reported nondeterministic, unshrunk", "[cli][fuzz][fault]") {
  // fault.intermittent fails every second run, as a race that corrupts results does: the
  // fuzzer must not shrink it (a shrunk case that passes on replay would be saved as a
  // failure), but keep the original case and say to run the sanitizers.
  FuzzOptions options;
  options.implementations = {default_registry().find("fault.intermittent")};
  options.seed = 3;
  options.cases = 40;
  options.stop_at_first_failure = true;
  options.out_dir = temp_dir();
  options.generator = [](std::uint64_t seed) { return sample_case(seed); };
  const FuzzResult result = run_fuzz(options);
  REQUIRE(result.failures.size() == 1);
  const FuzzFailure& f = result.failures.front();
  CHECK(f.nondeterministic);
  CHECK(f.file == f.original_file);
  CHECK(f.shrink_evaluations == 0);
  CHECK(f.shrunk_problem == f.original_problem);
  CHECK(f.note.find("NONDETERMINISTIC") != std::string::npos);
  CHECK(f.note.find("compute-sanitizer") != std::string::npos);
  CHECK(f.replay.find("replay " + f.original_file) != std::string::npos);
  const oracle::CaseFile saved = oracle::read_case_file(f.file);
  CHECK(saved.meta("gdn.note") == f.note);
  const nlohmann::json j = result.to_json(options);
  CHECK(j["failures"][0]["nondeterministic"] == true);

  // A deterministic fault is not reported so.
  options.implementations = {default_registry().find("fault.lost_state_carry")};
  options.cases = 0;
  options.seconds = 60;
  options.out_dir = temp_dir();
  const FuzzResult steady = run_fuzz(options);
  REQUIRE(steady.failures.size() == 1);
  CHECK_FALSE(steady.failures.front().nondeterministic);
  CHECK(steady.failures.front().file != steady.failures.front().original_file);
}
