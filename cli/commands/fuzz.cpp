// gdn-testbed fuzz: random cases from the property suite's generator until --seconds or
// --cases, every failure shrunk and saved as a case file with the command that replays it.
// Exit 1 when a failure was found, 77 (SKIPPED) when no selected implementation can run here.
#include <sys/stat.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>

#include "cli/commands/commands.hpp"
#include "cli/commands/options.hpp"
#include "cli/output.hpp"
#include "fuzz/sample.hpp"

namespace gdn::cli {

namespace {

std::atomic<bool> g_interrupted{false};

extern "C" void on_sigint(int) {
  if (g_interrupted.load()) std::_Exit(130);  // second Ctrl-C: leave now
  g_interrupted.store(true);
}

struct FuzzCommandOptions {
  std::string impl = "reference.chunked.f64,reference.chunked.f64.c37,reference.sequential.f80";
  BudgetChoice budget;
  std::uint64_t seed = 1;
  double seconds = 0;
  long long cases = 0;
  std::string shard;
  CLI::Option* shard_option = nullptr;
  long long device = 0;
  CLI::Option* device_option = nullptr;
  std::string out = "gdn-fuzz-out";
  std::string json;
  long long max_failures = 10;
  bool stop_at_first = false;
  bool no_shrink = false;
  bool quiet = false;
  SpaceOptions space;
};

// Creates every folder of `path` but the last component (the results file's folder does not
// exist when nothing failed).
void make_parent_folders(const std::string& path) {
  const auto slash = path.find_last_of('/');
  const std::string dir = path.substr(0, slash == std::string::npos ? 0 : slash);
  if (dir.empty()) return;
  std::string partial;
  std::stringstream parts(dir);
  std::string part;
  if (dir[0] == '/') partial = "/";
  while (std::getline(parts, part, '/'))
    if (!part.empty()) {
      partial += part + "/";
      ::mkdir(partial.c_str(), 0755);
    }
}

int fuzz_command(const FuzzCommandOptions& o, const std::string& command, const std::string& binary) {
  FuzzOptions options;
  if (o.device_option->count() > 0) {
    // Before anything touches CUDA: the process sees exactly that GPU, as device 0.
    ::setenv("CUDA_VISIBLE_DEVICES", std::to_string(o.device).c_str(), 1);
    options.device = static_cast<int>(o.device);
  }
  // Implementations that cannot run here (a GPU kernel without a device) are reported and left
  // out; when none is left the run is SKIPPED (exit 77, the skip code CTest is given), never
  // a pass.
  for (const oracle::RegistryEntry* e : select(o.impl)) {
    std::string why;
    if (e->make()->available(&why)) options.implementations.push_back(e);
    else std::cout << "SKIPPED " << e->name << ": " << why << "\n";
  }
  if (options.implementations.empty()) {
    std::cout << "fuzz: SKIPPED, no selected implementation can run here\n";
    return 77;
  }
  options.budget = o.budget.get();
  options.seed = o.seed;
  options.seconds = o.seconds;
  options.cases = o.cases;
  if (options.seconds <= 0 && options.cases <= 0) throw UsageError("fuzz needs --seconds S or --cases N");
  std::string error;
  if (o.shard_option->count() > 0) {
    if (!parse_shard(o.shard, &options.shard, &error)) throw UsageError(error);
  } else if (auto s = shard_from_environment(&error)) {
    options.shard = *s;
  } else if (!error.empty()) {
    throw UsageError(error);
  }
  options.out_dir = o.out;
  options.shrink = !o.no_shrink;
  options.max_saved_failures = static_cast<int>(o.max_failures);
  options.stop_at_first_failure = o.stop_at_first;
  const fuzz::CaseSpace space = o.space.space();
  options.generator = [space](std::uint64_t seed) { return fuzz::sample_case(seed, space); };
  options.interrupted = &g_interrupted;
  options.progress = o.quiet ? nullptr : &std::cerr;
  options.command = command;
  options.binary = binary;
  std::signal(SIGINT, on_sigint);
  std::signal(SIGTERM, on_sigint);  // schedulers send SIGTERM before they kill
  const FuzzResult result = run_fuzz(options);
  const std::string json_path =
      !o.json.empty() ? o.json
                      : options.out_dir + "/results-shard-" + std::to_string(options.shard.index) + "-of-" +
                            std::to_string(options.shard.count) + ".json";
  make_parent_folders(json_path);
  write_text_file(json_path, result.to_json(options).dump(2) + "\n");
  std::cout << "fuzz: " << result.cases << " cases in " << result.seconds << " s (" << result.stop_reason << "), "
            << result.failures_total << " failures";
  if (result.failures_not_saved > 0)
    std::cout << " (" << result.failures.size() << " saved, " << result.failures_not_saved
              << " more counted only: --max-failures)";
  std::cout << "\n";
  for (const auto& [name, t] : result.tallies)
    std::cout << "  " << name << ": " << t.pass << " pass, " << t.fail << " fail, " << t.error << " error, " << t.skipped
              << " skipped; worst margin " << t.worst_margin << "\n";
  for (const FuzzFailure& f : result.failures) {
    if (!f.saved) continue;
    std::cout << "FAILURE " << f.verdict.summary() << "\n  shrunk: " << f.shrunk_problem << "\n  replay: " << f.replay
              << "\n";
  }
  std::cout << "results: " << json_path << "\n";
  return result.failures_total > 0 ? 1 : 0;
}

}  // namespace

void add_fuzz(CLI::App& app, Context& context) {
  CLI::App* sub = app.add_subcommand(
      "fuzz",
      "random cases until --seconds or --cases; failures shrunk and saved as case files with a replay "
      "command; Ctrl-C keeps them and writes the summary. Exit 1 on failures, 77 when no selected "
      "implementation can run here (SKIPPED).");
  auto o = std::make_shared<FuzzCommandOptions>();
  sub->add_option("--impl", o->impl, "comma-separated names, 'prefix*', '*' (gdn-testbed list)")
      ->type_name("LIST")
      ->capture_default_str();
  add_budget(*sub, &o->budget, "each implementation's own");
  add_seed(*sub, "--seed", &o->seed, "the campaign's seed: case i has seed case_seed(S, i)")->type_name("S");
  add_number(*sub, "--seconds", &o->seconds, "stop after S seconds (0: no time limit)")->type_name("S");
  add_integer(*sub, "--cases", &o->cases, 0, "stop after N cases, the total over all shards (0: no limit)")
      ->type_name("N");
  o->shard_option = sub->add_option("--shard", o->shard,
                                    "run shard i of n (cases i, i+n, ...); default from SLURM_ARRAY_TASK_ID/COUNT "
                                    "or JOB_COMPLETION_INDEX + GDN_SHARD_COUNT, else 0/1")
                        ->type_name("i/n")
                        ->check(
                            [](const std::string& text) {
                              Shard s;
                              std::string error;
                              return parse_shard(text, &s, &error) ? std::string() : error;
                            },
                            "");
  o->device_option = add_integer(*sub, "--device", &o->device, 0,
                                 "set CUDA_VISIBLE_DEVICES=N before anything touches CUDA: one process per GPU")
                         ->type_name("N")
                         ->default_str("");
  sub->add_option("--out", o->out, "folder for the failures' case files and the results")
      ->type_name("DIR")
      ->capture_default_str();
  sub->add_option("--json", o->json, "the results (gdn-fuzz-results/1); default DIR/results-shard-i-of-n.json")
      ->type_name("FILE");
  add_integer(*sub, "--max-failures", &o->max_failures, 0, "failures shrunk and saved; later ones are only counted")
      ->type_name("N");
  sub->add_flag("--stop-at-first", o->stop_at_first, "stop at the first failure");
  sub->add_flag("--no-shrink", o->no_shrink, "save failures as found, unshrunk");
  sub->add_flag("--quiet", o->quiet, "no progress line on stderr");
  add_space_options(*sub, &o->space);
  sub->callback([o, &context] { context.exit_code = fuzz_command(*o, context.command_line, context.binary); });
}

}  // namespace gdn::cli
