#pragma once
// What several subcommands share: typed options (decimal integers with a lower bound, seeds,
// numbers), --budget, the case-space options of fuzz and generate, the --junit / --json
// verdict files, implementation selection, and what case files say about how they are judged.
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/campaign.hpp"
#include "cli/judge_file.hpp"
#include "fuzz/generators.hpp"
#include "oracle/case_file.hpp"

namespace gdn::cli {

// A usage error found after parsing (a missing input, options that do not fit together):
// main prints it and exits 2, like a parse error.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An integer option: decimal digits only, optional '-' (no 0x, no octal: 010 is ten), in
// [low, high] (high: what the field it ends up in holds, so nothing wraps).
CLI::Option* add_integer(CLI::App& app, const std::string& name, long long* value, long long low, long long high,
                         const std::string& help);
// A seed: unsigned, decimal (010 is ten) or hexadecimal with an explicit 0x, below 2^64.
CLI::Option* add_seed(CLI::App& app, const std::string& name, std::uint64_t* value, const std::string& help);
// A finite floating-point number in [low, high], the whole argument (nan and inf are refused).
CLI::Option* add_number(CLI::App& app, const std::string& name, double* value, double low, double high,
                        const std::string& help);

// --budget B, checked at parse time by oracle::parse_budget.
struct BudgetChoice {
  std::string text;
  CLI::Option* option = nullptr;
  std::optional<oracle::BudgetOptions> get() const;  // nullopt when not given
};
void add_budget(CLI::App& app, BudgetChoice* budget, const std::string& when_absent);

// The case distribution of fuzz::gen_case, narrowed by the command line (fuzz, generate).
// Without --space FILE or --preset NAME: CaseSpace::chunked(64) with the flags' values (defaults
// included). With a file: the file's space (gdn-case-space/1, fuzz/sample.hpp, the form the
// Python package's CaseSpace writes); with a preset: that preset (fuzz::CaseSpace, e.g.
// chunked_prefill, the space a kernel takes, so a fuzz of it spends no time on SKIPPED cases).
// Either way only the flags given on the command line override its fields. --dtypes pins the
// input dtypes in every case.
struct SpaceOptions {
  long long max_K = 128, max_V = 128, K_multiple = 1, max_tokens = 1024;
  long long max_sequences = fuzz::CaseSpace::chunked(64).max_sequences;
  double max_work = 1.0e6;
  bool intermediate = false;
  std::string file, preset, dtypes;
  // Set by add_space_options: which flags the command line gave.
  CLI::Option *max_K_option = nullptr, *max_V_option = nullptr, *K_multiple_option = nullptr,
              *max_tokens_option = nullptr, *max_sequences_option = nullptr, *max_work_option = nullptr,
              *intermediate_option = nullptr, *file_option = nullptr, *preset_option = nullptr,
              *dtypes_option = nullptr;
  // Chunked implementations cannot serve per-token states, so those stay off unless asked for.
  // Throws UsageError naming --space (an unreadable or invalid file) or the flag.
  fuzz::CaseSpace space() const;
};
void add_space_options(CLI::App& app, SpaceOptions* space);

// --max-case-bytes N and --max-case-work N: the size limits of a case file (oracle/limits.hpp),
// for the commands that read case files (verify, replay).
void add_case_limits(CLI::App& app, oracle::CaseLimits* limits);

// --junit FILE and --json FILE: the verdicts as JUnit XML and as gdn-verdicts/1 JSON.
struct VerdictFiles {
  std::string junit, json;
  void write(const std::string& suite, const std::string& command,
             const std::vector<oracle::Verdict>& verdicts) const;
};
void add_verdict_files(CLI::App& app, VerdictFiles* files, bool junit = true);

// The registry's selection; an unknown name, or a list that names nothing, is a usage error.
std::vector<const oracle::RegistryEntry*> select(const std::string& names);
// 1 when a verdict failed or errored, else 0 (SKIPPED is not a failure).
int exit_code(const std::vector<oracle::Verdict>& verdicts);

}  // namespace gdn::cli
