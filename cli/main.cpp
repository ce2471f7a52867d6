// gdn-testbed: conformance, fuzzing, replay, case files for external implementations.
// The options of each command are in cli/commands/NAME.cpp; gdn-testbed COMMAND --help prints
// them, cli/README.md describes them.
#include <algorithm>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/campaign.hpp"
#include "cli/commands/commands.hpp"
#include "cli/commands/options.hpp"
#include "cli/output.hpp"
#include "cli/registry_all.hpp"

#ifndef GDN_TESTBED_VERSION
#define GDN_TESTBED_VERSION "unknown"
#endif

namespace {

// The invocation as a shell would take it back: recorded in results and case files.
std::string command_line(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    const bool quote = a.find_first_of(" \t'\"$*?()") != std::string::npos;
    s += (i ? " " : "") + (quote ? "'" + a + "'" : a);
  }
  return s;
}

std::string version() {
  return "gdn-testbed " GDN_TESTBED_VERSION " (git " + gdn::cli::build_versions().value("gdn-testbed", "unknown") + ")";
}

const char* kFooter = R"(With no command, or options only, gdn-testbed runs conformance.
gdn-testbed COMMAND --help (or gdn-testbed help COMMAND) prints a command's options.
Exit status: 0 every verdict passed (SKIPPED is not a failure, and never shown as passed),
1 a verdict failed or errored (fuzz: a failure was found), 2 usage or I/O error,
77 fuzz or replay had nothing that can run here (SKIPPED).)";

const char* kUsageHint = "(gdn-testbed help, or gdn-testbed COMMAND --help, for usage)";

}  // namespace

int main(int argc, char** argv) {
  using namespace gdn::cli;
  // Valid UTF-8 (invalid bytes replaced): it is recorded in JSON and case-file metadata.
  Context context{valid_utf8(command_line(argc, argv)), argc > 0 ? argv[0] : "gdn-testbed"};

  CLI::App app("gdn-testbed: verification of gated-delta-rule implementations", "gdn-testbed");
  app.set_version_flag("--version", version(), "print the version and the git revision it was built from");
  app.require_subcommand(1, 1);
  // A repeated option takes its last value; a flag takes no value (--verbose=1 is an error).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)->disable_flag_override();
  add_conformance(app, context);
  add_fuzz(app, context);
  add_replay(app, context);
  add_generate(app, context);
  add_verify(app, context);
  add_merge(app, context);
  add_report(app, context);
  add_list(app, context);
  CLI::App* help = app.add_subcommand("help", "this help; help COMMAND: that command's options");
  std::string help_topic;
  help->add_option("COMMAND", help_topic, "a command")->type_name("");
  app.footer(kFooter);  // after the subcommands, which would inherit it

  std::set<std::string> commands;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) commands.insert(sub->get_name());
  std::vector<std::string> args(argv + 1, argv + argc);
  // A fault-campaign build (-DGDN_KERNEL_FAULTS=ON, cuda/faults/planted_faults.hpp) takes
  // `--plant-fault NAME` before the command; replay commands it prints carry it, so that a saved
  // failure replays with the same fault.
  if (!args.empty() && args[0] == "--plant-fault") {
    if (args.size() < 2) {
      std::cerr << "gdn-testbed: --plant-fault needs a fault name\n" << kUsageHint << "\n";
      return 2;
    }
    if (args[1] == "list") {  // the campaign's table of faults (scripts/fault_campaign.sh)
      const std::string faults = planted_kernel_faults();
      if (faults.empty()) {
        std::cerr << "gdn-testbed: --plant-fault list: this binary has no planted faults (a build with "
                     "-DGDN_KERNEL_FAULTS=ON has)\n";
        return 2;
      }
      std::cout << faults;
      return 0;
    }
    try {
      plant_kernel_fault(args[1]);
    } catch (const std::exception& e) {
      std::cerr << "gdn-testbed: " << e.what() << "\n";
      return 2;
    }
    std::cerr << "gdn-testbed: PLANTED FAULT " << args[1] << " (a fault-campaign build): verdicts judge a broken kernel\n";
    context.binary += " --plant-fault " + args[1];
    args.erase(args.begin(), args.begin() + 2);
  }
  const bool top_level_flag = !args.empty() && (args[0] == "-h" || args[0] == "--help" || args[0] == "--version");
  if (args.empty() || (args[0].rfind("--", 0) == 0 && !top_level_flag))
    args.insert(args.begin(), "conformance");  // the default command
  if (!top_level_flag && commands.count(args[0]) == 0) {
    std::cerr << "gdn-testbed: unknown command '" << args[0] << "'\n" << kUsageHint << "\n";
    return 2;
  }
  help->callback([&] {
    if (help_topic.empty()) {
      std::cout << app.get_formatter()->make_help(&app, app.get_name(), CLI::AppFormatMode::Normal);
    } else if (commands.count(help_topic) == 0) {
      throw UsageError("unknown command '" + help_topic + "'");
    } else {
      std::cout << app.get_subcommand(help_topic)->help(app.get_name());
    }
    context.exit_code = 0;
  });

  try {
    std::reverse(args.begin(), args.end());  // CLI11 takes the arguments last first
    app.parse(args);
    return context.exit_code;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);  // --help, --version
    std::cerr << "gdn-testbed: " << e.what() << "\n" << kUsageHint << "\n";
    return 2;
  } catch (const UsageError& e) {
    std::cerr << "gdn-testbed: " << e.what() << "\n" << kUsageHint << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "gdn-testbed: " << e.what() << "\n";
    return 2;
  }
}
