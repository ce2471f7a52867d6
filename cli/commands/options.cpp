#include "cli/commands/options.hpp"

#include <cerrno>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdlib>

#include "cli/output.hpp"
#include "fuzz/sample.hpp"
#include "cli/registry_all.hpp"

namespace gdn::cli {

namespace {

// CLI11 reads integers with strtoll's base 0 (010 is eight, 0x10 sixteen): these transforms
// check the text themselves and hand CLI11 the value in decimal, so what is accepted does not
// depend on that. Integers are decimal digits with an optional leading '-', nothing else (no
// spaces, no '+', no 0x); leading zeros are decimal digits (010 is ten). The value must lie in
// [low, high]: an option stored in an int cannot wrap (--max-K 4294967298 is refused, not 2).
bool decimal_digits(const std::string& text, std::size_t from) {
  if (text.size() <= from) return false;
  for (std::size_t i = from; i < text.size(); ++i)
    if (text[i] < '0' || text[i] > '9') return false;
  return true;
}

CLI::Validator integer_in(long long low, long long high) {
  return CLI::Validator(
      [low, high](std::string& text) -> std::string {
        long long x = 0;
        const bool negative = !text.empty() && text[0] == '-';
        if (!decimal_digits(text, negative ? 1 : 0)) return "needs a decimal integer, got '" + text + "'";
        errno = 0;
        char* end = nullptr;
        x = std::strtoll(text.c_str(), &end, 10);
        if (errno == ERANGE || x < low || x > high)
          return "must be in [" + std::to_string(low) + ", " + std::to_string(high) + "], got " + text;
        text = std::to_string(x);
        return "";
      },
      "");
}

// Seeds: decimal (leading zeros are decimal: 010 is ten), or hexadecimal with an explicit 0x;
// at most 2^64 - 1.
CLI::Validator unsigned_seed() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const bool hex = text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X');
        bool ok = hex ? text.find_first_not_of("0123456789abcdefABCDEF", 2) == std::string::npos
                      : decimal_digits(text, 0);
        unsigned long long x = 0;
        if (ok) {
          errno = 0;
          char* end = nullptr;
          x = std::strtoull(hex ? text.c_str() + 2 : text.c_str(), &end, hex ? 16 : 10);
          ok = errno != ERANGE && *end == '\0';
        }
        if (!ok) return "needs an unsigned decimal integer or 0x hexadecimal below 2^64, got '" + text + "'";
        text = std::to_string(x);
        return "";
      },
      "");
}

// A finite number in [low, high] (nan, inf and out-of-range values are refused by name).
CLI::Validator number_in(double low, double high) {
  return CLI::Validator(
      [low, high](std::string& text) -> std::string {
        double x = 0;
        try {
          std::size_t used = 0;
          x = std::stod(text, &used);
          if (used != text.size() || text.empty() || std::isspace(static_cast<unsigned char>(text[0])))
            throw std::invalid_argument("trailing");
        } catch (const std::exception&) {
          return "needs a number, got '" + text + "'";
        }
        if (!std::isfinite(x)) return "needs a finite number, got '" + text + "'";
        if (x < low || x > high) return "must be in [" + CLI::detail::to_string(low) + ", " +
                                        CLI::detail::to_string(high) + "], got " + text;
        return "";
      },
      "");
}

}  // namespace

CLI::Option* add_integer(CLI::App& app, const std::string& name, long long* value, long long low, long long high,
                         const std::string& help) {
  return app.add_option(name, *value, help)->transform(integer_in(low, high))->capture_default_str();
}

CLI::Option* add_seed(CLI::App& app, const std::string& name, std::uint64_t* value, const std::string& help) {
  return app.add_option(name, *value, help)->transform(unsigned_seed())->capture_default_str();
}

CLI::Option* add_number(CLI::App& app, const std::string& name, double* value, double low, double high,
                        const std::string& help) {
  return app.add_option(name, *value, help)->transform(number_in(low, high))->capture_default_str();
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
  auto given = [](const CLI::Option* option) { return option != nullptr && option->count() > 0; };
  const bool from_file = given(file_option), from_preset = given(preset_option);
  if (from_file && from_preset) throw UsageError("--space and --preset: give one of them, not both");
  fuzz::CaseSpace s = fuzz::CaseSpace::chunked(64);
  if (from_file) {
    nlohmann::json j;
    try {
      const std::vector<std::uint8_t> bytes = oracle::read_file_bytes(file, std::uint64_t(1) << 24);
      j = nlohmann::json::parse(bytes.begin(), bytes.end());
    } catch (const std::exception& e) {
      throw UsageError("--space: cannot read " + file + ": " + e.what());
    }
    try {
      s = fuzz::case_space_from_json(j);
    } catch (const std::exception& e) {
      throw UsageError("--space " + file + ": " + e.what());
    }
  }
  if (from_preset) {
    try {
      s = fuzz::case_space_from_json(nlohmann::json{{"preset", preset}});
    } catch (const std::exception& e) {
      throw UsageError("--preset " + preset + ": " + e.what());
    }
  }
  if (given(dtypes_option)) {
    std::vector<DType> list;
    std::string item;
    std::istringstream in(dtypes);
    while (std::getline(in, item, ',')) {
      DType d{};
      if (!parse_dtype(item, &d) || d == DType::f64)
        throw UsageError("--dtypes: each must be f32, bf16 or f16, got '" + item + "'");
      list.push_back(d);
    }
    if (list.empty()) throw UsageError("--dtypes: names no dtype, got '" + dtypes + "'");
    s.input_dtypes = list;
  }
  // Without a file or preset every flag applies (its default too); with one, only those given.
  const bool from_file_or_preset = from_file || from_preset;
  if (!from_file_or_preset || given(max_K_option)) s.max_K = static_cast<int>(max_K);
  if (!from_file_or_preset || given(max_V_option)) s.max_V = static_cast<int>(max_V);
  if (!from_file_or_preset || given(K_multiple_option)) s.K_multiple = static_cast<int>(K_multiple);
  if (s.K_multiple > s.max_K) throw UsageError("--K-multiple must be at most --max-K");
  if (!from_file_or_preset || given(max_tokens_option)) s.max_tokens = max_tokens;
  if (!from_file_or_preset || given(max_sequences_option)) s.max_sequences = static_cast<int>(max_sequences);
  if (!from_file_or_preset || given(max_work_option)) s.max_work = max_work;
  if (!from_file_or_preset || given(intermediate_option)) s.intermediate_states = intermediate;
  if (from_file_or_preset) {
    try {
      fuzz::check_space(s);
    } catch (const std::exception& e) {
      throw UsageError((from_file ? "--space " + file : "--preset " + preset) + " with the flags given: " + e.what());
    }
  }
  return s;
}

void add_space_options(CLI::App& app, SpaceOptions* space) {
  const std::string group = "Case space (fuzz::gen_case)";
  space->file_option =
      app.add_option("--space", space->file,
                     "the case space as JSON (gdn-case-space/1, docs/python.md); the flags below override its fields")
          ->type_name("FILE")
          ->group(group);
  space->preset_option =
      app.add_option("--preset", space->preset,
                     "start from a preset space instead: everything, chunked, recurrent_prefill, decode, "
                     "chunked_prefill (the CUDA kernels' spaces, fuzz/generators.hpp); the flags below override it")
          ->type_name("NAME")
          ->group(group);
  space->dtypes_option =
      app.add_option("--dtypes", space->dtypes, "comma-separated input dtypes every case takes (f32, bf16, f16)")
          ->type_name("LIST")
          ->group(group);
  space->max_K_option = add_integer(app, "--max-K", &space->max_K, 1, INT_MAX, "largest key head size K")->group(group);
  space->max_V_option = add_integer(app, "--max-V", &space->max_V, 1, INT_MAX, "largest value head size V")->group(group);
  space->K_multiple_option = add_integer(app, "--K-multiple", &space->K_multiple, 1, INT_MAX,
                                         "K rounded up to a multiple of M (16 for the chunked prefill); at most --max-K")
                                 ->type_name("M")
                                 ->group(group);
  space->max_tokens_option =
      add_integer(app, "--max-tokens", &space->max_tokens, 1, INT_MAX, "most tokens T of a case")->group(group);
  space->max_sequences_option =
      add_integer(app, "--max-sequences", &space->max_sequences, 1, INT_MAX, "most sequences N of a case")->group(group);
  space->max_work_option =
      add_number(app, "--max-work", &space->max_work, 1, 1e30, "cap on the work T*HV*K*V")->group(group);
  space->intermediate_option = app.add_flag("--intermediate", space->intermediate,
                                            "draw per-token intermediate states too (not for chunked implementations)")
                                   ->group(group);
}

void add_case_limits(CLI::App& app, oracle::CaseLimits* limits) {
  // CLI11 stores into uint64_t through the checked decimal text.
  app.add_option("--max-case-bytes", limits->max_bytes,
                 "refuse a case whose estimated memory to read and judge exceeds N bytes (docs/case_files.md)")
      ->transform(integer_in(1, LLONG_MAX))
      ->type_name("N")
      ->capture_default_str();
  app.add_option("--max-case-work", limits->max_work,
                 "refuse a case whose estimated reference work exceeds N state-element updates")
      ->transform(integer_in(1, LLONG_MAX))
      ->type_name("N")
      ->capture_default_str();
}

void VerdictFiles::write(const std::string& suite, const std::string& command,
                         const std::vector<oracle::Verdict>& verdicts) const {
  if (!junit.empty()) write_text_file(junit, junit_xml(suite, verdicts));
  if (!json.empty()) write_text_file(json, dump_json(verdicts_json(command, verdicts)));
}

void add_verdict_files(CLI::App& app, VerdictFiles* files, bool junit) {
  if (junit) app.add_option("--junit", files->junit, "write the verdicts as JUnit XML")->type_name("FILE");
  app.add_option("--json", files->json, "write the verdicts as JSON (gdn-verdicts/1)")->type_name("FILE");
}

std::vector<const oracle::RegistryEntry*> select(const std::string& names) {
  if (names.find_first_not_of(" ,") == std::string::npos)
    throw UsageError("--impl: names no implementation, got '" + names + "' (gdn-testbed list)");
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

}  // namespace gdn::cli
