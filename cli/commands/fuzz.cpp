// gdn-testbed fuzz: random cases from the property suite's generator until --seconds or
// --cases, every failure shrunk and saved as a case file with the command that replays it.
// Exit 1 when a failure was found, 77 (SKIPPED) when no selected implementation can run here.
// --backward fuzzes the backward (FuzzOptions::backward): cases from the backward's space,
// seeded cotangents, gradients judged, failures saved with in.dO, in.dhT and their gradients.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstring>
#include <ctime>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>

#include "cli/commands/commands.hpp"
#include "cli/commands/options.hpp"
#include "cli/output.hpp"
#include "fuzz/backward_properties.hpp"
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
  bool backward = false;
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

// The --out folder, checked before any case runs: not empty, not the root, created, and
// writable (proved by creating the lock file in it).
std::string checked_out_folder(const std::string& out) {
  if (out.empty()) throw UsageError("--out: must name a folder, got ''");
  make_parent_folders(out + "/");
  struct stat st {};
  if (::stat(out.c_str(), &st) != 0)
    throw UsageError("--out: cannot create the folder " + out + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) throw UsageError("--out: " + out + " exists and is not a folder");
  char resolved[PATH_MAX];
  if (::realpath(out.c_str(), resolved) != nullptr && std::string(resolved) == "/")
    throw UsageError("--out: refusing the root folder '/': failures and temporaries would be written there");
  return out;
}

// Takes OUT/.gdn-fuzz-shard-i-of-n.lock for the life of the process (flock: released by the
// kernel when the process ends, however it ends). A second fuzz run on the same --out and
// shard would overwrite this one's results file: it is refused, naming the holder.
void lock_out_folder(const std::string& out, const Shard& shard) {
  const std::string path = out + "/.gdn-fuzz-shard-" + std::to_string(shard.index) + "-of-" +
                           std::to_string(shard.count) + ".lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw UsageError("--out: cannot write to " + out + " (" + path + ": " + std::strerror(errno) + ")");
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char holder[32] = {0};
    (void)!::pread(fd, holder, sizeof holder - 1, 0);
    ::close(fd);
    throw UsageError("--out: another fuzz run (pid " + std::string(holder[0] ? holder : "?") + ") is writing shard " +
                     std::to_string(shard.index) + "/" + std::to_string(shard.count) + " into " + out +
                     ": use another --out or --shard, or wait for it");
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size()))
    throw UsageError("--out: cannot write to " + out + " (" + path + ": " + std::strerror(errno) + ")");
  // fd stays open (and locked) until the process exits.
}

// Removes the write temporaries (NAME.tmp.PID.N, oracle::write_file_atomic) that a killed run
// left in `out`: those whose process is gone on this machine and that are older than a minute
// (a live run on another machine sharing the folder finishes a write within that).
void remove_stale_temporaries(const std::string& out, std::ostream& log) {
  DIR* d = ::opendir(out.c_str());
  if (d == nullptr) return;
  const std::time_t now = std::time(nullptr);
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    const auto tmp = n.rfind(".tmp.");
    if (tmp == std::string::npos) continue;
    const std::string tail = n.substr(tmp + 5);  // PID.N
    const auto dot = tail.find('.');
    if (dot == std::string::npos || dot == 0 || dot + 1 == tail.size() ||
        tail.find_first_not_of("0123456789.") != std::string::npos || tail.find('.', dot + 1) != std::string::npos ||
        dot > 9)
      continue;
    const long pid = std::strtol(tail.substr(0, dot).c_str(), nullptr, 10);
    if (pid <= 0 || pid == ::getpid() || !(::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)) continue;
    const std::string path = out + "/" + n;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || now - st.st_mtime < 60) continue;
    if (::unlink(path.c_str()) == 0) log << "fuzz: removed " << path << ", left by a run that was killed\n";
  }
  ::closedir(d);
}

int fuzz_command(const FuzzCommandOptions& o, const std::string& command, const std::string& binary) {
  FuzzOptions options;
  if (o.device_option->count() > 0) {
    // Before anything touches CUDA: the process sees exactly that GPU, as device 0.
    ::setenv("CUDA_VISIBLE_DEVICES", std::to_string(o.device).c_str(), 1);
    options.device = static_cast<int>(o.device);
  }
  // Every usage check comes before any work, and before SKIPPED (77) is decided.
  const std::vector<const oracle::RegistryEntry*> selected = select(o.impl);
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
  if (o.backward && o.space.intermediate_option->count() > 0)
    throw UsageError("--intermediate: the backward does not differentiate per-token states (docs/backward.md, Scope); "
                     "leave it out with --backward");
  // --backward: the space restricted to what the backward covers (fuzz::backward_space).
  const fuzz::CaseSpace space = o.backward ? fuzz::backward_space(o.space.space()) : o.space.space();
  // A budget that cannot judge an implementation would make every case an ERROR: refused here.
  // The backward's operand model is of the chunked form at any C (oracle::emulate_backward_operands).
  if (options.budget && options.budget->baseline != oracle::BudgetBaseline::emulation &&
      options.budget->model == oracle::BudgetModel::calibrated) {
    for (const oracle::RegistryEntry* e : selected) {
      const auto impl = e->make();
      if (o.backward) {
        if (impl->has_backward() && impl->backward_formulation() != Formulation::chunked)
          throw UsageError("--budget " + options.budget->describe() + " does not apply to the gradients of " + e->name +
                           ": the backward's operand model is of the chunked form, and its backward is sequential "
                           "(use baseline=emulation)");
        continue;
      }
      if (impl->formulation() != Formulation::chunked || impl->chunk_size() != 64 || space.intermediate_states)
        throw UsageError("--budget " + options.budget->describe() + " does not apply to " + e->name +
                         ": baseline=operands_single needs a chunked formulation at C = 64 without --intermediate");
    }
  }
  options.out_dir = checked_out_folder(o.out);
  if (!o.json.empty()) make_parent_folders(o.json);
  lock_out_folder(options.out_dir, options.shard);
  remove_stale_temporaries(options.out_dir, std::cerr);
  // Implementations that cannot run here (a GPU kernel without a device) are reported and left
  // out; when none is left the run is SKIPPED (exit 77, the skip code CTest is given), never
  // a pass.
  for (const oracle::RegistryEntry* e : selected) {
    std::string why;
    const auto impl = e->make();
    if (!impl->available(&why)) std::cout << "SKIPPED " << e->name << ": " << why << "\n";
    else if (o.backward && !impl->has_backward()) std::cout << "SKIPPED " << e->name << ": no backward\n";
    else options.implementations.push_back(e);
  }
  if (options.implementations.empty()) {
    std::cout << "fuzz: SKIPPED, no selected implementation can run here" << (o.backward ? " with a backward" : "")
              << "\n";
    return 77;
  }
  options.shrink = !o.no_shrink;
  options.max_saved_failures = static_cast<int>(o.max_failures);
  options.stop_at_first_failure = o.stop_at_first;
  options.backward = o.backward;
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
  write_text_file(json_path, dump_json(result.to_json(options)));
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
    if (f.nondeterministic)
      std::cout << "FAILURE " << f.verdict.summary() << "\n  " << f.note << "\n  replay: " << f.replay << "\n";
    else
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
  add_number(*sub, "--seconds", &o->seconds, 0, 1e9, "stop after S seconds (0: no time limit)")->type_name("S");
  add_integer(*sub, "--cases", &o->cases, 0, LLONG_MAX, "stop after N cases, the total over all shards (0: no limit)")
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
  o->device_option = add_integer(*sub, "--device", &o->device, 0, INT_MAX,
                                 "set CUDA_VISIBLE_DEVICES=N before anything touches CUDA: one process per GPU")
                         ->type_name("N")
                         ->default_str("");
  sub->add_option("--out", o->out, "folder for the failures' case files and the results")
      ->type_name("DIR")
      ->capture_default_str();
  sub->add_option("--json", o->json, "the results (gdn-fuzz-results/1); default DIR/results-shard-i-of-n.json")
      ->type_name("FILE");
  add_integer(*sub, "--max-failures", &o->max_failures, 0, INT_MAX, "failures shrunk and saved; later ones are only counted")
      ->type_name("N");
  sub->add_flag("--stop-at-first", o->stop_at_first, "stop at the first failure");
  sub->add_flag("--no-shrink", o->no_shrink, "save failures as found, unshrunk");
  sub->add_flag("--quiet", o->quiet, "no progress line on stderr");
  sub->add_flag("--backward", o->backward,
                "fuzz the backward: cases without a state cache or per-token states, cotangents dO, dhT drawn from "
                "each case's seed, gradients judged under each implementation's backward budget; failures saved with "
                "in.dO, in.dhT and the gradients (gdn-case/2). Implementations without a backward are SKIPPED");
  add_space_options(*sub, &o->space);
  sub->callback([o, &context] { context.exit_code = fuzz_command(*o, context.command_line, context.binary); });
}

}  // namespace gdn::cli
