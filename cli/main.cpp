// gdn-testbed: conformance, fuzzing, replay, case files for external implementations.
// Usage: gdn-testbed help (or cli/README.md).
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli/campaign.hpp"
#include "cli/output.hpp"
#include "cli/registry_all.hpp"
#include "cli/sampler.hpp"
#include "cli/suite.hpp"
#include "oracle/case_file.hpp"

#ifndef GDN_SOURCE_DIR
#define GDN_SOURCE_DIR "."
#endif

namespace {

using namespace gdn;
using namespace gdn::cli;

const char* kUsage = R"(gdn-testbed: verification of gated-delta-rule implementations

usage: gdn-testbed <command> [options]

commands:
  conformance  built-in cases (and the golden vectors) against implementations; verdict table,
               exit 1 on any FAIL/ERROR. GPU kernels without a device are SKIPPED, never passed.
                 --impl LIST   comma-separated names, 'all' (default), 'prefix*', '*'
                 --budget B    calibrated | calibrated(factor=F,floor=U) | fixed | fixed(rel_rms=X)
                               | bitwise  (default: each implementation's own)
                 --junit FILE  --json FILE  --verbose  --no-golden
  fuzz         random cases until --seconds or --cases; failures shrunk and saved as case files
               with a replay command; Ctrl-C keeps them and writes the summary. Exit 1 on failures,
               77 when no selected implementation can run here (SKIPPED).
                 --impl LIST (default: the double/long double references)  --seed S (default 1)
                 --seconds S  --cases N (total over shards)  --out DIR (default gdn-fuzz-out)
                 --shard i/n (or from SLURM_ARRAY_TASK_ID/COUNT, JOB_COMPLETION_INDEX+GDN_SHARD_COUNT)
                 --device N (sets CUDA_VISIBLE_DEVICES=N: one process per GPU)
                 --json FILE (default DIR/results-shard-i-of-n.json)  --budget B
                 --max-failures N (saved and shrunk; default 10)  --stop-at-first  --no-shrink
                 --max-K N --max-V N (default 128) --K-multiple M (1) --max-tokens N (1024) --max-sequences N (5)
                 --max-work W (T*HV*K*V cap, 1e6) --intermediate --quiet
  replay FILE  re-run the implementation a case file names (or --impl NAME) and judge it;
               a file with outputs but no runnable implementation is judged on its outputs.
                 --impl NAME  --budget B  --expect pass|fail (exit 0 iff the verdict is that)  --json FILE
  generate     write inputs-only case files for an external implementation
                 --out DIR  --cases N (default 20)  --seed S  --suite fuzz|conformance
                 --first I (start at the campaign's case I: fuzz/I of fuzz --seed S)
                 --max-K N --max-V N --K-multiple M --max-tokens N --max-work W
  verify PATH  judge outputs an external implementation wrote into case files (files or folders)
                 --budget B  --junit FILE  --json FILE  --verbose
  merge        join fuzz shard results: --out FILE RESULTS.json...
  report       make the accuracy and speed reports: runs reports/make_reports.py (default
               --results reports/results --out reports; other arguments passed on)
  list         registered implementations
)";

std::atomic<bool> g_interrupted{false};

extern "C" void on_sigint(int) {
  if (g_interrupted.load()) std::_Exit(130);  // second Ctrl-C: leave now
  g_interrupted.store(true);
}

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// --name value / --name=value / --flag, and positionals. Unknown options are errors.
class Args {
 public:
  Args(std::vector<std::string> args, std::set<std::string> with_value, std::set<std::string> flags) {
    for (std::size_t i = 0; i < args.size(); ++i) {
      std::string a = args[i];
      if (a.rfind("--", 0) != 0 || a == "--") {
        positional_.push_back(a);
        continue;
      }
      std::string value;
      bool has_value = false;
      if (const auto eq = a.find('='); eq != std::string::npos) {
        value = a.substr(eq + 1);
        a = a.substr(0, eq);
        has_value = true;
      }
      if (flags.count(a)) {
        if (has_value) throw UsageError(a + " takes no value");
        values_[a] = "1";
      } else if (with_value.count(a)) {
        if (!has_value) {
          if (i + 1 >= args.size()) throw UsageError(a + " needs a value");
          value = args[++i];
        }
        values_[a] = value;
      } else {
        throw UsageError("unknown option " + a);
      }
    }
  }
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string get(const std::string& name, const std::string& fallback = "") const {
    const auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second;
  }
  double number(const std::string& name, double fallback) const {
    if (!has(name)) return fallback;
    try {
      std::size_t used = 0;
      const double x = std::stod(get(name), &used);
      if (used != get(name).size()) throw std::invalid_argument("trailing");
      return x;
    } catch (const std::exception&) {
      throw UsageError(name + " needs a number, got '" + get(name) + "'");
    }
  }
  long long integer(const std::string& name, long long fallback, long long low = 0) const {
    if (!has(name)) return fallback;
    try {
      std::size_t used = 0;
      const long long x = std::stoll(get(name), &used);
      if (used != get(name).size()) throw std::invalid_argument("trailing");
      if (x < low) throw UsageError(name + " must be >= " + std::to_string(low));
      return x;
    } catch (const UsageError&) {
      throw;
    } catch (const std::exception&) {
      throw UsageError(name + " needs an integer, got '" + get(name) + "'");
    }
  }
  std::uint64_t seed(const std::string& name, std::uint64_t fallback) const {
    if (!has(name)) return fallback;
    try {
      std::size_t used = 0;
      const unsigned long long x = std::stoull(get(name), &used, 0);
      if (used != get(name).size() || get(name)[0] == '-') throw std::invalid_argument("bad");
      return x;
    } catch (const std::exception&) {
      throw UsageError(name + " needs an unsigned integer, got '" + get(name) + "'");
    }
  }
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

std::string command_line(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    const bool quote = a.find_first_of(" \t'\"$*?()") != std::string::npos;
    s += (i ? " " : "") + (quote ? "'" + a + "'" : a);
  }
  return s;
}

std::optional<oracle::BudgetOptions> budget_option(const Args& args) {
  if (!args.has("--budget")) return std::nullopt;
  oracle::BudgetOptions b;
  std::string error;
  if (!oracle::parse_budget(args.get("--budget"), &b, &error)) throw UsageError(error);
  return b;
}

std::vector<const oracle::RegistryEntry*> select(const std::string& names) {
  try {
    return default_registry().select(names);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
}

void write_outputs(const Args& args, const std::string& suite, const std::string& command,
                   const std::vector<oracle::Verdict>& verdicts) {
  if (args.has("--junit")) write_text_file(args.get("--junit"), junit_xml(suite, verdicts));
  if (args.has("--json")) write_text_file(args.get("--json"), verdicts_json(command, verdicts).dump(2) + "\n");
}

int exit_code(const std::vector<oracle::Verdict>& verdicts) {
  const Tally t = tally(verdicts);
  return t.fail + t.error > 0 ? 1 : 0;
}

// The case distribution of fuzz::gen_case, narrowed by the command line. Chunked
// implementations cannot serve per-token states, so those stay off unless asked for.
fuzz::CaseSpace sample_space(const Args& args) {
  fuzz::CaseSpace s = fuzz::CaseSpace::chunked(64);
  s.max_K = static_cast<int>(args.integer("--max-K", 128, 1));
  s.max_V = static_cast<int>(args.integer("--max-V", 128, 1));
  s.K_multiple = static_cast<int>(args.integer("--K-multiple", 1, 1));
  if (s.K_multiple > s.max_K) throw UsageError("--K-multiple must be at most --max-K");
  s.max_tokens = args.integer("--max-tokens", 1024, 1);
  s.max_sequences = static_cast<int>(args.integer("--max-sequences", s.max_sequences, 1));
  s.max_work = args.number("--max-work", 1.0e6);
  s.intermediate_states = args.has("--intermediate");
  return s;
}

// ---- conformance ---------------------------------------------------------------------------

int conformance(const Args& args, const std::string& command) {
  const auto entries = select(args.get("--impl", "all"));
  const auto budget = budget_option(args);
  const auto start = std::chrono::steady_clock::now();
  std::vector<oracle::Verdict> verdicts;
  std::vector<std::unique_ptr<Implementation>> impls;
  for (const auto* e : entries) impls.push_back(e->make());
  for (const GeneratedCase& c : conformance_cases()) {
    // The long double recurrence is the oracle here: the double references are under test too.
    oracle::CaseContext context(c.name, c.problem, c.inputs, oracle::CaseContext::Oracle::f80);
    for (std::size_t i = 0; i < entries.size(); ++i)
      verdicts.push_back(oracle::evaluate(*impls[i], context, budget ? *budget : entries[i]->default_budget));
  }
  std::string golden_note;
  if (!args.has("--no-golden")) {
    bool available = false;
    std::string why;
    try {
      for (oracle::Verdict& v : golden_verdicts(&available, &why)) verdicts.push_back(std::move(v));
    } catch (const std::exception& e) {
      oracle::Verdict v;
      v.case_name = "golden";
      v.implementation = "golden loader";
      v.status = oracle::Status::error;
      v.message = e.what();
      verdicts.push_back(v);
      available = true;
    }
    if (!available) golden_note = "golden vectors: not run (" + why + ")";
  }
  print_table(std::cout, verdicts, args.has("--verbose"));
  if (!golden_note.empty()) std::cout << golden_note << "\n";
  std::cout << "oracle: the recurrence in long double; "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s\n";
  write_outputs(args, "gdn-testbed conformance", command, verdicts);
  return exit_code(verdicts);
}

// ---- fuzz ----------------------------------------------------------------------------------

int fuzz_command(const Args& args, const std::string& command, const std::string& binary) {
  FuzzOptions options;
  if (args.has("--device")) {
    const long long device = args.integer("--device", 0);
    // Before anything touches CUDA: the process sees exactly that GPU, as device 0.
    ::setenv("CUDA_VISIBLE_DEVICES", std::to_string(device).c_str(), 1);
    options.device = static_cast<int>(device);
  }
  // Implementations that cannot run here (a GPU kernel without a device) are reported and left
  // out; when none is left the run is SKIPPED (exit 77, the skip code CTest is given), never
  // a pass.
  for (const oracle::RegistryEntry* e :
       select(args.get("--impl", "reference.chunked.f64,reference.chunked.f64.c37,reference.sequential.f80"))) {
    std::string why;
    if (e->make()->available(&why)) options.implementations.push_back(e);
    else std::cout << "SKIPPED " << e->name << ": " << why << "\n";
  }
  if (options.implementations.empty()) {
    std::cout << "fuzz: SKIPPED, no selected implementation can run here\n";
    return 77;
  }
  options.budget = budget_option(args);
  options.seed = args.seed("--seed", 1);
  options.seconds = args.number("--seconds", 0);
  options.cases = args.integer("--cases", 0);
  if (options.seconds <= 0 && options.cases <= 0) throw UsageError("fuzz needs --seconds S or --cases N");
  if (args.has("--shard")) {
    std::string error;
    if (!parse_shard(args.get("--shard"), &options.shard, &error)) throw UsageError(error);
  } else {
    std::string error;
    if (auto s = shard_from_environment(&error)) options.shard = *s;
    else if (!error.empty()) throw UsageError(error);
  }
  options.out_dir = args.get("--out", "gdn-fuzz-out");
  options.shrink = !args.has("--no-shrink");
  options.max_saved_failures = static_cast<int>(args.integer("--max-failures", 10));
  options.stop_at_first_failure = args.has("--stop-at-first");
  const fuzz::CaseSpace space = sample_space(args);
  options.generator = [space](std::uint64_t seed) { return sample_case(seed, space); };
  options.interrupted = &g_interrupted;
  options.progress = args.has("--quiet") ? nullptr : &std::cerr;
  options.command = command;
  options.binary = binary;
  std::signal(SIGINT, on_sigint);
  std::signal(SIGTERM, on_sigint);  // schedulers send SIGTERM before they kill
  const FuzzResult result = run_fuzz(options);
  const std::string json_path =
      args.get("--json", options.out_dir + "/results-shard-" + std::to_string(options.shard.index) + "-of-" +
                             std::to_string(options.shard.count) + ".json");
  {
    // The directory may not exist when nothing failed.
    std::string dir = json_path.substr(0, json_path.find_last_of('/') == std::string::npos ? 0 : json_path.find_last_of('/'));
    if (!dir.empty()) {
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
  }
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

// ---- replay / verify -----------------------------------------------------------------------

Formulation formulation_of(const oracle::CaseFile& c) {
  return c.meta("gdn.formulation", "chunked") == "sequential" ? Formulation::sequential : Formulation::chunked;
}

int chunk_size_of(const oracle::CaseFile& c) {
  try {
    return std::max(1, std::stoi(c.meta("gdn.chunk_size", "64")));
  } catch (const std::exception&) {
    return 64;
  }
}

oracle::BudgetOptions file_budget(const oracle::CaseFile& c, const std::optional<oracle::BudgetOptions>& given,
                                  const oracle::RegistryEntry* entry) {
  if (given) return *given;
  if (c.metadata.count("gdn.budget")) {
    oracle::BudgetOptions b;
    std::string error;
    if (oracle::parse_budget(c.meta("gdn.budget"), &b, &error)) return b;
  }
  return entry ? entry->default_budget : oracle::BudgetOptions{};
}

int replay(const Args& args, const std::string& command) {
  if (args.positional().empty()) throw UsageError("replay needs a case file");
  const std::string expect = args.get("--expect");
  if (!expect.empty() && expect != "pass" && expect != "fail") throw UsageError("--expect must be pass or fail");
  std::vector<oracle::Verdict> verdicts;
  for (const std::string& path : args.positional()) {
    const oracle::CaseFile c = oracle::read_case_file(path);
    const std::string name = args.get("--impl", c.meta("gdn.implementation"));
    const oracle::RegistryEntry* entry = name.empty() ? nullptr : default_registry().find(name);
    oracle::CaseContext context(c.meta("gdn.case_name", path), c.problem, c.inputs);
    oracle::Verdict v;
    if (entry) {
      auto impl = entry->make();
      v = oracle::evaluate(*impl, context, file_budget(c, budget_option(args), entry));
      v.message += std::string(v.message.empty() ? "" : "; ") + "re-ran " + entry->name;
    } else if (c.outputs && !args.has("--impl")) {
      v = oracle::evaluate_outputs(name.empty() ? "(outputs in file)" : name, formulation_of(c), chunk_size_of(c), context,
                                   *c.outputs, file_budget(c, budget_option(args), nullptr));
      v.message = "judged the outputs stored in the file (" + (name.empty() ? std::string("no implementation named") : name + " is not registered here") + ")";
    } else if (!name.empty()) {
      throw UsageError("implementation '" + name + "' is not registered here (gdn-testbed list)");
    } else {
      throw UsageError(path + " names no implementation and holds no outputs: give --impl NAME");
    }
    v.case_name = path;
    std::cout << v.details() << "\n";
    verdicts.push_back(std::move(v));
  }
  write_outputs(args, "gdn-testbed replay", command, verdicts);
  if (tally(verdicts).skipped == static_cast<int>(verdicts.size())) {
    std::cout << "replay: SKIPPED (the implementation cannot run here)\n";
    return 77;
  }
  if (expect.empty()) return exit_code(verdicts);
  for (const oracle::Verdict& v : verdicts) {
    const bool matches = expect == "pass" ? v.passed() : v.status == oracle::Status::fail;
    if (!matches) {
      std::cout << "expected " << expect << ", got " << oracle::status_name(v.status) << " for " << v.case_name << "\n";
      return 1;
    }
  }
  std::cout << "every verdict is " << expect << ", as expected\n";
  return 0;
}

std::vector<std::string> case_files_under(const std::vector<std::string>& paths) {
  std::vector<std::string> files;
  for (const std::string& p : paths) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) throw UsageError("no such file or folder: " + p);
    if (S_ISDIR(st.st_mode)) {
      std::vector<std::string> found;
      DIR* d = ::opendir(p.c_str());
      while (dirent* e = d ? ::readdir(d) : nullptr) {
        const std::string n = e->d_name;
        if (n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0) found.push_back(p + "/" + n);
      }
      if (d) ::closedir(d);
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else {
      files.push_back(p);
    }
  }
  return files;
}

int verify(const Args& args, const std::string& command) {
  if (args.positional().empty()) throw UsageError("verify needs case files or folders");
  const auto budget = budget_option(args);
  std::vector<oracle::Verdict> verdicts;
  for (const std::string& path : case_files_under(args.positional())) {
    oracle::Verdict v;
    try {
      const oracle::CaseFile c = oracle::read_case_file(path);
      const std::string name = c.meta("gdn.implementation", "(unnamed)");
      oracle::CaseContext context(c.meta("gdn.case_name", path), c.problem, c.inputs);
      if (!c.outputs) {
        v.case_name = context.name();
        v.implementation = name;
        v.status = oracle::Status::error;
        v.message = path + " holds no outputs (out.o): run the external implementation on it first";
      } else {
        v = oracle::evaluate_outputs(name, formulation_of(c), chunk_size_of(c), context, *c.outputs,
                                     budget ? *budget : file_budget(c, std::nullopt, nullptr));
        v.message = path;
      }
    } catch (const oracle::CaseFileError& e) {
      v.case_name = path;
      v.implementation = "(unreadable)";
      v.status = oracle::Status::error;
      v.message = e.what();
    }
    verdicts.push_back(std::move(v));
  }
  print_table(std::cout, verdicts, args.has("--verbose"));
  write_outputs(args, "gdn-testbed verify", command, verdicts);
  return exit_code(verdicts);
}

// ---- generate / merge / report / list ------------------------------------------------------

int generate(const Args& args, const std::string& command) {
  const std::string out = args.get("--out");
  if (out.empty()) throw UsageError("generate needs --out DIR");
  const std::string suite = args.get("--suite", "fuzz");
  if (suite != "fuzz" && suite != "conformance") throw UsageError("--suite must be fuzz or conformance");
  const std::uint64_t seed = args.seed("--seed", 1);
  const long long count = args.integer("--cases", 20, 1);
  ::mkdir(out.c_str(), 0755);
  std::vector<GeneratedCase> cases;
  if (suite == "conformance") {
    cases = conformance_cases();
  } else {
    const fuzz::CaseSpace space = sample_space(args);
    // --first I: the cases a fuzz campaign with the same --seed calls fuzz/I, fuzz/I+1, ...
    const long long first = args.integer("--first", 0);
    for (long long i = first; i < first + count; ++i) {
      GeneratedCase c = sample_case(case_seed(seed, std::uint64_t(i)), space);
      c.name = "generate/" + std::to_string(seed) + "/" + std::to_string(i);
      cases.push_back(std::move(c));
    }
  }
  nlohmann::json manifest = {{"format", "gdn-case-manifest/1"}, {"command", command}, {"cases", nlohmann::json::array()}};
  int index = 0;
  for (const GeneratedCase& g : cases) {
    oracle::CaseFile c;
    c.problem = g.problem;
    c.inputs = g.inputs;
    c.metadata["gdn.case_name"] = g.name;
    c.metadata["gdn.generator"] = g.generator.dump();
    c.metadata["gdn.versions"] = build_versions().dump();
    c.metadata["gdn.command"] = command;
    char name[32];
    std::snprintf(name, sizeof name, "case-%05d.safetensors", index++);
    const std::string path = out + "/" + name;
    oracle::write_case_file(path, c);
    manifest["cases"].push_back({{"file", name}, {"name", g.name}, {"problem", g.problem.describe()}});
  }
  write_text_file(out + "/manifest.json", manifest.dump(2) + "\n");
  std::cout << "wrote " << cases.size() << " case files to " << out << "/ (manifest.json lists them)\n";
  return 0;
}

int merge(const Args& args) {
  const std::string out = args.get("--out");
  if (out.empty() || args.positional().empty()) throw UsageError("merge needs --out FILE and shard result files");
  std::vector<nlohmann::json> shards;
  for (const std::string& path : args.positional()) {
    std::ifstream in(path);
    if (!in) throw UsageError("cannot read " + path);
    try {
      shards.push_back(nlohmann::json::parse(in));
    } catch (const nlohmann::json::exception& e) {
      throw UsageError(path + " is not JSON: " + e.what());
    }
  }
  nlohmann::json merged;
  try {
    merged = merge_results(shards);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  write_text_file(out, merged.dump(2) + "\n");
  std::cout << "merged " << shards.size() << " shards: " << merged["cases"] << " cases, " << merged["failures_total"]
            << " failures";
  if (!merged["missing_shards"].empty()) std::cout << "; missing shards " << merged["missing_shards"].dump();
  std::cout << "\nwrote " << out << "\n";
  return merged["failures_total"].get<std::int64_t>() > 0 ? 1 : 0;
}

int report(std::vector<std::string> rest) {
  // The reports live in reports/ (Python + matplotlib): this only hands the arguments on, with
  // the committed results and the reports folder as defaults.
  const std::string source = GDN_SOURCE_DIR;
  const std::string script = source + "/reports/make_reports.py";
  if (::access(script.c_str(), R_OK) != 0) {
    std::cerr << "gdn-testbed report: " << script << " does not exist\n";
    return 2;
  }
  auto given = [&](const std::string& flag) {
    for (const std::string& a : rest)
      if (a == flag || a.rfind(flag + "=", 0) == 0) return true;
    return false;
  };
  if (!given("--results")) rest.insert(rest.end(), {"--results", source + "/reports/results"});
  if (!given("--out")) rest.insert(rest.end(), {"--out", source + "/reports"});
  std::string cmd = "python3";
  for (const std::string& a : std::vector<std::string>{script}) cmd += " '" + a + "'";
  for (const std::string& a : rest) {
    std::string quoted = "'";
    for (char ch : a) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    cmd += " " + quoted + "'";
  }
  std::cout << "gdn-testbed report: " << cmd << "\n" << std::flush;
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 1;
}

int list() {
  for (const oracle::RegistryEntry& e : default_registry().entries()) {
    std::string why;
    const bool available = e.make()->available(&why);
    std::cout << e.name << (e.in_conformance ? "" : "  [not in 'all']") << (e.gpu ? "  [gpu]" : "")
              << (available ? "" : "  [unavailable: " + why + "]") << "\n    " << e.description
              << "\n    default budget: " << e.default_budget.describe() << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> all(argv + 1, argv + argc);
  const std::string command = command_line(argc, argv);
  const std::string binary = argv[0];
  std::string sub = all.empty() ? "conformance" : all[0];
  std::vector<std::string> rest(all.begin() + (all.empty() ? 0 : 1), all.end());
  if (!all.empty() && all[0].rfind("--", 0) == 0 && all[0] != "--help") {
    sub = "conformance";  // options only: the default command
    rest = all;
  }
  try {
    if (sub == "help" || sub == "--help" || sub == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if (sub == "conformance")
      return conformance(Args(rest, {"--impl", "--budget", "--junit", "--json"}, {"--verbose", "--no-golden"}), command);
    if (sub == "fuzz")
      return fuzz_command(Args(rest,
                               {"--impl", "--budget", "--seed", "--seconds", "--cases", "--shard", "--device", "--out",
                                "--json", "--max-failures", "--max-K", "--max-V", "--K-multiple", "--max-tokens", "--max-sequences",
                                "--max-work"},
                               {"--no-shrink", "--stop-at-first", "--intermediate", "--quiet"}),
                          command, binary);
    if (sub == "replay") return replay(Args(rest, {"--impl", "--budget", "--expect", "--json", "--junit"}, {}), command);
    if (sub == "verify") return verify(Args(rest, {"--budget", "--junit", "--json"}, {"--verbose"}), command);
    if (sub == "generate")
      return generate(Args(rest, {"--out", "--cases", "--first", "--seed", "--suite", "--max-K", "--max-V", "--K-multiple", "--max-tokens", "--max-sequences",
                                  "--max-work"},
                           {"--intermediate"}),
                      command);
    if (sub == "merge") return merge(Args(rest, {"--out"}, {}));
    if (sub == "report") return report(rest);
    if (sub == "list") return list();
    throw UsageError("unknown command '" + sub + "'");
  } catch (const UsageError& e) {
    std::cerr << "gdn-testbed: " << e.what() << "\n(gdn-testbed help for usage)\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "gdn-testbed: " << e.what() << "\n";
    return 2;
  }
}
