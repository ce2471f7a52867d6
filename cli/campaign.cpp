#include "cli/campaign.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <limits>
#include <ostream>
#include <sstream>
#include <set>
#include <cerrno>
#include <cstring>

#include "fuzz/backward_properties.hpp"
#include "oracle/backward_budget.hpp"
#include "oracle/case_file.hpp"


namespace gdn::cli {

namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

bool parse_int(const std::string& text, long long* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

nlohmann::json number(double x) {
  if (std::isfinite(x)) return x;
  if (std::isnan(x)) return "nan";
  return x > 0 ? "inf" : "-inf";
}

void make_directories(const std::string& path) {
  std::string partial;
  std::stringstream parts(path);
  std::string part;
  if (!path.empty() && path[0] == '/') partial = "/";
  while (std::getline(parts, part, '/')) {
    if (part.empty()) continue;
    partial += part + "/";
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST)
      throw std::runtime_error("cannot create directory " + partial + ": " + std::strerror(errno));
  }
}

std::string hex(std::uint64_t x) {
  char buffer[17];
  std::snprintf(buffer, sizeof buffer, "%016llx", static_cast<unsigned long long>(x));
  return buffer;
}

std::string safe_name(std::string s) {
  for (char& c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_')) c = '_';
  return s;
}

std::string format_seconds(double s) {
  char buffer[32];
  if (s >= 3600) std::snprintf(buffer, sizeof buffer, "%dh%02dm", int(s / 3600), int(std::fmod(s, 3600) / 60));
  else if (s >= 60) std::snprintf(buffer, sizeof buffer, "%dm%02ds", int(s / 60), int(std::fmod(s, 60)));
  else std::snprintf(buffer, sizeof buffer, "%.0fs", s);
  return buffer;
}

}  // namespace

std::uint64_t case_seed(std::uint64_t campaign_seed, std::uint64_t index) {
  return splitmix64(splitmix64(campaign_seed) ^ (index * 0xd1b54a32d192ed03ull + 1));
}

bool parse_shard(const std::string& text, Shard* out, std::string* error) {
  const auto slash = text.find('/');
  long long i = 0, n = 0;
  if (slash == std::string::npos || !parse_int(text.substr(0, slash), &i) || !parse_int(text.substr(slash + 1), &n)) {
    *error = "--shard must be i/n (e.g. 0/4), got '" + text + "'";
    return false;
  }
  if (n < 1 || n > 1000000 || i < 0 || i >= n) {
    *error = "--shard i/n needs n >= 1 and 0 <= i < n, got '" + text + "'";
    return false;
  }
  out->index = static_cast<int>(i);
  out->count = static_cast<int>(n);
  return true;
}

std::optional<Shard> shard_from_environment(std::string* error) {
  auto env = [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (!v || !*v) return std::nullopt;
    return std::string(v);
  };
  long long id = 0, count = 0, minimum = 0;
  if (auto task = env("SLURM_ARRAY_TASK_ID")) {
    const auto total = env("SLURM_ARRAY_TASK_COUNT");
    if (!parse_int(*task, &id) || !total || !parse_int(*total, &count)) {
      *error = "SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT are not integers";
      return std::nullopt;
    }
    if (auto low = env("SLURM_ARRAY_TASK_MIN")) {
      if (!parse_int(*low, &minimum)) {
        *error = "SLURM_ARRAY_TASK_MIN is not an integer";
        return std::nullopt;
      }
    }
    // Arrays with a step (--array=0-30:10) have gaps: shards would not cover the campaign.
    if (auto step = env("SLURM_ARRAY_TASK_STEP"); step && *step != "1") {
      *error = "SLURM_ARRAY_TASK_STEP = " + *step + ": use a contiguous array (--array=0-N) for shards";
      return std::nullopt;
    }
    id -= minimum;
  } else if (auto index = env("JOB_COMPLETION_INDEX")) {
    const auto total = env("GDN_SHARD_COUNT");
    if (!parse_int(*index, &id) || !total || !parse_int(*total, &count)) {
      *error = "JOB_COMPLETION_INDEX is set: also set GDN_SHARD_COUNT to the Job's completions (integers)";
      return std::nullopt;
    }
  } else {
    return std::nullopt;
  }
  if (count < 1 || id < 0 || id >= count) {
    *error = "shard from the environment is " + std::to_string(id) + " of " + std::to_string(count) +
             ": needs 0 <= index < count";
    return std::nullopt;
  }
  return Shard{static_cast<int>(id), static_cast<int>(count)};
}

nlohmann::json FuzzResult::to_json(const FuzzOptions& options) const {
  nlohmann::json j;
  j["format"] = "gdn-fuzz-results/1";
  j["seed"] = std::to_string(options.seed);
  j["shard"] = {{"index", options.shard.index}, {"count", options.shard.count}};
  j["device"] = options.device;
  j["command"] = options.command;
  j["versions"] = build_versions();
  j["implementations"] = nlohmann::json::array();
  for (const auto* e : options.implementations) j["implementations"].push_back(e->name);
  j["budget"] = options.budget ? options.budget->describe() : "per implementation";
  j["cases_limit"] = options.cases;  // --cases, the campaign's total (0: none): merge compares it
  j["backward"] = options.backward;
  j["cases"] = cases;
  j["seconds"] = seconds;
  j["cases_per_second"] = seconds > 0 ? cases / seconds : 0.0;
  j["interrupted"] = interrupted;
  j["stop_reason"] = stop_reason;
  j["failures_total"] = failures_total;
  j["failures_not_saved"] = failures_not_saved;
  j["tallies"] = nlohmann::json::object();
  for (const auto& [name, t] : tallies)
    j["tallies"][name] = {{"pass", t.pass}, {"fail", t.fail}, {"error", t.error}, {"skipped", t.skipped},
                          {"worst_margin", number(t.worst_margin)}, {"worst_case", t.worst_case}};
  j["failures"] = nlohmann::json::array();
  for (const FuzzFailure& f : failures)
    j["failures"].push_back({{"implementation", f.implementation},
                             {"case_index", f.case_index},
                             {"case_seed", std::to_string(f.case_seed)},
                             {"original_problem", f.original_problem},
                             {"shrunk_problem", f.shrunk_problem},
                             {"file", f.file},
                             {"original_file", f.original_file},
                             {"replay", f.replay},
                             {"status", oracle::status_name(f.verdict.status)},
                             {"summary", f.verdict.summary()},
                             {"original_summary", f.original_verdict.summary()},
                             {"shrink_evaluations", f.shrink_evaluations},
                             {"shrink_seconds", f.shrink_seconds},
                             {"shrink_steps", f.shrink_steps},
                             {"found_after_seconds", f.found_after_seconds},
                             {"nondeterministic", f.nondeterministic},
                             {"note", f.note},
                             {"verdict", oracle::to_json(f.verdict)}});
  return j;
}

namespace {

std::map<std::string, std::string> common_metadata(const FuzzOptions& options, const oracle::RegistryEntry& entry,
                                                   const Implementation& impl, const oracle::BudgetOptions& budget) {
  std::map<std::string, std::string> m;
  m["gdn.implementation"] = entry.name;
  // The formulation the file is judged by: the backward's for a backward campaign.
  const Formulation formulation = options.backward ? impl.backward_formulation() : impl.formulation();
  m["gdn.formulation"] = formulation == Formulation::chunked ? "chunked" : "sequential";
  if (formulation == Formulation::chunked) m["gdn.chunk_size"] = std::to_string(impl.chunk_size());
  m["gdn.budget"] = budget.describe();
  m["gdn.versions"] = build_versions().dump();
  m["gdn.device"] = options.device >= 0 ? "device " + std::to_string(options.device) : "cpu";
  m["gdn.command"] = options.command;
  return m;
}

// One case as the campaign judges it: the forward (oracle::CaseContext) or, for a backward
// campaign, the backward on the cotangents drawn from the case's seed for this case's shape
// (oracle::BackwardContext). The oracle's results are computed once and shared by every
// implementation judged on it.
class CaseJudge {
 public:
  CaseJudge(bool backward, const std::string& name, const Problem& problem, const Inputs& inputs, std::uint64_t seed)
      : backward_(backward), name_(name), problem_(problem) {
    if (!backward) {
      forward_.emplace(name, problem, inputs);
    } else if (oracle::backward_in_scope(problem, &out_of_scope_)) {
      cotangents_ = fuzz::make_backward_inputs(problem, seed);
      backward_context_.emplace(name, problem, inputs, cotangents_);
    }
  }
  oracle::Verdict evaluate(Implementation& impl, const oracle::BudgetOptions& budget, Outputs<double>* outputs = nullptr,
                           Gradients<double>* gradients = nullptr) {
    if (!backward_) return oracle::evaluate(impl, *forward_, budget, outputs);
    if (backward_context_) return oracle::evaluate_backward(impl, *backward_context_, budget, gradients);
    oracle::Verdict v;  // a space wider than the backward's scope: nothing to judge
    v.case_name = name_;
    v.implementation = impl.name();
    v.problem = problem_.describe();
    v.budget = budget.describe();
    v.status = oracle::Status::skipped;
    v.message = "outside the backward's scope: " + out_of_scope_;
    return v;
  }
  // Empty (dO undefined) when the case is outside the backward's scope or not a backward case.
  const BackwardInputs& cotangents() const { return cotangents_; }

 private:
  bool backward_;
  std::string name_;
  Problem problem_;
  std::string out_of_scope_;
  BackwardInputs cotangents_;
  std::optional<oracle::CaseContext> forward_;
  std::optional<oracle::BackwardContext> backward_context_;
};

}  // namespace

FuzzResult run_fuzz(const FuzzOptions& options) {
  if (!options.generator) throw std::invalid_argument("run_fuzz: no case generator");
  if (options.implementations.empty()) throw std::invalid_argument("run_fuzz: no implementation selected");
  if (options.seconds <= 0 && options.cases <= 0)
    throw std::invalid_argument("fuzz needs a limit: --seconds or --cases");
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(clock::now() - start).count(); };
  auto interrupted = [&] { return options.interrupted && options.interrupted->load(); };

  struct Subject {
    const oracle::RegistryEntry* entry;
    std::unique_ptr<Implementation> impl;
    oracle::BudgetOptions budget;
  };
  std::vector<Subject> subjects;
  for (const oracle::RegistryEntry* e : options.implementations) {
    const oracle::BudgetOptions budget = !options.backward ? (options.budget ? *options.budget : e->default_budget)
                                         : options.budget  ? *options.budget
                                                           : oracle::backward_budget_of(*e);
    subjects.push_back({e, e->make(), budget});
  }

  FuzzResult result;
  std::int64_t saved = 0;
  double next_progress = options.progress_interval;
  const bool tty = options.progress && isatty(STDERR_FILENO);
  auto progress_line = [&](bool final) {
    if (!options.progress) return;
    const double t = elapsed();
    std::ostringstream line;
    line << "[fuzz shard " << options.shard.index << "/" << options.shard.count << "] " << result.cases << " cases";
    if (options.cases > 0) {
      const std::int64_t mine = (options.cases - options.shard.index + options.shard.count - 1) / options.shard.count;
      line << " of " << mine;
    }
    line << ", " << result.failures_total << " failures, " << std::fixed << std::setprecision(1)
         << (t > 0 ? result.cases / t : 0.0) << " cases/s, " << format_seconds(t) << " elapsed";
    if (options.seconds > 0) line << ", " << format_seconds(std::max(0.0, options.seconds - t)) << " left";
    else if (options.cases > 0 && result.cases > 0) {
      const std::int64_t mine = (options.cases - options.shard.index + options.shard.count - 1) / options.shard.count;
      line << ", ~" << format_seconds(t / result.cases * double(mine - result.cases)) << " left";
    }
    if (tty) *options.progress << "\r" << line.str() << (final ? "\n" : "   ") << std::flush;
    else *options.progress << line.str() << "\n" << std::flush;
  };

  for (std::int64_t local = 0;; ++local) {
    const std::uint64_t index = std::uint64_t(options.shard.index) + std::uint64_t(options.shard.count) * std::uint64_t(local);
    if (options.cases > 0 && index >= std::uint64_t(options.cases)) {
      result.stop_reason = "cases done";
      break;
    }
    if (options.seconds > 0 && elapsed() >= options.seconds) {
      result.stop_reason = "time limit";
      break;
    }
    if (interrupted()) {
      result.interrupted = true;
      result.stop_reason = "interrupted";
      break;
    }
    const std::uint64_t seed = case_seed(options.seed, index);
    GeneratedCase generated = options.generator(seed);
    const std::string name = "fuzz/" + std::to_string(index);
    CaseJudge context(options.backward, name, generated.problem, generated.inputs, seed);
    ++result.cases;
    bool stop = false;
    for (Subject& s : subjects) {
      Outputs<double> actual;
      Gradients<double> actual_gradients;
      const oracle::Verdict v = context.evaluate(*s.impl, s.budget, &actual, &actual_gradients);
      ImplementationTally& tally = result.tallies[s.entry->name];
      switch (v.status) {
        case oracle::Status::pass: ++tally.pass; break;
        case oracle::Status::fail: ++tally.fail; break;
        case oracle::Status::error: ++tally.error; break;
        case oracle::Status::skipped: ++tally.skipped; break;
      }
      if (v.status == oracle::Status::pass || v.status == oracle::Status::fail) {
        const double m = v.worst_margin();
        if (m > tally.worst_margin || std::isnan(m)) {
          tally.worst_margin = m;
          tally.worst_case = name + " seed " + std::to_string(seed);
        }
      }
      if (!v.failed()) continue;
      ++result.failures_total;
      FuzzFailure f;
      f.implementation = s.entry->name;
      f.case_index = static_cast<std::int64_t>(index);
      f.case_seed = seed;
      f.original_problem = generated.problem.describe();
      f.original_verdict = v;
      f.verdict = v;
      f.found_after_seconds = elapsed();
      if (saved >= options.max_saved_failures) {
        // Counted only: a broken implementation fails nearly every case, and a list of tens of
        // thousands of unsaved failures would only bloat the results.
        ++result.failures_not_saved;
        continue;
      }
      make_directories(options.out_dir);
      const std::string stem = options.out_dir + "/" + safe_name(s.entry->name) + "-" + hex(seed);
      auto metadata = common_metadata(options, *s.entry, *s.impl, s.budget);
      f.original_file = stem + ".original.safetensors";
      // A failure must repeat on the same inputs before it is shrunk: one that does not is a
      // race, uninitialised memory or another nondeterminism, and shrinking it would chase noise
      // (a shrunk case that passes on replay, saved as a failure). Such a failure keeps its
      // original case, and the note says to run the sanitizers.
      const std::string nondeterministic_note =
          "NONDETERMINISTIC: the failure did not repeat on the same inputs (a race, uninitialised memory or "
          "another run-to-run difference); the original case is kept unshrunk. Replay it several times and "
          "under compute-sanitizer --tool racecheck, then --tool initcheck";
      {
        CaseJudge again(options.backward, name, generated.problem, generated.inputs, seed);
        f.nondeterministic = again.evaluate(*s.impl, s.budget).status != v.status;
      }
      ConcreteCase smallest{generated.problem, generated.inputs};
      if (options.shrink && !f.nondeterministic) {
        const oracle::Status wanted = v.status;
        ShrinkOptions so = options.shrink_options;
        so.interrupted = interrupted;
        const ShrinkResult shrunk = shrink(
            smallest,
            [&](const ConcreteCase& c) {
              // A backward candidate gets the cotangents drawn from the case's seed for its shape.
              CaseJudge candidate(options.backward, name, c.problem, c.inputs, seed);
              return candidate.evaluate(*s.impl, s.budget).status == wanted;
            },
            so);
        smallest = shrunk.smallest;
        f.shrink_evaluations = shrunk.evaluations;
        f.shrink_seconds = shrunk.seconds;
        f.shrink_steps = shrunk.steps;
      }
      Outputs<double> shrunk_outputs;
      Gradients<double> shrunk_gradients;
      std::optional<CaseJudge> shrunk_context;
      if (!f.nondeterministic) {
        shrunk_context.emplace(options.backward, name + " (shrunk)", smallest.problem, smallest.inputs, seed);
        f.verdict = shrunk_context->evaluate(*s.impl, s.budget, &shrunk_outputs, &shrunk_gradients);
        // Every accepted shrink step failed; a shrunk case that no longer fails means the
        // implementation did not repeat itself on one of them.
        if (f.verdict.status != v.status) f.nondeterministic = true;
      }
      if (f.nondeterministic) {
        f.verdict = v;
        f.note = nondeterministic_note;
        f.shrunk_problem = f.original_problem;
        f.file = f.original_file;
      } else {
        f.shrunk_problem = smallest.problem.describe();
        f.file = stem + ".safetensors";
      }
      // A backward case file holds its cotangents (drawn from the case's seed, as
      // generate --backward writes them) and, for a FAIL, the gradients that failed.
      auto add_backward = [&](oracle::CaseFile& file, const CaseJudge& judged, const Gradients<double>& gradients,
                              oracle::Status status) {
        if (!options.backward || !judged.cotangents().dO.defined()) return;
        file.backward = judged.cotangents();
        if (status == oracle::Status::fail) file.gradients = gradients;
        file.metadata["gdn.backward"] =
            nlohmann::json{{"seed", std::to_string(seed)}, {"generator", "fuzz::make_backward_inputs"}}.dump();
      };
      // The case as generated, with the outputs (or gradients) that failed.
      {
        oracle::CaseFile file;
        file.problem = generated.problem;
        file.inputs = generated.inputs;
        if (v.status == oracle::Status::fail && !options.backward) file.outputs = actual;
        file.metadata = metadata;
        add_backward(file, context, actual_gradients, v.status);
        file.metadata["gdn.case_name"] = name;
        file.metadata["gdn.generator"] = generated.generator.dump();
        file.metadata["gdn.verdict"] = oracle::to_json(v).dump();
        file.metadata["gdn.replay"] = options.binary + " replay " + f.original_file;
        if (f.nondeterministic) file.metadata["gdn.note"] = f.note;
        oracle::write_case_file(f.original_file, file);
      }
      f.replay = options.binary + " replay " + f.file;
      if (!f.nondeterministic) {
        oracle::CaseFile file;
        file.problem = smallest.problem;
        file.inputs = smallest.inputs;
        if (f.verdict.status == oracle::Status::fail && !options.backward) file.outputs = shrunk_outputs;
        file.metadata = metadata;
        add_backward(file, *shrunk_context, shrunk_gradients, f.verdict.status);
        file.metadata["gdn.case_name"] = name + " (shrunk)";
        file.metadata["gdn.shrunk_from"] = f.original_file;
        nlohmann::json steps = f.shrink_steps;
        file.metadata["gdn.shrink_steps"] = steps.dump();
        file.metadata["gdn.verdict"] = oracle::to_json(f.verdict).dump();
        file.metadata["gdn.replay"] = f.replay;
        oracle::write_case_file(f.file, file);
      }
      ++saved;
      if (options.progress) {
        if (tty) *options.progress << "\n";
        if (f.nondeterministic)
          *options.progress << "FAILURE " << f.verdict.summary() << "\n  " << f.note << "\n  replay: " << f.replay << "\n"
                            << std::flush;
        else
          *options.progress << "FAILURE " << f.verdict.summary() << "\n  shrunk from " << f.original_problem << "\n  to "
                            << f.shrunk_problem << " in " << f.shrink_evaluations << " evaluations\n  replay: "
                            << f.replay << "\n"
                            << std::flush;
      }
      result.failures.push_back(std::move(f));
      if (options.stop_at_first_failure) stop = true;
    }
    if (stop) {
      result.stop_reason = "first failure";
      break;
    }
    if (elapsed() >= next_progress) {
      progress_line(false);
      next_progress = elapsed() + options.progress_interval;
    }
  }
  result.seconds = elapsed();
  progress_line(true);
  return result;
}

}  // namespace gdn::cli
