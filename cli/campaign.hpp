#pragma once
// A fuzz campaign: random cases against one or more implementations, each failure shrunk,
// saved as a case file with the command that replays it, results as JSON per shard.
#include <atomic>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/shrink.hpp"
#include "fuzz/sample.hpp"
#include "oracle/budget.hpp"
#include "oracle/registry.hpp"

namespace gdn::cli {

// One generated case and the seeded sampler that makes them (fuzz/sample.hpp).
using fuzz::GeneratedCase;
using fuzz::sample_case;

// seed -> case. Deterministic in the seed.
using CaseGenerator = std::function<GeneratedCase(std::uint64_t seed)>;

// The seed of the campaign's case number `index` (global over all shards): disjoint shards
// get disjoint indices, hence distinct, reproducible seeds.
std::uint64_t case_seed(std::uint64_t campaign_seed, std::uint64_t index);

struct Shard {
  int index = 0, count = 1;
};
// "i/n" (0 <= i < n).
bool parse_shard(const std::string& text, Shard* out, std::string* error);
// The shard the scheduler gave this process, if any: Slurm job arrays (SLURM_ARRAY_TASK_ID
// minus SLURM_ARRAY_TASK_MIN, out of SLURM_ARRAY_TASK_COUNT) or a Kubernetes indexed Job
// (JOB_COMPLETION_INDEX, out of GDN_SHARD_COUNT, which the Job spec must set). Fills *error
// when the variables are there but inconsistent.
std::optional<Shard> shard_from_environment(std::string* error);

struct FuzzOptions {
  std::vector<const oracle::RegistryEntry*> implementations;
  std::optional<oracle::BudgetOptions> budget;  // else each implementation's default
  std::uint64_t seed = 1;
  double seconds = 0;         // 0: no time limit
  std::int64_t cases = 0;     // total over all shards; 0: no limit (then seconds must be set)
  Shard shard;
  std::string out_dir = "gdn-fuzz-out";
  bool shrink = true;
  ShrinkOptions shrink_options;
  // After this many failures are saved, later ones are counted (failures_not_saved) but
  // neither shrunk, saved nor listed.
  int max_saved_failures = 10;
  bool stop_at_first_failure = false;
  // Fuzz the backward (Implementation::backward) instead of the forward: the generator draws from
  // the backward's space (fuzz::backward_space), each case's cotangents come from
  // fuzz::make_backward_inputs with the case's seed (drawn again with that seed for every shape
  // the shrinker tries, as gdn_testbed.fuzz_backward does), the gradients are judged by
  // oracle::evaluate_backward under each implementation's backward budget
  // (oracle::backward_budget_of, or `budget` applied to gradients), and a failure's case files
  // hold in.dO, in.dhT and the run's gradients (gdn-case/2).
  bool backward = false;
  CaseGenerator generator;                 // required
  const std::atomic<bool>* interrupted = nullptr;  // SIGINT: finish the case, write the summary
  std::ostream* progress = nullptr;        // progress lines, e.g. &std::cerr
  double progress_interval = 2.0;          // seconds
  std::string command;                     // recorded in files and results
  std::string binary = "gdn-testbed";      // how replay commands name the tool
  int device = -1;                         // recorded; the caller sets CUDA_VISIBLE_DEVICES
};

struct FuzzFailure {
  std::string implementation;
  std::int64_t case_index = 0;
  std::uint64_t case_seed = 0;
  std::string original_problem, shrunk_problem;
  std::string file, original_file;  // case files (shrunk, as generated)
  std::string replay;               // command line reproducing it from `file`
  oracle::Verdict verdict;          // on the shrunk case
  oracle::Verdict original_verdict;
  int shrink_evaluations = 0;
  double shrink_seconds = 0;
  std::vector<std::string> shrink_steps;
  double found_after_seconds = 0;
  bool saved = true;
  // The failure did not repeat on the same inputs, or its shrunk case passed on replay: the
  // original case is kept (file = original_file) and `note` says to run the sanitizers.
  bool nondeterministic = false;
  std::string note;
};

struct ImplementationTally {
  std::int64_t pass = 0, fail = 0, error = 0, skipped = 0;
  double worst_margin = 0;   // over the cases it passed or failed
  std::string worst_case;
};

struct FuzzResult {
  std::int64_t cases = 0;  // cases this shard generated
  std::vector<FuzzFailure> failures;
  std::int64_t failures_total = 0;  // counted, including those not saved
  std::int64_t failures_not_saved = 0;  // beyond max_saved_failures: counted, not listed
  std::map<std::string, ImplementationTally> tallies;
  double seconds = 0;
  bool interrupted = false;
  std::string stop_reason;
  nlohmann::json to_json(const FuzzOptions& options) const;
};

FuzzResult run_fuzz(const FuzzOptions& options);

// Joins shard result files' JSON into one (sums, concatenated failures, per-shard list). Every
// field is read with checked access: throws std::invalid_argument naming the file (names[i],
// else its position) and the key when one is missing or of the wrong type, when a shard index
// lies outside [0, count), when a shard is given twice, and when shards come from different
// campaigns (seed, shard count, implementations, budget or --cases).
nlohmann::json merge_results(const std::vector<nlohmann::json>& shards, const std::vector<std::string>& names = {});

// Versions of what built this binary (gdn-testbed git revision, compiler, Eigen, ...).
nlohmann::json build_versions();

}  // namespace gdn::cli
