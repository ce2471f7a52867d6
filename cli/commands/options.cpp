#include "cli/commands/options.hpp"

#include "cli/output.hpp"
#include "cli/registry_all.hpp"

namespace gdn::cli {

namespace {

// CLI11 reads integers with strtoll's base 0 (010 is eight): these transforms check the text
// and hand CLI11 the value in decimal, so what is accepted does not depend on that.
CLI::Validator integer_at_least(long long low) {
  return CLI::Validator(
      [low](std::string& text) -> std::string {
        long long x = 0;
        try {
          std::size_t used = 0;
          x = std::stoll(text, &used);
          if (used != text.size()) throw std::invalid_argument("trailing");
        } catch (const std::exception&) {
          return "needs an integer, got '" + text + "'";
        }
        if (x < low) return "must be >= " + std::to_string(low) + ", got " + text;
        text = std::to_string(x);
        return "";
      },
      "");
}

CLI::Validator unsigned_seed() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          std::size_t used = 0;
          const unsigned long long x = std::stoull(text, &used, 0);
          if (used != text.size() || text[0] == '-') throw std::invalid_argument("bad");
          text = std::to_string(x);
          return "";
        } catch (const std::exception&) {
          return "needs an unsigned integer, got '" + text + "'";
        }
      },
      "");
}

CLI::Validator number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          std::size_t used = 0;
          (void)std::stod(text, &used);
          if (used == text.size()) return "";
        } catch (const std::exception&) {
        }
        return "needs a number, got '" + text + "'";
      },
      "");
}

}  // namespace

CLI::Option* add_integer(CLI::App& app, const std::string& name, long long* value, long long low,
                         const std::string& help) {
  return app.add_option(name, *value, help)->transform(integer_at_least(low))->capture_default_str();
}

CLI::Option* add_seed(CLI::App& app, const std::string& name, std::uint64_t* value, const std::string& help) {
  return app.add_option(name, *value, help)->transform(unsigned_seed())->capture_default_str();
}

CLI::Option* add_number(CLI::App& app, const std::string& name, double* value, const std::string& help) {
  return app.add_option(name, *value, help)->transform(number())->capture_default_str();
}

std::optional<oracle::BudgetOptions> BudgetChoice::get() const {
  if (option == nullptr || option->count() == 0) return std::nullopt;
  oracle::BudgetOptions b;
  std::string error;
  if (!oracle::parse_budget(text, &b, &error)) throw UsageError(error);
  return b;
}

void add_budget(CLI::App& app, BudgetChoice* budget, const std::string& when_absent) {
  budget->option = app.add_option("--budget", budget->text,
                                  "calibrated | calibrated(factor=F,floor=U) | fixed | fixed(rel_rms=X) | bitwise "
                                  "(docs/budgets.md); default: " + when_absent)
                       ->type_name("B")
                       ->check(
                           [](const std::string& text) {
                             oracle::BudgetOptions b;
                             std::string error;
                             return oracle::parse_budget(text, &b, &error) ? std::string() : error;
                           },
                           "");
}

fuzz::CaseSpace SpaceOptions::space() const {
  fuzz::CaseSpace s = fuzz::CaseSpace::chunked(64);
  s.max_K = static_cast<int>(max_K);
  s.max_V = static_cast<int>(max_V);
  s.K_multiple = static_cast<int>(K_multiple);
  if (s.K_multiple > s.max_K) throw UsageError("--K-multiple must be at most --max-K");
  s.max_tokens = max_tokens;
  s.max_sequences = static_cast<int>(max_sequences);
  s.max_work = max_work;
  s.intermediate_states = intermediate;
  return s;
}

void add_space_options(CLI::App& app, SpaceOptions* space) {
  const std::string group = "Case space (fuzz::gen_case)";
  add_integer(app, "--max-K", &space->max_K, 1, "largest key head size K")->group(group);
  add_integer(app, "--max-V", &space->max_V, 1, "largest value head size V")->group(group);
  add_integer(app, "--K-multiple", &space->K_multiple, 1,
              "K rounded up to a multiple of M (16 for the chunked prefill); at most --max-K")
      ->type_name("M")
      ->group(group);
  add_integer(app, "--max-tokens", &space->max_tokens, 1, "most tokens T of a case")->group(group);
  add_integer(app, "--max-sequences", &space->max_sequences, 1, "most sequences N of a case")->group(group);
  add_number(app, "--max-work", &space->max_work, "cap on the work T*HV*K*V")->group(group);
  app.add_flag("--intermediate", space->intermediate, "draw per-token intermediate states too (not for chunked "
                                                        "implementations)")
      ->group(group);
}

void VerdictFiles::write(const std::string& suite, const std::string& command,
                         const std::vector<oracle::Verdict>& verdicts) const {
  if (!junit.empty()) write_text_file(junit, junit_xml(suite, verdicts));
  if (!json.empty()) write_text_file(json, verdicts_json(command, verdicts).dump(2) + "\n");
}

void add_verdict_files(CLI::App& app, VerdictFiles* files, bool junit) {
  if (junit) app.add_option("--junit", files->junit, "write the verdicts as JUnit XML")->type_name("FILE");
  app.add_option("--json", files->json, "write the verdicts as JSON (gdn-verdicts/1)")->type_name("FILE");
}

std::vector<const oracle::RegistryEntry*> select(const std::string& names) {
  try {
    return default_registry().select(names);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
}

int exit_code(const std::vector<oracle::Verdict>& verdicts) {
  const Tally t = tally(verdicts);
  return t.fail + t.error > 0 ? 1 : 0;
}

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

}  // namespace gdn::cli
